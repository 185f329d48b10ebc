"""The kernels against a deliberately naive numpy reference, bit for bit.

The reference below is written from docs/semantics.md with float64 and Fraction arithmetic
and never calls qemu_q: q = RNE_P(x / scale) (the float64 quotient of an x of at most 32
significant bits over a scale of at most 24 is never within half a double ulp of a midpoint
of P unless it is one, so rounding it once more to P is the correctly rounded quotient; the
tests keep int32 scales below 2**24 for that reason), then np.rint, + zero point,
clip; NaN -> minimum, +inf -> maximum, -inf -> minimum. DequantizeLinear: the exact product
(x - zp) * scale rounded once to the output type. Rounding to float32/float16/bfloat16 is
done by `round_f64` (integer rounding of a scaled float64, exact) or `round_fraction`
(Fractions), never by numpy's or ml_dtypes' conversions of inexact values (ml_dtypes rounds
float64 -> bfloat16 through float32, which is a double rounding).

Also here: thread-count independence on sizes straddling the kernels' task boundaries
(16384-element runs, the 65536-element serial threshold), read-only / non-contiguous inputs,
`out=`, DynamicQuantizeLinear, and pack/unpack.
"""

import os
import zlib
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from support import assert_same_bits, bits


def onnx_helpers():
    """onnx.helper and onnx.numpy_helper; the tests that compare with onnx skip without it."""
    pytest.importorskip("onnx", reason="pack/unpack are compared with onnx's raw_data (test extra)")
    from onnx import helper, numpy_helper
    return helper, numpy_helper


INT_TYPES = {  # name: (dtype, lo, hi)
    "int8": (np.dtype(np.int8), -128, 127),
    "uint8": (np.dtype(np.uint8), 0, 255),
    "int16": (np.dtype(np.int16), -32768, 32767),
    "uint16": (np.dtype(np.uint16), 0, 65535),
    "int4": (np.dtype(ml_dtypes.int4), -8, 7),
    "uint4": (np.dtype(ml_dtypes.uint4), 0, 15),
    "int2": (np.dtype(ml_dtypes.int2), -2, 1),
    "uint2": (np.dtype(ml_dtypes.uint2), 0, 3),
}
INT_NAMES = list(INT_TYPES)

# name: (fraction bits, smallest normal exponent, largest finite)
FLOAT_FORMATS = {
    "float": (23, -126, (2 - 2.0**-23) * 2.0**127),
    "float16": (10, -14, 65504.0),
    "bfloat16": (7, -126, (2 - 2.0**-7) * 2.0**127),
}
FLOAT_DTYPES = {"float": np.dtype(np.float32), "float16": np.dtype(np.float16),
                "bfloat16": np.dtype(ml_dtypes.bfloat16)}


# --- the naive reference ------------------------------------------------------------------------

def round_f64(v, fmt):
    """float64 values rounded to nearest-even on the grid of `fmt` (float64 results, exact).

    The value is scaled by a power of two so that one unit is the format's ulp at its
    exponent (clamped to the subnormal exponent), rounded to an integer with np.rint (ties
    to even), and scaled back. Overflow is decided on the rounded value.
    """
    man, emin, vmax = FLOAT_FORMATS[fmt]
    v = np.array(v, dtype=np.float64, copy=True)
    sel = np.isfinite(v) & (v != 0)
    a = v[sel]
    _, e = np.frexp(np.abs(a))  # |a| = m * 2**e, m in [0.5, 1)
    ulp_exp = np.maximum(e - 1, emin) - man
    r = np.ldexp(np.rint(np.ldexp(a, -ulp_exp)), ulp_exp)
    v[sel] = np.where(np.abs(r) > vmax, np.copysign(np.inf, r), r)
    return v


def round_fraction(value, fmt):
    """A Fraction rounded to nearest-even in `fmt`, as a Python float (or +-inf)."""
    man, emin, vmax = FLOAT_FORMATS[fmt]
    if value == 0:
        return 0.0
    sign = -1.0 if value < 0 else 1.0
    a = abs(value)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    assert Fraction(2) ** e <= a < Fraction(2) ** (e + 1)
    quantum = Fraction(2) ** (max(e, emin) - man)
    r = round(a / quantum) * quantum  # Fraction.__round__ rounds half to even
    if r > Fraction(vmax):
        return sign * np.inf
    return sign * float(r)


def to_format(values64, fmt):
    """float64 values that are exactly representable in fmt, as an array of fmt (exact)."""
    return np.asarray(values64, np.float64).astype(FLOAT_DTYPES[fmt])


def expand(param, shape, axis=1, block_size=0):
    """A per-tensor / per-axis / blocked parameter broadcast to one value per element of x."""
    param = np.asarray(param)
    if block_size == 0 and param.size == 1:
        return np.broadcast_to(param.reshape(()), shape)
    rank = len(shape)
    axis %= rank
    if block_size == 0:
        view = [1] * rank
        view[axis] = -1
        return np.broadcast_to(param.reshape(view), shape)
    repeated = np.repeat(param, block_size, axis=axis)
    return np.take(repeated, np.arange(shape[axis]), axis=axis)


def naive_quantize(x, scale, zero_point, out_name, precision, axis=1, block_size=0):
    dtype, lo, hi = INT_TYPES[out_name]
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        s64 = expand(scale.astype(np.float64), x.shape, axis, block_size)
        q = round_f64(x64 / s64, precision)
        z = 0 if zero_point is None else expand(zero_point.astype(np.int64), x.shape, axis, block_size)
        y = np.clip(np.rint(q) + z, lo, hi)
        y = np.where(np.isnan(q), lo, y)
    return y.astype(np.int64).astype(dtype)


def naive_dequantize(x, scale, zero_point, out_fmt, axis=1, block_size=0):
    d = x.astype(np.int64)
    if zero_point is not None:
        d = d - expand(zero_point.astype(np.int64), x.shape, axis, block_size)
    assert np.all(np.abs(d) < 2**29), "the float64 product is exact only below 2**29 x 24 bits"
    product = d.astype(np.float64) * expand(scale.astype(np.float64), x.shape, axis, block_size)
    return to_format(round_f64(product, out_fmt), out_fmt)


# --- data -------------------------------------------------------------------------------------------

def int_codes(rng, name, size):
    dtype, lo, hi = INT_TYPES[name]
    return rng.integers(lo, hi + 1, size=size).astype(dtype)


def param_shape(shape, axis, block_size, kind):
    if kind == "tensor":
        return ()
    axis %= len(shape)
    if kind == "axis":
        return (shape[axis],)
    s = list(shape)
    s[axis] = -(-shape[axis] // block_size)
    return tuple(s)


def random_scales(rng, shape, dtype, exp_range=(-8, 0)):
    """Positive normal scales: half with a full random mantissa, half with a small odd one
    (so that k + 0.5 times it is exact and makes exact ties)."""
    n = int(np.prod(shape, dtype=np.int64))
    mant = np.where(rng.random(n) < 0.5, rng.uniform(1.0, 2.0, n), rng.integers(1, 8, n) * 2 + 1.0)
    s = mant * np.exp2(rng.integers(exp_range[0], exp_range[1] + 1, n).astype(np.float64))
    return s.astype(dtype).reshape(shape)


def quantize_inputs(rng, out_name, shape, x_dtype, scale, zero_point, axis, block_size):
    """x whose quotients cover the output range and a little beyond, with exact ties, random
    fractions, NaN, +-inf and -0."""
    _, lo, hi = INT_TYPES[out_name]
    n = int(np.prod(shape))
    codes = rng.integers(lo - 3, hi + 4, n).astype(np.float64).reshape(shape)
    z = 0 if zero_point is None else expand(zero_point.astype(np.int64), shape, axis, block_size)
    frac = rng.choice([0.0, 0.5, -0.5, 0.25], size=shape)
    frac = np.where(rng.random(shape) < 0.3, rng.uniform(-0.5, 0.5, shape), frac)
    x = (codes - z + frac) * expand(scale.astype(np.float64), shape, axis, block_size)
    flat = x.reshape(-1)
    specials = rng.integers(0, n, size=min(n, 12))
    flat[specials] = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.nan, 1e30, -1e30, 2.0**31, -(2.0**31), 1e-30, -1e-30][: specials.size]
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        return x.astype(x_dtype)


