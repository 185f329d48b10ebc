"""Datapath scale_precision="promoted" (numpy's type promotion of the operands' types) and
nan="zero_opposite_sign" (ml_dtypes' NaN into formats without NaN codes): docs/semantics.md,
"`scale_precision="promoted"` and `nan="zero_opposite_sign"`". The oracles are the rules'
own tables and exact Fraction arithmetic, never the code under test or the peer."""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import Datapath

import datapath_oracle as do
import float_oracle as fo

PROMOTED = Datapath(scale_precision="promoted")
OPPOSITE = Datapath(nan="zero_opposite_sign")

DTYPES = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "int32": np.int32, "float8e8m0": ml_dtypes.float8_e8m0fnu}

# The rule's table (docs/semantics.md): (x type, scale type) -> the precision numpy divides in.
PROMOTION = {
    ("float", "float"): "float", ("float", "float16"): "float", ("float", "bfloat16"): "float",
    ("float", "int32"): "float64", ("float", "float8e8m0"): "float",
    ("float16", "float"): "float", ("float16", "float16"): "float16",
    ("float16", "bfloat16"): "float", ("float16", "int32"): "float64",
    ("float16", "float8e8m0"): "float",
    ("bfloat16", "float"): "float", ("bfloat16", "float16"): "float",
    ("bfloat16", "bfloat16"): "bfloat16", ("bfloat16", "int32"): "float64",
    ("bfloat16", "float8e8m0"): "bfloat16",
    ("int32", "float"): "float64", ("int32", "float16"): "float64", ("int32", "bfloat16"): "float64",
    ("int32", "int32"): "float64", ("int32", "float8e8m0"): "float64",
}


def _scale_values(x_type, scale_type):
    # non-power-of-two scales (but e8m0's), so that the quotients are inexact; 2^19 for
    # int32 x (below)
    if (x_type, scale_type) == ("int32", "float"):
        return [0.3, 3.0, 0.0123, 524288.0]
    if (x_type, scale_type) == ("float16", "int32"):
        return [3, 7, 100]  # x = (k + 1/2) * scale stays below float16's max
    return {"float": [0.3, 3.0, 0.0123], "float16": [0.3, 3.0, 0.0123],
            "bfloat16": [0.3, 3.0, 0.0123], "int32": [3, 16777217, 524287],
            "float8e8m0": [0.25, 8.0, 1.0]}[scale_type]


def _x_values(x_type, scale: float):
    """x near q = k + 1/2 for q in [-130, 130] (ties of the integer rounding and their
    float neighbours), and two arbitrary values."""
    values = []
    for k in (-129, -3, -1, 0, 1, 2, 7, 64, 100, 127):
        t = (k + 0.5) * scale
        values += [t, np.nextafter(t, math.inf), np.nextafter(t, -math.inf)]
    values += [2.5009765625 * scale, 14.2464 * scale]
    if x_type == "int32":
        # and one unit above each tie: with a scale of 2^19, q = k + 1/2 + 2^-19, which
        # float32 rounds to the tie and float64 does not (the entry of docs/divergences.md)
        values += [(k + 0.5) * scale + 1 for k in (-3, 0, 7, 100)]
        return np.array([round(v) for v in values if abs(v) < 2**31 - 1], np.int32)
    return np.array(values, np.float64).astype(DTYPES[x_type])


def _exact(v) -> Fraction:
    return Fraction(float(np.asarray(v).astype(np.float64)))


def _oracle_int8(x, s, precision):
    q = do.round_nearest_even_to(_exact(x) / _exact(s), precision)
    if isinstance(q, float):  # +-inf
        return 127 if q > 0 else -128
    return min(max(fo.round_half_even(q), -128), 127)


def test_the_promotion_table_is_numpys():
    """The table the oracle uses is what numpy divides these dtypes in (numpy 2, ml_dtypes
    0.7: ml_dtypes 0.6 divided bfloat16 by float8e8m0 in float32)."""
    for (x_type, scale_type), precision in PROMOTION.items():
        with np.errstate(all="ignore"):
            got = (np.ones(1, DTYPES[x_type]) / np.ones(1, DTYPES[scale_type])).dtype
        want = {"float": np.float32, "float64": np.float64}.get(precision, DTYPES.get(precision))
        assert got == np.dtype(want), (x_type, scale_type, got)


