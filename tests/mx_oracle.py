"""Exact oracle for OCP Microscaling (MX v1.0), written from the specification text and
the decisions of docs/semantics.md ("MX"), independently of qemu_q's kernels.

OCP MX v1.0, section 6.3 (Algorithm 1), for a block {V_i}:
    shared_exp = floor(log2(max_i |V_i|)) - emax_elem
    X = 2 ** shared_exp
    P_i = quantize_to_element_format(V_i / X), clamping normal numbers
"normal numbers that exceed the representable range of the element format are clamped to
the maximum representable value, preserving the sign. Infs and NaNs are not clamped."

Everything here is Fraction arithmetic on the exact values of the float32 inputs:
logarithms are integer comparisons with powers of two, elements are rounded by
tests/float_oracle.py's encoder (itself written from the format definitions), and the
only float32 rounding is the one rule "rceil_f32" names (NVIDIA's float32 product).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import float_oracle as fo

# element -> (float_oracle format or None for MXINT8, emax_elem, largest magnitude,
# fraction bits), from the OCP v1.0 element tables (section 5).
ELEMENTS = {
    "float8e4m3fn": ("float8_e4m3fn", 8, Fraction(448), 3),
    "float8e5m2": ("float8_e5m2", 15, Fraction(57344), 2),
    "float6e2m3": ("float6_e2m3fn", 2, Fraction(15, 2), 3),
    "float6e3m2": ("float6_e3m2fn", 4, Fraction(28), 2),
    "float4e2m1": ("float4_e2m1fn", 2, Fraction(6), 1),
    "int8": (None, 0, Fraction(127, 64), 6),
}
RULES = ("floor", "ceil", "even", "rceil", "rceil_f32")
# The code every element of a NaN block gets: the element's quiet NaN, or +0 without one.
NAN_BLOCK_CODE = {"float8e4m3fn": 0x7F, "float8e5m2": 0x7E, "float6e2m3": 0, "float6e3m2": 0,
                  "float4e2m1": 0, "int8": 0}
SCALE_NAN = 0xFF


def floor_log2(a: Fraction) -> int:
    """The integer e with 2**e <= a < 2**(e+1), for a > 0."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    assert Fraction(2) ** e <= a < Fraction(2) ** (e + 1)
    return e


def ceil_log2(a: Fraction) -> int:
    e = floor_log2(a)
    return e if Fraction(2) ** e == a else e + 1


def round_to_fraction_bits(a: Fraction, bits: int) -> Fraction:
    """a > 0 rounded to nearest (ties to even) with `bits` fraction bits and no exponent bound."""
    quantum = Fraction(2) ** (floor_log2(a) - bits)
    return fo.round_half_even(a / quantum) * quantum


def float32_reciprocal(m: Fraction) -> Fraction:
    return fo.round_to_binary(1 / m, "float")


def shared_exponent(amax: Fraction, element: str, rule: str) -> int:
    """The unclamped shared exponent E of a block with finite amax > 0 (X = 2**E)."""
    _, emax, largest, bits = ELEMENTS[element]
    if rule == "floor":
        return floor_log2(amax) - emax
    if rule == "ceil":
        return ceil_log2(amax) - emax
    if rule == "even":
        return floor_log2(round_to_fraction_bits(amax, bits)) - emax
    if rule == "rceil":
        # the smallest E with amax / 2**E <= largest
        return ceil_log2(amax / largest)
    if rule == "rceil_f32":
        q = fo.round_to_binary(amax * float32_reciprocal(largest), "float")
        return -127 if q == 0 else ceil_log2(q)
    raise ValueError(rule)


def scale_code(block: list[float], element: str, rule: str) -> int:
    """The e8m0 code of a block (a list of float32 values as Python floats)."""
    if any(math.isnan(v) or math.isinf(v) for v in block):
        return SCALE_NAN
    amax = max(abs(Fraction(v)) for v in block)
    if amax == 0:
        return 0  # 2**-127
    e = shared_exponent(amax, element, rule)
    return min(max(e, -127), 127) + 127


def element_code(v: float, e: int, element: str) -> int:
    """The code of V / X with X = 2**e (v finite)."""
    fmt, _, _, _ = ELEMENTS[element]
    q = Fraction(v) / Fraction(2) ** e
    if fmt is None:
        n = fo.round_half_even(q * 64)
        return max(-127, min(127, n)) & 0xFF
    if q == 0:
        return fo.encode(fmt, math.copysign(0.0, v), saturate=True)
    return fo.encode(fmt, q, saturate=True)


def quantize_block(block: list[float], element: str, rule: str) -> tuple[list[int], int]:
    code = scale_code(block, element, rule)
    if code == SCALE_NAN:
        return [NAN_BLOCK_CODE[element]] * len(block), code
    return [element_code(v, code - 127, element) for v in block], code


def mx_quantize(x: np.ndarray, element: str, axis: int, block_size: int, rule: str):
    """(codes as uint8 one per byte, scale codes as uint8 in the blocked shape)."""
    x = np.asarray(x, dtype=np.float32)
    axis %= x.ndim
    moved = np.moveaxis(x, axis, -1)
    d = moved.shape[-1]
    n_blocks = -(-d // block_size)
    codes = np.zeros(moved.shape, dtype=np.uint8)
    scales = np.zeros(moved.shape[:-1] + (n_blocks,), dtype=np.uint8)
    for index in np.ndindex(moved.shape[:-1]):
        row = [float(v) for v in moved[index]]
        for b in range(n_blocks):
            block = row[b * block_size:(b + 1) * block_size]
            c, s = quantize_block(block, element, rule)
            codes[index + (slice(b * block_size, b * block_size + len(block)),)] = c
            scales[index + (b,)] = s
    return np.moveaxis(codes, -1, axis), np.moveaxis(scales, -1, axis)


def element_value(code: int, element: str):
    """Fraction value of a code, or "nan"."""
    fmt = ELEMENTS[element][0]
    if fmt is None:
        return Fraction(code - 256 if code >= 128 else code, 64)
    v = fo.decode(fmt, code)
    return v


def dequantize_bits(codes: np.ndarray, scales: np.ndarray, element: str, axis: int, block_size: int) -> np.ndarray:
    """float32 bits of code * X rounded once (nearest even, overflow to inf); NaN as
    0x7FC00000 (a NaN scale, or a NaN code, which decodes with its sign)."""
    axis %= codes.ndim
    codes = np.moveaxis(codes, axis, -1)
    scales = np.moveaxis(scales, axis, -1)
    out = np.zeros(codes.shape, dtype=np.uint32)
    for index in np.ndindex(codes.shape):
        c = int(codes[index])
        s = int(scales[index[:-1] + (index[-1] // block_size,)])
        v = element_value(c, element)
        if v == "nan":
            out[index] = 0xFFC00000 if c & fo.FORMATS[ELEMENTS[element][0]].sign_mask else 0x7FC00000
            continue
        if s == SCALE_NAN:
            out[index] = 0x7FC00000
            continue
        if v in ("+inf", "-inf"):
            out[index] = 0x7F800000 if v == "+inf" else 0xFF800000
            continue
        y = fo.round_to_binary(v * Fraction(2) ** (s - 127), "float")
        out[index] = np.array(float(y), dtype=np.float32).view(np.uint32)
        if y == 0 and (v < 0 or (v == 0 and _negative_zero(c, element))):
            out[index] = 0x80000000
    return np.moveaxis(out, -1, axis)


def _negative_zero(code: int, element: str) -> bool:
    fmt = ELEMENTS[element][0]
    return fmt is not None and code == fo.FORMATS[fmt].sign_mask
