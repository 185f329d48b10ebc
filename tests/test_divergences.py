"""docs/divergences.md, checked: where onnx.reference or onnxruntime give other bits than qemu_q.

Every entry of the document has a test here (matched by its heading). Each test runs the
concrete input of the entry through qemu_q and through both peers and asserts

(a) qemu_q's bits are the value our rule (docs/semantics.md) gives, computed here
    independently (exact rational arithmetic or tests/float_oracle.py), and
(b) each peer's bits are what the document says, so the document stays true: when a peer
    changes, its test fails and the entry must be updated.

The last part checks that a representative set of non-divergent cases agree bit for bit
across all three, so the list is complete for what was probed.

onnxruntime runs on the CPU provider with graph optimizations disabled; inputs and outputs
go through IOBinding/OrtValue as raw bytes (sub-byte types packed as ONNX stores them), so
every output type can be compared.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import pathlib
import re
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo  # noqa: E402
import support  # noqa: E402

import qemu_q  # noqa: E402

onnx = pytest.importorskip("onnx", reason="the peers need onnx (test extra)")
ort = pytest.importorskip("onnxruntime", reason="the peers need onnxruntime (test extra)")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "divergences.md"

f32, f16, bf16 = np.float32, np.float16, ml_dtypes.bfloat16
E4M3FN, E4M3FNUZ = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz
E5M2, E5M2FNUZ = ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz
F4, F6E2M3, F6E3M2, E8M0 = (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn,
                            ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e8m0fnu)

# ONNX element type <-> numpy dtype, and the width of the packed types.
ONNX_TYPE = {
    np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.float16): 10, np.dtype(bf16): 16,
    np.dtype(E4M3FN): 17, np.dtype(E4M3FNUZ): 18, np.dtype(E5M2): 19, np.dtype(E5M2FNUZ): 20,
    np.dtype(ml_dtypes.uint4): 21, np.dtype(ml_dtypes.int4): 22, np.dtype(F4): 23,
    np.dtype(E8M0): 24, np.dtype(ml_dtypes.uint2): 25, np.dtype(ml_dtypes.int2): 26,
    np.dtype(F6E2M3): 27, np.dtype(F6E3M2): 28,
    np.dtype(np.int64): 7, np.dtype(np.bool_): 9, np.dtype(np.float64): 11,
    np.dtype(np.uint32): 12, np.dtype(np.uint64): 13,
}
NUMPY_TYPE = {v: k for k, v in ONNX_TYPE.items()}
PACKED_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2, 27: 6, 28: 6}
ORT_TYPE_NAME = {f"tensor({name.lower()})": value for name, value in TensorProto.DataType.items()}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
NAN32 = np.array([0x7FC00000], np.uint32).view(f32)[0]
NEG_NAN32 = np.array([0xFFC00000], np.uint32).view(f32)[0]

# --------------------------------------------------------------------------- peers


def _model(op, inputs, attrs, opset, out_types):
    names = ["x", "s", "z"][: len(inputs)]
    node_inputs = [n if a is not None else "" for n, a in zip(names, inputs)]
    while node_inputs and not node_inputs[-1]:
        node_inputs.pop()
    outs = ["y", "y_scale", "y_zero_point"][: len(out_types)]
    node = helper.make_node(op, node_inputs, outs, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, ONNX_TYPE[a.dtype], a.shape)
                    for n, a in zip(names, inputs) if a is not None]
    graph_outputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(outs, out_types)]
    graph = helper.make_graph([node], "divergence", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset < 23 else 11
    return model


def codes(a) -> np.ndarray:
    """Element bit patterns of a numpy/ml_dtypes array, one unsigned int per element."""
    a = np.ascontiguousarray(np.asarray(a))
    c = a.view(UINT[a.dtype.itemsize]).reshape(-1).copy()
    bits = PACKED_BITS.get(ONNX_TYPE[a.dtype])
    return c & ((1 << bits) - 1) if bits else c


def run_reference(op, inputs, attrs, opset, out_types):
    """onnx.reference outputs as (onnx type, codes), or the exception it raised."""
    model = _model(op, inputs, attrs, opset, out_types)
    feeds = {n: a for n, a in zip(["x", "s", "z"], inputs) if a is not None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its int32 casts warn on NaN/inf
            outs = ReferenceEvaluator(model).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - "not supported" is a result here
        return exc
    return [(ONNX_TYPE[np.asarray(o).dtype], codes(o)) for o in outs]


def _pack(values: np.ndarray, bits: int) -> bytes:
    total = 0
    for i, c in enumerate(values.reshape(-1).astype(np.uint64).tolist()):
        total |= (c & ((1 << bits) - 1)) << (bits * i)
    return total.to_bytes(-(-values.size * bits // 8), "little")


def _unpack(data: bytes, bits: int, n: int) -> np.ndarray:
    total = int.from_bytes(data, "little")
    return np.array([(total >> (bits * i)) & ((1 << bits) - 1) for i in range(n)], np.uint64)


def run_ort(op, inputs, attrs, opset, out_types):
    """onnxruntime (CPU, no graph optimization) outputs as (onnx type, codes), or the exception."""
    model = _model(op, inputs, attrs, opset, out_types)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        binding = session.io_binding()
        keep = []
        for name, a in zip(["x", "s", "z"], inputs):
            if a is None:
                continue
            a = np.ascontiguousarray(a)
            t = ONNX_TYPE[a.dtype]
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), t)
            data = _pack(codes(a), PACKED_BITS[t]) if t in PACKED_BITS else a.tobytes()
            assert value.tensor_size_in_bytes() == len(data)
            if data:
                ctypes.memmove(value.data_ptr(), data, len(data))
            keep.append(value)
            binding.bind_ortvalue_input(name, value)
        for name in ["y", "y_scale", "y_zero_point"][: len(out_types)]:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
    except Exception as exc:  # noqa: BLE001 - "not supported" is a result here
        return exc
    results = []
    for value in binding.get_outputs():
        t = ORT_TYPE_NAME[value.data_type()]
        n = int(np.prod(value.shape()))
        size = value.tensor_size_in_bytes()
        data = bytes((ctypes.c_uint8 * size).from_address(value.data_ptr())) if size else b""
        if t in PACKED_BITS:
            results.append((t, _unpack(data, PACKED_BITS[t], n)))
        else:
            results.append((t, np.frombuffer(data, UINT[NUMPY_TYPE[t].itemsize]).copy()))
    return results


def ours(op, inputs, attrs, opset):
    """qemu_q through run_op, as (onnx type, codes)."""
    return [(ONNX_TYPE[np.asarray(o).dtype], codes(o)) for o in qemu_q.run_op(op, inputs, attrs, opset)]


def quantize(x, scale, zp=None, opset=21, **attrs):
    """(qemu_q, onnx.reference, onnxruntime) for QuantizeLinear; output 0 only."""
    inputs = [x, scale] if zp is None else [x, scale, zp]
    if zp is not None:
        out = ONNX_TYPE[zp.dtype]
    else:
        out = attrs.get("output_dtype", 2)
    mine = ours("QuantizeLinear", inputs, attrs, opset)
    ref = run_reference("QuantizeLinear", inputs, attrs, opset, [out])
    rt = run_ort("QuantizeLinear", inputs, attrs, opset, [out])
    return mine[0][1], _first(ref, out), _first(rt, out)


def dequantize(x, scale, zp=None, opset=21, out_type=None, **attrs):
    """(qemu_q, onnx.reference, onnxruntime) for DequantizeLinear; output 0 only."""
    inputs = [x, scale] if zp is None else [x, scale, zp]
    mine = ours("DequantizeLinear", inputs, attrs, opset)
    out = out_type or mine[0][0]
    ref = run_reference("DequantizeLinear", inputs, attrs, opset, [out])
    rt = run_ort("DequantizeLinear", inputs, attrs, opset, [out])
    return mine[0][1], _first(ref, out), _first(rt, out)


def _first(result, out_type):
    if isinstance(result, Exception):
        return result
    t, c = result[0]
    assert t == out_type, f"peer output type {t}, expected {out_type}"
    return c


def not_supported(result) -> bool:
    return isinstance(result, Exception)


def u(values, dtype=np.uint64):
    return np.array(values, dtype=dtype).astype(np.uint64)


def eq(got, want):
    assert not isinstance(got, Exception), f"peer raised {type(got).__name__}: {got}"
    np.testing.assert_array_equal(np.asarray(got, np.uint64), u(want))


# ------------------------------------------------------------ our rules, computed here

# the bits dtype of each binary format
FLOATS = {"float": np.float32, "float16": np.float16, "bfloat16": bf16}
round_to = fo.round_to_binary
round_half_even = fo.round_half_even


def float_bits(value, name: str) -> int:
    """Bit pattern of a value representable in the format (a Fraction, +-inf or a signed 0.0)."""
    dtype = FLOATS[name]
    f = float(value)
    assert isinstance(value, float) or Fraction(f) == value
    return int(codes(np.array([f]).astype(dtype))[0])


def rule_int(q, zero_point: int, lo: int, hi: int) -> int:
    """docs/semantics.md, QuantizeLinear into integers: q is the rounded quotient."""
    if isinstance(q, float) and math.isnan(q):
        return lo
    if isinstance(q, float) and math.isinf(q):
        return hi if q > 0 else lo
    return min(max(round_half_even(Fraction(q)) + zero_point, lo), hi)


def exact(v) -> Fraction:
    return Fraction(float(v))


def as_codes(values, bits):
    return [v & ((1 << bits) - 1) for v in values]


# --------------------------------------------------------------------------- the document

# One registry for the entries tested here and in test_cast_differential.py (support is a
# helper module, imported once whatever the import mode).
ENTRIES = support.DIVERGENCE_ENTRIES
entry = support.divergence_entry


def doc_sections():
    text = DOC.read_text(encoding="utf-8")
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_entry_has_a_test_and_every_test_an_entry():
    importlib.import_module("test_cast_differential")  # registers the Cast entries
    importlib.import_module("test_integer_differential")  # and the integer datapath's
    importlib.import_module("test_mx")  # and the MX entries
    importlib.import_module("test_nvfp4")  # registers the NVFP4 entries
    importlib.import_module("test_mx_peers")  # and the MX peers' transcriptions
    importlib.import_module("test_codec_family")  # and the codec family's numpy peer
    sections = doc_sections()
    divergences = {h for h in sections if not h.startswith("Probed")}
    assert divergences == set(ENTRIES), (
        f"headings without a test: {sorted(divergences - set(ENTRIES))}; "
        f"tests without a heading: {sorted(set(ENTRIES) - divergences)}"
    )
    for heading in divergences:
        body = sections[heading]
        for field in ("**Op**", "**Input**", "**qemu_q**", "**onnx.reference**",
                      "**onnxruntime**", "**Why**", "**Test**"):
            assert f"- {field}:" in body, f"entry {heading!r} lacks the field {field}"
        assert f"`{ENTRIES[heading]}`" in body, f"entry {heading!r} must name its test"
    assert len(set(sections)) == len(re.findall(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)), \
        "headings must be unique"


# ------------------------------------------------------------------ QuantizeLinear, integers


@entry("QL integer: +inf and quotients beyond int32 (onnx.reference)")
@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
def test_ql_int_inf_and_huge(opset):
    x = np.array([np.inf, 2.0**31, 1e10, 3e9], f32)
    for dtype, lo, hi, bits in [(np.int8, -128, 127, 8), (np.uint8, 0, 255, 8),
                                (np.int16, -32768, 32767, 16), (ml_dtypes.int4, -8, 7, 4),
                                (ml_dtypes.uint2, 0, 3, 2)]:
        if opset < 21 and dtype not in (np.int8, np.uint8):
            continue
        if opset < 25 and dtype is ml_dtypes.uint2:
            continue
        mine, ref, rt = quantize(x, np.array(1.0, f32), np.array(0, dtype), opset=opset)
        want = [rule_int(float(v), 0, lo, hi) for v in x]
        eq(mine, as_codes(want, bits))
        assert want == [hi] * 4
        eq(ref, as_codes([lo] * 4, bits))  # int32 cast gives INT_MIN, clipped to the minimum
        eq(rt, as_codes([hi] * 4, bits))
    # x / 0 is +inf: the same class.
    mine, ref, rt = quantize(np.array([1.0], f32), np.array(0.0, f32), np.array(0, np.int8), opset=opset)
    eq(mine, [127]), eq(ref, [0x80]), eq(rt, [127])


@entry("QL integer: int32 wrap-around when adding the zero point (onnx.reference)")
def test_ql_int_zero_point_wrap():
    x = np.array([np.nan, -np.inf, -3e9], f32)
    mine, ref, rt = quantize(x, np.array(1.0, f32), np.array(-100, np.int8), opset=13)
    eq(mine, as_codes([rule_int(float(v), -100, -128, 127) for v in x], 8))
    assert [rule_int(float(v), -100, -128, 127) for v in x] == [-128] * 3
    eq(ref, [127] * 3)  # INT_MIN + (-100) wraps to INT_MAX - 99
    eq(rt, as_codes([-128] * 3, 8))
    x = np.array([2147483520.0], f32)  # 2^31 - 128, exact in float32
    mine, ref, rt = quantize(x, np.array(1.0, f32), np.array(200, np.uint8), opset=13)
    eq(mine, [rule_int(float(x[0]), 200, 0, 255)]), eq(ref, [0]), eq(rt, [255])
    assert rule_int(float(x[0]), 200, 0, 255) == 255


@entry("QL: int32 x or int32 scale, onnx.reference divides in float64")
def test_ql_int32_operands():
    x = np.array([52690945], np.int32)  # / 2^19 = 100.5 + 2^-19: float32 quotient 100.5 -> 100
    expected = rule_int(round_to(Fraction(52690945, 524288), "float"), 0, -128, 127)
    assert expected == 100
    mine, ref, rt = quantize(x, np.array(524288.0, f32), np.array(0, np.int8), opset=13)
    eq(mine, [100]), eq(ref, [101])
    assert not_supported(rt)
    mine, ref, rt = quantize(x, np.array(524288, np.int32), np.array(0, np.int8), opset=19)
    eq(mine, [100]), eq(ref, [101])
    assert not_supported(rt)
    x = np.array([0x4E810001], np.uint32).view(f32)
    expected = rule_int(round_to(exact(x[0]) / 16777217, "float"), 0, -128, 127)
    assert expected == 64
    mine, ref, rt = quantize(x, np.array(16777217, np.int32), np.array(0, np.int8), opset=23)
    eq(mine, [64]), eq(ref, [65])
    assert not_supported(rt)
    # into e4m3fn: x / s = 19/32 - 1/s lies below the midpoint 19/32 of 0x31 and 0x32;
    # float32 rounds the quotient onto it (ties to even: 0x32), float64 keeps it below, and
    # ml_dtypes 0.7 rounds that float64 once into e4m3fn (0x31)
    s = 2**30 + 32
    x = np.array([19 * s // 32 - 1], np.int32)
    q = Fraction(int(x[0]), s)
    assert round_to(q, "float") == Fraction(19, 32)
    assert fo.encode("float8_e4m3fn", round_to(q, "float"), 1) == 0x32
    assert fo.encode("float8_e4m3fn", q, 1) == 0x31
    mine, ref, rt = quantize(x, np.array(s, np.int32), np.zeros((), E4M3FN), opset=21)
    eq(mine, [0x32]), eq(ref, [0x31])
    assert not_supported(rt)


@entry("QL integer: bfloat16 x NaN, +-inf and quotients beyond int32 (onnx.reference)")
@pytest.mark.parametrize("opset", [21, 25])
def test_ql_bfloat16_specials(opset):
    x = np.array([np.nan, np.inf, -np.inf, 3e10, -3e10, 1.0], bf16)
    for zp, lo, hi, bits in ((np.uint8(85), 0, 255, 8), (np.int8(-100), -128, 127, 8),
                             (np.int8(0), -128, 127, 8)):
        mine, ref, rt = quantize(x, np.array(1.0, bf16), np.array(zp), opset=opset)
        want = as_codes([rule_int(float(v), int(zp), lo, hi) for v in x.astype(np.float64)], bits)
        eq(mine, want)
        # ml_dtypes makes NaN, +-inf and 3e10 the int32 0, then the zero point is added
        eq(ref, as_codes([int(zp)] * 5 + [int(zp) + 1], bits))
        assert not_supported(rt)
    eq(quantize(x, np.array(1.0, bf16), np.array(np.uint8(85)), opset=opset)[0],
       [0x00, 0xFF, 0x00, 0xFF, 0x00, 0x56])


# ------------------------------------------------------------ QuantizeLinear, division precision


@entry("QL-23+: float32 x with a float16 or bfloat16 scale")
@pytest.mark.parametrize("opset", [23, 25])
def test_ql_float32_x_half_scale(opset):
    x = np.array([2.5009765625, np.array([0x4163F141], np.uint32).view(f32)[0]], f32)
    scales = {"float16": [np.array(1.0, f16), np.array(0.3, f16)]}
    want = [rule_int(round_to(exact(v) / exact(s), "float16"), 0, -128, 127)
            for v, s in zip(x, scales["float16"])]
    assert want == [2, 47]
    results = [quantize(x[i:i + 1], s, np.array(0, np.int8), opset=opset)
               for i, s in enumerate(scales["float16"])]
    eq(np.concatenate([r[0] for r in results]), want)
    eq(np.concatenate([r[1] for r in results]), [3, 47])  # float32 division
    eq(np.concatenate([r[2] for r in results]), [2, 48])  # x rounded to float16 first
    # onnxruntime's model: round x to float16, divide in float16.
    rng = np.random.default_rng(0)
    xs = (rng.standard_normal(4000) * 60).astype(f32)
    s = np.array(0.7071, f16)
    _, _, rt = quantize(xs, s, np.array(0, np.int8), opset=opset)
    model = np.clip(np.rint((xs.astype(f16).astype(f32) / f32(s)).astype(f16).astype(f32)), -128, 127)
    eq(rt, codes(model.astype(np.int8)))
    # bfloat16 scale: onnx.reference divides in float32, onnxruntime has no kernel.
    mine, ref, rt = quantize(x[:1], np.array(1.0, bf16), np.array(0, np.int8), opset=opset)
    assert rule_int(round_to(exact(x[0]), "bfloat16"), 0, -128, 127) == 2
    eq(mine, [2]), eq(ref, [3])
    assert not_supported(rt)


@entry("QL-23+: precision attribute")
def test_ql_precision_attribute():
    x = np.array([0x40F01062], np.uint32).view(f32)  # 7.502
    want = rule_int(round_to(exact(x[0]) / 3, "float16"), 0, -32768, 32767)
    assert want == 2
    mine, ref, rt = quantize(x, np.array(3.0, f32), np.array(0, np.int16), opset=23, precision=10)
    eq(mine, [2]), eq(ref, [3]), eq(rt, [3])  # both round x to float16 before dividing
    x = np.array([0x3FC0A3D7], np.uint32).view(f32)  # 1.505
    want = rule_int(round_to(exact(x[0]) / 3, "bfloat16"), 0, -32768, 32767)
    assert want == 0
    mine, ref, rt = quantize(x, np.array(3.0, f32), np.array(0, np.int16), opset=23, precision=16)
    eq(mine, [0]), eq(ref, [1])
    assert not_supported(rt)


@entry("QL-19/21: float16 x, onnxruntime divides in float32")
@pytest.mark.parametrize("opset", [19, 21])
def test_ql_float16_ort_divides_in_float32(opset):
    x, s = np.array([0.25], f16), np.array(0.1, f16)
    want = rule_int(round_to(exact(x[0]) / exact(s), "float16"), 0, -128, 127)
    assert want == 2
    mine, ref, rt = quantize(x, s, np.array(0, np.int8), opset=opset)
    eq(mine, [2]), eq(ref, [2]), eq(rt, [3])
    # At 23 onnxruntime divides in float16 and agrees.
    _, _, rt23 = quantize(x, s, np.array(0, np.int8), opset=23)
    eq(rt23, [2])
    # Its model at 19/21, on every float16 x: float32 division, then rounding.
    xs = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(f16)
    _, _, rt = quantize(xs, s, np.array(0, np.int8), opset=opset)
    model = np.clip(np.rint(xs.astype(f32) / f32(s)), -128, 127).astype(np.int8)
    eq(rt, codes(model))


# ------------------------------------------------------------ QuantizeLinear, small floats


@entry("QL-19/21/23 FNUZ saturate=1: +-inf")
@pytest.mark.parametrize("opset", [19, 21, 23, 24, 25])
def test_ql_fnuz_inf_before_cast_24(opset):
    for name, out in [("float8_e4m3fnuz", 18), ("float8_e5m2fnuz", 20)]:
        zp = np.array(0, NUMPY_TYPE[out])
        for x, s in [(np.array([np.inf, -np.inf], f32), 1.0), (np.array([1.0, -1.0], f32), 0.0)]:
            with np.errstate(divide="ignore"):
                q = x / f32(s)
            mine, ref, rt = quantize(x, np.array(s, f32), zp, opset=opset)
            eq(mine, [fo.encode(name, float(v), 1, opset=opset) for v in q])
            eq(ref, [0x7F, 0xFF]), eq(rt, [0x7F, 0xFF])  # +-max at every opset
            eq(mine, [0x80, 0x80] if opset < 24 else [0x7F, 0xFF])


@entry("QL e5m2: onnxruntime NaN codes 0x7F / 0xFF")
@pytest.mark.parametrize("opset", [19, 21, 23, 25])
def test_ql_e5m2_onnxruntime_nan(opset):
    x = np.array([NAN32, NEG_NAN32], f32)
    for saturate in (0, 1):
        if opset < 21:
            mine, ref, rt = quantize(x, np.array(1.0, f32), np.array(0, E5M2), opset=opset,
                                     saturate=saturate)
        else:
            mine, ref, rt = quantize(x, np.array(1.0, f32), opset=opset, output_dtype=19,
                                     saturate=saturate)
        eq(mine, [fo.encode("float8_e5m2", float(v), saturate, opset=opset) for v in x])
        eq(mine, [0x7E, 0xFE])
        eq(ref, [0x7E, 0xFE]), eq(rt, [0x7F, 0xFF])
    # Cast agrees with QuantizeLinear (one codec): the official Cast vectors' 0x7E.
    eq(codes(qemu_q.cast(x, "float8e5m2", opset=opset)), [0x7E, 0xFE])


def test_agree_e4m3fn_negative_overflow():
    # "[x] < -FLT_MAX -> NaN" with the sign of x, as the official Cast vectors have it
    # (docs/semantics.md); the peers agree.
    x = np.array([-1000.0, -465.0, -1e30], f32)
    mine, ref, rt = quantize(x, np.array(1.0, f32), opset=21, output_dtype=17, saturate=0)
    eq(mine, [fo.encode("float8_e4m3fn", float(v), 0, opset=21) for v in x]), eq(mine, [0xFF] * 3)
    eq(ref, [0xFF] * 3), eq(rt, [0xFF] * 3)
    # -inf has its own row, "-Inf -> -NaN": all three agree.
    mine, ref, rt = quantize(np.array([-np.inf], f32), np.array(1.0, f32), opset=21,
                             output_dtype=17, saturate=0)
    eq(mine, [0xFF]), eq(ref, [0xFF]), eq(rt, [0xFF])


@entry("QL e4m3fn saturate=0: onnxruntime 448 for 480 <= |q| < 496")
def test_ql_e4m3fn_ort_448():
    x = np.array([480.0, 490.0, 495.75, -480.0, -495.75], f32)
    mine, ref, rt = quantize(x, np.array(1.0, f32), opset=21, output_dtype=17, saturate=0)
    eq(mine, [fo.encode("float8_e4m3fn", float(v), 0) for v in x]), eq(mine, [0x7F] * 3 + [0xFF] * 2)
    eq(ref, [0x7F, 0x7F, 0x7F, 0xFF, 0xFF]), eq(rt, [0x7E, 0x7E, 0x7E, 0xFE, 0xFE])
    # The range, on a grid of 1/64 steps: exactly [480, 496) gives +-448.
    grid = np.arange(440 * 64, 520 * 64, dtype=np.float64) / 64
    _, _, rt = quantize(grid.astype(f32), np.array(1.0, f32), opset=21, output_dtype=17, saturate=0)
    bad = (grid >= 480) & (grid < 496)
    eq(rt[grid >= 496], [0x7F] * int(np.sum(grid >= 496)))
    eq(rt[(grid > 464) & (grid < 480)], [0x7F] * int(np.sum((grid > 464) & (grid < 480))))
    eq(rt[bad], [0x7E] * int(np.sum(bad)))


@entry("QL e5m2 saturate=0: onnxruntime NaN for 61440 <= |q| < 65536")
def test_ql_e5m2_ort_nan():
    x = np.array([61440.0, 65535.0, -61440.0], f32)
    mine, ref, rt = quantize(x, np.array(1.0, f32), opset=21, output_dtype=19, saturate=0)
    eq(mine, [fo.encode("float8_e5m2", float(v), 0) for v in x]), eq(mine, [0x7C, 0x7C, 0xFC])
    eq(ref, [0x7C, 0x7C, 0xFC]), eq(rt, [0x7F, 0x7F, 0xFF])
    grid = np.arange(57344, 70000, 16, dtype=np.float64)
    _, _, rt = quantize(grid.astype(f32), np.array(1.0, f32), opset=21, output_dtype=19, saturate=0)
    bad = (grid >= 61440) & (grid < 65536)
    eq(rt[bad], [0x7F] * int(np.sum(bad)))
    assert np.all(rt[grid >= 65536] == 0x7C) and np.all(rt[grid < 61440] == 0x7B)


@entry("QL float8: -0 quotient plus a +0 zero point")
@pytest.mark.parametrize("opset", [19, 21, 25])
def test_ql_float8_negative_zero_plus_zero_point(opset):
    for dtype, name in [(E4M3FN, "float8_e4m3fn"), (E5M2, "float8_e5m2")]:
        for x, s in [(-0.0, 1.0), (0.0, -1.0), (-1.0, np.inf)]:
            mine, ref, rt = quantize(np.array([x], f32), np.array(s, f32), np.array(0, dtype), opset=opset)
            q = float(f32(x) / f32(s))
            assert q == 0 and math.copysign(1, q) < 0
            eq(mine, [fo.encode(name, q + 0.0, 1)]), eq(mine, [0x00])  # -0 + +0 = +0
            eq(ref, [0x80]), eq(rt, [0x80])  # the zero point is ignored
        # Without a zero point nothing is added: all agree on -0.
        mine, ref, rt = quantize(np.array([-0.0], f32), np.array(1.0, f32), opset=max(opset, 21),
                                 output_dtype=ONNX_TYPE[np.dtype(dtype)])
        eq(mine, [0x80]), eq(ref, [0x80]), eq(rt, [0x80])


@entry("QL float4/float6: NaN")
def test_ql_float4_float6_nan():
    x = np.array([NAN32, NEG_NAN32], f32)
    for out, opset, name, ref_codes in [(23, 23, "float4_e2m1fn", [0x8, 0x0]),
                                        (27, 28, "float6_e2m3fn", [0x20, 0x00]),
                                        (28, 28, "float6_e3m2fn", [0x20, 0x00])]:
        mine, ref, rt = quantize(x, np.array(1.0, f32), opset=opset, output_dtype=out)
        eq(mine, [fo.encode(name, float(v), 1) for v in x])
        eq(mine, [fo.FORMATS[name].max_code] * 2)
        eq(ref, ref_codes)  # ml_dtypes: +NaN -> -0, -NaN -> +0
        assert not_supported(rt)


@entry("Nonzero float zero points")
def test_nonzero_float_zero_points():
    one = np.array([1.0], f32)
    with pytest.raises(ValueError, match="must be zero"):
        qemu_q.quantize_linear(one, np.array(1.0, f32), np.array(2.0, E4M3FN), opset=19)
    _, ref, rt = quantize(np.array([0.0], f32), np.array(1.0, f32), np.array(0, E4M3FN), opset=19)
    for inputs, opset, out, ref_want, ort_want in [
        ([one, np.array(1.0, f32), np.array(2.0, E4M3FN)], 19, 17, [0x38], [0x38]),  # ignored
        ([one, np.array(1.0, f32), np.array(1.0, F4)], 23, 23, [0x4], None),  # added: 2.0
        ([one, np.array(1.0, f32), np.array(1.0, F6E2M3)], 28, 27, [0x10], None),  # added: 2.0
    ]:
        with pytest.raises(ValueError, match="must be zero"):
            qemu_q.run_op("QuantizeLinear", inputs, {}, opset)
        eq(run_reference("QuantizeLinear", inputs, {}, opset, [out])[0][1], ref_want)
        rt = run_ort("QuantizeLinear", inputs, {}, opset, [out])
        if ort_want is None:
            assert not_supported(rt)
        else:
            eq(rt[0][1], ort_want)
    assert fo.encode("float4_e2m1fn", 2.0, 1) == 0x4 and fo.encode("float6_e2m3fn", 2.0, 1) == 0x10
    # DequantizeLinear: float4 ignores the zero point, float6 subtracts it; float8: all reject.
    for inputs, opset, ref_want in [
        ([np.array([1.0], F4), np.array(1.0, f32), np.array(1.0, F4)], 23, [0x3F800000]),
        ([np.array([1.0], F6E2M3), np.array(1.0, f32), np.array(1.0, F6E2M3)], 28, [0x00000000]),
    ]:
        with pytest.raises(ValueError, match="must be zero"):
            qemu_q.run_op("DequantizeLinear", inputs, {}, opset)
        eq(run_reference("DequantizeLinear", inputs, {}, opset, [1])[0][1], ref_want)
        assert not_supported(run_ort("DequantizeLinear", inputs, {}, opset, [1]))
    inputs = [np.array([1.0], E4M3FN), np.array(1.0, f32), np.array(2.0, E4M3FN)]
    with pytest.raises(ValueError, match="must be zero"):
        qemu_q.run_op("DequantizeLinear", inputs, {}, 19)
    assert not_supported(run_reference("DequantizeLinear", inputs, {}, 19, [1]))
    assert not_supported(run_ort("DequantizeLinear", inputs, {}, 19, [1]))


# ------------------------------------------------------------------ DequantizeLinear


@entry("DQ: int32 x beyond 2^24")
@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
def test_dq_int32_beyond_2_24(opset):
    x = np.array([16777217, -16777217, 2147483647], np.int32)
    want = [float_bits(round_to(Fraction(int(v)) * 3, "float"), "float") for v in x]
    assert want[0] == 0x4C400001  # 50331651 -> 50331652
    mine, ref, rt = dequantize(x, np.array(3.0, f32), opset=opset)
    eq(mine, want)
    # The peers convert x to float32 first, then multiply in float32.
    peer = codes((x.astype(f32) * f32(3.0)).astype(f32))
    assert peer[0] == 0x4C400000
    if opset < 19:
        assert not_supported(ref)
    else:
        eq(ref, peer)
    eq(rt, peer)


@entry("DQ: float16 / bfloat16 output rounded twice")
def test_dq_double_rounding():
    # uint16 codes times a float16 scale, float16 output (DQ-21+).
    s = np.array(0.0123, f16)
    x = np.array([42139, 56165], np.uint16)
    want = [float_bits(round_to(Fraction(int(v)) * exact(s), "float16"), "float16") for v in x]
    assert want == [0x600D, 0x6165]
    for opset in (21, 23):
        mine, ref, rt = dequantize(x, s, opset=opset)
        eq(mine, want), eq(ref, [0x600C, 0x6166]), eq(rt, [0x600C, 0x6166])
    # int8 codes, float32 scale, output_dtype float16 (DQ-23+).
    s = np.array([0x3E848C46], np.uint32).view(f32).reshape(())
    x = np.array([73, -73], np.int8)
    want = [float_bits(round_to(Fraction(int(v)) * exact(s), "float16"), "float16") for v in x]
    assert want == [0x4CB9, 0xCCB9]
    mine, ref, rt = dequantize(x, s, opset=23, output_dtype=10)
    eq(mine, want), eq(ref, [0x4CBA, 0xCCBA]), eq(rt, [0x4CBA, 0xCCBA])
    # bfloat16 output: onnx.reference rounds twice, onnxruntime has no kernel.
    s = np.array(0.0123, f16)
    x = np.array([47973], np.uint16)
    want = float_bits(round_to(Fraction(47973) * exact(s), "bfloat16"), "bfloat16")
    assert want == 0x4413
    mine, ref, rt = dequantize(x, s, opset=23, output_dtype=16)
    eq(mine, [want]), eq(ref, [0x4414])
    assert not_supported(rt)


@entry("DQ: NaN code times NaN scale")
def test_dq_nan_code_nan_scale():
    codes_all = _all_codes(E4M3FN)  # 256 elements; NaN codes 0x7F and 0xFF
    nan_idx = [0x7F, 0xFF]
    for scale, ref_want in [(NAN32, 0x7FC00000), (NEG_NAN32, 0xFFC00000)]:
        s = np.array(scale, f32)
        mine, ref, rt = dequantize(codes_all, s, opset=21)
        eq(mine[nan_idx], [0x7FC00000, 0xFFC00000])  # the code's NaN, keeping its sign
        eq(rt[nan_idx], [0x7FC00000, 0xFFC00000])
        eq(ref[nan_idx], [ref_want, ref_want])  # the scale's NaN
        # Which NaN numpy's multiply returns depends on its loop: the same product here.
        with np.errstate(invalid="ignore"):
            eq(ref, codes(codes_all.astype(f32) * s))
            small = np.array([0xFF, 0x7F], np.uint8).view(E4M3FN)
            _, ref_small, _ = dequantize(small, s, opset=21)
            eq(ref_small, codes(small.astype(f32) * s))


@entry("DQ: float zero point -0")
def test_dq_negative_zero_zero_point():
    x = np.array([0x80, 0x00], np.uint8).view(E4M3FN)  # -0, +0
    zp = np.array(-0.0, E4M3FN)
    mine, ref, rt = dequantize(x, np.array(1.0, f32), zp, opset=19)
    want = [float_bits(float(f32(-0.0) - f32(-0.0)), "float"), float_bits(float(f32(0.0) - f32(-0.0)), "float")]
    assert want == [0, 0]
    eq(mine, want), eq(ref, [0x80000000, 0])  # zero point ignored
    assert not_supported(rt)  # "should have no zero point or all zero points should be 0"
    x = np.array([0x8, 0x0], np.uint8).view(F4)
    mine, ref, rt = dequantize(x, np.array(1.0, f32), np.array(-0.0, F4), opset=23)
    eq(mine, [0, 0]), eq(ref, [0x80000000, 0])
    assert not_supported(rt)


@entry("DQ-24+: e8m0 scale without output_dtype")
def test_dq_e8m0_output_type():
    x = np.array([3, -3, 0], np.int8)
    s = np.array([0x80], np.uint8).view(E8M0).reshape(())  # 2.0
    mine = ours("DequantizeLinear", [x, s], {}, 24)
    assert mine[0][0] == 1
    eq(mine[0][1], [float_bits(Fraction(int(v) * 2), "float") for v in x])
    ref = run_reference("DequantizeLinear", [x, s], {}, 24, [24])
    assert ref[0][0] == 24  # the product cast to float8e8m0
    eq(ref[0][1], [0x82, 0xFF, 0xFF])
    assert not_supported(run_ort("DequantizeLinear", [x, s], {}, 24, [24]))
    assert not_supported(run_ort("DequantizeLinear", [x, s], {}, 24, [1]))
    # With output_dtype=float32 onnx.reference agrees.
    eq(run_reference("DequantizeLinear", [x, s], {"output_dtype": 1}, 24, [1])[0][1], mine[0][1])


@entry("DQ-10/13: onnx.reference has no implementation")
@pytest.mark.parametrize("opset", [10, 13])
def test_dq_old_versions(opset):
    x = np.arange(-128, 128, dtype=np.int8)
    s = np.array(0.0123, f32)
    mine, ref, rt = dequantize(x, s, np.array(-3, np.int8), opset=opset)
    eq(mine, [float_bits(round_to((Fraction(int(v)) + 3) * exact(s), "float"), "float") for v in x])
    assert not_supported(ref)
    eq(rt, mine)


# ------------------------------------------------------------------ DynamicQuantizeLinear


def dynamic(x):
    mine = ours("DynamicQuantizeLinear", [x], {}, 11)
    ref = run_reference("DynamicQuantizeLinear", [x], {}, 11, [2, 1, 2])
    rt = run_ort("DynamicQuantizeLinear", [x], {}, 11, [2, 1, 2])
    unpack = lambda r: r if isinstance(r, Exception) else [c for _, c in r]  # noqa: E731
    return unpack(mine), unpack(ref), unpack(rt)


def rule_dynamic(x):
    """docs/semantics.md, DynamicQuantizeLinear-11, in float32 as the rule says."""
    finite = x[~np.isnan(x)]
    lo = min(f32(0), f32(finite.min())) if finite.size else f32(0)
    hi = max(f32(0), f32(finite.max())) if finite.size else f32(0)
    with np.errstate(all="ignore"):
        scale = f32(1.0) if hi == lo else f32(hi - lo) / f32(255)
        zp_real = f32(0) - lo / scale
    zp = 255 if math.isnan(zp_real) else round_half_even(Fraction(min(max(float(zp_real), 0.0), 255.0)))
    y = []
    for v in x:
        with np.errstate(all="ignore"):
            q = float(f32(v) / scale)
        y.append(rule_int(q if not math.isfinite(q) else Fraction(q), zp, 0, 255))
    return y, int(codes(np.array([scale], f32))[0]), zp


@entry("DynamicQuantizeLinear: all-zero or empty x")
def test_dynamic_zero_range():
    x = np.zeros(3, f32)
    y, scale, zp = rule_dynamic(x)
    assert scale == 0x3F800000
    mine, ref, rt = dynamic(x)
    for got in (mine, rt):
        eq(got[0], y), eq(got[1], [scale]), eq(got[2], [zp])
    eq(ref[0], [0, 0, 0]), eq(ref[1], [0x3B808081]), eq(ref[2], [0])  # 1/255
    mine, ref, rt = dynamic(np.zeros(0, f32))
    eq(mine[1], [0x3F800000]), eq(rt[1], [0x3F800000]), eq(mine[2], [0]), eq(rt[2], [0])
    assert not_supported(ref)


def test_dynamic_tiny_range_follows_the_rule():
    """A nonzero range whose scale underflows: all three follow the formula (fixed in 9be0b00;
    qemu_q used to substitute scale 1 here)."""
    x = np.array([1e-45, -1e-45, 0.0], f32)  # range 2^-148: (hi - lo) / 255 is 0 in float32
    y, scale, zp = rule_dynamic(x)
    assert (y, scale, zp) == ([255, 0, 0], 0x00000000, 255)
    mine, ref, rt = dynamic(x)
    for got in (ref, rt):
        eq(got[0], y), eq(got[1], [scale]), eq(got[2], [zp])
    eq(mine[0], y), eq(mine[1], [scale]), eq(mine[2], [zp])


@entry("DynamicQuantizeLinear: NaN in x")
def test_dynamic_nan():
    a = np.array([1.0, np.nan, -2.0, 3.0], f32)
    b = np.array([1, -2, 3, 0.5, -1.5, 2.5, 0.25, np.nan], f32)
    c = np.array([1, -2, 3, 0.5, -1.5, np.nan, 0.25, -0.75], f32)
    expected = {
        "a": ([0x99, 0, 0, 0xFF], 0x3CA0A0A1, 102),
        "b": ([0x99, 0, 0xFF, 0x80, 0x1A, 0xE5, 0x73, 0], 0x3CA0A0A1, 102),
        "c": ([0x99, 0, 0xFF, 0x80, 0x1A, 0, 0x73, 0x40], 0x3CA0A0A1, 102),
    }
    poisoned = lambda n: ([0] * n, 0x7FC00000, 255)  # noqa: E731
    ort_expected = {"a": expected["a"], "b": poisoned(8),
                    "c": ([0x8E, 0, 0xFF, 0x71, 0, 0, 0x63, 0x2B], 0x3C909091, 85)}
    for key, x in (("a", a), ("b", b), ("c", c)):
        assert rule_dynamic(x) == expected[key]
        mine, ref, rt = dynamic(x)
        for got, (y, scale, zp) in ((mine, expected[key]), (ref, poisoned(x.size)), (rt, ort_expected[key])):
            eq(got[0], y), eq(got[1], [scale]), eq(got[2], [zp])


def test_dynamic_negative_inf_agrees():
    # A -inf minimum: y_scale inf and zero point 255 (docs/semantics.md), as both peers give.
    for x, want_y in [(np.array([1.0, -np.inf, 2.0], f32), [255, 0, 255]),
                      (np.array([np.inf, -np.inf, 1.0], f32), [0, 0, 255])]:
        y, scale, zp = rule_dynamic(x)
        assert (y, scale, zp) == (want_y, 0x7F800000, 255)
        for got in dynamic(x):
            eq(got[0], y), eq(got[1], [scale]), eq(got[2], [zp])


# ============================================================ what agrees, bit for bit


def assert_agree(op, inputs, attrs, opset, out_types, ref=True, rt=True):
    mine = ours(op, inputs, attrs, opset)
    if ref:
        got = run_reference(op, inputs, attrs, opset, out_types)
        assert not isinstance(got, Exception), f"onnx.reference raised {got!r}"
        for (tm, cm), (tp, cp) in zip(mine, got):
            assert tm == tp
            np.testing.assert_array_equal(cp, cm, err_msg="onnx.reference")
    if rt:
        got = run_ort(op, inputs, attrs, opset, out_types)
        assert not isinstance(got, Exception), f"onnxruntime raised {got!r}"
        for (tm, cm), (tp, cp) in zip(mine, got):
            assert tm == tp
            np.testing.assert_array_equal(cp.astype(np.uint64), cm.astype(np.uint64), err_msg="onnxruntime")


INTEGER_OUTPUTS = [  # dtype, zero point, first opset
    (np.int8, -3, 10), (np.uint8, 128, 10), (np.int16, -1000, 21), (np.uint16, 30000, 21),
    (ml_dtypes.int4, -2, 21), (ml_dtypes.uint4, 7, 21), (ml_dtypes.int2, -1, 25),
    (ml_dtypes.uint2, 1, 25),
]


def _finite_inputs(seed):
    rng = np.random.default_rng(seed)
    ties = (np.arange(-300, 300) + 0.5) * 0.5  # k + 0.5 after dividing by 0.5
    return np.concatenate([ties, rng.standard_normal(3000) * 40, rng.uniform(-1e8, 1e8, 200),
                           [0.0, -0.0, 1e-40, -1e-40, 127.5, -128.5, 255.5, 32767.5, -65535.5]]).astype(f32)


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23, 25])
@pytest.mark.parametrize("scale", [0.5, 0.0731])
def test_agree_quantize_integers(opset, scale):
    x = _finite_inputs(opset)
    for dtype, zp, first in INTEGER_OUTPUTS:
        if opset >= first:
            assert_agree("QuantizeLinear", [x, np.array(scale, f32), np.array(zp, dtype)], {}, opset,
                         [ONNX_TYPE[np.dtype(dtype)]])
    if opset >= 13:  # per-axis
        x2 = x[:3000].reshape(30, 100)
        s = np.linspace(0.01, 2, 30).astype(f32)
        assert_agree("QuantizeLinear", [x2, s, np.full(30, -5, np.int8)], {"axis": 0}, opset, [3])


def _float8_agreeing_inputs(name, saturate, opset):
    """Every value and midpoint of the format (ties), their neighbours, and overflow and NaN
    cases the peers handle as we do."""
    fmt = fo.FORMATS[name]
    values, _ = fo.positive_values(fmt)
    points = [float(v) for v in values[:-1]] + [float(m) for m in fo.midpoints(fmt)]
    p = np.array(points, f32)
    near = np.concatenate([p, np.nextafter(p, f32(np.inf)), np.nextafter(p, f32(0))])
    x = np.concatenate([near, -near[near > 0]])
    extra = [1e6, 1e-30] + ([NAN32, NEG_NAN32] if name != "float8_e5m2" else [])
    extra += [np.inf] if fmt.kind != "fnuz" or not saturate or opset >= 24 else []
    if saturate or fmt.kind == "fnuz":
        extra += [-1e6] + ([-np.inf] if fmt.kind != "fnuz" or not saturate or opset >= 24 else [])
    elif name == "float8_e4m3fn":
        extra += [-np.inf]  # "-Inf -> -NaN": 0xFF in all three
    x = np.concatenate([x, np.array(extra, f32)])
    if name == "float8_e4m3fn" and not saturate:
        x = x[~((x < 0) & (np.abs(x) > 464) & np.isfinite(x))]  # negative overflow: own entry
        x = x[~((np.abs(x) >= 480) & (np.abs(x) < 496))]  # onnxruntime's 448 range
    if name == "float8_e5m2" and not saturate:
        x = x[~((np.abs(x) >= 61440) & (np.abs(x) < 65536))]
    return x


F8 = [("float8_e4m3fn", 17), ("float8_e4m3fnuz", 18), ("float8_e5m2", 19), ("float8_e5m2fnuz", 20)]


@pytest.mark.parametrize("opset", [19, 21, 23, 25])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("name,out", F8)
def test_agree_quantize_float8(opset, saturate, name, out):
    x = _float8_agreeing_inputs(name, saturate, opset)
    x = x[x != 0]  # +-0: see the zero-point entry; checked below without a zero point
    attrs = {"saturate": saturate}
    if opset >= 21:
        assert_agree("QuantizeLinear", [np.concatenate([x, np.array([0.0, -0.0], f32)]),
                                        np.array(1.0, f32)], dict(attrs, output_dtype=out), opset, [out])
        assert_agree("QuantizeLinear", [x * f32(0.375), np.array(0.375, f32)],
                     dict(attrs, output_dtype=out), opset, [out])
    zp = np.array(0, NUMPY_TYPE[out])
    assert_agree("QuantizeLinear", [x, np.array(1.0, f32), zp], attrs, opset, [out])


@pytest.mark.parametrize("opset", [19, 21, 23, 25])
@pytest.mark.parametrize("saturate", [0, 1])
def test_agree_float8_nan_signs(opset, saturate):
    # The tables' "-NaN -> -NaN": the sign of a NaN survives, whatever its payload; 0/0 and
    # inf/inf make the CPU's default NaN (negative on x86-64), the same in all three.
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF],
                    np.uint32).view(f32)
    x = np.concatenate([nans, np.array([0.0, np.inf, 1.0], f32)])
    s = np.concatenate([np.ones(nans.size, f32), np.array([0.0, np.inf, np.nan], f32)])
    attrs = {"saturate": saturate, "axis": 0}
    for out in (17, 18, 19, 20):
        zp = np.zeros(x.size, NUMPY_TYPE[out])
        assert_agree("QuantizeLinear", [x, s, zp], attrs, opset, [out], rt=out != 19)
    with np.errstate(invalid="ignore"):
        q = x / s
    mine = qemu_q.quantize_linear(x, s, np.zeros(x.size, E4M3FN), axis=0, saturate=saturate,
                                  opset=opset)
    eq(codes(mine), [fo.encode("float8_e4m3fn", float(v), saturate, opset=opset) for v in q])


@pytest.mark.parametrize("opset", [23, 25])
def test_agree_quantize_float16_and_bfloat16_x(opset):
    # Quotients stay finite (float16 overflows to inf above 65504: see the +inf entry).
    every = np.arange(0, 0x7C00, 3, dtype=np.uint16).view(f16)
    every = np.concatenate([every, -every[1:]])
    for s in (1.0, 3.0, 0.1):
        x = every[np.abs(every.astype(np.float64)) / s < 65000]
        assert_agree("QuantizeLinear", [x, np.array(s, f16), np.array(2, np.int8)], {}, opset, [3])
        assert_agree("QuantizeLinear", [x, np.array(s, f16)], {"output_dtype": 18}, opset, [18])
        assert_agree("QuantizeLinear", [x, np.array(s, f32), np.array(5, np.uint8)], {}, opset, [2])
    xb = np.arange(0, 0x4C00, 5, dtype=np.uint16).view(bf16)  # |x| < 2^25: quotients inside int32
    xb = np.concatenate([xb, -xb[1:]])
    for s in (1.0, 3.0, 0.1):  # onnxruntime has no bfloat16 QuantizeLinear
        assert_agree("QuantizeLinear", [xb, np.array(s, bf16), np.array(2, np.int8)], {}, opset, [3], rt=False)
        assert_agree("QuantizeLinear", [xb, np.array(s, bf16)], {"output_dtype": 20}, opset, [20], rt=False)


@pytest.mark.parametrize("name,out,opset", [("float4_e2m1fn", 23, 23), ("float4_e2m1fn", 23, 28),
                                            ("float6_e2m3fn", 27, 28), ("float6_e3m2fn", 28, 28)])
def test_agree_quantize_float4_float6(name, out, opset):
    fmt = fo.FORMATS[name]
    values, _ = fo.positive_values(fmt)
    p = np.array([float(v) for v in values] + [float(m) for m in fo.midpoints(fmt)] + [100.0, np.inf], f32)
    x = np.concatenate([p, np.nextafter(p, f32(0)), np.nextafter(p, f32(np.inf))])
    x = np.concatenate([x, -x])  # -0.0 included: no zero point is added
    for sat in (0, 1):  # onnxruntime has no float4/float6 QuantizeLinear
        assert_agree("QuantizeLinear", [x, np.array(1.0, f32)], {"output_dtype": out, "saturate": sat},
                     opset, [out], rt=False)
    assert_agree("QuantizeLinear", [x[x != 0], np.array(1.0, f32), np.array(0.0, NUMPY_TYPE[out])], {},
                 opset, [out], rt=False)


def _all_codes(dtype):
    bits = PACKED_BITS.get(ONNX_TYPE[np.dtype(dtype)], 8 * np.dtype(dtype).itemsize)
    storage = UINT[np.dtype(dtype).itemsize]
    return np.arange(1 << bits, dtype=np.uint64).astype(storage).view(dtype)


@pytest.mark.parametrize("opset", [19, 21, 23, 25])
def test_agree_dequantize(opset):
    s32, s16 = np.array(0.0123, f32), np.array(0.0123, f16)
    for dtype, zp, first in INTEGER_OUTPUTS:
        if opset < first:
            continue
        x = _all_codes(dtype)
        assert_agree("DequantizeLinear", [x, s32, np.array(zp, dtype)], {}, opset, [1])
        if np.dtype(dtype).itemsize == 1:  # 8-bit codes times float16: exact in float32
            assert_agree("DequantizeLinear", [x, s16, np.array(zp, dtype)], {}, opset, [10])
    for name, t in F8:
        x = _all_codes(NUMPY_TYPE[t])
        for s in (s32, s16, np.array(-3.5, f32), np.array(np.inf, f32), np.array(0.0, f16)):
            assert_agree("DequantizeLinear", [x, s], {}, opset, [ONNX_TYPE[s.dtype]])
        assert_agree("DequantizeLinear", [x, s32, np.array(0.0, NUMPY_TYPE[t])], {}, opset, [1])
        assert_agree("DequantizeLinear", [x, np.array(0.0123, bf16)], {}, opset, [16], rt=False)
    if opset >= 23:
        for dtype, out in [(F4, 23)] + ([(F6E2M3, 27), (F6E3M2, 28)] if opset >= 28 else []):
            assert_agree("DequantizeLinear", [_all_codes(dtype), s32], {}, opset, [1], rt=False)
        x = np.arange(-128, 128, dtype=np.int8)
        assert_agree("DequantizeLinear", [x, s16], {"output_dtype": 1}, opset, [1])


def test_agree_dequantize_float4_float6_opset28():
    s = np.array(0.0123, f32)
    for dtype in (F4, F6E2M3, F6E3M2):
        assert_agree("DequantizeLinear", [_all_codes(dtype), s], {}, 28, [1], rt=False)
        assert_agree("DequantizeLinear", [_all_codes(dtype), np.array(0.5, f16)], {}, 28, [10], rt=False)


@pytest.mark.parametrize("opset", [21, 23, 25])
def test_agree_blocked_and_per_axis(opset):
    rng = np.random.default_rng(opset)
    x = (rng.standard_normal((4, 6, 8)) * 20).astype(f32)
    for axis, block in [(1, 2), (1, 4), (2, 3), (2, 8), (0, 3)]:
        shape = list(x.shape)
        shape[axis] = -(-shape[axis] // block)
        s = rng.uniform(0.05, 0.5, shape).astype(f32)
        for dtype, zp in [(np.int8, rng.integers(-3, 4, shape)), (ml_dtypes.uint4, rng.integers(0, 15, shape)),
                          (E5M2, np.zeros(shape))]:
            z = zp.astype(dtype)
            attrs = {"axis": axis, "block_size": block}
            assert_agree("QuantizeLinear", [x, s, z], attrs, opset, [ONNX_TYPE[np.dtype(dtype)]])
            q = qemu_q.quantize_linear(x, s, z, opset=opset, **attrs)
            assert_agree("DequantizeLinear", [q, s, z], attrs, opset, [1])
    for axis in (0, 1, 2, -1):
        s = rng.uniform(0.05, 0.5, x.shape[axis]).astype(f32)
        z = rng.integers(-3, 4, x.shape[axis]).astype(ml_dtypes.int4)
        assert_agree("QuantizeLinear", [x, s, z], {"axis": axis}, opset, [22])
        q = qemu_q.quantize_linear(x, s, z, axis=axis, opset=opset)
        assert_agree("DequantizeLinear", [q, s, z], {"axis": axis}, opset, [1])


def test_agree_e8m0_scale():
    # onnxruntime has no kernel with an e8m0 scale.
    x = np.concatenate([_finite_inputs(24), [np.inf, NAN32, 1e-45]]).astype(f32)
    for code in (120, 127, 128, 130):
        s = np.array([code], np.uint8).view(E8M0).reshape(())
        xs = x[np.abs(x) < 2.0**30 * 2.0 ** (code - 127)]  # quotients inside int32: see the +inf entry
        assert_agree("QuantizeLinear", [xs[np.isfinite(xs)], s, np.array(3, np.int8)], {}, 24, [3], rt=False)
        assert_agree("QuantizeLinear", [xs[xs != 0], s], {"output_dtype": 17}, 24, [17], rt=False)
        assert_agree("DequantizeLinear", [np.arange(-128, 128, dtype=np.int8), s], {"output_dtype": 1}, 24,
                     [1], rt=False)
        assert_agree("DequantizeLinear", [_all_codes(E4M3FN), s], {"output_dtype": 10}, 24, [10], rt=False)


def test_agree_dynamic():
    rng = np.random.default_rng(11)
    cases = [np.array([0.5, 1, 2, 3], f32), np.array([-0.5, -1, -2], f32),
             np.array([-1, 0, 1, 2.5, -3.7], f32), np.array([1, np.inf, -2], f32),
             np.array([3e38, -3e38], f32), np.array([-1, 254], f32), np.array([-0.5, 127], f32)]
    cases += [(rng.standard_normal(1000) * rng.uniform(0.01, 100) + rng.uniform(-3, 3)).astype(f32)
              for _ in range(8)]
    for x in cases:
        assert_agree("DynamicQuantizeLinear", [x], {}, 11, [2, 1, 2])
        y, scale, zp = rule_dynamic(x)
        mine = ours("DynamicQuantizeLinear", [x], {}, 11)
        eq(mine[0][1], y), eq(mine[1][1], [scale]), eq(mine[2][1], [zp])
