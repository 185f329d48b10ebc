"""qemu_q.verify and `qemu-q verify`: a golden suite checked against the outputs of
onnx.reference and onnxruntime (which must fail exactly on the cases the manifest marks as
their divergences), hand-corrupted outputs, missing cases, the JSON report and bad
arguments."""

import json
import os
import pathlib

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import cli, golden
from qemu_q.golden import writers
from qemu_q.golden.verify import compare

pytest.importorskip("onnx", reason="the suite's ONNX folders need onnx (test extra)")
# how the golden tests run each case in the two runtimes (IOBinding for int4 / float8 in
# onnxruntime); what each cannot run is qemu_q/golden/runtimes.py
from test_golden import run_onnxruntime, run_reference  # noqa: E402

from qemu_q.golden.runtimes import cannot_run  # noqa: E402

# A few quantized types at one opset: every op (DynamicQuantizeLinear-11 comes with opset
# 21), every family and granularity, and divergences of both runtimes.
TYPES = ("uint8", "int4", "float8e4m3fn", "float8e5m2")
OPSET = 21
SELECTION = golden.Selection(types=TYPES, opsets=(OPSET,))


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "golden"
    assert cli.main(["golden", "--out", str(out), "--type", ",".join(TYPES),
                     "--opset", str(OPSET)]) == 0
    return out


@pytest.fixture(scope="module")
def cases(suite_dir):
    built = [golden.build_case(config) for config in golden.iter_configs(SELECTION)]
    manifest = json.loads((suite_dir / "manifest.json").read_text())
    assert [c.name for c in built] == [e["name"] for e in manifest["cases"]]
    return built


def _run(argv, capsys):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _write_case(root: pathlib.Path, name: str, files: dict[str, bytes]) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for file_name, data in files.items():
        (folder / file_name).write_bytes(data)


# --------------------------------------------------------------------------------------
# Runtimes: verify fails exactly the divergences the manifest names for each


RUNTIMES = {golden.REFERENCE: run_reference, golden.ONNXRUNTIME: run_onnxruntime}


@pytest.fixture(scope="module")
def runtime_outputs(cases):
    """runtime -> {case name: outputs} for the cases the runtime can run."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    results = {}
    for runtime, run in RUNTIMES.items():
        results[runtime] = {case.name: run(case, writers.model_bytes(case))
                            for case in cases if cannot_run(runtime, case.config) is None}
    return results


def _pb_files(case, outputs):
    return {f"output_{i}.pb": writers.tensor_proto_bytes(np.asarray(array), name)
            for i, ((name, _), array) in enumerate(zip(case.outputs, outputs))}


def _hex_files(case, outputs):
    return {f"output_{i}.hex": writers.hex_text(np.asarray(array), 8, name).encode()
            for i, ((name, _), array) in enumerate(zip(case.outputs, outputs))}


def _npz_files(case, outputs):
    arrays = {name: writers.to_storage(np.asarray(array))
              for (name, _), array in zip(case.outputs, outputs)}
    return {"outputs.npz": writers.npz_bytes(arrays)}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("layout", [_pb_files, _hex_files, _npz_files],
                         ids=["pb", "hex", "npz"])
def test_runtime_outputs_fail_exactly_their_divergences(suite_dir, cases, runtime_outputs,
                                                        tmp_path, runtime, layout, capsys):
    actual = tmp_path / "actual"
    outputs = runtime_outputs[runtime]
    for case in cases:
        if case.name in outputs:
            _write_case(actual, case.name, layout(case, outputs[case.name]))
    marked = {c.name for c in cases if c.name in outputs
              and any(runtime in who for _, who in c.divergences)}
    cannot = {c.name for c in cases if c.name not in outputs}
    # The divergence rows mark cases by their features; with this seed a few marked cases
    # happen to come out with the same bits (onnxruntime's float16-x random cases), and
    # those pass. Which ones: the runtime's arrays against the cases built in memory.
    agree = {c.name for c in cases if c.name in marked and all(
        np.asarray(got).tobytes() == want.tobytes()
        for got, (_, want) in zip(outputs[c.name], c.outputs))}
    assert len(agree) < len(marked) / 2, "the selection shows few divergences of this runtime"

    report = qemu_q.verify(suite_dir, actual)
    assert sorted(report.names("fail")) == sorted(marked - agree)
    assert sorted(report.names("missing")) == sorted(cannot)
    assert len(report.names("pass")) == len(cases) - len(marked - agree) - len(cannot)
    for name in marked - agree:
        result = report.case(name)
        assert not result.errors and result.mismatches and sum(result.differing.values())

    code, out, _ = _run(["verify", suite_dir, actual, "--allow-missing"], capsys)
    assert code == 1  # the divergences fail
    assert out.splitlines()[0] == (f"{len(cases)} cases checked: {len(report.names('pass'))} "
                                   f"passed, {len(marked - agree)} failed, {len(cannot)} missing")


def test_suite_is_its_own_actual(suite_dir, tmp_path, capsys):
    """The suite's node/ layout and, alone, its npz/ layout pass every case."""
    report = qemu_q.verify(suite_dir, suite_dir)
    assert report.ok() and report.summary.passed == report.summary.checked > 100
    assert all(r.source.endswith("test_data_set_0") for r in report.cases)
    npz_only = tmp_path / "npz_only"
    npz_only.mkdir()
    (npz_only / "npz").symlink_to(suite_dir / "npz")
    report = qemu_q.verify(suite_dir, npz_only)
    assert report.ok() and all(r.source.endswith(".npz") for r in report.cases)
    code, out, _ = _run(["verify", suite_dir, suite_dir], capsys)
    assert code == 0 and out.startswith(f"{report.summary.checked} cases checked: "
                                        f"{report.summary.checked} passed, 0 failed, 0 missing")


