"""The datapath's staged loops (pyx/_quantize.pyx run_datapath_wide, generated from
pyx/_datapath_loops_f64.pxi.tp): float16/bfloat16 x, their own division precision
(QuantizeLinear-19/21 with float16/bfloat16 x and scale), and float64 quotients
(scale_precision="float64", divide and reciprocal) for float32, float16, bfloat16 and int32
x, staged into a float32 buffer and finished by the float32 loops.

- Against the exact oracle of tests/datapath_oracle.py: float64 quotients on ties and their
  neighbours (float32 x, and int32 x whose double quotients carry bits beyond float32's
  24, right beside the ties of integers and of the float8 mantissas), boundaries, NaN,
  inf, zeros, subnormals, int32 extremes.
- Every float16 and bfloat16 code (65536 each) for several scales and every rounding
  mode, into int8 and float8e4m3fn, the same bits as the scalar datapath_one (which
  `FAST_KERNELS = False` keeps); one scale of each also against the oracle.
- The double rounding the half-precision stage relies on, checked on its own: the float32
  quotient rounded to float16/bfloat16 is the exact quotient rounded once, for every code.
- Piece and vector tails, per-element parameters, 1-3 threads, every level.
- The plan's datapath_wide field, and the config's refusals.
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import _dispatch, _kernels
from qemu_q._dtypes import FMT_FLOAT16, FMT_FLOAT32
from support import assert_same_bits, bits

import datapath_oracle as oracle
from test_datapath_fast import OUTPUTS, f32, hard_inputs, random_words

ROUNDINGS = ["half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd"]
ALL_ROUNDINGS = ROUNDINGS + ["stochastic"]
# Integer codes of float32 x under one reciprocal in float64 take the direct double loops
# (reciprocal_f64_integer_<mode>) in these modes: nothing staged.
DIRECT_RECIPROCAL_MODES = ("half_even", "half_away", "toward_zero")
F64 = [("divide", "float64"), ("reciprocal", "float64")]
LEVELS = _kernels.available_levels()
QUANTIZE_MODULE = sys.modules["qemu_q.ops.quantize_linear"]
WIDE_NONE, WIDE_X, WIDE_HALF, WIDE_F64 = 0, 1, 2, 3
BF16 = ml_dtypes.bfloat16


def plan_fields(x, scale, out, datapath, opset=None, **kw):
    from qemu_q import _coerce
    from qemu_q._validate import signature

    plan = QUANTIZE_MODULE.quantize_plan(
        opset, signature(x), signature(scale), signature(None), kw.get("axis", 1), kw.get("block_size", 0),
        1, 0, _coerce.output_dtype(out), "spec", _dispatch.FAST_KERNELS, datapath)
    return dict(plan.kernel_fields)


def reference(fn):
    _dispatch.FAST_KERNELS = False
    try:
        return fn()
    finally:
        _dispatch.FAST_KERNELS = True


def check(got, want, what):
    g = bits(got).astype(np.uint32).ravel()
    w = np.asarray(want).astype(np.uint32).ravel()
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ; at {bad[:6].tolist()} "
                           f"got {[hex(v) for v in g[bad[:6]]]} want {[hex(v) for v in w[bad[:6]]]}")


def every_code(dtype) -> np.ndarray:
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype)


# ------------------------------------------------------------------ the plan's choice

def test_the_plan_picks_the_staged_loops():
    x32, s32 = np.ones(8, np.float32), np.float32(0.5)
    x16, s16 = x32.astype(np.float16), np.float16(0.5)
    xb, sb = x32.astype(BF16), BF16(0.5)
    xi = np.ones(8, np.int32)
    up = qemu_q.Datapath(rounding="up")
    for x, s in ((x32, s32), (x16, s16), (xb, sb), (xi, s32)):
        for sc in ("divide", "reciprocal"):
            dp = qemu_q.Datapath(rounding="half_away", scale=sc, scale_precision="float64")
            for out in ("int8", "float8e4m3fn", "uint16"):
                fields = plan_fields(x, s, out, dp)
                assert fields["datapath_wide"] == WIDE_F64 and not fields["datapath_f32"], (x.dtype, sc, out)
        # stochastic needs the double's 32 dropped bits: datapath_one
        dp = qemu_q.Datapath(rounding="stochastic", scale_precision="float64")
        assert plan_fields(x, s, "int8", dp)["datapath_wide"] == WIDE_NONE
    # float16/bfloat16 x with a float32 quotient: widened (any rounding, stochastic too)
    for x, s in ((x16, s16), (xb, sb), (x16, s32), (xb, s32)):
        for dp in (qemu_q.Datapath(rounding="stochastic", scale_precision="float32"),
                   qemu_q.Datapath(scale="reciprocal", scale_precision="float32", subnormals="flush_both")):
            assert plan_fields(x, s, "int8", dp)["datapath_wide"] == WIDE_X, (x.dtype, s, dp)
    # float16 x and scale at 19/21: T1 is the division precision
    assert plan_fields(x16, s16, "int8", up, opset=21)["datapath_wide"] == WIDE_HALF
    assert plan_fields(xb, sb, "float8e4m3fn", up, opset=21)["datapath_wide"] == WIDE_HALF
    assert plan_fields(x16, s16, "int8", up, opset=21)["precision"] == FMT_FLOAT16
    # float32 x: the float32 loops themselves; the default datapath: the ONNX kernels
    assert plan_fields(x32, s32, "int8", up)["datapath_wide"] == WIDE_NONE
    assert plan_fields(x32, s32, "int8", up)["datapath_f32"]
    assert plan_fields(x16, s16, "int8", qemu_q.Datapath())["datapath_wide"] == WIDE_NONE
    # not served: int32 x with a float32 quotient (31-bit x), family minifloats
    assert plan_fields(xi, s32, "int8", up)["datapath_wide"] == WIDE_NONE
    e3m2 = qemu_q.minifloat_type(3, 2)
    assert plan_fields(x32, s32, e3m2, qemu_q.Datapath(scale_precision="float64"))["datapath_wide"] == WIDE_NONE
    _dispatch.FAST_KERNELS = False
    try:
        assert plan_fields(x16, s16, "int8", up, opset=21)["datapath_wide"] == WIDE_NONE
    finally:
        _dispatch.FAST_KERNELS = True


def test_the_config_refuses_a_staged_loop_it_cannot_run():
    module = _dispatch.entry_module(_dispatch.Path.QUANTIZE)
    f64 = plan_fields(np.ones(8, np.float32), np.float32(0.5), "int8",
                      qemu_q.Datapath(scale_precision="float64", rounding="up"))
    module.QuantizeConfig(**f64)
    for change in ({"datapath_wide": 7}, {"datapath_wide": WIDE_X}, {"datapath_wide": WIDE_HALF},
                   {"float64_quotient": False}, {"datapath": False}, {"rounding": 8}):
        with pytest.raises(ValueError, match="datapath_wide"):
            module.QuantizeConfig(**{**f64, **change})
    half = plan_fields(np.ones(8, np.float16), np.float16(0.5), "int8", qemu_q.Datapath(rounding="up"), opset=21)
    module.QuantizeConfig(**half)
    for change in ({"precision": FMT_FLOAT32}, {"reciprocal": True}):
        with pytest.raises(ValueError, match="datapath_wide"):
            module.QuantizeConfig(**{**half, **change})


# ------------------------------------------------- float64 quotients against the oracle

def int32_near_ties(seed=0) -> tuple[np.ndarray, float]:
    """int32 x over the scale 2**20: quotients with 31 significant bits on, one and a few
    units of 2**-20 beside the ties of integers and of e4m3/e5m2/e2m1 mantissa steps (where a
    float32 quotient would have rounded onto the tie), their negatives, the extremes."""
    rng = np.random.default_rng(seed)
    ties = np.concatenate([np.arange(-300, 301) + 0.5, np.arange(-80, 81) / 16 + 1 / 32,
                           np.arange(-80, 81) / 8 + 1 / 16, [464.0, 240.0, 57344.0 + 4096, 127.5, 255.5,
                                                               32767.5, 65535.5, 7.5, 15.5, 1.5]])
    base = np.round(ties * 2.0 ** 20).astype(np.int64)
    x = np.concatenate([base + d for d in (-3, -1, 0, 1, 3)] + [-base - 1, -base + 1])
    extremes = [2**31 - 1, -(2**31), -(2**31) + 1, 2**24 + 1, -(2**24) - 1, 0, 1, -1]
    x = np.concatenate([x, extremes, rng.integers(-(2**31), 2**31, 600)])
    return np.clip(x, -(2**31), 2**31 - 1).astype(np.int32), 2.0 ** 20


@pytest.mark.parametrize("scale_mode", F64, ids=lambda m: m[0])
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("out", ["int8", "uint8", "int16", "int4", "float8e4m3fn", "float8e5m2",
                                 "float8e4m3fnuz", "float4e2m1"])
def test_float64_quotients_against_the_oracle(out, rounding, scale_mode):
    dp = {"rounding": rounding, "scale": scale_mode[0], "scale_precision": "float64"}
    zero_point = {"int8": np.int8(-3), "uint8": np.uint8(100), "int16": np.int16(1000)}.get(out)
    zp = None if zero_point is None else int(zero_point)
    # float32 x by a scale whose quotients are inexact in float32 and in double
    scale = np.float32(0.37)
    x = hard_inputs(scale)
    got = qemu_q.quantize_linear(x, scale, zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp))
    want = oracle.quantize_array(x, float(scale), zp, OUTPUTS[out], dp, x_type="float", scale_type="float")
    check(got, want, f"float32 x {out} {dp}")
    # int32 x: double quotients beside the ties, closer than float32 resolves
    xi, s = int32_near_ties()
    got = qemu_q.quantize_linear(xi, np.float32(s), zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp))
    want = oracle.quantize_array(xi, s, zp, OUTPUTS[out], dp, x_type="int32", scale_type="float")
    check(got, want, f"int32 x {out} {dp}")


@pytest.mark.parametrize("subnormals", ["flush_inputs", "flush_outputs", "flush_both"])
@pytest.mark.parametrize("scale_mode", F64, ids=lambda m: m[0])
@pytest.mark.parametrize("out", ["int8", "float8e4m3fn", "float8e5m2fnuz"])
def test_float64_quotient_subnormals_against_the_oracle(subnormals, scale_mode, out):
    # 2**-30: float32 subnormal x become quotients of the float8 subnormal range; the
    # scale 3e-39 (itself subnormal) is flushed to zero with flush_inputs.
    rng = np.random.default_rng(5)
    tiny = rng.integers(1, 0x00800000, 2000, dtype=np.int64).astype(np.uint32).view(np.float32)
    x = np.concatenate([tiny, -tiny, f32(rng.standard_normal(1000) * 2.0 ** -36),
                        f32([0.0, -0.0, 2.0 ** -126, -(2.0 ** -126), np.nan, np.inf, 1.0, -1.0])])
    for rounding in ("up", "down", "half_even"):
        dp = {"rounding": rounding, "subnormals": subnormals, "scale": scale_mode[0], "scale_precision": "float64"}
        for scale in (np.float32(2.0 ** -30), np.float32(3e-39)):
            if scale < 1e-38 and subnormals != "flush_outputs":
                continue  # the oracle takes nonzero scales after flushing
            got = qemu_q.quantize_linear(x, scale, output_dtype=out, datapath=qemu_q.Datapath(**dp))
            want = oracle.quantize_array(x, float(scale), None, OUTPUTS[out], dp, x_type="float",
                                         scale_type="float")
            check(got, want, f"{out} {dp} {scale}")


def test_float64_quotient_flushes_a_subnormal_scale():
    x = f32([1.0, -1.0, 0.0, 3.0])
    for sc in ("divide", "reciprocal"):
        dp = qemu_q.Datapath(subnormals="flush_inputs", scale=sc, scale_precision="float64", nan_to_integer="zero")
        got = qemu_q.quantize_linear(x, np.float32(2.0 ** -130), np.int8(4), datapath=dp)
        assert got.tolist() == [127, -128, 4, 127], sc
        assert plan_fields(x, np.float32(1), "int8", dp)["datapath_wide"] == WIDE_F64


@pytest.mark.parametrize("rule", ["min", "zero", "max"])
def test_float64_quotient_nan_rules(rule):
    x = f32([np.nan, -np.nan, np.inf, -np.inf, 0.0, 2.5, -2.5])
    dp = qemu_q.Datapath(nan_to_integer=rule, scale_precision="float64", rounding="half_away")
    got = qemu_q.quantize_linear(x, np.float32(1), np.int8(-5), datapath=dp)
    nan = {"min": -128, "zero": -5, "max": 127}[rule]
    assert got.tolist() == [nan, nan, 127, -128, -5, -2, -8]


def test_float64_quotient_beside_a_tie_is_not_rounded_onto_it():
    # 2.5 + 2**-29 and 17/16 + 2**-29 (e4m3fn): float32 would round both onto the tie, and
    # ties to even would go down; the double quotient is above it.
    x = np.array([5 * 2**28 + 1, -(5 * 2**28 + 1), 5 * 2**28, 17 * 2**25 + 1, 17 * 2**25], np.int32)
    dp = qemu_q.Datapath(scale_precision="float64")
    got = qemu_q.quantize_linear(x[:3], np.float32(2.0 ** 29), output_dtype="int8", datapath=dp)
    assert got.tolist() == [3, -3, 2]
    got = qemu_q.quantize_linear(x[3:], np.float32(2.0 ** 29), output_dtype="float8e4m3fn", datapath=dp)
    assert bits(got).tolist() == [0x39, 0x38]  # 1.125, 1.0
    # toward_zero beside an integer from below: 3 - 2**-29 truncates to 2, not 3
    got = qemu_q.quantize_linear(np.array([3 * 2**29 - 1], np.int32), np.float32(2.0 ** 29),
                                 output_dtype="int8", datapath=qemu_q.Datapath(scale_precision="float64",
                                                                               rounding="toward_zero"))
    assert got.tolist() == [2]


# ---------------------------------------- float16 and bfloat16 x: every code, vs datapath_one

HALF_SCALES = {
    np.float16: [0.37, 3.0, 2.0 ** -10, 1000.0, 2.0 ** -24, 65504.0],
    BF16: [0.37, 3.0, 2.0 ** -10, 1e30, 2.0 ** -130, 2.0 ** -120],
}
CASES = [("opset21", {}, 21), ("float32", {"scale_precision": "float32"}, None),
         ("reciprocal32", {"scale": "reciprocal", "scale_precision": "float32"}, None),
         ("float64", {"scale_precision": "float64"}, None),
         ("reciprocal64", {"scale": "reciprocal", "scale_precision": "float64"}, None)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_every_half_code_same_bits_as_the_scalar_datapath(dtype, case):
    name, options, opset = case
    x = every_code(dtype)
    words = random_words(x.shape, 31)
    expected_wide = {"opset21": WIDE_HALF, "float32": WIDE_X, "reciprocal32": WIDE_X}.get(name, WIDE_F64)
    for scale_value, rounding, out in itertools.product(HALF_SCALES[dtype], ALL_ROUNDINGS,
                                                        ("int8", "float8e4m3fn")):
        scale = dtype(scale_value)
        # half_even with the subnormals kept would be the ONNX datapath (its own kernels)
        dp = qemu_q.Datapath(rounding=rounding, subnormals="flush_both" if rounding in ("up", "half_even") else "keep",
                             **options)
        w = words if rounding == "stochastic" else None
        if not (rounding == "stochastic" and expected_wide == WIDE_F64):
            assert plan_fields(x, scale, out, dp, opset=opset)["datapath_wide"] == expected_wide

        def run():
            return qemu_q.quantize_linear(x, scale, output_dtype=out, datapath=dp, random_bits=w, opset=opset)
        assert_same_bits(run(), reference(run), f"{dtype.__name__} {name} {scale_value} {rounding} {out}")


@pytest.mark.parametrize("dtype,precision", [(np.float16, "float16"), (BF16, "bfloat16")],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("rounding", ["half_even", "to_odd"])
def test_every_half_code_against_the_oracle(dtype, precision, rounding):
    # QuantizeLinear-21: x and scale of one half type, the quotient in that type.
    x = every_code(dtype)
    scale = dtype(0.37)
    dp = {"rounding": rounding}
    for out in ("int8", "float8e4m3fn"):
        got = qemu_q.quantize_linear(x, scale, output_dtype=out, datapath=qemu_q.Datapath(**dp), opset=21)
        want = oracle.quantize_array(x, float(scale), None, OUTPUTS[out], dp, precision=precision,
                                     x_type=precision, scale_type=precision, opset=21)
        check(got, want, f"{precision} {rounding} {out}")


def round_to_half_exact(q: Fraction, precision: str):
    return oracle.round_nearest_even_to(q, precision)


@pytest.mark.parametrize("dtype,precision", [(np.float16, "float16"), (BF16, "bfloat16")],
                         ids=["float16", "bfloat16"])
def test_the_float32_quotient_rounded_again_is_the_exact_quotient_rounded_once(dtype, precision):
    # The argument of WIDE_HALF (docs/semantics.md): for x and s of one half type the float32
    # quotient rounded to that type is the exact quotient rounded once (Figueroa: p' >= 2p + 2
    # for division), and so is the float32 product x * r with r = round(1 / s) for float16
    # (22 bits: exact). Checked here on its own terms, every finite nonzero x, for scales
    # with subnormal, huge and tiny quotients; where the two could differ, the exact
    # quotient sits near a midpoint of the half type, so only those are checked exactly.
    x = every_code(dtype)
    finite = np.isfinite(x.astype(np.float32)) & (x.astype(np.float32) != 0)
    xs = x[finite]
    total_checked = 0
    x32 = xs.astype(np.float32)
    for scale_value in HALF_SCALES[dtype] + [1.1, 0.0009765625 * 3]:
        s = dtype(scale_value)
        s32 = np.float32(s)
        with np.errstate(over="ignore", under="ignore"):
            twice = (x32 / s32).astype(dtype).astype(np.float64)
            once_near = (x32.astype(np.float64) / np.float64(s32))
        # the exact check where the float64 quotient is within 2**-8 half-type ulps of a
        # midpoint (or is the midpoint): elsewhere neither rounding can cross it
        q = np.abs(once_near)
        mant = {"float16": 10, "bfloat16": 7}[precision]
        min_exp = {"float16": -14, "bfloat16": -126}[precision]
        with np.errstate(divide="ignore"):
            e = np.maximum(np.floor(np.log2(q)), min_exp)
        t = q / np.exp2(e - mant)
        near = np.abs(t - np.floor(t) - 0.5) < 2.0 ** -8
        checked = 0
        for i in np.flatnonzero(near | ~np.isfinite(twice)):
            exact = Fraction(float(x32[i])) / Fraction(float(s32))
            want = round_to_half_exact(exact, precision)
            got = twice[i]
            if isinstance(want, float):
                assert np.isinf(got) and (got > 0) == (want > 0), (float(x32[i]), scale_value)
            else:
                assert Fraction(float(got)) == want, (float(x32[i]), scale_value, float(got), float(want))
            checked += 1
        total_checked += checked
    assert total_checked > 100
    # the float16 reciprocal's product: 11 x 11 bits, exact in float32
    r = np.float16(1) / np.float16(0.37)
    prod = x32[np.abs(x32) < 60000] * np.float32(r)
    assert np.array_equal(prod.astype(np.float64), x32[np.abs(x32) < 60000].astype(np.float64) * float(r))


# ------------------------------------------------------------ layouts, pieces, tails

def mixed_input(n, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.int32:
        x = rng.integers(-(2**31), 2**31, n).astype(np.int32)
        x[::5] = rng.integers(-3000, 3000, x[::5].size)
        return x
    v = rng.standard_normal(n) * np.exp(rng.uniform(-20, 12, n))
    with np.errstate(over="ignore"):
        x = v.astype(np.float32).astype(dtype)
    codes = bits(x)
    codes[::7] = rng.integers(0, 2 ** (8 * x.itemsize), codes[::7].size)
    x[:6] = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-40], np.float32)[:n].astype(dtype)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("out", ["int8", "uint16", "int4", "float8e4m3fn", "float8e5m2"])
def test_layouts_pieces_and_tails_same_bits_as_the_scalar_datapath(dtype, out):
    rng = np.random.default_rng(3)
    options = [dict(rounding=r, scale=sc, scale_precision="float64", subnormals=sub, nan_to_integer=nz)
               for r in ROUNDINGS for sc in ("divide", "reciprocal") for sub in ("keep", "flush_both")
               for nz in (("min", "zero", "max") if not out.startswith("float") else ("min",))]
    for n in (1, 7, 33, 511, 512, 513, 1100):
        x = mixed_input(n, dtype, n)
        layouts = [(np.float32(0.37), {}), (np.float32(3e-39), {})]
        if n == 1100:
            x = x.reshape(11, 100)
            layouts += [(f32(rng.uniform(0.05, 3, 100)), {"axis": 1}), (f32(rng.uniform(0.05, 3, 11)), {"axis": 0}),
                        (f32(rng.uniform(0.05, 3, (11, 100 // 8 + 1))), {"axis": 1, "block_size": 8})]
        for dp, (scale, kw) in itertools.product(options[:: 1 if n == 1100 else 5], layouts):
            if dtype in (np.float16, BF16):
                scale = scale.astype(dtype)

            def run():
                return qemu_q.quantize_linear(x, scale, output_dtype=out, datapath=qemu_q.Datapath(**dp), **kw)
            assert_same_bits(run(), reference(run), f"{np.dtype(dtype).name} n={n} {out} {dp} {kw}")


def test_half_layouts_same_bits_as_the_scalar_datapath():
    # WIDE_X and WIDE_HALF with per-element scales and zero points, across pieces.
    rng = np.random.default_rng(4)
    for dtype in (np.float16, BF16):
        x = mixed_input(13 * 150, dtype, 9).reshape(13, 150)
        zp = rng.integers(-20, 20, 150).astype(np.int8)
        for rounding, (opts, opset), kw in itertools.product(
                ALL_ROUNDINGS, (({}, 21), ({"scale_precision": "float32"}, None),
                                ({"scale": "reciprocal", "scale_precision": "float32"}, None)),
                ({"axis": 1}, {"axis": 0})):
            n_scales = 150 if kw["axis"] == 1 else 13
            scale = rng.uniform(0.05, 3, n_scales).astype(np.float32).astype(dtype)
            zero_point = zp if kw["axis"] == 1 else zp[:13]
            dp = qemu_q.Datapath(rounding=rounding, subnormals="flush_inputs", nan_to_integer="zero", **opts)
            w = random_words(x.shape, 5) if rounding == "stochastic" else None

            def run():
                return qemu_q.quantize_linear(x, scale, zero_point, datapath=dp, random_bits=w, opset=opset, **kw)
            assert_same_bits(run(), reference(run), f"{dtype} {rounding} {opts} {kw}")


# ---------------------------------------------- threads and instruction-set levels

@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32], ids=lambda d: np.dtype(d).name)
def test_independent_of_threads_and_levels(dtype):
    x = mixed_input(3 * 70001, dtype, 21).reshape(3, 70001)
    words = random_words(x.shape, 22)
    level = _kernels.active.level
    cases = [(dict(rounding=r, scale_precision="float64", scale=sc), None)
             for r in ("half_away", "to_odd", "down") for sc in ("divide", "reciprocal")]
    if dtype in (np.float16, BF16):
        cases += [(dict(rounding="stochastic"), 21), (dict(rounding="half_up", subnormals="flush_both"), 21),
                  (dict(rounding="stochastic", scale_precision="float32"), None)]
    scales = [np.array([0.3, 0.7, 1.1], np.float32), f32(np.linspace(0.1, 5, 70001))]
    try:
        for (dp, opset), scale, out in itertools.product(cases, scales, ("int8", "float8e4m3fn")):
            kw = {"axis": 0 if scale.size == 3 else 1}
            if dtype in (np.float16, BF16):
                scale = scale.astype(dtype)
            w = words if dp.get("rounding") == "stochastic" else None
            first = None
            for lv, n in itertools.product(LEVELS, (1, 2, 3)):
                _kernels.use(lv)
                got = qemu_q.quantize_linear(x, scale, output_dtype=out, datapath=qemu_q.Datapath(**dp),
                                             random_bits=w, opset=opset, n_threads=n, **kw)
                if first is None:
                    first = got
                    assert_same_bits(got, reference(lambda: qemu_q.quantize_linear(
                        x, scale, output_dtype=out, datapath=qemu_q.Datapath(**dp), random_bits=w,
                        opset=opset, **kw)), f"{dp} vs datapath_one")
                else:
                    assert_same_bits(got, first, f"{dp} level {lv} n_threads={n}")
    finally:
        _kernels.use(level)


def test_the_levels_run_their_own_staged_loops():
    level = _kernels.active.level
    x = np.array([5 * 2**28 + 1, -(5 * 2**28 + 1)], np.int32)
    fields = plan_fields(x, np.float32(2.0 ** 29), "int8", qemu_q.Datapath(scale_precision="float64"))
    assert fields["datapath_wide"] == WIDE_F64
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            module = _dispatch.entry_module(_dispatch.Path.QUANTIZE)
            assert lv == "baseline" or lv.replace("-", "_") in module.__name__
            module.QuantizeConfig(**fields)
            got = qemu_q.quantize_linear(x, np.float32(2.0 ** 29), output_dtype="int8",
                                         datapath=qemu_q.Datapath(scale_precision="float64"))
            assert got.tolist() == [3, -3], lv
    finally:
        _kernels.use(level)


# ------------------------------- float64 quotients of float32 operands: the remainder loops
#
# float32-valued x and scale with scale_precision="float64" stage the double quotient's
# value from the float32 quotient and its remainder (docs/semantics.md, "Staged quotients":
# the plan's quotient64, stage_remainder_* in pyx/_datapath_loops_f64.pxi.tp), and hand a
# piece of 512 to the double loop when one of its elements is outside the lanes where
# that is proven. These tests check the claim itself with exact arithmetic, the loops
# against datapath_one, the double loop and the oracle, and that each loop really ran.

QUOTIENT64_DOUBLE, QUOTIENT64_REMAINDER = 0, 1
# Non-powers of two (the reciprocal inexact), one power of two (the reciprocal exact).
# 123 / 2048, 117 / 128 and 105 / 64 have few significant bits, so that many x = B * s
# are float32 values, and a reciprocal whose product error s * RN64(1 / s) - 1 is above
# 0.8 * 2**-53: there RN64(x * RN64(1 / s)) differs from the exact quotient B wherever B's
# significand exceeds about 1.25 (the lanes the remainder loops hand to the double loop).
REMAINDER_SCALES = [123 / 2048, 0.37, 117 / 128, 1 / 3, 3.0, 105 / 64, 1.1, 2.0 ** -20 * 0.3,
                    2.0 ** 40 / 3, 0.25]


def quantize_module():
    return _dispatch.entry_module(_dispatch.Path.QUANTIZE)


def switched_off(switch, fn):
    """fn() with the kernel module's test hook `switch` (set_quotient64_remainder, ...)
    False, then back as it was."""
    setter = getattr(quantize_module(), switch)
    previous = setter(False)
    try:
        return fn()
    finally:
        setter(previous)


def double_loop(fn):
    return switched_off("set_quotient64_remainder", fn)


def nearest_off(fn):
    """fn() with nearest_divide_one off: the integer pieces it would write go to the fused loop."""
    return switched_off("set_nearest_quotients", fn)


def counted(fn):
    """fn's result and the (staged, fell_back) pieces of the remainder loops it ran."""
    module = quantize_module()
    module.count_quotient64_pieces(True)
    try:
        result = fn()
    finally:
        counts = module.count_quotient64_pieces(False)
    return result, counts


