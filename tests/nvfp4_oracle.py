"""An NVFP4 oracle written from the recipes' source, apart from qemu_q's kernel.

Each recipe is transcribed line by line from the code docs/semantics.md ("NVFP4") cites, in
numpy float32 arithmetic (every operation on float32 operands rounds once to float32, as
CUDA's float operations and torch's float32 tensors do), block by block in plain loops over
numpy arrays. The two conversions are not the kernel's bit tricks: the float4e2m1 and
float8e4m3fn values are listed from the OCP / ONNX format definitions as Fractions, and a
value is rounded to the nearest of them by comparing it with the midpoints (exact float32
numbers), ties to the even code. A NaN never carries a payload here: each recipe's code for
it is written out.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def _e2m1_values() -> list[Fraction]:
    # float4e2m1: 1 sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf, no NaN.
    values = []
    for code in range(8):
        e, m = code >> 1, code & 1
        values.append(Fraction(m, 2) if e == 0 else Fraction(2) ** (e - 1) * (1 + Fraction(m, 2)))
    return values


def _e4m3_values() -> list[Fraction]:
    # float8e4m3fn: bias 7, 3 mantissa bits, 0x7F/0xFF NaN, no inf: codes 0..0x7E finite.
    values = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        values.append(Fraction(m, 8) * Fraction(2) ** -6 if e == 0
                      else Fraction(2) ** (e - 7) * (1 + Fraction(m, 8)))
    return values


E2M1 = _e2m1_values()
E4M3 = _e4m3_values()
assert E2M1[-1] == 6 and E4M3[-1] == 448


def _midpoints(values: list[Fraction], next_value: Fraction) -> np.ndarray:
    grid = values + [next_value]
    mids = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
    out = np.array([float(m) for m in mids], dtype=np.float32)
    assert all(Fraction(float(v)) == m for v, m in zip(out, mids))  # exact float32 numbers
    return out


# The next value of each grid with an unbounded exponent (8 = 2**3, 480 = 1.875 * 2**8):
# beyond the last midpoint, or on it with the upper neighbour even, a value overflows.
_E2M1_MIDS = _midpoints(E2M1, Fraction(8))
_E4M3_MIDS = _midpoints(E4M3, Fraction(480))


def _round_magnitude(a: np.ndarray, mids: np.ndarray) -> np.ndarray:
    """Index of the nearest grid value of each magnitude a >= 0 (not NaN), ties to the even
    index (the even mantissa); len(mids) means beyond the largest finite value."""
    a = np.asarray(a, dtype=np.float32)
    i = np.searchsorted(mids, a, side="left")  # mids[i - 1] < a <= mids[i]
    tie = np.zeros(a.shape, dtype=bool)
    inside = i < mids.size
    tie[inside] = a[inside] == mids[i[inside]]
    return np.where(tie & (i % 2 == 1), i + 1, i)


def e2m1_rne(q: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e2m1: nearest, ties to even, +-6 beyond; the sign bit of q kept
    (-0 -> 0x8). NaN is left to the caller (returned as -1)."""
    q = np.asarray(q, dtype=np.float32)
    nan = np.isnan(q)
    a = np.where(nan, F32(0), np.abs(q))
    index = np.minimum(_round_magnitude(a, _E2M1_MIDS), 7)
    sign = (q.view(np.uint32) >> 31).astype(np.int64)
    return np.where(nan, -1, index + 8 * sign)


def e4m3_rne(s: np.ndarray, saturate: bool) -> np.ndarray:
    """Nearest float8e4m3fn code of s >= 0, ties to even; beyond 464 448 (saturate) or
    0x7F (torch's .to(float8_e4m3fn), whose overflow is NaN); NaN 0x7F."""
    s = np.asarray(s, dtype=np.float32)
    nan = np.isnan(s)
    assert not np.any(s[~nan] < 0)
    index = _round_magnitude(np.where(nan, F32(0), s), _E4M3_MIDS)
    over = index >= 0x7F
    index = np.where(over, 0x7E if saturate else 0x7F, index)
    return np.where(nan, 0x7F, index)


def e4m3_value(code: int) -> np.float32:
    return F32(np.nan) if code == 0x7F else F32(float(E4M3[code]))


def fminf(a, b):
    # C fminf: the other operand when one is NaN
    a, b = F32(a), F32(b)
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return a if a < b else b


def fmaxf(a, b):
    a, b = F32(a), F32(b)
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return a if a > b else b


