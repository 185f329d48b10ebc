"""Peer profiles (qemu_q.profiles): each reproduces its peer's bits on every golden case
where the peer runs, except its listed remainder (docs/divergences.md, "Peer profiles");
every remainder entry still differs. The peers' outputs are the session's
`golden_peer_runs` (tests/conftest.py), shared with tests/test_golden.py."""

import collections
import dataclasses
import pathlib
import re
import types
from collections import defaultdict
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import golden, profiles
from qemu_q.datapath import Datapath
from qemu_q.golden import datapaths

import float_oracle as fo
from support import assert_same_bits, same_bits

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIVERGENCES_DOC = ROOT / "docs" / "divergences.md"
VNNI = {"avx_vnni", "avx512_vnni", "avx512vnni"}


def cpu_flags() -> set[str]:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    match = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(match.group(1).split()) if match else set()


def documented_headings() -> set[str]:
    text = DIVERGENCES_DOC.read_text(encoding="utf-8")
    return {line[3:].strip() for line in text.splitlines() if line.startswith("## ")}


def peer_profile(peer: str) -> profiles.Profile:
    """The profile of the peer as it runs on this machine."""
    if peer == golden.ONNXRUNTIME:
        datapath = profiles.onnxruntime_cpu_for(cpu_flags())
        return next(p for p in profiles.PROFILES.values() if p.datapath == datapath
                    and p.peer == peer)
    return profiles.PROFILES["onnx_reference"]


# --------------------------------------------------------------------------------------
# The profiles as data


def test_importable_as_qemu_q_profiles():
    import qemu_q.profiles as module

    assert qemu_q.profiles is module
    assert "profiles" in qemu_q.__all__


def test_profile_fields():
    float32_ql = ("QuantizeLinear", 19, 21, {"scale_precision": "float32"})
    float32_dq = ("DequantizeLinear", 1, 28, {"scale_precision": "float32"})
    assert profiles.onnxruntime_cpu == Datapath(requantization="float32",
                                                float8_encoder="onnxruntime",
                                                by_version=(float32_ql, float32_dq))
    assert profiles.onnxruntime_cpu_avx2 == Datapath(
        requantization="float32", accumulator="x86-u8s8-pairs", float8_encoder="onnxruntime",
        by_version=(float32_ql, float32_dq))
    ml_dtypes_nan = tuple((op, 1, 28, {"nan": "zero_opposite_sign"})
                          for op in ("QuantizeLinear", "Cast", "CastLike"))
    assert profiles.onnx_reference == Datapath(requantization="float64", scale_precision="promoted",
                                               by_version=ml_dtypes_nan)
    # resolved per version: float32 division at QuantizeLinear-19/21 only
    assert profiles.onnxruntime_cpu.for_op("QuantizeLinear", 20).scale_precision == "float32"
    assert profiles.onnxruntime_cpu.for_op("QuantizeLinear", 23).scale_precision is None
    assert profiles.onnxruntime_cpu.for_op("QuantizeLinear", 13).scale_precision is None
    assert profiles.onnx_reference.for_op("QuantizeLinear", 21).scale_precision == "promoted"
    for name, profile in profiles.PROFILES.items():
        assert profile.name == name
        assert getattr(profiles, name) is profile.datapath
        assert profile.peer in (golden.REFERENCE, golden.ONNXRUNTIME)
        assert not profile.datapath.is_onnx


def test_onnxruntime_profile_by_cpu():
    assert profiles.onnxruntime_cpu_for({"avx2"}) is profiles.onnxruntime_cpu_avx2
    assert profiles.onnxruntime_cpu_for({"avx2", "avx512_vnni"}) is profiles.onnxruntime_cpu
    assert profiles.onnxruntime_cpu_for({"avx2", "avx_vnni"}) is profiles.onnxruntime_cpu
    assert profiles.onnxruntime_cpu_for(set()) is profiles.onnxruntime_cpu
    # a /proc/cpuinfo flags line is its names, not its characters
    assert profiles.onnxruntime_cpu_for("fpu sse2 avx2 fma") is profiles.onnxruntime_cpu_avx2
    assert profiles.onnxruntime_cpu_for("avx2 avx512_vnni") is profiles.onnxruntime_cpu
    for bad, match in ((None, "cpu_flags must be an iterable"), (3, "cpu_flags must be an iterable"),
                       ({"avx2", 3}, "cpu_flags must hold flag names")):
        with pytest.raises(TypeError, match=re.escape(match)):
            profiles.onnxruntime_cpu_for(bad)


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_tables_name_documented_headings(name):
    profile = profiles.PROFILES[name]
    headings = documented_headings()
    table_headings = {h for h, _who, _p in golden.DIVERGENCES}
    for heading in (*profile.reproduces, *profile.remainder):
        assert heading in headings, f"{name}: {heading!r} is no docs/divergences.md heading"
    for heading, reason in profile.remainder.items():
        assert heading in table_headings, heading  # so the golden cases can show it
        assert isinstance(reason, str) and len(reason) > 30, heading
    assert not set(profile.reproduces) & set(profile.remainder)


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_as_json_is_what_golden_reads(name):
    datapath = profiles.PROFILES[name].datapath
    assert datapaths.parse_datapath(__import__("json").loads(profiles.as_json(datapath))) \
        == datapath
    # a Profile stands for its datapath
    assert profiles.as_json(profiles.PROFILES[name]) == profiles.as_json(datapath)


