"""Golden vectors: coverage of the op-spec table, agreement with onnx.reference and
onnxruntime outside the documented divergences, file formats, determinism, and a Verilog
testbench that unpacks the hex files."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from collections import defaultdict

import numpy as np
import pytest

import qemu_q
from qemu_q import cli, golden
from qemu_q.golden import writers

onnx = pytest.importorskip("onnx", reason="golden tests read models with onnx (test extra)")
from onnx import numpy_helper  # noqa: E402

import golden_peers  # noqa: E402
from golden_peers import run_onnxruntime, run_reference  # noqa: E402,F401 (test_verify imports them)

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTBENCH = ROOT / "tests" / "verilog" / "unpack_tb.v"
DIVERGENCES_DOC = ROOT / "docs" / "divergences.md"

REFERENCE, ONNXRUNTIME = golden.REFERENCE, golden.ONNXRUNTIME
CAST_OPS = ("Cast", "CastLike")
INTEGER_OPS = ("MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv")


def _bits(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


# --------------------------------------------------------------------------------------
# The default suite, built once


@pytest.fixture(scope="module")
def suite(golden_suite):
    return golden_suite  # built once per session (tests/conftest.py)


def test_names_unique_and_stable(suite):
    names = [case.name for case in suite]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"test_[a-z0-9_]+", n) for n in names)
    assert len(suite) > 1000


# --------------------------------------------------------------------------------------
# Coverage against onnx.defs


def _schemas():
    found = defaultdict(list)
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain in ("", "ai.onnx") and schema.name in golden.OPS:
            found[schema.name].append(schema)
    return found


def _allowed(schema, type_str):
    if type_str.startswith("tensor("):
        return {type_str[7:-1]}
    for constraint in schema.type_constraints:
        if constraint.type_param_str == type_str:
            return {t[7:-1] for t in constraint.allowed_type_strs}
    raise AssertionError(f"{schema.name}-{schema.since_version}: no constraint {type_str}")


def test_every_op_version_and_quantized_type_is_covered():
    configs = list(golden.iter_configs())
    seen = {(c.op_type, c.version, c.qtype) for c in configs}
    required = set()
    for op, schemas in _schemas().items():
        for schema in schemas:
            if op == "QuantizeLinear":
                qtypes = _allowed(schema, schema.outputs[0].type_str)
            elif op == "DequantizeLinear":
                qtypes = _allowed(schema, schema.inputs[0].type_str)
            else:
                qtypes = _allowed(schema, schema.outputs[0].type_str)
            if op in CAST_OPS:
                qtypes -= {"string"}  # not implemented (docs/semantics.md, Cast)
            required |= {(op, schema.since_version, q) for q in qtypes}
    missing = sorted(required - seen)
    assert not missing, f"combinations onnx.defs allows that the suite lacks: {missing}"
    seen = {s for s in seen if s[0] not in golden.BLOCK_SCALED_OPS}  # not ONNX ops
    assert not sorted(seen - required), "the suite has combinations onnx.defs does not allow"


def test_every_float_type_attribute_and_granularity_is_covered():
    configs = list(golden.iter_configs())
    by_version = defaultdict(list)
    for c in configs:
        by_version[(c.op_type, c.version)].append(c)
    for op, schemas in _schemas().items():
        if op in ("DynamicQuantizeLinear",) + CAST_OPS + INTEGER_OPS:
            continue  # test_cast_pairs_..., test_integer_op_type_combinations_...
        for schema in schemas:
            cs = by_version[(op, schema.since_version)]
            x_types = _allowed(schema, schema.inputs[0].type_str)
            scale_types = _allowed(schema, schema.inputs[1].type_str)
            if op == "QuantizeLinear":
                assert {c.x_type for c in cs} == x_types, (op, schema.since_version)
                assert {c.scale_type for c in cs} == scale_types, (op, schema.since_version)
            else:
                out_types = _allowed(schema, schema.outputs[0].type_str)
                assert {c.scale_type for c in cs} == scale_types, (op, schema.since_version)
                assert {c.y_type for c in cs} == out_types, (op, schema.since_version)
            spec = qemu_q.get_spec(op, schema.since_version)
            assert {c.granularity for c in cs} == set(spec.granularities)
            attributes = set(schema.attributes)
            if "saturate" in attributes:
                assert any(c.saturate == 0 for c in cs)
            if "precision" in attributes:
                assert {c.precision for c in cs} >= {1, 10, 16}
            if "output_dtype" in attributes:
                assert any(c.output_dtype for c in cs)


def test_cast_pairs_and_attributes_are_covered():
    """Every (version, from, to) pair onnx.defs allows (strings excepted), saturate=0 where
    the version reads it, and every other round_mode into float8e8m0."""
    configs = [c for c in golden.iter_configs() if c.op_type in CAST_OPS]
    seen = {(c.op_type, c.version, c.x_type, c.qtype) for c in configs}
    required = set()
    for op in CAST_OPS:
        for schema in _schemas()[op]:
            sources = _allowed(schema, schema.inputs[0].type_str) - {"string"}
            targets = _allowed(schema, schema.outputs[0].type_str) - {"string"}
            required |= {(op, schema.since_version, a, b) for a in sources for b in targets}
            cs = [c for c in configs if (c.op_type, c.version) == (op, schema.since_version)]
            if "saturate" in schema.attributes:
                assert {c.qtype for c in cs if c.saturate == 0} >= {
                    t for t in targets if t.startswith("float8")}, (op, schema.since_version)
            if "round_mode" in schema.attributes:
                assert {c.round_mode for c in cs if c.qtype == "float8e8m0"} == {
                    None, "down", "nearest"}
    assert seen == required, (sorted(required - seen)[:10], sorted(seen - required)[:10])


def test_integer_op_type_combinations_are_covered():
    """Every (a, b, y) type combination of each integer op, every scale type, each conv
    geometry (auto_pad modes, strides, dilations, groups, 1-D/3-D, per-channel) and family."""
    configs = [c for c in golden.iter_configs() if c.op_type in INTEGER_OPS]
    for op in INTEGER_OPS:
        for schema in _schemas()[op]:
            cs = [c for c in configs if (c.op_type, c.version) == (op, schema.since_version)]
            first = 0
            second = 3 if op.startswith("QLinear") else 1
            required = {(a, b, y)
                        for a in _allowed(schema, schema.inputs[first].type_str)
                        for b in _allowed(schema, schema.inputs[second].type_str)
                        for y in _allowed(schema, schema.outputs[0].type_str)}
            assert {(c.x_type, c.w_type, c.qtype) for c in cs} == required, (op, schema.since_version)
            if op.startswith("QLinear"):
                assert {c.scale_type for c in cs} == _allowed(schema, schema.inputs[1].type_str)
                assert {"ties", "saturation", "zero_points"} <= {c.family for c in cs}
            else:
                assert {"overflow", "zero_points"} <= {c.family for c in cs}
            geometries = golden.MATMUL_GEOMETRIES if "MatMul" in op else golden.CONV_GEOMETRIES
            expected = set(geometries) - ({"no_zero_point"} if op.startswith("QLinear") else set())
            assert {c.geometry for c in cs} >= expected, (op, schema.since_version)


def test_integer_op_extras_hold_the_accumulator(suite):
    """The QLinear cases with integer operands carry the int32 accumulator they requantize:
    for a matmul, sum_k (a - a_zp)(b - b_zp) wrapped to int32 (Python ints here)."""
    cases = [c for c in suite if c.op_type in ("QLinearMatMul", "QLinearConv")
             and c.config.x_type in ("int8", "uint8") and c.config.w_type in ("int8", "uint8")]
    assert cases and all([name for name, _ in c.extras] == ["accumulator"] for c in cases)
    for case in cases:
        acc = case.extras[0][1]
        assert acc.dtype == np.int32 and acc.shape == case.outputs[0][1].shape, case.name
        if case.op_type != "QLinearMatMul" or case.config.geometry != "matrix":
            continue
        x = dict(case.inputs)
        a = x["a"].astype(np.int64) - int(x["a_zero_point"].reshape(-1)[0])
        b = x["b"].astype(np.int64) - int(x["b_zero_point"].reshape(-1)[0])
        exact = [[sum(int(a[i, k]) * int(b[k, j]) for k in range(a.shape[1]))
                  for j in range(b.shape[1])] for i in range(a.shape[0])]
        wrapped = [[(v + 2**31) % 2**32 - 2**31 for v in row] for row in exact]
        assert acc.tolist() == wrapped, case.name


def test_block_scaled_cases_are_covered():
    """MX: every element type x scale rule x family; NVFP4: every recipe, 1x16 blocks and
    16x16 tiles, x family. Each model is the dequantize graph of its op's function."""
    configs = [c for c in golden.iter_configs() if c.op_type in golden.BLOCK_SCALED_OPS]
    mx = {(c.qtype, c.variant, c.family) for c in configs if c.op_type == "MX"}
    assert mx == {(e, r, f) for e in qemu_q.MX_ELEMENTS for r in qemu_q.MX_SCALE_RULES
                  for f in golden.BLOCK_SCALED_FAMILIES}
    nvfp4 = {(c.variant, c.family) for c in configs if c.op_type == "NVFP4"}
    from qemu_q.ops.nvfp4 import RECIPES
    assert nvfp4 == {(r + t, f) for r in RECIPES for t in ("", "_tiles16x16")
                     for f in golden.BLOCK_SCALED_FAMILIES}


