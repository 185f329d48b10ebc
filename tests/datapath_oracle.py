"""Exact oracle of QuantizeLinear under a qemu_q.Datapath, written from docs/semantics.md
("Datapath options"), not from the kernels.

Values are exact: Fractions for the quotient's arithmetic, and the quotient, once rounded to
its precision, as an integer mantissa times a power of two, so that rounding it to an
integer or to a small float's mantissa is integer arithmetic. The final small-float code of
a rounded (exactly representable, or beyond max) value comes from tests/float_oracle.py's
`encode`, the definition of the Cast tables' rows.

    quantize(x_value, scale_value, zero_point, out, datapath_dict, random_word, ...)
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction
from functools import lru_cache

import numpy as np

import float_oracle as fo

TWO32 = 1 << 32

# (fraction bits, smallest normal exponent, largest finite) of the quotient precisions.
PRECISIONS = {
    "float": (23, -126, Fraction(2**24 - 1, 2**23) * 2**127),
    "float16": (10, -14, Fraction(65504)),
    "bfloat16": (7, -126, Fraction(2**8 - 1, 2**7) * 2**127),
    "float64": (52, -1022, Fraction(2**53 - 1, 2**52) * 2**1023),
}
PRECISIONS["float32"] = PRECISIONS["float"]
# Integer outputs: (lo, hi).
INTEGERS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
            "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
# The smallest normal of a float input type (subnormals="flush_inputs").
MIN_NORMAL = {"float": Fraction(1, 2**126), "float16": Fraction(1, 2**14),
              "bfloat16": Fraction(1, 2**126)}


def floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return e


def round_nearest_even_to(value: Fraction, precision: str):
    """value rounded to nearest, ties to even, in the precision: a Fraction or +-inf."""
    mantissa_bits, min_exponent, largest = PRECISIONS[precision]
    if value == 0:
        return Fraction(0)
    a = abs(value)
    e = max(floor_log2(a), min_exponent)
    ulp = Fraction(2) ** (e - mantissa_bits)
    t = a / ulp
    n = t.numerator // t.denominator
    rest = t - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
        n += 1
    r = n * ulp
    if r > largest:
        return math.copysign(math.inf, value)
    return r if value > 0 else -r


def round_magnitude(whole: int, rem: int, den: int, negative: bool, rounding: str, word: int) -> int:
    """The magnitude whole + rem/den (0 <= rem < den) rounded to an integer by the mode; the
    value's sign is `negative` (docs/semantics.md, the rounding table). Integers only."""
    if rem == 0:
        return whole
    above, tie = 2 * rem > den, 2 * rem == den
    if rounding == "half_even":
        up = above or (tie and whole % 2 == 1)
    elif rounding == "half_away":
        up = above or tie
    elif rounding == "half_up":
        up = above or (tie and not negative)
    elif rounding == "half_down":
        up = above or (tie and negative)
    elif rounding == "toward_zero":
        up = False
    elif rounding == "down":
        up = negative
    elif rounding == "up":
        up = not negative
    elif rounding == "to_odd":
        up = whole % 2 == 0
    elif rounding == "stochastic":
        # The first 32 bits of the fraction, plus the word: a carry out rounds up.
        up = (rem * TWO32) // den + word >= TWO32
    else:
        raise AssertionError(rounding)
    return whole + 1 if up else whole


def split(a: Fraction, ulp_exponent: int) -> tuple[int, int, int]:
    """a / 2**ulp_exponent as (whole, rem, den): whole + rem / den, 0 <= rem < den."""
    num, den = a.numerator, a.denominator
    if ulp_exponent >= 0:
        den <<= ulp_exponent
    else:
        num <<= -ulp_exponent
    whole, rem = divmod(num, den)
    return whole, rem, den