def test_as_json_refuses_what_is_no_datapath():
    for bad in ("x", None, {"rounding": "up"}):
        with pytest.raises(TypeError, match=re.escape("datapath must be a qemu_q.Datapath or a "
                                                      "qemu_q.profiles.Profile")):
            profiles.as_json(bad)


def test_profiles_section_documents_every_profile():
    text = DIVERGENCES_DOC.read_text(encoding="utf-8")
    assert "\n# Peer profiles\n" in text
    section = text[text.index("\n# Peer profiles\n"):]
    for name, profile in profiles.PROFILES.items():
        start = section.index(f"### `{name}`")
        end = section.find("\n### ", start + 1)
        words = " ".join(section[start:end if end > 0 else None].split())  # lines rewrapped
        for heading in (*profile.reproduces, *profile.remainder):
            assert f'"{heading}"' in words, (name, heading)
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for name in profiles.PROFILES:
        assert f"profiles.{name}" in api, name


# --------------------------------------------------------------------------------------
# Every golden case where the peer runs


@pytest.fixture(scope="module")
def profile_results(golden_suite, golden_peer_runs):
    """peer -> {"match": [...], "mismatch": {case: headings},
    "shown": {heading}, "reproduced": {heading: [(case, same)]}} for the peer's profile on
    this machine."""
    results = {}
    for peer in (golden.REFERENCE, golden.ONNXRUNTIME):
        profile = peer_profile(peer)
        found = {"match": [], "mismatch": {}, "shown": set(),
                 "reproduced": defaultdict(list)}
        for case in golden_suite:
            status, outputs = golden_peer_runs[(peer, case.name)]
            if status != "ran":
                continue
            config = case.config
            if config.op_type in datapaths.NO_DATAPATH_OPS:
                mine = case  # the op takes no datapath: its ONNX bits
            else:
                mine = golden.build_case(config, datapath=profile.datapath)
            same = all(same_bits(a, b) for (_n, a), b in zip(mine.outputs, outputs))
            all_rows = {h for h, _who in golden.divergences_of(config)}
            for heading in profile.reproduces:
                if heading in all_rows:
                    found["reproduced"][heading].append((case.name, same))
            if same:
                found["match"].append(case.name)
                continue
            headings = [h for h, who in case.divergences if peer in who]
            found["mismatch"][case.name] = headings
            found["shown"].update(headings)
        results[peer] = found
    return results


@pytest.mark.parametrize("peer", [golden.REFERENCE, golden.ONNXRUNTIME])
def test_profile_reproduces_the_peer_outside_its_remainder(profile_results, peer):
    profile = peer_profile(peer)
    found = profile_results[peer]
    unexplained = [f"{name}: {headings or 'no divergence row'}"
                   for name, headings in found["mismatch"].items()
                   if not set(headings) & set(profile.remainder)]
    headings = sorted({h for name, hs in found["mismatch"].items()
                       if not set(hs) & set(profile.remainder) for h in hs or ["(none)"]})
    assert not unexplained, (f"{profile.name} differs from {peer} on {len(unexplained)} cases "
                             f"outside its remainder, under the headings {headings}:\n"
                             + "\n".join(unexplained[:30]))
    assert len(found["match"]) > 1000