@pytest.mark.parametrize("opset", [13, 21, 25])
def test_promoted_quotient_into_int8(opset):
    """Every (x, scale) type pair of the version: the exact quotient rounded once to the
    promoted precision, then to even. Pairs whose precision differs from the version's own
    must change some bits (the table is not vacuous)."""
    if opset == 13:
        pairs = [("float", "float"), ("int32", "float")]
    elif opset == 21:
        pairs = [(t, t) for t in ("float", "float16", "bfloat16", "int32")]
    else:
        pairs = list(PROMOTION)
    changed = set()
    for x_type, scale_type in pairs:
        for scale_value in _scale_values(x_type, scale_type):
            s = np.asarray(scale_value).astype(DTYPES[scale_type])
            x = _x_values(x_type, float(s.astype(np.float64)))
            got = qemu_q.quantize_linear(x, s, np.int8(0), opset=opset, datapath=PROMOTED)
            want = [_oracle_int8(v, s, PROMOTION[(x_type, scale_type)]) for v in x]
            assert got.tolist() == want, (opset, x_type, scale_type, scale_value)
            if got.tolist() != qemu_q.quantize_linear(x, s, np.int8(0), opset=opset).tolist():
                changed.add((x_type, scale_type))
    expect = {pair for pair in pairs if PROMOTION[pair] != _onnx_precision(opset, *pair)}
    # An int32 operand with a half or e8m0 other operand: the float64 and float32
    # quotients within int8's range round alike (the quotient of an 11-bit or 8-bit value
    # by a 31-bit one, or by a power of two, stays far from a float32 tie's neighbourhood).
    # bfloat16 x over a float8e8m0 scale (a power of two): the quotient is exact in
    # bfloat16 and in float32 alike, but below 2^-126, where every int8 code is 0.
    alike = {("int32", "float16"), ("int32", "bfloat16"), ("int32", "float8e8m0"),
             ("float16", "int32"), ("bfloat16", "int32"), ("bfloat16", "float8e8m0")}
    assert expect - alike <= changed <= expect, (changed, expect)


def _onnx_precision(opset, x_type, scale_type):
    # docs/semantics.md, "QuantizeLinear: the division"
    if opset < 19 or scale_type in ("int32", "float8e8m0"):
        return "float"
    return scale_type


def test_promoted_with_the_precision_attribute_is_the_attribute():
    """A nonzero precision attribute names P (onnx.reference converts both operands to it):
    "promoted" is the version's own division there."""
    x = np.array([7.502, 1.505, 2.5009765625, -3.4997], np.float32)
    s = np.float32(3.0)
    for precision, name in ((10, "float16"), (16, "bfloat16"), (1, "float")):
        got = qemu_q.quantize_linear(x, s, np.int16(0), opset=23, precision=precision,
                                     datapath=PROMOTED)
        want = [fo.round_half_even(do.round_nearest_even_to(_exact(v) / 3, name)) for v in x]
        assert got.tolist() == want, precision


def test_promoted_float64_into_a_small_float_rounds_once():
    """int32 x and scale into e4m3fn: the float64 quotient rounded once to e4m3fn (ml_dtypes
    0.7's float64 -> float8 conversion; 0.6 went through float32). x / s = 19/32 - 1/s
    with s = 2^30 + 32: 19/32 = 0.59375 is an e4m3fn midpoint (0x31 and 0x32, even 0x32);
    the float64 quotient stays below it (0x31), its float32 rounding is the midpoint
    itself, which ties to even (0x32), as the default's float32 division gives."""
    s = 2**30 + 32
    x = 19 * s // 32 - 1
    assert 19 * s % 32 == 0 and x < 2**31
    q = Fraction(x, s)
    q64 = do.round_nearest_even_to(q, "float64")
    assert q64 < Fraction(19, 32) == do.round_nearest_even_to(q, "float")
    zero = np.zeros((), ml_dtypes.float8_e4m3fn)
    want = fo.encode("float8_e4m3fn", q64, 1)
    assert want == 0x31
    for opset in (21, 25):
        got = qemu_q.quantize_linear(np.array([x, -x], np.int32), np.int32(s), zero, opset=opset,
                                     datapath=PROMOTED)
        assert got.view(np.uint8).tolist() == [want, want | 0x80]
    # the default rounds the exact quotient to float32 once (the division precision)
    assert qemu_q.quantize_linear(np.array([x], np.int32), np.int32(s), zero,
                                  opset=21).view(np.uint8).tolist() == [0x32]


