"""Cast's typed loops (pyx/_cast.pyx, typed_task and datapath_task): float32 into float16 /
bfloat16 / 8- and 16-bit integers, float16 / bfloat16 into float32, and a Datapath into
the ONNX small floats and into float16 / bfloat16 from float32 (one loop per rounding mode
and target, pyx/_cast_loops.pxi).

Each loop against an exact oracle written from docs/semantics.md ("Cast", "Datapath
options"): tests/float_oracle.py's Fraction rounding, integer truncation in Python,
tests/test_datapath_dequantize_cast.py's `cast_oracle_small` (the rounding table on exact
values), on structured samples (every tie of the target and its float32 neighbours, every
boundary, NaN / inf / -0, float32 subnormals, stochastic words at 0, 2**32 - 1 and the
carry threshold); and against the general path (FAST_KERNELS off), the reference the loops
replace, on larger samples, every instruction-set level the machine runs, 1 to 3 threads,
vector heads and tails. The float16 / bfloat16 sources of the datapath loop are checked
exhaustively by test_datapath_dequantize_cast.py.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo
import qemu_q
from qemu_q import _dispatch, _dtypes, _kernels
from qemu_q._validate import signature
from qemu_q.ops.cast import cast_plan
from support import bits
from test_datapath_dequantize_cast import CANONICAL_NAN, IEEE, SMALL, cast_oracle_small, check, ieee_bits, round_ieee

F32, F16, BF16 = np.float32, np.float16, ml_dtypes.bfloat16
ROUNDINGS = ["half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd",
             "stochastic"]
LEVELS = _kernels.available_levels()
CAST_CHUNK = 32768  # pyx/_cast.pyx: elements per task


def plan_path(x, to, datapath=None):
    plan = cast_plan("Cast", None, signature(np.asarray(x)), _dtypes.element_type(to, "to"), 1, "up",
                     _dispatch.FAST_KERNELS, datapath or qemu_q.Datapath())
    assert dict(plan.kernel_fields)["path"] == plan.kernel_config().path
    return plan.kernel_config().path


def general(x, to, **kw):
    """The general path's result (FAST_KERNELS off: the scalar loop of convert /
    datapath_convert)."""
    _dispatch.FAST_KERNELS = False
    try:
        return qemu_q.cast(x, to, **kw)
    finally:
        _dispatch.FAST_KERNELS = True


def neighbourhoods(points) -> np.ndarray:
    """Each float32 point, its neighbours one ulp away, both signs."""
    p = np.asarray(points, F32)
    near = np.concatenate([p, np.nextafter(p, F32(np.inf)), np.nextafter(p, F32(-np.inf))])
    return np.concatenate([near, -near])


SPECIALS = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                     0x7F800001, 0xFF812345, 0x7FBFFFFF, 0x00000001, 0x80000001, 0x007FFFFF,
                     0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
                     # NaNs whose low half is all ones: an increment added to them would
                     # carry into the bfloat16 code (and, negative, out of 32 bits)
                     0x7FFFFFFF, 0xFFFFFFFF, 0xFF80FFFF], np.uint32).view(F32)


def test_the_plans_pick_the_typed_loops():
    x32, x16, xb = np.zeros(3, F32), np.zeros(3, F16), np.zeros(3, BF16)
    up = qemu_q.Datapath(rounding="up")
    assert plan_path(x32, "float16") == _dtypes.CAST_PATH_F32_F16
    assert plan_path(x32, "bfloat16") == _dtypes.CAST_PATH_F32_BF16
    for to in ("int8", "uint8", "int16", "uint16"):
        assert plan_path(x32, to) == _dtypes.CAST_PATH_F32_INTEGER
    assert plan_path(x16, "float") == _dtypes.CAST_PATH_F16_F32
    assert plan_path(xb, "float") == _dtypes.CAST_PATH_BF16_F32
    for x in (x32, x16, xb):
        for to in SMALL:
            assert plan_path(x, to, up) == _dtypes.CAST_PATH_SMALL_FLOAT_DATAPATH
    for x in (x32, x16, xb):
        assert plan_path(x, "float8e4m3fn") == _dtypes.CAST_PATH_F32_SMALL_FLOAT
    # the general loop for everything else: wider integers, float64 by default, a datapath
    # into float32 / float64, onnxruntime's float8 constructors
    assert plan_path(x32, "int32") == _dtypes.CAST_PATH_GENERAL
    # a datapath into float16 / bfloat16 from float32 and from the other 16-bit float
    for x, to in ((x32, "float16"), (x32, "bfloat16"), (x16, "bfloat16"), (xb, "float16")):
        for datapath in (up, qemu_q.Datapath(subnormals="flush_both"), qemu_q.Datapath(nan="canonical")):
            assert plan_path(x, to, datapath) == _dtypes.CAST_PATH_HALF_DATAPATH
    assert plan_path(x16, "float16", up) == _dtypes.CAST_PATH_GENERAL
    # float64 sources: rounded to odd into float32 first, but for stochastic rounding
    x64, sr = np.zeros(3), qemu_q.Datapath(rounding="stochastic")
    assert plan_path(x64, "float16", up) == _dtypes.CAST_PATH_HALF_DATAPATH
    assert plan_path(x64, "bfloat16", up) == _dtypes.CAST_PATH_HALF_DATAPATH
    assert plan_path(x64, "float4e2m1", up) == _dtypes.CAST_PATH_SMALL_FLOAT_DATAPATH
    for to in ("float16", "float8e4m3fn"):
        assert plan_path(x64, to, sr) == _dtypes.CAST_PATH_GENERAL
    assert plan_path(x64, "float", up) == _dtypes.CAST_PATH_GENERAL
    assert plan_path(x32, "float8e4m3fn", qemu_q.Datapath(float8_encoder="onnxruntime")) == _dtypes.CAST_PATH_GENERAL


# ------------------------------------------------------------- default conversions


def half_bits(value: Fraction | float, name: str) -> int:
    """The bits of an exact float16 / bfloat16 value (or +-inf)."""
    mantissa_bits, min_exponent, _ = fo.BINARY_FORMATS[name]
    width_exponent = 5 if name == "float16" else 8
    bias = (1 << (width_exponent - 1)) - 1
    sign = 0x8000 if (value < 0 or (value == 0 and math.copysign(1, float(value)) < 0)) else 0
    if isinstance(value, float) and math.isinf(value):
        return sign | (((1 << width_exponent) - 1) << mantissa_bits)
    a = abs(Fraction(value))
    if a == 0:
        return sign
    exponent = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** exponent > a:
        exponent -= 1
    if exponent < min_exponent:  # subnormal: the count of the smallest steps
        return sign | int(a / Fraction(2) ** (min_exponent - mantissa_bits))
    fraction = int((a / Fraction(2) ** exponent - 1) * (1 << mantissa_bits))
    return sign | ((exponent + bias) << mantissa_bits) | fraction


def half_oracle(x: np.ndarray, name: str) -> list[int]:
    """docs/semantics.md, Cast float32 -> float16 / bfloat16: round to nearest even,
    beyond the largest finite +-inf; a NaN quiet, with its sign and its payload's leading
    bits."""
    out = []
    for b in x.view(np.uint32).tolist():
        sign = (b >> 16) & 0x8000
        if (b & 0x7FFFFFFF) > 0x7F800000:
            payload = b & 0x7FFFFF
            out.append(sign | (0x7E00 | (payload >> 13) if name == "float16" else 0x7FC0 | (payload >> 16)))
            continue
        v = float(np.uint32(b).view(F32))
        if math.isinf(v):
            out.append(half_bits(v, name))
            continue
        r = fo.round_to_binary(Fraction(v), name)
        out.append(sign if r == 0 else half_bits(r, name))
    return out


def half_points(name: str) -> np.ndarray:
    """Every positive finite value of the format below 2**15 or so sampled: its values, the
    midpoints (exact in float32), the overflow threshold and the subnormal boundaries."""
    if name == "float16":
        values = np.arange(0, 0x7C00, dtype=np.uint16).view(F16).astype(np.float64)
    else:
        codes = np.concatenate([np.arange(0, 0x200), np.arange(0x3F00, 0x4100), np.arange(0x7E00, 0x7F80)])
        values = codes.astype(np.uint32).astype(np.uint16).view(BF16).astype(np.float64)
    mids = (values[:-1] + values[1:]) / 2
    largest = 65504.0 if name == "float16" else float(np.uint32(0x7F7F0000).view(F32))
    extra = [largest + (16.0 if name == "float16" else 2.0 ** 119), 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
             2.0 ** -126, 2.0 ** -133, 2.0 ** -134, 1.0e-45, 3.0e38]
    return np.concatenate([values[::97], mids[::97], mids[-40:], mids[:40], values[-40:],
                           mids[1008:1040], extra])


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_float32_into_halves_ties_and_boundaries(name):
    x = np.concatenate([neighbourhoods(half_points(name)), SPECIALS])
    got = qemu_q.cast(x, name)
    check(got, half_oracle(x, name), f"float32 -> {name}")
    # a wider sample against the general path: every float32 exponent, random mantissas
    rng = np.random.default_rng(4)
    wide = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(F32)
    check(qemu_q.cast(wide, name), bits(general(wide, name)), f"float32 -> {name}, general")


def test_halves_into_float32_every_code():
    codes = np.arange(65536, dtype=np.uint32)
    # float16: the value from its fields (ldexp is exact); bfloat16: the top half of a float32
    sign = np.where(codes & 0x8000, -1.0, 1.0)
    exponent, fraction = (codes >> 10) & 0x1F, codes & 0x3FF
    value = sign * np.ldexp(np.where(exponent > 0, fraction + 1024, fraction).astype(np.float64),
                            np.maximum(exponent.astype(np.int64), 1) - 25)
    with np.errstate(invalid="ignore", over="ignore"):
        want16 = value.astype(F32).view(np.uint32).astype(np.uint64)
    special = exponent == 0x1F
    want16[special] = ((codes[special] & 0x8000) << 16) | 0x7F800000 | (fraction[special] << 13)
    nan16 = special & (fraction != 0)
    want16[nan16] |= 0x00400000  # quiet
    check(qemu_q.cast(codes.astype(np.uint16).view(F16), "float"), want16, "float16 -> float32")
    wantb = (codes << 16).astype(np.uint64)
    nanb = (codes & 0x7FFF) > 0x7F80
    wantb[nanb] |= 0x00400000
    check(qemu_q.cast(codes.astype(np.uint16).view(BF16), "float"), wantb, "bfloat16 -> float32")


@pytest.mark.parametrize("target", ["int8", "uint8", "int16", "uint16"])
def test_float32_into_integers_truncates_and_saturates(target):
    width, signed = int(target.lstrip("uint")), not target.startswith("u")
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    edges = [v + d for v in (lo, hi, 0, 1, -1, lo - 1, hi + 1, 2 * hi) for d in (0.0, 0.5, -0.5, 0.25)]
    x = np.concatenate([neighbourhoods(edges + [1e-40, 2.0 ** 31, 2.0 ** 32, 3e38, 0.999]), SPECIALS,
                        np.linspace(2 * lo - 3, 2 * hi + 3, 4001, dtype=F32)])
    got = [int(v) for v in qemu_q.cast(x, target).tolist()]
    want = []
    for v in x.tolist():
        if math.isnan(v):
            want.append(0)  # docs/semantics.md: NaN -> 0
        elif math.isinf(v):
            want.append(hi if v > 0 else lo)
        else:
            want.append(min(max(math.trunc(v), lo), hi))
    assert got == want, target


# ------------------------------------------------------- datapath into the small floats


def small_points(name: str) -> np.ndarray:
    """Every non-negative value of the small float, every midpoint between neighbours,
    the overflow threshold and beyond, the subnormal boundaries of the target and of
    float32 (the flush threshold of the inputs), 2**20 (the loop's clamp): as float32 with
    their neighbours, both signs."""
    fmt = fo.FORMATS[name]
    values = sorted({float(fo.decode(fmt, c)) for c in fo.finite_codes(fmt)
                     if not (c & fmt.sign_mask) and fo.decode(fmt, c) >= 0})
    mids = [(a + b) / 2 for a, b in zip(values, values[1:])]
    largest, smallest = values[-1], values[1]
    ulp_top = values[-1] - values[-2]
    extra = [largest + ulp_top / 2, largest + ulp_top, 2 * largest, smallest / 2, smallest / 4,
             3 * smallest / 4, 2.0 ** fmt.min_normal_exp, 2.0 ** -126, 2.0 ** -149, 2.0 ** 20,
             2.0 ** 20 + 2.0 ** 9, 3e38, 1e-30]
    return neighbourhoods(values + mids + extra)


def threshold_words(x: np.ndarray, name: str) -> np.ndarray:
    """Per element, the word that just carries: 2**32 - W, W the first 32 bits of the
    fraction of |x| in units of the target's ulp (docs/semantics.md, stochastic)."""
    fmt = fo.FORMATS[name]
    with np.errstate(invalid="ignore"):  # signalling NaNs
        a = np.abs(x.astype(np.float64))
    a = np.where(np.isfinite(a) & (a > 0), np.minimum(a, 2.0 ** 20), 1.0)
    _, e = np.frexp(a)
    t = np.ldexp(a, -(np.maximum(e - 1, fmt.min_normal_exp) - fmt.man_bits))
    w = np.floor((t - np.floor(t)) * 2.0 ** 32).astype(np.uint64)
    return ((1 << 32) - w).astype(np.uint64) & 0xFFFFFFFF


@pytest.mark.parametrize("target", list(SMALL))
def test_float32_datapath_into_small_floats_every_mode(target):
    name = SMALL[target]
    x = np.concatenate([small_points(name), SPECIALS])
    carry = threshold_words(x, name)
    word_sets = [np.zeros(x.shape, np.uint64), np.full(x.shape, 0xFFFFFFFF, np.uint64), carry,
                 (carry - 1) & 0xFFFFFFFF]
    for rounding in ROUNDINGS:
        options = [{"rounding": rounding}, {"rounding": rounding, "subnormals": "flush_both"}]
        if rounding in ("half_even", "half_away", "down"):
            # half_even: the flushes' loops count its subnormal steps with the FPU
            options += [{"rounding": rounding, "subnormals": "flush_inputs", "nan": "canonical"},
                        {"rounding": rounding, "subnormals": "flush_outputs"}]
        for datapath, words in itertools.product(options, word_sets if rounding == "stochastic" else [None]):
            w = None if words is None else words.astype(np.uint32)
            got = qemu_q.cast(x, target, datapath=qemu_q.Datapath(**datapath), random_bits=w)
            want = cast_oracle_small(x, name, datapath, w, 2.0 ** -126)
            check(got, want, f"float32 -> {target} {datapath}")
    # the carry threshold acts: the words just below it and at it give different codes
    # wherever the fraction is nonzero
    up = qemu_q.cast(x, target, datapath=qemu_q.Datapath(rounding="stochastic"),
                     random_bits=carry.astype(np.uint32))
    down = qemu_q.cast(x, target, datapath=qemu_q.Datapath(rounding="stochastic"),
                       random_bits=((carry - 1) & 0xFFFFFFFF).astype(np.uint32))
    assert np.count_nonzero(bits(up) != bits(down)) > x.size // 4


@pytest.mark.parametrize("target", ["float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_float32_datapath_saturate_zero_rows(target):
    name = SMALL[target]
    x = np.concatenate([small_points(name), SPECIALS])
    for datapath in ({"rounding": "up"}, {"rounding": "half_away", "nan": "canonical"}):
        got = qemu_q.cast(x, target, saturate=0, datapath=qemu_q.Datapath(**datapath))
        check(got, bits(general(x, target, saturate=0, datapath=qemu_q.Datapath(**datapath))),
              f"{target} saturate=0 {datapath}")


def test_levels_threads_heads_and_tails_agree_with_the_general_path():
    rng = np.random.default_rng(9)
    n = 2 * CAST_CHUNK + 37  # three tasks, the last one short
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 12, n)).astype(F32)
    x[:len(SPECIALS)] = SPECIALS
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(F16)
        b = x.astype(BF16)
        x64 = x.astype(np.float64) * (1 + 2.0 ** -40)  # bits a float32 does not hold
    cases = [(x, "float16", {}), (x, "bfloat16", {}), (x, "int8", {}), (x, "uint16", {}),
             (h, "float", {}), (b, "float", {}), (h, "float8e4m3fnuz", {}), (b, "float6e2m3", {}),
             (x, "float8e4m3fn", {"datapath": qemu_q.Datapath(rounding="stochastic", subnormals="flush_both"),
                                  "random_bits": words}),
             (h, "float8e5m2", {"datapath": qemu_q.Datapath(rounding="to_odd"), }),
             (b, "float4e2m1", {"datapath": qemu_q.Datapath(rounding="stochastic"), "random_bits": words}),
             (x, "float6e3m2", {"datapath": qemu_q.Datapath(rounding="half_up", subnormals="flush_inputs")}),
             (x, "float16", {"datapath": qemu_q.Datapath(rounding="stochastic", subnormals="flush_both"),
                             "random_bits": words}),
             (x, "bfloat16", {"datapath": qemu_q.Datapath(rounding="half_away", nan="canonical")}),
             (h, "bfloat16", {"datapath": qemu_q.Datapath(rounding="down", subnormals="flush_inputs")}),
             (b, "float16", {"datapath": qemu_q.Datapath(rounding="stochastic", subnormals="flush_outputs"),
                             "random_bits": words}),
             # flush_both where the plan keeps both flushes (float16's subnormals are
             # float8e5m2 values) and where it drops the output flush (float16 into bfloat16)
             (h, "float8e5m2", {"datapath": qemu_q.Datapath(rounding="stochastic", subnormals="flush_both"),
                                "random_bits": words}),
             (h, "bfloat16", {"datapath": qemu_q.Datapath(rounding="up", subnormals="flush_both")}),
             # float64 rounded to odd into float32 first
             (x64, "float8e4m3fn", {"datapath": qemu_q.Datapath(rounding="half_away", subnormals="flush_both")}),
             (x64, "bfloat16", {"datapath": qemu_q.Datapath(rounding="toward_zero")})]
    reference = [bits(general(src, to, **kw)) for src, to, kw in cases]
    level = _kernels.active.level
    try:
        for lv, threads in itertools.product(LEVELS, (1, 2, 3)):
            _kernels.use(lv)
            for (src, to, kw), want in zip(cases, reference):
                check(qemu_q.cast(src, to, n_threads=threads, **kw), want, f"{lv} {threads} {src.dtype} -> {to}")
            # heads and tails: unaligned starts and every short length of a vector or two
            for (src, to, kw), want in zip(cases, reference):
                for start, length in ((1, 1), (3, 7), (1, 17), (5, 33), (7, 64 + 5)):
                    part = {k: (v[start:start + length] if k == "random_bits" else v) for k, v in kw.items()}
                    got = qemu_q.cast(src[start:start + length], to, n_threads=threads, **part)
                    check(got, want[start:start + length], f"{lv} {to} [{start}:+{length}]")
    finally:
        _kernels.use(level)


# ------------------------------------------------------- datapath into float16 / bfloat16


def half_threshold_words(x: np.ndarray, name: str) -> np.ndarray:
    """threshold_words for float16 / bfloat16: the word that just carries, 2**32 - W, W
    the first 32 bits of the fraction of |x| in units of the target's ulp."""
    mantissa_bits, min_exponent, _ = IEEE[name]
    with np.errstate(invalid="ignore"):
        a = np.abs(x.astype(np.float64))
    a = np.where(np.isfinite(a) & (a > 0), a, 1.0)
    _, e = np.frexp(a)
    t = np.ldexp(a, -(np.maximum(e - 1, min_exponent) - mantissa_bits))
    w = np.floor((t - np.floor(t)) * 2.0 ** 32).astype(np.uint64)
    return ((1 << 32) - w).astype(np.uint64) & 0xFFFFFFFF


def half_datapath_oracle(x: np.ndarray, name: str, datapath: dict, words) -> np.ndarray:
    """docs/semantics.md, Cast under a Datapath into float16 / bfloat16 from float32: the
    input flushed below 2**-126 (flush_inputs), the exact value rounded by the mode
    (round_ieee: beyond the largest finite +-inf, a subnormal result flushed with
    flush_outputs), +-0 and +-inf kept, NaN quiet with its sign and its payload's leading
    bits, or the canonical NaN."""
    subnormals = datapath.get("subnormals", "keep")
    with np.errstate(invalid="ignore"):
        v = x.astype(np.float64)
    if subnormals in ("flush_inputs", "flush_both"):
        v = np.where(np.abs(v) < 2.0 ** -126, np.copysign(0.0, v), v)
    want = np.zeros(v.shape, np.uint64)
    finite = np.isfinite(v) & (v != 0)
    plain = np.isinf(v) | (v == 0)
    want[plain] = ieee_bits(v[plain], name)
    w = (np.asarray(words)[finite] if words is not None else np.zeros(int(finite.sum()), np.uint32))
    want[finite] = round_ieee(v[finite], name, datapath.get("rounding", "half_even"), w,
                              subnormals in ("flush_outputs", "flush_both"))
    nan = np.isnan(v)
    if datapath.get("nan", "spec") == "canonical":
        want[nan] = CANONICAL_NAN[name]
    else:
        want[nan] = half_oracle(x[nan], name)
    return want


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_float32_datapath_into_halves_every_mode(name):
    # every tie of the target and its float32 neighbours, the overflow threshold, float16's
    # subnormal boundaries (2**-14, 2**-24, its half 2**-25), the flush threshold of the
    # inputs (2**-126), float32 subnormals, NaN / inf / -0
    x = np.concatenate([neighbourhoods(half_points(name)), SPECIALS,
                        neighbourhoods([2.0 ** -126, 2.0 ** -127, 3 * 2.0 ** -26, 65504.0, 65536.0])])
    carry = half_threshold_words(x, name)
    word_sets = [np.zeros(x.shape, np.uint64), np.full(x.shape, 0xFFFFFFFF, np.uint64), carry,
                 (carry - 1) & 0xFFFFFFFF]
    assert plan_path(x, name, qemu_q.Datapath(rounding="up")) == _dtypes.CAST_PATH_HALF_DATAPATH
    for rounding in ROUNDINGS:
        options = [{"rounding": rounding}, {"rounding": rounding, "subnormals": "flush_both"}]
        if rounding in ("half_even", "half_away", "down", "stochastic"):
            options += [{"rounding": rounding, "subnormals": "flush_inputs", "nan": "canonical"},
                        {"rounding": rounding, "subnormals": "flush_outputs"},
                        {"rounding": rounding, "subnormals": "flush_both", "nan": "canonical"}]
        for datapath, words in itertools.product(options, word_sets if rounding == "stochastic" else [None]):
            w = None if words is None else words.astype(np.uint32)
            got = qemu_q.cast(x, name, datapath=qemu_q.Datapath(**datapath), random_bits=w)
            check(got, half_datapath_oracle(x, name, datapath, w), f"float32 -> {name} {datapath}")
    # the carry threshold acts wherever the fraction is nonzero
    sr = qemu_q.Datapath(rounding="stochastic")
    up = qemu_q.cast(x, name, datapath=sr, random_bits=carry.astype(np.uint32))
    down = qemu_q.cast(x, name, datapath=sr, random_bits=((carry - 1) & 0xFFFFFFFF).astype(np.uint32))
    assert np.count_nonzero(bits(up) != bits(down)) > x.size // 4


def test_float32_datapath_into_halves_every_exponent_against_the_general_path():
    # random bit patterns (every float32 exponent, NaN payloads, subnormals) by every mode,
    # against the general loop that the new loops replace
    rng = np.random.default_rng(15)
    x = rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(F32)
    words = rng.integers(0, 2**32, x.shape, dtype=np.uint64).astype(np.uint32)
    for name, (index, rounding) in itertools.product(["float16", "bfloat16"], enumerate(ROUNDINGS)):
        subnormals = ("keep", "flush_inputs", "flush_outputs", "flush_both")[index % 4]
        datapath = qemu_q.Datapath(rounding=rounding, subnormals=subnormals,
                                   nan="canonical" if index % 3 == 0 else "spec")
        w = words if rounding == "stochastic" else None
        check(qemu_q.cast(x, name, datapath=datapath, random_bits=w),
              bits(general(x, name, datapath=datapath, random_bits=w)), f"float32 -> {name} {datapath}")



@pytest.mark.parametrize("target", ["float8e4m3fn", "float8e5m2fnuz", "float4e2m1", "float6e3m2", "float16"])
def test_output_flush_decides_on_the_top_subnormal_interval(target):
    # With an output flush the loops decide a subnormal lane on |x|'s float32 bits plus the
    # mode's increment over the top subnormal interval [2**e - u, 2**e) (pyx/_cast_loops.pxi.tp,
    # top_increment): that interval (its ends, midpoint, quarter points), the interval below
    # it, the smallest subnormal and its half, float32 subnormals, with their float32
    # neighbours, every mode, flush_outputs and flush_both, words 0, 2**32 - 1 and either side
    # of the carry threshold, at every instruction-set level, against the exact oracles.
    if target == "float16":
        e, m = -14, 10
    else:
        fmt = fo.FORMATS[SMALL[target]]
        e, m = fmt.min_normal_exp, fmt.man_bits
    u, top = 2.0 ** (e - m), 2.0 ** e
    x = neighbourhoods([top - u, top - u / 2, top - u / 4, top - 3 * u / 4, top, top - 2 * u,
                        top - 1.5 * u, top - 1.25 * u, u, u / 2, 2.0 ** -126, 2.0 ** -149])
    carry = (half_threshold_words(x, target) if target == "float16" else threshold_words(x, SMALL[target]))
    word_sets = [np.zeros(x.shape, np.uint64), np.full(x.shape, 0xFFFFFFFF, np.uint64), carry,
                 (carry - 1) & 0xFFFFFFFF]
    level = _kernels.active.level
    try:
        for lv in LEVELS:
            _kernels.use(lv)
            for rounding, subnormals in itertools.product(ROUNDINGS, ("flush_outputs", "flush_both")):
                datapath = {"rounding": rounding, "subnormals": subnormals}
                for words in (word_sets if rounding == "stochastic" else [None]):
                    w = None if words is None else words.astype(np.uint32)
                    got = qemu_q.cast(x, target, datapath=qemu_q.Datapath(**datapath), random_bits=w)
                    want = (half_datapath_oracle(x, target, datapath, w) if target == "float16"
                            else cast_oracle_small(x, SMALL[target], datapath, w, 2.0 ** -126))
                    check(got, want, f"{lv} float32 -> {target} {datapath}")
    finally:
        _kernels.use(level)
    # the samples straddle the decision: below 2**e both zero and the smallest normal occur
    below = (np.abs(x) < top) & (x != 0)
    got = bits(qemu_q.cast(x, target, datapath=qemu_q.Datapath(subnormals="flush_outputs")))[below]
    magnitude = 0x7FFF if target == "float16" else fo.FORMATS[SMALL[target]].sign_mask - 1
    assert set((got & magnitude).tolist()) == {0, 1 << m}

def float64_points(name: str, mantissa_bits: int, min_exponent: int, largest: float) -> np.ndarray:
    """float64 values a float32 cannot hold that straddle what the modes read: every tie
    of the target sampled, one float64 ulp and 2**-40 (relative) either side, values of the
    target +- 2**-35 (relative), the overflow threshold, beyond float32's range (2**128 and
    up), float64 subnormals and values between float32's subnormals."""
    rng = np.random.default_rng(16)
    exponents = rng.integers(min_exponent - mantissa_bits - 2, int(math.log2(largest)) + 2, 400)
    mantissas = rng.integers(0, 1 << mantissa_bits, 400)
    values = np.ldexp(1.0 + mantissas / 2.0 ** mantissa_bits, exponents)
    ulps = np.ldexp(1.0, np.maximum(exponents, min_exponent) - mantissa_bits)
    ties = values + ulps / 2
    near = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf),
                           ties * (1 + 2.0 ** -40), ties * (1 - 2.0 ** -40),
                           values * (1 + 2.0 ** -35), values * (1 - 2.0 ** -35)])
    extra = np.array([largest, largest * (1 + 2.0 ** -30), 2.0 ** 128, 2.0 ** 128 * (1 - 2.0 ** -40),
                      float(np.finfo(np.float32).max) * (1 + 2.0 ** -30), 1e300, 1e-300, 5e-324,
                      2.0 ** -1022 * (1 - 2.0 ** -20), 2.0 ** -1022, 2.0 ** -149 * 1.5, 2.0 ** -150,
                      2.0 ** -140 * (1 + 2.0 ** -30), np.inf, 0.0])
    x = np.concatenate([near, extra])
    return np.concatenate([x, -x, [np.nan, -np.nan]])


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8e4m3fn", "float8e5m2fnuz", "float4e2m1"])
def test_float64_datapath_through_float32_rounded_to_odd(name):
    # every deterministic mode, flushes and canonical NaN: the exact oracle and the general
    # loop; stochastic stays on the general loop (test_the_plans_pick_the_typed_loops)
    if name in SMALL:
        fmt = fo.FORMATS[SMALL[name]]
        largest = float(max(fo.decode(fmt, c) for c in fo.finite_codes(fmt)))
        x = float64_points(name, fmt.man_bits, fmt.min_normal_exp, largest)
    else:
        x = float64_points(name, *IEEE[name])
    for index, rounding in enumerate(ROUNDINGS[:-1]):
        subnormals = ("flush_outputs", "keep", "flush_inputs", "flush_both")[index % 4]
        datapath = {"rounding": rounding, "subnormals": subnormals,
                    "nan": "canonical" if index % 3 == 1 else "spec"}
        dp = qemu_q.Datapath(**datapath)
        assert plan_path(x, name, dp) != _dtypes.CAST_PATH_GENERAL
        got = qemu_q.cast(x, name, datapath=dp)
        check(got, bits(general(x, name, datapath=dp)), f"float64 -> {name} {datapath}, general")
        finite = np.isfinite(x)
        if name in SMALL:
            want = cast_oracle_small(x, SMALL[name], datapath, None, 2.0 ** -1022)
        else:
            flushed = np.where(np.abs(x) < 2.0 ** -1022, np.copysign(0.0, x), x) if subnormals in (
                "flush_inputs", "flush_both") else x
            nonzero = finite & (flushed != 0)
            want = ieee_bits(flushed, name)
            want[nonzero] = round_ieee(flushed[nonzero], name, rounding, np.zeros(int(nonzero.sum()), np.uint32),
                                       subnormals in ("flush_outputs", "flush_both"))
            want[np.isnan(x)] = bits(general(x[np.isnan(x)], name, datapath=dp))
        check(got[finite], np.asarray(want)[finite], f"float64 -> {name} {datapath}, oracle")