def quotient(x, s: Fraction, dp: dict, precision: str, x_type: str, scale_type: str):
    key = (repr(x), math.copysign(1.0, x) if isinstance(x, float) else 0, s, dp.get("subnormals", "keep") in ("flush_inputs", "flush_both"),
           dp.get("scale", "divide"), dp.get("scale_precision"), precision, x_type, scale_type)
    if key not in _QUOTIENTS:
        _QUOTIENTS[key] = _quotient(x, s, dp, precision, x_type, scale_type)
    return _QUOTIENTS[key]


_QUOTIENTS: dict = {}


def _quotient(x, s: Fraction, dp: dict, precision: str, x_type: str, scale_type: str):
    """The quotient as the datapath forms it: a Fraction, or a float (+-inf, NaN).
    x: a Fraction or a float inf/NaN (or -0.0); s: a Fraction (finite, nonzero here)."""
    flush = dp.get("subnormals", "keep") in ("flush_inputs", "flush_both")
    negative_x = (math.copysign(1.0, x) < 0) if isinstance(x, float) else x < 0
    if isinstance(x, float) and math.isnan(x):
        return x
    if flush:
        if not isinstance(x, float) and x != 0 and abs(x) < MIN_NORMAL.get(x_type, 0):
            x = -0.0 if negative_x else 0.0
        if s != 0 and abs(s) < MIN_NORMAL.get(scale_type, 0):
            s = Fraction(0)
    if s == 0:
        raise AssertionError("the oracle takes nonzero scales after flushing")
    p = dp.get("scale_precision") or precision
    if dp.get("scale", "divide") == "reciprocal":
        r = round_nearest_even_to(1 / s, p)
        if isinstance(r, float):  # 1/s overflowed the precision: x * inf
            if isinstance(x, float) and x == 0.0 or x == 0:
                return math.nan
            return math.copysign(math.inf, r) * (-1.0 if negative_x else 1.0)
        if isinstance(x, float):
            if x == 0.0:
                return math.copysign(0.0, (-1.0 if negative_x else 1.0) * float(r))
            return x * float(r)
        if x == 0:
            return Fraction(0)
        return round_nearest_even_to(x * r, p)
    if isinstance(x, float):
        if x == 0.0:
            return math.copysign(0.0, (-1.0 if negative_x else 1.0) * float(s))
        return x * float(s) / abs(float(s)) if math.isinf(x) else x / float(s)
    if x == 0:
        return Fraction(0)
    return round_nearest_even_to(x / s, p)


def quotient_sign(q, x, s) -> bool:
    """True when the quotient is negative (zero quotients take the sign of x/s)."""
    if isinstance(q, float):
        return math.copysign(1.0, q) < 0
    if q != 0:
        return q < 0
    negative_x = (math.copysign(1.0, x) < 0) if isinstance(x, float) else x < 0
    return negative_x != (s < 0)


def to_integer(q, negative: bool, zero_point: int, out: str, dp: dict, word: int) -> int:
    lo, hi = INTEGERS[out]
    if isinstance(q, float) and math.isnan(q):
        rule = dp.get("nan_to_integer", "min")
        if rule == "min":
            return lo
        if rule == "max":
            return hi
        q = Fraction(0)
    if isinstance(q, float) and q == 0.0:  # a signed zero
        q = Fraction(0)
    if isinstance(q, float):  # +-inf
        return lo if q < 0 else hi
    n = round_magnitude(*split(abs(q), 0), negative, dp.get("rounding", "half_even"), word)
    v = (-n if negative else n) + zero_point
    return min(max(v, lo), hi)