@pytest.mark.parametrize("n_threads", [1, 3])
def test_promoted_paths_do_not_depend_on_threads(n_threads):
    rng = np.random.default_rng(2)
    x = rng.integers(-2**30, 2**30, 5000).astype(np.int32)
    s = np.int32(16777219)
    zero = np.zeros((), ml_dtypes.float8_e5m2)
    ref8 = qemu_q.quantize_linear(x, s, zero, opset=25, datapath=PROMOTED, n_threads=1)
    got8 = qemu_q.quantize_linear(x, s, zero, opset=25, datapath=PROMOTED, n_threads=n_threads)
    assert got8.view(np.uint8).tolist() == ref8.view(np.uint8).tolist()
    want = [fo.encode("float8_e5m2", do.round_nearest_even_to(Fraction(int(v), int(s)), "float64"), 1)
            for v in x[:200]]
    assert ref8.view(np.uint8)[:200].tolist() == want
    xf = (rng.standard_normal(5000) * 30).astype(np.float32)
    for scale in (np.float16(0.3), ml_dtypes.bfloat16(0.3)):
        got = qemu_q.quantize_linear(xf, scale, np.int8(0), opset=25, datapath=PROMOTED,
                                     n_threads=n_threads)
        want = [_oracle_int8(v, scale, "float") for v in xf[:300]]
        assert got[:300].tolist() == want
        assert got.tolist() == qemu_q.quantize_linear(xf, scale, np.int8(0), opset=25,
                                                      datapath=Datapath(scale_precision="float32"),
                                                      n_threads=1).tolist()


def test_promoted_refuses_reciprocal():
    with pytest.raises(ValueError, match="scale='reciprocal' with scale_precision='promoted'"):
        Datapath(scale="reciprocal", scale_precision="promoted")


def test_promoted_dequantize_is_a_float32_product():
    """DequantizeLinear: numpy multiplies the float32 codes by the scale in float32. The
    example of docs/semantics.md: 3 * float32(1 + 2731 * 2^-23) into float16 is 0x4201
    rounded once and 0x4200 through float32."""
    scale = np.float32(1 + 2731 * 2.0**-23)
    exact = 3 * Fraction(float(scale))
    once = fo.round_to_binary(exact, "float16")
    twice = fo.round_to_binary(fo.round_to_binary(exact, "float"), "float16")
    assert once != twice
    bits = {once: 0x4201, twice: 0x4200}
    x = np.array([3], np.int8)
    for opset in (23, 25):
        got = qemu_q.dequantize_linear(x, scale, np.int8(0), opset=opset, output_dtype="float16",
                                       datapath=PROMOTED)
        assert got.view(np.uint16).tolist() == [bits[twice]]
        assert qemu_q.dequantize_linear(x, scale, np.int8(0), opset=opset,
                                        output_dtype="float16").view(np.uint16).tolist() == [bits[once]]