# --- layouts straddling the task boundaries ---------------------------------------------------------------

# (id, shape, axis, block_size, kind); sizes straddle the 16384-element runs and the
# 65536-element serial threshold; the blocked ones end with a partial block.
LAYOUTS = [
    ("tensor-16383", (16383,), 0, 0, "tensor"),
    ("tensor-16385", (16385,), 0, 0, "tensor"),
    ("tensor-65535", (65535,), 0, 0, "tensor"),
    ("tensor-65537", (65537,), 0, 0, "tensor"),
    ("tensor-3d", (3, 129, 257), 1, 0, "tensor"),
    ("axis-first", (3, 40001), 0, 0, "axis"),
    ("axis-middle", (5, 7, 3001), 1, 0, "axis"),
    ("axis-last", (2, 70001), -1, 0, "axis"),
    ("axis-1d", (16385,), 0, 0, "axis"),
    ("block3-last", (2, 70001), -1, 3, "block"),
    ("block7-last", (1, 65537), 1, 7, "block"),
    ("block32-last", (3, 32769), -1, 32, "block"),
    ("block100-last", (2, 70001), 1, 100, "block"),
    ("block7-first", (70001, 2), 0, 7, "block"),
    ("block100-middle", (3, 1001, 33), -2, 100, "block"),
]
LAYOUT_IDS = [layout[0] for layout in LAYOUTS]
THREADS = (1, 2, 3, 8)