# ---------------------------------------------------------------- the recipes' global scale

def tensor_amax(x: np.ndarray, recipe: str) -> np.float32:
    values = [F32(v) for v in np.asarray(x, dtype=np.float32).ravel()]
    if recipe == "transformer_engine":
        # amax kernel: max = fmaxf(fabsf(val), max) from 0
        return F32(np.fmax.reduce(np.abs(np.asarray(values, dtype=np.float32)), initial=F32(0)))
    # torch.max(torch.abs(x)) / max(|max|, |min|): NaN wins
    if any(math.isnan(v) for v in values):
        return F32(np.nan)
    return max((abs(v) for v in values), default=F32(0))


def global_parameters(recipe: str, amax) -> dict:
    amax = F32(amax)
    with np.errstate(all="ignore"):
        if recipe == "transformer_engine":
            # core_nvfp4.cuh compute_global_encode_scaling_factor_FP4
            s_enc = F32(448.0) * F32(6.0) / amax
            s_enc = fminf(s_enc, FLT_MAX)
            if amax == F32(0) or s_enc == F32(0):
                s_enc = F32(1.0)
            # S_dec_rowwise = 1.0 / S_enc_rowwise (a double quotient stored as float)
            s_dec = F32(1.0 / float(s_enc))
            return dict(s_enc=s_enc, decode=s_dec, inv6=F32(1.0) / F32(6.0))
        if recipe == "torchao":
            # per_tensor_amax_to_scale: amax.to(float32) / (F8E4M3_MAX * F4_E2M1_MAX)
            per_tensor_scale = amax / F32(448.0 * 6.0)
            return dict(decode=per_tensor_scale)
        # modelopt get_weights_scaling_factor_2: amax.float() / (6.0 * 448.0)
        return dict(decode=amax / F32(6.0 * 448.0))


# ------------------------------------------------------------------ one block per recipe

def _block_transformer_engine(values: np.ndarray, g: dict):
    with np.errstate(all="ignore"):
        # block_amax = fmaxf(block_amax, fabsf(elt)) from 0.0f: NaN never wins
        block_amax = F32(np.fmax.reduce(np.abs(values), initial=F32(0)))
        # compute_decoding_scaling_factor: block_amax * (S_enc * fp4_max_inv), fminf FLT_MAX,
        # static_cast<fp8e4m3> (satfinite)
        s_dec_b = block_amax * (g["s_enc"] * g["inv6"])
        s_dec_b = fminf(s_dec_b, FLT_MAX)
        scale = int(e4m3_rne(s_dec_b, saturate=True))
        # block_scale_inverse = fminf(1.0f / (float(S_dec_b_fp8) * S_dec), FLT_MAX)
        inverse = fminf(F32(1.0) / (e4m3_value(scale) * g["decode"]), FLT_MAX)
        q = values * inverse  # mul.f32x2
        codes = e2m1_rne(q)
        codes = np.where(codes < 0, 0x7, codes)  # NaN: satfinite +MAX_NORM
    return scale, codes


def _block_torchao(values: np.ndarray, g: dict):
    with np.errstate(all="ignore"):
        mags = np.abs(values)
        max_abs = F32(np.nan) if np.isnan(mags).any() else F32(mags.max())  # torch.amax
        block_scale = max_abs / F32(6.0)  # / F4_E2M1_MAX
        scaled = block_scale / g["decode"]  # / per_tensor_scale
        if not math.isnan(scaled):  # torch.clamp(., min=E4M3_EPS, max=F8E4M3_MAX)
            scaled = min(max(scaled, F32(2.0 ** -6)), F32(448.0))
        scale = int(e4m3_rne(scaled, saturate=False))
        reciprocal = (F32(1.0) / g["decode"]) / e4m3_value(scale)
        q = values * reciprocal
        q = np.where(np.isnan(q), q, np.clip(q, F32(-6.0), F32(6.0)))
        codes = e2m1_rne(q)
        # _f32_to_floatx_unpacked's normal branch on the canonical NaN 0x7FFFFFFF:
        # ((0x7FFFFFFF - (126 << 23) + (2**21 - 1) + 1) >> 22) & 0xFF
        nan_code = ((0x7FFFFFFF - (126 << 23) + (2 ** 21 - 1) + 1) >> 22) & 0xFF
        codes = np.where(codes < 0, nan_code, codes)
    return scale, codes