def to_small_float(q, negative: bool, fmt, dp: dict, word: int, saturate: int, opset: int) -> int:
    """q (plus the zero point, +-0, which only signs a zero) rounded by the mode on the
    format's mantissa, unbounded exponent; overflow and specials by the Cast rows."""
    fmt = fo.FORMATS[fmt] if isinstance(fmt, str) else fmt
    nan = dp.get("nan", "spec")
    if isinstance(q, float):
        if math.isnan(q) or math.isinf(q):
            return fo.encode(fmt, q, saturate, opset, nan)
        q = Fraction(0)
    if q == 0:
        return _encode(fmt, Fraction(0), negative, saturate, opset, nan)
    a = abs(q)
    u = max(floor_log2(a), fmt.min_normal_exp) - fmt.man_bits
    n = round_magnitude(*split(a, u), negative, dp.get("rounding", "half_even"), word)
    r = Fraction(n << u) if u >= 0 else Fraction(n, 1 << -u)
    if dp.get("subnormals", "keep") in ("flush_outputs", "flush_both") and n and u + n.bit_length() - 1 < fmt.min_normal_exp:
        r = Fraction(0)
    return _encode(fmt, r, negative, saturate, opset, nan)


@lru_cache(maxsize=None)
def _encode(fmt, r: Fraction, negative: bool, saturate: int, opset: int, nan: str) -> int:
    # r is representable with an unbounded exponent: encode only applies the rows.
    if r == 0:
        return fo.encode(fmt, -0.0 if negative else 0.0, saturate, opset, nan)
    return fo.encode(fmt, -r if negative else r, saturate, opset, nan)


def value_of(v: float):
    """An input element as the oracle takes it: a Fraction, or a float for inf/NaN/-0."""
    if math.isnan(v) or math.isinf(v) or (v == 0.0 and math.copysign(1.0, v) < 0):
        return float(v)
    return Fraction(v)


_QUOTIENT_ARRAYS: dict = {}


def _quotients_of(flat: np.ndarray, s: Fraction, dp: dict, precision: str, x_type: str,
                  scale_type: str) -> list:
    """(value, quotient, negative) of every element of flat, remembered per input array and
    quotient step: the exhaustive tests round the same quotients by every mode."""
    key = (hashlib.sha256(flat.tobytes()).hexdigest(), flat.size, s,
           dp.get("subnormals", "keep") in ("flush_inputs", "flush_both"), dp.get("scale", "divide"),
           dp.get("scale_precision"), precision, x_type, scale_type)
    if key not in _QUOTIENT_ARRAYS:
        triples = []
        for v in flat.tolist():
            xv = value_of(v)
            q = quotient(xv, s, dp, precision, x_type, scale_type)
            triples.append((xv, q, quotient_sign(q, xv, s)))
        _QUOTIENT_ARRAYS[key] = triples
    return _QUOTIENT_ARRAYS[key]


def quantize_array(x: np.ndarray, scale: float, zero_point, out: str, dp: dict, *,
                   words=None, precision: str = "float", x_type: str = "float16",
                   scale_type: str = "float", saturate: int = 1, opset: int = 28) -> np.ndarray:
    """Every element of x (any float dtype) with one scale, as uint codes (the storage's
    unsigned view for integers: the code masked to its width)."""
    s = Fraction(float(scale))
    with np.errstate(invalid="ignore"):  # signalling NaNs: quieted, their sign kept
        flat = np.asarray(x, dtype=np.float64).ravel()  # float16/bfloat16/float32: exact
    words = np.zeros(flat.size, np.uint64) if words is None else np.asarray(words).ravel()
    integer = out in INTEGERS
    bits = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int4": 4, "uint4": 4, "int2": 2, "uint2": 2}
    result = np.empty(flat.size, np.uint32)
    rounding_cache = {}
    for i, (xv, q, negative) in enumerate(_quotients_of(flat, s, dp, precision, x_type, scale_type)):
        word = int(words[i])
        # Zeros and NaNs keyed by their sign, the rest by value.
        key = (q, negative, word) if not isinstance(q, float) else (repr(q), negative, word)
        if key not in rounding_cache:
            if integer:
                rounding_cache[key] = to_integer(q, negative, int(zero_point or 0), out, dp, word) & ((1 << bits[out]) - 1)
            else:
                rounding_cache[key] = to_small_float(q, negative, out, dp, word, saturate, opset)
        result[i] = rounding_cache[key]
    return result.reshape(np.shape(x))
