"""qemu_q.Datapath on DequantizeLinear and Cast / CastLike (docs/semantics.md, "Datapath
options": "DequantizeLinear under a datapath", "Cast and CastLike under a datapath").

The oracle here is written from that text, not from the kernels: every value is exact (a
float64 that holds the exact value, because the operands have few significant bits: a code
of at most 8 bits times a scale of at most 24 bits, or a float16/bfloat16 input), rounded by
the table of modes with power-of-two scalings and integer parts only (`round_to`), and
encoded by numpy/ml_dtypes conversions of values that are exactly representable, or by
tests/float_oracle.py's definition of the small-float codes. `round_to` itself is checked
against tests/datapath_oracle.py's Fraction arithmetic on a sample.

Exhaustive: every code of each 8-bit-or-narrower DequantizeLinear input type, every
float16 and bfloat16 input of Cast into every small float and into bfloat16 / float16, for
every rounding mode; the subnormal and NaN options on the same domains.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import _kernels
from support import bits

import datapath_oracle
import float_oracle as fo

ROUNDINGS = ["half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd",
             "stochastic"]
SUBNORMALS = ["keep", "flush_inputs", "flush_outputs", "flush_both"]
TWO32 = 2.0 ** 32

# (fraction bits, smallest normal exponent, largest finite) of the IEEE-style outputs.
IEEE = {
    "float32": (23, -126, (2 - 2 ** -23) * 2.0 ** 127),
    "float16": (10, -14, 65504.0),
    "bfloat16": (7, -126, (2 - 2 ** -7) * 2.0 ** 127),
}
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
UINT = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}
CANONICAL_NAN = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
QUIET = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
SIGN = {"float32": 0x80000000, "float16": 0x8000, "bfloat16": 0x8000}

# ONNX names and ml_dtypes names of the small floats.
SMALL = {"float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
         "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz",
         "float4e2m1": "float4_e2m1fn", "float6e2m3": "float6_e2m3fn", "float6e3m2": "float6_e3m2fn"}
INTEGER_CODES = {"int8": (8, True), "uint8": (8, False), "int4": (4, True), "uint4": (4, False),
                 "int2": (2, True), "uint2": (2, False)}

LEVELS = _kernels.available_levels()
ALL_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
ALL_BF16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)


def words_for(shape, seed=11):
    return np.random.default_rng(seed).integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)


def dp(**fields) -> qemu_q.Datapath:
    return qemu_q.Datapath(**fields)


def check(got, want, what):
    g = bits(got).astype(np.uint64).ravel()
    w = np.asarray(want).astype(np.uint64).ravel()
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ; at {bad[:6].tolist()} "
                           f"got {[hex(v) for v in g[bad[:6]]]} want {[hex(v) for v in w[bad[:6]]]}")


# ------------------------------------------------------------------------ the oracle

def round_to(x: np.ndarray, mantissa_bits: int, min_exponent: int, rounding: str,
             words: np.ndarray) -> np.ndarray:
    """The rounding table of docs/semantics.md applied to exact finite nonzero values x
    (float64 holding them exactly): the magnitude rounded to `mantissa_bits` fraction bits,
    exponent at least `min_exponent`, unbounded above. Returns the rounded magnitudes."""
    a = np.abs(x)
    negative = np.signbit(x)
    _, e = np.frexp(a)  # a in [2**(e-1), 2**e)
    ulp_exponent = np.maximum(e - 1, min_exponent) - mantissa_bits
    t = np.ldexp(a, -ulp_exponent)  # a power-of-two scaling: exact
    whole = np.floor(t)
    frac = t - whole  # exact
    above, tie = frac > 0.5, frac == 0.5
    odd = np.fmod(whole, 2.0) == 1.0
    if rounding == "half_even":
        up = above | (tie & odd)
    elif rounding == "half_away":
        up = above | tie
    elif rounding == "half_up":
        up = above | (tie & ~negative)
    elif rounding == "half_down":
        up = above | (tie & negative)
    elif rounding == "toward_zero":
        up = np.zeros(a.shape, bool)
    elif rounding == "down":
        up = negative.copy()
    elif rounding == "up":
        up = ~negative
    elif rounding == "to_odd":
        up = ~odd
    else:
        # the first 32 bits of the dropped fraction plus the word; a carry rounds up
        up = np.floor(frac * TWO32) + words.astype(np.float64) >= TWO32
    up &= frac != 0.0
    return np.ldexp(whole + up, ulp_exponent)


def ieee_bits(values: np.ndarray, out: str) -> np.ndarray:
    """Bits of values exactly representable in `out` (or +-inf, +-0)."""
    with np.errstate(over="ignore"):
        return values.astype(NUMPY[out]).view(UINT[out]).astype(np.uint64)


def round_ieee(x: np.ndarray, out: str, rounding: str, words, flush_outputs: bool) -> np.ndarray:
    """Finite nonzero exact values into float32/float16/bfloat16 bits by the mode: rounded
    with an unbounded exponent, beyond the largest finite +-inf, a subnormal result
    flushed to a zero of its sign."""
    mantissa_bits, min_exponent, largest = IEEE[out]
    r = round_to(x, mantissa_bits, min_exponent, rounding, words)
    r = np.where(r > largest, np.inf, r)
    if flush_outputs:
        r = np.where(r < 2.0 ** min_exponent, 0.0, r)
    return ieee_bits(np.where(np.signbit(x), -r, r), out)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_round_to_against_fractions(rounding):
    # round_to (numpy, power-of-two scaling) agrees with datapath_oracle's Fraction and
    # integer arithmetic on a sample of float32 values into float16's format.
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(400) * 2.0 ** rng.integers(-20, 16, 400)).astype(np.float32).astype(np.float64)
    words = words_for(x.shape, 5)
    got = round_to(x, 10, -14, rounding, words)
    for value, word, r in zip(x.tolist(), words.tolist(), got.tolist()):
        a = abs(Fraction(value))
        e = max(datapath_oracle.floor_log2(a), -14) - 10
        n = datapath_oracle.round_magnitude(*datapath_oracle.split(a, e), value < 0, rounding, word)
        assert Fraction(r) == n * Fraction(2) ** e, (value, word, r)


# ------------------------------------------------------------------ DequantizeLinear

def code_values(x_type: str) -> tuple[np.ndarray, np.ndarray]:
    """Every code of an input type (as stored) and its exact value (float64; NaN with the
    code's sign)."""
    if x_type in INTEGER_CODES:
        width, signed = INTEGER_CODES[x_type]
        raw = np.arange(1 << width)
        values = np.where(raw >= (1 << (width - 1)), raw - (1 << width), raw) if signed else raw
        dtype = {"int8": np.int8, "uint8": np.uint8, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4,
                 "int2": ml_dtypes.int2, "uint2": ml_dtypes.uint2}[x_type]
        return np.asarray(values).astype(dtype), np.asarray(values, np.float64)
    fmt = fo.FORMATS[SMALL[x_type]]
    raw = np.arange(fmt.n_codes, dtype=np.uint8)
    values = np.array([fo.decode_float(fmt, int(c)) for c in raw], np.float64)
    return raw.view(getattr(ml_dtypes, SMALL[x_type])), values


def dq_oracle(values: np.ndarray, scale: float, scale_type: str, out: str, datapath: dict,
              words, x_min_normal: float) -> np.ndarray:
    """docs/semantics.md, "DequantizeLinear under a datapath", steps 1 to 5, with a +0 zero
    point (x_zero_point absent)."""
    rounding = datapath.get("rounding", "half_even")
    subnormals = datapath.get("subnormals", "keep")
    flush_in = subnormals in ("flush_inputs", "flush_both")
    flush_out = subnormals in ("flush_outputs", "flush_both")
    precision = datapath.get("scale_precision")
    v = values.copy()
    s = float(scale)
    if flush_in:
        v = np.where((np.abs(v) < x_min_normal) & (v != 0), np.copysign(0.0, v), v)
        scale_min = {"float": 2.0 ** -126, "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}.get(scale_type, 0.0)
        if abs(s) < scale_min:
            s = math.copysign(0.0, s)
    d = v - 0.0  # the absent zero point: +0 (-0 - +0 is -0)
    with np.errstate(invalid="ignore", over="ignore"):
        product = d * s  # exact: at most 8 + 24 significant bits; IEEE for 0, inf, NaN
    want = np.zeros(values.shape, np.uint64)
    finite = np.isfinite(product) & (product != 0)
    # zeros and infinities: the IEEE product, nothing to round
    want[~finite] = ieee_bits(product[~finite], out)
    x = product[finite]
    w = np.asarray(words)[finite] if words is not None else np.zeros(x.shape, np.uint32)
    if precision == "float64" or (precision == "float32" and out != "float32"):
        p_bits, p_min, p_max = (52, -1022, np.finfo(np.float64).max) if precision == "float64" else IEEE["float32"]
        r = round_to(x, p_bits, p_min, "half_even", w)
        x = np.where(np.signbit(x), -1.0, 1.0) * np.where(r > p_max, np.inf, r)
    rounded = np.zeros(x.shape, np.uint64)
    inf = np.isinf(x)
    rounded[inf] = ieee_bits(x[inf], out)
    rounded[~inf] = round_ieee(x[~inf], out, rounding, w[~inf], flush_out)
    want[finite] = rounded
    nan = np.isnan(d)
    if datapath.get("nan", "spec") == "canonical":
        want[np.isnan(product)] = CANONICAL_NAN[out]
    else:
        # a NaN code's NaN with its sign (the code wins over the scale)
        want[nan] = QUIET[out] | np.where(np.signbit(d[nan]), SIGN[out], 0).astype(np.uint64)
    return want


def dq_min_normal(x_type: str) -> float:
    if x_type in SMALL:
        return float(fo.FORMATS[SMALL[x_type]].subnormal_quantum * (1 << fo.FORMATS[SMALL[x_type]].man_bits))
    return 0.0


def run_dq(x_type, scale, scale_type, out, datapath, words=None, n_threads=None):
    codes, values = code_values(x_type)
    s = np.asarray(scale, dtype=NUMPY[scale_type] if scale_type != "float" else np.float32)
    got = qemu_q.dequantize_linear(codes, s, output_dtype=out, datapath=dp(**datapath),
                                   random_bits=words, n_threads=n_threads)
    want = dq_oracle(values, float(s), scale_type, out, datapath, words, dq_min_normal(x_type))
    check(got, want, f"DequantizeLinear {x_type} * {scale_type} {float(s)!r} -> {out} {datapath}")


DQ_TYPES = list(INTEGER_CODES) + list(SMALL)
# Scales with full mantissas, so that the products round, of both signs; the float32 one
# times 127 overflows bfloat16/float32 only with the large scale below.
DQ_SCALES = [(0.1, "float"), (-3.3, "float"), (1.7e38, "float"), (1.9e-39, "float")]


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("out", ["float32", "float16", "bfloat16"])
def test_dequantize_every_code_every_rounding(rounding, out):
    for x_type in DQ_TYPES:
        for scale, scale_type in DQ_SCALES:
            n = 1 << (INTEGER_CODES[x_type][0] if x_type in INTEGER_CODES else fo.FORMATS[SMALL[x_type]].n_bits)
            words = words_for((n,), n) if rounding == "stochastic" else None
            run_dq(x_type, scale, scale_type, out, {"rounding": rounding}, words)


@pytest.mark.parametrize("subnormals", SUBNORMALS)
@pytest.mark.parametrize("nan", ["spec", "canonical"])
def test_dequantize_subnormals_and_nan(subnormals, nan):
    # 1.9e-39 (a float32 subnormal scale) and 2**-20 (products below float16's normals).
    for rounding in ("half_even", "up"):
        for x_type in DQ_TYPES:
            for scale, scale_type in [(1.9e-39, "float"), (2.0 ** -20 * 1.3, "float"), (0.1, "float")]:
                for out in ("float32", "float16", "bfloat16"):
                    run_dq(x_type, scale, scale_type, out,
                           {"rounding": rounding, "subnormals": subnormals, "nan": nan})


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("rounding", ["half_even", "toward_zero", "half_away", "stochastic"])
def test_dequantize_scale_precision(precision, rounding):
    # float32 then the output: two roundings for float16 / bfloat16 outputs.
    for x_type in ("int8", "uint8", "float8e4m3fn", "float8e5m2"):
        for out in ("float32", "float16", "bfloat16"):
            # float32 subnormal scales; products below float32's subnormals round
            # to zero in the float32 step
            for scale in (0.1, 1.0 / 3.0, 65519.0 / 127.0, 1.9e-39, 3 * 2.0 ** -149):
                n = 256
                words = words_for((n,), 3) if rounding == "stochastic" else None
                run_dq(x_type, scale, "float", out, {"rounding": rounding, "scale_precision": precision},
                       words)


def test_dequantize_double_rounding_example():
    # s = 1 + 2731 * 2**-23 (a float32); 3 * s = 3 + 8193 * 2**-23 = 3 + 2**-10 + 2**-23:
    # just above the float16 midpoint 3 + 2**-10 between 3 (0x4200) and 3 + 2**-9 (0x4201).
    # Rounded once it is 0x4201. Through float32 (ulp 2**-22 there) it is a tie that goes to
    # the even 3 + 2**-10, the float16 midpoint, which then goes to the even 3: 0x4200.
    s = np.float32(1 + 2731 * 2.0 ** -23)
    x = np.array([3], np.int8)
    once = qemu_q.dequantize_linear(x, s, output_dtype="float16")
    twice = qemu_q.dequantize_linear(x, s, output_dtype="float16", datapath=dp(scale_precision="float32"))
    assert bits(once).tolist() == [0x4201]
    assert bits(twice).tolist() == [0x4200]


@pytest.mark.parametrize("codes", [
    np.array([2**31 - 1, -(2**31), 123456789, -987654321, 3, 0], np.int32),
    np.array([32767, -32768, -12345, 777, 1, 0], np.int16),
    np.array([65535, 54321, 4097, 1, 0], np.uint16),
], ids=["int32", "int16", "uint16"])
def test_dequantize_wide_codes(codes):
    # 16- and 32-bit codes: x * s needs up to 57 bits; the oracle in Fractions.
    x = codes
    s = np.float32(0.1)
    for rounding in ROUNDINGS:
        words = words_for(x.shape, 9) if rounding == "stochastic" else None
        for out in ("float32", "float16", "bfloat16"):
            got = qemu_q.dequantize_linear(x, s, output_dtype=out, datapath=dp(rounding=rounding),
                                           random_bits=words)
            mantissa_bits, min_exponent, largest = IEEE[out]
            want = []
            for i, code in enumerate(x.tolist()):
                exact = Fraction(code) * Fraction(float(s))
                if exact == 0:
                    want.append(0)
                    continue
                a = abs(exact)
                e = max(datapath_oracle.floor_log2(a), min_exponent) - mantissa_bits
                word = int(words[i]) if words is not None else 0
                n = datapath_oracle.round_magnitude(*datapath_oracle.split(a, e), exact < 0, rounding, word)
                r = float(n * Fraction(2) ** e)
                r = math.inf if r > largest else r
                want.append(int(ieee_bits(np.array([-r if exact < 0 else r]), out)[0]))
            check(got, want, f"{x.dtype} {rounding} {out}")


# 9- to 16-bit family minifloats (qemu_q.minifloat_type, x_dtype=): each one's codes as the
# bits of an IEEE type they are the top bits of, so that numpy/ml_dtypes decode them
# exactly (independent of qemu_q's decoder): (make, storage dtype, the IEEE view, shift,
# smallest normal).
WIDE_MINIFLOATS = {
    "e5m3_inf": (lambda: qemu_q.minifloat_type(5, 3, inf=True), np.float16, 7, 2.0 ** -14),
    "e5m10_inf": (lambda: qemu_q.minifloat_type(5, 10, inf=True), np.float16, 0, 2.0 ** -14),
    "e8m7_inf": (lambda: qemu_q.minifloat_type(8, 7, inf=True), ml_dtypes.bfloat16, 0, 2.0 ** -126),
}


def wide_minifloat_codes(name: str):
    """Every code of the format (uint16 storage) and its exact value (float64, NaN with the
    code's sign)."""
    make, view, shift, _ = WIDE_MINIFLOATS[name]
    etype = make()
    codes = np.arange(1 << etype.bits, dtype=np.uint32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns among the codes
        values = (codes << shift).astype(np.uint16).view(view).astype(np.float64)
    # quiet NaNs with the code's sign (the NaN's payload plays no part)
    values = np.where(np.isnan(values), np.copysign(np.nan, np.where(codes >> (etype.bits - 1), -1.0, 1.0)),
                      values)
    return etype, codes.astype(np.uint16), values


@pytest.mark.parametrize("name", list(WIDE_MINIFLOATS))
@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_dequantize_wide_minifloat_codes_every_rounding(name, rounding):
    # DequantizeLinear's datapath steps on 9- to 16-bit minifloat codes, as on the 8-bit
    # float codes: the product rounded by the mode into each output type.
    etype, codes, values = wide_minifloat_codes(name)
    words = words_for(codes.shape, 21) if rounding == "stochastic" else None
    for scale in (0.1, -3.3, 1.9e-39):
        s = np.float32(scale)
        for out in ("float32", "float16", "bfloat16"):
            datapath = {"rounding": rounding}
            got = qemu_q.dequantize_linear(codes, s, x_dtype=etype, output_dtype=out, datapath=dp(**datapath),
                                           random_bits=words)
            want = dq_oracle(values, float(s), "float", out, datapath, words, WIDE_MINIFLOATS[name][3])
            check(got, want, f"{name} * {float(s)!r} -> {out} {datapath}")


@pytest.mark.parametrize("name", list(WIDE_MINIFLOATS))
@pytest.mark.parametrize("subnormals", SUBNORMALS)
def test_dequantize_wide_minifloat_subnormals_nan_and_precision(name, subnormals):
    etype, codes, values = wide_minifloat_codes(name)
    for datapath in ({"subnormals": subnormals, "nan": "canonical"},
                     {"subnormals": subnormals, "rounding": "up"},
                     {"subnormals": subnormals, "scale_precision": "float32", "rounding": "toward_zero"},
                     {"subnormals": subnormals, "scale_precision": "float64"}):
        for scale in (1.9e-39, 2.0 ** -20 * 1.3, 1.0 / 3.0):
            s = np.float32(scale)
            for out in ("float32", "float16", "bfloat16"):
                for threads in (1, 3):
                    got = qemu_q.dequantize_linear(codes, s, x_dtype=etype, output_dtype=out,
                                                   datapath=dp(**datapath), n_threads=threads)
                    want = dq_oracle(values, float(s), "float", out, datapath, None, WIDE_MINIFLOATS[name][3])
                    check(got, want, f"{name} * {float(s)!r} -> {out} {datapath} threads {threads}")


def test_dequantize_wide_minifloat_options_change_bits_and_levels_agree():
    # The options act (a test that could not fail otherwise): flushing the inputs zeroes the
    # subnormal codes, ties-away and toward-zero differ; every level and thread count agrees.
    etype, codes, values = wide_minifloat_codes("e5m10_inf")
    s = np.float32(0.1)
    keep = qemu_q.dequantize_linear(codes, s, x_dtype=etype, datapath=dp(rounding="toward_zero"))
    flushed = qemu_q.dequantize_linear(codes, s, x_dtype=etype, datapath=dp(rounding="toward_zero",
                                                                             subnormals="flush_inputs"))
    subnormal = (values != 0) & (np.abs(values) < 2.0 ** -14)
    assert subnormal.sum() == 2 * 1023
    assert np.all(flushed[subnormal] == 0) and np.all(keep[subnormal] != 0)
    assert not np.array_equal(bits(keep), bits(qemu_q.dequantize_linear(codes, s, x_dtype=etype)))
    words = words_for(codes.shape, 5)
    datapath = dp(rounding="stochastic", subnormals="flush_both", scale_precision="float64")
    level = _kernels.active.level
    runs = []
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            for threads in (1, 2, 3):
                runs.append(bits(qemu_q.dequantize_linear(codes, s, x_dtype=etype, output_dtype="bfloat16",
                                                          datapath=datapath, random_bits=words,
                                                          n_threads=threads)).tolist())
    finally:
        _kernels.use(level)
    assert all(run == runs[0] for run in runs)
    want = dq_oracle(values, float(s), "float", "bfloat16",
                     {"rounding": "stochastic", "subnormals": "flush_both", "scale_precision": "float64"},
                     words, 2.0 ** -14)
    check(np.array(runs[0], np.uint16).view(ml_dtypes.bfloat16), want, "levels")
    with pytest.raises(ValueError, match=r"random_bits has shape \(3,\)"):
        qemu_q.dequantize_linear(codes, s, x_dtype=etype, datapath=dp(rounding="stochastic"),
                                 random_bits=np.zeros(3, np.uint32))


def test_dequantize_packed_and_blocked_follow_the_datapath():
    rng = np.random.default_rng(2)
    x = rng.integers(-8, 8, size=(6, 64)).astype(ml_dtypes.int4)
    scale = (rng.random((6, 2)) + 0.05).astype(np.float32)
    datapath = dp(rounding="stochastic", subnormals="flush_both")
    words = words_for(x.shape, 4)
    plain = qemu_q.dequantize_linear(x, scale, axis=1, block_size=32, output_dtype="float16",
                                     datapath=datapath, random_bits=words)
    packed = qemu_q.dequantize_linear(qemu_q.pack(x), scale, axis=1, block_size=32, output_dtype="float16",
                                      packed=True, dtype="int4", shape=x.shape, datapath=datapath,
                                      random_bits=words)
    check(packed, bits(plain), "packed")
    values = x.astype(np.float64)
    want = np.empty(x.shape, np.uint64)
    for row in range(6):
        for block in range(2):
            sl = slice(32 * block, 32 * block + 32)
            want[row, sl] = dq_oracle(values[row, sl], float(scale[row, block]), "float", "float16",
                                      {"rounding": "stochastic", "subnormals": "flush_both"},
                                      words[row, sl], 0.0)
    check(plain, want, "blocked int4 stochastic")


# ------------------------------------------------------------------------ Cast

def small_codes(fmt_name: str):
    """(sorted representable non-negative values, their codes) of a small float."""
    fmt = fo.FORMATS[fmt_name]
    pairs = sorted((float(fo.decode(fmt, c)), c) for c in fo.finite_codes(fmt)
                   if not (c & fmt.sign_mask) and fo.decode(fmt, c) >= 0)
    return np.array([v for v, _ in pairs]), np.array([c for _, c in pairs], np.uint64)


def cast_special_code(fmt_name: str, value: float, nan: str, saturate: int = 1) -> int:
    """The Cast rows for NaN, +-inf and overflow (a finite value beyond max). float4/float6
    write the negative-zero code for NaN (Cast's conformance vectors), +-max otherwise."""
    fmt = fo.FORMATS[fmt_name]
    if fmt.kind == "none":
        if math.isnan(value):
            return fmt.sign_mask
        return (fmt.sign_mask if value < 0 else 0) | fmt.max_code
    return fo.encode(fmt, value, saturate, 28, nan)


def cast_oracle_small(x: np.ndarray, fmt_name: str, datapath: dict, words, x_min_normal: float) -> np.ndarray:
    fmt = fo.FORMATS[fmt_name]
    rounding = datapath.get("rounding", "half_even")
    subnormals = datapath.get("subnormals", "keep")
    nan = datapath.get("nan", "spec")
    with np.errstate(invalid="ignore"):  # signalling NaNs: quieted, their sign kept
        v = x.astype(np.float64)
    if subnormals in ("flush_inputs", "flush_both"):
        v = np.where((np.abs(v) < x_min_normal) & (v != 0), np.copysign(0.0, v), v)
    want = np.zeros(v.shape, np.uint64)
    negative = np.signbit(v)
    zero_code = fmt.sign_mask if fmt.has_negative_zero else 0
    finite = np.isfinite(v) & (v != 0)
    want[v == 0] = np.where(negative[v == 0], zero_code, 0)
    for special in np.flatnonzero(~np.isfinite(v)):
        want[special] = cast_special_code(fmt_name, float(v[special]), nan)
    values, codes = small_codes(fmt_name)
    largest = values[-1]
    w = np.asarray(words)[finite] if words is not None else np.zeros(int(finite.sum()), np.uint32)
    r = round_to(v[finite], fmt.man_bits, fmt.min_normal_exp, rounding, w)
    if subnormals in ("flush_outputs", "flush_both"):
        r = np.where(r < 2.0 ** fmt.min_normal_exp, 0.0, r)
    neg = negative[finite]
    index = np.clip(np.searchsorted(values, r), 0, len(values) - 1)
    inside = r <= largest
    assert np.all(values[index[inside]] == r[inside])  # the rounded value is representable
    code = codes[index]
    code = np.where(neg & ((code != 0) | fmt.has_negative_zero), code | fmt.sign_mask, code)
    over_pos = cast_special_code(fmt_name, float(2 * largest), nan)
    over_neg = cast_special_code(fmt_name, float(-2 * largest), nan)
    code = np.where(inside, code, np.where(neg, over_neg, over_pos))
    want[finite] = code
    return want


def narrow_nan(x_bits: np.ndarray, source: str, out: str) -> np.ndarray:
    """Cast's NaN row between float16 and bfloat16: quiet, the sign and the payload's
    leading bits (cut on the right, or padded with zeros)."""
    sign = (x_bits & 0x8000).astype(np.uint64)
    if source == "float16":  # 10 payload bits into 7
        payload = (x_bits.astype(np.uint64) & 0x3FF) >> 3
        return sign | 0x7F80 | 0x40 | payload
    payload = (x_bits.astype(np.uint64) & 0x7F) << 3
    return sign | 0x7C00 | 0x200 | payload


def cast_oracle_ieee(x: np.ndarray, source: str, out: str, datapath: dict, words) -> np.ndarray:
    rounding = datapath.get("rounding", "half_even")
    subnormals = datapath.get("subnormals", "keep")
    with np.errstate(invalid="ignore"):  # signalling NaNs: quieted, their sign kept
        v = x.astype(np.float64)
    x_min_normal = 2.0 ** IEEE[source][1]
    if subnormals in ("flush_inputs", "flush_both"):
        v = np.where((np.abs(v) < x_min_normal) & (v != 0), np.copysign(0.0, v), v)
    want = np.zeros(v.shape, np.uint64)
    finite = np.isfinite(v) & (v != 0)
    plain = np.isinf(v) | (v == 0)
    want[plain] = ieee_bits(v[plain], out)
    w = np.asarray(words)[finite] if words is not None else np.zeros(int(finite.sum()), np.uint32)
    want[finite] = round_ieee(v[finite], out, rounding, w, subnormals in ("flush_outputs", "flush_both"))
    nan = np.isnan(v)
    if datapath.get("nan", "spec") == "canonical":
        want[nan] = CANONICAL_NAN[out]
    else:
        want[nan] = narrow_nan(x.view(np.uint16)[nan], source, out)
    return want


SOURCES = {"float16": ALL_F16, "bfloat16": ALL_BF16}


def run_cast(source, target, datapath, words=None, n_threads=None, saturate=1):
    x = SOURCES[source]
    got = qemu_q.cast(x, target, datapath=dp(**datapath), random_bits=words, n_threads=n_threads,
                      saturate=saturate)
    if target in SMALL:
        want = cast_oracle_small(x, SMALL[target], datapath, words, 2.0 ** IEEE[source][1])
    else:
        want = cast_oracle_ieee(x, source, target, datapath, words)
    check(got, want, f"Cast {source} -> {target} {datapath}")


CAST_TARGETS = list(SMALL)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("source", ["float16", "bfloat16"])
def test_cast_every_input_every_rounding(source, rounding):
    words = words_for((65536,), 17) if rounding == "stochastic" else None
    other = "bfloat16" if source == "float16" else "float16"
    for target in CAST_TARGETS + [other]:
        run_cast(source, target, {"rounding": rounding}, words)


@pytest.mark.parametrize("subnormals", SUBNORMALS)
@pytest.mark.parametrize("nan", ["spec", "canonical"])
@pytest.mark.parametrize("source", ["float16", "bfloat16"])
def test_cast_subnormals_and_nan(source, subnormals, nan):
    other = "bfloat16" if source == "float16" else "float16"
    for rounding in ("half_even", "up"):
        for target in CAST_TARGETS + [other]:
            run_cast(source, target, {"rounding": rounding, "subnormals": subnormals, "nan": nan})


def test_cast_nan_canonical_alone_keeps_the_fast_small_float_loop_bits():
    # nan="canonical" into a small float is the encoder's rows (every NaN 0x7F in e4m3fn,
    # e5m2); from float32 on the fast loop and from float16 on the general one.
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 1e6, -1e6, 1.0], np.float32)
    for target, want in (("float8e4m3fn", [0x7F, 0x7F, 0x7E, 0xFE, 0x7E, 0xFE, 0x38]),
                         ("float8e5m2", [0x7F, 0x7F, 0x7B, 0xFB, 0x7B, 0xFB, 0x3C])):
        with np.errstate(over="ignore"):
            narrow = x.astype(np.float16)  # 1e6 is inf there: the same codes with saturate=1
        for source in (x, narrow):
            check(qemu_q.cast(source, target, datapath=dp(nan="canonical")), want, target)
    # saturate=0: the signed-NaN rows are the canonical NaN too
    check(qemu_q.cast(x, "float8e4m3fn", saturate=0, datapath=dp(nan="canonical")),
          [0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x38], "saturate=0")


def test_cast_float32_and_float64_targets():
    # float64 -> float32 by every mode, and the IEEE NaN option into float32 / float64.
    rng = np.random.default_rng(8)
    x = rng.standard_normal(3000) * 2.0 ** rng.integers(-160, 140, 3000)
    x[:4] = [np.nan, -np.nan, 1e-310, -1e-310]
    for rounding in ROUNDINGS:
        words = words_for(x.shape, 21) if rounding == "stochastic" else None
        got = qemu_q.cast(x, "float32", datapath=dp(rounding=rounding), random_bits=words)
        finite = np.isfinite(x) & (x != 0)
        want = np.zeros(x.shape, np.uint64)
        want[finite] = round_ieee(x[finite], "float32", rounding,
                                  words[finite] if words is not None else np.zeros(int(finite.sum()), np.uint32),
                                  False)
        want[~finite] = np.where(np.signbit(x[~finite]), 0xFFC00000, 0x7FC00000)
        check(got, want, f"float64 -> float32 {rounding}")
    got = qemu_q.cast(x[:4], "float64", datapath=dp(nan="canonical", subnormals="flush_inputs"))
    check(got, [0x7FF8000000000000, 0x7FF8000000000000, 0, 1 << 63], "float64 canonical, flushed")
    got = qemu_q.cast(x[:4].astype(np.float32), "float32", datapath=dp(nan="canonical"))
    check(got, [0x7FC00000, 0x7FC00000, 0, 1 << 31], "float32 identity canonical")


def test_cast_integers_into_floats_and_int4():
    # int64 into float32 rounds by the mode; float into int4 rounds by the mode, then the
    # low bits; float into int8 truncates whatever the mode (the spec's rule).
    big = np.array([2**60 + 1, -(2**60 + 1), 2**24 + 1, -(2**24 + 3), 7, -(2**63)], np.int64)
    halves = np.array([2.5, -2.5, 3.5, -0.5, 0.25, 7.75, -8.5, 1e-3], np.float32)
    for rounding in ROUNDINGS:
        words = words_for(big.shape, 1) if rounding == "stochastic" else None
        got = qemu_q.cast(big, "float32", datapath=dp(rounding=rounding), random_bits=words)
        want = []
        for i, v in enumerate(big.tolist()):
            a = abs(Fraction(v))
            e = max(datapath_oracle.floor_log2(a), -126) - 23
            word = int(words[i]) if words is not None else 0
            n = datapath_oracle.round_magnitude(*datapath_oracle.split(a, e), v < 0, rounding, word)
            want.append(int(np.float32(float(-n * 2.0 ** e if v < 0 else n * 2.0 ** e)).view(np.uint32)))
        check(got, want, f"int64 -> float32 {rounding}")
        words = words_for(halves.shape, 2) if rounding == "stochastic" else None
        got = qemu_q.cast(halves, "int4", datapath=dp(rounding=rounding), random_bits=words)
        want = []
        for i, v in enumerate(halves.tolist()):
            a = abs(Fraction(v))
            word = int(words[i]) if words is not None else 0
            n = datapath_oracle.round_magnitude(*datapath_oracle.split(a, 0), v < 0, rounding, word)
            want.append((-n if v < 0 else n) & 0xF)
        check(got.view(np.uint8) & 0xF, want, f"float32 -> int4 {rounding}")
        truncated = qemu_q.cast(halves, "int8", datapath=dp(rounding=rounding), random_bits=words)
        assert truncated.tolist() == [2, -2, 3, 0, 0, 7, -8, 0]


def test_cast_e8m0_round_mode_wins():
    x = np.array([3.0, 0.75, 5.0, 1e-40], np.float32)
    for rounding in ROUNDINGS:
        words = words_for(x.shape) if rounding == "stochastic" else None
        for mode in ("up", "down", "nearest"):
            got = qemu_q.cast(x, "float8e8m0", round_mode=mode, datapath=dp(rounding=rounding),
                              random_bits=words)
            plain = qemu_q.cast(x, "float8e8m0", round_mode=mode)
            check(got, bits(plain), f"e8m0 {mode} {rounding}")
    # flush_inputs reaches e8m0: 1e-40 (a float32 subnormal) is 0, below E8M0_MIN: 0x00
    # with saturate=1 (the default), NaN with saturate=0
    got = qemu_q.cast(x, "float8e8m0", saturate=0, datapath=dp(subnormals="flush_inputs"))
    assert bits(got)[3] == 0xFF


def test_cast_like_takes_the_datapath():
    x = ALL_F16[::7]
    words = words_for(x.shape, 6)
    target = np.zeros(1, ml_dtypes.float8_e5m2)
    got = qemu_q.cast_like(x, target, datapath=dp(rounding="stochastic"), random_bits=words)
    check(got, cast_oracle_small(x, "float8_e5m2", {"rounding": "stochastic"}, words, 2.0 ** -14), "CastLike")


# ------------------------------------------------- the default, ignored fields, threads

def test_default_datapath_changes_no_bit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5000).astype(np.float32) * 100
    x[:3] = [np.nan, np.inf, 1e-40]
    for target in ("float16", "bfloat16", "float8e4m3fn", "float8e5m2", "float4e2m1", "int8", "int4",
                   "float8e8m0", "float32", "float64"):
        plain = qemu_q.cast(x, target)
        for datapath in (None, dp(), dp(scale="reciprocal", scale_precision="float32"),
                         dp(nan_to_integer="max"), dp(accumulator="int16"), dp(scale_precision="float64")):
            check(qemu_q.cast(x, target, datapath=datapath), bits(plain), f"Cast {target} {datapath}")
    codes = np.arange(256, dtype=np.uint8)
    for dtype in (np.int8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2fnuz):
        for out in ("float32", "float16", "bfloat16"):
            plain = qemu_q.dequantize_linear(codes.view(dtype), np.float32(0.37), output_dtype=out)
            for datapath in (None, dp(), dp(scale="reciprocal", scale_precision="float32") if out == "float32" else dp(),
                             dp(nan_to_integer="zero"), dp(accumulator="int24-saturate")):
                check(qemu_q.dequantize_linear(codes.view(dtype), np.float32(0.37), output_dtype=out,
                                               datapath=datapath), bits(plain), f"DQ {dtype} {out}")