def _block_modelopt(values: np.ndarray, g: dict):
    with np.errstate(all="ignore"):
        mags = np.abs(values)
        block_amax = F32(np.nan) if np.isnan(mags).any() else F32(mags.max())
        per_block_scale = block_amax / (F32(6.0) * g["decode"])
        if per_block_scale == F32(0):
            per_block_scale = F32(1.0)
        scale = int(e4m3_rne(per_block_scale, saturate=False))  # .to(float8_e4m3fn), no clamp
        divisor = e4m3_value(scale) * g["decode"]
        q = values / divisor
        # _cast_fp4: sign_bit = (w < 0); searchsorted over the bounds (NaN last: 7);
        # the ordinal with the odd-bound fix-up is the nearest value, ties even.
        sign = (q < 0).astype(np.int64)
        index = np.where(np.isnan(q), 7, np.minimum(_round_magnitude(np.where(np.isnan(q), 0, np.abs(q)), _E2M1_MIDS), 7))
        codes = 8 * sign + index
    return scale, codes


_BLOCKS = {"transformer_engine": _block_transformer_engine, "torchao": _block_torchao,
           "modelopt": _block_modelopt}


def quantize(x: np.ndarray, recipe: str, axis: int = -1, block_shape=(1, 16), global_amax=None):
    """(codes, scale codes, global scale): codes as uint8 code numbers of x's shape, scales
    as uint8 of the blocked shape, the global scale a float32."""
    x = np.asarray(x, dtype=np.float32)
    axis %= x.ndim
    amax = tensor_amax(x, recipe) if global_amax is None else F32(global_amax)
    g = global_parameters(recipe, amax)
    moved = np.moveaxis(x, axis, -1)  # blocks along the last axis of `moved`
    lead = moved.shape[:-1]
    n = moved.shape[-1]
    n_blocks = -(-n // 16)
    codes = np.zeros(moved.shape, dtype=np.int64)
    scales = np.zeros(lead + (n_blocks,), dtype=np.int64)
    block = _BLOCKS[recipe]
    if tuple(block_shape) == (16, 16):
        assert x.ndim == 2
        rows = moved.shape[0]
        for r0 in range(0, rows, 16):
            for b in range(n_blocks):
                tile = moved[r0:r0 + 16, 16 * b:16 * b + 16]
                scale, tile_codes = block(tile.ravel(), g)
                codes[r0:r0 + 16, 16 * b:16 * b + 16] = tile_codes.reshape(tile.shape)
                scales[r0:r0 + 16, b] = scale
    else:
        for index in np.ndindex(*lead):
            for b in range(n_blocks):
                values = moved[index][16 * b:16 * b + 16]
                scale, block_codes = block(values, g)
                codes[index][16 * b:16 * b + 16] = block_codes
                scales[index + (b,)] = scale
    codes = np.moveaxis(codes, -1, axis).astype(np.uint8)
    scales = np.moveaxis(scales, -1, axis).astype(np.uint8)
    return codes, scales, F32(g["decode"])


def dequantize_exact(codes: np.ndarray, scales: np.ndarray, global_scale, axis: int = -1) -> np.ndarray:
    """The two-DequantizeLinear graph from the ONNX text: block scale = RN32(e4m3 * global),
    y = RN32(e2m1 * block scale); exact Fractions rounded once each (float32 results)."""
    def rn32(value: Fraction) -> np.float32:
        # float(Fraction) rounds to nearest even once; a double holds every product of a
        # float32 and a 4-bit or 8-bit value exactly, so no double rounding occurs here.
        return F32(float(value))

    axis %= codes.ndim
    g = Fraction(float(global_scale))
    e2m1 = [v if c < 8 else -v for c in range(16) for v in [E2M1[c % 8]]]
    out = np.zeros(codes.shape, dtype=np.float32)
    for index in np.ndindex(*codes.shape):
        b = list(index)
        b[axis] //= 16
        s = int(scales[tuple(b)])
        sign = -1 if s & 0x80 else 1
        block_scale = rn32(sign * E4M3[s & 0x7F] * g) if (s & 0x7F) != 0x7F else F32(np.nan)
        c = int(codes[index])
        value = e2m1[c]
        if math.isnan(block_scale):
            out[index] = np.nan
        else:
            product = value * Fraction(float(block_scale))
            out[index] = -F32(0) if product == 0 and (c >= 8) != (block_scale < 0) else rn32(product)
    return out
