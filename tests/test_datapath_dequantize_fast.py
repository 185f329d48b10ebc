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


def test_float32_short_blocks_share_the_one_pass_pieces():
    # Blocks of at most 128 along the last axis share the one-pass float32 loops' 512-element
    # pieces (their scales and zero points spread per element; datapath_fused_f32_range):
    # blocks of 48 and 128 with a short last block per row (250 = 5 * 48 + 10), so that
    # blocks cross pieces and rows; one block of products beyond the largest finite flags
    # its piece (handed back with the spread parameters); 129, just above, a call per block.
    rng = np.random.default_rng(15)
    for block, cols in ((48, 250), (128, 300), (129, 300)):
        shape = (7, cols)
        nb = -(-cols // block)
        codes = rng.integers(-128, 128, size=shape).astype(np.int8)
        scale = ((rng.random((7, nb)) * 2 + 0.01) * rng.choice([-1, 1], (7, nb))).astype(np.float32)
        scale[3, 1] = np.float32(3e38)
        zp = rng.integers(-128, 128, size=(7, nb)).astype(np.int8)
        s = np.repeat(scale.astype(np.float64), block, axis=1)[:, :cols]
        z = np.repeat(zp.astype(np.float64), block, axis=1)[:, :cols]
        d = codes.astype(np.float64) - z
        for rounding in ROUNDINGS:
            words = words_for(shape, 9) if rounding == "stochastic" else None
            for options in ({"rounding": rounding}, {"rounding": rounding, "subnormals": "flush_both",
                                                     "nan": "canonical"}):
                check_both(codes, scale, zp, d, s, "float", "float32", options, words,
                           f"block={block} cols={cols}", axis=1, block_size=block,
                           n_threads=int(rng.integers(1, 4)))


@pytest.mark.parametrize("block", [56, 50])
def test_float32_blocks_stepped_from_a_piece_inside_a_block(block):
    # Packed codes are unpacked 4096 at a time, and each piece starts the block stepping of
    # datapath_fused_f32_range anew, at element 4096: row 8, column 96, inside a block.
    # Rows of 500: blocks of 56 leave a short last block per row (the parameters spread per
    # element), blocks of 50 divide the rows (the blocks loop, its first block the partial
    # one). A block of products beyond the largest finite hands its piece back, in the
    # first piece and in the one starting inside a block (the staged loops then read each
    # element's block from that offset). Scales below float32's smallest normal, +-0 among them, for flush_inputs (the
    # once-per-call flushed scales).
    rng = np.random.default_rng(31)
    shape = (9, 500)
    nb = -(-shape[1] // block)
    codes = rng.integers(-8, 8, size=shape).astype(ml_dtypes.int4)
    scale = ((rng.random((9, nb)) * 2 + 0.01) * rng.choice([-1, 1], (9, nb))).astype(np.float32)
    scale[8, 1] = np.float32(2.0 ** -127)
    scale[8, 2] = np.float32(-(2.0 ** -149) * 5)
    scale[0, 0], scale[1, 0], scale[8, 3] = np.float32(0.0), np.float32(-0.0), np.float32(2.0 ** -126)
    scale[4, 2] = scale[8, 4] = np.float32(3e38)
    zp = rng.integers(-8, 8, size=(9, nb)).astype(ml_dtypes.int4)
    s = np.repeat(scale.astype(np.float64), block, axis=1)[:, :shape[1]]
    d = codes.astype(np.float64) - np.repeat(zp.astype(np.float64), block, axis=1)[:, :shape[1]]
    words = words_for(shape, 32)
    level = _kernels.active.level
    try:
        for rounding in ROUNDINGS:
            w = words if rounding == "stochastic" else None
            for options in ({"rounding": rounding}, {"rounding": rounding, "subnormals": "flush_inputs"}):
                kw = dict(axis=1, block_size=block, packed=True, dtype="int4", shape=shape, output_dtype="float32",
                          datapath=qemu_q.Datapath(**options), random_bits=w)
                what = f"int4 blocks of {block} {options}"
                want = oracle(d, s, "float", "float32", options, w)
                base.check(bits(general(qemu_q.pack(codes), scale, zp, **kw)), want, f"{what} (general)")
                for lv in LEVELS:  # every level's loops
                    _kernels.use(lv)
                    got = qemu_q.dequantize_linear(qemu_q.pack(codes), scale, zp, n_threads=2, **kw)
                    base.check(got, want, f"{what} {lv}")
    finally:
        _kernels.use(level)


def test_float32_one_pass_ties_at_binade_edges():
    # half_up / half_down find a tie as g = f - 2r with f - g == 2r (r = f - d * s,
    # docs/semantics.md): where the two neighbours straddle a power of two the gap below it
    # is half the gap above. 31 * 1082401 = 2**25 - 1 (the midpoint of 2**25 - 2 and 2**25:
    # f = 2**25, the tie toward zero), 3 * 11184811 = 2**25 + 1 (of 2**25 and 2**25 + 2:
    # f = 2**25, the tie away from zero), both signs of code and scale, the products normal
    # down to 2**-124 (a subnormal scale, 1082401 * 2**-149) and up to 2**105.
    codes = np.arange(-128, 128, dtype=np.int32).astype(np.int8)
    scales = [sign * m * 2.0 ** k for m in (1082401, 11184811) for k in (-149, -60, 0, 80) for sign in (1, -1)]
    scales = [sc for sc in scales if np.float32(sc) == sc and np.float32(sc) != 0]
    codes2, scale = fused_rows(codes, scales)
    d = codes2.astype(np.float64)
    s = np.broadcast_to(scale.astype(np.float64)[:, None], codes2.shape)
    zp = np.zeros(len(scale), np.int8)
    w0 = np.zeros(codes2.shape, np.uint32)
    x = (d * s)[d != 0]
    ties = base.round_to(np.abs(x), 23, -126, "half_up", w0[d != 0]) != base.round_to(np.abs(x), 23, -126, "half_down", w0[d != 0])
    assert ties.sum() >= 2 * len(scales), ties.sum()
    level = _kernels.active.level
    try:
        for lv, rounding in itertools.product(LEVELS, ROUNDINGS):  # every level's loops
            _kernels.use(lv)
            w = words_for(codes2.shape, 33) if rounding == "stochastic" else None
            check_both(codes2, scale, zp, d, s, "float", "float32", {"rounding": rounding}, w,
                       f"binade ties {lv}", axis=0)
            check_both(codes2.T.copy(), scale, zp, d.T, s.T, "float", "float32", {"rounding": rounding},
                       None if w is None else w.T.copy(), f"binade ties, columns {lv}", axis=1)
    finally:
        _kernels.use(level)


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
            for out, rounding in (("float32", "half_down"), ("float16", "stochastic"), ("bfloat16", "to_odd"),
                                  ("float32", "stochastic"), ("float32", "up")):
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
        # into float16 / bfloat16 the default takes the datapath loops (vectorized)
        for scale_dtype in (np.float16, ml_dtypes.bfloat16):
            assert config_of(x_dtype, qemu_q.Datapath(), scale_dtype)[1].fast_datapath, (x_dtype, scale_dtype)
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


@pytest.mark.parametrize("scale_dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_the_default_into_half_formats_equals_the_onnx_kernels(scale_dtype):
    # The default datapath into float16 / bfloat16 runs the fast datapath loops (the ONNX
    # kernels' loop there is scalar): bit for bit the ONNX kernels' general loop
    # (FAST_KERNELS=False) for every code of each kind (and zero points at the ends of its
    # range) times every float16 / bfloat16 scale pattern: NaN payloads of either sign, a
    # NaN code against a NaN scale, infinities, subnormals, zeros of either sign.
    scales = np.arange(65536, dtype=np.uint16).view(scale_dtype)
    rng = np.random.default_rng(16)
    kinds = [
        (np.arange(-128, 128, dtype=np.int8), [np.int8(-128), np.int8(127), np.int8(5)]),
        (np.arange(256, dtype=np.uint8), [np.uint8(0), np.uint8(255)]),
        (rng.integers(-32768, 32768, 64).astype(np.int16), [np.int16(-32768), np.int16(32767)]),
        (rng.integers(0, 65536, 64).astype(np.uint16), [np.uint16(65535)]),
        (np.arange(-8, 8).astype(ml_dtypes.int4), [ml_dtypes.int4(-8)]),
        (np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn), [None]),
        (np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2), [None]),
        (np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fnuz), [None]),
    ]
    kinds += [(np.arange(256, dtype=np.uint8).view(dtype), [None])
              for dtype in (ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn,
                            ml_dtypes.float6_e3m2fn)]
    kinds += [(np.arange(-2, 2).astype(ml_dtypes.int2), [ml_dtypes.int2(-2), ml_dtypes.int2(1)]),
              (np.arange(16).astype(ml_dtypes.uint4), [ml_dtypes.uint4(15)])]
    level = _kernels.active.level
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            for codes, zero_points in kinds:
                for zp in zero_points:
                    _half_formats_against_general(codes, zp, scales, (0x0001, 0x3555, 0x7BFF, 0x8400, 0xFC00, 0x7E01),
                                                  (lv, codes.dtype, zp))
    finally:
        _kernels.use(level)


