"""qemu_q.Datapath with quantize_linear and dequantize_linear: every option against the exact
oracle of tests/datapath_oracle.py (written from docs/semantics.md, "Datapath options"),
exhaustively over float16 and bfloat16 inputs; the ONNX default unchanged; thread-count and
instruction-set-level independence; bad arguments."""

from __future__ import annotations

import itertools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import _kernels
from support import assert_same_bits, bits

import datapath_oracle as oracle

ROUNDINGS = ["half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd",
             "stochastic"]
SMALL_FLOATS = {
    "float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz", "float8e5m2": "float8_e5m2",
    "float8e5m2fnuz": "float8_e5m2fnuz", "float4e2m1": "float4_e2m1fn",
}
# Not a power of two, so that the division rounds; float16 x / SCALE spans every small
# float's range, its subnormals and its overflow.
SCALE = np.float32(0.3)
ALL_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
ALL_BF16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
LEVELS = _kernels.available_levels()


def random_words(shape, seed=7):
    return np.random.default_rng(seed).integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)


def quantize(x, scale, out, dp, words=None, zero_point=None, **kw):
    scale_arr = np.asarray(scale, dtype=x.dtype if x.dtype != np.float32 else np.float32)
    return qemu_q.quantize_linear(x, scale_arr, zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp),
                                  random_bits=words, **kw)


def expected(x, scale, out, dp, words=None, zero_point=None, x_type="float16", **kw):
    name = SMALL_FLOATS.get(out, out)
    return oracle.quantize_array(x, float(scale), zero_point, name, dp, words=words, x_type=x_type,
                                 scale_type=x_type, **kw)


def check(got, want, what):
    g = bits(got).astype(np.uint32).ravel()
    w = want.astype(np.uint32).ravel()
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ; at {bad[:6].tolist()} "
                           f"got {[hex(v) for v in g[bad[:6]]]} want {[hex(v) for v in w[bad[:6]]]}")


# ---------------------------------------------------------------- the default is ONNX's

