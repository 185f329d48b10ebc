"""An independent transcription of each requantization scheme in Python integers, written
from the sources docs/semantics.md cites (not from pyx/_fixedpoint.pxd): unbounded ints,
with each C operation's semantics spelled out (C++ '/' truncates, '>>' of a negative
int64 is floor division by a power of two, int64 overflow checked explicitly).

Each function returns the scheme's int32 result, or None where the source leaves the
element undefined (a REQUIRE/DCHECK that fails, a signed overflow).

quantize_multiplier's oracle works on Fractions: the exponent is found by comparing with
powers of two, never by math.frexp.
"""

from __future__ import annotations

from fractions import Fraction

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _is_int32(v: int) -> bool:
    return INT32_MIN <= v <= INT32_MAX


def _trunc_div(a: int, b: int) -> int:
    # C/C++ integer division: the quotient rounded toward zero
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


# TOSA specification, "apply_scale_32" / "apply_scale_16" (tosa_spec, scaling helpers;
# mlplatform tosa-reference-model reference_model/src/quant_util.h)
def tosa32(value: int, multiplier: int, shift: int, double_round: bool) -> int | None:
    assert multiplier >= 0 and 2 <= shift <= 62
    if not (-(2 ** (shift - 1)) <= value < 2 ** (shift - 1)):
        return None
    round_ = 2 ** (shift - 1)
    if double_round and shift > 31:
        round_ += 2**30 if value >= 0 else -(2**30)
    result = (value * multiplier + round_) // 2**shift   # int64 '>>': floor
    return result if _is_int32(result) else None


def tosa16(value: int, multiplier: int, shift: int) -> int | None:
    assert 0 <= multiplier <= 32767 and 2 <= shift <= 62
    result = (value * multiplier + 2 ** (shift - 1)) // 2**shift
    return result if _is_int32(result) else None


# gemmlowp fixedpoint/fixedpoint.h: SaturatingRoundingDoublingHighMul, RoundingDivideByPOT;
# TFLite tensorflow/lite/kernels/internal/common.h MultiplyByQuantizedMultiplier (default)
def srdhm(a: int, b: int) -> int:
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = 2**30 if ab >= 0 else 1 - 2**30
    return _trunc_div(ab + nudge, 2**31)


def rdbpot(x: int, exponent: int) -> int:
    assert 0 <= exponent <= 31
    mask = 2**exponent - 1
    remainder = x & mask                       # two's complement AND of the low bits
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def gemmlowp(x: int, multiplier: int, shift: int) -> int | None:
    left = shift if shift > 0 else 0
    right = 0 if shift > 0 else -shift
    shifted = x * 2**left
    if not _is_int32(shifted):
        return None
    return rdbpot(srdhm(shifted, multiplier), right)


# TFLite common.h, #if TFLITE_SINGLE_ROUNDING
def tflite_single(x: int, multiplier: int, shift: int) -> int | None:
    assert multiplier >= 0 and -31 <= shift <= 30
    total = 31 - shift
    result = (x * multiplier + 2 ** (total - 1)) >> total
    return result if _is_int32(result) else None


# TVM src/relay/qnn/utils.cc FixedPointMultiply (UPWARD, TONEAREST); the final
# Cast(int64 -> int32) keeps the low 32 bits
def tvm(x: int, multiplier: int, shift: int, rounding: str) -> int | None:
    left = shift if shift > 0 else 0
    right = 0 if shift > 0 else -shift
    tensor = x << left
    product = tensor * multiplier
    if not INT64_MIN <= product <= INT64_MAX:
        return None
    total_right = right + 31
    pos = 1 << (total_right - 1)
    if rounding == "UPWARD":
        rounder = pos
    else:
        rounder = pos if product >= 0 else pos - 1
    summed = product + rounder
    if not INT64_MIN <= summed <= INT64_MAX:
        return None
    low = (summed >> total_right) & 0xFFFFFFFF
    return low - 2**32 if low >= 2**31 else low


def apply(scheme: str, x: int, multiplier: int, shift: int, double_round: bool = False) -> int | None:
    if scheme == "tosa32":
        return tosa32(x, multiplier, shift, double_round)
    if scheme == "tosa16":
        return tosa16(x, multiplier, shift)
    if scheme == "gemmlowp":
        return gemmlowp(x, multiplier, shift)
    if scheme == "tflite_single":
        return tflite_single(x, multiplier, shift)
    if scheme == "tvm_upward":
        return tvm(x, multiplier, shift, "UPWARD")
    if scheme == "tvm_tonearest":
        return tvm(x, multiplier, shift, "TONEAREST")
    raise AssertionError(scheme)


# ---------------------------------------------------------------------------------------
# quantize_multiplier from Fractions

def _mantissa_exponent(scale: Fraction) -> tuple[Fraction, int]:
    """|scale| = mantissa * 2^e, mantissa in [1/2, 1) (frexp's convention), scale != 0."""
    magnitude = abs(scale)
    e = 0
    while magnitude >= Fraction(2) ** e:
        e += 1
    while magnitude < Fraction(2) ** (e - 1):
        e -= 1
    return magnitude / Fraction(2) ** e, e


def _round_away(q: Fraction) -> int:
    floor = q.numerator // q.denominator
    return floor + 1 if q - floor >= Fraction(1, 2) else floor


def quantize_multiplier(scale: float, scheme: str) -> tuple[int, int] | None:
    """None where the scheme rejects the scale."""
    s = Fraction(scale)
    if scheme in ("tosa32", "tosa16"):
        if s < 0:
            return None
        bits = 31 if scheme == "tosa32" else 15
        if s == 0:
            m, e = 0, 0
        else:
            mant, e = _mantissa_exponent(s)
            m = _round_away(mant * 2**bits)
            if m == 2**bits:
                m, e = m // 2, e + 1
        shift = bits - e
        if shift > 62:
            m = m >> min(31, shift - 62)
            shift = 62
        if shift < 2:
            return None
        return m, shift
    if s == 0:
        return 0, 0
    if s < 0 and scheme == "tflite_single":
        return None
    mant, e = _mantissa_exponent(s)
    m = _round_away(mant * 2**31)
    if s < 0:
        m = -m      # std::round is symmetric; the sources fold only q_fixed == +2^31
    if m == 2**31:
        m, e = m // 2, e + 1
    if scheme in ("gemmlowp", "tflite_single"):
        if e < -31:
            return 0, 0
        if e > 30:
            return (2**31 - 1, 30) if scheme == "tflite_single" else None
        return m, e
    if not -32 <= e <= 31:
        return None
    return m, e
