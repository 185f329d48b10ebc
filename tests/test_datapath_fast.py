"""The datapath's vectorized float32 loops (pyx/_quantize.pyx run_datapath_f32, generated
from pyx/_datapath_loops.pxi.tp): float32 x and scale with the quotient in float32.

- Every rounding mode, scale mode, NaN and subnormal policy, into every integer and small
  float output, against the exact oracle of tests/datapath_oracle.py (Fractions, written
  from docs/semantics.md): ties of the quotient, their float32 neighbours, the clamp and
  saturation boundaries, NaN, +-inf, +-0, float32 subnormals, random bit patterns, at
  lengths that cover the vector loops' heads and tails.
- The same bits as the scalar datapath path (datapath_one, which `FAST_KERNELS = False`
  keeps) on a large random input, per tensor, per axis and blocked.
- The bits independent of the thread count (sizes across the parallel threshold) and of
  the instruction-set level, for every option.
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction

import numpy as np
import pytest

import qemu_q
from qemu_q import _dispatch, _kernels
from support import assert_same_bits, bits

import datapath_oracle as oracle

ROUNDINGS = ["half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd",
             "stochastic"]
# output_dtype -> the oracle's name
OUTPUTS = {
    "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int4": "int4",
    "uint4": "uint4", "int2": "int2", "uint2": "uint2",
    "float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz", "float8e5m2": "float8_e5m2",
    "float8e5m2fnuz": "float8_e5m2fnuz", "float4e2m1": "float4_e2m1fn", "float6e2m3": "float6_e2m3fn",
    "float6e3m2": "float6_e3m2fn",
}
SCALE_MODES = [("divide", None), ("divide", "float32"), ("reciprocal", "float32")]
LEVELS = _kernels.available_levels()
QUANTIZE_MODULE = sys.modules["qemu_q.ops.quantize_linear"]


def random_words(shape, seed=7):
    return np.random.default_rng(seed).integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)


def f32(values) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float64).astype(np.float32)


def hard_inputs(scale: float, seed: int = 0) -> np.ndarray:
    """float32 x whose quotients by `scale` sit on and beside the ties of integers, of each
    small float's mantissa steps (normal and subnormal), on the saturation boundaries, plus
    NaN, infinities, signed zeros, float32 subnormals and random bit patterns."""
    rng = np.random.default_rng(seed)
    s = float(scale)
    halves = np.arange(-300, 301) / 2.0                   # integers and their ties
    steps = np.concatenate([np.arange(-40, 41) / 16.0,    # e4m3/e2m1 mantissa steps and ties
                            np.arange(-40, 41) * 2.0 ** -9 / 2,  # e4m3fn subnormal steps, halves
                            np.arange(-40, 41) * 2.0 ** -17 / 2,  # e5m2fnuz subnormal halves
                            [448, 464, 480, 496, 240, 248, 57344, 61440, 6, 6.5, 7.5, 7.75, 28, 30,
                             127.5, 128.5, -128.5, -129, 255.5, 32767.5, 65535.5, 2.0 ** 20, 2.0 ** 24]])
    quotients = np.concatenate([halves, steps, -steps])
    x = f32(quotients * s)
    neighbours = np.concatenate([np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    specials = f32([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1.4e-45, -1.4e-45,
                    1.17549435e-38, -1.17549435e-38, 3.4e38, -3.4e38, 1e30, -1e30])
    patterns = rng.integers(0, 2**32, 1500, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = f32(rng.standard_normal(1500) * np.exp(rng.uniform(-25, 12, 1500)) * s)
    return np.concatenate([x, neighbours, specials, patterns, scaled])


def quantize(x, scale, out, dp, words=None, **kw):
    return qemu_q.quantize_linear(x, scale, output_dtype=out, datapath=qemu_q.Datapath(**dp),
                                  random_bits=words, **kw)


def check(got, want, what):
    g = bits(got).astype(np.uint32).ravel()
    w = np.asarray(want).astype(np.uint32).ravel()
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ; at {bad[:6].tolist()} "
                           f"got {[hex(v) for v in g[bad[:6]]]} want {[hex(v) for v in w[bad[:6]]]}")


def plan_fields(x, scale, out, datapath, **kw):
    from qemu_q import _coerce
    from qemu_q._validate import signature

    plan = QUANTIZE_MODULE.quantize_plan(
        None, signature(x), signature(scale), signature(None), kw.get("axis", 1), kw.get("block_size", 0),
        1, 0, _coerce.output_dtype(out), "spec", _dispatch.FAST_KERNELS, datapath)
    return dict(plan.kernel_fields)


# ------------------------------------------------------------------ the plan's choice

def test_float32_datapaths_take_the_float32_loops():
    x = np.ones(8, np.float32)
    s = np.float32(0.5)
    for dp in (qemu_q.Datapath(rounding="up"), qemu_q.Datapath(scale="reciprocal", scale_precision="float32"),
               qemu_q.Datapath(subnormals="flush_both"), qemu_q.Datapath(nan_to_integer="max"),
               qemu_q.Datapath(scale_precision="float32", rounding="stochastic")):
        assert plan_fields(x, s, "int8", dp)["datapath_f32"], dp
        assert plan_fields(x, s, "float8e4m3fn", dp)["datapath_f32"], dp
    # The default datapath keeps the ONNX kernels; float64 quotients, float16 x and
    # scales wider than float32 keep datapath_one.
    assert not plan_fields(x, s, "int8", qemu_q.Datapath())["datapath_f32"]
    assert not plan_fields(x, s, "int8", qemu_q.Datapath(scale_precision="float64"))["datapath_f32"]
    assert not plan_fields(x, s, "int8", qemu_q.Datapath(scale="reciprocal", scale_precision="float64"))["datapath_f32"]
    assert not plan_fields(x.astype(np.float16), np.float16(0.5), "int8", qemu_q.Datapath(rounding="up"))["datapath_f32"]
    _dispatch.FAST_KERNELS = False
    try:
        assert not plan_fields(x, s, "int8", qemu_q.Datapath(rounding="up"))["datapath_f32"]
    finally:
        _dispatch.FAST_KERNELS = True


def test_the_config_refuses_a_float32_loop_it_cannot_run():
    module = _dispatch.entry_module(_dispatch.Path.QUANTIZE)
    fields = plan_fields(np.ones(8, np.float32), np.float32(0.5), "int8", qemu_q.Datapath(rounding="up"))
    module.QuantizeConfig(**fields)
    for change in ({"float64_quotient": True}, {"datapath": False}, {"f32_operands": False}):
        with pytest.raises(ValueError, match="datapath_f32"):
            module.QuantizeConfig(**{**fields, **change})


# ----------------------------------------------------------- against the exact oracle

@pytest.mark.parametrize("scale_mode", SCALE_MODES, ids=lambda m: "-".join(filter(None, m)))
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("out", ["int8", "uint8", "int4", "int16", "float8e4m3fn", "float8e5m2fnuz",
                                 "float4e2m1"])
def test_every_rounding_against_the_oracle(out, rounding, scale_mode):
    scale = np.float32(0.37)
    x = hard_inputs(scale)
    words = random_words(x.shape) if rounding == "stochastic" else None
    dp = {"rounding": rounding, "scale": scale_mode[0], "scale_precision": scale_mode[1]}
    zero_point = {"int8": np.int8(-3), "uint8": np.uint8(100), "int16": np.int16(1000)}.get(out)
    got = qemu_q.quantize_linear(x, scale, zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp),
                                 random_bits=words)
    want = oracle.quantize_array(x, float(scale), None if zero_point is None else int(zero_point),
                                 OUTPUTS[out], dp, words=words, x_type="float", scale_type="float")
    check(got, want, f"{out} {dp}")


@pytest.mark.parametrize("out", list(OUTPUTS))
@pytest.mark.parametrize("rounding", ["half_away", "to_odd", "stochastic"])
def test_every_output_type_against_the_oracle(out, rounding):
    scale = np.float32(3.0)  # a quotient's tie falls on an exact division: no rounding of it
    x = hard_inputs(scale, seed=1)
    words = random_words(x.shape, 3) if rounding == "stochastic" else None
    dp = {"rounding": rounding}
    got = quantize(x, scale, out, dp, words)
    want = oracle.quantize_array(x, float(scale), None, OUTPUTS[out], dp, words=words, x_type="float",
                                 scale_type="float")
    check(got, want, f"{out} {rounding}")


@pytest.mark.parametrize("subnormals", ["flush_inputs", "flush_outputs", "flush_both"])
@pytest.mark.parametrize("out", ["int8", "float8e4m3fn", "float8e5m2", "float8e4m3fnuz", "float4e2m1"])
@pytest.mark.parametrize("rounding", ["up", "down", "stochastic"])
def test_subnormal_policies_against_the_oracle(subnormals, out, rounding):
    # Scale 2**-30 (exact): float32 subnormal x become quotients of the small floats'
    # subnormal range, where flushing the input or the result shows.
    scale = np.float32(2.0 ** -30)
    rng = np.random.default_rng(5)
    tiny = rng.integers(1, 0x00800000, 3000, dtype=np.int64).astype(np.uint32).view(np.float32)
    x = np.concatenate([tiny, -tiny, f32(rng.standard_normal(2000) * 2.0 ** -36),
                        f32([0.0, -0.0, 2.0 ** -126, -(2.0 ** -126), np.nan, np.inf])])
    words = random_words(x.shape, 4) if rounding == "stochastic" else None
    dp = {"rounding": rounding, "subnormals": subnormals}
    got = quantize(x, scale, out, dp, words)
    want = oracle.quantize_array(x, float(scale), None, OUTPUTS[out], dp, words=words, x_type="float",
                                 scale_type="float")
    check(got, want, f"{out} {dp}")


@pytest.mark.parametrize("rule", ["min", "zero", "max"])
@pytest.mark.parametrize("out,zero_point", [("int8", np.int8(-5)), ("uint8", np.uint8(7)),
                                            ("int16", np.int16(-300)), ("uint4", np.uint8(3))])
def test_nan_to_integer_against_the_oracle(rule, out, zero_point):
    scale = np.float32(0.37)
    x = hard_inputs(scale, seed=2)
    if out == "uint4":
        zero_point = np.asarray(zero_point).astype(qemu_q.quantize_linear(
            np.float32(0), np.float32(1), output_dtype="uint4").dtype)
    dp = {"nan_to_integer": rule, "rounding": "half_down"}
    got = qemu_q.quantize_linear(x, scale, zero_point, datapath=qemu_q.Datapath(**dp))
    want = oracle.quantize_array(x, float(scale), int(np.asarray(zero_point).astype(np.int64)), OUTPUTS[out],
                                 dp, x_type="float", scale_type="float")
    check(got, want, f"{out} {rule}")
    assert np.isnan(x).sum() >= 2


def test_subnormal_scale_flushed():
    # flush_inputs flushes a subnormal scale too: x / +-0 saturates, 0 / 0 is NaN.
    x = f32([1.0, -1.0, 0.0, 3.0])
    for scale_mode in SCALE_MODES:
        dp = qemu_q.Datapath(subnormals="flush_inputs", scale=scale_mode[0], scale_precision=scale_mode[1],
                             nan_to_integer="zero")
        got = qemu_q.quantize_linear(x, np.float32(2.0 ** -130), np.int8(4), datapath=dp)
        assert got.tolist() == [127, -128, 4, 127], scale_mode
        kept = qemu_q.quantize_linear(x, np.float32(2.0 ** -130), np.int8(4),
                                      datapath=qemu_q.Datapath(scale=scale_mode[0],
                                                               scale_precision=scale_mode[1],
                                                               rounding="up"))
        # kept: x / 2**-130 saturates and 0 / 2**-130 is 0; the reciprocal 2**130 is
        # beyond float32, inf, and 0 * inf is NaN: the "min" rule's -128.
        want = [127, -128, -128 if scale_mode[0] == "reciprocal" else 4, 127]
        assert kept.tolist() == want, scale_mode


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100])
def test_vector_heads_and_tails(n):
    # Every length of a vector body and its remainder, at an unaligned start too: each
    # element's own oracle, whatever its position.
    scale = np.float32(0.25)
    base = f32((np.arange(200) - 100) / 8.0 + 1 / 16)  # quarter-ties of the quotient
    words = random_words(200, 8)
    for offset in (0, 1, 3):
        x = base[offset:offset + n]
        w = words[offset:offset + n]
        for out in ("int8", "float8e4m3fn"):
            for rounding in ("half_up", "stochastic"):
                dp = {"rounding": rounding}
                got = quantize(x, scale, out, dp, w if rounding == "stochastic" else None)
                want = oracle.quantize_array(x, 0.25, None, OUTPUTS[out], dp,
                                             words=w if rounding == "stochastic" else None,
                                             x_type="float", scale_type="float")
                check(got, want, f"n={n} offset={offset} {out} {rounding}")


def test_stochastic_word_alignment_in_the_float32_loops():
    # x / 1 = 2.25 (int8) and 1.0625 (e4m3fn: half its ulp of 1/8 dropped): the dropped
    # fraction, 0x40000000 and 0x80000000 in 32 bits, plus the word carries or not.
    x = f32([2.25, 2.25, -2.25, -2.25] + [1.0625, 1.0625, -1.0625, -1.0625])
    words = np.array([0xBFFFFFFF, 0xC0000000] * 2 + [0x7FFFFFFF, 0x80000000] * 2, np.uint32)
    dp = qemu_q.Datapath(rounding="stochastic")
    got = qemu_q.quantize_linear(x[:4], np.float32(1), output_dtype="int8", datapath=dp, random_bits=words[:4])
    assert got.tolist() == [2, 3, -2, -3]
    got = qemu_q.quantize_linear(x[4:], np.float32(1), output_dtype="float8e4m3fn", datapath=dp,
                                 random_bits=words[4:])
    assert bits(got).tolist() == [0x38, 0x39, 0xB8, 0xB9]
    # The first 32 bits of the fraction, exactly: 2**-32 is one unit (the word 2**32 - 1
    # carries it), 2**-33 and 2**-40 fall below the first bit (nothing carries them); a
    # fraction of 1 - 2**-22, 2**32 - 2**10 units, carries with a word of 2**10, not 2**10 - 1.
    x = f32([2.0 ** -32, 2.0 ** -33, 2.0 ** -40, 3 - 2.0 ** -22, 3 - 2.0 ** -22, -(3 - 2.0 ** -22)])
    words = np.array([0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 1 << 10, (1 << 10) - 1, 1 << 10], np.uint32)
    got = qemu_q.quantize_linear(x, np.float32(1), output_dtype="int8", datapath=dp, random_bits=words)
    assert got.tolist() == [1, 0, 0, 3, 2, -3]


# The integer loops clamp the quotient to [lo - z, hi - z] in float32 BEFORE rounding it
# (a NaN first replaced by a quotient the clamp sends to its rule's code): what the clamp
# could change is the code of a quotient on or beside those bounds, at any zero point.
INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
                  "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1)}


def zero_points(out):
    lo, hi = INTEGER_RANGES[out]
    return sorted({lo, lo + 1, (lo + hi) // 2, 0 if lo < 0 else lo + 2, hi - 1, hi})


def boundary_quotients(out, z):
    """Quotients on the clamp's bounds lo - z and hi - z, a quarter, a half (the ties) and
    whole units either side, their float32 neighbours, and beyond the range."""
    lo, hi = INTEGER_RANGES[out]
    q = np.concatenate([[bound + k / 4 for k in range(-9, 10)] for bound in (lo - z, hi - z)]
                       + [[0.0, -0.0, 0.5, -0.5, 1e6, -1e6]])
    q = f32(q)
    return np.concatenate([q, np.nextafter(q, np.float32(np.inf)), np.nextafter(q, np.float32(-np.inf)),
                           f32([np.nan, -np.nan, np.inf, -np.inf])])


def zero_point_array(out, values):
    dtype = qemu_q.quantize_linear(np.float32(0), np.float32(1), output_dtype=out).dtype
    return np.asarray(values, dtype=np.int64).astype(dtype)


@pytest.mark.parametrize("rule", ["min", "zero", "max"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("out", list(INTEGER_RANGES))
def test_the_clamp_before_rounding_at_every_zero_point(out, rounding, rule):
    # Per tensor (one zero point per call) and per element (per axis along the last axis,
    # one zero point per column: the loops' `vary` variants), divide and reciprocal, with
    # a power-of-two scale (the quotient is x exactly) and 0.37 (x is the quotient's
    # float32 product, itself rounded).
    zs = zero_points(out)
    rows = max(boundary_quotients(out, z).size for z in zs)
    for scale, scale_mode in ((np.float32(0.5), ("divide", None)), (np.float32(0.37), ("reciprocal", "float32"))):
        dp = {"rounding": rounding, "nan_to_integer": rule, "scale": scale_mode[0],
              "scale_precision": scale_mode[1]}
        x = np.empty((rows, len(zs)), np.float32)
        for j, z in enumerate(zs):
            column = f32(boundary_quotients(out, z).astype(np.float64) * float(scale))
            x[:, j] = np.resize(column, rows)
        words = random_words(x.shape, 30) if rounding == "stochastic" else None
        want = np.stack([oracle.quantize_array(x[:, j], float(scale), z, OUTPUTS[out], dp,
                                               words=None if words is None else words[:, j],
                                               x_type="float", scale_type="float")
                         for j, z in enumerate(zs)], axis=1)
        per_element = qemu_q.quantize_linear(x, f32([scale] * len(zs)), zero_point_array(out, zs), axis=1,
                                             datapath=qemu_q.Datapath(**dp), random_bits=words)
        check(per_element, want, f"{out} {dp} per element")
        for j, z in enumerate(zs):
            column = np.ascontiguousarray(x[:, j])
            got = qemu_q.quantize_linear(column, scale, zero_point_array(out, z), datapath=qemu_q.Datapath(**dp),
                                         random_bits=None if words is None else np.ascontiguousarray(words[:, j]))
            check(got, want[:, j], f"{out} {dp} zero point {z}")


def test_the_float32_roundings_at_their_identities():
    # The loops' roundings (datapath_round_f32_* in _codecs.pxd) rest on float32
    # identities near 1/2: RNE(q) and the remainder q - RNE(q) for half_up/half_down/
    # down/up, q + copysign(1/2 - 2**-25, q) for half_away (1/2 - 2**-25 must stay at 0),
    # trunc and its exactness for to_odd. One float32 in about 1100 of [1/4, 4) and of
    # [2**14, 2**16), the floats beside 1/2, 3/2 and 65535, random ones, both signs,
    # divided by 1, against exact Python integers.
    def exact(mode, v):
        f = Fraction(v)
        down = f.numerator // f.denominator
        rest = f - down
        if rest == 0:
            return down
        if mode == "half_up":
            return down + (rest >= Fraction(1, 2))
        if mode == "half_down":
            return down + (rest > Fraction(1, 2))
        if mode == "half_away":
            up = rest > Fraction(1, 2) or (rest == Fraction(1, 2) and f > 0)
            return down + up
        if mode == "down":
            return down
        if mode == "up":
            return down + 1
        if mode == "to_odd":
            return down if down % 2 else down + 1
        raise AssertionError(mode)

    # uint16 codes: zero point 0 for the positive quotients, 65535 for the negative ones,
    # so that no code of [-65535, 65535] saturates.
    rng = np.random.default_rng(31)
    b = np.concatenate([np.arange(0x3E800000, 0x40800000, 1163, dtype=np.uint32),
                        np.arange(0x46800000, 0x47800000, 1061, dtype=np.uint32),
                        np.uint32([0x3EFFFFFF, 0x3F000000, 0x3F000001, 0x3F7FFFFF, 0x3FBFFFFF, 0x3FC00000,
                                   0x3FC00001, 0x477FFF80, 0x477FFF7F, 0x477FFF00]),
                        rng.integers(1, 0x477FFF00, 4000, dtype=np.uint64).astype(np.uint32)])
    x = b.view(np.float32)
    values = x.astype(np.float64).tolist()
    for mode in ("half_up", "half_down", "half_away", "down", "up", "to_odd"):
        dp = qemu_q.Datapath(rounding=mode)
        got = qemu_q.quantize_linear(x, np.float32(1), np.uint16(0), datapath=dp)
        check(got, [min(exact(mode, v), 65535) for v in values], f"{mode} positive")
        got = qemu_q.quantize_linear(-x, np.float32(1), np.uint16(65535), datapath=dp)
        check(got, [max(exact(mode, -v) + 65535, 0) for v in values], f"{mode} negative")


# ------------------------------------------------- the same bits as the scalar datapath

ALL_OPTIONS = [dict(rounding=r, scale=sc, scale_precision=sp, subnormals=sub, nan_to_integer=nz)
               for r in ROUNDINGS for sc, sp in SCALE_MODES for sub in ("keep", "flush_both")
               for nz in ("min", "zero", "max")]


def _reference(fn):
    _dispatch.FAST_KERNELS = False
    try:
        return fn()
    finally:
        _dispatch.FAST_KERNELS = True


def _mixed_input(shape, seed):
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    x = f32(rng.standard_normal(size) * np.exp(rng.uniform(-30, 14, size)))
    x[::7] = rng.integers(0, 2**32, x[::7].size, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[::11] = f32((rng.integers(-300, 300, x[::11].size) + 0.5) * 0.37)
    x[:8] = f32([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-40, -1e-40, 3e38])
    return x.reshape(shape)


@pytest.mark.parametrize("out", ["int8", "uint16", "int4", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_same_bits_as_the_scalar_datapath(out):
    x = _mixed_input((3, 20011), 11)
    words = random_words(x.shape, 12)
    for dp in ALL_OPTIONS:
        if dp["nan_to_integer"] != "min" and out.startswith("float"):
            continue
        w = words if dp["rounding"] == "stochastic" else None
        for scale, kw in ((np.float32(0.37), {}), (np.float32(3e-39), {}), (np.float32(1e30), {}),
                          (np.array([0.3, 7.0, 2.0 ** -20], np.float32), {"axis": 0})):
            def run():
                return quantize(x, scale, out, dp, w, **kw)
            assert_same_bits(run(), _reference(run), f"{out} {dp} {kw}")


@pytest.mark.parametrize("layout", ["per_axis_last", "per_axis_first", "blocked_last", "blocked_first",
                                    "blocked_odd"])
@pytest.mark.parametrize("out", ["int8", "float8e4m3fn"])
def test_same_bits_in_every_layout(layout, out):
    # Per axis along the last axis and blocked along the first give per-element scales
    # (the loops' `vary` variants); the others one scale per run.
    rng = np.random.default_rng(13)
    x = _mixed_input((64, 200), 14)
    if layout == "per_axis_last":
        scale, kw = f32(rng.uniform(0.05, 3, 200)), {"axis": 1}
    elif layout == "per_axis_first":
        scale, kw = f32(rng.uniform(0.05, 3, 64)), {"axis": 0}
    elif layout == "blocked_last":
        scale, kw = f32(rng.uniform(0.05, 3, (64, 200 // 8))), {"axis": 1, "block_size": 8}
    elif layout == "blocked_first":
        scale, kw = f32(rng.uniform(0.05, 3, (64 // 16, 200))), {"axis": 0, "block_size": 16}
    else:
        scale, kw = f32(rng.uniform(0.05, 3, (64, 200 // 32 + 1))), {"axis": 1, "block_size": 32}
    words = random_words(x.shape, 15)
    for rounding, sc in itertools.product(ROUNDINGS, SCALE_MODES):
        dp = dict(rounding=rounding, scale=sc[0], scale_precision=sc[1], subnormals="flush_both")
        w = words if rounding == "stochastic" else None

        def run():
            return quantize(x, scale, out, dp, w, **kw)
        assert_same_bits(run(), _reference(run), f"{layout} {out} {dp}")


# ---------------------------------------------- threads and instruction-set levels

@pytest.mark.parametrize("out", ["int8", "int16", "int4", "float8e4m3fn", "float8e5m2fnuz", "float4e2m1"])
def test_every_option_independent_of_threads_and_levels(out):
    # 3 x 70001 elements: above the one-thread threshold, tasks that split rows; per axis
    # along the first axis (one scale per run) and along the last (one per element).
    x = _mixed_input((3, 70001), 21)
    words = random_words(x.shape, 22)
    level = _kernels.active.level
    options = [dp for dp in ALL_OPTIONS if dp["nan_to_integer"] == "min" or not out.startswith("float")]
    options = options[::3] + [dict(rounding=r) for r in ROUNDINGS] + [
        dict(subnormals=s) for s in ("flush_inputs", "flush_outputs", "flush_both")] + [
        dict(scale="reciprocal", scale_precision="float32"), dict(scale_precision="float32")]
    scales = ((np.array([0.3, 0.7, 1.1], np.float32), {"axis": 0}),
              (f32(np.linspace(0.1, 5, 70001)), {"axis": 1}))
    try:
        for dp, (scale, kw) in itertools.product(options, scales):
            w = words if dp.get("rounding") == "stochastic" else None
            first = None
            for lv, n in itertools.product(LEVELS, (1, 2, 3)):
                _kernels.use(lv)
                assert _kernels.active.level == lv
                got = quantize(x, scale, out, dp, w, n_threads=n, **kw)
                if first is None:
                    first = got
                else:
                    assert_same_bits(got, first, f"{out} {dp} {kw} level {lv} n_threads={n}")
    finally:
        _kernels.use(level)


def test_the_levels_run_their_own_float32_loops():
    # The level comparison above means something only if each level's module runs the
    # float32 loops: the same plan's config, built by each level's module, says so.
    level = _kernels.active.level
    x = np.ones(8, np.float32)
    fields = plan_fields(x, np.float32(0.5), "int8", qemu_q.Datapath(rounding="down"))
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            module = _dispatch.entry_module(_dispatch.Path.QUANTIZE)
            assert lv == "baseline" or lv.replace("-", "_") in module.__name__
            module.QuantizeConfig(**fields)
            got = qemu_q.quantize_linear(f32([2.5, -2.5, 0.5]), np.float32(1), output_dtype="int8",
                                         datapath=qemu_q.Datapath(rounding="down"))
            assert got.tolist() == [2, -3, 0], lv
    finally:
        _kernels.use(level)


# ------------------------- per-axis and blocked layouts: the buffered feeding of the loops
#
# quantize_datapath_f32 (pyx/_quantize.pyx) feeds the float32 loops long runs: short runs
# (blocks, short rows) gathered with their parameters spread out per element in L1
# buffers, the parameters converted (scale flushed, reciprocal, zero point) once per
# parameter into a window of 4096. Sizes below cross its constants: runs of 256 and more
# are called on their own, at most 1024 elements per call, 4096 parameters per window.

def _quantize_module():
    return _dispatch.entry_module(_dispatch.Path.QUANTIZE)


def _feeds(enabled):
    # set_datapath_feed on every level's module (each level is its own build of the kernels)
    level = _kernels.active.level
    previous = {}
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            previous[lv] = _quantize_module().set_datapath_feed(enabled)
    finally:
        _kernels.use(level)
    return previous


def _pieces(fn):
    # the same call on the feeding before the buffered one (the general cursor's pieces)
    _feeds(False)
    try:
        return fn()
    finally:
        _feeds(True)


def _per_element(params, shape, axis, block_size):
    # The parameter of every element, written from the operator's definition: per axis,
    # params[j] for axis index j; blocked, params[..., j // block_size, ...].
    params = np.asarray(params)
    if block_size:
        return np.take(params, np.arange(shape[axis]) // block_size, axis=axis)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(params.reshape(view), shape)


def _oracle_by_parameter(x, scale, zero_point, out, dp, words, axis, block_size):
    # The exact oracle element by element, each with its own scale, zero point and word,
    # grouped by (scale, zero point) for the oracle's one-scale calls.
    s = _per_element(scale, x.shape, axis, block_size).ravel()
    z = (np.zeros(x.size, np.int64) if zero_point is None
         else _per_element(np.asarray(zero_point).astype(np.int64), x.shape, axis, block_size).ravel())
    flat = x.ravel()
    w = None if words is None else words.ravel()
    want = np.empty(x.size, np.uint32)
    keys = np.stack([s.astype(np.float64), z.astype(np.float64)], 1)
    for key in np.unique(keys, axis=0):
        at = np.flatnonzero((keys[:, 0] == key[0]) & (keys[:, 1] == key[1]))
        want[at] = oracle.quantize_array(flat[at], float(key[0]), None if zero_point is None else int(key[1]),
                                         OUTPUTS[out], dp, words=None if w is None else w[at],
                                         x_type="float", scale_type="float")
    return want.reshape(x.shape)


def _layout_parameters(shape, axis, block_size, rng, pool=None):
    # scales of the layout: from a small pool (a few oracle calls), else random
    n = -(-shape[axis] // block_size) if block_size else shape[axis]
    pshape = list(shape) if block_size else [shape[axis]]
    if block_size:
        pshape[axis] = n
    if pool is not None:
        return f32(np.asarray(pool)[rng.integers(0, len(pool), pshape)])
    return f32(rng.uniform(0.05, 3, pshape))


def _config_feed(x, scale, out, dp, **kw):
    return _quantize_module().QuantizeConfig(**plan_fields(x, scale, out, dp, **kw)).datapath_feed


def test_per_axis_and_blocked_datapaths_take_the_buffered_feed():
    # The hook the comparisons below rely on: the feeding the kernel dispatches on.
    x = np.ones((6, 8, 10), np.float32)
    dp = qemu_q.Datapath(rounding="half_away")
    for out in ("int8", "float8e4m3fn"):
        for axis in (0, 1, 2):
            assert _config_feed(x, np.ones(x.shape[axis], np.float32), out, dp, axis=axis) == "buffered"
            shape = list(x.shape)
            shape[axis] = (shape[axis] + 2) // 3
            assert _config_feed(x, np.ones(shape, np.float32), out, dp, axis=axis, block_size=3) == "buffered"
        wide = np.ones((3, 4, 64), np.float32)
        assert _config_feed(wide, np.ones((3, 4, 2), np.float32), out, dp, axis=2, block_size=32) == "whole blocks"
        assert _config_feed(wide, np.ones((3, 1, 64), np.float32), out, dp, axis=1, block_size=4) == "buffered"
        # per tensor: one run, fed in DATAPATH_PIECE chunks
        assert _config_feed(x, np.float32(0.5), out, dp) == "buffered"
        # the default datapath and the scalar datapath_one keep the cursor's pieces
        assert _config_feed(x, np.ones(10, np.float32), out, qemu_q.Datapath(), axis=2) == "pieces"
        # float64 quotients: the float32-remainder staging's own buffered feeding
        # (tests/test_datapath_f64.py)
        assert _config_feed(x, np.ones(10, np.float32), out, qemu_q.Datapath(scale_precision="float64"),
                            axis=2) == "staged buffered"
    previous = _feeds(False)
    try:
        assert all(previous.values())
        assert _config_feed(x, np.ones(10, np.float32), "int8", dp, axis=2) == "pieces"
    finally:
        _feeds(True)


BLOCK_CASES = [
    # (shape, axis, block_size): blocks of 1, 2, 3, 31, 32, 33, 64, 1024 along the last axis
    # and along others, ragged last blocks, rows shorter and longer than the 256-element
    # direct run and the 1024-element call
    ((40, 96), 1, 1), ((40, 96), 1, 2), ((40, 97), 1, 3), ((30, 100), 1, 31), ((30, 128), 1, 32),
    ((30, 100), 1, 33), ((20, 200), 1, 64), ((3, 2500), 1, 1024), ((5, 1000), 1, 1000),
    ((96, 40), 0, 1), ((95, 40), 0, 2), ((97, 33), 0, 3), ((70, 30), 0, 31), ((64, 40), 0, 32),
    ((70, 30), 0, 33), ((130, 20), 0, 64), ((1100, 3), 0, 1024),
    ((4, 65, 7), 1, 32), ((3, 9, 300), 1, 4), ((2, 3, 1030), 1, 2), ((2, 5, 3), 2, 2),
    # whole blocks of 16, 32, 64, 128 tiling the rows (their own feeding), rows across the
    # 1024-element pieces
    ((40, 96), 1, 16), ((3, 2048), 1, 32), ((7, 320), 1, 64), ((5, 1280), 1, 128), ((2, 3, 128), 2, 32),
]
BLOCK_OPTIONS = [dict(rounding="half_even", scale_precision="float32", nan_to_integer="zero"),
                 dict(rounding="half_away"), dict(rounding="down", subnormals="flush_both"),
                 dict(rounding="stochastic", scale="reciprocal", scale_precision="float32"),
                 dict(rounding="to_odd", scale="reciprocal", scale_precision="float32",
                      subnormals="flush_inputs", nan_to_integer="max")]


# uint16 codes (the loops' other storage) on every third case: their loop bodies are the
# int8 ones, and the int8 and float8 runs cover every case
BLOCK_RUNS = [(case, out) for i, case in enumerate(BLOCK_CASES)
              for out in (("int8", "uint16", "float8e4m3fn") if i % 3 == 0 else ("int8", "float8e4m3fn"))]


@pytest.mark.parametrize("shape,axis,block_size,out,run", [case + (out, i) for i, (case, out) in enumerate(BLOCK_RUNS)],
                         ids=lambda v: str(v).replace(" ", ""))
def test_blocked_buffered_against_the_oracle(shape, axis, block_size, out, run):
    rng = np.random.default_rng(sum(shape) + axis + block_size)
    pool = [0.37, 0.25, 3.0, 2.0 ** -20, 1.5]
    scale = _layout_parameters(shape, axis, block_size, rng, pool)
    zero_point = None
    if out != "float8e4m3fn":
        dtype = np.int8 if out == "int8" else np.uint16
        zero_point = np.asarray(rng.choice([-3, 5, 0], scale.shape) if out == "int8"
                                else rng.choice([0, 1000], scale.shape)).astype(dtype)
    x = _mixed_input(shape, 31)
    words = random_words(shape, 32)
    whole = axis == len(shape) - 1 and block_size in (16, 32, 64, 128) and shape[axis] % block_size == 0
    assert _config_feed(x, scale, out, qemu_q.Datapath(rounding="up"), axis=axis,
                        block_size=block_size) == ("whole blocks" if whole else "buffered")
    # three of the five options per run, in turn: each option meets every layout and
    # output over the runs
    for dp in [BLOCK_OPTIONS[(run + k) % len(BLOCK_OPTIONS)] for k in range(3)]:
        if out.startswith("float") and dp.get("nan_to_integer"):
            dp = {k: v for k, v in dp.items() if k != "nan_to_integer"}
        w = words if dp["rounding"] == "stochastic" else None

        def run():
            return qemu_q.quantize_linear(x, scale, zero_point, output_dtype=out, axis=axis, block_size=block_size,
                                          datapath=qemu_q.Datapath(**dp), random_bits=w)
        got = run()
        check(got, _oracle_by_parameter(x, scale, zero_point, out, dp, w, axis, block_size), f"{out} {dp}")
        assert_same_bits(got, _reference(run), f"{out} {dp} vs datapath_one")
        assert_same_bits(got, _pieces(run), f"{out} {dp} vs the cursor's pieces")


@pytest.mark.parametrize("out", ["int8", "int4", "float8e4m3fn", "float4e2m1"])
@pytest.mark.parametrize("shape", [(3, 5, 1500), (2, 700, 6), (1300, 4, 2), (2, 5000), (5000, 2)],
                         ids=lambda v: "x".join(map(str, v)))
def test_per_axis_buffered_on_every_axis(shape, out):
    # Every axis: the last (per-element parameters from the window: rows of 2 to 5000,
    # across its 4096), the others (one parameter per run of 2 to 7500 elements).
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    x = _mixed_input(shape, 41)
    words = random_words(shape, 42)
    for axis in range(len(shape)):
        scale = f32(rng.uniform(0.05, 3, shape[axis]))
        zero_point = None
        if out == "int8":
            zero_point = rng.integers(-10, 10, shape[axis]).astype(np.int8)
        for dp in BLOCK_OPTIONS:
            if out.startswith("float") and dp.get("nan_to_integer"):
                dp = {k: v for k, v in dp.items() if k != "nan_to_integer"}
            w = words if dp["rounding"] == "stochastic" else None

            def run():
                return qemu_q.quantize_linear(x, scale, zero_point, output_dtype=out, axis=axis,
                                              datapath=qemu_q.Datapath(**dp), random_bits=w)
            got = run()
            assert _config_feed(x, scale, out, qemu_q.Datapath(**dp), axis=axis) == "buffered"
            assert_same_bits(got, _reference(run), f"{shape} axis {axis} {out} {dp} vs datapath_one")
            assert_same_bits(got, _pieces(run), f"{shape} axis {axis} {out} {dp} vs the cursor's pieces")
            if x.shape[axis] <= 1500 and dp["rounding"] in ("half_away", "stochastic"):
                # the oracle on a slice of whole rows (every parameter), not every element
                rows = tuple(slice(0, 2) if a != axis else slice(None) for a in range(len(shape)))
                sub = np.ascontiguousarray(x[rows])
                ws = None if w is None else np.ascontiguousarray(w[rows])
                got_sub = qemu_q.quantize_linear(sub, scale, zero_point, output_dtype=out, axis=axis,
                                                 datapath=qemu_q.Datapath(**dp), random_bits=ws)
                check(got_sub, _oracle_by_parameter(sub, scale, zero_point, out, dp, ws, axis, 0),
                      f"{shape} axis {axis} {out} {dp} oracle")


def test_buffered_stochastic_words_are_each_elements_own():
    # Blocks of 3 along the last axis and per axis along it: x / s = 2.25 everywhere, so
    # the word alone decides each code (0xBFFFFFFF stays at 2, 0xC0000000 carries to 3);
    # a word taken from another element (a buffer offset off by one, a block's first
    # word) would show in the pattern.
    shape = (50, 301)
    rng = np.random.default_rng(51)
    carries = rng.integers(0, 2, shape).astype(bool)
    words = np.where(carries, np.uint32(0xC0000000), np.uint32(0xBFFFFFFF)).astype(np.uint32)
    want = np.where(carries, 3, 2).astype(np.int8)
    dp = qemu_q.Datapath(rounding="stochastic")
    for scale, kw in ((np.full((50, 101), 0.5, np.float32), {"axis": 1, "block_size": 3}),
                      (np.full((17, 301), 0.5, np.float32), {"axis": 0, "block_size": 3}),
                      (np.full(301, 0.5, np.float32), {"axis": 1}),
                      (np.full(50, 0.5, np.float32), {"axis": 0})):
        x = np.full(shape, 1.125, np.float32)
        for n in (1, 2, 3):
            got = qemu_q.quantize_linear(x, scale, output_dtype="int8", datapath=dp, random_bits=words,
                                         n_threads=n, **kw)
            assert_same_bits(got, want, f"{kw} n_threads={n}")


@pytest.mark.parametrize("out", ["int8", "uint16", "int4", "float8e4m3fn", "float6e3m2"])
def test_buffered_feed_independent_of_threads_and_levels(out):
    # Above the one-thread threshold and across tasks that cut blocks and rows: blocked 32
    # and 33 along the last axis (ragged), 32 and 128 tiling the rows (whole blocks), 7
    # along the first, per axis on both axes; every thread count and level against
    # datapath_one and the cursor's pieces.
    inputs = {shape: (_mixed_input(shape, 61), random_words(shape, 62)) for shape in ((70, 3001), (50, 4096))}
    rng = np.random.default_rng(63)
    layouts = [((70, 3001), 1, 32), ((70, 3001), 1, 33), ((70, 3001), 0, 7), ((70, 3001), 0, 0),
               ((70, 3001), 1, 0), ((50, 4096), 1, 32), ((50, 4096), 1, 128)]
    level = _kernels.active.level
    options = [dict(rounding=r) for r in ROUNDINGS] + BLOCK_OPTIONS + [dict(subnormals="flush_outputs")]
    try:
        for (shape, axis, block_size), dp in itertools.product(layouts, options):
            x, words = inputs[shape]
            scale = _layout_parameters(x.shape, axis, block_size, rng)
            if out.startswith("float") and dp.get("nan_to_integer"):
                dp = {k: v for k, v in dp.items() if k != "nan_to_integer"}
            w = words if dp.get("rounding") == "stochastic" else None

            def run(n=1):
                return quantize(x, scale, out, dp, w, axis=axis, block_size=block_size, n_threads=n)
            first = _reference(run)
            assert_same_bits(_pieces(run), first, f"{out} {dp} {axis} {block_size} pieces")
            for lv, n in itertools.product(LEVELS, (1, 2, 3)):
                _kernels.use(lv)
                assert _kernels.active.level == lv
                assert_same_bits(run(n), first, f"{out} {dp} axis {axis} block {block_size} level {lv} n={n}")
    finally:
        _kernels.use(level)