def test_block_scaled_cases_dequantize_their_codes(suite):
    """Each MX / NVFP4 case: the expected output is the dequantization of its inputs by
    qemu_q's DequantizeLinear (the graph's nodes, one by one), and the extra x is the float
    input the codes came from (every partial last block and 16x16 tile included)."""
    for case in suite:
        if case.op_type not in golden.BLOCK_SCALED_OPS:
            continue
        inputs = dict(case.inputs)
        (name, x), = case.extras
        assert name == "x" and x.dtype == np.float32 and x.shape == inputs["codes"].shape
        if case.op_type == "NVFP4":
            scale = qemu_q.dequantize_linear(inputs["block_scales"], inputs["global_scale"])
            y = qemu_q.dequantize_linear(inputs["codes"], scale, axis=-1, block_size=16, opset=24)
        elif case.config.qtype == "int8":
            scale = inputs["scales"].astype(np.float32) * np.float32(2.0**-6)
            y = qemu_q.dequantize_linear(inputs["codes"], scale, axis=-1, block_size=32, opset=24)
        else:
            y = qemu_q.dequantize_linear(inputs["codes"], inputs["scales"], axis=-1,
                                         block_size=32, output_dtype="float", opset=case.opset)
        assert _bits(y) == _bits(case.outputs[0][1]), case.name


