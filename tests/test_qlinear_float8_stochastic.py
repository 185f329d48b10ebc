"""QLinearMatMul-21 into float8 outputs under rounding="stochastic", every requantization
rule (docs/semantics.md, "The integer ops under a datapath"): the rule's value v ("exact":
the exact real acc * sa * sb / sy, or S * m with a stored multiplier; "float64": the rule's
double; "float32": its float32) rounded on the float8 mantissa with the output's word added
to the first 32 bits dropped below the last kept bit, then saturated (saturate=1) and
encoded. The oracle is the definition in exact integers and Fractions, with the float8
codes built from the formats' fields (bias, mantissa bits, largest finite), never from the
code under test. The words sit at 0, 2**32 - 1, the exact carry threshold and one below it:
only an implementation that reads the exact value's first 32 dropped bits gets the last
two right where v has more than 24 significant bits."""

from fractions import Fraction
from functools import lru_cache

import ml_dtypes
import numpy as np
import pytest

import qemu_q
import datapath_oracle as do

TWO32 = 1 << 32

# name: (mantissa bits, bias, largest finite, has -0) from the format definitions
# (OCP 8-bit floating point: e4m3fn, e5m2; the FNUZ formats: bias 8 and 16, no -0).
FORMATS = {
    "float8e4m3fn": (3, 7, Fraction(448), True),
    "float8e5m2": (2, 15, Fraction(57344), True),
    "float8e4m3fnuz": (3, 8, Fraction(240), False),
    "float8e5m2fnuz": (2, 16, Fraction(57344), False),
}
DTYPES = {"float8e4m3fn": ml_dtypes.float8_e4m3fn, "float8e5m2": ml_dtypes.float8_e5m2,
          "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz}


def floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > a else e


def split(v: Fraction, fmt: str):
    """|v| (nonzero) in units of its float8 ulp: (ulp exponent, whole, floor(frac * 2**32))."""
    m, bias, _, _ = FORMATS[fmt]
    u = max(floor_log2(abs(v)), 1 - bias) - m
    t = abs(v) / Fraction(2) ** u
    whole = t.numerator // t.denominator
    return u, whole, (t - whole) * TWO32 // 1


def encode(r: Fraction, negative: bool, fmt: str) -> int:
    """A value of the format's grid (unbounded above) saturated to +-max, as its code."""
    m, bias, largest, signed_zero = FORMATS[fmt]
    r = min(r, largest)
    sign = 0x80 if negative and (r != 0 or signed_zero) else 0
    if r == 0:
        return sign
    e = floor_log2(r)
    if e < 1 - bias:  # subnormal: field 0, mantissa r / 2**(1 - bias - m)
        mantissa = r / Fraction(2) ** (1 - bias - m)
        assert mantissa.denominator == 1
        return sign | int(mantissa)
    mantissa = r / Fraction(2) ** (e - m) - (1 << m)
    assert mantissa.denominator == 1
    return sign | ((e + bias) << m) | int(mantissa)


def stochastic_code(v: Fraction, word: int, fmt: str, flush: bool = False) -> int:
    """The definition: truncation + carry, carry = floor(frac * 2**32) + word >= 2**32; the
    zero point (+0) only signs a zero v, which stays +0 (an exact zero v is +0)."""
    if v == 0:
        return 0
    u, whole, frac32 = split(v, fmt)
    n = whole + (1 if frac32 + word >= TWO32 else 0)
    r = n * Fraction(2) ** u
    _, bias, _, _ = FORMATS[fmt]
    if flush and 0 < r < Fraction(2) ** (1 - bias):
        r = Fraction(0)
    return encode(r, v < 0, fmt)


def word_kinds(v: Fraction, fmt: str) -> list:
    """0, 2**32 - 1, the smallest word that carries, and the largest that does not."""
    if v == 0:
        return [0, TWO32 - 1, 1 << 31, (1 << 31) - 1]
    _, _, frac32 = split(v, fmt)
    threshold = TWO32 - frac32 if frac32 else TWO32 - 1
    return [0, TWO32 - 1, threshold, threshold - 1]


def test_the_oracle_encoder_agrees_with_ml_dtypes():
    # every finite code decodes (ml_dtypes) to a value the oracle encodes back to it
    for fmt, dtype in DTYPES.items():
        values = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
        for code, value in enumerate(values):
            if np.isfinite(value) and not (value == 0 and code == 0x80 and not FORMATS[fmt][3]):
                assert encode(abs(Fraction(value)), np.signbit(value), fmt) == code, (fmt, code)


def f32(x) -> Fraction:
    return Fraction(float(np.float32(x)))


def fl(v: Fraction, precision: str) -> Fraction:
    return do.round_nearest_even_to(v, precision)


def rule_value(rule: str, s: Fraction, sa: Fraction, sb: Fraction, sy: Fraction, f64_multiplier: bool,
               int_sum: bool) -> Fraction:
    """The rule's value v of docs/semantics.md for a float8 output (no zero point: it is
    +-0). f64_multiplier: the datapath's scale_precision="float64", "divide"."""
    if f64_multiplier:
        m = fl(fl(sa * sb, "float64") / sy, "float64")
        if rule == "exact":
            return s * m
        return fl(fl(s, "float64") * m, "float64")
    m32 = fl(fl(sa * sb, "float32") / sy, "float32")
    if rule == "exact":
        return s * sa * sb / sy
    if rule == "float32":
        return fl(fl(s, "float32") * m32, "float32")
    # "float64": fl64(acc * m), m the rule's multiplier in the scale type (float32 here)
    return fl(fl(s, "float64") * m32, "float64")


# a column of operand codes, each value met with every word kind: b repeats each code 4 times
A_INT = np.array(sorted({*range(-128, 128, 15), -127, -1, 1, 2, 3, 127}), np.int8).reshape(-1, 1)
B_CODES = [1, -3, 37, 127]
B_INT = np.repeat(np.array([B_CODES], np.int8), 4, axis=1)


def scales_for(fmt: str, band: str):
    """(sa, sb, sy) float32 so that |acc| up to 128 * 127 reaches the band: "low" the
    format's subnormals and the values below the smallest one, "high" the saturation bound
    (the largest |v| about 1.06 * max). sy is not a power of two: v has long expansions."""
    _, bias, largest, _ = FORMATS[fmt]
    if band == "low":
        return np.float32(0.75), np.float32(1.0), np.float32(16256 * 0.75 / (2.0 ** (1 - bias) * 6))
    return np.float32(1.0), np.float32(1.0), np.float32(16256 / (float(largest) * 1.0625) * 1.0000001)


@lru_cache(maxsize=None)
def expected(fmt: str, rule: str, band: str, f64_multiplier: bool, flush: bool):
    """(words, codes) of the oracle for A_INT x B_INT under the band's scales."""
    sa, sb, sy = scales_for(fmt, band)
    rows, cols = A_INT.shape[0], B_INT.shape[1]
    words = np.zeros((rows, cols), np.uint32)
    want = np.zeros((rows, cols), np.uint8)
    for i in range(rows):
        for j in range(cols):
            v = rule_value(rule, Fraction(int(A_INT[i, 0]) * int(B_INT[0, j])), f32(sa), f32(sb), f32(sy),
                           f64_multiplier, True)
            words[i, j] = word_kinds(v, fmt)[j % 4]
            want[i, j] = stochastic_code(v, int(words[i, j]), fmt, flush)
    return words, want


def run_and_check(fmt, rule, band, *, datapath_kw=None, threads=1, zp_negative=False):
    datapath_kw = datapath_kw or {}
    sa, sb, sy = scales_for(fmt, band)
    dtype = DTYPES[fmt]
    words, want = expected(fmt, rule, band, datapath_kw.get("scale_precision") == "float64",
                           datapath_kw.get("subnormals") == "flush_outputs")
    zp = np.array(-0.0 if zp_negative else 0.0, dtype)
    y = qemu_q.qlinear_matmul(A_INT, sa, np.int8(0), B_INT, sb, np.int8(0), sy, zp, opset=21,
                              requantization=rule, n_threads=threads, random_bits=words,
                              datapath=qemu_q.Datapath(rounding="stochastic", **datapath_kw))
    assert y.dtype == dtype
    got = y.view(np.uint8)
    assert got.tolist() == want.tolist(), (fmt, rule, band, datapath_kw,
                                           np.argwhere(got != want)[:5].tolist())
    return want


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("rule", ["exact", "float64", "float32"])
def test_qlinear_float8_stochastic_every_rule(fmt, rule):
    for band in ("low", "high"):
        want = run_and_check(fmt, rule, band)
        # the samples reach what they are meant to: subnormal codes and zeros of both
        # signs (low), the largest finite code of both signs (high)
        field = want & 0x7F
        if band == "low":
            assert np.any((field > 0) & (field < (1 << FORMATS[fmt][0]))) and np.any(want == 0)
            if FORMATS[fmt][3]:
                assert np.any(want == 0x80)
        else:
            top = {"float8e4m3fn": 0x7E, "float8e5m2": 0x7B}.get(fmt, 0x7F)
            assert np.any(want == top) and np.any(want == (top | 0x80))


def test_qlinear_float8_stochastic_threshold_words_need_the_exact_bits():
    # the test's own check that its threshold words tell the exact value from the value
    # rounded to odd at float32's 24 bits (what the kernels held before): with the odd
    # value's dropped bits, many outputs would carry differently
    sa, sb, sy = scales_for("float8e4m3fn", "low")
    differ = 0
    for a in A_INT[:, 0]:
        for b in B_CODES:
            v = Fraction(int(a) * b) * f32(sa) * f32(sb) / f32(sy)
            if v == 0:
                continue
            odd = Fraction(float(np.float32(float(v))))  # nearest float32, then made odd
            if odd != v:
                e = floor_log2(abs(v)) - 23
                n = abs(v) / Fraction(2) ** e // 1
                odd = (n | 1) * Fraction(2) ** e * (1 if v > 0 else -1)
            for word in word_kinds(v, "float8e4m3fn")[2:]:
                differ += stochastic_code(v, word, "float8e4m3fn") != stochastic_code(odd, word, "float8e4m3fn")
    assert differ > 50


@pytest.mark.parametrize("rule", ["exact", "float64"])
def test_qlinear_float8_stochastic_with_a_float64_multiplier_and_flush(rule):
    # the datapath's multiplier (requantize_with_multiplier): "exact" S * m exactly,
    # "float64" fl64(S * m); and the output flush after the stochastic rounding
    for fmt in ("float8e4m3fn", "float8e5m2"):
        run_and_check(fmt, rule, "low", datapath_kw={"scale": "divide", "scale_precision": "float64"})
        run_and_check(fmt, rule, "low", datapath_kw={"subnormals": "flush_outputs"}, zp_negative=True)


@pytest.mark.parametrize("rule", ["exact", "float64", "float32"])
def test_qlinear_float8_operands_stochastic_float8_output(rule):
    # float8e4m3fn and float8e5m2 operands (the exact 128-bit sums of float_matmul_requantize)
    # into e4m3fn and e5m2: sums of two products, v with long expansions (sy = 0.37)
    a_vals = [0.001953125, -0.013671875, 0.4375, -3.75, 15.0, 448.0, -240.0, 0.0, 1.125, -0.0625]
    rng = np.random.default_rng(5)
    for a_fmt, out_fmt in (("float8e4m3fn", "float8e5m2"), ("float8e5m2", "float8e4m3fn")):
        a = np.array([[x, a_vals[(k * 3 + 1) % len(a_vals)]] for k, x in enumerate(a_vals)], DTYPES[a_fmt])
        b = np.array([[1, -3, 7, 127], [5, 2, -128, 1]], np.int8)
        b = np.repeat(b, 4, axis=1)
        for datapath_kw in ({}, {"scale_precision": "float64"}):
            sa, sb, sy = np.float32(1.5), np.float32(0.75), np.float32(0.37 if out_fmt == "float8e5m2" else 9.37)
            sums = [[sum(Fraction(float(a[i, k].astype(np.float64))) * int(b[k, j]) for k in range(2))
                     for j in range(b.shape[1])] for i in range(a.shape[0])]
            words = np.zeros((a.shape[0], b.shape[1]), np.uint32)
            want = np.zeros(words.shape, np.uint8)
            for i in range(a.shape[0]):
                for j in range(b.shape[1]):
                    v = rule_value(rule, sums[i][j], f32(sa), f32(sb), f32(sy), bool(datapath_kw), False)
                    kinds = word_kinds(v, out_fmt) + [int(rng.integers(0, TWO32))]
                    words[i, j] = kinds[(i + j) % 5]
                    want[i, j] = stochastic_code(v, int(words[i, j]), out_fmt)
            if rule == "float32" and datapath_kw:
                continue  # a float64 multiplier with the float32 rule is refused
            for threads in (1, 3):
                y = qemu_q.qlinear_matmul(a, sa, np.zeros((), DTYPES[a_fmt]), b, sb, np.int8(0), sy,
                                          np.zeros((), DTYPES[out_fmt]), opset=21, requantization=rule,
                                          n_threads=threads, random_bits=words,
                                          datapath=qemu_q.Datapath(rounding="stochastic", **datapath_kw))
                assert y.view(np.uint8).tolist() == want.tolist(), (a_fmt, out_fmt, datapath_kw, threads)


def test_qlinear_float8_stochastic_nan_and_refusals():
    # y_scale 0 with a zero sum: 0 / 0 is NaN, written by the nan option ("canonical": 0x7F)
    zero = np.zeros((1, 1), np.int8)
    zp = np.zeros((), ml_dtypes.float8_e4m3fn)
    for rule in ("exact", "float64", "float32"):
        y = qemu_q.qlinear_matmul(zero, np.float32(1.0), np.int8(0), zero, np.float32(1.0), np.int8(0),
                                  np.float32(0.0), zp, opset=21, requantization=rule,
                                  random_bits=np.zeros((1, 1), np.uint32),
                                  datapath=qemu_q.Datapath(rounding="stochastic", nan="canonical"))
        assert y.view(np.uint8).tolist() == [[0x7F]]
    # the words are still required, and refused without "stochastic"
    one = np.ones((1, 1), np.int8)
    with pytest.raises(ValueError, match="random_bits"):
        qemu_q.qlinear_matmul(one, np.float32(1.0), np.int8(0), one, np.float32(1.0), np.int8(0),
                              np.float32(3.0), zp, opset=21, datapath=qemu_q.Datapath(rounding="stochastic"))
    with pytest.raises(ValueError, match="random_bits"):
        qemu_q.qlinear_matmul(one, np.float32(1.0), np.int8(0), one, np.float32(1.0), np.int8(0),
                              np.float32(3.0), zp, opset=21, random_bits=np.zeros((1, 1), np.uint32))


def test_qlinear_float8_stochastic_every_level_and_thread_count():
    from qemu_q import _kernels

    level = _kernels.active.level
    try:
        for lv in _kernels.available_levels():
            _kernels.use(lv)
            for threads in (1, 2, 3):
                run_and_check("float8e4m3fn", "exact", "low", threads=threads)
                run_and_check("float8e5m2", "float64", "high", threads=threads)
    finally:
        _kernels.use(level)