def test_promoted_in_the_other_ops():
    """QLinear: the "float64" rule's own multiplier (numpy's, in the scales' type), refused
    with the other rules; MX: float32 (numpy divides by e8m0 in float32); NVFP4: the
    recipes' float32 steps."""
    a = np.array([[7, 250]], np.uint8)
    b = np.array([[5], [9]], np.uint8)
    inputs = [a, np.float32(0.1), np.uint8(0), b, np.float32(0.37), np.uint8(0), np.float32(0.3),
              np.uint8(10)]
    want = qemu_q.qlinear_matmul(*inputs, requantization="float64")
    got = qemu_q.qlinear_matmul(*inputs, requantization="float64", datapath=PROMOTED)
    assert got.tolist() == want.tolist()
    for rule in ("exact", "float32"):
        with pytest.raises(ValueError, match=f"scale_precision='promoted' with the '{rule}'"):
            qemu_q.qlinear_matmul(*inputs, requantization=rule, datapath=PROMOTED)
    # MX, a directed mode (tests/test_datapath_block_scaled.py's case): the exact quotient
    # 2^-149 / 2^119 = 2^-268 rounds "up" to the smallest subnormal, its float32 rounding (0)
    # stays 0: "promoted" is the float32 one.
    x = np.zeros(32, np.float32)
    x[0] = np.float32(2.0 ** 127)
    x[1] = np.float32(2.0 ** -149)
    codes = {p: np.asarray(qemu_q.mx_quantize(x, "float4e2m1", datapath=Datapath(
        rounding="up", scale_precision=p))[0]).view(np.uint8).tolist() for p in (None, "promoted")}
    assert codes["promoted"][1] == 0 and codes[None][1] == 1
    xs = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    default = qemu_q.nvfp4_quantize(xs)
    promoted = qemu_q.nvfp4_quantize(xs, datapath=PROMOTED)
    assert [np.asarray(p).tobytes() for p in promoted] == [np.asarray(d).tobytes() for d in default]
    with pytest.raises(ValueError, match="nan='zero_opposite_sign' conflicts with recipe"):
        qemu_q.nvfp4_quantize(xs, datapath=OPPOSITE)


# --------------------------------------------------------------------------------------
# nan="zero_opposite_sign"

NO_NAN = {"float4e2m1": ("float4_e2m1fn", 4), "float6e2m3": ("float6_e2m3fn", 6),
          "float6e3m2": ("float6_e3m2fn", 6)}


def _nan_inputs():
    """float32 NaNs of both signs, quiet and signalling, with payloads; infinities and
    finite values to check that nothing else changes."""
    bits = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000,
            0xFFA00000, 0x7F800000, 0xFF800000, 0x40200000, 0xC0B00000, 0x80000000, 0x00000000,
            0x3E800000, 0xBE800001]
    return np.array(bits, np.uint32).view(np.float32)


def _rule_code(value: np.float32, width: int, fmt: str) -> int:
    """The rule: a NaN gives the zero of the opposite sign; anything else the spec's code
    (QuantizeLinear's: finite and +-inf through the float oracle, saturating)."""
    negative = bool(np.asarray(value).view(np.uint32) >> 31)
    if math.isnan(float(value)):
        return 0 if negative else 1 << (width - 1)
    return fo.encode(fmt, float(value), 1)


@pytest.mark.parametrize("out", sorted(NO_NAN))
def test_zero_opposite_sign_quantize_linear(out):
    fmt, width = NO_NAN[out]
    x = _nan_inputs()
    want = [_rule_code(v, width, fmt) for v in x]
    opset = 28
    # (flush_inputs: the datapath loop; the inputs hold no subnormal)
    for datapath in (OPPOSITE, Datapath(nan="zero_opposite_sign", subnormals="flush_inputs")):
        got = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype=out, opset=opset,
                                     datapath=datapath)
        assert got.view(np.uint8).tolist() == want, datapath
        with np.errstate(invalid="ignore"):  # numpy warns on signalling NaNs
            half = x.astype(np.float16)
        got = qemu_q.quantize_linear(half, np.float16(1.0), output_dtype=out, opset=opset,
                                     datapath=datapath)
        assert got.view(np.uint8).tolist() == [_rule_code(np.float32(v), width, fmt) for v in half]
    # the spec's +max for NaN without the value
    default = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype=out, opset=opset)
    assert default.view(np.uint8).tolist()[:2] == [(1 << (width - 1)) - 1] * 2
    # NaN made by the division (0 / 0: the FPU's default NaN, negative on x86) and by a
    # NaN scale (positive)
    got = qemu_q.quantize_linear(np.array([0.0, 1.0], np.float32), np.array([0.0, np.nan], np.float32),
                                 output_dtype=out, opset=opset, axis=0, datapath=OPPOSITE)
    with np.errstate(invalid="ignore"):
        default_nan = np.array([0.0], np.float32) / np.array([0.0], np.float32)
    assert got.view(np.uint8).tolist() == [_rule_code(default_nan[0], width, fmt), 1 << (width - 1)]