def test_every_model_is_valid_onnx(suite):
    for case in suite:
        model = writers.model_proto(case)
        onnx.checker.check_model(model, full_check=True)
        opset = [onnx.helper.make_opsetid("", case.opset)]
        assert model.ir_version == onnx.helper.find_min_ir_version_for(opset)


# --------------------------------------------------------------------------------------
# onnx.reference and onnxruntime: identical bits except the documented divergences

# What each implementation cannot run at all: qemu_q/golden/runtimes.py (the manifest's
# runs_on), checked here by running every case.


def _mismatch(case, got) -> str | None:
    for (name, expected), result in zip(case.outputs, got):
        result = np.asarray(result)
        if result.dtype != expected.dtype or result.shape != expected.shape:
            return f"{name}: {result.dtype}{result.shape}, expected {expected.dtype}{expected.shape}"
        if _bits(result) != _bits(expected):
            width = expected.dtype.itemsize
            e = np.frombuffer(_bits(expected), np.uint8).reshape(-1, width)
            r = np.frombuffer(_bits(result), np.uint8).reshape(-1, width)
            index = np.nonzero((e != r).any(axis=1))[0]
            first = int(index[0])
            return (f"{name}: {index.size} of {expected.size} elements differ, first at "
                    f"{first}: got {result.reshape(-1)[first]!r}, "
                    f"expected {expected.reshape(-1)[first]!r}")
    return None


RUNTIMES = golden_peers.RUNTIMES


@pytest.fixture(scope="module")
def comparisons(suite, golden_peer_runs):
    """(runtime, case name) -> ("cannot" | "divergence" | "ok" | "mismatch" | "error", text)

    Every case runs, the divergent ones too (once per test session: the peers' outputs
    are the session fixture `golden_peer_runs`, which tests/test_profiles.py shares): a
    mismatch outside the marked cases fails test_runtimes_agree; a divergence row that
    never shows fails test_every_divergence_row_shows."""
    results = {}
    for case in suite:
        for runtime in RUNTIMES:
            status, value = golden_peer_runs[(runtime, case.name)]
            if status != "ran":
                results[(runtime, case.name)] = (status, value)
                continue
            problem = _mismatch(case, value)
            headings = [h for h, who in case.divergences if runtime in who]
            if headings:
                results[(runtime, case.name)] = ("divergence", "; ".join(headings), problem,
                                                 headings)
            else:
                results[(runtime, case.name)] = ("mismatch", problem) if problem else ("ok", "")
    return results


@pytest.mark.parametrize("runtime", [REFERENCE, ONNXRUNTIME])
def test_runtimes_agree(comparisons, suite, runtime):
    errors, mismatches, skipped = [], [], defaultdict(list)
    for case in suite:
        status, text, *_ = comparisons[(runtime, case.name)]
        if status == "error":
            errors.append(f"{case.name}: {text}")
        elif status == "mismatch":
            mismatches.append(f"{case.name}: {text}")
        elif status in ("cannot", "divergence"):
            skipped[text].append(case.name)  # by name, with the reason
    assert not errors, f"{runtime} failed on {len(errors)} cases:\n" + "\n".join(errors[:20])
    assert not mismatches, (
        f"{runtime} differs on {len(mismatches)} cases that no divergence names:\n"
        + "\n".join(mismatches[:40]))
    ran = sum(1 for case in suite if comparisons[(runtime, case.name)][0] == "ok")
    assert ran > 500, f"only {ran} cases compared with {runtime}"
    for reason, names in skipped.items():
        assert names and reason