def odd24(v: Fraction) -> Fraction:
    """v rounded to odd at 24 significant bits (any exponent): itself when it has 24
    bits, else the odd one of its two 24-bit neighbours."""
    if v == 0:
        return v
    a = abs(v)
    whole, rem, den = oracle.split(a, oracle.floor_log2(a) - 23)
    if rem:
        whole |= 1
    e = oracle.floor_log2(a) - 23
    r = Fraction(whole) * (Fraction(2) ** e)
    return r if v > 0 else -r


def exact_quotient_inputs(scale: np.float32) -> np.ndarray:
    """x = B * s exactly (where float32 holds the product) for the boundaries B of the
    roundings: integers, half-integers, e4m3/e5m2 mantissa steps and their midpoints,
    saturation points; and their float32 neighbours."""
    s = float(scale)
    boundaries = np.concatenate([np.arange(-300, 301) / 2.0, np.arange(-64, 65) / 16.0,
                                 np.arange(-64, 65) / 32.0 + 1 / 64, np.arange(-40, 41) * 2.0 ** -9,
                                 [448.0, 464.0, 480.0, 57344.0, 61440.0, 127.5, 255.5, 32767.5, -32768.5]])
    x = boundaries * s
    x = x[(x.astype(np.float32).astype(np.float64) == x)].astype(np.float32)
    nonzero = x[x != 0]  # a zero's neighbours are float32 subnormals (lanes the loops hand on)
    up, down = np.nextafter(nonzero, np.float32(np.inf)), np.nextafter(nonzero, np.float32(-np.inf))
    return np.concatenate([x, up, down])


