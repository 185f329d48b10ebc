"""DequantizeLinear's vectorized datapath loops (pyx/_dequantize.pyx, datapath_fast_range;
pyx/_dequantize_datapath_loops.pxi.tp): 8- and 16-bit integer codes and 8-bit small floats
under a qemu_q.Datapath, every mode into float32 / float16 / bfloat16.

Each result is checked against the exact oracle of tests/test_datapath_dequantize_cast.py
(docs/semantics.md, "DequantizeLinear under a datapath", written from the text: exact
float64 products rounded by the table of modes, itself checked against Fractions there),
generalized here to zero points and one scale per element, and against the general scalar
loop (run_datapath, which `FAST_KERNELS = False` keeps). The samples are structured: exact
ties of each output precision and their neighbours (scales whose products land on the
midpoints), the overflow boundary, the flush thresholds of codes, scales and results,
NaN / inf / zero scales, every layout (one scale, one per element along the last axis, one
per row of an inner axis, blocks) with lengths crossing the 512-product staging chunk, 1-3
threads and every instruction-set level the machine runs.
"""

from __future__ import annotations

import itertools
import math
import sys

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import _dispatch, _kernels
from support import bits

import test_datapath_dequantize_cast as base

ROUNDINGS = base.ROUNDINGS
OUTS = ("float32", "float16", "bfloat16")
LEVELS = _kernels.available_levels()
TWO128 = 2.0 ** 128

# (numpy dtype, lowest, highest) of the integer codes of the fast loops.
INTEGERS = {"int8": (np.int8, -128, 127), "uint8": (np.uint8, 0, 255),
            "int16": (np.int16, -32768, 32767), "uint16": (np.uint16, 0, 65535),
            "int4": (ml_dtypes.int4, -8, 7), "uint4": (ml_dtypes.uint4, 0, 15)}


def dq_module():
    return sys.modules["qemu_q.ops.dequantize_linear"]


