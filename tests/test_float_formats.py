"""Exhaustive, bit-exact tests of the small float formats against an independent oracle.

The oracle (tests/float_oracle.py) is written from the format definitions with Fractions;
nothing here uses ml_dtypes' conversions or onnx.reference to compute an expected value.
Every comparison is on bit patterns (``.view`` as unsigned integers), never approximate.
"""

import math

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo  # noqa: E402

import qemu_q  # noqa: E402

FORMATS = fo.QUANT_FORMATS
FORMAT_IDS = [f.name for f in FORMATS]
FNUZ = [f for f in FORMATS if f.kind == "fnuz"]
NO_NAN = [f for f in FORMATS if f.kind == "none"]
WITH_NEG_ZERO = [f for f in FORMATS if f.has_negative_zero]
LATEST = 28

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def dtype_of(fmt):
    return np.dtype(getattr(ml_dtypes, fmt.name))


def codes_array(fmt, codes):
    return np.asarray(codes, dtype=np.uint8).view(dtype_of(fmt))


def scalar(value, dtype):
    return np.array(value, dtype=np.float64).astype(dtype)


def opsets(fmt):
    return sorted({fo.MIN_OPSET[fmt.name], LATEST})


def quantize(x, scale, fmt, saturate, opset=LATEST, **kwargs):
    if opset >= 21:
        kwargs["output_dtype"] = fo.ONNX_NAME[fmt.name]
    else:
        # No output_dtype before version 21: a zero point of the format sets the type. It is
        # added to the quotient (IEEE), so -0 (where the format has it) is the one that
        # changes no bit; +0 would turn an exact -0 quotient into +0.
        zero = fmt.sign_mask if fmt.has_negative_zero else 0
        kwargs["y_zero_point"] = codes_array(fmt, zero).reshape(())
    y = qemu_q.quantize_linear(x, scale, saturate=saturate, opset=opset, **kwargs)
    assert y.dtype == dtype_of(fmt)
    assert y.shape == np.shape(x)
    return y.view(np.uint8)


def input_bits(x):
    x = np.asarray(x)
    return x.view(UINT[x.dtype.itemsize])


def assert_codes(got, expected, x, what=""):
    """Codes must match bit for bit; on failure list input bits, value, expected, got."""
    got = np.asarray(got).ravel()
    expected = np.asarray(expected, dtype=np.uint8).ravel()
    bad = np.flatnonzero(got != expected)
    if bad.size:
        xr = np.asarray(x).ravel()
        bits = input_bits(xr)
        width = 2 * xr.dtype.itemsize
        with np.errstate(invalid="ignore"):
            values = xr.astype(np.float64)
        lines = [
            f"x=0x{int(bits[i]):0{width}x} ({values[i]!r}): expected 0x{int(expected[i]):02x}, "
            f"got 0x{int(got[i]):02x}"
            for i in bad[:12]
        ]
        pytest.fail(f"{what}: {bad.size} of {got.size} codes differ\n" + "\n".join(lines))


