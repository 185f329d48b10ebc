# The integer-only requantization schemes of docs/semantics.md ("Integer-only
# requantization"): acc * multiplier * 2^-shift as compilers lower it, one inline function
# per scheme, each transcribed from the source docs/semantics.md cites. Each writes its
# int32 result to `out` and returns FP_OK, or returns the reason the source leaves the
# element undefined (a TOSA REQUIRE, a TFLite DCHECK, a C++ or LLVM signed overflow): the
# caller reports it instead of inventing bits.

from libc.stdint cimport int32_t, int64_t, uint32_t

cdef extern from *:
    """
    #include <stdint.h>
    static inline int qq_mul_overflow_i64(int64_t a, int64_t b, int64_t *r) {
        return __builtin_mul_overflow(a, b, r);
    }
    static inline int qq_add_overflow_i64(int64_t a, int64_t b, int64_t *r) {
        return __builtin_add_overflow(a, b, r);
    }
    """
    bint mul_overflow_i64 "qq_mul_overflow_i64" (int64_t a, int64_t b, int64_t* r) noexcept nogil
    bint add_overflow_i64 "qq_add_overflow_i64" (int64_t a, int64_t b, int64_t* r) noexcept nogil

cdef enum FixedPointScheme:
    FP_TOSA32 = 0
    FP_TOSA16 = 1
    FP_GEMMLOWP = 2
    FP_TFLITE_SINGLE = 3
    FP_TVM_UPWARD = 4
    FP_TVM_TONEAREST = 5

cdef enum FixedPointStatus:
    FP_OK = 0
    FP_TOSA_VALUE_RANGE = 1      # TOSA: REQUIRE(value >= -(1 << (shift-1)) && value < (1 << (shift-1)))
    FP_RESULT_RANGE = 2          # TOSA REQUIRE / TFLite DCHECK: the shifted result is an int32
    FP_LEFT_SHIFT_OVERFLOW = 3   # TFLite: x * (1 << left_shift) overflows int32
    FP_INT64_OVERFLOW = 4        # TVM: the int64 product or sum overflows

cdef enum:
    FP_INT32_MIN = -2147483648
    FP_INT32_MAX = 2147483647


cdef inline int tosa_apply_scale_32(int32_t value, int32_t multiplier, int shift,
                                    bint double_round, int64_t* out) noexcept nogil:
    cdef int64_t half = <int64_t>1 << (shift - 1)
    cdef int64_t round_term = half
    cdef int64_t result
    if value < -half or value >= half:
        return FP_TOSA_VALUE_RANGE
    if double_round and shift > 31:
        # the sign follows the value, not the product (multiplier >= 0)
        if value >= 0:
            round_term += <int64_t>1 << 30
        else:
            round_term -= <int64_t>1 << 30
    result = (<int64_t>value * multiplier + round_term) >> shift
    if result < FP_INT32_MIN or result > FP_INT32_MAX:
        return FP_RESULT_RANGE
    out[0] = result
    return FP_OK


cdef inline int tosa_apply_scale_16(int32_t value, int32_t multiplier, int shift,
                                    int64_t* out) noexcept nogil:
    cdef int64_t result = (<int64_t>value * multiplier + (<int64_t>1 << (shift - 1))) >> shift
    if result < FP_INT32_MIN or result > FP_INT32_MAX:
        return FP_RESULT_RANGE
    out[0] = result
    return FP_OK


cdef inline int32_t saturating_rounding_doubling_high_mul(int32_t a, int32_t b) noexcept nogil:
    cdef int64_t ab, t
    if a == b and a == FP_INT32_MIN:
        return FP_INT32_MAX
    ab = <int64_t>a * b
    t = ab + ((<int64_t>1 << 30) if ab >= 0 else (1 - (<int64_t>1 << 30)))
    # gemmlowp divides by 2^31 with C++ '/', which truncates toward zero (not a shift)
    if t >= 0:
        return <int32_t>(t >> 31)
    return <int32_t>(-((-t) >> 31))


cdef inline int32_t rounding_divide_by_pot(int32_t x, int exponent) noexcept nogil:
    cdef int32_t mask = <int32_t>((<int64_t>1 << exponent) - 1)
    cdef int32_t remainder = x & mask
    cdef int32_t threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


cdef inline int gemmlowp_multiply(int32_t x, int32_t multiplier, int shift,
                                  int64_t* out) noexcept nogil:
    cdef int left_shift = shift if shift > 0 else 0
    cdef int right_shift = 0 if shift > 0 else -shift
    cdef int64_t shifted = <int64_t>x * (<int64_t>1 << left_shift)
    if shifted < FP_INT32_MIN or shifted > FP_INT32_MAX:
        return FP_LEFT_SHIFT_OVERFLOW
    out[0] = rounding_divide_by_pot(
        saturating_rounding_doubling_high_mul(<int32_t>shifted, multiplier), right_shift)
    return FP_OK


cdef inline int tflite_single_rounding(int32_t x, int32_t multiplier, int shift,
                                       int64_t* out) noexcept nogil:
    cdef int total_shift = 31 - shift
    cdef int64_t result = (<int64_t>x * multiplier + (<int64_t>1 << (total_shift - 1))) >> total_shift
    if result < FP_INT32_MIN or result > FP_INT32_MAX:
        return FP_RESULT_RANGE
    out[0] = result
    return FP_OK


cdef inline int tvm_fixed_point_multiply(int32_t x, int32_t multiplier, int shift,
                                         bint to_nearest, int64_t* out) noexcept nogil:
    cdef int left_shift = shift if shift > 0 else 0
    cdef int right_shift = 0 if shift > 0 else -shift
    cdef int total_right_shift = right_shift + 31
    cdef int64_t rounding = <int64_t>1 << (total_right_shift - 1)
    cdef int64_t product, total
    # |x| * 2^left_shift <= 2^62: the int64 left shift itself cannot overflow
    if mul_overflow_i64(<int64_t>x * (<int64_t>1 << left_shift), multiplier, &product):
        return FP_INT64_OVERFLOW
    if to_nearest and product < 0:
        rounding -= 1
    if add_overflow_i64(product, rounding, &total):
        return FP_INT64_OVERFLOW
    # relay's final Cast(int64 -> int32) is LLVM's trunc: the low 32 bits
    out[0] = <int32_t><uint32_t>(total >> total_right_shift)
    return FP_OK


cdef inline int apply_fixed_point(int scheme, int32_t x, int32_t multiplier, int shift,
                                  bint double_round, int64_t* out) noexcept nogil:
    if scheme == FP_TOSA32:
        return tosa_apply_scale_32(x, multiplier, shift, double_round, out)
    if scheme == FP_TOSA16:
        return tosa_apply_scale_16(x, multiplier, shift, out)
    if scheme == FP_GEMMLOWP:
        return gemmlowp_multiply(x, multiplier, shift, out)
    if scheme == FP_TFLITE_SINGLE:
        return tflite_single_rounding(x, multiplier, shift, out)
    return tvm_fixed_point_multiply(x, multiplier, shift, scheme == FP_TVM_TONEAREST, out)