def _half_formats_against_general(codes, zp, scales, columns, what, words=None, **kw):
    # Every code (a row) times every scale (a column) per axis, and the given columns per
    # tensor (one scale per call), against the general loop (random_bits: words, an
    # element's word in both)
    x = np.repeat(codes[:, None], scales.size, axis=1)
    z = None if zp is None else np.full(scales.size, zp, dtype=codes.dtype)
    if words is not None:
        kw["random_bits"] = words
    want = general(x, scales, z, axis=1, **kw)
    got = qemu_q.dequantize_linear(x, scales, z, axis=1, n_threads=2, **kw)
    mismatch = np.argwhere(bits(got) != bits(want))
    assert mismatch.size == 0, (what, [(codes[i], hex(int(bits(scales)[j])), hex(int(bits(got)[i, j])),
                                        hex(int(bits(want)[i, j]))) for i, j in mismatch[:4]])
    for j in columns:
        if words is not None:
            kw["random_bits"] = np.ascontiguousarray(words[:, j])
        one = qemu_q.dequantize_linear(codes, scales[j], zp, **kw)
        assert bits(one).tolist() == bits(want[:, j]).tolist(), (what, hex(j))


HALF_OPTIONS = [{"rounding": mode} for mode in ("half_away", "half_up", "half_down", "toward_zero", "down",
                                                "up", "to_odd", "stochastic")] + [
    {"subnormals": "flush_inputs"}, {"subnormals": "flush_outputs"}, {"subnormals": "flush_both"},
    {"nan": "canonical"}, {"scale_precision": "float32"}, {"scale_precision": "float64"},
    {"rounding": "stochastic", "subnormals": "flush_both", "nan": "canonical"}]