def test_every_divergence_row_shows(comparisons, suite):
    """Each (heading, implementation) of the divergence table differs on some case."""
    shown = set()
    for case in suite:
        for runtime in RUNTIMES:
            entry = comparisons[(runtime, case.name)]
            if entry[0] == "divergence" and entry[2]:
                shown.update((heading, runtime) for heading in entry[3])
    rows = {(heading, runtime) for heading, who, _ in golden.DIVERGENCES for runtime in who}
    assert not sorted(rows - shown), f"divergence rows no case shows: {sorted(rows - shown)}"


def test_divergence_headings_are_documented():
    assert DIVERGENCES_DOC.is_file(), "docs/divergences.md is missing"
    text = DIVERGENCES_DOC.read_text(encoding="utf-8")
    headings = {line[3:].strip() for line in text.splitlines() if line.startswith("## ")}
    used = {heading for heading, _who, _predicate in golden.DIVERGENCES}
    missing = sorted(used - headings)
    assert not missing, f"headings the manifest uses that docs/divergences.md lacks: {missing}"


# --------------------------------------------------------------------------------------
# Files


def _environment(package_home, **variables) -> dict[str, str]:
    """os.environ for a subprocess that imports the qemu_q under test."""
    path = os.pathsep.join(p for p in (str(package_home), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **variables}


# Every op, input family, granularity and kind of variant, on a few quantized types and
# opsets: the command that runs twice is this selection, not the whole suite (4240 cases,
# about 42000 files), whose bytes are compared with it in memory.
SAMPLE_TYPES = ("uint8", "int4", "float8e4m3fn", "int32", "float4e2m1")
SAMPLE_OPSETS = (10, 25)
SAMPLE = ("--type", ",".join(SAMPLE_TYPES), "--opset", ",".join(map(str, SAMPLE_OPSETS)))


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory, package_home):
    """`qemu-q golden` on SAMPLE, run twice, each in a fresh interpreter with its own hash
    seed."""
    runs = []
    for hash_seed in ("1", "2"):
        out = tmp_path_factory.mktemp("golden") / "golden"
        # Run beside the package under test: `python -m` puts the working directory
        # first on sys.path, and a source checkout there holds an unbuilt qemu_q.
        done = subprocess.run([sys.executable, "-m", "qemu_q", "golden", "--out", str(out),
                               *SAMPLE], capture_output=True, text=True, cwd=str(package_home),
                              env=_environment(package_home, PYTHONHASHSEED=hash_seed))
        assert done.returncode == 0, done.stderr
        runs.append(out)
    return runs


@pytest.fixture(scope="module")
def written(sample_runs):
    """The SAMPLE suite as `qemu-q golden` writes it."""
    return sample_runs[0]


@pytest.fixture(scope="module")
def suite_files(suite, written):
    """The files and manifest entries of the cases the SAMPLE selection wrote, built in
    memory from the whole default suite's cases (only those paths are compared)."""
    names = {entry["name"] for entry in _manifest(written)["cases"]}
    files, entries = {}, {}
    for case in suite:
        if case.name not in names:
            continue
        case_files, entries[case.name] = writers.case_files(case, writers.FORMATS,
                                                            writers.DEFAULT_WORD_BITS)
        files.update(case_files)
    assert entries.keys() == names
    return files, entries