def test_the_plan_stages_float32_operands_by_their_remainder():
    dp = qemu_q.Datapath(rounding="up", scale_precision="float64")
    for x, s in ((np.ones(8, np.float32), np.float32(0.37)), (np.ones(8, np.float16), np.float16(0.37)),
                 (np.ones(8, BF16), BF16(0.37)), (np.ones(8, np.float16), np.float32(0.37))):
        for sc in ("divide", "reciprocal"):
            fields = plan_fields(x, s, "int8", qemu_q.Datapath(rounding="up", scale=sc, scale_precision="float64"))
            assert fields["datapath_wide"] == WIDE_F64 and fields["quotient64"] == QUOTIENT64_REMAINDER
            config = quantize_module().QuantizeConfig(**fields)
            assert config.quotient64 == "float32 remainder"
            assert double_loop(lambda: config.quotient64) == "double"
    # int32 x (31 bits): the double loop; no float64 quotient: neither
    fields = plan_fields(np.ones(8, np.int32), np.float32(0.37), "int8", dp)
    assert fields["quotient64"] == QUOTIENT64_DOUBLE
    assert quantize_module().QuantizeConfig(**fields).quotient64 == "double"
    f32_fields = plan_fields(np.ones(8, np.float32), np.float32(0.37), "int8", qemu_q.Datapath(rounding="up"))
    assert f32_fields["quotient64"] == QUOTIENT64_DOUBLE
    assert quantize_module().QuantizeConfig(**f32_fields).quotient64 is None
    for bad in ({**fields, "quotient64": QUOTIENT64_REMAINDER}, {**f32_fields, "quotient64": QUOTIENT64_REMAINDER},
                {**fields, "quotient64": 2}):
        with pytest.raises(ValueError, match="quotient64"):
            quantize_module().QuantizeConfig(**bad)