# --------------------------------------------------------------------------------------
# Hand-corrupted outputs

F8_CASE = f"test_quantizelinear_{OPSET}_float8e4m3fn_random"  # shape (2, 3, 11)
INT4_CASE = f"test_quantizelinear_{OPSET}_int4_random"


def _golden_output(suite_dir, name, index=0):
    return writers.read_npz(suite_dir / "npz" / f"{name}.npz")[1][
        ["expected_y", "expected_y_scale", "expected_y_zero_point"][index]]


def test_one_flipped_bit_in_a_float8_pb(suite_dir, tmp_path):
    y = _golden_output(suite_dir, F8_CASE).copy()
    assert y.shape == (2, 3, 11)
    codes = y.view(np.uint8).reshape(-1)
    code = int(codes[40])
    assert 0x7F not in (code & 0x7F, (code ^ 0x04) & 0x7F)  # neither is NaN
    codes[40] ^= 0x04  # flat 40 = (1, 0, 7): 1 * 33 + 0 * 11 + 7
    _write_case(tmp_path, F8_CASE, {"output_0.pb": writers.tensor_proto_bytes(y, "y")})
    report = qemu_q.verify(suite_dir, tmp_path, case=F8_CASE)
    assert report.summary.to_dict() == {"checked": 1, "passed": 0, "failed": 1, "missing": 0}
    result = report.case(F8_CASE)
    assert result.status == "fail" and result.differing == {"y": 1} and not result.errors
    (m,) = result.mismatches
    assert (m.output, m.index, m.multi_index) == ("y", 40, (1, 0, 7))
    assert m.expected_bits == f"0x{code:02x}" and m.actual_bits == f"0x{code ^ 0x04:02x}"
    # bit 2 of a sign-magnitude code: 4 steps on the e4m3fn grid, either sign
    assert m.ulp == 4
    as_float = np.array([code, code ^ 0x04], np.uint8).view(ml_dtypes.float8_e4m3fn)
    assert (m.expected, m.actual) == (float(as_float[0]), float(as_float[1]))