@pytest.mark.parametrize("peer", [golden.REFERENCE, golden.ONNXRUNTIME])
def test_every_remainder_entry_still_differs(profile_results, peer):
    profile = peer_profile(peer)
    stale = sorted(set(profile.remainder) - profile_results[peer]["shown"])
    assert not stale, f"{profile.name}: remainder entries no golden case shows any more: {stale}"


@pytest.mark.parametrize("peer", [golden.REFERENCE, golden.ONNXRUNTIME])
def test_reproduced_rows_match_on_every_case(profile_results, peer):
    """Each reproduced heading that is a row of the golden table: the profile gives the
    peer's bits on every case of the row the peer runs (and, for the row's peers, those
    bits differ from the ONNX default: the profile changed something)."""
    profile = peer_profile(peer)
    rows = {h for h, _who, _p in golden.DIVERGENCES}
    for heading in profile.reproduces:
        if heading not in rows:
            continue  # not visible in the suite: pinned by the direct tests below
        cases = profile_results[peer]["reproduced"][heading]
        assert cases, (profile.name, heading)
        assert all(same for _name, same in cases), (profile.name, heading, cases[:5])


# --------------------------------------------------------------------------------------
# The documented entries' own inputs, through the peers


def _qlinear_inputs(a, a_scale, y_zero_point):
    return [np.array([[a]], np.uint8), np.float32(a_scale), np.uint8(0),
            np.array([[1]], np.uint8), np.float32(1.0), np.uint8(0),
            np.float32(1.0), np.uint8(y_zero_point)]


def _onnxruntime(op_type, inputs, output_type, **attributes):
    onnx = pytest.importorskip("onnx", reason="the peer runs need onnx (test extra)")
    ort = pytest.importorskip("onnxruntime", reason="the peer runs need onnxruntime (test extra)")
    helper = onnx.helper
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attributes)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                       list(np.shape(v))) for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info("y", output_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {n: np.asarray(v) for n, v in zip(names, inputs)})[0]


def _reference(op_type, inputs, output_type):
    onnx = pytest.importorskip("onnx", reason="the peer runs need onnx (test extra)")
    from onnx.reference import ReferenceEvaluator

    helper = onnx.helper
    names = [f"i{k}" for k in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, ["y"])], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                       list(np.shape(v))) for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info("y", output_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, {n: np.asarray(v) for n, v in zip(names, inputs)})[0]


def _fl32(value: Fraction) -> Fraction:
    return fo.round_to_binary(value, "float")


@pytest.mark.parametrize("name", ["onnxruntime_cpu", "onnxruntime_cpu_avx2"])
def test_onnxruntime_requantization_entry(name):
    """docs/divergences.md, requantization entry, input (2): acc = 25, a_scale = fl32(0.1)
    (13421773 * 2^-27). onnxruntime: fl32(fl32(acc) * fl32(multiplier)) = fl32(2.5 + 5 *
    2^-27) = 2.5 -> 2; the exact rule: 3."""
    profile = profiles.PROFILES[name]
    inputs = _qlinear_inputs(25, 0.1, 0)
    a_scale = Fraction(float(np.float32(0.1)))
    assert a_scale == Fraction(13421773, 2**27)
    multiplier = _fl32(a_scale * 1 / 1)
    want_float32 = fo.round_half_even(_fl32(25 * multiplier))
    want_exact = fo.round_half_even(25 * a_scale)
    assert (want_float32, want_exact) == (2, 3)
    # Through the golden helper: until branch mxint merges, qlinear_matmul reads
    # datapath.requantization only as the helper passes it (requantization=).
    got = datapaths.call_op(qemu_q.qlinear_matmul, *inputs, datapath=profile.datapath)
    assert got.tolist() == [[want_float32]]
    assert qemu_q.qlinear_matmul(*inputs).tolist() == [[want_exact]]
    import onnx

    assert _onnxruntime("QLinearMatMul", inputs, onnx.TensorProto.UINT8).tolist() == \
        [[want_float32]]


def test_reference_requantization_entry():
    """Input (1): acc * a_scale = 2.5 exactly, y_zero_point 1: onnx.reference adds the zero
    point before rounding, RNE(3.5) = 4; the exact rule RNE(2.5) + 1 = 3."""
    inputs = _qlinear_inputs(5, 0.5, 1)
    want_float64 = fo.round_half_even(Fraction(5) * Fraction(1, 2) + 1)
    want_exact = fo.round_half_even(Fraction(5) * Fraction(1, 2)) + 1
    assert (want_float64, want_exact) == (4, 3)
    got = datapaths.call_op(qemu_q.qlinear_matmul, *inputs, datapath=profiles.onnx_reference)
    assert got.tolist() == [[want_float64]]
    import onnx

    assert _reference("QLinearMatMul", inputs, onnx.TensorProto.UINT8).tolist() == \
        [[want_float64]]