def test_the_double_quotient_rounds_to_odd_as_the_exact_quotient():
    # The claim the remainder loops rest on, in exact arithmetic and nothing of qemu_q:
    # for float32 x and s, RO24(RN64(x / s)) = RO24(x / s), and for the reciprocal
    # RO24(RN64(x * RN64(1 / s))) = RO24(x / s) except where x / s is an even 24-bit
    # number; and those exceptions do occur (so the loops' fallback is needed).
    rng = np.random.default_rng(11)
    differ = 0
    for sv in REMAINDER_SCALES[:6]:
        s = np.float32(sv)
        xs = np.concatenate([exact_quotient_inputs(s)[::2],
                             f32(rng.standard_normal(300) * 100 * sv),
                             rng.integers(0x0D000000, 0x7F000000, 300, dtype=np.int64).astype(np.uint32).view(np.float32)])
        fs = Fraction(float(s))
        m = 1.0 / float(s)
        for xv in xs.tolist():
            if xv == 0 or not np.isfinite(xv) or not (2.0 ** -99 <= abs(xv / float(s)) < 2.0 ** 99):
                continue
            exact = Fraction(xv) / fs
            assert odd24(Fraction(xv / float(s))) == odd24(exact), (xv, sv)
            recip = odd24(Fraction(xv * m))
            if recip != odd24(exact):
                whole, rem, _ = oracle.split(abs(exact), oracle.floor_log2(abs(exact)) - 23)
                assert rem == 0 and whole % 2 == 0, (xv, sv)
                differ += 1
    assert differ > 50


@pytest.mark.parametrize("scale_mode", ["divide", "reciprocal"])
def test_remainder_loops_same_bits_as_datapath_one_and_the_double_loop(scale_mode):
    # exact quotients on every rounding boundary and their neighbours, random values,
    # every mode, flushes, integer and ONNX small-float outputs and a narrow family integer
    rng = np.random.default_rng(12)
    int5 = qemu_q.integer_type(5, narrow_range=True)
    outs = ["int8", "uint8", "int16", "int4", int5, "float8e4m3fn", "float8e5m2", "float4e2m1"]
    for i, sv in enumerate(REMAINDER_SCALES):
        s = np.float32(sv)
        x = np.concatenate([exact_quotient_inputs(s), f32(rng.standard_normal(500) * 50 * sv)])
        for j, rounding in enumerate(ROUNDINGS):
            out = outs[(i + j) % len(outs)]
            sub = ("keep", "flush_both", "flush_outputs")[(i + j) % 3]
            dp = qemu_q.Datapath(rounding=rounding, scale=scale_mode, scale_precision="float64", subnormals=sub)

            def run():
                return qemu_q.quantize_linear(x, s, output_dtype=out, datapath=dp)
            got, (staged, fell_back) = counted(run)
            what = f"{sv} {rounding} {out} {sub}"
            direct = (scale_mode == "reciprocal" and rounding in DIRECT_RECIPROCAL_MODES
                      and not (isinstance(out, str) and out.startswith("float")))
            assert (staged == 0) if direct else (staged > 0), what
            if scale_mode == "divide" or sv == 0.25:
                assert fell_back == 0, what  # every lane here is one the loops take
            assert_same_bits(got, reference(run), what)
            assert_same_bits(got, double_loop(run), what)