def test_one_flipped_bit_in_an_int4_hex_file(suite_dir, tmp_path):
    """Bit 4 of the first word is bit 0 of element 1 (element 0 is bits 3:0)."""
    text = (suite_dir / "node" / INT4_CASE / "test_data_set_0" / "output_0.hex").read_text()
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if not line.startswith("//"))
    word = int(lines[first], 16)
    lines[first] = format(word ^ 0x10, f"0{len(lines[first])}x")
    _write_case(tmp_path, INT4_CASE, {"output_0.hex": ("\n".join(lines) + "\n").encode()})
    result = qemu_q.verify(suite_dir, tmp_path, case=INT4_CASE).case(INT4_CASE)
    (m,) = result.mismatches
    code = (word >> 4) & 0xF
    assert (m.index, m.multi_index) == (1, (0, 0, 1))
    assert (m.expected_bits, m.actual_bits) == (f"0x{code:x}", f"0x{code ^ 1:x}")
    signed = lambda c: c - 16 if c >= 8 else c  # noqa: E731
    assert (m.expected, m.actual, m.ulp) == (signed(code), signed(code ^ 1), None)


@pytest.mark.parametrize("dtype, expected, actual, ulp", [
    (np.float16, 0x3C00, 0x3C01, 1),            # 1.0 and the next float16
    (np.float16, 0x0000, 0x8000, 0),            # +0 and -0: other bits, same place
    (np.float16, 0x0001, 0x8001, 2),            # smallest subnormals of both signs
    (np.float16, 0x7BFF, 0x7C00, 1),            # largest finite and +inf
    (np.float16, 0x3C00, 0x7E00, None),         # NaN has no place
    (ml_dtypes.bfloat16, 0x3F80, 0xBF80, 0x7F00),  # 1.0 and -1.0
    (np.float32, 0x3F800000, 0x3F800003, 3),
    (ml_dtypes.float8_e4m3fn, 0x38, 0xB8, 0x70),   # 1.0 and -1.0: 2 * 0x38
    (ml_dtypes.float8_e4m3fn, 0x7E, 0x7F, None),   # 448 and NaN
    (ml_dtypes.float8_e5m2fnuz, 0x01, 0x80, None),  # 0x80 is the fnuz NaN
    (ml_dtypes.float8_e8m0fnu, 0x7F, 0x81, 2),     # exponent only: 1, 4
    (np.int8, 0x7F, 0x80, None),                   # integers: no ulp
])
def test_ulp_distance(dtype, expected, actual, ulp):
    etype = qemu_q.element_type(np.dtype(dtype))
    storage = etype.storage if etype.storage.kind == "u" else np.dtype(f"u{etype.storage.itemsize}")
    e = np.array([expected], storage).view(dtype)
    a = np.array([actual], storage).view(dtype)
    count, (m,) = compare("y", e, a, etype, 10)
    assert count == 1 and m.ulp == ulp and m.index == 0 and m.multi_index == (0,)
    digits = etype.bits // 4
    assert m.expected_bits == f"0x{expected:0{digits}x}"
    assert m.actual_bits == f"0x{actual:0{digits}x}"


def test_max_mismatches_limits_the_list_not_the_count(suite_dir, tmp_path, capsys):
    y = _golden_output(suite_dir, F8_CASE).copy()
    y.view(np.uint8)[...] ^= 0x01  # every element, by one place
    _write_case(tmp_path, F8_CASE, {"outputs.npz": writers.npz_bytes({"y": writers.to_storage(y)})})
    result = qemu_q.verify(suite_dir, tmp_path, case=F8_CASE, max_mismatches=3).case(F8_CASE)
    assert result.differing == {"y": 66}
    assert [m.index for m in result.mismatches] == [0, 1, 2]
    assert all(m.ulp == 1 for m in result.mismatches)
    code, out, _ = _run(["verify", suite_dir, tmp_path, "--case", F8_CASE,
                         "--max-mismatches", "2"], capsys)
    assert code == 1 and "y: 66 elements differ" in out
    assert out.count(" at (0, 0, ") == 2


def test_wrong_type_or_shape_fails_with_a_reason(suite_dir, tmp_path):
    y = _golden_output(suite_dir, F8_CASE)
    _write_case(tmp_path, F8_CASE, {
        "output_0.pb": writers.tensor_proto_bytes(y.view(np.uint8), "y")})
    result = qemu_q.verify(suite_dir, tmp_path, case=F8_CASE).case(F8_CASE)
    assert result.status == "fail" and not result.mismatches
    assert "holds ONNX data type 2, expected 17 (float8e4m3fn)" in result.errors[0]
    _write_case(tmp_path, F8_CASE, {"output_0.pb": writers.tensor_proto_bytes(y[:1], "y")})
    result = qemu_q.verify(suite_dir, tmp_path, case=F8_CASE).case(F8_CASE)
    assert "has shape [1, 3, 11], expected [2, 3, 11]" in result.errors[0]