def test_onnxruntime_u8s8_entry_on_this_cpu():
    """The u8 x s8 entry: A = 255 x 4, B = 127 x 4. Pairs: each 2 * 255 * 127 = 64770
    saturates to int16 32767: 65534; exact: 129540. The profile of this CPU gives
    onnxruntime's bits."""
    import onnx

    a = np.full((1, 4), 255, np.uint8)
    b = np.full((4, 1), 127, np.int8)
    inputs = [a, b, np.uint8(0), np.int8(0)]
    exact = sum(255 * 127 for _ in range(4))
    pairs = sum(min(255 * 127 + 255 * 127, 2**15 - 1) for _ in range(2))
    assert (exact, pairs) == (129540, 65534)
    flags = cpu_flags()
    datapath = profiles.onnxruntime_cpu_for(flags)
    want = pairs if datapath.accumulator == "x86-u8s8-pairs" else exact
    got = datapaths.call_op(qemu_q.matmul_integer, *inputs, datapath=datapath)
    assert got.tolist() == [[want]]
    assert datapaths.call_op(qemu_q.matmul_integer, *inputs,
                             datapath=profiles.onnxruntime_cpu_avx2).tolist() == [[pairs]]
    theirs = _onnxruntime("MatMulInteger", inputs, onnx.TensorProto.INT32).tolist()
    if "avx2" in flags or flags & VNNI:
        assert theirs == [[want]]
    else:  # another instruction set: onnxruntime's path is one of the two models
        assert theirs in ([[exact]], [[pairs]])


def test_onnxruntime_conv_integer_s8u8_entry_on_this_cpu():
    """The ConvInteger s8 x u8 entry: x = int8 -64 with x_zero_point 127, w = uint8 255 x 4
    taps, pads 2 above and 1 below: K holds the raw codes (127, 127, -64, 127). Pairs:
    min(2 * 127 * 255, 32767) + (-64 + 127) * 255 - 127 * 4 * 255; exact: (-64 - 127) * 255.
    The profile of this CPU gives onnxruntime's bits."""
    import onnx

    inputs = [np.array([[[[-64]]]], np.int8), np.full((1, 1, 4, 1), 255, np.uint8), np.int8(127), np.uint8(0)]
    exact = (-64 - 127) * 255
    pairs = min(2 * 127 * 255, 2**15 - 1) + (-64 + 127) * 255 - 127 * 4 * 255
    assert (exact, pairs) == (-48705, -80708)
    flags = cpu_flags()
    datapath = profiles.onnxruntime_cpu_for(flags)
    want = pairs if datapath.accumulator == "x86-u8s8-pairs" else exact
    got = datapaths.call_op(qemu_q.conv_integer, *inputs, datapath=datapath, pads=[2, 0, 1, 0])
    assert got.tolist() == [[[[want]]]]
    assert datapaths.call_op(qemu_q.conv_integer, *inputs, datapath=profiles.onnxruntime_cpu_avx2,
                             pads=[2, 0, 1, 0]).tolist() == [[[[pairs]]]]
    theirs = _onnxruntime("ConvInteger", inputs, onnx.TensorProto.INT32, pads=[2, 0, 1, 0]).tolist()
    if "avx2" in flags or flags & VNNI:
        assert theirs == [[[[want]]]]
    else:  # another instruction set: onnxruntime's path is one of the two models
        assert theirs in ([[[[exact]]]], [[[[pairs]]]])


def _onnxruntime_codes(op_type, inputs, output_type, opset, **attributes) -> list[int]:
    """onnxruntime's output codes, through IOBinding and raw bytes (its numpy API takes no
    float8 arrays): tests/test_divergences.py's runner."""
    pytest.importorskip("onnxruntime", reason="the peer runs need onnxruntime (test extra)")
    from test_divergences import run_ort

    result = run_ort(op_type, list(inputs), attributes, opset, [output_type])
    assert not isinstance(result, Exception), result
    return [int(c) for c in result[0][1]]


