"""qemu_q.Datapath in mx_quantize and nvfp4_quantize (docs/semantics.md, "Datapath options",
"Block-scaled quantization"): the element rounding (every mode, stochastic with random_bits),
MX's subnormal flushes, quotient precision and canonical NaN, NVFP4's recipe conflicts and
subnormal flushes.

Oracles: the shared scale from tests/mx_oracle.py (the OCP text) and NVFP4's recipe steps
from tests/nvfp4_oracle.py (the sources); the element's rounding by mode from
tests/datapath_oracle.py (the rounding table of docs/semantics.md, Fraction arithmetic);
none calls the code under test."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import datapath_oracle as do
import float_oracle as fo
import mx_oracle as mo
import nvfp4_oracle as no
import qemu_q

MODES = ("half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd",
         "stochastic")
MX_ELEMENTS = tuple(mo.ELEMENTS)
# A finite float16 sample: every 7th code (all binades, subnormals, both signs) and the
# largest values, in blocks of 32 (each block its own scale).
_F16 = np.arange(0, 65536, 7, dtype=np.uint32).astype(np.uint16).view(np.float16)
F16_SAMPLE = _F16[np.isfinite(_F16)][:4608]


def words_for(shape, seed=15) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, size=shape, dtype=np.uint32)


def flush_input(v: float, x_dtype) -> float:
    smallest_normal = 2.0 ** -14 if np.dtype(x_dtype) == np.float16 else 2.0 ** -126
    if v != 0 and abs(v) < smallest_normal:
        return math.copysign(0.0, v)
    return v


def mx_element_oracle(v: float, scale_code: int, element: str, dp: dict, word: int) -> int:
    """One element of a finite MX block: q = v / 2**E exactly (or rounded to float32 for
    scale_precision="float32"), rounded by the mode, clamped to +-max (OCP)."""
    fmt, _, largest, _ = mo.ELEMENTS[element]
    q = Fraction(v) / Fraction(2) ** (scale_code - 127)
    if dp.get("scale_precision") == "float32":
        q = do.round_nearest_even_to(q, "float32")
    negative = math.copysign(1.0, v) < 0
    mode = dp.get("rounding", "half_even")
    if fmt is None:  # MXINT8: units of 2**-6, [-127, 127]
        n = min(do.round_magnitude(*do.split(abs(q) * 64, 0), negative, mode, word), 127)
        return (-n if negative else n) & 0xFF
    # saturate=1: a rounded value beyond max encodes as +-max, OCP's clamp
    return do.to_small_float(q, negative, fmt, dp, word, 1, 28)


def mx_oracle(x: np.ndarray, element: str, block_size: int, rule: str, dp: dict, words=None):
    """(codes, scales) as uint8 for x blocked along the last axis."""
    rows = x.reshape(-1, x.shape[-1])
    words = np.zeros(rows.shape, np.uint64) if words is None else words.reshape(rows.shape)
    flush = dp.get("subnormals", "keep") in ("flush_inputs", "flush_both")
    codes, scales = [], []
    for r, row in enumerate(rows):
        values = [float(v) for v in row]
        if flush:
            values = [flush_input(v, x.dtype) for v in values]
        for b in range(0, len(values), block_size):
            block = values[b:b + block_size]
            code = mo.scale_code(block, element, rule)
            scales.append(code)
            if code == mo.SCALE_NAN:
                nan = mo.NAN_BLOCK_CODE[element]
                if dp.get("nan") == "canonical" and nan:
                    nan = 0x7F
                codes += [nan] * len(block)
                continue
            codes += [mx_element_oracle(v, code, element, dp, int(words[r, b + i]))
                      for i, v in enumerate(block)]
    return np.array(codes, np.uint8).reshape(x.shape), np.array(scales, np.uint8)


def run_mx(x, element, dp: dict, words=None, block_size=32, rule="floor", n_threads=1, **kw):
    codes, scales = qemu_q.mx_quantize(x, element, block_size=block_size, scale_rule=rule,
                                       datapath=qemu_q.Datapath(**dp), random_bits=words,
                                       n_threads=n_threads, **kw)
    return codes.view(np.uint8), scales.view(np.uint8).reshape(-1)


@pytest.mark.parametrize("mode", MODES)
def test_mx_element_rounding_every_mode(mode):
    x = F16_SAMPLE.reshape(-1, 32)
    words = words_for(x.shape) if mode == "stochastic" else None
    for element in MX_ELEMENTS:
        dp = {"rounding": mode}
        want_codes, want_scales = mx_oracle(x, element, 32, "floor", dp, words)
        codes, scales = run_mx(x, element, dp, words)
        assert np.array_equal(scales, want_scales.reshape(-1)), element
        assert codes.tolist() == want_codes.tolist(), element


def test_mx_half_even_datapath_is_the_default_path():
    # rounding="half_even" with other options at their defaults changes no bit and scale
    # "reciprocal" is the same exact quotient (X is a power of two).
    x = F16_SAMPLE.astype(np.float32).reshape(-1, 32)
    for element in MX_ELEMENTS:
        plain = qemu_q.mx_quantize(x, element)
        for dp in ({}, {"scale": "reciprocal", "scale_precision": "float64"},
                   {"scale_precision": "float32"}, {"nan_to_integer": "max", "accumulator": "int16",
                                                    "requantization": "float32"}):
            got = qemu_q.mx_quantize(x, element, datapath=qemu_q.Datapath(**dp))
            assert got[0].tobytes() == plain[0].tobytes() and got[1].tobytes() == plain[1].tobytes()


def test_mx_quotient_precision_float32_with_a_directed_mode():
    # A block whose amax sets E = 120 (e4m3fn: 2**128 / 2**8 ... here 2**127 -> E = 119) and
    # a tiny element: the exact quotient 2**-149 / 2**119 = 2**-268 is positive, so "up"
    # gives the smallest subnormal; rounded to float32 first it is 0, which stays 0.
    x = np.zeros(32, np.float32)
    x[0] = np.float32(2.0 ** 127)
    x[1] = np.float32(2.0 ** -149)
    x[2] = np.float32(-(2.0 ** -149))
    for element in MX_ELEMENTS:
        for precision in (None, "float32", "float64"):
            dp = {"rounding": "up", "scale_precision": precision}
            want_codes, want_scales = mx_oracle(x.reshape(1, 32), element, 32, "floor", dp)
            codes, scales = run_mx(x, element, dp)
            assert codes.tolist() == want_codes.reshape(-1).tolist(), (element, precision)
        exact, rounded = run_mx(x, element, {"rounding": "up"})[0], run_mx(
            x, element, {"rounding": "up", "scale_precision": "float32"})[0]
        assert exact[1] != rounded[1]  # the smallest subnormal (MXINT8: code 1) versus 0
        assert rounded[1] == 0 and rounded[2] in (0, 0x80, 0x20, 0x8)  # signed zeros


@pytest.mark.parametrize("subnormals", ["flush_inputs", "flush_outputs", "flush_both"])
def test_mx_subnormals(subnormals):
    # float16 subnormals (flush_inputs: below 2**-14) in blocks of their own and beside
    # normals; the element results that are subnormal (flush_outputs).
    sub = np.arange(1, 1024, 3, dtype=np.uint16).view(np.float16)
    x16 = np.concatenate([sub[:320], -sub[:64] * np.float16(1), F16_SAMPLE[:1024]]).astype(np.float16)
    x16 = x16[:len(x16) // 32 * 32].reshape(-1, 32)
    for x in (x16, x16.astype(np.float32) * np.float32(2.0 ** -112)):  # float32 subnormals too
        for element in MX_ELEMENTS:
            for mode in ("half_even", "up"):
                dp = {"subnormals": subnormals, "rounding": mode}
                want_codes, want_scales = mx_oracle(x, element, 32, "floor", dp)
                codes, scales = run_mx(x, element, dp)
                assert np.array_equal(scales, want_scales.reshape(-1)), (element, x.dtype)
                assert codes.tolist() == want_codes.tolist(), (element, x.dtype, mode)


def test_mx_canonical_nan_and_other_axes_and_packing():
    x = F16_SAMPLE[:32 * 24].astype(np.float32).reshape(24, 32).copy()
    x[3, 5] = np.nan
    x[7, 1] = -np.inf
    xt = np.ascontiguousarray(x.T)  # blocks along axis 0
    for element in MX_ELEMENTS:
        for dp in ({"nan": "canonical"}, {"nan": "canonical", "rounding": "toward_zero"}):
            want_codes, want_scales = mx_oracle(x, element, 8, "even", dp)
            codes, scales = run_mx(x, element, dp, block_size=8, rule="even")
            assert codes.tolist() == want_codes.tolist() and scales.tolist() == want_scales.tolist()
            for threads in (1, 2):
                codes_t, scales_t = run_mx(xt, element, dp, block_size=8, rule="even", axis=0,
                                           n_threads=threads)
                assert codes_t.T.tolist() == want_codes.tolist()
                assert scales_t.reshape(4, 24).T.reshape(-1).tolist() == want_scales.tolist()
        if element == "float8e5m2":
            assert want_codes[3, 0] == 0x7F  # the spec's quiet NaN 0x7E becomes 0x7F
        if element in ("float4e2m1", "float6e2m3"):
            packed, _ = qemu_q.mx_quantize(x, element, block_size=8, packed=True,
                                           datapath=qemu_q.Datapath(rounding="toward_zero"))
            one_per_byte = run_mx(x, element, {"rounding": "toward_zero"}, block_size=8)[0]
            assert packed.tobytes() == qemu_q.pack(one_per_byte.view(mo_dtype(element))).tobytes()


def mo_dtype(element):
    return {"float4e2m1": ml_dtypes.float4_e2m1fn, "float6e2m3": ml_dtypes.float6_e2m3fn}[element]


def test_mx_stochastic_threads_and_word_alignment():
    # e4m3fn, a block of amax 448 (X = 1): q = 1.0625 keeps 3 mantissa bits and drops
    # 0.5 of an ulp: the word rounds up exactly when word >= 2**31.
    x = np.full(64, 448.0, np.float32)
    x[1::2] = np.float32(1.0625)
    words = np.zeros(64, np.uint32)
    words[1::2] = np.array([0x7FFFFFFF, 0x80000000] * 16, np.uint32)
    codes, _ = run_mx(x, "float8e4m3fn", {"rounding": "stochastic"}, words)
    assert codes[1::2].tolist() == [0x38, 0x39] * 16  # 1.0 and 1.125
    big = F16_SAMPLE.astype(np.float32).reshape(-1, 32)
    words = words_for(big.shape, 7)
    one = run_mx(big, "float4e2m1", {"rounding": "stochastic"}, words, n_threads=1)
    two = run_mx(big, "float4e2m1", {"rounding": "stochastic"}, words, n_threads=2)
    assert one[0].tobytes() == two[0].tobytes() and one[1].tobytes() == two[1].tobytes()


def test_mx_random_bits_checks():
    x = np.ones((2, 32), np.float32)
    stochastic = qemu_q.Datapath(rounding="stochastic")
    with pytest.raises(ValueError, match="needs random_bits="):
        qemu_q.mx_quantize(x, "float8e4m3fn", datapath=stochastic)
    with pytest.raises(ValueError, match="random_bits is given but datapath.rounding='half_even'"):
        qemu_q.mx_quantize(x, "float8e4m3fn", random_bits=np.zeros(x.shape, np.uint32))
    with pytest.raises(ValueError, match=r"random_bits has shape \(64,\)"):
        qemu_q.mx_quantize(x, "float8e4m3fn", datapath=stochastic, random_bits=np.zeros(64, np.uint32))
    with pytest.raises(TypeError, match="random_bits must be a numpy uint32 array"):
        qemu_q.mx_quantize(x, "float8e4m3fn", datapath=stochastic, random_bits=np.zeros(x.shape, np.int64))
    with pytest.raises(TypeError, match="expected a qemu_q.Datapath"):
        qemu_q.mx_quantize(x, "float8e4m3fn", datapath={"rounding": "up"})


# --- NVFP4 -----------------------------------------------------------------------------------

NV_RECIPES = ("transformer_engine", "torchao", "modelopt")


def nvfp4_oracle(x: np.ndarray, recipe: str, mode: str, words=None):
    """codes (uint8) of x [rows, 16k] blocked along the last axis: the recipe's float32 element
    (tests/nvfp4_oracle.py's steps) rounded by the mode into e2m1, +-6 beyond."""
    _, scales, _ = no.quantize(x, recipe)
    g = no.global_parameters(recipe, no.tensor_amax(x, recipe))
    words = np.zeros(x.shape, np.uint64) if words is None else words
    out = np.zeros(x.shape, np.uint8)
    with np.errstate(all="ignore"):
        for r in range(x.shape[0]):
            for b in range(x.shape[1] // 16):
                s = no.e4m3_value(int(scales[r, b]))
                values = x[r, 16 * b:16 * b + 16].astype(np.float32)
                if recipe == "transformer_engine":
                    q = values * no.fminf(np.float32(1.0) / (s * g["decode"]), no.FLT_MAX)
                elif recipe == "torchao":
                    q = values * ((np.float32(1.0) / g["decode"]) / s)
                else:
                    q = values / (s * g["decode"])
                for i, v in enumerate(q):
                    v = float(v)
                    if math.isnan(v):
                        code = 0x4 if recipe == "torchao" else 0x7
                    elif recipe == "modelopt" and v == 0 and math.copysign(1.0, v) < 0:
                        code = 0
                    elif math.isinf(v):
                        code = 0x7 if v > 0 else 0xF
                    else:
                        code = do.to_small_float(Fraction(v), math.copysign(1.0, v) < 0, "float4_e2m1fn",
                                                 {"rounding": mode}, int(words[r, 16 * b + i]), 1, 28)
                    out[r, 16 * b + i] = code
    return out


@pytest.mark.parametrize("recipe", NV_RECIPES)
def test_nvfp4_element_rounding_every_mode(recipe):
    x = F16_SAMPLE[:16 * 64].astype(np.float32).reshape(64, 16) * np.float32(3.0)
    for mode in MODES:
        words = words_for(x.shape, 3) if mode == "stochastic" else None
        want = nvfp4_oracle(x, recipe, mode, words)
        plain_scales = qemu_q.nvfp4_quantize(x, recipe=recipe)[1]
        for threads in (1, 2):
            codes, scales, _ = qemu_q.nvfp4_quantize(x, recipe=recipe, datapath=qemu_q.Datapath(rounding=mode),
                                                     random_bits=words, n_threads=threads)
            assert codes.view(np.uint8).tolist() == want.tolist(), (mode, threads)
            assert scales.tobytes() == plain_scales.tobytes()  # the block scales are the recipe's


def test_nvfp4_datapath_options_the_recipe_fixes():
    x = np.linspace(-5, 5, 64, dtype=np.float32).reshape(4, 16)
    # agreeing options (and those NVFP4 has no step for) change no bit
    for recipe, dp in (("transformer_engine", {"scale": "reciprocal", "scale_precision": "float32"}),
                       ("torchao", {"scale": "reciprocal", "scale_precision": "float32"}), ("modelopt", {"scale_precision": "float32"}),
                       ("modelopt", {"nan": "canonical", "nan_to_integer": "zero", "accumulator": "int16",
                                     "requantization": "float64"})):
        got = qemu_q.nvfp4_quantize(x, recipe=recipe, datapath=qemu_q.Datapath(**dp))[0].tobytes()
        assert got == qemu_q.nvfp4_quantize(x, recipe=recipe)[0].tobytes()
    with pytest.raises(ValueError, match="datapath scale='reciprocal' conflicts with recipe='modelopt'"):
        qemu_q.nvfp4_quantize(x, recipe="modelopt", datapath=qemu_q.Datapath(scale="reciprocal",
                                                                             scale_precision="float32"))
    with pytest.raises(ValueError, match="scale_precision='float64' conflicts with recipe='torchao'"):
        qemu_q.nvfp4_quantize(x, recipe="torchao", datapath=qemu_q.Datapath(scale_precision="float64"))
    with pytest.raises(ValueError, match="needs random_bits="):
        qemu_q.nvfp4_quantize(x, datapath=qemu_q.Datapath(rounding="stochastic"))
    with pytest.raises(ValueError, match=r"random_bits has shape \(64,\)"):
        qemu_q.nvfp4_quantize(x, datapath=qemu_q.Datapath(rounding="stochastic"),
                              random_bits=np.zeros(64, np.uint32))


def nvfp4_flush_oracle(x: np.ndarray, recipe: str, mode: str, subnormals: str, words=None):
    """docs/semantics.md, "NVFP4 under a datapath": flush_inputs reads x below its type's
    smallest normal as a zero of its sign before every recipe step (the amaxes included);
    flush_outputs writes e2m1's subnormal results (+-0.5, codes 0x1 / 0x9) as zeros of their
    sign. (codes, block scales) as uint8."""
    x32 = x.astype(np.float32)
    if subnormals in ("flush_inputs", "flush_both"):
        x32 = np.array([[flush_input(float(v), x.dtype) for v in row] for row in x32], np.float32)
    codes = nvfp4_oracle(x32, recipe, mode, words)
    if subnormals in ("flush_outputs", "flush_both"):
        codes = np.where((codes & 0x7) == 0x1, codes & 0x8, codes).astype(np.uint8)
    return codes, no.quantize(x32, recipe)[1]


@pytest.mark.parametrize("recipe", NV_RECIPES)
@pytest.mark.parametrize("subnormals", ["flush_inputs", "flush_outputs", "flush_both"])
def test_nvfp4_subnormals(recipe, subnormals):
    # float16 x: every 7th code, its subnormals (below 2**-14, float32 normals) in blocks of
    # their own; float32 x: blocks of float32 subnormals beside normal ones, and a tensor of
    # subnormals only (its amax flushes to 0).
    f16 = F16_SAMPLE[:16 * 64].reshape(64, 16)
    f32 = (F16_SAMPLE[:16 * 64].astype(np.float32) * np.float32(3.0)).reshape(64, 16)
    f32[::3] = f32[::3] * np.float32(2.0 ** -130)
    tiny = (F16_SAMPLE[:16 * 8].astype(np.float32) * np.float32(2.0 ** -128)).reshape(8, 16)
    changed = False
    for x in (f16, f32, tiny):
        plain = qemu_q.nvfp4_quantize(x, recipe=recipe)
        for mode in ("half_even", "up", "stochastic"):
            words = words_for(x.shape, 8) if mode == "stochastic" else None
            want_codes, want_scales = nvfp4_flush_oracle(x, recipe, mode, subnormals, words)
            for threads in (1, 3):
                codes, scales, _ = qemu_q.nvfp4_quantize(
                    x, recipe=recipe, datapath=qemu_q.Datapath(rounding=mode, subnormals=subnormals),
                    random_bits=words, n_threads=threads)
                assert codes.view(np.uint8).tolist() == want_codes.tolist(), (x.dtype, mode, threads)
                assert scales.view(np.uint8).tolist() == want_scales.tolist(), (x.dtype, mode, threads)
            if mode == "half_even":
                changed |= codes.tobytes() != plain[0].tobytes() or scales.tobytes() != plain[1].tobytes()
    assert changed  # the option acts on these inputs


def test_nvfp4_flushed_tensor_amax_and_given_amax():
    # A tensor of float32 subnormals: flushed, its amax is 0 (the recipes' zero-amax
    # branches), and the returned global scale is the one of amax 0; a given global_amax is
    # the caller's and is not flushed.
    x = np.full((1, 16), np.float32(2.0 ** -130))
    x[0, 1::2] = -x[0, 1::2]
    for recipe in NV_RECIPES:
        flushed = qemu_q.nvfp4_quantize(x, recipe=recipe, datapath=qemu_q.Datapath(subnormals="flush_inputs"))
        zero = qemu_q.nvfp4_quantize(np.zeros((1, 16), np.float32), recipe=recipe)
        assert flushed[2].tobytes() == zero[2].tobytes() == np.float32(no.global_parameters(recipe, 0.0)["decode"]).tobytes()
        want_codes, want_scales = nvfp4_flush_oracle(x, recipe, "half_even", "flush_inputs")
        assert flushed[0].view(np.uint8).tolist() == want_codes.tolist()
        assert flushed[1].view(np.uint8).tolist() == want_scales.tolist()
        given = qemu_q.nvfp4_quantize(x, recipe=recipe, global_amax=np.float32(2.0 ** -130),
                                      datapath=qemu_q.Datapath(subnormals="flush_inputs"))
        assert given[2].tobytes() == np.float32(no.global_parameters(recipe, np.float32(2.0 ** -130))["decode"]).tobytes()


def test_nvfp4_stochastic_word_alignment_and_2d_tiles():
    # transformer_engine, tensor amax 6 * 448: S_enc = 1, block amax 6 -> scale 1.0, the
    # element q = x. q = 1.25 keeps 1 mantissa bit (ulp 0.5) and drops half an ulp.
    x = np.full((1, 16), 6.0, np.float32)
    x[0, 1:] = np.float32(1.25)
    words = np.zeros(x.shape, np.uint32)
    words[0, 1:] = [0x7FFFFFFF, 0x80000000] * 7 + [0xFFFFFFFF]
    codes = qemu_q.nvfp4_quantize(x, global_amax=np.float32(2688.0), datapath=qemu_q.Datapath(
        rounding="stochastic"), random_bits=words)[0].view(np.uint8)
    assert codes[0, 1:].tolist() == [0x2, 0x3] * 7 + [0x3]  # 1.0 or 1.5
    # 16x16 tiles and a blocked axis 0 take the words of their own elements
    big = F16_SAMPLE[:32 * 32].astype(np.float32).reshape(32, 32)
    words = words_for(big.shape, 11)
    dp = qemu_q.Datapath(rounding="stochastic")
    tiles = qemu_q.nvfp4_quantize(big, block_shape=(16, 16), datapath=dp, random_bits=words)[0]
    plain_tiles = qemu_q.nvfp4_quantize(big, block_shape=(16, 16))[0]
    assert tiles.shape == plain_tiles.shape
    axis0 = qemu_q.nvfp4_quantize(np.ascontiguousarray(big.T), axis=0, datapath=dp,
                                  random_bits=np.ascontiguousarray(words.T))[0]
    axis1 = qemu_q.nvfp4_quantize(big, datapath=dp, random_bits=words)[0]
    assert axis0.T.view(np.uint8).tolist() == axis1.view(np.uint8).tolist()
    assert axis1.view(np.uint8).tolist() == nvfp4_oracle(big, "transformer_engine", "stochastic",
                                                         words).tolist()


# --- instruction-set levels and threads ------------------------------------------------------

def test_every_option_same_bits_on_every_level_and_thread_count():
    from qemu_q import _kernels

    x = F16_SAMPLE[:64 * 32].astype(np.float32).reshape(64, 32)
    words = words_for(x.shape, 5)
    a = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    calls = {
        "mx": lambda n: qemu_q.mx_quantize(x, "float6e3m2", n_threads=n, random_bits=words, datapath=qemu_q.Datapath(
            rounding="stochastic", subnormals="flush_both", scale_precision="float32")),
        "mxint8": lambda n: qemu_q.mx_quantize(x, "int8", n_threads=n, datapath=qemu_q.Datapath(rounding="to_odd")),
        "nvfp4": lambda n: qemu_q.nvfp4_quantize(x, recipe="torchao", n_threads=n, random_bits=words,
                                                 datapath=qemu_q.Datapath(rounding="stochastic"))[:2],
        "nvfp4_flush": lambda n: qemu_q.nvfp4_quantize(x * np.float32(2.0 ** -120), recipe="modelopt", n_threads=n,
                                                       datapath=qemu_q.Datapath(subnormals="flush_both"))[:2],
        "qlinear": lambda n: (qemu_q.qlinear_matmul(
            a, np.float32(0.37), np.int8(1), a, np.float32(0.05), np.int8(-2), np.float32(0.5), np.int8(3),
            n_threads=n, datapath=qemu_q.Datapath(rounding="half_away", requantization="float32",
                                                  accumulator="int16-saturate")),),
    }
    level = _kernels.active.level
    results = {}
    try:
        for lv in _kernels.available_levels():
            _kernels.use(lv)
            for n in (1, 2):
                for name, call in calls.items():
                    results.setdefault(name, []).append((lv, n, [r.tobytes() for r in call(n)]))
    finally:
        _kernels.use(level)
    for name, runs in results.items():
        assert all(bits == runs[0][2] for _, _, bits in runs), name


# --- MX's vectorized datapath loops (pyx/_mx_datapath_loops.pxi.tp) ----------------------------
# The innermost axis runs one vectorized loop per rounding mode and input flush; the scalar
# quantize_groups_datapath stays the reference. Each case: the vector loop, the reference
# loop (MXQuantizeConfig(reference_loop=True)) and the exact oracle above agree bit for bit.

ELEMENT_BITS = {"float8e4m3fn": 8, "float8e5m2": 8, "float6e2m3": 6, "float6e3m2": 6, "float4e2m1": 4,
                "int8": 8}
DP_VARIANTS = ({}, {"subnormals": "flush_inputs"}, {"subnormals": "flush_outputs"},
               {"subnormals": "flush_both", "scale_precision": "float32"}, {"scale_precision": "float32"})


def kernel_loops(x, element, dp, words=None, block_size=32, rule="floor", n_threads=1):
    """(codes, scales) of the vector loop and of the scalar reference loop, as uint8, each
    from the kernel entry with the plan's fields (the reference with reference_loop=True)."""
    from qemu_q import _dispatch
    from qemu_q._validate import signature
    from qemu_q.ops import mx as mx_op

    plan = mx_op.mx_quantize_plan(signature(x), element, -1, block_size, rule, False, qemu_q.Datapath(**dp))
    module = _dispatch.entry_module(_dispatch.Path.MX_QUANTIZE)
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = {}
    for loop, reference in (("vector", False), ("scalar", True)):
        config = module.MXQuantizeConfig(**dict(plan.kernel_fields), reference_loop=reference)
        # half_even without a flush changes no bit: the default loop, for both
        default = dp.get("rounding", "half_even") == "half_even" and dp.get("subnormals", "keep") == "keep"
        assert config.datapath_loop == ("default" if default else loop), (config.datapath_loop, loop, dp)
        codes = np.full(x.size, 0xA5, np.uint8)
        scales = np.full(config.n_scales, 0xA5, np.uint8)
        module.mx_quantize(flat, codes, scales, config, n_threads,
                           None if words is None else np.ascontiguousarray(words, np.uint32).reshape(-1))
        out[loop] = (codes.reshape(x.shape), scales)
    return out


def tie_blocks(element: str, n_blocks: int, seed: int) -> np.ndarray:
    """Blocks of 32 float32 whose first element fixes the scale (the element's max times
    2**E: X = 2**E under "floor") and whose others are, divided by X, the element's values,
    the midpoints between neighbours and the float32 neighbours of both, tiny quotients
    (float32 subnormals, values far below the smallest element subnormal), zeros of both
    signs; E from the ends of e8m0's range to the middle, so that quotients underflow
    float32 and float32 subnormal x appear."""
    rng = np.random.default_rng(seed)
    fmt, emax, largest, _ = mo.ELEMENTS[element]
    values = sorted({abs(v) for v in (mo.element_value(c, element) for c in range(1 << ELEMENT_BITS[element]))
                     if isinstance(v, Fraction)})
    qs = set(values)
    for a, b in zip(values, values[1:]):
        mid = np.float32((a + b) / 2)
        qs |= {Fraction(float(mid)), Fraction(float(np.nextafter(mid, np.float32(0)))),
               Fraction(float(np.nextafter(mid, np.float32(np.inf))))}
    smallest = values[1]
    qs |= {smallest / 2, smallest / 3, smallest / 1024, Fraction(2) ** -60, Fraction(2) ** -130,
           Fraction(2) ** -149}
    qs = sorted(q for q in qs if q <= largest)
    blocks = []
    exponents = [-127, -126, -120, -100, -30, -3, 0, 2, 30, 100, 112, 118, 119]
    for i in range(n_blocks):
        e = exponents[i % len(exponents)]
        lead = largest * Fraction(2) ** e
        if not (Fraction(2) ** -149 <= lead < Fraction(2) ** 128):
            e = 0
            lead = largest
        picks = rng.choice(len(qs), size=31)
        block = [float(lead)] + [float(np.float32(qs[p] * Fraction(2) ** e)) * rng.choice([1.0, -1.0])
                                 for p in picks]
        if i % 5 == 3:
            block[rng.integers(1, 32)] = -0.0
        blocks.append(block)
    return np.array(blocks, np.float32)


def assert_loops_match_oracle(x, element, dp, words=None, block_size=32, rule="floor", n_threads=1):
    got = kernel_loops(x, element, dp, words, block_size, rule, n_threads)
    want_codes, want_scales = mx_oracle(x.reshape(-1, x.shape[-1]), element, block_size, rule, dp, words)
    for loop, (codes, scales) in got.items():
        assert scales.tolist() == want_scales.reshape(-1).tolist(), (loop, element, dp)
        assert codes.reshape(want_codes.shape).tolist() == want_codes.tolist(), (loop, element, dp)


@pytest.mark.parametrize("element", MX_ELEMENTS)
@pytest.mark.parametrize("mode", MODES)
def test_mx_vector_loops_ties_neighbours_and_tiny_quotients(element, mode):
    x = tie_blocks(element, 26, seed=len(element) + len(mode))
    words = None
    if mode == "stochastic":
        # the extremes of the words beside random ones
        words = words_for(x.shape, 11)
        words[:, 1:5] = np.array([0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000], np.uint32)
    for dp in DP_VARIANTS:
        assert_loops_match_oracle(x, element, dict(dp, rounding=mode), words)


def test_mx_vector_loops_stochastic_word_alignment_every_element():
    # q = 1 + k / 16 of an ulp (k = 1..15) in a block of amax max (X = 1): the first 32 bits
    # of the dropped fraction are k * 2**28, so the word rounds up exactly from
    # 2**32 - k * 2**28 on; 1.0 is a normal of every element (MXINT8: 64 units).
    for element in MX_ELEMENTS:
        _, _, largest, bits = mo.ELEMENTS[element]
        one = next(c for c in range(1 << ELEMENT_BITS[element]) if mo.element_value(c, element) == 1)
        ulp = Fraction(1, 1 << bits)
        x = np.zeros((15, 32), np.float32)
        words = np.zeros(x.shape, np.uint32)
        for k in range(1, 16):
            x[k - 1, 0] = float(largest)
            x[k - 1, 1:] = float(1 + ulp * k / 16)
            cut = k << 28
            words[k - 1, 1:] = [(1 << 32) - cut - 1, (1 << 32) - cut] * 15 + [0]
        got = kernel_loops(x, element, {"rounding": "stochastic"}, words)
        for loop, (codes, _) in got.items():
            assert codes[:, 1:31:2].tolist() == [[one] * 15] * 15, (element, loop)
            assert codes[:, 2:32:2].tolist() == [[one + 1] * 15] * 15, (element, loop)
            assert codes[:, 31].tolist() == [one] * 15, (element, loop)
        assert_loops_match_oracle(x, element, {"rounding": "stochastic"}, words)


def test_mx_vector_loops_sample_flushes_rules_and_ragged_blocks():
    # F16_SAMPLE (every binade, float16 subnormals) as float16 x and scaled into float32
    # subnormals; every scale rule; blocks other than 32 (the run-time trip count) and
    # ragged tails (axis lengths that are no multiple of the block).
    x16 = F16_SAMPLE[:40 * 23].reshape(40, 23)
    for x in (x16, x16.astype(np.float32) * np.float32(2.0 ** -112)):
        for element in MX_ELEMENTS:
            for rule, block_size in (("floor", 8), ("ceil", 23), ("even", 5), ("rceil", 16), ("rceil_f32", 7)):
                for dp in ({"rounding": "up", "subnormals": "flush_both"}, {"rounding": "to_odd"},
                           {"rounding": "stochastic", "subnormals": "flush_inputs", "scale_precision": "float32"}):
                    words = words_for(x.shape, 3) if dp["rounding"] == "stochastic" else None
                    assert_loops_match_oracle(x, element, dp, words, block_size, rule)


def test_mx_vector_loops_against_the_reference_at_scale():
    # 64K elements of a wide distribution (float32 bits), NaN and inf blocks, a 32-wide block
    # with a ragged tail of 17: the vector loop and the reference loop, every element, mode
    # and flush, 1 to 3 threads.
    rng = np.random.default_rng(9)
    bits = rng.integers(0, 2**32, size=(64, 1041), dtype=np.uint64).astype(np.uint32)
    bits[:, ::3] = (bits[:, ::3] & 0x81FFFFFF) | 0x3E000000  # many blocks of moderate amax
    x = bits.view(np.float32).copy()
    x[~np.isfinite(x)] = 1.5
    x[5, 40] = np.nan
    x[9, 70] = -np.inf
    x[11, 1030] = np.inf  # the ragged tail's block
    words = words_for(x.shape, 4)
    for element in MX_ELEMENTS:
        for mode in MODES:
            for dp in DP_VARIANTS[:4]:
                dp = dict(dp, rounding=mode, nan="canonical" if mode == "up" else "spec")
                w = words if mode == "stochastic" else None
                first = None
                for n in (1, 2, 3):
                    got = kernel_loops(x, element, dp, w, n_threads=n)
                    assert got["vector"][0].tobytes() == got["scalar"][0].tobytes(), (element, dp, n)
                    assert got["vector"][1].tobytes() == got["scalar"][1].tobytes(), (element, dp, n)
                    first = first or got["vector"][0].tobytes()
                    assert got["vector"][0].tobytes() == first


def test_mx_vector_loops_run_and_agree_on_every_level():
    # The plan of the innermost axis runs the vector loops on every level the machine runs
    # (each level's own module says so), other axes the scalar loop, half_even without a
    # flush the default loop; the bits are the same everywhere, packed output included.
    from qemu_q import _dispatch, _kernels
    from qemu_q.ops import mx as mx_op
    from qemu_q._validate import signature

    x = tie_blocks("float4e2m1", 13, seed=2)
    words = words_for(x.shape, 8)
    level = _kernels.active.level
    results = []
    try:
        for lv in _kernels.available_levels():
            _kernels.use(lv)
            module = _dispatch.entry_module(_dispatch.Path.MX_QUANTIZE)
            assert lv == "baseline" or lv.replace("-", "_") in module.__name__
            for dp, axis, loop in (({"rounding": "up"}, -1, "vector"), ({"subnormals": "flush_outputs"}, -1, "vector"),
                                   ({"rounding": "up"}, 0, "scalar"), ({"scale_precision": "float32"}, -1, "default")):
                plan = mx_op.mx_quantize_plan(signature(x), "float4e2m1", axis, 1 if axis == 0 else 32, "floor",
                                              False, qemu_q.Datapath(**dp))
                assert module.MXQuantizeConfig(**dict(plan.kernel_fields)).datapath_loop == loop, (lv, dp)
            for n in (1, 2, 3):
                for element in MX_ELEMENTS:
                    got = kernel_loops(x, element, {"rounding": "stochastic", "subnormals": "flush_both"}, words,
                                       n_threads=n)
                    results.append((lv, n, element, got["vector"][0].tobytes(), got["scalar"][0].tobytes()))
                packed = qemu_q.mx_quantize(x, "float4e2m1", packed=True, random_bits=words, n_threads=n,
                                            datapath=qemu_q.Datapath(rounding="stochastic"))[0]
                one = qemu_q.mx_quantize(x, "float4e2m1", random_bits=words, n_threads=n,
                                         datapath=qemu_q.Datapath(rounding="stochastic"))[0]
                assert packed.tobytes() == qemu_q.pack(one).tobytes()
    finally:
        _kernels.use(level)
    for lv, n, element, vector, scalar in results:
        assert vector == scalar, (lv, n, element)
        assert vector == next(r[3] for r in results if r[2] == element), (lv, n, element)