@pytest.mark.parametrize("scale_dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_the_options_into_half_formats_equal_the_general_loop(scale_dtype):
    # Every option on the float32 products and Cast's loops (half_products_run) against
    # the general loop's exact double products: every code of int8 (zero point 3), uint8
    # (255), float8e4m3fn, float8e5m2 and uint4 times every third float16 / bfloat16 scale
    # pattern (ties, subnormal results, overflow, NaN payloads, zeros of either sign) per
    # axis, and six scales per tensor, at each level; stochastic words at random.
    scales = np.arange(65536, dtype=np.uint16)[::3].view(scale_dtype)
    rng = np.random.default_rng(17)
    kinds = [(np.arange(-128, 128, dtype=np.int8), np.int8(3)), (np.arange(256, dtype=np.uint8), np.uint8(255)),
             (np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn), None),
             (np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2), None),
             (np.arange(16).astype(ml_dtypes.uint4), None)]
    level = _kernels.active.level
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            for codes, zp in kinds:
                words = rng.integers(0, 2**32, (codes.size, scales.size), dtype=np.uint32)
                for fields in HALF_OPTIONS:
                    datapath = qemu_q.Datapath(**fields)
                    _half_formats_against_general(codes, zp, scales, (1, 0x1555, 0x2AAA, 0x3FFF, 0x5000),
                                                  (lv, codes.dtype, fields), datapath=datapath,
                                                  words=words if datapath.rounding == "stochastic" else None)
    finally:
        _kernels.use(level)