@pytest.mark.parametrize("scale_mode", ["divide", "reciprocal"])
@pytest.mark.parametrize("out", ["int8", "uint8", "int16", "int4", "float8e4m3fn", "float8e5m2"])
def test_remainder_loops_exact_quotients_against_the_oracle(out, scale_mode):
    zero_point = {"int8": np.int8(-3), "uint8": np.uint8(100), "int16": np.int16(1000)}.get(out)
    zp = None if zero_point is None else int(zero_point)
    for sv, rounding in ((0.37, "half_even"), (0.1, "half_away"), (1 / 3, "to_odd"), (7.0, "down"),
                         (1.1, "half_up")):
        s = np.float32(sv)
        x = exact_quotient_inputs(s)[::2]
        dp = {"rounding": rounding, "scale": scale_mode, "scale_precision": "float64"}
        got = qemu_q.quantize_linear(x, s, zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp))
        want = oracle.quantize_array(x, float(s), zp, OUTPUTS[out], dp, x_type="float", scale_type="float")
        check(got, want, f"{out} {dp} {sv}")


@pytest.mark.parametrize("lv", LEVELS)
def test_reciprocal_integer_codes_every_mode_against_the_oracle(lv):
    # Integer codes of float32 x under one reciprocal in float64 (the direct double loops,
    # reciprocal_f64_integer_<mode>, and the two passes): x = B * s for every rounding boundary B, where
    # x * RN64(1 / s) lies within a double ulp of B and its own rounding decides the side,
    # and their float32 neighbours; NaN, infinities, huge and subnormal x; every mode but
    # stochastic, three integer types with zero points, the input flush; against the
    # oracle's Fraction arithmetic, at each level.
    level = _kernels.active.level
    _kernels.use(lv)
    try:
        for sv in (0.37, 0.1, 1 / 3, 1.1, 0.25, 3e-36):
            s = np.float32(sv)
            x = np.concatenate([exact_quotient_inputs(s), f32([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-40, -1e-40,
                                                               0.0, -0.0])])
            for j, rounding in enumerate(ROUNDINGS):
                for out, zp in (("int8", -3), ("uint8", 100), ("int16", 1000)):
                    zero_point = np.array(zp, out)
                    dp = {"rounding": rounding, "scale": "reciprocal", "scale_precision": "float64",
                          "subnormals": ("keep", "flush_inputs")[j % 2]}
                    got = qemu_q.quantize_linear(x, s, zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp))
                    want = oracle.quantize_array(x, float(s), zp, OUTPUTS[out], dp, x_type="float",
                                                 scale_type="float")
                    check(got, want, f"{lv} {out} {dp} {sv}")
    finally:
        _kernels.use(level)


NEAREST_MODES = ("half_even", "half_away", "half_up", "half_down")


def near_half_integer_inputs(scale: np.float32) -> np.ndarray:
    """float32 x = RN32((k + 1/2) s) for k in [-300, 300): where the product is inexact,
    x / s lies within float32's resolution of the tie without being it, and its float32
    quotient mostly rounds onto k + 1/2 (the lanes nearest_<mode>_divide_one hands on)."""
    return (((np.arange(-300, 300) + 0.5) * float(scale))).astype(np.float32)


@pytest.mark.parametrize("lv", LEVELS)
def test_nearest_divide_one_scale_against_the_oracle(lv):
    # Integer codes of float32 x under one divisor in float64 in the nearest modes
    # (nearest_<mode>_divide_one: the float32 quotient's codes, a piece handed to the fused
    # loop where a clamped quotient is a half-integer): pieces of ordinary x with NaN,
    # infinities, huge and subnormal x among them (which the fused loop's lanes refuse and
    # this loop takes), and pieces of ties and near ties (x = B * s and its float32
    # neighbours, RN32((k + 1/2) s)); three integer types with zero points, the input
    # flush, 1 and 2 threads; against the oracle's Fraction arithmetic, the same bits with
    # the loop turned off (set_nearest_quotients), and the pieces each took.
    level = _kernels.active.level
    _kernels.use(lv)
    module = quantize_module()  # the level's own module: each keeps its own counts
    rng = np.random.default_rng(31)
    try:
        for sv in (0.37, 0.1, 1 / 3, 1.1, 3e-36):
            s = np.float32(sv)
            ordinary = (rng.standard_normal(2048) * 60 * float(s)).astype(np.float32)
            ordinary[::101] = f32([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-40, -1e-40, 0.0, -0.0, -np.nan,
                                   2.0 ** -149, 1e30, -1e-30, 7.0, -7.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5])
            near = np.concatenate([exact_quotient_inputs(s), near_half_integer_inputs(s)])
            x = np.concatenate([ordinary, near])
            for j, rounding in enumerate(NEAREST_MODES):
                for out, zp in (("int8", -3), ("uint8", 100), ("int16", 1000)):
                    zero_point = np.array(zp, out)
                    dp = {"rounding": rounding, "scale_precision": "float64",
                          "subnormals": ("keep", "flush_inputs", "flush_outputs", "flush_both")[j],
                          "nan_to_integer": ("min", "zero", "max")[j % 3]}

                    def run(n=1 + j % 2):
                        return qemu_q.quantize_linear(x, s, zero_point, output_dtype=out, n_threads=n,
                                                      datapath=qemu_q.Datapath(**dp))
                    module.count_nearest_pieces()
                    got, (staged, fell_back) = counted(run)
                    nearest = module.count_nearest_pieces()
                    want = oracle.quantize_array(x, float(s), zp, OUTPUTS[out], dp, x_type="float",
                                                 scale_type="float")
                    what = f"{lv} {out} {dp} {sv}"
                    check(got, want, what)
                    # the ordinary pieces (whose quotients stand far from half-integers) are
                    # the nearest loop's, the pieces of ties handed on (to the fused loop, or
                    # past its lanes, as x = B * 3e-36 is, to the double loop)
                    assert nearest >= 3 and staged + fell_back > 0, (what, nearest, staged, fell_back)
                    off, _ = nearest_off(lambda: counted(run))
                    assert module.count_nearest_pieces() == 0, what
                    assert_same_bits(got, off, what)
    finally:
        _kernels.use(level)


def test_narrow_integer_and_many_mantissa_bits_against_exact_rounding():
    # a narrow family integer (the remainder loops) and a family minifloat of 10 mantissa
    # bits (e5m10 with inf: float16's values; datapath_one), against exact arithmetic
    int5 = qemu_q.integer_type(5, narrow_range=True)
    e5m10 = qemu_q.minifloat_type(5, 10, inf=True)
    for sv in (0.37, 1 / 3):
        s = np.float32(sv)
        x = exact_quotient_inputs(s)
        x = x[np.abs(x / s) < 60000]
        for scale_mode in ("divide", "reciprocal"):
            m = 1.0 / float(s)
            for rounding in ("half_even", "toward_zero", "up"):
                dp = {"rounding": rounding, "scale": scale_mode, "scale_precision": "float64"}
                got = qemu_q.quantize_linear(x, s, output_dtype=int5, datapath=qemu_q.Datapath(**dp))
                want = []
                for xv in x.tolist():
                    q = Fraction(xv / float(s) if scale_mode == "divide" else xv * m)
                    n = oracle.round_magnitude(*oracle.split(abs(q), 0), q < 0, rounding, 0)
                    want.append(min(max(-n if q < 0 else n, -15), 15))
                assert got.astype(np.int64).tolist() == want, (sv, dp)
            # half_even into e5m10 (float16's values): numpy's correctly rounded float64 -> float16
            dp = qemu_q.Datapath(scale=scale_mode, scale_precision="float64", rounding="half_even",
                                 subnormals="flush_inputs")
            got = qemu_q.quantize_linear(x, s, output_dtype=e5m10, datapath=dp)
            q = x.astype(np.float64) / float(s) if scale_mode == "divide" else x.astype(np.float64) * m
            assert bits(got).tolist() == bits(q.astype(np.float16)).tolist(), (sv, scale_mode)