# The float8 entries' own inputs (docs/divergences.md): (target, saturate, x, onnxruntime's
# codes as the entries state them). QuantizeLinear takes them with a unit scale.
_FLOAT8_ENTRIES = [
    ("float8e4m3fn", 0, [480, 490, 495.75, -480, -495.75], [0x7E, 0x7E, 0x7E, 0xFE, 0xFE]),
    ("float8e5m2", 0, [61440, 65504, -61440], [0x7F, 0x7F, 0xFF]),
    ("float8e5m2", 1, [np.nan, -np.nan], [0x7F, 0xFF]),
    ("float8e5m2", 0, [np.nan, -np.nan], [0x7F, 0xFF]),
    ("float8e4m3fnuz", 1, [np.inf, -np.inf], [0x7F, 0xFF]),
    ("float8e5m2fnuz", 1, [np.inf, -np.inf], [0x7F, 0xFF]),
]


@pytest.mark.parametrize("name", ["onnxruntime_cpu", "onnxruntime_cpu_avx2"])
@pytest.mark.parametrize("target, saturate, values, want", _FLOAT8_ENTRIES)
@pytest.mark.parametrize("opset", [19, 21])
def test_onnxruntime_float8_entries(name, target, saturate, values, want, opset):
    """The float8 entries' inputs: the profile gives the stated codes through QuantizeLinear
    and Cast, onnxruntime gives them too, and the ONNX default does not (for -NaN the
    profile keeps the sign as onnxruntime's float32 path does)."""
    import onnx

    datapath = profiles.PROFILES[name].datapath
    x = np.array(values, np.float32)  # -np.nan: the sign bit set (0xFFC00000)
    assert x.view(np.uint32).tolist()[-1] != 0x7FC00000
    tensor_type = getattr(onnx.TensorProto, target.upper())
    zero_point = qemu_q.cast(np.zeros(1, np.float32), target).reshape(())
    got = qemu_q.quantize_linear(x, np.float32(1.0), zero_point, saturate=saturate, opset=opset,
                                 datapath=datapath)
    assert got.view(np.uint8).tolist() == want
    default = qemu_q.quantize_linear(x, np.float32(1.0), zero_point, saturate=saturate, opset=opset)
    assert default.view(np.uint8).tolist() != want
    theirs = _onnxruntime_codes("QuantizeLinear", [x, np.float32(1.0), zero_point], tensor_type,
                                opset, saturate=saturate)
    assert theirs == want
    got = qemu_q.cast(x, target, saturate=saturate, opset=opset, datapath=datapath)
    assert got.view(np.uint8).tolist() == want
    theirs = _onnxruntime_codes("Cast", [x], tensor_type, opset, to=tensor_type, saturate=saturate)
    assert theirs == want


@pytest.mark.parametrize("saturate, want", [(0, [0x7F, 0x7F]), (1, [0x7F, 0xFF])])
def test_onnxruntime_bfloat16_negative_nan_entry(saturate, want):
    """Cast bfloat16 [+nan, -nan] into e4m3fn: onnxruntime drops the sign with saturate=0
    only; the profile gives the same, the default keeps the sign."""
    import ml_dtypes
    import onnx

    x = np.array([0x7FC0, 0xFFC0], np.uint16).view(ml_dtypes.bfloat16)
    got = qemu_q.cast(x, "float8e4m3fn", saturate=saturate, opset=21,
                      datapath=profiles.onnxruntime_cpu)
    assert got.view(np.uint8).tolist() == want
    assert qemu_q.cast(x, "float8e4m3fn", saturate=saturate, opset=21).view(np.uint8).tolist() \
        == [0x7F, 0xFF]
    tensor_type = onnx.TensorProto.FLOAT8E4M3FN
    assert _onnxruntime_codes("Cast", [x], tensor_type, 21, to=tensor_type,
                              saturate=saturate) == want


def test_profiles_leave_quantize_linear_on_its_onnx_bits():
    """float32 x and scale into int8: every profile gives the ONNX bits (onnx_reference's
    "promoted" is float32 there, and the integer ops' fields are ignored: docs/semantics.md's rule),
    on ties and their neighbours."""
    x = np.array([0.5, 1.5, 2.5, -2.5, 2.5000002, 127.5, -128.5, 300.0, np.nan], np.float32)
    want = [fo.round_half_even(Fraction(float(v))) if np.isfinite(v) else None for v in x]
    want = [-128 if w is None else min(max(w, -128), 127) for w in want]
    for profile in profiles.PROFILES.values():
        got = qemu_q.quantize_linear(x, np.float32(1.0), np.int8(0), datapath=profile.datapath)
        assert_same_bits(got, np.array(want, np.int8), profile.name)