def _seed(*parts):
    """A deterministic seed per test case (hash() of a str varies between runs)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("out_name", INT_NAMES)
def test_quantize_threads_and_naive(out_name, layout):
    _, shape, axis, block_size, kind = layout
    rng = np.random.default_rng(_seed("q", out_name, layout[0]))
    pshape = param_shape(shape, axis, block_size, kind)
    scale = random_scales(rng, pshape, np.float32)
    zero_point = int_codes(rng, out_name, pshape).reshape(pshape)
    x = quantize_inputs(rng, out_name, shape, np.float32, scale, zero_point, axis, block_size)
    expected = naive_quantize(x, scale, zero_point, out_name, "float", axis, block_size)
    for n in THREADS:
        got = qemu_q.quantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, n_threads=n)
        assert_same_bits(got, expected, f"n_threads={n}")


@pytest.mark.parametrize("layout", LAYOUTS[3:4] + LAYOUTS[5:8] + LAYOUTS[9:10] + LAYOUTS[13:], ids=lambda l: l[0])
@pytest.mark.parametrize("x_name", ["float16", "bfloat16", "int32"])
def test_quantize_threads_other_x_types(x_name, layout):
    # Opset 28: the division precision is the scale's type (float16 / bfloat16; float32 for
    # an int32 x with a float32 scale, whose quotient of 31 over 24 bits the float64 path
    # rounds correctly).
    _, shape, axis, block_size, kind = layout
    rng = np.random.default_rng(_seed("qx", x_name, layout[0]))
    pshape = param_shape(shape, axis, block_size, kind)
    out_name = "int8" if x_name != "int32" else "int16"
    if x_name == "int32":
        scale = random_scales(rng, pshape, np.float32, exp_range=(0, 16))
        zero_point = int_codes(rng, out_name, pshape).reshape(pshape)
        x = rng.integers(-(2**31), 2**31, size=shape, dtype=np.int64).astype(np.int32)
        x.reshape(-1)[:4] = [2**31 - 1, -(2**31), 0, 40960513]
        precision = "float"
    else:
        scale = random_scales(rng, pshape, FLOAT_DTYPES[x_name], exp_range=(-6, -2))
        zero_point = int_codes(rng, out_name, pshape).reshape(pshape)
        x = quantize_inputs(rng, out_name, shape, FLOAT_DTYPES[x_name], scale, zero_point, axis, block_size)
        precision = x_name
    expected = naive_quantize(x, scale, zero_point, out_name, precision, axis, block_size)
    for n in THREADS:
        got = qemu_q.quantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, n_threads=n)
        assert_same_bits(got, expected, f"n_threads={n}")


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("code_name", INT_NAMES + ["int32"])
def test_dequantize_threads_and_naive(code_name, layout):
    _, shape, axis, block_size, kind = layout
    rng = np.random.default_rng(_seed("dq", code_name, layout[0]))
    pshape = param_shape(shape, axis, block_size, kind)
    scale = random_scales(rng, pshape, np.float32, exp_range=(-20, 20))
    if code_name == "int32":
        # Below 2**29 the float64 product with a 24-bit scale is exact; larger codes are
        # checked with Fractions in test_dequantize_int32_near_2_31.
        x = rng.integers(-(2**29) + 1, 2**29, size=shape).astype(np.int32)
        zero_point = None
    else:
        x = int_codes(rng, code_name, shape)
        zero_point = int_codes(rng, code_name, pshape).reshape(pshape)
    expected = naive_dequantize(x, scale, zero_point, "float", axis, block_size)
    for n in THREADS:
        got = qemu_q.dequantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, n_threads=n)
        assert_same_bits(got, expected, f"n_threads={n}")


@pytest.mark.parametrize("layout", LAYOUTS[3:4] + LAYOUTS[7:8] + LAYOUTS[10:11] + LAYOUTS[13:14], ids=lambda l: l[0])
@pytest.mark.parametrize("out_fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("code_name", ["int16", "uint8", "int32"])
def test_dequantize_threads_half_outputs(code_name, out_fmt, layout):
    _, shape, axis, block_size, kind = layout
    rng = np.random.default_rng(_seed("dqh", code_name, out_fmt, layout[0]))
    pshape = param_shape(shape, axis, block_size, kind)
    scale = random_scales(rng, pshape, FLOAT_DTYPES[out_fmt], exp_range=(-12, -2))
    if code_name == "int32":
        x = rng.integers(-(2**29) + 1, 2**29, size=shape).astype(np.int32)
        zero_point = None
    else:
        x = int_codes(rng, code_name, shape)
        zero_point = int_codes(rng, code_name, pshape).reshape(pshape)
    expected = naive_dequantize(x, scale, zero_point, out_fmt, axis, block_size)
    for n in THREADS:
        got = qemu_q.dequantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, n_threads=n)
        assert_same_bits(got, expected, f"n_threads={n}")


def test_default_thread_count_setting_gives_same_bits():
    rng = np.random.default_rng(7)
    x = rng.normal(0, 100, 200003).astype(np.float32)
    scale = np.float32(0.37)
    expected = qemu_q.quantize_linear(x, scale, np.int8(3), n_threads=1)
    try:
        for n in (2, 5):
            qemu_q.set_num_threads(n)
            assert qemu_q.get_num_threads() == n
            assert_same_bits(qemu_q.quantize_linear(x, scale, np.int8(3)), expected, f"default {n}")
    finally:
        qemu_q.set_num_threads(None)


def test_openmp_enabled():
    if os.environ.get("QEMU_Q_ALLOW_SERIAL") == "1":
        pytest.skip("QEMU_Q_ALLOW_SERIAL=1: a serial (non-OpenMP) build is allowed here")
    assert qemu_q.openmp_enabled(), (
        "qemu_q was built without OpenMP; set QEMU_Q_ALLOW_SERIAL=1 to accept a serial build"
    )


# --- random data on every granularity, small shapes -----------------------------------------------

SMALL_LAYOUTS = [
    ((5,), 0, 0, "tensor"), ((2, 3, 4), 1, 0, "tensor"), ((4, 3), 0, 0, "axis"),
    ((2, 3, 5), -1, 0, "axis"), ((2, 3, 5), 1, 0, "axis"), ((1,), 0, 0, "axis"),
    ((7, 3), 0, 2, "block"), ((2, 9), 1, 4, "block"), ((2, 5, 3), 1, 3, "block"),
    ((2, 5, 3), -2, 4, "block"), ((3, 1, 2), 1, 1, "block"),
]


@pytest.mark.parametrize("layout", SMALL_LAYOUTS, ids=str)
@pytest.mark.parametrize("out_name", INT_NAMES)
def test_quantize_small_shapes_naive(out_name, layout):
    shape, axis, block_size, kind = layout
    rng = np.random.default_rng(_seed("qs", out_name, layout))
    pshape = param_shape(shape, axis, block_size, kind)
    for x_name in ("float", "float16", "bfloat16"):
        scale = random_scales(rng, pshape, FLOAT_DTYPES[x_name], exp_range=(-5, -2))
        for zero_point in (None, int_codes(rng, out_name, pshape).reshape(pshape)):
            kwargs = {} if zero_point is not None else {"output_dtype": out_name}
            x = quantize_inputs(rng, out_name, shape, FLOAT_DTYPES[x_name], scale, zero_point, axis, block_size)
            got = qemu_q.quantize_linear(x, scale, zero_point, axis=axis, block_size=block_size, **kwargs)
            expected = naive_quantize(x, scale, zero_point, out_name, x_name, axis, block_size)
            assert_same_bits(got, expected, f"{x_name} zp={zero_point is not None}")


@pytest.mark.parametrize("layout", SMALL_LAYOUTS, ids=str)
@pytest.mark.parametrize("code_name", INT_NAMES)
def test_dequantize_small_shapes_naive(code_name, layout):
    shape, axis, block_size, kind = layout
    rng = np.random.default_rng(_seed("dqs", code_name, layout))
    pshape = param_shape(shape, axis, block_size, kind)
    for scale_name in ("float", "float16", "bfloat16"):
        scale = random_scales(rng, pshape, FLOAT_DTYPES[scale_name], exp_range=(-10, 3))
        x = int_codes(rng, code_name, shape)
        for zero_point in (None, int_codes(rng, code_name, pshape).reshape(pshape)):
            for out_fmt in ("float", "float16", "bfloat16"):
                got = qemu_q.dequantize_linear(x, scale, zero_point, axis=axis, block_size=block_size,
                                               output_dtype=out_fmt)
                expected = naive_dequantize(x, scale, zero_point, out_fmt, axis, block_size)
                assert_same_bits(got, expected, f"{scale_name} -> {out_fmt}")


# --- NaN, infinities and the range boundaries, every integer type --------------------------------------------

@pytest.mark.parametrize("x_name", ["float", "float16", "bfloat16"])
@pytest.mark.parametrize("out_name", INT_NAMES)
def test_nan_inf_and_saturation(out_name, x_name):
    dtype, lo, hi = INT_TYPES[out_name]
    values = [np.nan, -np.nan, np.inf, -np.inf, hi + 0.5, lo - 0.5, hi + 1.0, lo - 1.0,
              hi - 0.5, lo + 0.5, 1e30, -1e30, 2.0**31, -(2.0**31), 2.0**40, -0.0, 0.0, -0.5, 0.5,
              1.5, -1.5, 2.5]
    # The expected codes, written from the rules: NaN -> lo whatever the sign; +inf -> hi;
    # -inf -> lo; ties round to even, then saturate (hi + 0.5 -> hi, lo - 0.5 -> lo).
    def rule(v):
        if v != v:
            return lo
        if v in (np.inf, -np.inf):
            return hi if v > 0 else lo
        return min(max(int(np.rint(v)), lo), hi)

    finite_max = FLOAT_FORMATS[x_name][2]
    values = [v for v in values if not (np.isfinite(v) and abs(v) > finite_max)]
    x = np.array(values, dtype=np.float64).astype(FLOAT_DTYPES[x_name])
    # With a scale of 1 the quotient is x itself, as the format holds it (65535.5 is 65536
    # in bfloat16, for instance).
    got = qemu_q.quantize_linear(x, np.array(1.0, FLOAT_DTYPES[x_name]), output_dtype=out_name)
    expected = np.array([rule(v) for v in x.astype(np.float64)], dtype=np.int64).astype(dtype)
    assert_same_bits(got, expected, out_name)


@pytest.mark.parametrize("out_name", INT_NAMES)
def test_nan_is_minimum_whatever_the_zero_point(out_name):
    dtype, lo, hi = INT_TYPES[out_name]
    for zp in (lo, hi, (lo + hi) // 2):
        x = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)
        got = qemu_q.quantize_linear(x, np.float32(1.0), np.array(zp).astype(dtype))
        expected = np.array([lo, hi, lo, zp], dtype=np.int64).astype(dtype)
        assert_same_bits(got, expected, f"zp={zp}")


@pytest.mark.parametrize("out_name", ["int8", "uint8", "int4", "uint2"])
def test_ieee_scales_zero_negative_infinite(out_name):
    dtype, lo, hi = INT_TYPES[out_name]
    x = np.array([1.0, -1.0, 0.0, -0.0, 3.0], np.float32)
    # x / 0: +-inf, 0 / 0: NaN -> [hi, lo, lo, lo, hi]
    got = qemu_q.quantize_linear(x, np.float32(0.0), output_dtype=out_name)
    assert_same_bits(got, np.array([hi, lo, lo, lo, hi]).astype(dtype), "scale 0")
    # negative scale: the quotient changes sign
    got = qemu_q.quantize_linear(x, np.float32(-1.0), output_dtype=out_name)
    expected = np.clip(np.array([-1, 1, 0, 0, -3]), lo, hi).astype(dtype)
    assert_same_bits(got, expected, "scale -1")
    # x / inf = +-0; inf scale with NaN -> NaN -> lo
    x2 = np.array([5.0, -5.0, np.inf, np.nan], np.float32)
    got = qemu_q.quantize_linear(x2, np.float32(np.inf), output_dtype=out_name)
    assert_same_bits(got, np.array([0 if lo <= 0 else lo, max(lo, 0), lo, lo]).astype(dtype), "scale inf")


# --- double rounding: the quotient is rounded to the division precision first ---------------------------------

def rne_int(value):
    return round(value)  # Python rounds half to even (float and Fraction alike)


@pytest.mark.parametrize("opset", [19, 21, 23, 28])
def test_float16_quotient_rounded_to_float16_first(opset):
    # (x, scale, output type, via float16, via float32)
    # 1537 / 0.75 = 2049.33...: float16 holds only even integers in [2048, 4096), so the
    # quotient is 2050 (not 2049). 450.5 / 0.75 = 600.66...: float16 has a 0.5 step in
    # [512, 1024), so the quotient is 600.5, a tie that rounds to 600 (not 601).
    # 128 / 0.9375 = 136.53...: float16 step 0.125 in [128, 256), quotient 136.5 -> 136 (not
    # 137); 127 / 0.9375 = 135.47... -> 135.5 -> 136 (not 135).
    cases = [(1537.0, 0.75, "int16", 2050, 2049), (450.5, 0.75, "int16", 600, 601),
             (-1537.0, 0.75, "int16", -2050, -2049),
             (128.0, 0.9375, "uint8", 136, 137), (127.0, 0.9375, "uint8", 136, 135)]
    for xv, sv, _, via_fp16, via_fp32 in cases:
        exact = Fraction(xv) / Fraction(sv)
        assert rne_int(Fraction(round_fraction(exact, "float16"))) == via_fp16
        assert rne_int(Fraction(round_fraction(exact, "float"))) == via_fp32
    for out_name in ("int16", "uint8"):
        if out_name == "int16" and opset < 21:
            continue
        sel = [c for c in cases if c[2] == out_name]
        x = np.array([c[0] for c in sel], np.float16)
        s = np.array([c[1] for c in sel], np.float16)
        zp = np.zeros(len(sel), INT_TYPES[out_name][0])
        got = qemu_q.quantize_linear(x, s, zp, axis=0, opset=opset)
        assert_same_bits(got, np.array([c[3] for c in sel]).astype(zp.dtype), f"{out_name} P = float16")
        if opset >= 23:
            got = qemu_q.quantize_linear(x, s, zp, axis=0, opset=opset, precision=1)
            assert_same_bits(got, np.array([c[4] for c in sel]).astype(zp.dtype), f"{out_name} precision=1")
            got = qemu_q.quantize_linear(x, s, zp, axis=0, opset=opset, precision=10)
            assert_same_bits(got, np.array([c[3] for c in sel]).astype(zp.dtype), f"{out_name} precision=10")


@pytest.mark.parametrize("x_dtype", [np.int32, np.float32])
def test_quotient_2049_rounds_to_2048_in_float16(x_dtype):
    # From version 23 x and the scale have separate types; the scale's type float16 is the
    # precision. 2049 is not a float16 (ulp 2 above 2048): the tie goes to even, 2048.
    assert round_fraction(Fraction(2049), "float16") == 2048.0
    x = np.array([2049, -2049, 2051, 4097], x_dtype)
    s = np.array(1.0, np.float16)
    got = qemu_q.quantize_linear(x, s, output_dtype="int16", opset=23)
    assert_same_bits(got, np.array([2048, -2048, 2052, 4096], np.int16), "P = float16")
    got = qemu_q.quantize_linear(x, s, output_dtype="int16", opset=23, precision=1)
    assert_same_bits(got, np.array([2049, -2049, 2051, 4097], np.int16), "precision=1")


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_half_precision_quotients_random(fmt):
    # Many quotients near .5 ties: the naive reference rounds the exact quotient to the half
    # format first. The float32-precision answer must differ in a good number of cases, or
    # the test would not distinguish the two rules.
    rng = np.random.default_rng(11 if fmt == "float16" else 12)
    dtype = FLOAT_DTYPES[fmt]
    n = 20000
    scale = (rng.integers(1, 256, n) * 2.0 ** rng.integers(-9, -6, n)).astype(dtype)
    target = rng.integers(100, 30000, n) + 0.5 + rng.uniform(-0.3, 0.3, n)
    x = (target * scale.astype(np.float64)).astype(dtype)
    assert np.all(np.isfinite(x.astype(np.float64)))
    expected = naive_quantize(x, scale, None, "int16", fmt, axis=0)
    via_f32 = naive_quantize(x, scale, None, "int16", "float", axis=0)
    assert np.count_nonzero(expected != via_f32) > 100
    for opset, kwargs in ((21, {}), (23, {}), (28, {"precision": 10 if fmt == "float16" else 16})):
        got = qemu_q.quantize_linear(x, scale, output_dtype="int16", opset=opset, axis=0, **kwargs)
        assert_same_bits(got, expected, f"opset {opset}")
    got = qemu_q.quantize_linear(x, scale, output_dtype="int16", opset=23, axis=0, precision=1)
    assert_same_bits(got, via_f32, "precision=1")


def test_float32_x_float16_precision():
    # precision=10 with float32 operands: the 24-over-24-bit quotient rounded once to float16.
    rng = np.random.default_rng(13)
    x = rng.uniform(-60000, 60000, 20000).astype(np.float32)
    scale = rng.uniform(0.5, 4.0, 20000).astype(np.float32)
    expected = naive_quantize(x, scale, None, "int16", "float16", axis=0)
    got = qemu_q.quantize_linear(x, scale, output_dtype="int16", precision=10, axis=0, opset=23)
    assert_same_bits(got, expected, "precision=10")


# --- int32 x -------------------------------------------------------------------------------------------------------

def test_int32_x_quotient_rounded_to_float32():
    # 40960513 / 1024 = 40000.5 + 2**-10; float32 has a 2**-8 step in [2**15, 2**16), so the
    # quotient is 40000.5, a tie that rounds to 40000 (the float64 quotient would give 40001).
    # 40961025 / 2048 = 20000.5 + 2**-11, step 2**-9 in [2**14, 2**15): 20000 (not 20001).
    x = np.array([40960513, 40961025, -40961025, 52559873], np.int32)
    assert Fraction(40960513, 1024) == Fraction(80001, 2) + Fraction(1, 1024)
    assert round_fraction(Fraction(40960513, 1024), "float") == 40000.5
    assert round_fraction(Fraction(40961025, 2048), "float") == 20000.5
    # (x and the scale share one type at 21; from 23 a float32 scale may divide an int32 x)
    for opset, scale_type in ((21, np.int32), (23, np.int32), (23, np.float32)):
        got = qemu_q.quantize_linear(x[:1], np.array(1024, scale_type), np.array(0, np.uint16), opset=opset)
        assert_same_bits(got, np.array([40000], np.uint16), f"opset {opset} {scale_type}")
        got = qemu_q.quantize_linear(x[1:3], np.array(2048, scale_type), np.array(0, np.int16), opset=opset)
        assert_same_bits(got, np.array([20000, -20000], np.int16), f"opset {opset} {scale_type}")
    # 52559873 / 2**18 = 200.5 + 2**-18 -> float32 200.5 -> 200 (uint8), at opset 13 with a
    # float32 scale and at 19 with an int32 scale.
    assert round_fraction(Fraction(52559873, 2**18), "float") == 200.5
    got = qemu_q.quantize_linear(x[3:], np.float32(2.0**18), np.uint8(0), opset=13)
    assert_same_bits(got, np.array([200], np.uint8), "opset 13")
    got = qemu_q.quantize_linear(x[3:], np.array(2**18, np.int32), np.uint8(0), opset=19)
    assert_same_bits(got, np.array([200], np.uint8), "opset 19")


def test_int32_x_int32_scale_random():
    # Scales below 2**24: the float64 quotient rounds to float32 as the exact one does.
    rng = np.random.default_rng(14)
    n = 50000
    x = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    scale = rng.integers(1, 2**24, n).astype(np.int32)
    scale[: n // 2] = rng.integers(2**15, 2**17, n // 2)
    expected = naive_quantize(x, scale, None, "int16", "float", axis=0)
    for opset in (21, 23):
        got = qemu_q.quantize_linear(x, scale, np.zeros(n, np.int16), axis=0, opset=opset)
        assert_same_bits(got, expected, f"opset {opset}")
    scale8 = rng.integers(2**20, 2**24, n).astype(np.int32)
    got = qemu_q.quantize_linear(x, scale8, np.zeros(n, np.uint8), axis=0, opset=19)
    assert_same_bits(got, naive_quantize(x, scale8, None, "uint8", "float", axis=0), "opset 19")


def _int32_scale_double_rounding_case():
    # a / b = 0.5 + 2**-25 + d with 0 < d < 2**-54: the float32 midpoint between 0.5 and
    # 0.5 + 2**-24 plus less than half a double ulp. Solved from a * 2**25 - b * (2**24 + 1) = 1.
    a = 2**23 + 20 * (2**24 + 1)
    b = (a * 2**25 - 1) // (2**24 + 1)
    assert (a * 2**25 - 1) % (2**24 + 1) == 0 and a < 2**31 and b < 2**31
    exact = Fraction(a, b)
    assert 0 < exact - Fraction(1, 2) - Fraction(1, 2**25) < Fraction(1, 2**54)
    assert round_fraction(exact, "float") == 0.5 + 2.0**-24  # correctly rounded: above the midpoint
    return a, b


@pytest.mark.parametrize("opset", [19, 21, 23])
def test_int32_scale_quotient_correctly_rounded(opset):
    a, b = _int32_scale_double_rounding_case()
    # RNE_f32(a / b) = 0.5 + 2**-24 -> rint -> 1.
    got = qemu_q.quantize_linear(np.array([a, -a], np.int32), np.array(b, np.int32),
                                 np.array(0, np.int8), opset=opset)
    assert_same_bits(got, np.array([1, -1], np.int8), f"opset {opset}")


# --- DequantizeLinear: exact products rounded once ------------------------------------------------------------------

def _int32_tie_cases(rng, count):
    # Codes and 24-bit scale significands whose exact product is an odd multiple of 2**30
    # (a float32 midpoint in [2**54, 2**55)) plus or minus 1 or 2: the double product lands
    # on the midpoint and only the exact product says which way to round.
    cases = []
    while len(cases) < count:
        s = int(rng.integers(2**23, 2**24)) | 1
        eps = int(rng.choice([1, -1, 2, -2]))
        d0 = (eps * pow(s, -1, 2**30)) % 2**30
        for d in (d0, d0 + 2**30):
            k, rem = divmod(d * s - eps, 2**30)
            if rem == 0 and 2**24 <= k < 2**25 and k % 2 == 1 and 2**29 <= d < 2**31:
                cases.append((d, s))
    return cases


def test_dequantize_int32_near_2_31():
    rng = np.random.default_rng(15)
    codes = [2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1, 2**30 + 1, -(2**30) - 3, 2**24 + 1, 0, 1, -1]
    codes += rng.integers(-(2**31), 2**31, 300).tolist()
    scales = rng.uniform(1.0, 2.0, len(codes)) * np.exp2(rng.integers(-30, 30, len(codes)))
    scales = scales.astype(np.float32).tolist()
    for d, s in _int32_tie_cases(rng, 40):
        sign = 1 if rng.random() < 0.5 else -1
        codes.append(sign * d)
        scales.append(float(np.float32(s * 2.0**-23)))
    x = np.array(codes, np.int32)
    scale = np.array(scales, np.float32)
    for out_fmt, opset in (("float", 10), ("float", 13), ("float", 21), ("float16", 23), ("bfloat16", 23)):
        expected = np.array(
            [round_fraction(Fraction(int(c)) * Fraction(float(s)), out_fmt) for c, s in zip(x, scale)]
        )
        expected = to_format(expected, out_fmt)
        if opset == 10:
            got = np.concatenate([qemu_q.dequantize_linear(x[i:i + 1], scale[i], opset=10) for i in range(x.size)])
        elif out_fmt == "float":
            got = qemu_q.dequantize_linear(x, scale, axis=0, opset=opset)
        else:
            got = qemu_q.dequantize_linear(x, scale, axis=0, opset=opset, output_dtype=out_fmt)
        assert_same_bits(got, expected, f"{out_fmt} opset {opset}")
    # The tie cases do tell a single rounding from a double one.
    tail = slice(len(codes) - 40, None)
    double = (x[tail].astype(np.float64) * scale[tail].astype(np.float64)).astype(np.float32)
    assert np.count_nonzero(bits(double) != bits(qemu_q.dequantize_linear(x[tail], scale[tail], axis=0))) >= 10


def _double_rounding_products(rng, out_fmt, scale_bits, count):
    """(d, S) with 0 < d < 2**16 and S a `scale_bits`-bit significand whose exact product,
    rounded to float32 first, lands on a midpoint of out_fmt that the exact product is not
    on (so a float32 product then a cast would round twice)."""
    out_sig = FLOAT_FORMATS[out_fmt][0] + 1

    def rounds_twice(d, S, top):
        exact = float(d * S) * 2.0**-top  # < 2**53 bits, scaled into range: exact
        once = round_f64(np.array([exact]), out_fmt)[0]
        return once != round_f64(round_f64(np.array([exact]), "float"), out_fmt)[0]

    found = []
    while len(found) < count:
        if scale_bits <= 11:
            # d * S = (odd) * 2**m + eps with |eps| <= 3, below half a float32 ulp of a
            # 26- or 27-bit product: d = eps / S mod 2**m.
            S = int(rng.integers(2 ** (scale_bits - 1), 2**scale_bits)) | 1
            eps = int(rng.choice([1, -1, 2, -2, 3, -3]))
            top = int(rng.integers(16 + scale_bits - 1, 16 + scale_bits + 1))
            m = top - out_sig - 1
            d0 = (eps * pow(S, -1, 2**m)) % 2**m
            found += [(d, S) for d in range(d0, 2**16, 2**m) if d > 0 and rounds_twice(d, S, top)]
        else:
            # A midpoint of out_fmt in [2**39, 2**40), S = round(midpoint / d): the product
            # misses it by at most d / 2 < 2**15, half a float32 ulp there.
            mid = (2 * int(rng.integers(2 ** (out_sig - 1), 2**out_sig)) + 1) << (40 - out_sig - 1)
            d = int(rng.integers(mid // 2**24 + 1, 2**16))
            S = round(Fraction(mid, d))
            if 2 ** (scale_bits - 1) <= S < 2**scale_bits and d * S != mid and rounds_twice(d, S, 40):
                found.append((d, S))
    return found[:count]


@pytest.mark.parametrize("out_fmt", ["float16", "bfloat16"])
def test_dequantize_int16_half_outputs_rounded_once(out_fmt):
    # int16 codes with a float16 / bfloat16 scale (the output type at 19 and 21).
    rng = np.random.default_rng(16)
    n = 30000
    d = rng.integers(-65535, 65536, n)
    S = rng.integers(2 ** FLOAT_FORMATS[out_fmt][0], 2 ** (FLOAT_FORMATS[out_fmt][0] + 1), n)
    if out_fmt == "float16":
        # 17 x 11 bits can exceed float32: products that a float32 product would round twice.
        # (17 x 8 bits never do, so bfloat16 has no such cases.)
        for i, (dd, ss) in enumerate(_double_rounding_products(rng, out_fmt, 11, 40)):
            d[i], S[i] = dd if i % 2 else -dd, ss
    x = np.where(d >= 0, d - 32768, d + 32767).astype(np.int16)
    zp = np.where(d >= 0, -32768, 32767).astype(np.int16)
    zp[40::2] = rng.integers(-32768, 32768, zp[40::2].size)
    scale = (S * np.exp2(rng.integers(-24, -13, n).astype(np.float64))).astype(FLOAT_DTYPES[out_fmt])
    exact = (x.astype(np.int64) - zp).astype(np.float64) * scale.astype(np.float64)  # exact in float64
    expected = to_format(round_f64(exact, out_fmt), out_fmt)
    if out_fmt == "float16":
        twice = round_f64(round_f64(exact, "float"), out_fmt)
        assert np.count_nonzero(twice != expected.astype(np.float64)) >= 40
    for opset in (21, 23, 28):
        got = qemu_q.dequantize_linear(x, scale, zp, axis=0, opset=opset)
        assert_same_bits(got, expected, f"opset {opset}")


@pytest.mark.parametrize("out_fmt", ["float16", "bfloat16"])
def test_dequantize_float32_scale_narrow_output_rounded_once(out_fmt):
    # From version 23 output_dtype may be narrower than a float32 scale: 17 x 24 bits, still
    # exact in float64, rounded once.
    rng = np.random.default_rng(26)
    n = 30000
    d = rng.integers(-65535, 65536, n)
    S = rng.integers(2**23, 2**24, n)
    for i, (dd, ss) in enumerate(_double_rounding_products(rng, out_fmt, 24, 40)):
        d[i], S[i] = dd if i % 2 else -dd, ss
    x = np.where(d >= 0, d - 32768, d + 32767).astype(np.int16)
    zp = np.where(d >= 0, -32768, 32767).astype(np.int16)
    scale = (S * np.exp2(rng.integers(-50, -26, n).astype(np.float64))).astype(np.float32)
    exact = (x.astype(np.int64) - zp).astype(np.float64) * scale.astype(np.float64)
    assert np.array_equal(exact, d * scale.astype(np.float64))
    expected = to_format(round_f64(exact, out_fmt), out_fmt)
    twice = round_f64(round_f64(exact, "float"), out_fmt)
    assert np.count_nonzero(twice != expected.astype(np.float64)) >= 40
    for opset in (23, 28):
        got = qemu_q.dequantize_linear(x, scale, zp, axis=0, output_dtype=out_fmt, opset=opset)
        assert_same_bits(got, expected, f"opset {opset}")


def test_round_helpers_agree():
    # The two reference roundings agree with each other, including subnormals, ties and overflow.
    rng = np.random.default_rng(17)
    v = np.concatenate([
        rng.normal(0, 1, 300) * np.exp2(rng.integers(-150, 130, 300)),
        [65519.99, 65520.0, 2.0**-25, 3 * 2.0**-26, 2.0**-24 * 1.5, 1 + 2.0**-8 + 2.0**-30, -0.0],
    ])
    for fmt in FLOAT_FORMATS:
        a = round_f64(v, fmt)
        b = np.array([round_fraction(Fraction(float(t)), fmt) for t in v])
        assert np.array_equal(a, b), fmt
    # the case ml_dtypes gets wrong by rounding through float32
    assert round_f64(np.array([1 + 2.0**-8 + 2.0**-30]), "bfloat16")[0] == 1 + 2.0**-7


# --- read-only, untouched and non-contiguous inputs, out= ------------------------------------------------------------

def _q_case(rng):
    x = rng.normal(0, 30, (6, 10, 8)).astype(np.float32)
    scale = rng.uniform(0.1, 1, (6, 4, 8)).astype(np.float32)
    zp = rng.integers(-128, 128, (6, 4, 8)).astype(np.int8)
    return x, scale, zp, {"axis": 1, "block_size": 3}


def _dq_case(rng):
    x = rng.integers(-8, 8, (6, 10, 8)).astype(ml_dtypes.int4)
    scale = rng.uniform(0.1, 1, 10).astype(np.float16)
    zp = rng.integers(-8, 8, 10).astype(ml_dtypes.int4)
    return x, scale, zp, {"axis": 1}


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_read_only_inputs_and_inputs_unchanged(op):
    rng = np.random.default_rng(18)
    x, scale, zp, kwargs = (_q_case if op == "quantize" else _dq_case)(rng)
    fn = qemu_q.quantize_linear if op == "quantize" else qemu_q.dequantize_linear
    before = [a.tobytes() for a in (x, scale, zp)]
    expected = fn(x, scale, zp, **kwargs)
    assert [a.tobytes() for a in (x, scale, zp)] == before
    for a in (x, scale, zp):
        a.setflags(write=False)
    for n in (1, 3):
        got = fn(x, scale, zp, n_threads=n, **kwargs)
        assert_same_bits(got, expected, "read-only")
    assert [a.tobytes() for a in (x, scale, zp)] == before


def test_inputs_unchanged_large_threaded():
    rng = np.random.default_rng(19)
    x = rng.normal(0, 30, 100003).astype(ml_dtypes.bfloat16)
    scale = np.array(0.25, ml_dtypes.bfloat16)
    zp = np.array(-3, np.int16)
    before = [a.tobytes() for a in (x, scale, zp)]
    y = qemu_q.quantize_linear(x, scale, zp, n_threads=4)
    d = qemu_q.dequantize_linear(y, scale, zp, n_threads=4)
    assert [a.tobytes() for a in (x, scale, zp)] == before
    y_before = y.tobytes()
    qemu_q.dequantize_linear(y, scale, zp, n_threads=4, out=np.empty_like(d))
    assert y.tobytes() == y_before


def test_dynamic_quantize_leaves_input_unchanged():
    x = np.random.default_rng(20).normal(0, 3, 70001).astype(np.float32)
    x.setflags(write=False)
    before = x.tobytes()
    qemu_q.dynamic_quantize_linear(x)
    assert x.tobytes() == before


def _views(a):
    """Non-contiguous views of a 3-D array with their contiguous copies."""
    yield "step", a[::2, :, ::3]
    yield "transpose", a.transpose(2, 0, 1)
    yield "fortran", np.asfortranarray(a)
    yield "negative-step", a[::-1, 1:, ::-2]


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_non_contiguous_inputs(op):
    rng = np.random.default_rng(21)
    if op == "quantize":
        base = rng.normal(0, 30, (8, 9, 10)).astype(np.float16)
    else:
        base = rng.integers(0, 65536, (8, 9, 10)).astype(np.uint16)
    for name, view in _views(base):
        assert not view.flags.c_contiguous or name == "fortran"
        contiguous = np.ascontiguousarray(view)
        axis = 1
        n = view.shape[axis]
        scale_base = rng.uniform(0.1, 2, 2 * n).astype(np.float16)
        scale = scale_base[::2]  # a strided per-axis scale
        if op == "quantize":
            zp_base = rng.integers(-100, 100, 3 * n).astype(np.int8)
            zp = zp_base[::3]
            got = qemu_q.quantize_linear(view, scale, zp, axis=axis)
            expected = qemu_q.quantize_linear(contiguous, scale.copy(), zp.copy(), axis=axis)
            assert_same_bits(expected, naive_quantize(contiguous, scale, zp, "int8", "float16", axis), name)
        else:
            zp = rng.integers(0, 65536, 2 * n).astype(np.uint16)[::2]
            got = qemu_q.dequantize_linear(view, scale, zp, axis=axis)
            expected = qemu_q.dequantize_linear(contiguous, scale.copy(), zp.copy(), axis=axis)
            assert_same_bits(expected, naive_dequantize(contiguous, scale, zp, "float16", axis), name)
        assert_same_bits(got, expected, name)


def test_non_contiguous_blocked_scale():
    rng = np.random.default_rng(22)
    x = rng.normal(0, 10, (4, 7)).astype(np.float32)
    scale_full = rng.uniform(0.1, 1, (4, 6)).astype(np.float32)
    scale = scale_full[:, ::2]  # (4, 3): blocks of 3 along axis 1, the last one partial
    zp = np.asfortranarray(rng.integers(-8, 8, (4, 3)).astype(ml_dtypes.int4))
    got = qemu_q.quantize_linear(x.T.copy().T, scale, zp, axis=1, block_size=3)
    expected = naive_quantize(x, scale, zp, "int4", "float", 1, 3)
    assert_same_bits(got, expected, "blocked")


@pytest.mark.parametrize("n_threads", [1, 4])
def test_out_is_honoured(n_threads):
    rng = np.random.default_rng(23)
    x = rng.normal(0, 30, (3, 40001)).astype(np.float32)
    scale = rng.uniform(0.1, 1, 3).astype(np.float32)
    out = np.full(x.shape, 0x55, np.uint16)
    y = qemu_q.quantize_linear(x, scale, np.zeros(3, np.uint16), axis=0, out=out, n_threads=n_threads)
    assert y is out
    assert_same_bits(out, naive_quantize(x, scale, np.zeros(3, np.uint16), "uint16", "float", 0), "quantize out")
    out4 = np.empty(x.shape, ml_dtypes.int4)
    y = qemu_q.quantize_linear(x, scale, np.zeros(3, ml_dtypes.int4), axis=0, out=out4, n_threads=n_threads)
    assert y is out4
    codes = naive_quantize(x, scale, np.zeros(3, ml_dtypes.int4), "int4", "float", 0)
    assert_same_bits(out4, codes, "int4 out")
    dq_out = np.empty(x.shape, ml_dtypes.bfloat16)
    scale_bf = scale.astype(ml_dtypes.bfloat16)
    z = np.zeros(3, ml_dtypes.int4)
    y = qemu_q.dequantize_linear(codes, scale_bf, z, axis=0, out=dq_out, n_threads=n_threads)
    assert y is dq_out
    assert_same_bits(dq_out, naive_dequantize(codes, scale_bf, z, "bfloat16", 0), "dequantize out")


# --- DynamicQuantizeLinear ---------------------------------------------------------------------------------------------

def naive_dynamic(x):
    """The DynamicQuantizeLinear-11 formula in float32 numpy, with docs/semantics.md's rules
    for the cases it leaves open (zero range, NaN elements, infinite range)."""
    f = np.float32
    with np.errstate(all="ignore"):
        valid = x[~np.isnan(x)]
        lo = min(f(0), valid.min()) if valid.size else f(0)
        hi = max(f(0), valid.max()) if valid.size else f(0)
        # Only a zero range has no scale; a range whose scale underflows keeps scale 0.
        scale = f(1) if f(hi - lo) == 0 else f(f(hi - lo) / f(255))
        inter = f(f(0) - f(lo / scale))
        if np.isnan(inter):  # the limits: lo -> -inf gives 255, lo = 0 with scale -> 0 gives 0
            zp = 255 if np.isinf(lo) else 0
        else:
            zp = int(np.rint(np.clip(inter, 0, 255)))
        q = (x / scale).astype(np.float32)
        y = np.clip(np.rint(q) + zp, 0, 255)
        y = np.where(np.isnan(q), 0, y)
    return y.astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)


def _check_dynamic(x, expect_scale=None, expect_zp=None):
    y, scale, zp = qemu_q.dynamic_quantize_linear(x)
    ey, escale, ezp = naive_dynamic(x)
    assert y.dtype == np.uint8 and scale.dtype == np.float32 and zp.dtype == np.uint8
    assert scale.shape == () and zp.shape == ()
    assert_same_bits(scale, escale, "scale")
    assert_same_bits(zp, ezp, "zero point")
    assert_same_bits(y, ey, "y")
    if expect_scale is not None:
        assert bits(scale).item() == np.array(expect_scale, np.float32).view(np.uint32).item()
    if expect_zp is not None:
        assert int(zp) == expect_zp
    return y


def test_dynamic_all_zeros():
    y = _check_dynamic(np.zeros((3, 4), np.float32), 1.0, 0)
    assert not y.any()


def test_dynamic_empty():
    y = _check_dynamic(np.zeros((0, 5), np.float32), 1.0, 0)
    assert y.shape == (0, 5)


def test_dynamic_nan_ignored_in_range():
    x = np.array([np.nan, -2.0, 3.0, np.nan, 0.5], np.float32)
    # range [-2, 3]: scale 5/255, zp = rint(2 / (5/255)) = rint(102.0...) = 102
    y = _check_dynamic(x, np.float32(5) / np.float32(255), 102)
    assert y[0] == 0 and y[3] == 0


def test_dynamic_all_nan():
    y = _check_dynamic(np.full(4, np.nan, np.float32), 1.0, 0)
    assert not y.any()


def test_dynamic_positive_infinity():
    # Infinite range: scale inf, zero point 0; finite values quantize to 0, inf/inf is NaN -> 0.
    y = _check_dynamic(np.array([1.0, np.inf, -3.0], np.float32), np.inf, 0)
    assert not y.any()


def test_dynamic_negative_infinity():
    # min x = -inf: scale inf, zero point 255 (the limit); finite values -> 255, -inf/inf NaN -> 0.
    y = _check_dynamic(np.array([-np.inf, 1.0, -3.0], np.float32), np.inf, 255)
    assert y.tolist() == [0, 255, 255]


@pytest.mark.parametrize("values, zero_point", [
    ([1e-44], 0),            # lo = 0: 0 - 0/0 -> the zero point of every positive scale
    ([-1e-44], 255),         # lo < 0: 0 - lo/0 = +inf, saturated
    ([-1e-44, 1e-44], 255),
])
def test_dynamic_underflowing_scale(values, zero_point):
    # (hi - lo) / 255 rounds to 0 in float32: the formula goes on with a zero scale.
    _check_dynamic(np.array(values, np.float32), 0.0, zero_point)


def test_dynamic_negative_only():
    # hi = 0: zp = 255
    _check_dynamic(np.array([-1.0, -0.5, -2.5], np.float32), None, 255)


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_typical(seed):
    rng = np.random.default_rng(100 + seed)
    size = [7, 1000, 65535, 65537, 131073, 300001][seed]
    x = (rng.normal(seed - 2, 3, size) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
    _check_dynamic(x)


def test_dynamic_ties():
    # y_scale = 255/255 = 1: the data's .5 values are exact ties of x / y_scale.
    x = np.array([0.0, 255.0, 0.5, 1.5, 2.5, 254.5, 127.5], np.float32)
    y = _check_dynamic(x, 1.0, 0)
    assert y.tolist() == [0, 255, 0, 2, 2, 254, 128]


# --- pack / unpack -------------------------------------------------------------------------------------------------------

PACKED = {  # name: (dtype, bits, ONNX TensorProto data type)
    "int4": (np.dtype(ml_dtypes.int4), 4, 22),
    "uint4": (np.dtype(ml_dtypes.uint4), 4, 21),
    "int2": (np.dtype(ml_dtypes.int2), 2, 26),
    "uint2": (np.dtype(ml_dtypes.uint2), 2, 25),
    "float4e2m1": (np.dtype(ml_dtypes.float4_e2m1fn), 4, 23),
    "float6e2m3": (np.dtype(ml_dtypes.float6_e2m3fn), 6, 27),
    "float6e3m2": (np.dtype(ml_dtypes.float6_e3m2fn), 6, 28),
}


def stream_bytes(codes, width):
    """The LSB-first bit stream of `codes` (each `width` bits): code i at bit width*i."""
    value = 0
    for i, c in enumerate(codes):
        value |= (int(c) & ((1 << width) - 1)) << (width * i)
    return value.to_bytes(-(-width * len(codes) // 8), "little")


def test_pack_examples_from_notes():
    assert qemu_q.pack(np.array([1, -2, 7, -8, 3], ml_dtypes.int4)).tobytes() == bytes.fromhex("e18703")
    assert qemu_q.pack(np.array([1, -2, 0, 1, -1], ml_dtypes.int2)).tobytes() == bytes.fromhex("4903")


@pytest.mark.parametrize("name", ["float6e2m3", "float6e3m2"])
def test_float6_all_codes_four_in_three(name):
    dtype = PACKED[name][0]
    codes = np.arange(64, dtype=np.uint8)
    packed = qemu_q.pack(codes.view(dtype)).tobytes()
    assert len(packed) == 48
    expected = bytearray()
    for g in range(16):
        x0, x1, x2, x3 = (int(c) for c in codes[4 * g: 4 * g + 4])
        expected += bytes([x0 | (x1 & 3) << 6, x1 >> 2 | (x2 & 0xF) << 4, x2 >> 4 | x3 << 2])
    assert packed == bytes(expected)
    assert packed == stream_bytes(codes, 6)
    back = qemu_q.unpack(packed, name, (64,))
    assert back.dtype == dtype
    assert_same_bits(back, codes.view(dtype), "unpack")


@pytest.mark.parametrize("count, nbytes", [(1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (7, 6), (8, 6)])
def test_float6_odd_counts(count, nbytes):
    codes = np.array([0x3F, 0x15, 0x2A, 0x01, 0x20, 0x33, 0x0C, 0x3E][:count], np.uint8)
    packed = qemu_q.pack(codes.view(ml_dtypes.float6_e2m3fn)).tobytes()
    assert len(packed) == nbytes == -(-6 * count // 8)
    assert packed == stream_bytes(codes, 6)
    assert_same_bits(qemu_q.unpack(packed, "float6e2m3", count), codes.view(ml_dtypes.float6_e2m3fn), "unpack")


@pytest.mark.parametrize("name", list(PACKED))
def test_pack_round_trips_and_onnx(name):
    helper, numpy_helper = onnx_helpers()
    dtype, width, onnx_type = PACKED[name]
    rng = np.random.default_rng(_seed("pack", name))
    for n in range(18):
        codes = rng.integers(0, 1 << width, n).astype(np.uint8)
        array = codes.view(dtype)
        packed = qemu_q.pack(array)
        assert packed.dtype == np.uint8 and packed.shape == (-(-width * n // 8),)
        assert packed.tobytes() == stream_bytes(codes, width), n
        raw = numpy_helper.from_array(array).raw_data
        assert packed.tobytes() == raw, n
        if width != 6:
            # make_tensor(raw=False) packs these types into int32_data, one byte per entry
            values = array.astype(np.float32).tolist() if name.startswith("float") else array.astype(np.int64).tolist()
            tensor = helper.make_tensor("t", onnx_type, [n], values, raw=False)
            assert list(tensor.int32_data) == packed.tolist(), n
        back = qemu_q.unpack(packed, name, (n,))
        assert back.dtype == dtype and back.shape == (n,)
        assert_same_bits(back, array, f"round trip {n}")
        back2 = qemu_q.unpack(packed.tobytes(), dtype, n)
        assert_same_bits(back2, array, f"bytes round trip {n}")
        # onnx reads our bytes back to the same codes
        tensor = helper.make_tensor("t", onnx_type, [n], packed.tobytes(), raw=True)
        assert_same_bits(numpy_helper.to_array(tensor), array, f"onnx reads {n}")


def test_pack_multidimensional_and_unpack_shape():
    a = np.arange(15).reshape(3, 5).astype(np.uint8) % 16
    arr = a.view(ml_dtypes.uint4)
    packed = qemu_q.pack(arr)
    assert packed.tobytes() == stream_bytes(a.ravel(), 4)
    assert_same_bits(qemu_q.unpack(packed, "uint4", (3, 5)), arr, "2-D")
    nc = arr.T  # non-contiguous: packed in C order of the view
    assert qemu_q.pack(nc).tobytes() == stream_bytes(a.T.ravel(), 4)


@pytest.mark.parametrize("name", ["int8", "uint16", "int32", "float16", "bfloat16", "float", "float8e4m3fn"])
def test_pack_unpacked_types_are_little_endian_bytes(name):
    dtype = {"int8": np.int8, "uint16": np.uint16, "int32": np.int32, "float16": np.float16,
             "bfloat16": ml_dtypes.bfloat16, "float": np.float32, "float8e4m3fn": ml_dtypes.float8_e4m3fn}[name]
    _, numpy_helper = onnx_helpers()
    rng = np.random.default_rng(24)
    raw = rng.integers(0, 256, 7 * np.dtype(dtype).itemsize).astype(np.uint8).tobytes()
    array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    assert qemu_q.pack(array).tobytes() == raw
    assert qemu_q.pack(array).tobytes() == numpy_helper.from_array(array).raw_data
    assert_same_bits(qemu_q.unpack(raw, name, (7,)), array, name)


@pytest.mark.parametrize("name", list(PACKED))
def test_pack_threaded_equals_serial(name):
    dtype, width, _ = PACKED[name]
    rng = np.random.default_rng(_seed("packmt", name))
    n = 4 * 3 * 16384 * 4 + 7  # several 49152-byte tasks, and a partial last group
    codes = rng.integers(0, 1 << width, n).astype(np.uint8)
    array = codes.view(dtype)
    serial = qemu_q.pack(array, n_threads=1)
    # an independent vectorized packing of whole groups
    per = {4: 2, 2: 4, 6: 4}[width]
    padded = np.zeros(-(-n // per) * per, np.uint32)
    padded[:n] = codes
    groups = padded.reshape(-1, per)
    word = sum(groups[:, i] << (width * i) for i in range(per))
    nbytes = width * per // 8
    expected = np.stack([(word >> (8 * b)) & 0xFF for b in range(nbytes)], axis=1).astype(np.uint8).ravel()
    expected = expected[: -(-width * n // 8)]
    assert_same_bits(serial, expected, "serial")
    for t in (2, 3, 8):
        assert_same_bits(qemu_q.pack(array, n_threads=t), serial, f"pack n_threads={t}")
        assert_same_bits(qemu_q.unpack(serial, name, (n,), n_threads=t), array, f"unpack n_threads={t}")