def test_remainder_loops_fall_back_piece_by_piece():
    # lanes the loops do not take, in the middle of vectors, at piece edges and in tails:
    # huge and tiny quotients, |x| below 2**-101, NaN, inf, float32 subnormals; zeros are
    # taken. Only the pieces holding one fall back (n_threads=1: the pieces are the
    # cursor's 2048-element blocks cut into 512s). Integer codes under a divide in a nearest
    # mode are nearest_divide_one's, which has no lanes: it takes every piece, and the
    # fused loop's lanes are checked with it off.
    module = quantize_module()
    rng = np.random.default_rng(13)
    s = np.float32(0.37)
    base = f32(rng.standard_normal(4100) * 40)
    base[::97] = 0.0
    base[5::89] = -0.0
    for special in (3e38, -2.0 ** 120, 2.0 ** -110, -1e-40, np.nan, np.inf, 2.0 ** -101 * 0.75):
        x = base.copy()
        where = [700, 1023 + 512, 4099]
        x[where] = special
        for sc in ("divide", "reciprocal"):
            for rounding, out in (("half_away", "int8"), ("to_odd", "float8e4m3fn"), ("down", "float8e5m2")):
                dp = qemu_q.Datapath(rounding=rounding, scale=sc, scale_precision="float64", subnormals="flush_outputs")

                def run():
                    return qemu_q.quantize_linear(x, s, output_dtype=out, datapath=dp, n_threads=1)
                what = f"{special} {sc} {rounding} {out}"
                module.count_nearest_pieces()
                got, (staged, fell_back) = counted(run)
                if out == "int8":  # the direct double loop or nearest_divide_one: nothing staged
                    assert (staged, fell_back) == (0, 0), (what, staged, fell_back)
                    assert module.count_nearest_pieces() == (9 if sc == "divide" else 0), what
                if sc == "divide" and out == "int8":
                    off, (staged, fell_back) = nearest_off(lambda: counted(run))
                    assert_same_bits(off, got, what)
                if (sc, out) != ("reciprocal", "int8"):
                    assert fell_back == 3 and staged == 9 - 3, (what, staged, fell_back)
                assert_same_bits(got, reference(run), what)
        # zeros alone never fall back
        got, counts = counted(lambda: qemu_q.quantize_linear(base, s, datapath=qemu_q.Datapath(
            scale_precision="float64", rounding="up"), n_threads=1))
        assert counts == (9, 0)
    # a scale of 2**48 or more: every piece (a nonzero x could have a zero q)
    for big in (np.float32(2.0 ** 48), np.float32(-3e38)):
        for sc in ("divide", "reciprocal"):
            dp = qemu_q.Datapath(rounding="up", scale=sc, scale_precision="float64")

            def run():
                return qemu_q.quantize_linear(base * np.float32(2.0 ** 60), big, datapath=dp, n_threads=1)
            got, counts = counted(run)
            assert counts == (0, 9), (big, sc)
            assert_same_bits(got, reference(run), f"{big} {sc}")