def test_a_hex_file_is_exactly_its_tensor(suite_dir, tmp_path):
    """A .hex file that says another type or shape, has a word too many, a word wider than
    its width or a nonzero padding byte fails its case, whatever its leading bytes hold."""
    text = (suite_dir / "node" / INT4_CASE / "test_data_set_0" / "output_0.hex").read_text()
    lines = text.splitlines()
    last = len(lines) - 1
    # 66 int4 codes are 33 bytes: 9 words of 32 bits, the last one holding 1 data byte
    padded = lines[:last] + [format(int(lines[last], 16) | 0x100, "08x")]
    variants = {
        "the header declares int8 [999], expected int4 [2, 3, 11]":
            [line.replace("// type: int4", "// type: int8").replace("[2, 3, 11]", "[999]") for line in lines],
        "10 words; 66 elements of int4 take 9 words of 32 bits": lines + ["deadbeef"],
        "word '1deadbeef': expected at most 8 hex digits": lines[:last] + ["1deadbeef"],
        "the padding after the 33 data bytes is not zero": padded,
    }
    assert qemu_q.verify(suite_dir, suite_dir, case=INT4_CASE).ok()
    for reason, variant in variants.items():
        _write_case(tmp_path, INT4_CASE, {"output_0.hex": ("\n".join(variant) + "\n").encode()})
        result = qemu_q.verify(suite_dir, tmp_path, case=INT4_CASE).case(INT4_CASE)
        assert result.status == "fail" and reason in result.errors[0], (reason, result.errors)


def test_a_corrupt_npz_fails_its_case_not_the_run(suite_dir, tmp_path, capsys):
    _write_case(tmp_path, F8_CASE, {"outputs.npz": b"not a zip file"})
    _copy_case(suite_dir, tmp_path, INT4_CASE)
    report = qemu_q.verify(suite_dir, tmp_path)
    assert report.case(F8_CASE).status == "fail"
    assert "cannot read" in report.case(F8_CASE).errors[0]
    assert report.case(INT4_CASE).status == "pass"


def test_a_manifest_that_is_not_one(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"cases": [{}]}')
    code, _out, err = _run(["verify", tmp_path, tmp_path], capsys)
    assert code == 2 and "cases[0] is not a case qemu-q golden writes" in err
    (tmp_path / "manifest.json").write_text("nope")
    code, _out, err = _run(["verify", tmp_path, tmp_path], capsys)
    assert code == 2 and "not valid JSON" in err


# --------------------------------------------------------------------------------------
# Missing cases, --json, a single file


def _copy_case(suite_dir, actual, name):
    source = suite_dir / "node" / name / "test_data_set_0"
    _write_case(actual, name, {p.name: p.read_bytes() for p in source.glob("output_*.pb")})


def test_missing_cases_and_allow_missing(suite_dir, cases, tmp_path, capsys):
    dynamic = next(c.name for c in cases if c.op_type == "DynamicQuantizeLinear")
    _copy_case(suite_dir, tmp_path, dynamic)  # three outputs
    report = qemu_q.verify(suite_dir, tmp_path)
    assert report.names("pass") == [dynamic]
    assert len(report.names("missing")) == len(cases) - 1
    assert not report.ok() and report.ok(allow_missing=True)
    code, out, _ = _run(["verify", suite_dir, tmp_path], capsys)
    assert code == 1 and f"MISSING {cases[0].name}" in out
    code, out, _ = _run(["verify", suite_dir, tmp_path, "--allow-missing"], capsys)
    assert code == 0 and out.startswith(f"{len(cases)} cases checked: 1 passed, 0 failed, "
                                        f"{len(cases) - 1} missing")
    # one of the three outputs absent: the case fails and says which
    (tmp_path / dynamic / "output_2.pb").unlink()
    result = qemu_q.verify(suite_dir, tmp_path, case=dynamic).case(dynamic)
    assert result.status == "fail"
    assert result.errors == [f"output 2 (y_zero_point): no output_2.pb or output_2.hex in "
                             f"{tmp_path / dynamic}"]