def _all_files(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _manifest(root: pathlib.Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def test_sample_covers_every_op_family_granularity_and_variant(written):
    configs = list(golden.iter_configs())
    entries = _manifest(written)["cases"]
    whole = {(c.op_type, c.family, c.granularity, c.variant.split("_")[0]) for c in configs}
    chosen = {(e["op_type"], e["family"], e["granularity"], e["variant"].split("_")[0])
              for e in entries}
    assert chosen == whole
    assert len(entries) < len(configs) / 10


def test_same_command_same_bytes(sample_runs):
    first, second = sample_runs
    a, b = _all_files(first), _all_files(second)
    assert a.keys() == b.keys()
    different = [name for name in a if a[name] != b[name]]
    assert not different, f"{len(different)} files differ, e.g. {different[:5]}"


def test_case_files_do_not_depend_on_the_selection(written, suite_files):
    """A case's files and manifest entry are the same in the whole suite and in a
    selection."""
    whole, entries = suite_files
    selected = _all_files(written)
    selected.pop("manifest.json")
    different = [path for path in selected if whole.get(path) != selected[path]]
    assert not different, f"{len(different)} files differ, e.g. {different[:5]}"
    for entry in _manifest(written)["cases"]:
        assert entry == entries[entry["name"]], entry["name"]


def test_npz_members_have_fixed_dates(written):
    for path in sorted((written / "npz").glob("*.npz"))[:50]:
        with zipfile.ZipFile(path) as archive:
            assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_manifest_and_layout(written, suite, shared_dir):
    first = written
    manifest = _manifest(first)
    assert manifest["qemu_q_version"] == qemu_q.__version__
    assert manifest["seed"] == 0
    selection = golden.Selection(types=SAMPLE_TYPES, opsets=SAMPLE_OPSETS)
    assert [e["name"] for e in manifest["cases"]] == [
        c.name for c in golden.iter_configs(selection)]
    assert manifest["case_count"] == len(manifest["cases"])
    by_name = {case.name: case for case in suite}
    shared = shared_dir / "onnx-node-tests" / "test_quantizelinear"
    shared_layout = sorted(str(p.relative_to(shared)) for p in shared.rglob("*") if p.is_file())
    for entry in manifest["cases"][::2]:
        case = by_name[entry["name"]]
        assert entry["divergence"] == case.divergence
        folder = first / entry["onnx_dir"]
        layout = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.pb")) + ["model.onnx"]
        expected = [f"test_data_set_0/input_{i}.pb" for i in range(len(case.inputs))] + [
            f"test_data_set_0/output_{i}.pb" for i in range(len(case.outputs))]
        assert layout == sorted(expected) + ["model.onnx"]
        if entry["op_type"] == "QuantizeLinear" and len(case.inputs) == 3:
            assert sorted(layout) == shared_layout
        model = onnx.load(str(folder / "model.onnx"))
        assert [o.version for o in model.opset_import] == [entry["opset"]]
        if entry["op_type"] in golden.BLOCK_SCALED_OPS:  # the dequantize graph
            assert model.graph.node[-1].op_type == "DequantizeLinear"
        else:
            assert model.graph.node[0].op_type == entry["op_type"]
            attributes = {a.name: onnx.helper.get_attribute_value(a)
                          for a in model.graph.node[0].attribute}
            attributes = {k: v.decode() if isinstance(v, bytes) else v
                          for k, v in attributes.items()}
            assert attributes == entry["attributes"]
        meta, arrays = writers.read_npz(first / entry["npz"])
        assert meta["op_type"] == entry["op_type"] and meta["opset"] == entry["opset"]
        for role, tensors, items in (("input", entry["inputs"], case.inputs),
                                     ("output", entry["outputs"], case.outputs)):
            for index, (tensor, (name, array)) in enumerate(zip(tensors, items)):
                assert tensor["name"] == name and tensor["type"] == qemu_q.element_type(
                    array.dtype).name and tensor["shape"] == list(array.shape)
                assert tensor["pb"] == f"{entry['onnx_dir']}/test_data_set_0/{role}_{index}.pb"
                assert tensor["hex"] == tensor["pb"][:-3] + ".hex"  # beside it, same stem
                proto = onnx.load_tensor(str(first / tensor["pb"]))
                assert proto.name == name
                loaded = numpy_helper.to_array(proto)
                assert loaded.dtype == array.dtype and _bits(loaded) == _bits(array)
                hex_text = (first / tensor["hex"]).read_text()
                parsed = writers.read_hex(hex_text, tensor["type"], tensor["shape"])
                assert _bits(parsed) == _bits(array)
                assert bytes(proto.raw_data) == qemu_q.pack(array).tobytes()
                from_npz = arrays[tensor["npz_key"]]
                assert from_npz.dtype == array.dtype and _bits(from_npz) == _bits(array)


def test_written_folders_run_in_onnx_reference(written):
    """A few folders straight from disk, the way a backend test runner reads them."""
    from onnx.reference import ReferenceEvaluator

    first = written
    manifest = _manifest(first)
    picked = [e for e in manifest["cases"] if e["divergence"] is None
              and REFERENCE in e["runs_on"]
              and e["since_version"] >= 19 and e["family"] in ("grid", "codes")][::3]
    assert len(picked) > 10
    for entry in picked:
        folder = first / entry["onnx_dir"]
        model = onnx.load(str(folder / "model.onnx"))
        data = folder / "test_data_set_0"
        inputs = [numpy_helper.to_array(onnx.load_tensor(str(p)))
                  for p in sorted(data.glob("input_*.pb"))]
        expected = [numpy_helper.to_array(onnx.load_tensor(str(p)))
                    for p in sorted(data.glob("output_*.pb"))]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = ReferenceEvaluator(model).run(
                None, {i.name: a for i, a in zip(model.graph.input, inputs)})
        for g, e in zip(got, expected):
            assert _bits(np.asarray(g)) == _bits(e), entry["name"]


def test_hex_layout():
    a = np.array([1, -2, 7, -8, 3], dtype=qemu_q.ELEMENT_TYPES["int4"].dtype)
    text = writers.hex_text(a, 16, "x")
    header = [line for line in text.splitlines() if line.startswith("//")]
    words = [line for line in text.splitlines() if not line.startswith("//")]
    assert words == ["87e1", "0003"]  # bytes e1 87 03, little-endian 16-bit words
    assert any("shape: [5]" in h for h in header) and any("elements: 5" in h for h in header)
    assert any("int4" in h for h in header) and any("packing" in h for h in header)
    assert writers.hex_text(a, 8, "x").splitlines()[-3:] == ["e1", "87", "03"]
    assert writers.hex_text(a, 64, "x").splitlines()[-1] == "00000000000387e1"
    i2 = np.array([1, -2, 0, 1, -1], dtype=qemu_q.ELEMENT_TYPES["int2"].dtype)
    assert writers.hex_text(i2, 32).splitlines()[-1] == "00000349"
    with pytest.raises(ValueError, match="word_bits"):
        writers.hex_text(a, 12)


def test_storage_round_trip():
    for name, etype in qemu_q.ELEMENT_TYPES.items():
        codes = np.arange(1 << min(etype.bits, 8), dtype=np.uint8)
        if etype.kind == "integer":
            array = np.arange(max(etype.lo, -300), min(etype.hi, 300) + 1).astype(etype.dtype)
        else:
            array = codes.view(etype.dtype) if etype.storage.itemsize == 1 else \
                np.arange(0, 65536, 97, dtype=np.uint16).view(etype.dtype)
        stored = writers.to_storage(array)
        assert stored.dtype.type.__module__ == "numpy", name
        back = writers.from_storage(stored, name)
        assert back.dtype == array.dtype and _bits(back) == _bits(array), name
        if etype.kind != "integer" and etype.bits < 8:
            # a stored byte with bits above the code is no code of the type
            wide = np.array([0, 1 << etype.bits], np.uint8)
            with pytest.raises(ValueError, match=f"holds the code {1 << etype.bits:#x}, wider than {name}'s"):
                writers.from_storage(wide, name)


def test_cases_do_not_depend_on_the_selection():
    config = next(c for c in golden.iter_configs() if c.family == "random"
                  and c.qtype == "int4" and c.granularity == "blocked")
    narrow = golden.Selection(ops=("dq", "q"), opsets=(config.version,), types=("int4",),
                              granularities=("blocked",), families=("random",))
    assert config in list(golden.iter_configs(narrow))
    a, b = golden.build_case(config), golden.build_case(config)
    assert all(_bits(x) == _bits(y) for (_, x), (_, y) in zip(a.inputs, b.inputs))
    c = golden.build_case(config, seed=1)
    assert any(_bits(x) != _bits(y) for (_, x), (_, y) in zip(a.inputs, c.inputs))
    d = golden.build_case(config, size=200)
    assert d.inputs[0][1].size >= 200


def test_selection_by_opset_resolves_versions():
    configs = list(golden.iter_configs(golden.Selection(opsets=(20,))))
    assert {(c.op_type, c.version) for c in configs} == {
        ("QuantizeLinear", 19), ("DequantizeLinear", 19), ("DynamicQuantizeLinear", 11),
        ("Cast", 19), ("CastLike", 19), ("MatMulInteger", 10), ("ConvInteger", 10),
        ("QLinearMatMul", 10), ("QLinearConv", 10)}


# --------------------------------------------------------------------------------------
# Without onnx


def test_npz_and_hex_without_onnx(tmp_path, package_home):
    """The core, the writers and the CLI import without onnx; --format onnx says why not."""
    script = f"""
import sys
sys.modules["onnx"] = None  # import onnx raises ImportError
from qemu_q import cli
code = cli.main(["golden", "--out", {str(tmp_path / 'a')!r}, "--op", "q", "--opset", "10"])
assert code == 0, code
code = cli.main(["golden", "--out", {str(tmp_path / 'b')!r}, "--format", "onnx"])
assert code == 1, code
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=str(tmp_path), env=_environment(package_home))
    assert done.returncode == 0, done.stderr
    assert "the onnx format needs the onnx package: pip install qemu_q[onnx]" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "a" / "manifest.json").is_file()
    assert not list((tmp_path / "a").rglob("*.onnx"))
    assert list((tmp_path / "a").rglob("*.hex")) and list((tmp_path / "a").rglob("*.npz"))


# --------------------------------------------------------------------------------------
# Verilog: a testbench reads the hex files with $readmemh and unpacks the elements


@pytest.fixture(scope="module")
def testbench(tmp_path_factory):
    iverilog, vvp = shutil.which("iverilog"), shutil.which("vvp")
    if not (iverilog and vvp):
        if os.environ.get("CI"):
            pytest.fail("iverilog is required in CI (.ci/run installs it)")
        pytest.skip("iverilog is not installed (apt-get install -y iverilog); "
                    "CI runs this test")
    build = tmp_path_factory.mktemp("verilog")
    compiled = build / "unpack_tb.vvp"
    subprocess.run([iverilog, "-g2005", "-Wall", "-o", str(compiled), str(TESTBENCH)],
                   check=True, capture_output=True, text=True)
    return vvp, compiled


def _simulate(testbench, path, word_bits, etype, count):
    vvp, compiled = testbench
    signed = int(etype.kind == "integer" and etype.lo < 0)
    done = subprocess.run(
        [vvp, "-N", str(compiled), f"+hex={path}", f"+word={word_bits}", f"+bits={etype.bits}",
         f"+count={count}", f"+signed={signed}"],
        check=True, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("ERROR")], done.stdout
    return [int(line[2:]) for line in lines if line.startswith("E ")]


def _expected_values(array):
    etype = qemu_q.element_type(array.dtype)
    if etype.kind == "integer":
        return [int(v) for v in array.reshape(-1).astype(np.int64 if etype.lo < 0 else np.uint64)]
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[array.dtype.itemsize]
    return [int(v) for v in np.ascontiguousarray(array).reshape(-1).view(unsigned)]


@pytest.mark.parametrize("word_bits", [8, 16, 32, 64])
def test_verilog_testbench_unpacks_hex(testbench, tmp_path, word_bits):
    out = tmp_path / "golden"
    # every code of every quantized type (DequantizeLinear inputs), scales, float outputs
    assert cli.main(["golden", "--out", str(out), "--op", "dq", "--family", "codes",
                     "--opset", "28", "--format", "hex,npz",
                     "--word-bits", str(word_bits)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    seen = set()
    for entry in manifest["cases"]:
        _meta, arrays = writers.read_npz(out / entry["npz"])
        for tensor in entry["inputs"] + entry["outputs"]:
            array = arrays[tensor["npz_key"]]
            key = (tensor["type"], array.ndim == 0)
            if key in seen:
                continue
            seen.add(key)
            etype = qemu_q.element_type(array.dtype)
            got = _simulate(testbench, out / tensor["hex"], word_bits, etype, array.size)
            assert got == _expected_values(array), (entry["name"], tensor["name"])
    types = {t for t, _ in seen}
    # every type of the quantization ops (the types only Cast takes: test_verilog_testbench_odd_counts)
    cast_only = {"double", "int64", "uint32", "uint64", "bool"}
    assert types == set(qemu_q.ELEMENT_TYPES) - cast_only, set(qemu_q.ELEMENT_TYPES) - types


@pytest.mark.parametrize("word_bits", [16, 64])
def test_verilog_testbench_odd_counts(testbench, tmp_path, word_bits):
    """Counts that leave a partly filled byte and word, for every element type."""
    rng = np.random.default_rng(5)
    for name, etype in qemu_q.ELEMENT_TYPES.items():
        count = 13
        if etype.kind == "integer":
            wide = np.int64 if etype.lo < 0 else np.uint64  # numpy draws no ml_dtypes ints
            array = rng.integers(etype.lo, etype.hi, size=count, dtype=wide, endpoint=True)
            array = array.astype(etype.dtype)
        elif etype.kind == "bool":
            array = rng.integers(0, 2, size=count).astype(np.bool_)
        else:
            width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[etype.dtype.itemsize]
            bits = rng.integers(0, 1 << min(etype.bits, 63), size=count, dtype=np.uint64)
            array = bits.astype(width).view(etype.dtype)
        path = tmp_path / f"{name}.hex"
        path.write_text(writers.hex_text(array, word_bits, name))
        got = _simulate(testbench, path, word_bits, etype, count)
        assert got == _expected_values(array), name


# --------------------------------------------------------------------------------------
# runs_on, --variant, --block-size


def test_cannot_rows_really_cannot(suite):
    """Each row of qemu_q/golden/runtimes.py: the first cases it alone rules out fail in
    that runtime (test_runtimes_agree shows the cases it lets through run)."""
    pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
    for runtime, run in RUNTIMES.items():
        for reason, predicate in golden.runtimes.CANNOT[runtime]:
            ruled_out = [case for case in suite if predicate(case.config)
                         and golden.cannot_run(runtime, case.config) == reason]
            assert ruled_out, reason
            for case in ruled_out[:3]:
                with pytest.raises(Exception):  # noqa: B017 - any failure to run counts
                    run(case, writers.model_bytes(case))


def test_runs_on_in_the_manifest(written):
    by_name = {entry["name"]: entry for entry in _manifest(written)["cases"]}
    assert by_name["test_quantizelinear_25_int4_grid"]["runs_on"] == [REFERENCE, ONNXRUNTIME]
    assert by_name["test_dequantizelinear_10_uint8_codes"]["runs_on"] == [ONNXRUNTIME]
    everything = [golden.runs_on(c) for c in golden.iter_configs()]
    assert [REFERENCE] in everything and [ONNXRUNTIME] in everything
    # Cases no peer runs are qemu_q's vectors alone (Cast-1, e8m0 -> float4, ...): each
    # for a reason both tables give.
    assert all(golden.cannot_run(REFERENCE, c) and golden.cannot_run(ONNXRUNTIME, c)
               for c in golden.iter_configs() if not golden.runs_on(c))


def test_variant_and_block_size_options(tmp_path, package_home):
    base = [sys.executable, "-m", "qemu_q", "golden", "--op", "q", "--opset", "21",
            "--type", "int4"]
    env = _environment(package_home)
    # Beside the package under test: `python -m` looks in the working directory first.
    listed = subprocess.run(base + ["--list", "--variant", "blocked*,x_float16",
                                    "--block-size", "4", "--block-size", "16"],
                            capture_output=True, text=True, env=env,
                            cwd=str(package_home))
    assert listed.returncode == 0, listed.stderr
    names = listed.stdout.split()
    assert "test_quantizelinear_21_int4_blocked_b4_random" in names
    assert "test_quantizelinear_21_int4_blocked_b16_random" in names
    assert "test_quantizelinear_21_int4_x_float16_grid" in names
    assert not any(n.endswith("_blocked_random") or "_base_" in n for n in names)
    out = tmp_path / "g"
    done = subprocess.run(base + ["--out", str(out), "--variant", "blocked*", "--block-size",
                                  "5", "--format", "onnx,npz"],
                          capture_output=True, text=True, env=env, cwd=str(package_home))
    assert done.returncode == 0, done.stderr
    manifest = _manifest(out)
    (entry,) = manifest["cases"]
    assert manifest["selection"]["block_size"] == ["5"]
    assert manifest["selection"]["variant"] == ["blocked*"]
    assert entry["variant"] == "blocked_b5" and entry["attributes"]["block_size"] == 5
    assert [t["shape"] for t in entry["inputs"]] == [[2, 3, 11], [2, 3, 3], [2, 3, 3]]
    meta, arrays = writers.read_npz(out / entry["npz"])
    case = golden.build_case(next(iter(golden.iter_configs(golden.Selection(
        ops=("q",), opsets=(21,), types=("int4",), variants=("blocked*",),
        block_sizes=(5,))))))
    (got,) = golden_peers.run_reference(case, (out / entry["onnx_dir"] / "model.onnx").read_bytes())
    assert _bits(got) == _bits(arrays["expected_y"])
    bad = subprocess.run(base + ["--list", "--block-size", "0"], capture_output=True,
                         text=True, env=env, cwd=str(package_home))
    assert bad.returncode == 2 and "block size 0" in bad.stderr


def test_run_node_is_run_op_under_the_default_datapath(suite):
    """The suite's outputs come from golden/datapaths.py's run_node (the one helper that
    passes datapath=); under the default datapath they are run_op's, on every case."""
    from qemu_q.golden import datapaths

    checked = 0
    for case in suite:
        if case.model_builder is not None:  # MX / NVFP4: no single node
            continue
        node_inputs = [array for _name, array in case.inputs]
        want = qemu_q.run_op(case.op_type, node_inputs, case.attributes, case.config.version)
        got, bits = datapaths.run_node(case.op_type, node_inputs, case.attributes,
                                       case.config.version, qemu_q.Datapath())
        assert bits is None
        for (name, expected), a, b in zip(case.outputs, want, got):
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == b.dtype == expected.dtype and _bits(a) == _bits(b) == _bits(expected), \
                (case.name, name)
        checked += 1
    assert checked > 10000


def test_generate_and_selection_refuse_bad_arguments():
    """The Python API checks what the CLI's options check: a string is one value, not a
    sequence of its characters; sizes and seeds are ints; the selection is a Selection."""
    selection = golden.Selection(ops=("q",), opsets=(21,), types=("int8",))
    for kwargs, error, fragment in [
            (dict(size=0), ValueError, "size=0"), (dict(size=2.5), TypeError, "size must be an int"),
            (dict(size=True), TypeError, "size must be an int"), (dict(seed="abc"), TypeError, "seed must be an int"),
            (dict(seed=None), TypeError, "seed must be an int")]:
        with pytest.raises(error, match=re.escape(fragment)):
            golden.generate(selection, **kwargs)
    with pytest.raises(TypeError, match=re.escape("selection must be a qemu_q.golden.Selection")):
        golden.generate({"ops": ["q"]})
    for kwargs, error, fragment in [
            (dict(variants="base"), TypeError, "variants='base'; expected a sequence"),
            (dict(opsets=21), TypeError, "opsets=21; expected a sequence"),
            (dict(opsets=("21",)), TypeError, "opsets holds '21'"),
            (dict(types=()), ValueError, "types=() selects nothing")]:
        with pytest.raises(error, match=re.escape(fragment)):
            golden.Selection(**kwargs)
    assert golden.Selection(variants=["base"]).variants == ("base",)
    assert len(list(golden.generate(selection, size=8))) == len(list(golden.iter_configs(selection)))