def oracle(d: np.ndarray, s: np.ndarray, scale_type: str, out: str, datapath: dict, words) -> np.ndarray:
    """docs/semantics.md steps 1-6 on exact x - zero_point values d (float64, NaN for a NaN
    code; codes already flushed where step 1 says) and one scale per element s (float64)."""
    rounding = datapath.get("rounding", "half_even")
    subnormals = datapath.get("subnormals", "keep")
    precision = datapath.get("scale_precision")
    s = s.astype(np.float64).copy()
    if subnormals in ("flush_inputs", "flush_both"):
        scale_min = {"float": 2.0 ** -126, "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}[scale_type]
        s = np.where(np.abs(s) < scale_min, np.copysign(0.0, s), s)
    with np.errstate(invalid="ignore", over="ignore"):
        product = d * s  # exact: at most 17 + 24 significant bits
    want = np.zeros(d.shape, np.uint64)
    finite = np.isfinite(product) & (product != 0)
    want[~finite] = base.ieee_bits(product[~finite], out)
    x = product[finite]
    w = np.asarray(words)[finite] if words is not None else np.zeros(x.shape, np.uint32)
    if precision == "float32" and out != "float32":
        r = base.round_to(x, 23, -126, "half_even", w)
        x = np.where(np.signbit(x), -1.0, 1.0) * np.where(r > base.IEEE["float32"][2], np.inf, r)
    rounded = np.zeros(x.shape, np.uint64)
    inf, zero = np.isinf(x), x == 0
    rounded[inf | zero] = base.ieee_bits(x[inf | zero], out)
    ok = ~inf & ~zero
    rounded[ok] = base.round_ieee(x[ok], out, rounding, w[ok], subnormals in ("flush_outputs", "flush_both"))
    want[finite] = rounded
    if datapath.get("nan", "spec") == "canonical":
        want[np.isnan(product)] = base.CANONICAL_NAN[out]
    else:
        nan = np.isnan(d)
        want[nan] = base.QUIET[out] | np.where(np.signbit(d[nan]), base.SIGN[out], 0).astype(np.uint64)
    return want


def general(*args, **kwargs):
    """The same call on the general datapath loop (run_datapath)."""
    _dispatch.FAST_KERNELS = False
    try:
        return qemu_q.dequantize_linear(*args, **kwargs)
    finally:
        _dispatch.FAST_KERNELS = True


def words_for(shape, seed):
    return base.words_for(shape, seed)


def check_both(codes, scale, zp, d, s, scale_type, out, datapath, words, what, **kw):
    got = qemu_q.dequantize_linear(codes, scale, zp, output_dtype=out, datapath=qemu_q.Datapath(**datapath),
                                   random_bits=words, **kw)
    base.check(got, oracle(d, s, scale_type, out, datapath, words), f"{what} {out} {datapath} (oracle)")
    ref = general(codes, scale, zp, output_dtype=out, datapath=qemu_q.Datapath(**datapath),
                  random_bits=words, **{k: v for k, v in kw.items() if k != "n_threads"})
    base.check(got, bits(ref), f"{what} {out} {datapath} (general loop)")


# ------------------------------------------------------------ ties and their neighbours

def tie_scales(out: str) -> list[float]:
    """float32 scales whose products with small odd codes land on midpoints of `out`
    (and next to them): few significant bits above out's precision, odd."""
    rng = np.random.default_rng({"float32": 1, "float16": 2, "bfloat16": 3}[out])
    m = base.IEEE[out][0]
    scales = []
    # normal results: mantissas of m + 2 bits; subnormal results of out (float16: below
    # 2**-14; bfloat16: below 2**-126): the same mantissas placed there
    for exponent in (0, -9, 30, -(base.IEEE[out][1] * -1) - 6):
        for k in rng.integers(2 ** (m + 1), 2 ** (m + 2), size=4):
            scales.append(math.ldexp(float(int(k) | 1), exponent - m - 1))
    # the overflow boundaries: 31 * 1082401 * 2**103 is float32's largest finite plus half
    # an ulp, a tie between it and 2**128; float16's is 65520 = 65504 + 16
    scales += [1082401 * 2.0 ** 103, 2.0 ** 127 * 1.5, 65520.0 / 31, 65504.0 / 31]
    return [s for s in scales if abs(s) < 3.4e38]


@pytest.mark.parametrize("out", OUTS)
def test_ties_and_neighbours_every_mode(out):
    codes = np.arange(-128, 128, dtype=np.int32).astype(np.int8)
    scales = np.array(tie_scales(out), np.float32)
    for scale in scales:
        s = np.full(codes.shape, float(scale))
        for rounding in ROUNDINGS:
            words = words_for(codes.shape, 5) if rounding == "stochastic" else None
            for datapath in ({"rounding": rounding},
                             {"rounding": rounding, "subnormals": "flush_outputs", "nan": "canonical"}):
                got = qemu_q.dequantize_linear(codes, scale, output_dtype=out, datapath=qemu_q.Datapath(**datapath),
                                               random_bits=words)
                base.check(got, oracle(codes.astype(np.float64), s, "float", out, datapath, words),
                           f"int8 * {float(scale)!r} -> {out} {datapath}")


def test_ties_exist_in_the_sample():
    # The tie sample means something only if it holds ties: count the products on a
    # midpoint of each output (the oracle's half_even and half_away differ exactly there).
    codes = np.arange(-128, 128, dtype=np.int32).astype(np.float64)
    for out in OUTS:
        m, e, _ = base.IEEE[out]
        ties = 0
        for scale in np.array(tie_scales(out), np.float32):
            x = codes[codes != 0] * float(scale)
            x = x[np.abs(x) < 2.0 ** 128]
            w = np.zeros(x.shape, np.uint32)
            ties += int(np.sum(base.round_to(x, m, e, "half_even", w) != base.round_to(x, m, e, "half_away", w)))
        assert ties > 50, (out, ties)


# ------------------------------------------------------- every code type and layout

def layout_case(rng, kind, shape, axis, block):
    """codes, scale, zero point, and the per-element d = x - zp and s of a layout."""
    if kind in INTEGERS:
        dtype, lo, hi = INTEGERS[kind]
        values = rng.integers(lo, hi + 1, size=shape)
        codes = values.astype(dtype)
    else:
        raw = rng.integers(0, 256, size=shape).astype(np.uint8)
        codes = raw.view(getattr(ml_dtypes, base.SMALL[kind]))
        values = codes.astype(np.float64)
    if axis is None:
        sshape = ()
    elif block:
        sshape = tuple(n // block if i == axis else n for i, n in enumerate(shape))
    else:
        sshape = (shape[axis],)
    scale = (rng.random(sshape) * 2 + 0.01).astype(np.float32) * np.float32(rng.choice([-1, 1]))
    if kind in INTEGERS:
        dtype, lo, hi = INTEGERS[kind]
        zp = np.asarray(rng.integers(lo, hi + 1, size=sshape)).astype(dtype)
        zvalues = zp.astype(np.float64)
    else:
        zp, zvalues = None, np.zeros(sshape)
    if axis is None:
        s, z = np.broadcast_to(scale.astype(np.float64), shape), np.broadcast_to(zvalues, shape)
    elif block:
        s = np.repeat(scale.astype(np.float64), block, axis=axis)
        z = np.repeat(zvalues, block, axis=axis)
    else:
        view = [1] * len(shape)
        view[axis] = shape[axis]
        s = np.broadcast_to(scale.astype(np.float64).reshape(view), shape)
        z = np.broadcast_to(zvalues.reshape(view), shape)
    return codes, scale, zp, values.astype(np.float64) - z, s


# (shape, axis, block size): one scale; one per element of the last axis; one per row of
# an inner axis; blocks along the last axis and along an inner one. Lengths cross the
# 512-product staging chunk and leave vector tails.
LAYOUTS = [((1037,), None, 0), ((3, 701), 1, 0), ((5, 3, 117), 1, 0), ((4, 96), 1, 32),
           ((64, 9), 0, 16)]


@pytest.mark.parametrize("kind", list(INTEGERS) + ["float8e4m3fn", "float8e5m2"])
def test_every_code_type_and_layout(kind):
    rng = np.random.default_rng(abs(hash(kind)) % 1000)
    modes = ROUNDINGS if kind in ("int8", "uint16", "float8e4m3fn") else ("half_up", "to_odd", "stochastic")
    for (shape, axis, block), out, rounding in itertools.product(LAYOUTS, OUTS, modes):
        codes, scale, zp, d, s = layout_case(rng, kind, shape, axis, block)
        words = words_for(shape, 7) if rounding == "stochastic" else None
        kw = {} if axis is None else {"axis": axis, "block_size": block}
        check_both(codes, scale, zp, d, s, "float", out, {"rounding": rounding}, words,
                   f"{kind} {shape} axis={axis} block={block}", n_threads=int(rng.integers(1, 4)), **kw)


def test_packed_int4_takes_the_fast_loops():
    rng = np.random.default_rng(4)
    codes, scale, zp, d, s = layout_case(rng, "int4", (6, 2048), 1, 32)
    words = words_for(codes.shape, 8)
    for out, rounding in (("float32", "stochastic"), ("float16", "half_down"), ("bfloat16", "up")):
        datapath = qemu_q.Datapath(rounding=rounding, subnormals="flush_both")
        w = words if rounding == "stochastic" else None
        got = qemu_q.dequantize_linear(qemu_q.pack(codes), scale, zp, axis=1, block_size=32,
                                       packed=True, dtype="int4", shape=codes.shape, output_dtype=out,
                                       datapath=datapath, random_bits=w, n_threads=2)
        base.check(got, oracle(d, s, "float", out, {"rounding": rounding, "subnormals": "flush_both"}, w),
                   f"packed int4 {out} {rounding}")


# ------------------------------------------- flushes, precisions, NaN / inf / 0 scales

@pytest.mark.parametrize("out", OUTS)
def test_flush_thresholds_precisions_and_special_scales(out):
    codes = np.array([0, 1, -1, 2, -2, 3, 5, 7, 100, -127, 127, 31], np.int8)
    d = codes.astype(np.float64)
    min_normal = 2.0 ** base.IEEE[out][1]
    # scales at the scale's own flush threshold (float32 2**-126 and its neighbour below),
    # products at and around the output's smallest normal (before and after rounding:
    # tininess after rounding), NaN, inf, zeros of both signs
    scales = [2.0 ** -126, float(np.nextafter(np.float32(2.0 ** -126), np.float32(0))),
              min_normal, min_normal * (1 - 2.0 ** -12), min_normal / 3 * (1 + 2.0 ** -20),
              min_normal * 0.5, -min_normal * (1 - 2.0 ** -9), 0.1, 1 / 3,
              float("nan"), float("inf"), float("-inf"), 0.0, -0.0]
    for scale, rounding, subnormals, precision, nan in itertools.product(
            np.array(scales, np.float32), ("half_even", "up", "toward_zero", "half_away", "stochastic"),
            base.SUBNORMALS, (None, "float32", "float64"), ("spec", "canonical")):
        datapath = {"rounding": rounding, "subnormals": subnormals, "scale_precision": precision, "nan": nan}
        words = words_for(codes.shape, 9) if rounding == "stochastic" else None
        check_both(codes, scale, None, d, np.full(d.shape, float(scale)), "float", out, datapath, words,
                   f"int8 * {float(scale)!r}")


def test_small_float_code_flush_and_nan_codes():
    # every e4m3fn / e5m2 code, a NaN scale and a subnormal-code flush, float16 scale
    for name, out, scale in itertools.product(("float8e4m3fn", "float8e5m2"), OUTS,
                                              (np.float16(0.3), np.float16(np.nan), np.float16(6e-8))):
        raw = np.arange(256, dtype=np.int32).astype(np.uint8)
        codes = raw.view(getattr(ml_dtypes, base.SMALL[name]))
        values = codes.astype(np.float64)
        x_min = base.dq_min_normal(name)
        for subnormals in ("keep", "flush_both"):
            d = values
            if subnormals == "flush_both":
                d = np.where((np.abs(values) < x_min) & (values != 0), np.copysign(0.0, values), values)
            datapath = {"rounding": "down", "subnormals": subnormals}
            check_both(codes, scale, None, d - 0.0, np.full(d.shape, float(scale)), "float16", out,
                       datapath, None, f"{name} * float16 {float(scale)!r}")


# ---------------------------------------------------- threads, levels, the plan field

def test_threads_and_levels_agree_on_the_fast_loops():
    rng = np.random.default_rng(6)
    codes = rng.integers(-32768, 32768, size=(3, 20011)).astype(np.int16)
    scale = np.array([0.1, -3.7e-5, 2.0 ** -140], np.float32)
    words = words_for(codes.shape, 10)
    level = _kernels.active.level
    results = []
    try:
        for lv, threads in itertools.product(LEVELS, (1, 2, 3)):
            _kernels.use(lv)
            for out, rounding in (("float32", "half_down"), ("float16", "stochastic"), ("bfloat16", "to_odd")):
                datapath = qemu_q.Datapath(rounding=rounding, subnormals="flush_outputs")
                w = words if rounding == "stochastic" else None
                results.append(((out, rounding), lv, threads,
                                bits(qemu_q.dequantize_linear(codes, scale, axis=0, output_dtype=out,
                                                              datapath=datapath, random_bits=w,
                                                              n_threads=threads))))
    finally:
        _kernels.use(level)
    first = {}
    for key, lv, threads, got in results:
        if key not in first:
            first[key] = got
            d = codes.astype(np.float64)
            s = np.broadcast_to(scale.astype(np.float64)[:, None], codes.shape)
            w = words if key[1] == "stochastic" else None
            base.check(got, oracle(d, s, "float", key[0], {"rounding": key[1], "subnormals": "flush_outputs"}, w),
                       f"{key} oracle")
        base.check(got, first[key], f"{key} {lv} n_threads={threads}")


def config_of(x_dtype, datapath, scale_dtype=np.float32):
    plan = dq_module().dequantize_plan(None, (np.dtype(x_dtype), (4,)), (np.dtype(scale_dtype), ()), None,
                                       1, 0, None, _dispatch.FAST_KERNELS, datapath)
    return plan, plan.kernel_config()


def test_the_plan_says_which_loop_runs_at_every_level():
    up = qemu_q.Datapath(rounding="up")
    for x_dtype in (np.int8, np.uint8, np.int16, np.uint16, ml_dtypes.int4, ml_dtypes.uint4,
                    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        assert config_of(x_dtype, up)[1].fast_datapath, x_dtype
        assert not config_of(x_dtype, qemu_q.Datapath())[1].fast_datapath, x_dtype  # the ONNX kernels
    assert not config_of(np.int32, up)[1].fast_datapath  # 32-bit codes: the general loop
    _dispatch.FAST_KERNELS = False
    try:
        assert not config_of(np.int8, up)[1].fast_datapath
    finally:
        _dispatch.FAST_KERNELS = True
    # each level's module builds the plan's config with the field set, and runs it
    plan, _ = config_of(np.int8, up)
    fields = dict(plan.kernel_fields)
    level = _kernels.active.level
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            module = _dispatch.entry_module(_dispatch.Path.DEQUANTIZE)
            assert lv == "baseline" or lv.replace("-", "_") in module.__name__
            assert module.DequantizeConfig(**fields).fast_datapath
            # 1 + 3 * 2**-23 is 0x3C01 upward in float16, -1 - 3 * 2**-23 is 0xBC00, and
            # 3 + 9 * 2**-23 is 0x4201
            got = qemu_q.dequantize_linear(np.array([1, -1, 3], np.int8), np.float32(1 + 2.0 ** -23 * 3),
                                           output_dtype="float16", datapath=up)
            assert bits(got).tolist() == [0x3C01, 0xBC00, 0x4201], lv
    finally:
        _kernels.use(level)
    # the config refuses the fast loops without a datapath, and for 32-bit codes
    module = _dispatch.entry_module(_dispatch.Path.DEQUANTIZE)
    with pytest.raises(ValueError, match="fast datapath loops"):
        module.DequantizeConfig(**{**fields, "datapath": False, "float32_parameters": True, "fast_datapath": True})
    with pytest.raises(ValueError, match="fast datapath loops"):
        module.DequantizeConfig(**{**dict(config_of(np.int32, up)[0].kernel_fields), "fast_datapath": True})
