"""DequantizeLinear of 8-bit integer codes times float32 scales into float16 / bfloat16:
the products rounded to odd at 24 bits (pyx/_dequantize.pyx, odd_products and
half_products_run; docs/semantics.md, "float32 scales into float16 / bfloat16: products
rounded to odd").

Every code of int8 and uint8 (zero points at the ends of their ranges, so |x - zero_point|
reaches 255) and of int4 times float32 scales built to land the products on float16 /
bfloat16 midpoints exactly and a few float32 ulps beside them (where RN32 of the product
would be the midpoint itself: the case the odd step exists for), at the overflow
thresholds, in the subnormal ranges and below 2**-100, float32 subnormal scales, random
ones, zeros, infinities and NaNs; per axis (one scale per element) and per row (one scale
per run); every mode but stochastic, the flushes, canonical NaN, scale_precision float64,
and (on the double route) stochastic and scale_precision float32; every instruction-set
level; 1 and 2 threads. Bit patterns against the general scalar loop (FAST_KERNELS=False),
and against the exact oracle of tests/test_datapath_dequantize_fast.py for finite scales.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from qemu_q import _dispatch, _kernels
from support import bits

import test_datapath_dequantize_cast as base
import test_datapath_dequantize_fast as fast

LEVELS = _kernels.available_levels()
F32_MAX = float(np.finfo(np.float32).max)
ODD_CODES = (1, 3, 5, 7, 9, 11, 13, 15, 17, 25, 45, 51, 63, 85, 91, 105, 127, 191, 253, 255)
CODES = (1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 15, 17, 25, 45, 51, 63, 64, 85, 91, 105, 127, 128, 191,
         200, 253, 255)


def f32(value: float) -> np.float32:
    with np.errstate(over="ignore"):
        return np.float32(value)


def beside(s: np.float32, steps: int = 2) -> list[np.float32]:
    """s and its float32 neighbours up to `steps` ulps away on each side (finite ones)."""
    out = [s]
    up = down = s
    for _ in range(steps):
        up = np.nextafter(up, np.float32(np.inf))
        down = np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    return [v for v in out if np.isfinite(v)]


def midpoint_scales(out: str, rng) -> list[np.float32]:
    """Scales s = M / d with M a midpoint of out (normal and subnormal results) and d a
    code distance: exact where d's odd part divides M's odd significand (N = t * j), and
    a few float32 ulps beside, where d * s is within a few d-ulps of M."""
    m = base.IEEE[out][0]
    emin = base.IEEE[out][1]
    scales = []
    # normal midpoints: N odd in [2**(m+1), 2**(m+2)), M = N * 2**e of magnitude about 2**top
    tops = (0, -13, 10, 15) if out == "float16" else (0, -125, -60, 60, 126)
    for d in ODD_CODES + (2, 4, 6, 12, 64, 128, 192, 200):
        t = d // (d & -d)
        for top in tops:
            odd = [j for j in range(-(-(2 ** (m + 1)) // t), -(-(2 ** (m + 2)) // t)) if j % 2]
            if odd:  # (none for bfloat16 and t >= 171)
                j = odd[int(rng.integers(0, len(odd)))]
                scales += beside(f32(math.ldexp(float(t * j), top - (m + 1)) / d))
            # a midpoint d does not divide: d * RN32(M / d) lies within d / 2 ulps of s
            # from M, often under half a float32 ulp of M (RN32 of the product is M)
            for n in rng.integers(2 ** m, 2 ** (m + 1), 3):
                scales += beside(f32(math.ldexp(float(2 * int(n) + 1), top - (m + 1)) / d), 1)
        # subnormal midpoints of out: odd multiples of half its smallest subnormal
        j = int(rng.integers(0, -(-(2 ** (m + 1)) // t) // 2 or 1)) * 2 + 1  # t * j < 2**(m+1)
        scales += beside(f32(math.ldexp(float(t * j), emin - m - 1) / d))
    return scales


def boundary_scales(out: str) -> list[np.float32]:
    """Products at the overflow thresholds and largest finites, and in and below the
    subnormal ranges (down to float32's own)."""
    m, emin, largest = base.IEEE[out]
    scales = []
    threshold = largest + math.ldexp(1.0, int(math.floor(math.log2(largest))) - m - 1)
    for d in CODES:
        for target in (largest, threshold, 2.0 ** 16, math.ldexp(1.0, emin), math.ldexp(1.0, emin - m),
                       math.ldexp(1.0, emin - m - 1), math.ldexp(3.0, emin - m - 2), 2.0 ** -100,
                       2.0 ** -126, 2.0 ** -140):
            if target / d < F32_MAX:
                scales += beside(f32(target / d))
    return scales


def tiny_scales(rng) -> list[np.float32]:
    """float32 subnormal scales (flush_inputs makes them zeros) and the smallest normals."""
    raw = np.concatenate([rng.integers(1, 2 ** 23, 40), [1, 2, 3, 0x7FFFFF, 0x800000, 0x800001]])
    values = raw.astype(np.uint32).view(np.float32)
    return list(values) + list(-values)


def random_scales(rng, n: int) -> list[np.float32]:
    """Random sign, mantissa and exponent over float32's finite range (products beyond
    float32's range among them)."""
    raw = rng.integers(0, 2 ** 31, n).astype(np.uint32)
    raw = raw % np.uint32(0x7F800000)
    raw |= (rng.integers(0, 2, n).astype(np.uint32) << np.uint32(31))
    return list(raw.view(np.float32))


SPECIAL_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FC00001,
                0xFFC12345, 0x7F800001, 0xFFBFFFFF, 0x7F7FFFFF, 0xFF7FFFFF]