def test_nan_to_integer_is_ignored_by_cast():
    x = np.array([np.nan, -np.nan], np.float32)
    for rule in ("min", "zero", "max"):
        assert qemu_q.cast(x, "int8", datapath=dp(nan_to_integer=rule)).tolist() == [0, 0]
        assert qemu_q.cast(x, "int4", datapath=dp(nan_to_integer=rule, rounding="up")).astype(int).tolist() == [0, 0]


@pytest.mark.parametrize("datapath", [
    {"rounding": "stochastic", "subnormals": "flush_both"},
    {"rounding": "to_odd", "nan": "canonical"},
    {"rounding": "half_away", "scale_precision": "float32"},
])
def test_threads_and_levels_do_not_change_the_bits(datapath):
    rng = np.random.default_rng(1)
    n = 99_999  # several Cast chunks and DequantizeLinear tasks
    x = (rng.standard_normal(n) * 10).astype(np.float32)
    x[:3] = [np.nan, 1e-40, -np.inf]
    stochastic = datapath["rounding"] == "stochastic"
    words = words_for(x.shape, 12) if stochastic else None
    cast_dp = {k: v for k, v in datapath.items() if k != "scale_precision"}
    codes = rng.integers(-128, 128, size=(3, n // 3)).astype(np.int8)
    scale = np.array([0.1, -0.37, 2.0 ** -131], np.float32)
    w = words_for(codes.shape, 13) if stochastic else None
    level = _kernels.active.level
    results = []
    try:
        for lv, threads in itertools.product(LEVELS, (1, 2)):
            _kernels.use(lv)
            got = [qemu_q.cast(x, target, datapath=dp(**cast_dp), random_bits=words, n_threads=threads)
                   for target in ("float16", "float8e4m3fn")]
            got.append(qemu_q.dequantize_linear(codes, scale, axis=0, output_dtype="bfloat16",
                                                datapath=dp(**datapath), random_bits=w, n_threads=threads))
            got.append(qemu_q.dequantize_linear(qemu_q.pack(codes.astype(ml_dtypes.int4)), scale, axis=0,
                                                packed=True, dtype="int4", shape=codes.shape,
                                                datapath=dp(**datapath), random_bits=w, n_threads=threads))
            results.append((lv, threads, got))
    finally:
        _kernels.use(level)
    for lv, threads, got in results:
        for g, f in zip(got, results[0][2]):
            check(g, bits(f), f"{lv} n_threads={threads}")


# ------------------------------------------------------------------------ validation

def test_random_bits_checks():
    x = np.array([1.5, 2.5], np.float32)
    codes = np.array([1, 2], np.int8)
    sr = dp(rounding="stochastic")
    for call in (lambda **kw: qemu_q.cast(x, "float16", **kw),
                 lambda **kw: qemu_q.cast_like(x, np.zeros(1, np.float16), **kw),
                 lambda **kw: qemu_q.dequantize_linear(codes, np.float32(0.1), **kw)):
        with pytest.raises(ValueError, match="needs random_bits"):
            call(datapath=sr)
        with pytest.raises(ValueError, match="only rounding='stochastic'"):
            call(random_bits=np.zeros(2, np.uint32))
        with pytest.raises(TypeError, match="uint32"):
            call(datapath=sr, random_bits=np.zeros(2, np.int64))
        with pytest.raises(ValueError, match=r"shape \(3,\)"):
            call(datapath=sr, random_bits=np.zeros(3, np.uint32))
        with pytest.raises(TypeError, match="datapath"):
            call(datapath={"rounding": "up"})
    words = np.arange(4, dtype=np.uint32)[::2]  # not contiguous: read, never written
    before = words.copy()
    qemu_q.cast(x, "float16", datapath=sr, random_bits=words)
    assert words.tolist() == before.tolist()


def test_datapath_is_part_of_the_plan_cache():
    x = np.array([1 + 2 ** -11 + 2 ** -20], np.float32)  # above a float16 midpoint
    assert bits(qemu_q.cast(x, "float16")).tolist() == [0x3C01]
    assert bits(qemu_q.cast(x, "float16", datapath=dp(rounding="toward_zero"))).tolist() == [0x3C00]
    assert bits(qemu_q.cast(x, "float16")).tolist() == [0x3C01]
    codes = np.array([3], np.int8)
    s = np.float32(1 + 2 ** -11 + 2 ** -20)
    assert bits(qemu_q.dequantize_linear(codes, s, output_dtype="float16",
                                         datapath=dp(rounding="down"))).tolist() == [0x4200]
    # 3 * s = 3 + 0.75 * 2**-9 + 3 * 2**-20: to nearest, 3 + 2**-9
    assert bits(qemu_q.dequantize_linear(codes, s, output_dtype="float16")).tolist() == [0x4201]