def test_call_op_passes_the_datapath():
    seen = []

    def takes(x, *, datapath=None):
        seen.append(datapath)
        return x

    custom = Datapath(rounding="half_away")
    assert datapaths.call_op(takes, 1, datapath=custom) == 1 and seen[-1] is custom
    assert datapaths.call_op(takes, 1, datapath=None) == 1 and seen[-1] == Datapath()
    with pytest.raises(datapaths.DatapathNotTaken, match="random_bits"):
        datapaths.call_op(takes, 3, datapath=Datapath(rounding="stochastic"),
                          random_bits=np.zeros(1, np.uint32))
    assert len(seen) == 2


def test_dynamic_quantize_linear_never_takes_a_datapath():
    config = next(golden.iter_configs(golden.Selection(ops=("DynamicQuantizeLinear",))))
    with pytest.raises(datapaths.DatapathNotTaken, match="DynamicQuantizeLinear takes no datapath="):
        golden.build_case(config, datapath=profiles.onnx_reference)
    assert "DynamicQuantizeLinear" in datapaths.NO_DATAPATH_OPS


def test_dataclass_replace_keeps_profiles_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        profiles.onnxruntime_cpu.requantization = "exact"
    with pytest.raises(TypeError):
        profiles.PROFILES["onnx_reference"].remainder["x"] = "y"


# --------------------------------------------------------------------------------------
# Datapath.by_version: fields for some versions of one op


def test_by_version_is_validated_and_frozen():
    entry = ["QuantizeLinear", 19, 21, {"scale_precision": "float32"}]
    datapath = Datapath(by_version=[entry])  # lists and dicts, as JSON gives them
    assert datapath.by_version == (("QuantizeLinear", 19, 21, (("scale_precision", "float32"),)),)
    hash(datapath)
    for bad, match in [
            ("x", "by_version='x'"),
            ([["Foo", 1, 2, {}]], "op_type='Foo'"),
            ([["QuantizeLinear", 3, 2, {}]], "3..2"),
            ([["QuantizeLinear", 0, 2, {}]], "first_version=0"),
            ([["QuantizeLinear", True, 2, {}]], "first_version=True"),
            ([["QuantizeLinear", 1, 2, {"bogus": "x"}]], "field 'bogus'"),
            ([["QuantizeLinear", 1, 2, {"by_version": ()}]], "field 'by_version'"),
            ([["QuantizeLinear", 1, 10, {"rounding": "nearest"}]], "rounding='nearest'"),
            ([["QuantizeLinear", 1, 2]], "entry"),
            # a field twice: no order of the pairs would say which holds
            ([["QuantizeLinear", 10, 28, [("rounding", "up"), ("rounding", "down")]]],
             "gives the field 'rounding' twice"),
            ([["QuantizeLinear", 10, 28, ["ab"]]], "allowed a mapping of Datapath fields"),
            # QuantizeLinear's versions are 19 and 21, none in between
            ([["QuantizeLinear", 20, 20, {"rounding": "up"}]], "versions 20..20 hold no version"),
            ([["QuantizeLinear", 1, 2, {}]], "versions 1..2 hold no version")]:
        with pytest.raises(ValueError, match=re.escape(match)):
            Datapath(by_version=bad)


def test_by_version_takes_any_mapping():
    for overrides in (types.MappingProxyType({"rounding": "up"}), collections.UserDict(rounding="up"),
                      collections.ChainMap({"rounding": "up"}), [("rounding", "up")]):
        datapath = Datapath(by_version=[("QuantizeLinear", 19, 21, overrides)])
        assert datapath.by_version == (("QuantizeLinear", 19, 21, (("rounding", "up"),)),)
        assert datapath.for_op("QuantizeLinear", 21).rounding == "up"
    # a two-letter field name is a name, not a (field, value) pair
    with pytest.raises(ValueError, match=re.escape("by_version field 'up'")):
        Datapath(by_version=[("QuantizeLinear", 19, 21, types.MappingProxyType({"up": "x"}))])