def test_json_report(suite_dir, tmp_path, capsys):
    actual = tmp_path / "actual"
    y = _golden_output(suite_dir, F8_CASE).copy()
    y.view(np.uint8).reshape(-1)[0] ^= 0x01
    _write_case(actual, F8_CASE, {"output_0.pb": writers.tensor_proto_bytes(y, "y")})
    _copy_case(suite_dir, actual, INT4_CASE)
    report_path = tmp_path / "report.json"
    code, _, _ = _run(["verify", suite_dir, actual, "--json", report_path], capsys)
    assert code == 1
    report = json.loads(report_path.read_text())
    assert set(report) == {"summary", "cases"}
    summary = report["summary"]
    assert set(summary) == {"checked", "passed", "failed", "missing"}
    assert (summary["passed"], summary["failed"]) == (1, 1)
    assert summary["checked"] == len(report["cases"]) == summary["missing"] + 2
    by_name = {c["name"]: c for c in report["cases"]}
    assert {c["status"] for c in report["cases"]} == {"pass", "fail", "missing"}
    assert by_name[INT4_CASE]["status"] == "pass" and by_name[INT4_CASE]["mismatches"] == []
    (m,) = by_name[F8_CASE]["mismatches"]
    assert set(m) == {"output", "index", "multi_index", "expected_bits", "actual_bits",
                      "expected", "actual", "ulp"}
    assert (m["index"], m["multi_index"], m["ulp"]) == (0, [0, 0, 0], 1)


def test_one_file_with_case(suite_dir, tmp_path, capsys):
    pb = suite_dir / "node" / F8_CASE / "test_data_set_0" / "output_0.pb"
    code, out, _ = _run(["verify", suite_dir, pb, "--case", F8_CASE], capsys)
    assert code == 0 and out.startswith("1 cases checked: 1 passed")
    hex_file = pb.with_suffix(".hex")
    assert qemu_q.verify(suite_dir, hex_file, case=F8_CASE).ok()
    npz = suite_dir / "npz" / f"{F8_CASE}.npz"
    assert qemu_q.verify(suite_dir, npz, case=F8_CASE).ok()
    npy = tmp_path / "y.npy"
    y = _golden_output(suite_dir, F8_CASE).copy()
    y.view(np.uint8).reshape(-1)[-1] ^= 0x80  # the sign bit of the last element
    np.save(npy, writers.to_storage(y))
    (m,) = qemu_q.verify(suite_dir, npy, case=F8_CASE).case(F8_CASE).mismatches
    assert (m.index, m.multi_index) == (65, (1, 2, 10))


# --------------------------------------------------------------------------------------
# Bad arguments: one line on stderr, exit 2; ValueError from the function


def test_bad_arguments(suite_dir, tmp_path, capsys):
    nowhere = tmp_path / "nowhere"
    pb = suite_dir / "node" / F8_CASE / "test_data_set_0" / "output_0.pb"
    for argv, message in [
        ([nowhere, suite_dir], f"golden_dir='{nowhere}' is not a directory"),
        ([tmp_path, suite_dir], f"golden_dir='{tmp_path}' has no manifest.json"),
        ([suite_dir, nowhere], f"actual='{nowhere}': no such file or directory"),
        ([suite_dir, suite_dir, "--case", "test_nope"], "case='test_nope' is not in"),
        ([suite_dir, pb], "is a file: name its case with case= (--case NAME)"),
        ([suite_dir, suite_dir, "--max-mismatches", "-1"], "--max-mismatches must be >= 0"),
        ([suite_dir], "the following arguments are required: ACTUAL"),
    ]:
        code, out, err = _run(["verify", *argv], capsys)
        assert code == 2, argv
        assert err.count("\n") == 1 and message in err and err.startswith("qemu-q verify"), err
    with pytest.raises(ValueError, match="case='test_nope' is not in"):
        qemu_q.verify(suite_dir, suite_dir, case="test_nope")
    with pytest.raises(ValueError, match=r"max_mismatches=-1; allowed: an int >= 0"):
        qemu_q.verify(suite_dir, suite_dir, max_mismatches=-1)
    assert os.path.isdir(suite_dir)