def test_zero_opposite_sign_family_minifloat_and_formats_with_nan():
    """A family format without NaN follows the rule; formats with NaN codes keep "spec"."""
    e2m1 = qemu_q.minifloat_type(2, 1, nan="none")
    x = np.array([0x7FC00000, 0xFFC00000, 0x40000000], np.uint32).view(np.float32)
    got = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype=e2m1, datapath=OPPOSITE)
    assert np.asarray(got).view(np.uint8).tolist() == [0x8, 0x0, fo.encode("float4_e2m1fn", 2.0, 1)]
    for out, fmt in (("float8e4m3fn", "float8_e4m3fn"), ("float8e5m2", "float8_e5m2"),
                     ("float8e4m3fnuz", "float8_e4m3fnuz")):
        got = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype=out, opset=25, datapath=OPPOSITE)
        want = [fo.encode(fmt, float(v), 1, opset=25) for v in x]
        assert got.view(np.uint8).tolist() == want, out
    # DequantizeLinear's outputs have NaN codes: "spec"
    codes = np.array([0x7F, 0xFF], np.uint8).view(ml_dtypes.float8_e4m3fn)
    got = qemu_q.dequantize_linear(codes, np.float32(1.0), datapath=OPPOSITE)
    assert got.view(np.uint32).tolist() == [0x7FC00000, 0xFFC00000]


@pytest.mark.parametrize("target", sorted(NO_NAN))
def test_zero_opposite_sign_cast(target):
    fmt, width = NO_NAN[target]
    x = _nan_inputs()
    want = [_rule_code(v, width, fmt) for v in x]
    for datapath in (OPPOSITE, Datapath(nan="zero_opposite_sign", subnormals="flush_inputs")):
        for source in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
            with np.errstate(invalid="ignore"):  # numpy warns on signalling NaNs
                xs = x.astype(source)
            # (the inputs hold no subnormal: flush_inputs only moves Cast to its datapath loop)
            expect = [_rule_code(np.float32(v), width, fmt) for v in xs.astype(np.float32)]
            got = qemu_q.cast(xs, target, opset=28, datapath=datapath)
            assert got.view(np.uint8).tolist() == expect, (source, datapath)
    assert qemu_q.cast(x, target, opset=28).view(np.uint8).tolist()[:2] == [1 << (width - 1)] * 2
    # float8 NaN codes: the code's sign (e4m3fnuz's one NaN, 0x80, is negative)
    for codes, dtype in (([0x7F, 0xFF], ml_dtypes.float8_e4m3fn), ([0x80], ml_dtypes.float8_e4m3fnuz),
                         ([0x7E, 0xFD], ml_dtypes.float8_e5m2)):
        got = qemu_q.cast(np.array(codes, np.uint8).view(dtype), target, opset=28, datapath=OPPOSITE)
        assert got.view(np.uint8).tolist() == [0 if c & 0x80 else 1 << (width - 1) for c in codes]
    assert want[:2] == [1 << (width - 1), 0]


@pytest.mark.parametrize("n_threads", [1, 4])
def test_zero_opposite_sign_threads(n_threads):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(20000) * 4).astype(np.float32)
    x[::5] = np.nan
    x[1::10] = -np.nan
    want = [_rule_code(v, 4, "float4_e2m1fn") for v in x[:500]]
    got = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype="float4e2m1", opset=25,
                                 datapath=OPPOSITE, n_threads=n_threads)
    assert got.view(np.uint8)[:500].tolist() == want
    ref = qemu_q.quantize_linear(x, np.float32(1.0), output_dtype="float4e2m1", opset=25,
                                 datapath=OPPOSITE, n_threads=1)
    assert got.view(np.uint8).tolist() == ref.view(np.uint8).tolist()
    got = qemu_q.cast(x, "float4e2m1", opset=25, datapath=OPPOSITE, n_threads=n_threads)
    assert got.view(np.uint8)[:500].tolist() == want