def test_by_version_is_checked_with_the_datapath_it_overrides():
    """An entry's fields hold together with the datapath's own at every version it
    applies to: valid combinations are accepted whichever side gives which field, invalid
    ones are refused when the Datapath is made, naming the version."""
    split = Datapath(scale_precision="float32",
                     by_version=[("QuantizeLinear", 19, 21, {"scale": "reciprocal"})])
    assert split.for_op("QuantizeLinear", 19) == Datapath(scale="reciprocal", scale_precision="float32")
    assert split.for_op("QuantizeLinear", 23) == Datapath(scale_precision="float32")
    with pytest.raises(ValueError, match=re.escape("by_version, as QuantizeLinear-19 resolves it: "
                                                   "scale='reciprocal' with scale_precision=None")):
        Datapath(scale="reciprocal", scale_precision="float32",
                 by_version=[("QuantizeLinear", 19, 21, {"scale_precision": None})])
    # overlapping entries combine, in order, before the check
    with pytest.raises(ValueError, match=re.escape("as QuantizeLinear-21 resolves it")):
        Datapath(by_version=[("QuantizeLinear", 19, 28, {"scale": "reciprocal"}),
                             ("QuantizeLinear", 10, 19, {"scale_precision": "float64"})])


def test_by_version_resolves_at_the_op_version():
    datapath = Datapath(rounding="half_away", by_version=[
        ("QuantizeLinear", 19, 21, {"scale_precision": "float32"}),
        ("QuantizeLinear", 21, 28, {"rounding": "toward_zero"})])
    assert datapath.for_op("QuantizeLinear", 20) == Datapath(rounding="half_away",
                                                             scale_precision="float32")
    assert datapath.for_op("QuantizeLinear", 22) == Datapath(rounding="toward_zero",
                                                             scale_precision="float32")
    assert datapath.for_op("QuantizeLinear", None) == Datapath(rounding="toward_zero")
    assert datapath.for_op("QuantizeLinear", 13) == Datapath(rounding="half_away")
    assert datapath.for_op("DequantizeLinear", 21) == Datapath(rounding="half_away")
    assert Datapath().for_op("QuantizeLinear", 21) is not None


def test_by_version_reaches_quantize_linear():
    """QuantizeLinear resolves the entry at its version: at 19 and 21 the float32 division
    (which differs from the version's own on these float16 inputs: checked), at 23 and 25
    the datapath without it."""
    rng = np.random.default_rng(15)
    x = (rng.standard_normal(4096) * 2).astype(np.float16)
    scale = np.float16(0.0123)
    zero_point = np.int8(0)
    split = Datapath(by_version=[("QuantizeLinear", 19, 21, {"scale_precision": "float32"})])
    float32 = Datapath(scale_precision="float32")
    for opset, explicit in ((19, float32), (21, float32), (23, Datapath()), (25, Datapath())):
        got = qemu_q.quantize_linear(x, scale, zero_point, opset=opset, datapath=split)
        want = qemu_q.quantize_linear(x, scale, zero_point, opset=opset, datapath=explicit)
        assert got.view(np.uint8).tolist() == want.view(np.uint8).tolist(), opset
        if explicit is float32:
            default = qemu_q.quantize_linear(x, scale, zero_point, opset=opset)
            assert got.view(np.uint8).tolist() != default.view(np.uint8).tolist(), opset


# --------------------------------------------------------------------------------------
# onnx_reference: numpy's promotion and ml_dtypes' NaN (the entries' own inputs)


def _reference_node(op_type, inputs, opset, **attributes):
    onnx = pytest.importorskip("onnx", reason="the peer runs need onnx (test extra)")
    from onnx.reference import ReferenceEvaluator

    helper = onnx.helper
    names = [f"i{k}" for k in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, ["y"], **attributes)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                       list(np.shape(v))) for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN into float4/float6
        return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


def _f32(bits):
    return np.array(bits, np.uint32).view(np.float32)


# docs/divergences.md, the entries' inputs: (opset, x, y_scale, y_zero_point, the ONNX codes,
# onnx.reference's codes as the entries state them)
_PROMOTED_ENTRIES = [
    # "QL: int32 x or int32 scale, onnx.reference divides in float64": the exact quotient
    # 100.5 + 2^-19 is 100.5 in float32 (-> 100) and keeps its 2^-19 in float64 (-> 101)
    (13, np.array([52690945], np.int32), np.float32(524288.0), np.int8(0), [0x64], [0x65]),
    (19, np.array([52690945], np.int32), np.int32(524288), np.int8(0), [0x64], [0x65]),
    (23, _f32([0x4E810001]), np.int32(16777217), np.int8(0), [0x40], [0x41]),
    # "QL-23+: float32 x with a float16 or bfloat16 scale": numpy divides in float32
    (23, np.array([2.5009765625], np.float32), np.float16(1.0), np.int8(0), [0x02], [0x03]),
    (23, _f32([0x4163F141]), np.array([0x34CD], np.uint16).view(np.float16).reshape(()),
     np.int8(0), [0x2F], [0x2F]),
    (23, np.array([2.5009765625], np.float32), ml_dtypes.bfloat16(1.0), np.int8(0), [0x02], [0x03]),
]