@pytest.mark.parametrize("out", ["int8", "uint8", "int4", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_default_datapath_changes_no_bit(out):
    x = np.random.default_rng(1).standard_normal(5000).astype(np.float32) * 40
    x[:4] = [np.nan, -np.inf, np.inf, -0.0]
    s = np.float32(0.37)
    plain = qemu_q.quantize_linear(x, s, output_dtype=out)
    for dp in (None, qemu_q.Datapath(), qemu_q.Datapath(scale_precision=None, accumulator="int32")):
        assert_same_bits(qemu_q.quantize_linear(x, s, output_dtype=out, datapath=dp), plain, str(dp))


def test_datapath_nan_canonical_is_the_nan_option():
    x = np.array([np.nan, -np.nan, -np.inf, 1e6, -1e6], np.float32)
    for out in ("float8e4m3fn", "float8e5m2"):
        a = qemu_q.quantize_linear(x, np.float32(1), output_dtype=out, saturate=0, nan="canonical")
        b = qemu_q.quantize_linear(x, np.float32(1), output_dtype=out, saturate=0,
                                   datapath=qemu_q.Datapath(nan="canonical"))
        assert_same_bits(a, b)
        assert bits(b)[0] == bits(b)[1] == 0x7F


# ----------------------------------------------------------- exhaustive against the oracle

@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("out", ["int8", *SMALL_FLOATS])
def test_every_float16_every_rounding(rounding, out):
    words = random_words(ALL_F16.shape) if rounding == "stochastic" else None
    dp = {"rounding": rounding}
    got = quantize(ALL_F16, np.float16(SCALE), out, dp, words)
    want = expected(ALL_F16, np.float16(SCALE), out, dp, words, precision="float16")
    check(got, want, f"float16 -> {out} {rounding}")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("out", ["int8", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_every_bfloat16_every_rounding(rounding, out):
    words = random_words(ALL_BF16.shape, 11) if rounding == "stochastic" else None
    dp = {"rounding": rounding}
    scale = ml_dtypes.bfloat16(3.0)
    got = quantize(ALL_BF16, scale, out, dp, words)
    want = expected(ALL_BF16, scale, out, dp, words, precision="bfloat16", x_type="bfloat16")
    check(got, want, f"bfloat16 -> {out} {rounding}")


def test_the_modes_do_differ():
    # The test above could not fail if every mode gave half_even's bits.
    x = np.array([2.5, -2.5, 1.25, -1.25, 0.75, -3.5], np.float32)
    got = {r: qemu_q.quantize_linear(x, np.float32(1), output_dtype="int8",
                                     datapath=qemu_q.Datapath(rounding=r)).tolist()
           for r in ROUNDINGS[:-1]}
    assert got == {
        "half_even": [2, -2, 1, -1, 1, -4],
        "half_away": [3, -3, 1, -1, 1, -4],
        "half_up": [3, -2, 1, -1, 1, -3],
        "half_down": [2, -3, 1, -1, 1, -4],
        "toward_zero": [2, -2, 1, -1, 0, -3],
        "down": [2, -3, 1, -2, 0, -4],
        "up": [3, -2, 2, -1, 1, -3],
        "to_odd": [3, -3, 1, -1, 1, -3],
    }


# ------------------------------------------------------------------------ stochastic

def test_stochastic_integer_alignment():
    # 2.25: fraction 0.25 = 0x40000000 in 32 bits; a word rounds up iff word + 0x40000000 >= 2**32.
    x = np.full(6, 2.25, np.float32)
    x[3:] = -2.25
    words = np.array([0xBFFFFFFF, 0xC0000000, 0, 0xBFFFFFFF, 0xC0000000, 0xFFFFFFFF], np.uint32)
    got = qemu_q.quantize_linear(x, np.float32(1), output_dtype="int8",
                                 datapath=qemu_q.Datapath(rounding="stochastic"), random_bits=words)
    assert got.tolist() == [2, 3, 2, -2, -3, -3]


def test_stochastic_small_float_alignment():
    # e4m3fn at 1.0625 = 1 + 1/16: the ulp is 1/8, the dropped fraction is 1/2 of it,
    # 0x80000000 as a 32-bit fraction of the ulp.
    x = np.array([1.0625, 1.0625, -1.0625], np.float32)
    words = np.array([0x7FFFFFFF, 0x80000000, 0x80000000], np.uint32)
    got = qemu_q.quantize_linear(x, np.float32(1), output_dtype="float8e4m3fn",
                                 datapath=qemu_q.Datapath(rounding="stochastic"), random_bits=words)
    assert bits(got).tolist() == [0x38, 0x39, 0xB9]


def test_stochastic_bits_follow_their_element_in_every_layout():
    x = np.random.default_rng(3).standard_normal((9, 2 * 4096 + 45)).astype(np.float32) * 5
    words = random_words(x.shape, 5)
    scale = np.linspace(0.1, 2, 9 * ((x.shape[1] + 31) // 32)).astype(np.float32).reshape(9, -1)
    dp = qemu_q.Datapath(rounding="stochastic")
    got = qemu_q.quantize_linear(x, scale, output_dtype="int8", axis=1, block_size=32, datapath=dp,
                                 random_bits=words)
    # each row on its own, with per-element oracle
    for row in (0, 8):
        s_row = np.repeat(scale[row], 32)[: x.shape[1]]
        want = [oracle.to_integer(*_q(v, s), 0, "int8", {"rounding": "stochastic"}, int(w)) & 0xFF
                for v, s, w in zip(x[row][:3000].tolist(), s_row[:3000].tolist(), words[row][:3000].tolist())]
        assert bits(got[row][:3000]).tolist() == want


def _q(v, s):
    q = oracle.quotient(Fraction(v), Fraction(s), {}, "float", "float", "float")
    return q, q < 0


# --------------------------------------------------------------- reciprocal vs divide

# each precision exhaustively into one output (the float64 reciprocal into the integers:
# tests/test_datapath_f64.py, beside the ties)
@pytest.mark.parametrize(("precision", "out"), [("float32", "int8"), ("float64", "float8e4m3fn")])
def test_reciprocal_every_float16(precision, out):
    dp = {"scale": "reciprocal", "scale_precision": precision, "rounding": "half_away"}
    got = quantize(ALL_F16, np.float16(SCALE), out, dp)
    want = expected(ALL_F16, np.float16(SCALE), out, dp, precision="float16")
    check(got, want, f"reciprocal {precision} -> {out}")


def test_divide_in_float64_every_float16():
    dp = {"scale_precision": "float64"}
    got = quantize(ALL_F16, np.float16(SCALE), "int8", dp)
    want = expected(ALL_F16, np.float16(SCALE), "int8", dp, precision="float")
    check(got, want, "divide float64")


def test_reciprocal_differs_from_divide_at_ties():
    # Scale 7: x = 7 * (k + 1/2) divides to an exact tie, while float32(1/7) is not 1/7, so
    # the product moves off the tie where float32's resolution shows it (1622 of 6000).
    x = (7 * (np.arange(-3000, 3000, dtype=np.float64) + 0.5)).astype(np.float32)
    s = np.float32(7.0)
    divide = qemu_q.quantize_linear(x, s, output_dtype="int16")
    recip = qemu_q.quantize_linear(x, s, output_dtype="int16",
                                   datapath=qemu_q.Datapath(scale="reciprocal", scale_precision="float32"))
    r = oracle.round_nearest_even_to(1 / Fraction(float(s)), "float")
    want = []
    for v in x.tolist():
        q = oracle.round_nearest_even_to(Fraction(v) * r, "float") if v else Fraction(0)
        want.append(oracle.to_integer(q, q < 0, 0, "int16", {}, 0))
    assert recip.tolist() == want
    assert divide.tolist() == [oracle.to_integer(Fraction(k) + Fraction(1, 2), k < 0, 0, "int16", {}, 0)
                               for k in range(-3000, 3000)]
    assert 0 < np.count_nonzero(divide != recip) < x.size


# ------------------------------------------------------------------- NaN and subnormals

# The NaN codes by sign (negative, positive) from the spec's tables: Cast's "NaN -> NaN"
# 0x7F and "-NaN -> -NaN" 0xFF for e4m3fn; zero_opposite_sign's zeros for float4e2m1.
NAN_CODES = {("float8e4m3fn", "spec"): (0xFF, 0x7F), ("float4e2m1", "zero_opposite_sign"): (0x0, 0x8)}


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("x_type", [np.float32, np.float16])
@pytest.mark.parametrize("out, nan", sorted(NAN_CODES))
def test_reciprocal_nan_x_wins_over_a_nan_scale(precision, x_type, out, nan):
    """x * (1 / scale): a NaN x's sign over a NaN scale's, as in the division, at every
    position of a row (vector bodies and tails), per tensor, per axis and blocked, on
    every level and thread count. Rows: -NaN x over a +NaN scale, +NaN over -NaN, finite x
    over a NaN scale (the scale's sign), NaN x over a finite scale."""
    width = 67
    x_bits = np.empty((4, width), np.uint32)
    x_bits[0], x_bits[1] = 0xFFC00000, 0x7FC00000
    x_bits[2] = np.arange(width, dtype=np.float32).view(np.uint32)
    x_bits[3, ::2], x_bits[3, 1::2] = 0xFFC00000, 0x7FC00001
    x = x_bits.view(np.float32).astype(x_type)
    scale_bits = np.array([0x7FC00000, 0xFFC00000, 0xFFC00000, np.float32(0.5).view(np.uint32)], np.uint32)
    scale = scale_bits.view(np.float32).astype(x_type)
    negative, positive = NAN_CODES[(out, nan)]
    want = np.empty((4, width), np.uint8)
    want[0], want[1], want[2] = negative, positive, negative
    want[3, ::2], want[3, 1::2] = negative, positive
    dp = qemu_q.Datapath(scale="reciprocal", scale_precision=precision, nan=nan)
    layouts = {"per axis": dict(y_scale=scale, axis=0),
               "blocked": dict(y_scale=np.repeat(scale[:, None], 3, axis=1), axis=1, block_size=23)}
    level = _kernels.active.level
    try:
        for lv, n in itertools.product(LEVELS, (1, 2)):
            _kernels.use(lv)
            for name, kwargs in layouts.items():
                got = qemu_q.quantize_linear(x, output_dtype=out, datapath=dp, n_threads=n, **kwargs)
                assert got.view(np.uint8).tolist() == want.tolist(), f"{name}, {lv}, n_threads={n}"
            for row in range(4):
                got = qemu_q.quantize_linear(x[row], scale[row], output_dtype=out, datapath=dp, n_threads=n)
                assert got.view(np.uint8).tolist() == want[row].tolist(), f"per tensor, row {row}, {lv}"
    finally:
        _kernels.use(level)

@pytest.mark.parametrize("rule,code", [("min", -128), ("zero", 5), ("max", 127)])
def test_nan_to_integer(rule, code):
    x = np.array([np.nan, -np.nan, 1.0], np.float32)
    got = qemu_q.quantize_linear(x, np.float32(1), np.int8(5), datapath=qemu_q.Datapath(nan_to_integer=rule))
    assert got.tolist() == [code, code, 6]


def test_nan_to_integer_min_is_todays_rule():
    x = np.array([np.nan], np.float32)
    assert qemu_q.quantize_linear(x, np.float32(1), np.uint8(9)).tolist() == [0]
    assert qemu_q.quantize_linear(x, np.float32(1), np.uint8(9),
                                  datapath=qemu_q.Datapath(nan_to_integer="min", rounding="up")).tolist() == [0]


@pytest.mark.parametrize("subnormals", ["keep", "flush_inputs", "flush_outputs", "flush_both"])
@pytest.mark.parametrize("out", ["int8", "float8e4m3fn", "float8e5m2", "float8e4m3fnuz"])
def test_subnormals_every_float16(subnormals, out):
    # rounding "up" so that a flushed tiny input (0) and a kept one (1 or the smallest
    # subnormal) give different codes; scale 1 keeps float16 subnormals as quotients.
    dp = {"subnormals": subnormals, "rounding": "up"}
    got = quantize(ALL_F16, np.float16(1.0), out, dp)
    want = expected(ALL_F16, np.float16(1.0), out, dp, precision="float16")
    check(got, want, f"{subnormals} -> {out}")


def test_flush_policies_differ():
    x = np.array([2.0 ** -20, -(2.0 ** -20), 2.0 ** -8], np.float16)
    s = np.float16(1.0)

    def run(sub, out):
        return bits(qemu_q.quantize_linear(x, s, output_dtype=out,
                                           datapath=qemu_q.Datapath(subnormals=sub, rounding="up"))).tolist()
    # float16 subnormal inputs: kept they round up to 1 (int8) / e4m3fn's smallest subnormal.
    assert run("keep", "int8") == [1, 0, 1]
    assert run("flush_inputs", "int8") == [0, 0, 1]
    assert run("keep", "float8e4m3fn") == [0x01, 0x80, 0x02]
    assert run("flush_outputs", "float8e4m3fn") == [0x00, 0x80, 0x00]
    assert run("flush_inputs", "float8e4m3fn") == [0x00, 0x80, 0x02]


def test_flush_inputs_subnormal_scale():
    x = np.array([1.0, -1.0, 0.0], np.float32)
    s = np.float32(2.0 ** -130)
    got = qemu_q.quantize_linear(x, s, output_dtype="int8", datapath=qemu_q.Datapath(subnormals="flush_inputs"))
    # x / +0: +-inf saturates; 0 / 0 is NaN: the type's minimum.
    assert got.tolist() == [127, -128, -128]


# --------------------------------------------------------- threads and instruction sets

@pytest.mark.parametrize("dp", [
    dict(rounding="stochastic"), dict(rounding="half_away", scale="reciprocal", scale_precision="float32"),
    dict(rounding="to_odd", subnormals="flush_both", nan_to_integer="max"),
])
@pytest.mark.parametrize("out", ["int8", "int4", "float8e5m2", "float4e2m1"])
def test_threads_and_levels(dp, out):
    x = np.random.default_rng(2).standard_normal((3, 70001)).astype(np.float32) * 9
    x[0, :3] = [np.nan, np.inf, 1e-40]
    words = random_words(x.shape) if dp.get("rounding") == "stochastic" else None
    scale = np.array([0.3, 0.7, 1.1], np.float32)
    level = _kernels.active.level
    results = []
    try:
        for lv, n, packed in itertools.product(LEVELS, (1, 2, 5), (False, True)):
            _kernels.use(lv)
            results.append((lv, n, packed, qemu_q.quantize_linear(
                x, scale, output_dtype=out, axis=0, datapath=qemu_q.Datapath(**dp), random_bits=words,
                n_threads=n, packed=packed)))
    finally:
        _kernels.use(level)
    first = {p: r for lv, n, p, r in results if (lv, n) == (LEVELS[0], 1)}
    for lv, n, packed, r in results:
        assert_same_bits(r, first[packed], f"{lv} n_threads={n} packed={packed}")
    assert_same_bits(first[True], qemu_q.pack(first[False]), "packed vs pack()")


# --------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("field,value", [
    ("rounding", "nearest"), ("rounding", None), ("scale", "multiply"), ("scale_precision", "float16"),
    ("nan", "quiet"), ("nan_to_integer", "nan"), ("subnormals", "flush"), ("accumulator", "int64"),
    ("rounding", 3), ("subnormals", True),
])
def test_datapath_refuses(field, value):
    with pytest.raises(ValueError, match=field):
        qemu_q.Datapath(**{field: value})


def test_datapath_is_immutable_and_hashable():
    dp = qemu_q.Datapath(rounding="up")
    with pytest.raises(AttributeError):
        dp.rounding = "down"
    assert hash(dp) == hash(qemu_q.Datapath(rounding="up")) and dp != qemu_q.Datapath()
    with pytest.raises(ValueError, match="scale_precision"):
        qemu_q.Datapath(scale="reciprocal")


def test_bad_datapath_and_random_bits():
    x = np.ones((2, 3), np.float32)
    s = np.float32(1)
    with pytest.raises(TypeError, match="datapath"):
        qemu_q.quantize_linear(x, s, datapath="half_away")
    with pytest.raises(ValueError, match="random_bits"):
        qemu_q.quantize_linear(x, s, datapath=qemu_q.Datapath(rounding="stochastic"))
    with pytest.raises(ValueError, match="random_bits"):
        qemu_q.quantize_linear(x, s, random_bits=np.zeros((2, 3), np.uint32))
    with pytest.raises(TypeError, match="uint32"):
        qemu_q.quantize_linear(x, s, datapath=qemu_q.Datapath(rounding="stochastic"),
                               random_bits=np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="shape"):
        qemu_q.quantize_linear(x, s, datapath=qemu_q.Datapath(rounding="stochastic"),
                               random_bits=np.zeros(6, np.uint32))


def test_random_bits_not_modified_and_strided():
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    words = random_words((202,))
    view = words[::2]
    before = words.copy()
    dp = qemu_q.Datapath(rounding="stochastic")
    got = qemu_q.quantize_linear(x, np.float32(0.25), output_dtype="int8", datapath=dp, random_bits=view)
    assert_same_bits(words, before)
    want = qemu_q.quantize_linear(x, np.float32(0.25), output_dtype="int8", datapath=dp,
                                  random_bits=np.ascontiguousarray(view))
    assert_same_bits(got, want)


def test_dequantize_linear_datapath():
    # DequantizeLinear reads rounding, scale_precision, nan and subnormals
    # (tests/test_datapath_dequantize_cast.py); the fields of steps it has not are ignored.
    x = np.array([-128, -1, 0, 5, 127], np.int8)
    s = np.float32(0.1)
    plain = qemu_q.dequantize_linear(x, s)
    for dp in (None, qemu_q.Datapath(), qemu_q.Datapath(nan="canonical"),
               qemu_q.Datapath(nan_to_integer="zero"),
               qemu_q.Datapath(scale="reciprocal", scale_precision="float32"),
               qemu_q.Datapath(accumulator="int16-saturate")):
        assert_same_bits(qemu_q.dequantize_linear(x, s, datapath=dp), plain)
    with pytest.raises(TypeError, match="datapath"):
        qemu_q.dequantize_linear(x, s, datapath={"rounding": "up"})


def test_datapath_in_the_plan_cache():
    # Two datapaths on the same signature must not share a plan.
    x = np.array([0.5, 1.5, -0.5], np.float32)
    a = qemu_q.quantize_linear(x, np.float32(1), datapath=qemu_q.Datapath(rounding="up"), output_dtype="int8")
    b = qemu_q.quantize_linear(x, np.float32(1), datapath=qemu_q.Datapath(rounding="down"), output_dtype="int8")
    c = qemu_q.quantize_linear(x, np.float32(1), output_dtype="int8")
    assert (a.tolist(), b.tolist(), c.tolist()) == ([1, 2, 0], [0, 1, -1], [0, 2, 0])


@pytest.mark.parametrize("rounding", ["half_away", "to_odd", "down"])
@pytest.mark.parametrize("scale_mode", [("divide", None), ("reciprocal", "float32"), ("reciprocal", "float64")])
def test_int32_x_and_uint8_zero_point(rounding, scale_mode):
    # int32 x has 31 significant bits: the float32 reciprocal product is not exact in
    # double, the kernel's FMA error term decides its rounding.
    rng = np.random.default_rng(4)
    x = rng.integers(-2**31, 2**31, 4000, dtype=np.int64).astype(np.int32)
    x[:6] = [2**31 - 1, -2**31, 0, 1, -1, 3 * 2**24 + 1]
    s = np.float32(1.7e7)
    dp = dict(rounding=rounding, scale=scale_mode[0], scale_precision=scale_mode[1])
    got = qemu_q.quantize_linear(x, s, np.uint8(100), datapath=qemu_q.Datapath(**dp))
    want = []
    for v in x.tolist():
        q = oracle.quotient(Fraction(v), Fraction(float(s)), dp, "float", "int32", "float")
        want.append(oracle.to_integer(q, q < 0, 100, "uint8", dp, 0))
    assert got.tolist() == want


@pytest.mark.parametrize("rounding", ["half_up", "stochastic"])
def test_per_axis_float16(rounding):
    x = ALL_F16[ALL_F16 == ALL_F16][:60000].reshape(3, 20000)  # no NaN: one oracle path
    scale = np.array([0.3, 1.0, 7.5], np.float16)
    words = random_words(x.shape, 9) if rounding == "stochastic" else None
    dp = {"rounding": rounding}
    got = qemu_q.quantize_linear(x, scale, output_dtype="int16", axis=0, datapath=qemu_q.Datapath(**dp),
                                 random_bits=words)
    for row in range(3):
        want = oracle.quantize_array(x[row], float(scale[row]), None, "int16", dp,
                                     words=None if words is None else words[row], precision="float16",
                                     x_type="float16", scale_type="float16")
        check(got[row], want, f"row {row}")