@pytest.mark.parametrize("scale_dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_which_codes_round_float32_products_into_half_formats(scale_dtype):
    # Into float16 / bfloat16 the fast loops round float32 products by Cast's loops
    # (half_products_run) where every product of a code and a scale of scale_dtype is a
    # float32, whatever the datapath: at most 24
    # significant bits between them (8-bit integers: 8; float8 e4m3: 4; the scales 11 and
    # 8), and their last bits' product at least 2**-149 (float16 scales from 2**-24,
    # bfloat16 ones from 2**-133; e5m2fnuz's smallest code is 2**-17, e8m0's 2**-127)
    float16 = scale_dtype is np.float16
    expected = {np.int8: True, np.uint8: True, ml_dtypes.int4: True, ml_dtypes.uint2: True,
                ml_dtypes.float8_e4m3fn: True, ml_dtypes.float8_e5m2: True,  # 2**-16 * 2**-133
                ml_dtypes.float8_e4m3fnuz: True, ml_dtypes.float8_e5m2fnuz: float16,
                ml_dtypes.float4_e2m1fn: True, ml_dtypes.float6_e3m2fn: True,
                np.int16: False, np.uint16: False}
    for x_dtype, takes in expected.items():
        for datapath in (qemu_q.Datapath(), qemu_q.Datapath(rounding="stochastic"),
                         qemu_q.Datapath(subnormals="flush_both", nan="canonical", scale_precision="float64")):
            config = config_of(x_dtype, datapath, scale_dtype)[1]
            assert config.fast_datapath and config.half_from_float32 == takes, (x_dtype, datapath)
    # float32 scales (24 bits): their products with int8 codes are not float32s
    from qemu_q import _coerce

    plan = dq_module().dequantize_plan(None, (np.dtype(np.int8), (4,)), (np.dtype(np.float32), ()), None,
                                       1, 0, _coerce.output_dtype("float16" if float16 else "bfloat16"),
                                       _dispatch.FAST_KERNELS, qemu_q.Datapath())
    assert plan.out_type.name == ("float16" if float16 else "bfloat16")
    assert not plan.kernel_config().half_from_float32


def test_the_plan_names_the_one_pass_loops():
    # which code kind and parameter layout of fused_f32_* a plan runs (DequantizeConfig's
    # fused_loops): whole-byte codes their own kinds, short blocks along the last axis the
    # blocks loops where the rows hold whole blocks, else spread per element
    up = qemu_q.Datapath(rounding="up")

    def loops(x_dtype, shape, scale_shape, axis, block=0, datapath=up):
        plan = dq_module().dequantize_plan(None, (np.dtype(x_dtype), shape), (np.dtype(np.float32), scale_shape),
                                           None, axis, block, None, True, datapath)
        return plan.kernel_config().fused_loops

    kinds = {np.int8: "int8", np.uint8: "uint8", ml_dtypes.int4: "sbyte", ml_dtypes.uint4: "ubyte",
             np.int16: "sword", np.uint16: "uword", ml_dtypes.float8_e4m3fn: "small"}
    for x_dtype, kind in kinds.items():
        assert loops(x_dtype, (4,), (), 1) == (kind, "one"), x_dtype
    assert loops(np.int8, (3, 64), (64,), 1) == ("int8", "vary")
    assert loops(np.int8, (3, 64), (3,), 0) == ("int8", "one")
    assert loops(ml_dtypes.int4, (3, 64), (3, 2), 1, 32) == ("sbyte", "blocks")
    assert loops(ml_dtypes.int4, (3, 64), (3, 2), 1, 48) == ("sbyte", "vary")
    assert loops(np.int8, (3, 256), (3, 2), 1, 128) == ("int8", "blocks")
    assert loops(np.int8, (3, 258), (3, 2), 1, 129) == ("int8", "one")
    assert loops(np.int8, (64, 3), (2, 3), 0, 32) == ("int8", "vary")
    assert loops(np.int8, (4,), (), 1, datapath=qemu_q.Datapath()) is None
    assert loops(np.int8, (4,), (), 1, datapath=qemu_q.Datapath(nan="canonical")) == ("int8", "one")


# ------------------------------------- the one-pass float32 loops (fused_f32_*)
# float32 outputs run one pass per mode: f = RN32(d * s), e = d * s - f exactly (fmaf, or
# the double form at levels without FMA), the neighbour picked from e's sign and the
# ties (2e equal to the gap to the neighbour); pieces with an infinite or NaN f, tiny
# small-float products, or tiny inexact stochastic products are recomputed on the staged
# double loops (docs/semantics.md, "DequantizeLinear under a datapath").

FLT_MAX = float(np.finfo(np.float32).max)


def float32_tie_scales() -> list[float]:
    """float32 scales s = M * 2**k with d0 * M in [2**24, 2**25) and odd (M odd), so that
    d0 * s has 25 significant bits: an exact float32 midpoint, for the odd codes d0 (and
    -d0); the other codes give the neighbours. k puts the products mid-range, near 2**100
    and near 2**-120 (normal products whose ulp is 2**-143: stochastic hands those back)."""
    scales = []
    for d0 in (3, 5, 7, 9, 11, 13, 15, 17, 25, 51, 101, 127):
        lo, hi = -(-2 ** 24 // d0), (2 ** 25 - 1) // d0
        m = (lo + hi) // 2 | 1
        assert 2 ** 24 <= d0 * m < 2 ** 25 and m < 2 ** 24
        scales += [math.ldexp(m, k) for k in (-30, 80, -143)]
    return scales


def float32_boundary_scales() -> list[float]:
    """Scales whose products with int8 codes straddle float32's largest finite, 2**128 and
    the midpoint between them (infinite f: handed back), and the subnormal range (exact
    products of integer codes: subnormal results, and 2**-126 from both sides)."""
    scales = []
    for d in (1.0, 3.0, 127.0):
        s = np.float32(FLT_MAX / d)
        bits_of = int(s.view(np.uint32))
        scales += [float(np.uint32(min(bits_of + k, 0x7F7FFFFF)).view(np.float32)) for k in range(-2, 3)]
    scales += [2.0 ** -149 * 3, 2.0 ** -149 * 0x7FFFFF, 2.0 ** -126, 2.0 ** -126 / 3 * (1 + 2 ** -22),
               2.0 ** -110 * (1 + 2 ** -23), 2.0 ** -105 * 5 / 3]
    return [float(np.float32(s)) for s in scales]


def test_float32_tie_sample_holds_ties():
    # The tie scales mean something only if their products are float32 midpoints: the
    # oracle's half_up and half_down differ exactly there.
    d = np.arange(-128, 128, dtype=np.float64)
    for scale in float32_tie_scales():
        x = d[d != 0] * np.float64(np.float32(scale))
        w = np.zeros(x.shape, np.uint32)
        ties = base.round_to(x, 23, -126, "half_up", w) != base.round_to(x, 23, -126, "half_down", w)
        assert ties.sum() >= 2, scale


def fused_rows(codes_row, scales):
    """codes_row repeated once per scale: (len(scales), len(codes_row)) codes, one scale per
    row (axis 0: the one-scale loops) and its transpose (axis 1: one scale per element)."""
    codes = np.tile(codes_row, (len(scales), 1))
    return codes, np.array(scales, np.float32)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_float32_one_pass_ties_neighbours_and_boundaries(rounding):
    codes, scale = fused_rows(np.arange(-128, 128, dtype=np.int32).astype(np.int8),
                              float32_tie_scales() + float32_boundary_scales())
    zp = np.array([0, 5, -3] * (len(scale) // 3) + [0] * (len(scale) % 3), np.int8)
    d = codes.astype(np.float64) - zp[:, None]
    s = np.broadcast_to(scale.astype(np.float64)[:, None], codes.shape)
    words = words_for(codes.shape, 21)
    w = words if rounding == "stochastic" else None
    for datapath in ({"rounding": rounding},
                     {"rounding": rounding, "subnormals": "flush_both", "nan": "canonical"}):
        # one scale per row, then the transpose: one scale per element of the last axis
        check_both(codes, scale, zp, d, s, "float", "float32", datapath, w, "int8 rows", axis=0,
                   n_threads=2)
        check_both(codes.T.copy(), scale, zp, d.T, s.T, "float", "float32", datapath,
                   None if w is None else w.T.copy(), "int8 columns", axis=1)


@pytest.mark.parametrize("kind", ["uint8", "int16", "uint16", "int4", "uint4"])
def test_float32_one_pass_code_kinds(kind):
    # every code kind's loop (signed and unsigned bytes, sub-byte codes in bytes, 16-bit
    # codes) on ties, boundaries and a blocked layout, every mode
    dtype, lo, hi = INTEGERS[kind]
    values = np.unique(np.linspace(lo, hi, 64).astype(np.int64))
    scales = float32_tie_scales()[::2] + float32_boundary_scales()[::2]
    codes = np.tile(values, (len(scales), 1)).astype(dtype)
    scale = np.array(scales, np.float32)
    zp = np.asarray(np.full(len(scales), (lo + hi + 1) // 2)).astype(dtype)
    d = codes.astype(np.float64) - zp.astype(np.float64)[:, None]
    s = np.broadcast_to(scale.astype(np.float64)[:, None], codes.shape)
    for rounding in ROUNDINGS:
        w = words_for(codes.shape, 22) if rounding == "stochastic" else None
        check_both(codes, scale, zp, d, s, "float", "float32", {"rounding": rounding}, w, kind, axis=0)


def test_float32_one_pass_small_float_codes():
    # every e4m3fn / e5m2 code (NaN and inf codes hand their piece back), scales giving
    # tiny products (below 2**-100: handed back), overflow, NaN and inf scales, flushes
    for name in ("float8e4m3fn", "float8e5m2"):
        raw = np.arange(256, dtype=np.int32).astype(np.uint8)
        codes = raw.view(getattr(ml_dtypes, base.SMALL[name]))
        values = codes.astype(np.float64)
        for scale, rounding in itertools.product(
                np.array([0.3, 1 + 2.0 ** -23, 2.0 ** -118 * 3, 2.0 ** -90 / 3, 3e38, float("nan")], np.float32),
                ROUNDINGS):
            w = words_for(codes.shape, 23) if rounding == "stochastic" else None
            for subnormals, nan in (("keep", "spec"), ("flush_both", "canonical")):
                d = values
                if subnormals == "flush_both":
                    x_min = base.dq_min_normal(name)
                    d = np.where((np.abs(values) < x_min) & (values != 0), np.copysign(0.0, values), values)
                check_both(codes, scale, None, d - 0.0, np.full(d.shape, float(scale)), "float", "float32",
                           {"rounding": rounding, "subnormals": subnormals, "nan": nan}, w,
                           f"{name} * {float(scale)!r}")


def run_config(codes, scale, zp, datapath, words, axis, fallback):
    """The kernel entry of the active level on DequantizeConfig(fused_fallback=...): with
    fallback off, what the one-pass loops wrote stays, flagged pieces included."""
    plan = dq_module().dequantize_plan(None, (codes.dtype, codes.shape), (scale.dtype, scale.shape),
                                       (zp.dtype, zp.shape), axis, 0, None, True, datapath)
    module = _dispatch.entry_module(_dispatch.Path.DEQUANTIZE)
    config = module.DequantizeConfig(**{**dict(plan.kernel_fields), "fused_fallback": fallback})
    assert config.fused_float32 and config.float32_parameters
    out = np.empty(codes.size, np.float32)
    module.dequantize(codes.reshape(-1).view(np.uint8 if codes.itemsize == 1 else np.uint16),
                      scale.reshape(-1).astype(np.float32), zp.reshape(-1).astype(np.float32), out, config, 2,
                      random_bits=None if words is None else words.reshape(-1))
    return out.reshape(codes.shape)


def test_the_one_pass_loops_compute_the_bits_themselves():
    # With the hand-back off, the one-pass loops alone give the oracle's bits wherever no
    # lane is flagged (so it is they that compute them), at every level (the baseline
    # forms e in double); and pieces with an infinite product, or a tiny inexact
    # stochastic one, are flagged: alone they differ, handed back they are right.
    codes, scale = fused_rows(np.arange(-128, 128, dtype=np.int32).astype(np.int8),
                              [s for s in float32_tie_scales() if s > 2.0 ** -100] + [0.1, 2.0 ** -140])
    # 2**-117 * (1 + 2**-23): normal products of 25 bits below 2**-104, which stochastic
    # rounding hands back
    tiny = (1 + 2.0 ** -23) * 2.0 ** -117
    zp = np.zeros(len(scale), np.int8)
    d = codes.astype(np.float64)
    s = np.broadcast_to(scale.astype(np.float64)[:, None], codes.shape)
    words = words_for(codes.shape, 24)
    level = _kernels.active.level
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            for rounding in ROUNDINGS:
                # (nan="canonical", which no product here is, makes half_even a datapath)
                options = {"rounding": rounding, "nan": "canonical"}
                datapath = qemu_q.Datapath(**options)
                w = words if rounding == "stochastic" else None
                want = oracle(d, s, "float", "float32", options, w)
                base.check(run_config(codes, scale, zp, datapath, w, 0, False), want,
                           f"{lv} {rounding} one pass alone")
                # the flagged pieces: products beyond FLT_MAX + half an ulp (f infinite),
                # tiny stochastic ones
                flagged = np.array([FLT_MAX / 100, tiny if rounding == "stochastic" else 3e38], np.float32)
                fc, fz = codes[:2], zp[:2]
                fd, fs = fc.astype(np.float64), np.broadcast_to(flagged.astype(np.float64)[:, None], fc.shape)
                fw = None if w is None else w[:2]
                want = oracle(fd, fs, "float", "float32", options, fw)
                base.check(run_config(fc, flagged, fz, datapath, fw, 0, True), want, f"{lv} {rounding} handed back")
                alone = bits(run_config(fc, flagged, fz, datapath, fw, 0, False)).astype(np.uint64)
                if not rounding.startswith("half"):
                    # (an infinite f is what the half modes give there, but at the exact
                    # midpoint above the largest finite, where they hand it back)
                    assert (alone != want.reshape(alone.shape)).any(), f"{lv} {rounding}: nothing was flagged"
    finally:
        _kernels.use(level)


def test_scale_precision_that_changes_no_bit_runs_the_onnx_kernels():
    # float32 outputs: scale_precision "float32" is the output's own rounding, "float64" of
    # an exact product (codes of at most 16 bits) is the product: no datapath step, so
    # the ONNX kernels run; with another option the one-pass loops run.
    for x_dtype in (np.int8, np.uint16, ml_dtypes.float8_e4m3fn):
        for precision in ("float32", "float64"):
            plan, config = config_of(x_dtype, qemu_q.Datapath(scale_precision=precision))
            assert not dict(plan.kernel_fields)["datapath"] and config.float32_parameters, (x_dtype, precision)
            _, config = config_of(x_dtype, qemu_q.Datapath(scale_precision=precision, rounding="up"))
            assert config.fused_float32, (x_dtype, precision)
    # 32-bit codes: float64 can round the product (33 + 24 bits), the datapath stays
    plan, _ = config_of(np.int32, qemu_q.Datapath(scale_precision="float64"))
    assert dict(plan.kernel_fields)["datapath"]
    # float16 outputs keep the staged loops
    plan = dq_module().dequantize_plan(None, (np.dtype(np.int8), (4,)), (np.dtype(np.float16), ()), None,
                                       1, 0, None, True, qemu_q.Datapath(rounding="up"))
    assert not plan.kernel_config().fused_float32 and plan.kernel_config().fast_datapath


def test_the_one_pass_loops_take_nan_and_inf_codes_in_the_lane():
    # Random small-float codes hold NaN codes in nearly every piece of 512: the loops take
    # NaN and infinite codes (IEEE products, the NaN code winning) themselves, with the
    # hand-back off, canonical NaN included.
    for name in ("float8e4m3fn", "float8e5m2"):
        dtype = getattr(ml_dtypes, base.SMALL[name])
        codes = np.arange(256, dtype=np.int32).astype(np.uint8).view(dtype).reshape(1, 256)
        d = codes.astype(np.float64)
        scale, zp = np.array([0.3], np.float32), np.zeros(1, dtype)
        s = np.full(d.shape, float(scale[0]))
        for rounding, nan in itertools.product(("up", "half_away", "to_odd", "stochastic"), ("spec", "canonical")):
            options = {"rounding": rounding, "nan": nan}
            w = words_for(codes.shape, 25) if rounding == "stochastic" else None
            base.check(run_config(codes, scale, zp, qemu_q.Datapath(**options), w, 0, False),
                       oracle(d, s, "float", "float32", options, w), f"{name} {options}")