@pytest.mark.parametrize("opset, x, scale, zero_point, onnx_codes, peer_codes", _PROMOTED_ENTRIES)
def test_reference_promoted_entries(opset, x, scale, zero_point, onnx_codes, peer_codes):
    """The profile's "promoted" division gives onnx.reference's codes (an exact oracle:
    the quotient rounded once to float64 or float32, then to even), the default the
    ONNX ones, and the peer the stated ones."""
    q = Fraction(float(np.asarray(x).astype(np.float64)[0])) / Fraction(
        float(np.asarray(scale).astype(np.float64)))
    precision = "double" if np.int32 in (np.asarray(x).dtype.type, np.asarray(scale).dtype.type) \
        else "float"
    rounded = Fraction(float(q)) if precision == "double" else _fl32(q)
    assert [fo.round_half_even(rounded) & 0xFF] == peer_codes
    got = qemu_q.quantize_linear(x, scale, zero_point, opset=opset, datapath=profiles.onnx_reference)
    assert got.view(np.uint8).tolist() == peer_codes
    assert qemu_q.quantize_linear(x, scale, zero_point, opset=opset).view(np.uint8).tolist() \
        == onnx_codes
    assert _reference_node("QuantizeLinear", [x, scale, zero_point], opset).view(np.uint8).tolist() \
        == peer_codes


@pytest.mark.parametrize("target, width, opset", [("float4e2m1", 4, 23), ("float6e2m3", 6, 28),
                                                  ("float6e3m2", 6, 28)])
def test_reference_float4_float6_nan_entries(target, width, opset):
    """"QL float4/float6: NaN" and "Cast float4e2m1 / float6: NaN with the sign bit": the
    rule's codes (+NaN the negative-zero code, -NaN +0; a float8 NaN code by its sign bit),
    through the profile and the peer; the ONNX default's are +max (QuantizeLinear) and the
    negative-zero code (Cast)."""
    import onnx

    x = _f32([0x7FC00000, 0xFFC00000])
    want = [1 << (width - 1), 0]
    tensor_type = getattr(onnx.TensorProto, target.upper())
    got = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype=target, opset=opset,
                                 datapath=profiles.onnx_reference)
    assert got.view(np.uint8).tolist() == want
    assert qemu_q.quantize_linear(x, np.float32(1.0), output_dtype=target,
                                  opset=opset).view(np.uint8).tolist() == [(1 << (width - 1)) - 1] * 2
    peer = _reference_node("QuantizeLinear", [x, np.float32(1.0)], opset, output_dtype=tensor_type)
    assert peer.view(np.uint8).tolist() == want
    cast_opset = max(opset, 25)
    sources = [(x, want),
               (np.array([0x7F, 0xFF], np.uint8).view(ml_dtypes.float8_e4m3fn), want),
               (np.array([0x80], np.uint8).view(ml_dtypes.float8_e4m3fnuz), [0])]
    for source, codes in sources:
        for op_type in ("Cast", "CastLike") if width == 4 else ("Cast",):  # no CastLike into float6
            function = qemu_q.cast if op_type == "Cast" else qemu_q.cast_like
            like = np.zeros(1, np.uint8).view(getattr(ml_dtypes, {
                "float4e2m1": "float4_e2m1fn", "float6e2m3": "float6_e2m3fn",
                "float6e3m2": "float6_e3m2fn"}[target]))
            target_arg = target if op_type == "Cast" else like
            got = function(source, target_arg, opset=cast_opset, datapath=profiles.onnx_reference)
            assert got.view(np.uint8).tolist() == codes, (op_type, source.dtype)
        assert qemu_q.cast(source, target, opset=cast_opset).view(np.uint8).tolist() == \
            [1 << (width - 1)] * len(codes)
        peer = _reference_node("Cast", [source], cast_opset, to=tensor_type)
        assert peer.view(np.uint8).tolist() == codes, source.dtype