def scale_sets(out: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng({"float16": 24, "bfloat16": 25}[out])
    finite = midpoint_scales(out, rng) + boundary_scales(out) + tiny_scales(rng)
    finite = np.array(finite, np.float32)
    finite = np.concatenate([finite, -finite])
    # products of up to 255 times these stay within float32's range
    finite = finite[np.abs(finite.astype(np.float64)) * 255 <= F32_MAX]
    special = np.concatenate([np.array(SPECIAL_BITS, np.uint32).view(np.float32),
                              np.array(random_scales(rng, 400), np.float32),
                              np.array([F32_MAX / 200, -F32_MAX / 3, F32_MAX / 255 * 1.0001], np.float32)])
    return {"finite": finite, "special": special}


def test_the_samples_hold_midpoints_and_near_misses():
    # Some products are exact midpoints of the output; some lie beside one by less than
    # half a float32 ulp of it (RN32 gives the midpoint: rounding that product from RN32
    # would be a double rounding)
    for out in ("float16", "bfloat16"):
        m = base.IEEE[out][0]
        s = scale_sets(out)["finite"].astype(np.float64)
        d = np.arange(1, 256, dtype=np.float64)
        p = (d[:, None] * s[None, :]).ravel()
        p = p[(p != 0) & (np.abs(p) < 2.0 ** 15 if out == "float16" else p != 0)]
        p = p[np.abs(p) >= 2.0 ** -100]
        e = np.floor(np.log2(np.abs(p)))
        scaled = np.abs(p) / np.exp2(e - m - 1)  # the midpoints are the odd integers here
        exact_ties = (scaled == np.round(scaled)) & (np.round(scaled) % 2 == 1)
        f = p.astype(np.float32).astype(np.float64)
        near = (f != p) & (np.abs(f) / np.exp2(e - m - 1) % 2 == 1)
        assert exact_ties.sum() > 500 and near.sum() > 500, (out, exact_ties.sum(), near.sum())


KINDS = [("int8", np.arange(-128, 128, dtype=np.int8), np.int8(-128)),
         ("int8", np.arange(-128, 128, dtype=np.int8), np.int8(127)),
         ("int8", np.arange(-128, 128, dtype=np.int8), None),
         ("uint8", np.arange(256, dtype=np.uint8), np.uint8(255)),
         ("uint8", np.arange(256, dtype=np.uint8), np.uint8(0)),
         ("int4", np.arange(-8, 8).astype(ml_dtypes.int4), ml_dtypes.int4(-8))]

ODD_OPTIONS = [{}] + [{"rounding": mode} for mode in ("half_away", "half_up", "half_down", "toward_zero",
                                                      "down", "up", "to_odd")] + [
    {"subnormals": "flush_inputs"}, {"subnormals": "flush_outputs"}, {"subnormals": "flush_both"},
    {"nan": "canonical"}, {"scale_precision": "float64"},
    {"rounding": "up", "subnormals": "flush_both", "nan": "canonical", "scale_precision": "float64"}]
# not on the odd products (the plan says so), checked all the same: stochastic on the double
# route; a float32 scale_precision on the float32 products (half_from_float32: the float32
# multiply is that option's first rounding), stochastic included
DOUBLE_OPTIONS = [{"rounding": "stochastic"}, {"scale_precision": "float32"},
                  {"rounding": "toward_zero", "scale_precision": "float32"},
                  {"rounding": "stochastic", "scale_precision": "float32"}]


def config_for(x_dtype, out: str, datapath):
    from qemu_q import _coerce

    plan = fast.dq_module().dequantize_plan(None, (np.dtype(x_dtype), (4,)), (np.dtype(np.float32), ()), None,
                                            1, 0, _coerce.output_dtype(out), _dispatch.FAST_KERNELS,
                                            fast.dq_module().datapath_reads(datapath))
    return plan.kernel_config()


def test_the_plan_takes_odd_products_where_they_apply():
    for out in ("float16", "bfloat16"):
        for x_dtype in (np.int8, np.uint8, ml_dtypes.int4, ml_dtypes.uint2):
            for fields in ODD_OPTIONS:
                config = config_for(x_dtype, out, qemu_q.Datapath(**fields))
                assert config.half_odd_products and not config.half_from_float32, (x_dtype, out, fields)
            for fields in DOUBLE_OPTIONS + [{"scale_precision": "promoted"}]:
                config = config_for(x_dtype, out, qemu_q.Datapath(**fields))
                assert config.fast_datapath and not config.half_odd_products, (x_dtype, out, fields)
                # 8-bit codes (int4 and uint2 are stored a byte each)
                assert config.half_from_float32 == ("float32" in fields.values()
                                                    or "promoted" in fields.values()), (x_dtype, out, fields)
        for x_dtype in (np.int16, ml_dtypes.float8_e4m3fn):
            assert not config_for(x_dtype, out, qemu_q.Datapath()).half_odd_products
    assert not config_for(np.int8, "float32", qemu_q.Datapath()).half_odd_products


def _run(x, s, z, axis, out, fields, n_threads):
    return qemu_q.dequantize_linear(x, s, z, axis=axis, output_dtype=out, n_threads=n_threads,
                                    datapath=qemu_q.Datapath(**fields), **_words(x, fields))


def _words(x, fields):
    if fields.get("rounding") == "stochastic":
        return {"random_bits": fast.words_for(x.shape, 7)}
    return {}


@pytest.mark.parametrize("kind", range(len(KINDS)), ids=[f"{k[0]}-{k[2]}" for k in KINDS])
@pytest.mark.parametrize("out", ["float16", "bfloat16"])
def test_odd_products_equal_the_general_loop(out, kind):
    # Per axis along the last axis (a scale per element: pieces of 512 mixing scales,
    # those with a NaN, infinite or out-of-range product handed to the double route) and
    # along the first (one scale per row of codes), against the general loop; finite
    # scales also against the exact oracle (the default and the modes, keep subnormals).
    _, codes, zp = KINDS[kind]
    d = codes.astype(np.float64) - (0.0 if zp is None else float(zp))
    level = _kernels.active.level
    try:
        for name, scales in scale_sets(out).items():
            along_last = np.repeat(codes[:, None], scales.size, axis=1)
            along_first = np.ascontiguousarray(along_last.T)
            z = None if zp is None else np.full(scales.size, zp, dtype=codes.dtype)
            for fields in ODD_OPTIONS + DOUBLE_OPTIONS:
                cases = [(along_last, 1), (along_first, 0)]
                for x, axis in cases:
                    want = bits(fast.general(x, scales, z, axis=axis, output_dtype=out,
                                             datapath=qemu_q.Datapath(**fields), **_words(x, fields)))
                    if name == "finite" and fields.get("rounding") != "stochastic" and axis == 1 and (
                            "subnormals" not in fields and "nan" not in fields):
                        oracle = fast.oracle(np.repeat(d[:, None], scales.size, axis=1).ravel(),
                                             np.tile(scales.astype(np.float64), codes.size), "float", out,
                                             fields, None)
                        base.check(want, oracle, f"general loop {out} {fields} (oracle)")
                    for lv in LEVELS:
                        _kernels.use(lv)
                        for n_threads in (1, 2):
                            got = bits(_run(x, scales, z, axis, out, fields, n_threads))
                            bad = np.argwhere(got != want)
                            assert bad.size == 0, (
                                lv, n_threads, out, fields, name, axis, bad.shape[0],
                                [(float(d[i if axis else j]), hex(int(scales.view(np.uint32)[j if axis else i])),
                                  hex(int(got[i, j])), hex(int(want[i, j]))) for i, j in bad[:4]])
                    _kernels.use(level)
    finally:
        _kernels.use(level)


@pytest.mark.parametrize("out", ["float16", "bfloat16"])
def test_odd_products_per_tensor(out):
    # One scale for the whole tensor (the loop without per-element parameters), codes
    # longer than a piece, every level and mode, a sample of the scales of each set
    rng = np.random.default_rng(26)
    codes = rng.integers(-128, 128, 1500).astype(np.int8)
    codes[:256] = np.arange(-128, 128)
    sets = scale_sets(out)
    sample = np.concatenate([rng.choice(sets["finite"], 80), sets["special"][:len(SPECIAL_BITS)]])
    level = _kernels.active.level
    try:
        for fields in ODD_OPTIONS + DOUBLE_OPTIONS[:2]:
            for s in sample:
                for zp in (np.int8(-128), np.int8(127)):
                    want = bits(fast.general(codes, s, zp, output_dtype=out, datapath=qemu_q.Datapath(**fields),
                                             **_words(codes, fields)))
                    for lv in LEVELS:
                        _kernels.use(lv)
                        got = bits(_run(codes, s, zp, 1, out, fields, 2))
                        assert np.array_equal(got, want), (lv, out, fields, hex(int(np.float32(s).view(np.uint32))),
                                                           int(zp))
    finally:
        _kernels.use(level)