def assert_float_bits(got, expected_f64, dtype, codes=None, what=""):
    """Float output must equal the exact expected values bit for bit (signed zeros
    included); a NaN is checked as NaN with the expected sign bit."""
    dtype = np.dtype(dtype)
    got = np.asarray(got)
    assert got.dtype == dtype, f"{what}: output dtype {got.dtype}, expected {dtype}"
    expected_f64 = np.asarray(expected_f64, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = expected_f64.astype(dtype)
        got32 = got.astype(np.float32)
    uint = UINT[dtype.itemsize]
    nan = np.isnan(expected_f64)
    gb, eb = got.view(uint).ravel(), expected.view(uint).ravel()
    bad = np.flatnonzero((gb != eb) & ~nan.ravel())
    bad_nan = np.flatnonzero(
        nan.ravel()
        & ~(np.isnan(got32.ravel()) & (np.signbit(got32.ravel()) == np.signbit(expected_f64.ravel())))
    )
    bad = np.union1d(bad, bad_nan)
    if bad.size:
        width = 2 * dtype.itemsize
        lines = []
        for i in bad[:12]:
            src = f"code 0x{int(np.ravel(codes)[i]):02x} " if codes is not None else ""
            lines.append(
                f"{src}expected 0x{int(eb[i]):0{width}x} ({expected_f64.ravel()[i]!r}), "
                f"got 0x{int(gb[i]):0{width}x} ({got32.ravel()[i]!r})"
            )
        pytest.fail(f"{what}: {bad.size} of {gb.size} values differ\n" + "\n".join(lines))


def decoded(fmt, codes):
    return np.array([fo.decode_float(fmt, int(c)) for c in codes], dtype=np.float64)


def all_codes(fmt):
    return np.arange(fmt.n_codes, dtype=np.uint8)


def as_float32(values):
    """float64 -> float32 for values known to be exact in float32."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = values.astype(np.float32)
        back = out.astype(np.float64)
    assert np.array_equal(back, values, equal_nan=True)
    return out


# ----------------------------------------------------------------- decode / re-encode


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_oracle_table_matches_scalar_definition(fmt):
    # The vectorized oracle used below against the scalar Fraction one, on every value,
    # every midpoint and both float32 neighbours of each.
    points = [float(v) for v in fo.positive_values(fmt)[0]] + [float(m) for m in fo.midpoints(fmt)]
    xs = []
    for p in points:
        p32 = np.float32(p)
        xs += [p, float(np.nextafter(p32, np.float32(np.inf))), float(np.nextafter(p32, np.float32(-np.inf)))]
    xs += [-v for v in xs] + [math.inf, -math.inf, math.nan, -math.nan, 1e300, -1e-300]
    xs = np.array(xs)
    for saturate in (0, 1):
        table = fo.encode_array(fmt, xs, saturate)
        direct = [fo.encode(fmt, float(v), saturate) for v in xs]
        assert table.tolist() == direct


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("opset", [None, LATEST], ids=["min_opset", "opset28"])
def test_decode_every_code_float32(fmt, opset):
    opset = opset or fo.MIN_OPSET[fmt.name]
    codes = all_codes(fmt)
    y = qemu_q.dequantize_linear(codes_array(fmt, codes), scalar(1.0, np.float32), opset=opset)
    assert_float_bits(y, decoded(fmt, codes), np.float32, codes, f"{fmt.name} decode")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("out", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_decode_every_code_half(fmt, out):
    codes = all_codes(fmt)
    expected = decoded(fmt, codes)
    finite = np.isfinite(expected)
    # Every finite value of these formats is exact in float16 and bfloat16.
    with np.errstate(invalid="ignore"):
        assert np.array_equal(expected[finite].astype(out).astype(np.float64), expected[finite])
    x = codes_array(fmt, codes)
    y = qemu_q.dequantize_linear(x, scalar(1.0, np.float32), output_dtype=np.dtype(out), opset=LATEST)
    assert_float_bits(y, expected, out, codes, f"{fmt.name} decode to {np.dtype(out).name} (output_dtype)")
    # The scale's own type as the output type, at the format's first opset.
    y = qemu_q.dequantize_linear(x, scalar(1.0, out), opset=fo.MIN_OPSET[fmt.name])
    assert_float_bits(y, expected, out, codes, f"{fmt.name} decode with {np.dtype(out).name} scale")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("saturate", [0, 1])
def test_reencode_every_code(fmt, saturate):
    codes = all_codes(fmt)
    values = decoded(fmt, codes)
    x = as_float32(values)
    got = quantize(x, scalar(1.0, np.float32), fmt, saturate)
    expected = fo.encode_array(fmt, x, saturate)
    finite = np.isfinite(values)
    # Every finite code comes back as itself (-0 included where the format has it) ...
    assert np.array_equal(expected[finite], codes[finite])
    # ... and NaN / inf codes as the rules say.
    for c in codes[~finite]:
        v = fo.decode(fmt, int(c))
        if v == "nan":
            assert expected[c] == fo.nan_code(fmt, negative=bool(c & fmt.sign_mask))
        else:
            assert expected[c] == (c - 1 if saturate else c)  # e5m2 inf: max or inf
    # "-NaN -> -NaN": a NaN keeps its sign (docs/semantics.md).
    if fmt.name == "float8_e4m3fn":
        assert expected[0xFF] == 0xFF and expected[0x7F] == 0x7F
    if fmt.name == "float8_e5m2":
        assert (expected[[0x7D, 0x7E, 0x7F]] == 0x7E).all()
        assert (expected[[0xFD, 0xFE, 0xFF]] == 0xFE).all()
    assert_codes(got, expected, x, f"{fmt.name} re-encode saturate={saturate}")


# ------------------------------------------------------ all float16 / bfloat16 inputs


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_all_half_inputs(fmt, saturate, src):
    x = np.arange(1 << 16, dtype=np.uint16).view(src)
    for opset in opsets(fmt):
        # FNUZ +-inf with saturate=1: NaN at opset 19 (Cast-19), +-max at 28.
        expected = fo.encode_array(fmt, x, saturate, opset=opset)
        got = quantize(x, scalar(1.0, src), fmt, saturate, opset=opset)
        assert_codes(got, expected, x, f"{fmt.name} from {np.dtype(src).name} saturate={saturate} opset={opset}")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_thread_count_does_not_change_bits(fmt):
    x = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    x = np.concatenate([x] * 4)
    expected = fo.encode_array(fmt, x, 1)
    for n_threads in (1, 2, 3, None):
        got = quantize(x, scalar(1.0, ml_dtypes.bfloat16), fmt, 1, n_threads=n_threads)
        assert_codes(got, expected, x, f"{fmt.name} n_threads={n_threads}")


# ------------------------------------------------------------ ties and their neighbours


def tie_points(fmt):
    """Every midpoint (incl. the one above max), every value, both float32 neighbours of
    each, the value one ulp above the top midpoint, the first value beyond max, huge
    values, infinities and NaNs, with both signs."""
    mids = [float(m) for m in fo.midpoints(fmt)]
    values = [float(v) for v in fo.positive_values(fmt)[0]]  # includes the one above max
    pts = []
    for p in mids + values:
        p32 = np.float32(p)
        pts += [p32, np.nextafter(p32, np.float32(np.inf)), np.nextafter(p32, np.float32(0))]
    pts += [np.float32(3.0e38), np.float32(np.finfo(np.float32).max), np.float32(np.inf)]
    pts = np.array(pts, dtype=np.float32)
    pts = np.concatenate([pts, -pts, np.array([np.nan, -np.nan], dtype=np.float32)])
    return pts


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("saturate", [0, 1])
def test_midpoints_and_neighbours(fmt, saturate):
    x = tie_points(fmt)
    expected = fo.encode_array(fmt, x, saturate)
    got = quantize(x, scalar(1.0, np.float32), fmt, saturate)
    assert_codes(got, expected, x, f"{fmt.name} ties saturate={saturate}")


@pytest.mark.parametrize("saturate", [0, 1])
def test_e4m3fn_overflow_boundary(saturate):
    fmt = fo.FORMATS["float8_e4m3fn"]
    above = np.nextafter(np.float32(464), np.float32(np.inf))
    x = np.array([448, 464, above, 480, -464, -above], dtype=np.float32)
    over = 0x7E if saturate else 0x7F
    over_neg = 0xFE if saturate else 0xFF  # -NaN: the sign of x (the official Cast vectors)
    expected = [0x7E, 0x7E, over, over, 0xFE, over_neg]
    assert fo.encode_array(fmt, x, saturate).tolist() == expected
    assert_codes(quantize(x, scalar(1.0, np.float32), fmt, saturate), expected, x, "e4m3fn 464")


@pytest.mark.parametrize("saturate", [0, 1])
def test_e5m2_overflow_boundary(saturate):
    fmt = fo.FORMATS["float8_e5m2"]
    below = np.nextafter(np.float32(61440), np.float32(0))
    x = np.array([57344, below, 61440, 65536, np.inf, -61440, -np.inf], dtype=np.float32)
    if saturate:
        expected = [0x7B, 0x7B, 0x7B, 0x7B, 0x7B, 0xFB, 0xFB]
    else:
        expected = [0x7B, 0x7B, 0x7C, 0x7C, 0x7C, 0xFC, 0xFC]
    assert fo.encode_array(fmt, x, saturate).tolist() == expected
    assert_codes(quantize(x, scalar(1.0, np.float32), fmt, saturate), expected, x, "e5m2 61440")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("saturate", [0, 1])
def test_no_double_rounding(fmt, saturate):
    # m + m*2^-14 is exact in float32 and rounds back to the midpoint m in float16 and in
    # bfloat16; converting through either would turn it into a tie. Direct rounding must
    # go away from the tie.
    mids = np.array([float(m) for m in fo.midpoints(fmt)], dtype=np.float64)
    mids = np.concatenate([mids, -mids])
    offset = np.abs(mids) * 2.0**-14
    x64 = np.concatenate([mids + offset, mids - offset])
    x = as_float32(x64)
    for half in (np.float16, ml_dtypes.bfloat16):
        assert np.array_equal(x.astype(half).astype(np.float64), np.concatenate([mids, mids]))
    expected = fo.encode_array(fmt, x, saturate)
    via_tie = fo.encode_array(fmt, np.concatenate([mids, mids]), saturate)
    assert (expected != via_tie).sum() >= len(mids) // 2  # the test has teeth
    got = quantize(x, scalar(1.0, np.float32), fmt, saturate)
    assert_codes(got, expected, x, f"{fmt.name} double rounding saturate={saturate}")


# --------------------------------------------------------------- scales and granularity


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("scale", [0.5, 3.0, 0.1])
def test_non_unit_scale_quantize(fmt, saturate, scale):
    s = np.float32(scale)
    with np.errstate(invalid="ignore", over="ignore"):
        x = (tie_points(fmt).astype(np.float64) * np.float64(s)).astype(np.float32)
        q = x / s  # IEEE float32 division: the correctly rounded quotient at precision float32
    expected = fo.encode_array(fmt, q, saturate)
    got = quantize(x, scalar(scale, np.float32), fmt, saturate)
    assert_codes(got, expected, x, f"{fmt.name} scale={scale} saturate={saturate}")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("scale", [0.5, 3.0, 0.1])
def test_non_unit_scale_dequantize(fmt, scale):
    codes = all_codes(fmt)
    s = np.float32(scale)
    values = decoded(fmt, codes)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = (values.astype(np.float32) * s).astype(np.float64)  # one float32 product
    y = qemu_q.dequantize_linear(codes_array(fmt, codes), scalar(scale, np.float32), opset=LATEST)
    assert_float_bits(y, expected, np.float32, codes, f"{fmt.name} decode scale={scale}")


def granular_example(fmt):
    """A 2x4 float32 x built from the format's values; per-axis / blocked scales of powers
    of two so that every quotient is exact."""
    values = [float(v) for v in fo.positive_values(fmt)[0][:-1]]
    mids = [float(m) for m in fo.midpoints(fmt)]
    pick = [values[1], -values[len(values) // 2], mids[len(mids) // 3], -mids[-1],
            values[-1], mids[2], -values[3], mids[-2]]
    return np.array(pick, dtype=np.float64).reshape(2, 4)


GRANULARITIES = {
    # name: (axis, block_size, scale array (float32, powers of two), scale broadcast to x)
    "per_axis_0": (0, 0, np.array([0.5, 2.0]), lambda s: s[:, None]),
    "per_axis_1": (1, 0, np.array([1.0, 0.5, 2.0, 0.25]), lambda s: s[None, :]),
    "blocked_axis_1": (1, 2, np.array([[0.5, 2.0], [4.0, 0.25]]), lambda s: np.repeat(s, 2, axis=1)),
    "blocked_axis_0": (0, 1, np.array([[0.5, 2.0, 1.0, 4.0], [0.25, 1.0, 2.0, 0.5]]), lambda s: s),
}


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
@pytest.mark.parametrize("saturate", [0, 1])
def test_granularity_quantize(fmt, granularity, saturate):
    axis, block_size, scale, broadcast = GRANULARITIES[granularity]
    base = granular_example(fmt)
    full = broadcast(scale)
    x = as_float32(base * full)  # so that x / scale == base exactly
    expected = fo.encode_array(fmt, base, saturate)
    got = quantize(x, scale.astype(np.float32), fmt, saturate, axis=axis, block_size=block_size)
    assert got.shape == (2, 4)
    assert_codes(got, expected, x, f"{fmt.name} {granularity} saturate={saturate}")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_granularity_dequantize(fmt, granularity):
    axis, block_size, scale, broadcast = GRANULARITIES[granularity]
    codes = fo.encode_array(fmt, granular_example(fmt), 1)
    expected = decoded(fmt, codes.ravel()).reshape(2, 4) * broadcast(scale)
    y = qemu_q.dequantize_linear(
        codes_array(fmt, codes), scale.astype(np.float32), axis=axis, block_size=block_size, opset=LATEST
    )
    assert y.shape == (2, 4)
    assert_float_bits(y, expected, np.float32, codes, f"{fmt.name} {granularity} decode")


# ------------------------------------------------------------------ float8e8m0 scales


def e8m0(codes):
    return np.asarray(codes, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)


def test_e8m0_oracle_decode():
    assert fo.decode(fo.E8M0, 127) == 1
    assert fo.decode(fo.E8M0, 0) == fo.Fraction(1, 2**127)
    assert fo.decode(fo.E8M0, 254) == 2**127
    assert fo.decode(fo.E8M0, 255) == "nan"


@pytest.mark.parametrize("xtype", [np.int8, np.uint8])
def test_dequantize_e8m0_scale(xtype):
    info = np.iinfo(xtype)
    codes = np.arange(info.min, info.max + 1, dtype=np.int64)  # all 256 codes, down axis 0
    exps = np.arange(255)  # every non-NaN e8m0 code, along axis 1
    zp = ((exps * 37) % 256 + info.min).astype(xtype)  # a varied zero point per column
    x = np.repeat(codes[:, None], 255, axis=1).astype(xtype)
    # Exact: |x - zp| < 2^9 and 2^(e-127) are exact in float64; the float32 result is the
    # correctly rounded (here exact, or inf beyond 2^128) product.
    exact = (codes[:, None] - zp.astype(np.int64)[None, :]) * np.ldexp(1.0, exps - 127)[None, :]
    y = qemu_q.dequantize_linear(x, e8m0(exps), zp, axis=1, output_dtype=np.float32, opset=24)
    assert_float_bits(y, exact, np.float32, None, f"{np.dtype(xtype).name} with e8m0 scale")
    # Per-tensor, no zero point, latest opset.
    y = qemu_q.dequantize_linear(codes.astype(xtype), e8m0(120), output_dtype=np.float32, opset=LATEST)
    assert_float_bits(y, codes * 2.0**-7, np.float32, None, "per-tensor e8m0 scale")


def test_dequantize_e8m0_nan_scale():
    y = qemu_q.dequantize_linear(
        np.array([0, 1, -1], dtype=np.int8), e8m0(255), output_dtype=np.float32, opset=24
    )
    assert np.isnan(y).all()


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("k", [-3, 0, 5])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_e8m0_scale(fmt, k, saturate):
    base = tie_points(fmt)
    with np.errstate(over="ignore"):
        x = (base.astype(np.float64) * 2.0**k).astype(np.float32)
    expected = fo.encode_array(fmt, x.astype(np.float64) / 2.0**k, saturate)
    got = quantize(x, e8m0(127 + k), fmt, saturate, opset=max(24, fo.MIN_OPSET[fmt.name]))
    assert_codes(got, expected, x, f"{fmt.name} e8m0 scale 2^{k} saturate={saturate}")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_quantize_e8m0_scale_divides_in_float32(fmt):
    # 2^16 is not a float16 value: a float16 division would give 0 for every finite x.
    # The default division precision with an e8m0 scale is float32, where x / 2^16 is exact.
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the inputs
        expected = fo.encode_array(fmt, x.astype(np.float64) / 2.0**16, 1)
    got = quantize(x, e8m0(127 + 16), fmt, 1, opset=max(24, fo.MIN_OPSET[fmt.name]))
    assert_codes(got, expected, x, f"{fmt.name} float16 x, e8m0 scale 2^16")


# --------------------------------------------------------------- the special-value rules


@pytest.mark.parametrize("fmt", NO_NAN, ids=[f.name for f in NO_NAN])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float4_float6_nan_gives_positive_max(fmt, saturate):
    # ONNX float4 technical note: NaN -> +max (ml_dtypes gives -0 instead).
    nan_bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32)
    x = nan_bits.view(np.float32)
    expected = {"float4_e2m1fn": 0x7, "float6_e2m3fn": 0x1F, "float6_e3m2fn": 0x1F}[fmt.name]
    got = quantize(x, scalar(1.0, np.float32), fmt, saturate)
    assert_codes(got, [expected] * 4, x, f"{fmt.name} NaN")
    # No inf either: +-inf and overflow are +-max whatever saturate says.
    x = np.array([np.inf, -np.inf, 1e30, -1e30], dtype=np.float32)
    sign = fmt.sign_mask
    got = quantize(x, scalar(1.0, np.float32), fmt, saturate)
    assert_codes(got, [expected, sign | expected] * 2, x, f"{fmt.name} inf/overflow")


@pytest.mark.parametrize("fmt", FNUZ, ids=[f.name for f in FNUZ])
@pytest.mark.parametrize("saturate", [0, 1])
def test_fnuz_has_no_negative_zero(fmt, saturate):
    tiny = float(fmt.subnormal_quantum)
    # -0, far below the smallest subnormal, and exactly half of it (a tie, to even: zero).
    x = as_float32([-0.0, -2.0**-100, -tiny / 2, -tiny / 4, 0.0, -tiny])
    expected = [0x00, 0x00, 0x00, 0x00, 0x00, 0x81]
    assert fo.encode_array(fmt, x, saturate).tolist() == expected
    assert_codes(quantize(x, scalar(1.0, np.float32), fmt, saturate), expected, x, f"{fmt.name} -0")
    # 0x80 is the NaN code, 0x00 is +0.
    y = qemu_q.dequantize_linear(codes_array(fmt, [0x00, 0x80]), scalar(1.0, np.float32), opset=LATEST)
    assert y.view(np.uint32)[0] == 0 and np.isnan(y[1])


@pytest.mark.parametrize("fmt", WITH_NEG_ZERO, ids=[f.name for f in WITH_NEG_ZERO])
def test_negative_zero_kept(fmt):
    tiny = float(fmt.subnormal_quantum)
    x = as_float32([-0.0, -2.0**-100, -tiny / 2, 0.0, tiny / 2])
    expected = [fmt.sign_mask, fmt.sign_mask, fmt.sign_mask, 0, 0]
    assert_codes(quantize(x, scalar(1.0, np.float32), fmt, 1), expected, x, f"{fmt.name} signed zero")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.has_nan], ids=lambda f: f.name)
@pytest.mark.parametrize("saturate", [0, 1])
def test_nan_input_keeps_its_sign(fmt, saturate):
    # The Cast tables' "-NaN -> -NaN" (e4m3fn, e5m2; e5m2's quiet NaN 0x7E, as the official
    # Cast vectors); nan="canonical": 0x7F for every NaN.
    nan_bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32)
    x = nan_bits.view(np.float32)
    expected = {"fn": [0x7F, 0xFF] * 2, "ieee": [0x7E, 0xFE] * 2, "fnuz": [0x80] * 4}[fmt.kind]
    canonical = {"fn": [0x7F] * 4, "ieee": [0x7F] * 4, "fnuz": [0x80] * 4}[fmt.kind]
    for nan, want in [("spec", expected), ("canonical", canonical)]:
        got = quantize(x, scalar(1.0, np.float32), fmt, saturate, nan=nan)
        assert_codes(got, want, x, f"{fmt.name} NaN nan={nan}")
        for half in (np.float16, ml_dtypes.bfloat16):
            xh = np.array([0x7E00, 0xFE00, 0x7C01, 0xFFFF], dtype=np.uint16)
            if half is ml_dtypes.bfloat16:
                xh = np.array([0x7FC0, 0xFFC0, 0x7F81, 0xFFFF], dtype=np.uint16)
            xh = xh.view(half)
            got = quantize(xh, scalar(1.0, half), fmt, saturate, nan=nan)
            assert_codes(got, want, xh, f"{fmt.name} NaN nan={nan}")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.has_nan], ids=lambda f: f.name)
def test_nan_codes_decode_with_their_sign(fmt):
    codes = np.array(fmt.nan_codes, dtype=np.uint8)
    y = qemu_q.dequantize_linear(codes_array(fmt, codes), scalar(1.0, np.float32), opset=LATEST)
    assert np.isnan(y).all()
    got = {f"0x{c:02x}": "-nan" if s else "+nan" for c, s in zip(codes, np.signbit(y))}
    want = {f"0x{c:02x}": "-nan" if c & fmt.sign_mask else "+nan" for c in codes}
    assert got == want, f"{fmt.name}: NaN codes must keep their sign bit when decoded"


# ------------------------------------------------------------- output type and zero point


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_output_dtype_spellings(fmt):
    onnx = pytest.importorskip("onnx", reason="the ONNX type numbers come from onnx (test extra)")
    x = tie_points(fmt)
    expected = fo.encode_array(fmt, x, 1)
    proto = getattr(onnx.TensorProto, fo.ONNX_NAME[fmt.name].upper())
    for spelling in (fo.ONNX_NAME[fmt.name], proto, dtype_of(fmt), getattr(ml_dtypes, fmt.name)):
        y = qemu_q.quantize_linear(x, scalar(1.0, np.float32), output_dtype=spelling, opset=LATEST)
        assert y.dtype == dtype_of(fmt), spelling
        assert_codes(y.view(np.uint8), expected, x, f"{fmt.name} output_dtype={spelling!r}")


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_float_zero_point(fmt):
    x = tie_points(fmt)
    expected = fo.encode_array(fmt, x, 1)
    one = scalar(1.0, np.float32)
    zero_codes = [0x00] if not fmt.has_negative_zero else [0x00, fmt.sign_mask]
    # The zero point enters the formula with IEEE signed-zero arithmetic (docs/semantics.md):
    # QuantizeLinear adds it, so an exact -0 quotient plus a +0 zero point is +0, while a
    # tiny negative quotient stays negative and rounds to -0; DequantizeLinear subtracts it,
    # so the -0 code minus a -0 zero point is +0.
    x = np.concatenate([x, np.array([-0.0, 0.0, -1e-30, 1e-30], dtype=np.float32)])
    expected = fo.encode_array(fmt, x, 1)
    exact_negative_zero = (x == 0) & np.signbit(x)
    codes = all_codes(fmt)
    values = decoded(fmt, codes)
    for zc in zero_codes:
        zp = codes_array(fmt, zc).reshape(())
        zp_is_negative = zc == fmt.sign_mask and fmt.has_negative_zero
        want = expected.copy()
        if not zp_is_negative:
            want[exact_negative_zero] = 0x00
        y = qemu_q.quantize_linear(x, one, zp, opset=LATEST)
        assert y.dtype == dtype_of(fmt)
        assert_codes(y.view(np.uint8), want, x, f"{fmt.name} zero point 0x{zc:02x}")
        y = qemu_q.dequantize_linear(codes_array(fmt, codes), one, zp, opset=LATEST)
        want_values = values.copy()
        if zp_is_negative:
            want_values[values == 0] = 0.0  # -0 - (-0) = +0, +0 - (-0) = +0
        assert_float_bits(y, want_values, np.float32, codes, f"{fmt.name} decode zp 0x{zc:02x}")
    nonzero = codes_array(fmt, fo.encode(fmt, 1.0, 1)).reshape(())
    with pytest.raises(ValueError):
        qemu_q.quantize_linear(x, one, nonzero, opset=LATEST)
    with pytest.raises(ValueError):
        qemu_q.dequantize_linear(codes_array(fmt, all_codes(fmt)), one, nonzero, opset=LATEST)


# ------------------------------------- the Cast table in force: NaN, inf, overflow, zeros

CAST_OPSETS = [19, 21, 23, 24, 25, 28]
FLOAT8 = [f for f in FORMATS if f.name.startswith("float8")]
# NaN bit patterns of each x type: quiet and signalling, both signs, several payloads.
NAN_PATTERNS = {
    np.dtype(np.float32): [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF,
                           0xFFFFFFFF, 0x7FA00000, 0xFFA00000, 0x7FC12345, 0xFFC12345],
    np.dtype(np.float16): [0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF, 0xFFFF, 0x7D00, 0xFD00],
    np.dtype(ml_dtypes.bfloat16): [0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF, 0x7FA0,
                                   0xFFA0],
}


def special_inputs(fmt, src):
    """+-NaN (every pattern above), +-inf, +-0, +-max, the midpoint above max (a tie that
    goes to max), the values just past it and far past it, the largest finite x."""
    src = np.dtype(src)
    nans = np.array(NAN_PATTERNS[src], dtype=UINT[src.itemsize]).view(src)
    top = float(fo.midpoints(fmt)[-1])
    with np.errstate(over="ignore"):
        finite = np.array([0.0, float(fmt.max_finite), top, top * 1.01, 2 * top, 1e4,
                           float(ml_dtypes.finfo(src).max)], dtype=np.float64).astype(src)
    finite = finite[np.isfinite(finite)]
    values = np.concatenate([finite, -finite, np.array([np.inf, -np.inf], dtype=src)])
    return np.concatenate([nans, values])


@pytest.fixture(params=[True, False], ids=["fast", "general"])
def kernel_path(request, monkeypatch):
    monkeypatch.setattr(qemu_q._dispatch, "FAST_KERNELS", request.param)
    return request.param


@pytest.mark.parametrize("fmt", FLOAT8, ids=lambda f: f.name)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("opset", CAST_OPSETS)
@pytest.mark.parametrize("src", [np.float32, np.float16, ml_dtypes.bfloat16],
                         ids=["float32", "float16", "bfloat16"])
def test_cast_table_special_values(fmt, saturate, opset, src, kernel_path):
    # Tiled so that two threads get several tasks each; the codes must not depend on it.
    x = np.tile(special_inputs(fmt, src), 8192)
    for nan in fo.NAN_OPTIONS:
        expected = fo.encode_array(fmt, x, saturate, opset=opset, nan=nan)
        for n_threads in (1, 2):
            got = quantize(x, scalar(1.0, src), fmt, saturate, opset=opset, nan=nan,
                           n_threads=n_threads)
            assert_codes(got, expected, x, f"{fmt.name} saturate={saturate} opset={opset} "
                                           f"nan={nan} n_threads={n_threads}")
    if opset >= 21:  # blocked along the last axis: the float32 block loops
        xb = x[: x.size // 32 * 32].reshape(-1, 32)
        s = np.ones((xb.shape[0], 1), dtype=src)
        got = qemu_q.quantize_linear(xb, s, axis=1, block_size=32, saturate=saturate, opset=opset,
                                     output_dtype=fo.ONNX_NAME[fmt.name]).view(np.uint8)
        assert_codes(got, fo.encode_array(fmt, xb, saturate, opset=opset), xb, "blocked")


def test_cast_table_rows_pinned():
    # The rows the tables of the versions differ on, and the signed NaN rows, spelled out.
    e4, e4z, e5, e5z = (fo.FORMATS[n] for n in ("float8_e4m3fn", "float8_e4m3fnuz",
                                               "float8_e5m2", "float8_e5m2fnuz"))
    x = np.array([np.inf, -np.inf, np.nan, np.nan, -1e6, 1e6], dtype=np.float32)
    x[2:4] = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)
    want = {  # (format, saturate, opset): codes of x
        (e4, 0, 28): [0x7F, 0xFF, 0x7F, 0xFF, 0xFF, 0x7F],
        (e4, 1, 28): [0x7E, 0xFE, 0x7F, 0xFF, 0xFE, 0x7E],
        (e5, 0, 28): [0x7C, 0xFC, 0x7E, 0xFE, 0xFC, 0x7C],
        (e5, 1, 28): [0x7B, 0xFB, 0x7E, 0xFE, 0xFB, 0x7B],
        (e4z, 1, 23): [0x80, 0x80, 0x80, 0x80, 0xFF, 0x7F],
        (e4z, 1, 24): [0x7F, 0xFF, 0x80, 0x80, 0xFF, 0x7F],
        (e5z, 1, 21): [0x80, 0x80, 0x80, 0x80, 0xFF, 0x7F],
        (e5z, 1, 25): [0x7F, 0xFF, 0x80, 0x80, 0xFF, 0x7F],
        (e5z, 0, 25): [0x80, 0x80, 0x80, 0x80, 0x80, 0x80],
    }
    for (fmt, saturate, opset), codes in want.items():
        assert fo.encode_array(fmt, x, saturate, opset=opset).tolist() == codes
        got = quantize(x, scalar(1.0, np.float32), fmt, saturate, opset=opset)
        assert got.tolist() == codes, (fmt.name, saturate, opset)
    canonical = quantize(x, scalar(1.0, np.float32), e4, 0, nan="canonical")
    assert canonical.tolist() == [0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F]


def test_nan_option_is_validated_and_keyed():
    x, one = np.array([-np.nan], dtype=np.float32), scalar(1.0, np.float32)
    x[0] = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    for bad in ("Spec", "", None, 1, ["spec"]):
        with pytest.raises(ValueError, match=r"nan=.*allowed 'spec' or 'canonical'"):
            qemu_q.quantize_linear(x, one, output_dtype="float8e4m3fn", nan=bad)
    # One signature, two options: the cached plan must tell them apart.
    for nan, code in [("spec", 0xFF), ("canonical", 0x7F), ("spec", 0xFF)]:
        y = qemu_q.quantize_linear(x, one, output_dtype="float8e4m3fn", nan=nan)
        assert y.view(np.uint8).tolist() == [code]
    with pytest.raises(ValueError, match="no attribute 'nan'"):
        qemu_q.run_op("QuantizeLinear", [x, one], {"nan": "canonical"}, 28)