def test_remainder_loops_per_element_scales():
    # per-axis and blocked scales, among them a power of two (the reciprocal exact), a
    # subnormal scale (flushed or kept: a piece with it falls back) and huge/tiny ones
    rng = np.random.default_rng(14)
    scales = f32(rng.uniform(0.05, 3, 300))
    scales[[3, 100, 299]] = [0.25, 1e-39, 2.0 ** 100]
    x = f32(rng.standard_normal((7, 300)) * 30)
    x[:, ::7] = (np.round(x[:, ::7] / scales[::7] * 2) / 2 * scales[::7]).astype(np.float32)  # near exact quotients
    block_scales = f32(rng.uniform(0.05, 3, (7, 300 // 20)))
    for sc, rounding, sub in itertools.product(("divide", "reciprocal"), ("half_even", "up", "to_odd"),
                                               ("keep", "flush_inputs")):
        dp = qemu_q.Datapath(rounding=rounding, scale=sc, scale_precision="float64", subnormals=sub)
        for scale, kw in ((scales, {"axis": 1}), (block_scales, {"axis": 1, "block_size": 20})):
            def run():
                return qemu_q.quantize_linear(x, scale, datapath=dp, **kw)
            got, (staged, fell_back) = counted(run)
            if scale is scales:
                assert fell_back > 0  # every row holds the subnormal and the 2**100 scale
            else:
                assert staged > 0
            assert_same_bits(got, reference(run), f"{sc} {rounding} {sub} {kw}")


def test_the_levels_run_their_own_remainder_loops():
    # every level the machine runs (the baseline's remainder in double, FMA's in fmaf),
    # 1-3 threads, against the double loop
    level = _kernels.active.level
    rng = np.random.default_rng(15)
    s = np.float32(0.37)
    x = np.concatenate([exact_quotient_inputs(s), f32(rng.standard_normal(30000) * 60)])
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            for sc, rounding in (("divide", "half_even"), ("reciprocal", "half_down"), ("reciprocal", "to_odd")):
                dp = qemu_q.Datapath(rounding=rounding, scale=sc, scale_precision="float64")
                want = double_loop(lambda: qemu_q.quantize_linear(x, s, output_dtype="float8e4m3fn", datapath=dp))
                for n in (1, 2, 3):
                    got, (staged, _) = counted(lambda: qemu_q.quantize_linear(
                        x, s, output_dtype="float8e4m3fn", datapath=dp, n_threads=n))
                    assert staged > 0, lv
                    assert_same_bits(got, want, f"{lv} {sc} {rounding} n_threads={n}")
    finally:
        _kernels.use(level)


# ------------------------------- the remainder loops on per-axis and blocked layouts
#
# QUOTIENT64_REMAINDER plans are fed as the float32 loops are (quantize_datapath_staged in
# pyx/_quantize.pyx, the plan's datapath_feed "staged buffered" / "staged whole blocks"):
# the scales converted and lane-checked once per parameter, short runs gathered into
# pieces, whole blocks spread, each piece staged by the remainder loop on float32
# divisors (or the double loop where one of its elements or scales is outside the lanes)
# and finished by the `_one` float32 loop (one zero point) or the buffered one. The layouts
# below cross its constants: direct runs of 256 or more, pieces of 1024, gathered runs
# (blocks, short rows, runs of one scale shorter than 256), ragged last blocks.

STAGED_LAYOUTS = [
    # (name, x shape, axis, block_size, feed)
    ("per-axis 1, rows of 2100", (3, 2100), 1, 0, "staged buffered"),
    ("per-axis 1, short rows", (30, 50), 1, 0, "staged buffered"),
    ("per-axis 0, short runs", (200, 40), 0, 0, "staged buffered"),
    ("blocked 32", (3, 2048), 1, 32, "staged whole blocks"),
    ("blocked 24", (5, 300), 1, 24, "staged buffered"),
    ("blocked 48, ragged", (3, 1000), 1, 48, "staged buffered"),
    ("blocked 32 along axis 0", (70, 300), 0, 32, "staged buffered"),
    ("blocked 4 along an inner axis", (3, 9, 100), 1, 4, "staged buffered"),
]
# scales that put an element outside the remainder loops' lanes whatever its x: a float32
# subnormal (kept, or flushed to zero), zero, inf, NaN, 2**50 (not below 2**48)
BAD_SCALES = [1e-39, 0.0, np.inf, np.nan, 2.0 ** 50]


def staged_case(shape, axis, block_size, rng, hard):
    """x and per-parameter scales: ordinary scales among scales of few significant bits
    (exact quotients x = B * s on many elements of the first third); with `hard`, those
    are mostly non-powers of two (an exact even quotient: the reciprocal's hard lane), one
    parameter gets a scale outside the lanes and a few x are huge, tiny, NaN or inf."""
    n = -(-shape[axis] // block_size) if block_size else shape[axis]
    pshape = list(shape) if block_size else [shape[axis]]
    if block_size:
        pshape[axis] = n
    scales = f32(rng.uniform(0.05, 3, pshape))
    flat = scales.reshape(-1)
    # few significant bits: many float32 x are exact multiples B * s; for the non-powers
    # of two (hard only) also many random x, about one in 100 to 200 for 123/2048 and
    # 105/64, an exact even quotient that sends its piece to the double loop: those on
    # the first third of the parameters only)
    few_bits = [123 / 2048, 117 / 128, 0.25, 105 / 64] if hard else [0.25, 2.0, 0.5, 1.0]
    first = flat[:flat.size // 3 + 1]
    first[1::5] = f32(few_bits)[rng.integers(0, 4, first[1::5].size)]
    if hard:
        flat[flat.size // 2] = BAD_SCALES[rng.integers(0, len(BAD_SCALES))]
    from test_datapath_fast import _per_element
    s = _per_element(scales, shape, axis, block_size).astype(np.float64)
    s = np.where((s > 1e-30) & (s < 1e10), s, 1.0)  # (the bad scale's x: ordinary values)
    x = rng.standard_normal(shape) * 30 * s
    exact = np.round(x * 2 / s) / 2 * s  # B * s, kept where float32 holds it
    pick = (rng.random(shape) < 0.3) & (exact.astype(np.float32).astype(np.float64) == exact)
    # in the first third only: with a reciprocal, the pieces holding them go to the double
    # loop, the others stay on the remainder loops
    pick.reshape(-1)[x.size // 3:] = False
    x = np.where(pick, exact, x).astype(np.float32)
    x.reshape(-1)[::97] = 0.0
    x.reshape(-1)[5::89] = -0.0
    if hard:
        where = rng.choice(1000, 5, replace=False)  # in the first piece
        x.reshape(-1)[where] = f32([3e38, 2.0 ** -110, np.nan, -np.inf, -1e-40])
    return x, scales


def zero_points_for(out, scales, rng, uniform):
    if out == "int8":
        return np.full(scales.shape, -3, np.int8) if uniform else rng.integers(-20, 20, scales.shape).astype(np.int8)
    if out == "uint8":
        return np.full(scales.shape, 100, np.uint8) if uniform else rng.integers(90, 110, scales.shape).astype(np.uint8)
    if out == "float8e4m3fn" and not uniform:
        # +0 and -0: one value, two bit patterns (the sign of a zero quotient)
        return rng.integers(0, 2, scales.shape).astype(np.uint8).__mul__(0x80).view(ml_dtypes.float8_e4m3fn)
    return None


def staged_feed(x, scale, out, dp, axis, block_size):
    return quantize_module().QuantizeConfig(**plan_fields(x, scale, out, dp, axis=axis,
                                                          block_size=block_size)).datapath_feed


def test_the_plan_feeds_the_remainder_loops_buffered():
    rng = np.random.default_rng(20)
    for name, shape, axis, block_size, feed in STAGED_LAYOUTS:
        x, scales = staged_case(shape, axis, block_size, rng, False)
        for sc in ("divide", "reciprocal"):
            dp = qemu_q.Datapath(rounding="up", scale=sc, scale_precision="float64")
            assert staged_feed(x, scales, "int8", dp, axis, block_size) == feed, name
            assert double_loop(lambda: staged_feed(x, scales, "int8", dp, axis, block_size)) == "pieces"
    x = np.ones((4, 64), np.float32)
    dp = qemu_q.Datapath(rounding="up", scale_precision="float64")
    assert staged_feed(x, np.float32(0.37), "int8", dp, 1, 0) == "staged buffered"  # per tensor: long runs
    assert staged_feed(x.astype(np.float16), np.ones(64, np.float16), "float8e4m3fn", dp, 1, 0) == "staged buffered"
    # int32 x (the double loop) and stochastic (datapath_one) keep the cursor's pieces
    assert staged_feed(x.astype(np.int32), np.ones(64, np.float32), "int8", dp, 1, 0) == "pieces"
    stochastic = qemu_q.Datapath(rounding="stochastic", scale_precision="float64")
    assert staged_feed(x, np.ones(64, np.float32), "int8", stochastic, 1, 0) == "pieces"
    assert plan_fields(x, np.ones(64, np.float32), "int8", stochastic, axis=1)["datapath_wide"] == WIDE_NONE


@pytest.mark.parametrize("scale_mode", ["divide", "reciprocal"])
@pytest.mark.parametrize("hard", [False, True], ids=["ordinary", "hard"])
def test_remainder_loops_on_layouts_same_bits_as_datapath_one(scale_mode, hard):
    # every layout, every mode but stochastic, integer and small-float outputs, one and
    # several zero points, the flushes; against datapath_one and the double loop, and the
    # pieces counted: the remainder loops ran, and only the pieces with a hard element or a
    # bad scale went to the double loop
    rng = np.random.default_rng(21 + hard)
    outs = ["int8", "uint8", "int4", "float8e4m3fn", "float8e5m2"]
    subs = ["keep", "flush_inputs", "flush_outputs", "flush_both"]
    for i, (name, shape, axis, block_size, feed) in enumerate(STAGED_LAYOUTS):
        x, scales = staged_case(shape, axis, block_size, rng, hard)
        for j, rounding in enumerate(ROUNDINGS):
            k = i + j
            out = outs[k % len(outs)]
            zero_point = zero_points_for(out, scales, rng, uniform=k % 2 == 0)
            dp = qemu_q.Datapath(rounding=rounding, scale=scale_mode, scale_precision="float64",
                                 subnormals=subs[k % len(subs)])

            def run():
                return qemu_q.quantize_linear(x, scales, zero_point, output_dtype=out, datapath=dp, axis=axis,
                                              block_size=block_size)
            got, (staged, fell_back) = counted(run)
            what = f"{name} {out} {dp}"
            # (short rows: the bad scale is in every row, so in every gathered piece)
            assert staged > 0 or (hard and name == "per-axis 1, short rows"), what
            if hard:
                assert fell_back > 0, what
            elif scale_mode == "divide":
                assert fell_back == 0, what  # (the reciprocal: exact quotients of the first third)
            assert_same_bits(got, reference(run), what)
            assert_same_bits(got, double_loop(run), what)


def test_one_bad_scale_sends_its_piece_to_the_double_loop():
    # The per-parameter lane check: ordinary x everywhere (every element on the remainder
    # loops' lanes but for the scale), one block's scale outside them, kept subnormal
    # (x / s is then an ordinary quotient: only the scale's check sees it). Whole blocks of
    # 32 in pieces of 1024 (one thread, 4 pieces): the block's piece alone falls back.
    rng = np.random.default_rng(22)
    x = f32(rng.standard_normal((2, 2048)) * 30)
    for bad in BAD_SCALES:
        scales = f32(rng.uniform(0.05, 3, (2, 64)))
        scales[1, 40] = bad
        xb = x.copy()
        xb[1, 40 * 32:41 * 32] *= np.float32(1e-39) if bad == 1e-39 else np.float32(1)
        for sc in ("divide", "reciprocal"):
            dp = qemu_q.Datapath(rounding="half_away", scale=sc, scale_precision="float64")

            def run():
                return qemu_q.quantize_linear(xb, scales, output_dtype="float8e4m3fn", datapath=dp, axis=1,
                                              block_size=32, n_threads=1)
            got, counts = counted(run)
            assert counts == (3, 1), (bad, sc, counts)
            assert_same_bits(got, reference(run), f"{bad} {sc}")


@pytest.mark.parametrize("out", ["int8", "float8e4m3fn"])
def test_remainder_loops_on_layouts_against_the_oracle(out):
    # a pool of scales (few oracle calls), blocked 24 with a ragged last block and per
    # axis 1 with short rows, exact quotients on the ties
    from test_datapath_fast import _oracle_by_parameter
    rng = np.random.default_rng(23)
    pool = [0.37, 123 / 2048, 1 / 3, 0.25]
    zero_point_pool = np.array([-3, 7], np.int8)
    for (shape, axis, block_size), sc, rounding in zip(
            [((4, 100), 1, 24), ((20, 30), 1, 0)], ("divide", "reciprocal"), ("half_away", "to_odd")):
        n = -(-shape[axis] // block_size) if block_size else shape[axis]
        pshape = (shape[0], n) if block_size else (n,)
        # (123/2048 makes one random x in ~250 an exact even quotient: not with the reciprocal)
        use = pool if sc == "divide" else [0.37, 0.1, 1 / 3, 0.25]
        scales = f32(np.asarray(use)[rng.integers(0, len(use), pshape)])
        zero_point = zero_point_pool[rng.integers(0, 2, pshape)] if out == "int8" else None
        from test_datapath_fast import _per_element
        s = _per_element(scales, shape, axis, block_size).astype(np.float64)
        # on the ties and beside them (the reciprocal: beside only, where exact quotients
        # of a non-power-of-two scale send the pieces to the double loop)
        offsets = [0, 2.0 ** -20, -(2.0 ** -20)] if sc == "divide" else [2.0 ** -18, -(2.0 ** -18)]
        q = np.round(rng.uniform(-60, 60, shape) * 2) / 2 + rng.choice(offsets, shape)
        x = f32(q * s)
        if sc == "reciprocal":
            # a float32 x that lands on an exact quotient of a non-power-of-two scale moved
            # off it (a hard lane: the piece would go to the double loop)
            z = x.astype(np.float64) / s
            on_grid = (z * s == x) & (z.astype(np.float32) == z) & (s != 0.25)
            x = np.where(on_grid, np.nextafter(x, np.float32(np.inf)), x)
        dp = {"rounding": rounding, "scale": sc, "scale_precision": "float64"}
        got, (staged, _) = counted(lambda: qemu_q.quantize_linear(
            x, scales, zero_point, output_dtype=out, datapath=qemu_q.Datapath(**dp), axis=axis,
            block_size=block_size))
        assert staged > 0, (shape, dp, _)
        want = _oracle_by_parameter(x, scales, zero_point, out, dp, None, axis, block_size)
        check(got, want, f"{shape} {dp}")


def test_remainder_loops_on_layouts_threads_and_levels():
    # every level the machine runs, 1-3 threads, float32 and float16 x, against
    # datapath_one
    rng = np.random.default_rng(24)
    level = _kernels.active.level
    cases = []
    for name, shape, axis, block_size, _ in (STAGED_LAYOUTS[0], STAGED_LAYOUTS[3], STAGED_LAYOUTS[4]):
        x, scales = staged_case(shape, axis, block_size, rng, True)
        cases.append((x, scales, axis, block_size, "int8", "reciprocal"))
    x16 = f32(rng.standard_normal((6, 700)) * 30).astype(np.float16)
    cases.append((x16, f32(rng.uniform(0.05, 3, 700)).astype(np.float16), 1, 0, "float8e4m3fn", "divide"))
    try:
        for x, scales, axis, block_size, out, sc in cases:
            dp = qemu_q.Datapath(rounding="half_down", scale=sc, scale_precision="float64")

            def run(n=None):
                return qemu_q.quantize_linear(x, scales, output_dtype=out, datapath=dp, axis=axis,
                                              block_size=block_size, n_threads=n)
            want = reference(run)
            for lv in LEVELS:
                _kernels.use(lv)
                assert staged_feed(x, scales, out, dp, axis, block_size).startswith("staged"), lv
                for n in (1, 2, 3):
                    got, (staged, _) = counted(lambda: run(n))
                    assert staged > 0, (lv, n)
                    assert_same_bits(got, want, f"{lv} {x.dtype} {axis} {block_size} n_threads={n}")
    finally:
        _kernels.use(level)


def fused_and_two_passes(module, run, what):
    """run() as it runs, with nearest_divide_one off (set_nearest_quotients(False)) and with
    the fused loops off too (the two passes: set_fused_staging(False)), each checked
    against the reference; returns the pieces of the run with the fused loops but not
    nearest_divide_one: (staged, fell back, fused)."""
    got = run()
    module.count_fused_pieces()
    fused_run, (staged, fell_back) = nearest_off(lambda: counted(run))
    fused = module.count_fused_pieces()
    two_passes, _ = switched_off("set_fused_staging", lambda: nearest_off(lambda: counted(run)))
    assert module.count_fused_pieces() == 0
    want = reference(run)
    for result in (got, fused_run, two_passes):
        assert_same_bits(result, want, what)
    return staged, fell_back, fused


@pytest.mark.parametrize("scale_mode", ["divide", "reciprocal"])
def test_the_fused_loop_same_bits_as_the_two_passes(scale_mode):
    # Pieces with one zero point (integer codes: symmetric, or one value everywhere; the
    # ONNX small floats: +0 or -0 everywhere) are staged and rounded in one loop
    # (stage_round, stage_round_small_float); set_fused_staging(False) stages into a buffer and
    # rounds in a second pass. Every mode, the flushes, hard and ordinary data, a piece the
    # fused loop refuses (then the double loop), 1 and 2 threads.
    module = quantize_module()
    rng = np.random.default_rng(25)
    subs = ["keep", "flush_inputs", "flush_outputs", "flush_both"]
    for hard in (False, True):
        for i, (name, shape, axis, block_size, _) in enumerate(STAGED_LAYOUTS):
            x, scales = staged_case(shape, axis, block_size, rng, hard)
            for j, rounding in enumerate(ROUNDINGS):
                out = ("int8", "uint8", "int4", "int16", "float8e4m3fn", "float8e5m2", "float8e4m3fnuz")[(i + j) % 7]
                zero_point = {"int8": np.full(scales.shape, -3, np.int8),
                              "uint8": np.full(scales.shape, 128, np.uint8)}.get(out)
                dp = qemu_q.Datapath(rounding=rounding, scale=scale_mode, scale_precision="float64",
                                     subnormals=subs[(i + j) % 4], nan_to_integer=("min", "zero", "max")[j % 3])

                def run():
                    return qemu_q.quantize_linear(x, scales, zero_point, output_dtype=out, datapath=dp, axis=axis,
                                                  block_size=block_size, n_threads=1 + j % 2)
                what = f"{name} {out} {dp} hard={hard}"
                staged, _, fused = fused_and_two_passes(module, run, what)
                assert 0 < fused <= staged or (hard and staged == 0), what
    # several zero points (+0 and -0 are two): the two passes
    x, scales = staged_case((3, 2048), 1, 32, rng, False)
    dp = qemu_q.Datapath(scale=scale_mode, scale_precision="float64")
    for zero_point, out in ((rng.integers(-5, 5, scales.shape).astype(np.int8), "int8"),
                            (zero_points_for("float8e4m3fn", scales, rng, uniform=False), "float8e4m3fn")):
        module.count_fused_pieces()
        got, (staged, _) = counted(lambda: qemu_q.quantize_linear(x, scales, zero_point, output_dtype=out,
                                                                  datapath=dp, axis=1, block_size=32))
        assert staged > 0 and module.count_fused_pieces() == 0, out


@pytest.mark.parametrize("lv", LEVELS)
@pytest.mark.parametrize("hard", [False, True], ids=["ordinary", "hard"])
def test_one_scale_takes_the_fused_loop(hard, lv):
    level = _kernels.active.level
    _kernels.use(lv)
    try:
        one_scale_takes_the_fused_loop(hard)
    finally:
        _kernels.use(level)


def one_scale_takes_the_fused_loop(hard):
    # One scale and one zero point over a long run (per tensor; per axis along the first
    # axis: run_datapath_wide) under a float64 quotient: each piece of 512 is staged and
    # rounded in one pass (run_fused_one_scale, stage_round_one); a piece the fused loop
    # refuses is written by the double loop. Same bits as the two passes and as the
    # reference, every mode and flush, divide and reciprocal (integer codes under a
    # reciprocal: the direct double loops for float32 x in their modes, else the two passes),
    # float32 and float16 x, 1 and 2 threads.
    module = quantize_module()
    rng = np.random.default_rng(26)
    subs = ["keep", "flush_inputs", "flush_outputs", "flush_both"]
    for k, shape in enumerate([(5000,), (40, 1500)]):
        if len(shape) == 1:
            scales = np.float32(0.37)
            x, _ = staged_case(shape, 0, 0, rng, hard)
        else:
            scales = f32(rng.uniform(0.05, 3, shape[0]))
            scales[::4] = f32([0.25, 123 / 2048, 105 / 64, 2.0])[rng.integers(0, 4, scales[::4].size)]
            x = (rng.standard_normal(shape) * 30 * scales[:, None]).astype(np.float32)
            exact = (np.round(x * 2 / scales[:, None]) / 2).astype(np.float32) * scales[:, None]
            x[::3] = exact[::3]  # x = B * s on every third row (exact even quotients among them)
            x.reshape(-1)[::97] = 0.0
            if hard:
                x[0, :5] = f32([3e38, 2.0 ** -110, np.nan, -np.inf, -1e-40])
                scales[5] = 1e-39  # outside the remainder loops' lane: its row takes the double loop
        for j, rounding in enumerate(ROUNDINGS):
            out = ("int8", "uint8", "int4", "int16", "float8e4m3fn", "float8e5m2", "float4e2m1")[(j + k) % 7]
            zero_point = {"int8": np.full(np.shape(scales), -3, np.int8),
                          "uint8": np.full(np.shape(scales), 128, np.uint8)}.get(out)
            with np.errstate(over="ignore"):  # (3e38 is inf in float16)
                xs = x if j % 2 == 0 else x.astype(np.float16)
            for scale_mode in ("divide", "reciprocal"):
                dp = qemu_q.Datapath(rounding=rounding, scale=scale_mode, scale_precision="float64",
                                     subnormals=subs[(j + k) % 4])

                def run():
                    return qemu_q.quantize_linear(xs, scales, zero_point, output_dtype=out, datapath=dp,
                                                  axis=0, n_threads=1 + j % 2)
                what = f"{shape} {out} {xs.dtype} {dp} hard={hard}"
                staged, fell_back, fused = fused_and_two_passes(module, run, what)
                if scale_mode == "divide" or out.startswith("float"):
                    assert 0 < fused <= staged, (what, fused, staged, fell_back)
                    assert fell_back > 0 or not hard, what
                elif len(shape) == 1:
                    # integer codes under a reciprocal: float32 x takes the direct double
                    # loop in its modes (nothing staged), else the two passes (per axis, a task's
                    # edge inside a row leaves a short run, which the buffered feeding
                    # gathers and fuses, reciprocal or not)
                    direct = xs.dtype == np.float32 and rounding in DIRECT_RECIPROCAL_MODES
                    assert fused == 0 and ((staged == 0) if direct else (staged > 0)), what
