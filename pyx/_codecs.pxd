# Scalar codecs shared by every kernel family: bit casts, float16/bfloat16 and small-float
# encoders and decoders, rounding to a format's precision, the integer saturating encoder.
# Everything here is `inline noexcept nogil` so that each kernel gets its own copy the
# compiler can specialise on constant arguments.

from libc.math cimport fabs, fabsf, floor, ceil, copysign, copysignf, fma, fmod, frexp, ldexp, isinf, isnan, INFINITY
from libc.stdint cimport int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcpy


# Storage of the x operand of QuantizeLinear: float32 values, float16/bfloat16 bit patterns,
# int32 values.
ctypedef fused x_storage_t:
    float
    uint16_t
    int32_t

# Storage of quantized codes: 8-bit types (including one-per-byte int4/int2/float4/float6/
# float8 codes) and 16-bit types.
ctypedef fused code_storage_t:
    uint8_t
    uint16_t

# Storage of DequantizeLinear's output: float32 values, float16/bfloat16 bit patterns.
ctypedef fused y_storage_t:
    float
    uint16_t


cdef enum ValueFormat:
    FMT_FLOAT32 = 0
    FMT_FLOAT16 = 1
    FMT_BFLOAT16 = 2
    FMT_INT32 = 3


# Encodings of a quantized type, as the kernels see them.
cdef enum CodeKind:
    CODE_INTEGER = 0   # two's complement / unsigned integer, clamped to [lo, hi], masked
    CODE_SMALL_FLOAT = 1


# How QuantizeLinear computes, decided once per plan (qemu_q/ops/quantize_linear.py):
# the general scalar path, or a vectorized float32 one.
cdef enum QuantizePath:
    PATH_GENERAL = 0
    PATH_F32_INTEGER = 1      # float32 x, float32 division, integer codes
    PATH_F32_SMALL_FLOAT = 2  # float32 x, float32 division, 8-bit-stored small-float codes


# What Cast reads and writes (pyx/_cast.pyx): the encoding of an element, and the loop
# qemu_q/ops/cast.py picks once per plan.
cdef enum CastKind:
    CAST_FLOAT64 = 0
    CAST_FLOAT32 = 1
    CAST_FLOAT16 = 2
    CAST_BFLOAT16 = 3
    CAST_SMALL_FLOAT = 4  # float8, float4, float6 (one code per byte)
    CAST_E8M0 = 5
    CAST_SIGNED = 6       # two's complement, 2 to 64 bits (int4/int2 one per byte)
    CAST_UNSIGNED = 7
    CAST_BOOL = 8


cdef enum CastPath:
    CAST_PATH_GENERAL = 0
    CAST_PATH_F32_SMALL_FLOAT = 1
    CAST_PATH_F32_E8M0 = 2
    # a Datapath into an ONNX small float from float32 (float16 / bfloat16 widened first):
    # one loop per rounding mode (pyx/_cast_loops.pxi)
    CAST_PATH_SMALL_FLOAT_DATAPATH = 3
    CAST_PATH_F32_F16 = 4        # float32 -> float16, bit arithmetic
    CAST_PATH_F32_BF16 = 5       # float32 -> bfloat16
    CAST_PATH_F32_INTEGER = 6    # float32 -> 8- and 16-bit integers (truncation, saturation)
    CAST_PATH_F16_F32 = 7        # float16 -> float32 (exact)
    CAST_PATH_BF16_F32 = 8       # bfloat16 -> float32 (exact)
    # a Datapath into float16 / bfloat16 from float32 (float16 / bfloat16 widened first):
    # one loop per rounding mode and target (pyx/_cast_loops.pxi)
    CAST_PATH_HALF_DATAPATH = 9


cdef enum SmallFloatId:
    SF_E4M3FN = 0
    SF_E4M3FNUZ = 1
    SF_E5M2 = 2
    SF_E5M2FNUZ = 3
    SF_E2M1 = 4
    SF_E2M3 = 5
    SF_E3M2 = 6
    SF_COUNT = 7


# The codec family (qemu_q.minifloat_type, docs/semantics.md "Codec family"): a format that
# is not one of the ONNX ids above carries its parameters in its id, so that every kernel
# entry that takes a small_float_id takes it unchanged. Bits 0-3: exponent bits (1..8),
# 4-7: mantissa bits (0..14), 8-15: bias (0..127), 16-17: the NaN convention, 18: inf.
cdef enum:
    SF_FAMILY = 1 << 24
    SF_FAMILY_IEEE = 0   # the all-ones exponent holds inf (with `inf`) and the NaNs
    SF_FAMILY_FN = 1     # only the all-ones magnitude of each sign is NaN
    SF_FAMILY_FNUZ = 2   # the negative-zero code is the one NaN; no -0
    SF_FAMILY_NONE = 3   # no NaN


cdef struct SmallFloatFormat:
    int width          # bits in a code; the sign is the top bit
    int mantissa_bits
    int min_exponent   # unbiased exponent of the smallest normal (1 - bias)
    int bias
    double max_finite
    int max_code       # code of +max_finite
    int nan_code       # the NaN code conversions write, -1 when the format has none
    int inf_code       # code of +inf, -1 when the format has none
    bint unsigned_zero # FNUZ: the negative-zero pattern is NaN, so -0 encodes as +0
    int first_nan_magnitude  # magnitudes from here up decode as NaN (1 << 30: none)


cdef enum SmallFloatRule:
    # Rows of the float8 Cast tables that differ by version or by option, as flags that
    # qemu_q/ops/quantize_linear.py sets from qemu_q/_opspec.py's CAST_FLOAT8_TABLES.
    SF_RULE_NAN_SIGN = 1      # "-NaN -> -NaN", "-Inf -> -NaN" (e4m3fn, e5m2); off: NaN is 0x7F
    SF_RULE_FNUZ_INF_NAN = 2  # Cast-19/21/23, saturate=1: FNUZ "Inf -> NaN", "-Inf -> NaN"
    # Cast into a format without NaN (float4, float6): NaN gives the negative-zero code, as
    # the official Cast vectors of opset 25 do; off: +max, as QuantizeLinear follows the
    # ONNX float4 note (docs/semantics.md, "Cast").
    SF_RULE_NAN_NEGATIVE_ZERO = 4
    # Datapath nan="zero_opposite_sign" (ml_dtypes' conversions): NaN into a format without
    # NaN gives the zero of the opposite sign, +NaN -> -0, -NaN -> +0; wins over the above.
    SF_RULE_NAN_OPPOSITE_ZERO = 8


# The codes of the values outside the finite range, decided once per call from the format,
# `saturate` and the rules: both encoders read them, so they cannot disagree on a row.
# A sign mask is all ones where the code takes the input's sign, 0 where it is fixed.
cdef struct SmallFloatSpecials:
    int nan_code
    int nan_sign
    int inf_code
    int inf_sign
    int overflow_code   # a finite input whose [x] is beyond +-max
    int overflow_sign


cdef inline SmallFloatSpecials small_float_specials(const SmallFloatFormat* f, bint saturate,
                                                    int rules) noexcept nogil:
    cdef SmallFloatSpecials s
    # float4/float6: no inf or NaN codes; NaN gives +max (the ONNX float4 note).
    cdef bint no_specials = f.nan_code < 0 and f.inf_code < 0
    cdef bint signed_nan = not no_specials and not f.unsigned_zero  # e4m3fn, e5m2
    s.nan_code = f.max_code if no_specials else f.nan_code
    if no_specials and (rules & SF_RULE_NAN_NEGATIVE_ZERO):
        s.nan_code = 1 << (f.width - 1)
    # The FNUZ NaN 0x80 has no sign to keep. Without the signed-NaN rows, the one NaN
    # code NVIDIA's conversions write: 0x7F, e5m2 included.
    s.nan_sign = -1 if (rules & SF_RULE_NAN_SIGN) and signed_nan else 0
    if signed_nan and not (rules & SF_RULE_NAN_SIGN):
        s.nan_code = (1 << (f.width - 1)) - 1  # the all-ones magnitude: 0x7F in 8 bits
    if no_specials and (rules & SF_RULE_NAN_OPPOSITE_ZERO):
        # The encoders XOR the NaN's sign into nan_code (elsewhere nan_code holds no sign
        # bit where nan_sign is set, so XOR is OR): the negative-zero code flips to +0.
        s.nan_code = 1 << (f.width - 1)
        s.nan_sign = -1
    if saturate or no_specials:
        s.overflow_code = f.max_code
        s.overflow_sign = -1
    elif f.inf_code >= 0:
        s.overflow_code = f.inf_code
        s.overflow_sign = -1
    else:
        # "[x] > FLT_MAX -> NaN" and "[x] < -FLT_MAX -> NaN": a NaN with the sign of x
        # (e4m3fn), as the official Cast vectors of opset 25 have it (docs/semantics.md).
        s.overflow_code = s.nan_code
        s.overflow_sign = s.nan_sign
    # +-Inf: as an overflow, but for the rows that say NaN where an overflow does not.
    s.inf_code = s.overflow_code
    s.inf_sign = s.overflow_sign
    if f.unsigned_zero and saturate and (rules & SF_RULE_FNUZ_INF_NAN):
        s.inf_code = f.nan_code
        s.inf_sign = 0
    elif not saturate and f.inf_code < 0 and not no_specials and not f.unsigned_zero:
        # e4m3fn saturate=0: "Inf -> NaN", "-Inf -> -NaN": the sign of a NaN result.
        s.inf_code = s.nan_code
        s.inf_sign = s.nan_sign
    return s


cdef inline bint valid_small_float_id(int fmt_id) noexcept nogil:
    # An ONNX format, or a family id whose fields the Python layer checked
    # (qemu_q/codecs.py); the kernels re-check only what keeps their arithmetic defined.
    cdef int e, m, bias
    if 0 <= fmt_id < SF_COUNT:
        return True
    if fmt_id & ~(SF_FAMILY | 0x7FFFF) or not fmt_id & SF_FAMILY:
        return False
    e = fmt_id & 0xF
    m = (fmt_id >> 4) & 0xF
    bias = (fmt_id >> 8) & 0xFF
    return 1 <= e <= 8 and m <= 14 and e + m <= 15 and bias <= 127 and ((1 << e) - 1 - bias) <= 128


cdef inline SmallFloatFormat family_format(int fmt_id) noexcept nogil:
    cdef SmallFloatFormat f
    cdef int e = fmt_id & 0xF
    cdef int m = (fmt_id >> 4) & 0xF
    cdef int convention = (fmt_id >> 16) & 3
    cdef bint inf = (fmt_id >> 18) & 1
    cdef int all_ones = (1 << (e + m)) - 1      # the largest magnitude
    cdef int top_exponent = ((1 << e) - 1) << m  # the all-ones exponent, zero mantissa
    cdef int field, fraction
    f.width = 1 + e + m
    f.mantissa_bits = m
    f.bias = (fmt_id >> 8) & 0xFF
    f.inf_code = -1
    f.unsigned_zero = False
    f.first_nan_magnitude = 1 << 30
    if convention == SF_FAMILY_IEEE:
        # The quiet NaN a binary format's conversions write: the top mantissa bit set.
        f.nan_code = top_exponent | (1 << (m - 1)) if m > 0 else top_exponent
        if inf:
            f.inf_code = top_exponent
        f.first_nan_magnitude = top_exponent + 1 if inf else top_exponent
        f.max_code = top_exponent - 1
    elif convention == SF_FAMILY_FN:
        f.nan_code = all_ones
        f.first_nan_magnitude = all_ones
        f.max_code = all_ones - 1
    elif convention == SF_FAMILY_FNUZ:
        f.nan_code = 1 << (f.width - 1)
        f.unsigned_zero = True
        # inf: the extreme codes, as IEEE P3109's binaryKpP formats have them
        if inf:
            f.inf_code = all_ones
        f.max_code = all_ones - 1 if inf else all_ones
    else:
        f.nan_code = -1
        f.max_code = all_ones
    f.min_exponent = 1 - f.bias
    field = f.max_code >> m
    fraction = f.max_code & ((1 << m) - 1)
    if field == 0:
        f.max_finite = fraction * pow2(f.min_exponent - m)
    else:
        f.max_finite = ((1 << m) | fraction) * pow2(field - f.bias - m)
    return f


cdef inline SmallFloatFormat small_float_format(int fmt_id) noexcept nogil:
    cdef SmallFloatFormat f
    if fmt_id & SF_FAMILY:
        return family_format(fmt_id)
    if fmt_id == SF_E4M3FN:
        f.width = 8; f.mantissa_bits = 3; f.bias = 7; f.max_finite = 448.0
        f.max_code = 0x7E; f.nan_code = 0x7F; f.inf_code = -1; f.unsigned_zero = False
    elif fmt_id == SF_E4M3FNUZ:
        f.width = 8; f.mantissa_bits = 3; f.bias = 8; f.max_finite = 240.0
        f.max_code = 0x7F; f.nan_code = 0x80; f.inf_code = -1; f.unsigned_zero = True
    elif fmt_id == SF_E5M2:
        f.width = 8; f.mantissa_bits = 2; f.bias = 15; f.max_finite = 57344.0
        # 0x7E: the quiet NaN of a binary format with two mantissa bits (float16's 0x7E00
        # cut to 8 bits), as IEEE conversions and the official Cast vectors give it.
        f.max_code = 0x7B; f.nan_code = 0x7E; f.inf_code = 0x7C; f.unsigned_zero = False
    elif fmt_id == SF_E5M2FNUZ:
        f.width = 8; f.mantissa_bits = 2; f.bias = 16; f.max_finite = 57344.0
        f.max_code = 0x7F; f.nan_code = 0x80; f.inf_code = -1; f.unsigned_zero = True
    elif fmt_id == SF_E2M1:
        f.width = 4; f.mantissa_bits = 1; f.bias = 1; f.max_finite = 6.0
        f.max_code = 0x7; f.nan_code = -1; f.inf_code = -1; f.unsigned_zero = False
    elif fmt_id == SF_E2M3:
        f.width = 6; f.mantissa_bits = 3; f.bias = 1; f.max_finite = 7.5
        f.max_code = 0x1F; f.nan_code = -1; f.inf_code = -1; f.unsigned_zero = False
    else:  # SF_E3M2
        f.width = 6; f.mantissa_bits = 2; f.bias = 3; f.max_finite = 28.0
        f.max_code = 0x1F; f.nan_code = -1; f.inf_code = -1; f.unsigned_zero = False
    f.min_exponent = 1 - f.bias
    f.first_nan_magnitude = 1 << 30
    if f.inf_code >= 0:
        f.first_nan_magnitude = f.inf_code + 1
    elif f.nan_code >= 0 and not f.unsigned_zero:
        f.first_nan_magnitude = f.nan_code
    return f


cdef inline uint32_t float_bits(float v) noexcept nogil:
    cdef uint32_t b
    memcpy(&b, &v, 4)
    return b


cdef inline float bits_float(uint32_t b) noexcept nogil:
    cdef float v
    memcpy(&v, &b, 4)
    return v


cdef inline uint64_t double_bits(double v) noexcept nogil:
    cdef uint64_t b
    memcpy(&b, &v, 8)
    return b


cdef inline double bits_double(uint64_t b) noexcept nogil:
    cdef double v
    memcpy(&v, &b, 8)
    return v


cdef inline double pow2(int e) noexcept nogil:
    # Exact 2**e for the normal double range, which covers every use here.
    return bits_double(<uint64_t>(e + 1023) << 52)


cdef inline float float16_to_float(uint16_t h) noexcept nogil:
    # Placing the exponent and mantissa in a float32 and multiplying by 2**112 rebias
    # normals and subnormals alike, exactly; only inf/NaN need the exponent forced.
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16
    cdef uint32_t magnitude = (<uint32_t>(h & 0x7FFF)) << 13
    cdef float v
    if magnitude >= 0x0F800000:
        return bits_float(sign | 0x7F800000 | magnitude)
    v = bits_float(magnitude) * 5.192296858534828e+33  # 2**112
    return bits_float(sign | float_bits(v))


cdef inline float bfloat16_to_float(uint16_t b) noexcept nogil:
    return bits_float((<uint32_t>b) << 16)


cdef inline double round_half_even(double t) noexcept nogil:
    # Round to an integer, ties to even, for |t| < 2**52: adding and removing 2**52 leaves
    # the rounding to the FPU's default mode. Larger |t| are integers already.
    cdef double a = fabs(t)
    cdef double r
    if a < 4503599627370496.0:
        r = (a + 4503599627370496.0) - 4503599627370496.0
        return copysign(r, t)
    return t


cdef inline double round_to_precision(double v, double err, int mantissa_bits, int min_exponent) noexcept nogil:
    # Round the exact value v + err (|err| <= half an ulp of v in double) to a binary format
    # with `mantissa_bits` fraction bits and smallest normal exponent `min_exponent`, ties to
    # even, with an unbounded exponent range above (overflow is the caller's rule, decided on
    # the rounded value). err breaks ties that v alone would see as exact.
    cdef uint64_t b = double_bits(v)
    cdef int exponent = <int>((b >> 52) & 0x7FF)
    cdef int ulp_exponent
    cdef double t, r, t_err
    if exponent == 0x7FF or v == 0.0:
        return v
    exponent = exponent - 1023 if exponent != 0 else -1022
    if exponent < min_exponent:
        exponent = min_exponent
    ulp_exponent = exponent - mantissa_bits
    t = v * pow2(-ulp_exponent)
    r = round_half_even(t)
    if err != 0.0 and fabs(t - r) == 0.5:
        t_err = err * pow2(-ulp_exponent)
        r = ceil(t) if t_err > 0.0 else floor(t)
    return r * pow2(ulp_exponent)


cdef inline float round_to_float16_value(double v, double err) noexcept nogil:
    # IEEE binary16 rounding of v + err, returned as the (exact) float32 value; overflow -> inf.
    cdef double r = round_to_precision(v, err, 10, -14)
    if fabs(r) > 65504.0:
        return <float>copysign(INFINITY, r)
    return <float>r


cdef inline float round_to_bfloat16_value(double v, double err) noexcept nogil:
    # Above the largest bfloat16 the rounded value is at least 2**128: float32 inf.
    return <float>round_to_precision(v, err, 7, -126)


cdef inline float round_to_float32_value(double v, double err) noexcept nogil:
    if err == 0.0:
        return <float>v
    return <float>round_to_precision(v, err, 23, -126)


cdef inline uint16_t float_to_float16_bits(float v) noexcept nogil:
    # v must already be a binary16 value (or inf/NaN): this only re-packs the bits.
    cdef uint32_t b = float_bits(v)
    cdef uint32_t sign = (b >> 16) & 0x8000
    cdef uint32_t magnitude = b & 0x7FFFFFFF
    cdef int exponent
    if magnitude >= 0x7F800000:
        if magnitude == 0x7F800000:
            return <uint16_t>(sign | 0x7C00)
        return <uint16_t>(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF))
    if magnitude < 0x38800000:  # below 2**-14: subnormal half
        return <uint16_t>(sign | <uint32_t>(fabs(<double>v) * 16777216.0))
    exponent = <int>(magnitude >> 23) - 127 + 15
    return <uint16_t>(sign | (<uint32_t>exponent << 10) | ((magnitude >> 13) & 0x3FF))


cdef inline uint16_t float_to_bfloat16_bits(float v) noexcept nogil:
    # v must already be a bfloat16 value (or inf/NaN); NaN stays quiet.
    cdef uint32_t b = float_bits(v)
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return <uint16_t>((b >> 16) | 0x0040)
    return <uint16_t>(b >> 16)


cdef inline float round_to_value_format(double v, double err, int value_format) noexcept nogil:
    # Round v + err once to float32/float16/bfloat16. err is zero where v is exact, or where
    # v is a double result that cannot sit on a midpoint of the target unless exact.
    if value_format == FMT_FLOAT16:
        return round_to_float16_value(v, err)
    if value_format == FMT_BFLOAT16:
        return round_to_bfloat16_value(v, err)
    return round_to_float32_value(v, err)


cdef inline float divide_to_value_format(double x, double s, int value_format) noexcept nogil:
    # The exact quotient x / s rounded once to float32/float16/bfloat16. The double quotient
    # q can land exactly on a midpoint of the target while the exact quotient does not (an
    # int32 scale has up to 31 significant bits); a midpoint has its low double bits clear,
    # and only then is the remainder x - q*s (exact, by FMA) needed to break the tie.
    cdef double q = x / s
    cdef double error = 0.0
    cdef int mantissa_bits = 23 if value_format == FMT_FLOAT32 else (10 if value_format == FMT_FLOAT16 else 7)
    cdef uint64_t low_bits = (<uint64_t>1 << (52 - mantissa_bits - 1)) - 1
    if (double_bits(q) & low_bits) == 0 and q != 0.0 and not isinf(q) and not isnan(q):
        error = fma(-q, s, x) / s
    return round_to_value_format(q, error, value_format)


cdef inline uint16_t pack_value_format(float v, int value_format) noexcept nogil:
    if value_format == FMT_FLOAT16:
        return float_to_float16_bits(v)
    return float_to_bfloat16_bits(v)


cdef enum:
    # float32 bits of 1.5 * 2**23, the rounding constant of round_biased.
    ROUND_MAGIC_BITS = 0x4B400000


cdef inline int encode_integer(float q, float zero_point, float lo, float hi, int mask) noexcept nogil:
    # q is the quotient already rounded to the division precision. Round half to even,
    # add the zero point, saturate; NaN gives lo.
    return saturate_biased(round_biased(q), <int32_t>zero_point, <int32_t>lo, <int32_t>hi) & mask


cdef inline int32_t round_biased(float q) noexcept nogil:
    # RNE(q) + ROUND_MAGIC_BITS for |q| < 2**22, and a value that orders like q beyond:
    # adding 1.5 * 2**23 puts q in [2**23, 2**24), where the float32 ulp is 1, so the FPU
    # rounds it to an integer (ties to even, the default mode) that sits in the low
    # mantissa bits; outside that binade the bits of a positive float still increase with
    # it, and a sum <= 0 reads as a negative int32. NaN gives INT32_MIN. Branch-free, and
    # integer-only after the add, so the loops vectorize without mask juggling.
    cdef float t = q + <float>12582912.0
    return select_i32(t == t, <int32_t>float_bits(t), <int32_t>(-2147483647 - 1))


cdef inline int32_t saturate_biased(int32_t biased, int32_t zero_point, int32_t lo, int32_t hi) noexcept nogil:
    # clamp(RNE(q) + zero_point, lo, hi) from biased = round_biased(q), for |lo|, |hi|,
    # |zero_point| < 2**17: the bounds are moved into the biased domain, where NaN
    # (INT32_MIN) lands on lo, +-inf and huge quotients on hi / lo.
    cdef int32_t biased_lo = <int32_t>ROUND_MAGIC_BITS + lo - zero_point
    cdef int32_t biased_hi = <int32_t>ROUND_MAGIC_BITS + hi - zero_point
    biased = biased if biased > biased_lo else biased_lo
    biased = biased if biased < biased_hi else biased_hi
    return biased - <int32_t>ROUND_MAGIC_BITS + zero_point


# The one small-float encoder: a float32 value into a small float with integer operations
# on its bits. The per-format constants are loop invariants, so one branch-free loop
# serves every format and vectorizes (uniform shifts, compares, selects). Every quotient
# the kernels encode is a float32 value (the division precision is float32, float16 or
# bfloat16), so no wider input is needed; tests/float_oracle.py checks it exhaustively.
cdef struct SmallFloat32Encoder:
    int32_t shift          # 23 - mantissa bits
    int32_t round_bias     # half an ulp of the target, minus one, in float32 mantissa units
    int32_t exponent_offset  # (127 - bias) << mantissa_bits
    int32_t min_normal_bits  # float32 bits of the smallest normal
    float subnormal_magic  # 2**(min_exponent - mantissa_bits + 23): its ulp is the smallest subnormal
    int32_t subnormal_magic_bits
    int32_t sign_shift     # width - 1: where the sign bit goes
    int32_t max_code
    int32_t zero_sign      # all ones when -0 exists, 0 for FNUZ
    SmallFloatSpecials special  # NaN, inf and overflow codes of the Cast table in force


cdef inline SmallFloat32Encoder small_float32_encoder(int fmt_id, bint saturate, int rules) noexcept nogil:
    cdef SmallFloatFormat f = small_float_format(fmt_id)
    cdef SmallFloat32Encoder e
    e.shift = 23 - f.mantissa_bits
    e.round_bias = (1 << (e.shift - 1)) - 1
    e.exponent_offset = (127 - f.bias) << f.mantissa_bits
    e.min_normal_bits = (f.min_exponent + 127) << 23
    e.subnormal_magic_bits = (f.min_exponent - f.mantissa_bits + 23 + 127) << 23
    e.subnormal_magic = bits_float(<uint32_t>e.subnormal_magic_bits)
    e.sign_shift = f.width - 1
    e.max_code = f.max_code
    e.zero_sign = 0 if f.unsigned_zero else -1
    e.special = small_float_specials(&f, saturate, rules)
    return e


cdef inline int32_t select_i32(bint condition, int32_t if_true, int32_t if_false) noexcept nogil:
    # A select written with masks: both operands are computed whatever the condition, so
    # the compiler cannot sink a floating-point operation into a branch (which, with
    # trapping math, it may not speculate back out, and the loop would not vectorize).
    cdef int32_t m = -(<int32_t>condition)
    return (if_true & m) | (if_false & ~m)


cdef inline int encode_small_float32(float q, const SmallFloat32Encoder* e) noexcept nogil:
    # Every operand is computed before the selects, which then pick between plain values:
    # the compiler turns them into blends instead of branches.
    cdef int32_t u = <int32_t>float_bits(q)
    cdef int32_t sign = <int32_t>((<uint32_t>u >> 31) << e.sign_shift)
    cdef int32_t a = u & 0x7FFFFFFF
    cdef int32_t max_code = e.max_code
    cdef int32_t zero = sign & e.zero_sign
    cdef int32_t overflow = e.special.overflow_code | (sign & e.special.overflow_sign)
    cdef int32_t inf = e.special.inf_code | (sign & e.special.inf_sign)
    cdef int32_t nan = e.special.nan_code ^ (sign & e.special.nan_sign)
    cdef int32_t magnitude = half_even_count(a, e.round_bias, e.shift, e.exponent_offset, e.min_normal_bits,
                                             e.subnormal_magic, e.subnormal_magic_bits)
    cdef int32_t code = sign | magnitude
    code = code if magnitude != 0 else zero
    code = code if magnitude <= max_code else overflow
    code = code if a != 0x7F800000 else inf
    code = code if a <= 0x7F800000 else nan
    return code


# Datapath(float8_encoder="onnxruntime"): the float -> float8 constructors of onnxruntime's
# include/onnxruntime/core/common/float8.h (Float8E4M3FN(float v, bool saturate) and its
# three siblings), which truncate the float32 mantissa, then round half to even only while
# the truncated code is below the largest finite one. On every float32 they give the ONNX
# rounding and the Cast-24 table's rows (the encoder `e` is built with SF_RULE_NAN_SIGN
# alone), except where that order of steps shows (docs/semantics.md, "Datapath options";
# tests/test_datapath_float8_encoder.py transcribes the constructors themselves):
# - e4m3fn, saturate=0: the truncated code of 480 <= |v| < 512 is the NaN code, which the
#   constructor lowers to 0x7E (448) before rounding; a value that does not round up,
#   |v| < 496, keeps 448 instead of the NaN of an overflow.
# - e5m2, saturate=0: a round-up from 0x7B (57344) ORs the infinity code 0x7C into 0x7B,
#   which gives 0x7F, a NaN, for 61440 <= |v| < 65536 (from 65536 up: infinity).
# - e5m2: a NaN input is the all-ones magnitude with the input's sign, 0x7F / 0xFF.
cdef inline int encode_float8_onnxruntime(float v, const SmallFloat32Encoder* e, int fmt_id,
                                          bint saturate) noexcept nogil:
    cdef uint32_t u = float_bits(v)
    cdef uint32_t a = u & 0x7FFFFFFF
    cdef int sign = <int>((u >> 31) << 7)
    if fmt_id == SF_E5M2:
        if a > 0x7F800000:
            return sign | 0x7F
        if not saturate and 0x47700000 <= a < 0x47800000:  # [61440, 65536)
            return sign | 0x7F
    elif fmt_id == SF_E4M3FN and not saturate and 0x43F00000 <= a < 0x43F80000:  # [480, 496)
        return sign | 0x7E
    return encode_small_float32(v, e)


cdef inline float select_f32(bint condition, float if_true, float if_false) noexcept nogil:
    # select_i32 on the bits: both operands computed, no branch, no speculation needed.
    return bits_float(<uint32_t>select_i32(condition, <int32_t>float_bits(if_true), <int32_t>float_bits(if_false)))


# Branch-free conversions between float32 and the 16-bit floats, for Cast's typed loops
# (pyx/_cast.pyx): the bits float_to_float16_bits(round_to_float16_value(v, 0)),
# float_to_bfloat16_bits(round_to_bfloat16_value(v, 0)) and float16_to_float /
# bfloat16_to_float give (ties to even, overflow to inf, a NaN quiet with its payload's
# leading bits: docs/semantics.md, "Cast"), with integer operations and one float add that
# the compiler vectorizes at every instruction-set level (no F16C needed).
cdef inline uint16_t float_to_float16_rne(float v) noexcept nogil:
    cdef uint32_t b = float_bits(v)
    cdef uint32_t sign = (b >> 16) & 0x8000
    cdef int32_t a = <int32_t>(b & 0x7FFFFFFF)
    # normals: round the mantissa on the bits (a carry bumps the exponent, and from
    # 65520 up reaches 0x7C00, inf); the rebias is 112 << 10
    cdef int32_t normal = <int32_t>((<uint32_t>a + 0xFFF + ((<uint32_t>a >> 13) & 1)) >> 13) - 0x1C000
    # below 2**-14: |v| + 0.5 lands in [0.5, 1), whose ulp is float16's smallest
    # subnormal 2**-24, so the FPU's ties-to-even counts subnormal steps
    cdef int32_t sub = <int32_t>float_bits(bits_float(<uint32_t>a) + <float>0.5) - 0x3F000000
    cdef int32_t code = select_i32(a < 0x38800000, sub, normal)
    code = select_i32(code < 0x7C00, code, 0x7C00)
    code = select_i32(a > 0x7F800000, 0x7E00 | ((a >> 13) & 0x3FF), code)
    return <uint16_t>(<uint32_t>code | sign)


cdef inline uint16_t float_to_bfloat16_rne(float v) noexcept nogil:
    # bfloat16 keeps float32's exponent: rounding the bits serves subnormals and the carry
    # into inf alike; the sign bit is never reached by a finite value's carry
    cdef uint32_t b = float_bits(v)
    cdef uint32_t rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    cdef uint32_t nan = (b >> 16) | 0x0040
    return <uint16_t>select_i32((b & 0x7FFFFFFF) > 0x7F800000, <int32_t>nan, <int32_t>rounded)


cdef inline float float16_to_float_select(uint16_t h) noexcept nogil:
    # float16_to_float without its branch (a NaN also quiet, as a float -> double -> float
    # round trip of the general path leaves it)
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16
    cdef uint32_t magnitude = (<uint32_t>(h & 0x7FFF)) << 13
    cdef int32_t finite = <int32_t>float_bits(bits_float(magnitude) * <float>5.192296858534828e+33)  # 2**112
    cdef int32_t special = <int32_t>(0x7F800000 | magnitude) | select_i32(magnitude > 0x0F800000, 0x00400000, 0)
    return bits_float(sign | <uint32_t>select_i32(magnitude >= 0x0F800000, special, finite))


cdef inline float bfloat16_to_float_quiet(uint16_t b) noexcept nogil:
    # bfloat16_to_float with a NaN made quiet, as the general path's float -> double
    # conversion leaves it
    cdef uint32_t bits = (<uint32_t>b) << 16
    return bits_float(bits | <uint32_t>select_i32((bits & 0x7FFFFFFF) > 0x7F800000, 0x00400000, 0))


# Cast's float32 datapath loops into the ONNX small floats (pyx/_cast_loops.pxi): the
# loop invariants of QuantizeLinear's small-float datapath body (DatapathF32 of
# pyx/_quantize.pyx) that a Cast reads, its value being x itself.
cdef struct CastSmallFloatDatapath:
    float x_min_normal        # subnormals flush_inputs: below it x is flushed (0: kept)
    int32_t shift             # 23 - mantissa bits
    int32_t fraction_mask     # (1 << shift) - 1: the float32 bits below the target's ulp
    int32_t min_normal_bits   # float32 bits of the target's smallest normal
    int32_t min_normal_code   # its code, 1 << mantissa bits
    int32_t flush_outputs     # 1: a result below the smallest normal becomes zero


# The one small-float decoder: a code into its float32 value (exact: every small-float
# value is a float32) with integer operations, for the vectorized DequantizeLinear loops
# and for the 256-entry table of the general ones. NaN codes keep their sign bit.
cdef struct SmallFloat32Decoder:
    int32_t code_mask         # the code's width
    int32_t sign_shift        # width - 1
    int32_t magnitude_mask
    int32_t shift             # 23 - mantissa bits: where the magnitude goes in a float32
    int32_t exponent_rebias   # (127 - bias) << 23
    int32_t min_normal_magnitude  # 1 << mantissa bits: below it, subnormal
    float subnormal_step      # 2**(min_exponent - mantissa_bits)
    int32_t inf_magnitude     # -1 where there is no inf code
    int32_t nan_magnitude     # magnitudes from here up are NaN (a large value where none)
    int32_t nan_code          # a whole code that is NaN (FNUZ 0x80), else -1


cdef inline SmallFloat32Decoder small_float32_decoder(int fmt_id) noexcept nogil:
    cdef SmallFloatFormat f = small_float_format(fmt_id)
    cdef SmallFloat32Decoder d
    d.code_mask = (1 << f.width) - 1
    d.sign_shift = f.width - 1
    d.magnitude_mask = (1 << (f.width - 1)) - 1
    d.shift = 23 - f.mantissa_bits
    d.exponent_rebias = (127 - f.bias) << 23
    d.min_normal_magnitude = 1 << f.mantissa_bits
    d.subnormal_step = <float>pow2(f.min_exponent - f.mantissa_bits)
    d.inf_magnitude = f.inf_code
    d.nan_magnitude = f.first_nan_magnitude
    d.nan_code = f.nan_code if f.unsigned_zero else -1
    return d


cdef inline float decode_small_float32(uint32_t stored, const SmallFloat32Decoder* d) noexcept nogil:
    cdef int32_t code = <int32_t>stored & d.code_mask
    cdef uint32_t sign = (<uint32_t>code >> d.sign_shift) << 31
    cdef int32_t magnitude = code & d.magnitude_mask
    # unsigned: a family format's inf/NaN magnitudes may pass bit 31 here (discarded below)
    cdef int32_t normal = <int32_t>((<uint32_t>magnitude << d.shift) + <uint32_t>d.exponent_rebias)
    cdef int32_t subnormal = <int32_t>float_bits(<float>magnitude * d.subnormal_step)
    cdef int32_t bits = select_i32(magnitude < d.min_normal_magnitude, subnormal, normal)
    bits = select_i32(magnitude == d.inf_magnitude, 0x7F800000, bits)
    bits = select_i32(magnitude >= d.nan_magnitude, 0x7FC00000, bits)
    bits = bits | <int32_t>sign
    bits = select_i32(code == d.nan_code, <int32_t>0xFFC00000, bits)
    return bits_float(<uint32_t>bits)


# float8e8m0 (Cast-24+ and the scales of QuantizeLinear/DequantizeLinear-24+): the value
# 2**(code - 127), 0xFF is NaN; no zero, no sign.
cdef enum E8M0RoundMode:
    E8M0_UP = 0       # toward the next power of two (Cast's default "up")
    E8M0_DOWN = 1     # toward zero
    E8M0_NEAREST = 2  # to the nearer power of two, the midpoint 1.5 * 2**k going up


cdef inline int encode_e8m0(float v, int round_mode, bint saturate) noexcept nogil:
    # Cast's float8e8m0 table applied to x itself ("x > E8M0_MAX", "x < E8M0_MIN"), for
    # every round_mode: out-of-range inputs saturate to the nearer end or give NaN, and
    # every value at or below zero counts as below E8M0_MIN (docs/semantics.md, "Cast").
    # Inside [2**-127, 2**127] both neighbouring powers of two are codes, so rounding
    # cannot leave the range. Branch-free (selects), so that the float32 loop vectorizes.
    cdef int32_t u = <int32_t>float_bits(v)
    cdef int32_t magnitude = u & 0x7FFFFFFF
    cdef bint normal = magnitude >= 0x00800000
    # [2**-127, 2**-126) is a float32 subnormal whose leading bit is bit 22
    cdef int32_t exponent = select_i32(normal, (magnitude >> 23) - 127, -127)
    cdef int32_t mantissa = select_i32(normal, magnitude & 0x7FFFFF, (magnitude << 1) & 0x7FFFFF)
    cdef int32_t step = select_i32(round_mode == E8M0_UP, mantissa != 0,
                                   select_i32(round_mode == E8M0_NEAREST, mantissa >= 0x400000, 0))
    cdef int32_t code = exponent + step + 127
    code = select_i32(u > 0x7F000000, 0xFE if saturate else 0xFF, code)  # above 2**127, +inf
    code = select_i32(u < 0x00400000, 0x00 if saturate else 0xFF, code)  # negatives (u < 0), [0, 2**-127)
    return select_i32(magnitude > 0x7F800000, 0xFF, code)  # NaN, either sign


cdef inline float decode_e8m0(uint32_t code) noexcept nogil:
    code &= 0xFF
    if code == 0xFF:
        return bits_float(0x7FC00000)
    # code 0 is 2**-127, a float32 subnormal; the others are normal exponents.
    return bits_float(code << 23 if code != 0 else 0x00400000)


# Round-to-odd intermediates: a value rounded to odd at p bits and then rounded (any
# IEEE-style rule) to at most p - 2 bits gives the same result as rounding the exact value
# once (Boldo and Melquiond, "When double rounding is odd", 2005). Cast uses them so that
# float64 and 64-bit integers reach every narrow format with a single rounding, through
# the float32 encoders (float16 has 11 significant bits, bfloat16 8, the small floats
# at most 4: all <= 24 - 2).
cdef inline float double_to_float_odd(double v) noexcept nogil:
    # v truncated toward zero to float32, with the last bit set when that was inexact.
    # Beyond FLT_MAX this gives FLT_MAX (odd), which every narrower format still sees as
    # an overflow; inf and NaN pass through with their sign.
    cdef float f = <float>v
    cdef uint32_t b
    if f != f or <double>f == v:
        return f
    b = float_bits(f)
    if fabs(<double>f) > fabs(v):
        b -= 1  # one step toward zero: the magnitude is the low 31 bits
    return bits_float(b | 1)


cdef inline double uint64_to_double_odd(uint64_t m) noexcept nogil:
    # m rounded to odd at 53 bits (exact below 2**53).
    cdef int shift = 0
    cdef uint64_t kept
    if m <= (<uint64_t>1 << 53):
        return <double>m
    while (m >> shift) >= (<uint64_t>1 << 53):
        shift += 1
    kept = m >> shift
    if m & ((<uint64_t>1 << shift) - 1):
        kept |= 1
    return <double>kept * pow2(shift)


cdef inline double int64_to_double_odd(int64_t v) noexcept nogil:
    cdef uint64_t magnitude
    if v >= 0:
        return uint64_to_double_odd(<uint64_t>v)
    magnitude = (~<uint64_t>v) + 1  # |v|, INT64_MIN included
    return -uint64_to_double_odd(magnitude)


# qemu_q.Datapath (qemu_q/datapath.py): the rounding of a quotient to an integer or to a
# small float's mantissa, by mode. The codes are the index in datapath.ROUNDINGS; they are
# C constants so that the C helpers (rounded_count below, _mx_codecs.pxd) switch on them.
cdef extern from *:
    """
    enum qemu_q_datapath_rounding {
        QEMU_Q_DP_HALF_EVEN = 0, QEMU_Q_DP_HALF_AWAY = 1, QEMU_Q_DP_HALF_UP = 2,
        QEMU_Q_DP_HALF_DOWN = 3, QEMU_Q_DP_TOWARD_ZERO = 4, QEMU_Q_DP_DOWN = 5, QEMU_Q_DP_UP = 6,
        QEMU_Q_DP_TO_ODD = 7, QEMU_Q_DP_STOCHASTIC = 8
    };
    """
    enum:
        DP_HALF_EVEN "QEMU_Q_DP_HALF_EVEN"
        DP_HALF_AWAY "QEMU_Q_DP_HALF_AWAY"
        DP_HALF_UP "QEMU_Q_DP_HALF_UP"
        DP_HALF_DOWN "QEMU_Q_DP_HALF_DOWN"
        DP_TOWARD_ZERO "QEMU_Q_DP_TOWARD_ZERO"
        DP_DOWN "QEMU_Q_DP_DOWN"
        DP_UP "QEMU_Q_DP_UP"
        DP_TO_ODD "QEMU_Q_DP_TO_ODD"
        DP_STOCHASTIC "QEMU_Q_DP_STOCHASTIC"


# What a NaN quotient rounds to for integer outputs (datapath.NANS_TO_INTEGER).
cdef enum DatapathNanToInteger:
    DP_NAN_MIN = 0
    DP_NAN_ZERO = 1
    DP_NAN_MAX = 2


cdef inline double round_magnitude(double t, bint negative, int mode, uint32_t random_word) noexcept nogil:
    # t = |value| / ulp, finite, 0 <= t < 2**53; the integer the magnitude rounds to, where
    # `negative` is the value's sign (the directed and half_up/half_down modes depend on it).
    # frac = t - floor(t) is exact, and so is frac * 2**32: its truncation is the first 32
    # bits of the fraction that stochastic rounding adds the random word to.
    cdef double whole = floor(t)
    cdef double frac = t - whole
    cdef bint up
    if frac == 0.0:
        return whole
    if mode == DP_HALF_EVEN:
        up = frac > 0.5 or (frac == 0.5 and fmod(whole, 2.0) != 0.0)
    elif mode == DP_HALF_AWAY:
        up = frac >= 0.5
    elif mode == DP_HALF_UP:
        up = frac > 0.5 or (frac == 0.5 and not negative)
    elif mode == DP_HALF_DOWN:
        up = frac > 0.5 or (frac == 0.5 and negative)
    elif mode == DP_TOWARD_ZERO:
        up = False
    elif mode == DP_DOWN:
        up = negative
    elif mode == DP_UP:
        up = not negative
    elif mode == DP_TO_ODD:
        up = fmod(whole, 2.0) == 0.0
    else:
        up = (<uint64_t>(frac * 4294967296.0) + <uint64_t>random_word) >= (<uint64_t>1 << 32)
    return whole + 1.0 if up else whole


cdef inline double round_to_small_float_value(double q, int mantissa_bits, int min_exponent, int mode,
                                              uint32_t random_word, bint flush) noexcept nogil:
    # round_to_minifloat_value for the ONNX small floats, whose values are all below 2**20.
    return round_to_minifloat_value(q, mantissa_bits, min_exponent, 20, mode, random_word, flush)


cdef inline double round_to_minifloat_value(double q, int mantissa_bits, int min_exponent,
                                            int clamp_exponent, int mode, uint32_t random_word,
                                            bint flush) noexcept nogil:
    # q (finite) rounded by `mode` to a binary format of `mantissa_bits` fraction bits whose
    # smallest normal is 2**min_exponent, with an unbounded exponent above (the caller's
    # encoder applies the overflow rows to anything beyond max). Beyond 2**clamp_exponent,
    # which must lie above the format's largest value, every mode gives an overflow, so q
    # is clamped there first: the scaling below stays in double's normal range.
    # `flush`: a nonzero result below the smallest normal becomes a zero of q's sign
    # (tininess after rounding).
    cdef double a = fabs(q)
    cdef int exponent
    cdef int ulp_exponent
    cdef double r
    if a == 0.0:
        return q
    if a > pow2(clamp_exponent):
        a = pow2(clamp_exponent)
    frexp(a, &exponent)
    exponent -= 1  # a in [2**exponent, 2**(exponent + 1))
    if exponent < min_exponent:
        exponent = min_exponent
    ulp_exponent = exponent - mantissa_bits
    r = round_magnitude(a * pow2(-ulp_exponent), q < 0.0, mode, random_word) * pow2(ulp_exponent)
    if flush and r < pow2(min_exponent):
        r = 0.0
    return copysign(r, q)


# qemu_q.Datapath on DequantizeLinear and Cast (docs/semantics.md, "Datapath options"): an
# exact value m * 2**k rounded by a DatapathRounding mode with integer arithmetic only, so
# that no FPU rounding mode is involved and no intermediate is rounded.
cdef extern from *:
    """
    static inline int qemu_q_clz64(unsigned long long v) { return __builtin_clzll(v); }
    static inline int qemu_q_ctz64(unsigned long long v) { return __builtin_ctzll(v); }
    """
    int clz64 "qemu_q_clz64" (unsigned long long v) noexcept nogil
    int ctz64 "qemu_q_ctz64" (unsigned long long v) noexcept nogil


cdef inline void exact_parts(double a, uint64_t* m, int* k) noexcept nogil:
    # |a| = m * 2**k with m odd (a finite, nonzero): a double's significand is an integer
    # of at most 53 bits, so the product of two such parts with few significant bits (codes
    # of at most 34 bits, scales of at most 24) fits in 64.
    cdef int e
    cdef double f = frexp(fabs(a), &e)
    cdef uint64_t mantissa = <uint64_t>(f * 9007199254740992.0)  # * 2**53: exact
    cdef int zeros = ctz64(mantissa)
    m[0] = mantissa >> zeros
    k[0] = e - 53 + zeros


cdef inline bint datapath_rounds_up(int mode, bint above, bint tie, bint odd, bint negative,
                                    bint carry) noexcept nogil:
    # The rounding table of docs/semantics.md for an inexact magnitude: above / tie say
    # where the dropped part lies against half a unit, odd is the kept part's parity, carry
    # the stochastic word's carry out.
    if mode == DP_HALF_EVEN:
        return above or (tie and odd)
    if mode == DP_HALF_AWAY:
        return above or tie
    if mode == DP_HALF_UP:
        return above or (tie and not negative)
    if mode == DP_HALF_DOWN:
        return above or (tie and negative)
    if mode == DP_TOWARD_ZERO:
        return False
    if mode == DP_DOWN:
        return negative
    if mode == DP_UP:
        return not negative
    if mode == DP_TO_ODD:
        return not odd
    return carry


cdef inline uint64_t round_exact_units(uint64_t m, int shift, bint negative, int mode,
                                       uint32_t random_word) noexcept nogil:
    # m / 2**shift (shift >= 1) rounded to an integer by `mode`, from the exact bits: the
    # kept part, the dropped part against half, and the dropped part's first 32 bits for the
    # stochastic carry (those past the 32nd are lost, as the definition says).
    cdef uint64_t whole, rest, fraction32
    cdef bint above, tie
    if shift >= 64:
        whole = 0
        rest = m
        above = shift == 64 and rest > (<uint64_t>1 << 63)
        tie = shift == 64 and rest == (<uint64_t>1 << 63)
    else:
        whole = m >> shift
        rest = m & ((<uint64_t>1 << shift) - 1)
        above = rest > (<uint64_t>1 << (shift - 1))
        tie = rest == (<uint64_t>1 << (shift - 1))
    if rest == 0:
        return whole
    if shift <= 32:
        fraction32 = rest << (32 - shift)
    elif shift - 32 < 64:
        fraction32 = rest >> (shift - 32)
    else:
        fraction32 = 0
    if datapath_rounds_up(mode, above, tie, (whole & 1) != 0, negative,
                          fraction32 + <uint64_t>random_word >= (<uint64_t>1 << 32)):
        return whole + 1
    return whole


cdef inline double round_exact_to_format(uint64_t m, int k, bint negative, int mantissa_bits,
                                         int min_exponent, int mode, uint32_t random_word) noexcept nogil:
    # The magnitude m * 2**k (m > 0) rounded by `mode` to a binary format of `mantissa_bits`
    # fraction bits whose smallest normal is 2**min_exponent, with an unbounded exponent
    # above (the caller decides overflow on the result, which may be inf in double).
    # `negative` is the value's sign. Exact: the result has at most mantissa_bits + 1 <= 53
    # significant bits.
    cdef int exponent = 63 - clz64(m) + k
    cdef int ulp_exponent, shift
    if exponent < min_exponent:
        exponent = min_exponent
    ulp_exponent = exponent - mantissa_bits
    shift = ulp_exponent - k
    if shift <= 0:
        return ldexp(<double>m, k)
    return ldexp(<double>round_exact_units(m, shift, negative, mode, random_word), ulp_exponent)


# The datapath roundings on float32 operands, branch-free, for the vectorized datapath
# loops of _quantize.pyx (run_datapath_f32). They give round_magnitude's bits on every
# magnitude those loops hand them: a float32 t = |value| / ulp with t < 2**24, split into
# whole = floor(t) (a truncation) and frac = t - whole, which is exact (Sterbenz for
# t >= 1, frac = t below).
# The stochastic carry and rounding are C with always_inline: as `cdef inline` functions
# GCC called them out of line from the largest loop dispatchers (their inlining budget
# spent), which left those loops scalar (int8 stochastic per axis at 10x the default).
#
# stochastic_carry_f32: the carry out of 32 bits when random_word is added to W =
# floor(frac * 2**32), the first 32 bits of the fraction (0 <= frac < 1), as
# round_magnitude adds them. f = frac * 2**32 is exact; from 2**31 up it is an integer and
# f - 2**31 is exact, below it the truncation to int32 is the floor: one conversion,
# always in range, gives W or W - 2**31, and the bit 31 put back gives W - 2**31 as a
# signed int32 either way. W + word >= 2**32 <=> W - 2**31 > 2**31 - 1 - word, a signed
# compare on both sides (AVX2 and SSE2 have no unsigned conversion or compare). Where the
# level has both (AVX-512F: vcvttps2udq, vpcmpud), W = (uint32_t)f, the same floor (f is
# exact and below 2**32), and W + word >= 2**32 <=> W > ~word: 5 vector operations for the
# carry instead of 10, the same bit.
# datapath_round_f32_stochastic: on the magnitude, as round_magnitude defines it: the
# carry adds one unit away from 0; q's sign put back on the bits, then one truncation.
#
# half_even_count: a float32 magnitude (bits `absolute`) rounded to nearest even onto a
# small float (the encoder's fields): the code, exponent included. Normals on the bits: the
# float32 mantissa rounded to the target's width, a carry out of it bumping the exponent;
# subnormals: |x| + magic lands in a binade whose ulp is the smallest subnormal, so the
# FPU's rounding (ties to even: the kernels' MXCSR, _fpenv.pxd) counts the subnormal steps,
# 2**m of them being the smallest normal, whose code is 2**m too. The default encoder
# (encode_small_float32) and the half_even datapath loops (QuantizeLinear's and
# mx_quantize's, which the flush options run) share it.
#
# rounded_count: a float32 magnitude (bits `absolute`, of a value whose sign is `negative`,
# 0 or 1) rounded by `mode` (a DP_ constant: the callers' loops are one per mode, so the
# switch folds) onto a float format of `mantissa_bits` whose smallest normal is float32's
# exponent `min_normal_exponent`: the format's code for it, exponent included (subnormal
# counts below 2**mantissa_bits, the normals above), from integer operations alone, the
# rounding table of docs/semantics.md on the dropped bits. |x| = mantissa * 2**(exponent -
# 150) (exponent at least 1: float32's subnormals have no implicit bit), and the format's
# ulp at |x| is float32's times 2**dropped: dropped = 23 - mantissa_bits at and above the
# smallest normal, one more for each binade below it. The kept part is mantissa >> dropped
# (0 from 24 dropped bits on), `fraction` the first 32 dropped bits: mantissa << (32 -
# dropped), wrapped, up to 25 dropped bits, then (mantissa << 7) >> (dropped - 25)
# (mantissa << 7 < 2**31: a count clamped to 31 gives 0 where every bit lies past the 32).
# A mode rounds up where the fraction plus its increment carries out of 32 bits: the
# stochastic word (docs/semantics.md, stochastic rounding), just below or at half for the
# ties (exact: up to 25 dropped bits the fraction holds them all, and beyond them the value
# lies below a quarter of the ulp); the directed modes and to_odd need only whether any
# dropped bit is set. A carry out of the mantissa moves into the next binade by itself;
# the caller clamps what lies beyond the format's largest (inf and NaN bits give counts
# beyond every format's largest, for the caller's selects). Every shift count is in [0,
# 31] and every select a max or min: GCC vectorizes it with AVX2's per-lane shifts (the x86
# baseline level, SSE2, has none: there it takes the float route). QuantizeLinear's,
# Cast's and mx_quantize's small-float datapath loops call it for every mode but the
# default half_even (half_even_count: fewer operations; Cast's output-flush loops test
# only the top subnormal interval). It replaced the float route (|x|
# scaled to subnormal ulps and the fraction compared, or split at 2**31 for the stochastic
# carry's signed conversion: up to 8 float operations a vector, which Zen 3 issues on two
# of its four vector pipes) where a loop serves a format's subnormal and normal lanes
# together. One grid without subnormals (MXINT8) rounds as QuantizeLinear's integer codes
# do (datapath_round_f32_<mode>), its stochastic mode on the float carry: fewer operations
# there (docs/performance.md, "Every rounding mode on integers").
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include <math.h>
    #if defined(__GNUC__) || defined(__clang__)
    #define QEMU_Q_ALWAYS_INLINE static inline __attribute__((always_inline))
    #elif defined(_MSC_VER)
    #define QEMU_Q_ALWAYS_INLINE static __forceinline
    #else
    #define QEMU_Q_ALWAYS_INLINE static inline
    #endif
    QEMU_Q_ALWAYS_INLINE float qemu_q_bits_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
    QEMU_Q_ALWAYS_INLINE uint32_t qemu_q_f32_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
    QEMU_Q_ALWAYS_INLINE int qemu_q_stochastic_carry_f32(float frac, uint32_t random_word) {
    #if defined(__AVX512F__)
        return (uint32_t)(frac * 4294967296.0f) > ~random_word;
    #else
        float f = frac * 4294967296.0f;
        int32_t big = -(int32_t)(f >= 2147483648.0f);
        float low = f - qemu_q_bits_f32((uint32_t)big & 0x4F000000u);
        int32_t below = (int32_t)low | (int32_t)(~(uint32_t)big & 0x80000000u);
        return below > (int32_t)(0x7FFFFFFFu - random_word);
    #endif
    }
    /* 1 where round_magnitude adds one to `whole` (odd: whole & 1), from the float
       fraction t - whole of a magnitude t (exact); negative 0 or 1. */
    QEMU_Q_ALWAYS_INLINE int32_t qemu_q_round_up_f32(int32_t odd, float frac, int32_t negative,
                                                     uint32_t random_word, int mode) {
        switch (mode) {
        case QEMU_Q_DP_HALF_EVEN: return (frac > 0.5f) | ((frac == 0.5f) & odd);
        case QEMU_Q_DP_HALF_AWAY: return frac >= 0.5f;
        case QEMU_Q_DP_HALF_UP: return (frac > 0.5f) | ((frac == 0.5f) & (1 - negative));
        case QEMU_Q_DP_HALF_DOWN: return (frac > 0.5f) | ((frac == 0.5f) & negative);
        case QEMU_Q_DP_TOWARD_ZERO: return 0;
        case QEMU_Q_DP_DOWN: return (frac != 0.0f) & negative;
        case QEMU_Q_DP_UP: return (frac != 0.0f) & (1 - negative);
        case QEMU_Q_DP_TO_ODD: return (frac != 0.0f) & (1 - odd);
        default: return qemu_q_stochastic_carry_f32(frac, random_word);
        }
    }
    QEMU_Q_ALWAYS_INLINE int32_t qemu_q_half_even_count(int32_t absolute, int32_t round_bias, int32_t shift,
                                                        int32_t exponent_offset, int32_t min_normal_bits,
                                                        float subnormal_magic, int32_t subnormal_magic_bits) {
        uint32_t rounded = (uint32_t)absolute + (uint32_t)round_bias + (((uint32_t)absolute >> shift) & 1u);
        int32_t normal = (int32_t)(rounded >> shift) - exponent_offset;
        int32_t subnormal = (int32_t)qemu_q_f32_bits(qemu_q_bits_f32((uint32_t)absolute) + subnormal_magic)
                            - subnormal_magic_bits;
        int32_t below = -(int32_t)(absolute < min_normal_bits);
        return (subnormal & below) | (normal & ~below);
    }
    QEMU_Q_ALWAYS_INLINE int32_t qemu_q_rounded_count(int32_t absolute, int32_t negative, uint32_t random_word,
                                                      int32_t min_normal_exponent, int32_t mantissa_bits,
                                                      int mode) {
        int32_t shift = 23 - mantissa_bits;
    #if (defined(__x86_64__) || defined(_M_X64)) && !defined(__AVX2__)
        /* SSE2 has no per-lane shifts (the integer route ran scalar, about 4x slower): the
           float route. Normals: the mode's increment added to the dropped bits (one shift
           count for every lane); subnormals: |x| scaled to subnormal ulps (2**(254 + m - e)
           as float32 bits; |x| clamped to 2**20, beyond every format's largest, so that the
           count converts) and the fraction compared. */
        int32_t clamped = absolute < 0x49800000 ? absolute : 0x49800000;
        int32_t below = -(int32_t)(clamped < (min_normal_exponent << 23));
        uint32_t dropped_mask = (1u << shift) - 1u;
        uint32_t half = 1u << (shift - 1);
        uint32_t inexact = ((uint32_t)clamped & dropped_mask) != 0;
        uint32_t odd = ((uint32_t)clamped >> shift) & 1u;
        float t = qemu_q_bits_f32((uint32_t)(clamped & below))
                  * qemu_q_bits_f32((uint32_t)(254 + mantissa_bits - min_normal_exponent) << 23);
        int32_t whole = (int32_t)t;
        float frac = t - (float)whole;
        int32_t up = qemu_q_round_up_f32(whole & 1, frac, negative, random_word, mode);
        uint32_t increment;
        switch (mode) {
        case QEMU_Q_DP_HALF_EVEN: increment = half - 1u + odd; break;
        case QEMU_Q_DP_HALF_AWAY: increment = half; break;
        case QEMU_Q_DP_HALF_UP: increment = half - (uint32_t)negative; break;
        case QEMU_Q_DP_HALF_DOWN: increment = half - 1u + (uint32_t)negative; break;
        case QEMU_Q_DP_TOWARD_ZERO: increment = 0; break;
        case QEMU_Q_DP_DOWN: increment = dropped_mask & (0u - (uint32_t)negative); break;
        case QEMU_Q_DP_UP: increment = dropped_mask & ((uint32_t)negative - 1u); break;
        /* not an increment: an inexact kept part is made odd */
        case QEMU_Q_DP_TO_ODD: increment = (uint32_t)(inexact & (odd ^ 1u)) << shift; break;
        default: increment = random_word >> (32 - shift); break;
        }
        int32_t normal = (int32_t)(((uint32_t)clamped + increment) >> shift)
                         - ((min_normal_exponent - 1) << mantissa_bits);
        return ((whole + up) & below) | (normal & ~below);
    #else
        int32_t exponent = absolute >> 23;
        exponent = exponent > 1 ? exponent : 1;
        uint32_t mantissa = (uint32_t)absolute - ((uint32_t)(exponent - 1) << 23);
        int32_t dropped = min_normal_exponent + shift - exponent;
        dropped = dropped > shift ? dropped : shift;
        int32_t window = dropped < 25 ? dropped : 25;
        int32_t beyond = dropped - window;
        beyond = beyond < 31 ? beyond : 31;
        uint32_t window_bits = mantissa << (32 - window);
        uint32_t fraction = window_bits >> beyond;
        uint32_t kept = mantissa >> (dropped < 31 ? dropped : 31);
        int32_t binade = exponent - min_normal_exponent;
        binade = binade > 0 ? binade : 0;
        int32_t count = (binade << mantissa_bits) + (int32_t)kept;
        /* inexact: window_bits holds every dropped bit (all of the mantissa from 25 dropped
           bits on); a fraction shifted further lies below a quarter of the ulp, where no
           half mode rounds up */
        int32_t inexact = window_bits != 0;
        uint32_t increment;
        switch (mode) {
        case QEMU_Q_DP_HALF_EVEN: increment = 0x7FFFFFFFu + (kept & 1u); break;
        case QEMU_Q_DP_HALF_AWAY: increment = 0x80000000u; break;
        case QEMU_Q_DP_HALF_UP: increment = 0x80000000u - (uint32_t)negative; break;
        case QEMU_Q_DP_HALF_DOWN: increment = 0x7FFFFFFFu + (uint32_t)negative; break;
        case QEMU_Q_DP_TOWARD_ZERO: return count;
        case QEMU_Q_DP_DOWN: return count + (inexact & negative);
        case QEMU_Q_DP_UP: return count + (inexact & (1 - negative));
        case QEMU_Q_DP_TO_ODD: return count | inexact;
        default: increment = random_word; break;
        }
        return count + (int32_t)(fraction + increment < fraction);
    #endif
    }
    QEMU_Q_ALWAYS_INLINE int32_t qemu_q_round_f32_stochastic(float q, uint32_t random_word) {
        float a = fabsf(q);
        float whole = (float)(int32_t)a;
        float one = qemu_q_bits_f32(0x3F800000u
                                    & (uint32_t)-(int32_t)qemu_q_stochastic_carry_f32(a - whole, random_word));
        return (int32_t)qemu_q_bits_f32((qemu_q_f32_bits(q) & 0x80000000u) | qemu_q_f32_bits(whole + one));
    }
    """
    int32_t datapath_round_up "qemu_q_round_up_f32" (int32_t odd, float frac, int32_t negative,
                                                     uint32_t random_word, int mode) noexcept nogil
    int32_t datapath_round_f32_stochastic "qemu_q_round_f32_stochastic" (float q, uint32_t random_word) noexcept nogil
    int32_t half_even_count "qemu_q_half_even_count" (int32_t absolute, int32_t round_bias, int32_t shift,
                                                      int32_t exponent_offset, int32_t min_normal_bits,
                                                      float subnormal_magic, int32_t subnormal_magic_bits) noexcept nogil
    int32_t rounded_count "qemu_q_rounded_count" (int32_t absolute, int32_t negative, uint32_t random_word,
                                                  int32_t min_normal_exponent, int32_t mantissa_bits,
                                                  int mode) noexcept nogil


cdef inline float flush_subnormal_f32(float v, float min_normal) noexcept nogil:
    # v with |v| < min_normal replaced by a zero of its sign (min_normal 0: v unchanged;
    # NaN compares false and stays): one compare, then the magnitude bits cleared with an
    # and-not (a select of two bit patterns cost two more operations per vector).
    cdef int32_t flushed = -(<int32_t>(fabsf(v) < min_normal))
    return bits_float(float_bits(v) & ~(<uint32_t>flushed & <uint32_t>0x7FFFFFFF))


cdef inline float flush_subnormal_unsigned_f32(float v, float min_normal) noexcept nogil:
    # flush_subnormal_f32 for the integer outputs, where +0 and -0 give the same code in
    # every mode: the flushed value is +0, one operation fewer.
    cdef int32_t kept = -(<int32_t>(not (fabsf(v) < min_normal)))
    return bits_float(float_bits(v) & <uint32_t>kept)


# The datapath roundings of a float32 quotient straight to a signed integer, for the integer
# loops of _datapath_loops.pxi: q is finite with |q| < 2**22 (the loops clamp it first, to
# the codes' range less the zero point, |q| <= 2**17), and the result is round_magnitude(|q|)
# with q's sign, the integer datapath_one adds the zero point to. Each works in float32
# and ends in ONE integer (the bits of s = q + 1.5 * 2**23, or one truncation): GCC
# narrows the integer tail of these loops to the code's width, and it narrowed every
# integer operand separately (a pack sequence each), so a correction added in int32
# cost more than the float operation that adds it before the conversion.
# s = q + 1.5 * 2**23 lies in [2**23, 2**24), where the ulp is 1: the FPU rounds it to
# nearest even (qemu_q's MXCSR, _fpenv.pxd), its bits are that integer plus
# ROUND_MAGIC_BITS, s - 1.5 * 2**23 = RNE(q) exactly, r = q - RNE(q) in [-1/2, 1/2] is
# exact (Sterbenz, or r = q where RNE(q) = 0) and +-1 added to s is exact. (floorf /
# ceilf / truncf would be one vroundps each, but GCC vectorizes none of them under
# -ftrapping-math.) tests/test_datapath_fast.py checks each against the oracle, and the
# identities were checked beforehand on every float32 of [1/8, 4) and [2**15, 2**17) and
# 2**16 values of every other binade below 2**17, both signs.
cdef inline float one_if(bint condition) noexcept nogil:
    # 1.0 or 0.0: the compare's mask and-ed with 1.0's bits, no select
    return bits_float(<uint32_t>0x3F800000 & <uint32_t>(-(<int32_t>condition)))


cdef inline float copysign_f32(float magnitude, float sign_of) noexcept nogil:
    # magnitude (>= 0, or +0) with sign_of's sign bit: two bit operations
    return bits_float((float_bits(sign_of) & <uint32_t>0x80000000) | float_bits(magnitude))


cdef inline int32_t datapath_round_f32_half_even(float q, uint32_t random_word) noexcept nogil:
    return <int32_t>float_bits(q + <float>12582912.0) - <int32_t>ROUND_MAGIC_BITS


cdef inline int32_t datapath_round_f32_half_away(float q, uint32_t random_word) noexcept nogil:
    # trunc(q + copysign(1/2 - 2**-25, q)): the sum rounds up to the next integer exactly
    # at the ties and above them (the float below 1/2, not 1/2, so that 1/2 - 2**-25
    # itself, whose sum with 1/2 would round to 1, stays at 0)
    return <int32_t>(q + copysign_f32(bits_float(<uint32_t>0x3EFFFFFF), q))


cdef inline int32_t datapath_round_f32_half_up(float q, uint32_t random_word) noexcept nogil:
    # RNE(q), and one up where q was a tie that RNE rounded down (r = +1/2)
    cdef float s = q + <float>12582912.0
    cdef float r = q - (s - <float>12582912.0)
    return <int32_t>float_bits(s + one_if(r == <float>0.5)) - <int32_t>ROUND_MAGIC_BITS


cdef inline int32_t datapath_round_f32_half_down(float q, uint32_t random_word) noexcept nogil:
    cdef float s = q + <float>12582912.0
    cdef float r = q - (s - <float>12582912.0)
    return <int32_t>float_bits(s - one_if(r == <float>-0.5)) - <int32_t>ROUND_MAGIC_BITS


cdef inline int32_t datapath_round_f32_toward_zero(float q, uint32_t random_word) noexcept nogil:
    return <int32_t>q


cdef inline int32_t datapath_round_f32_down(float q, uint32_t random_word) noexcept nogil:
    # RNE(q), one down where it lies above q
    cdef float s = q + <float>12582912.0
    return <int32_t>float_bits(s - one_if((s - <float>12582912.0) > q)) - <int32_t>ROUND_MAGIC_BITS


cdef inline int32_t datapath_round_f32_up(float q, uint32_t random_word) noexcept nogil:
    cdef float s = q + <float>12582912.0
    return <int32_t>float_bits(s + one_if((s - <float>12582912.0) < q)) - <int32_t>ROUND_MAGIC_BITS


cdef inline int32_t datapath_round_f32_to_odd(float q, uint32_t random_word) noexcept nogil:
    # RNE(q), and one toward q where that is even and q is not an integer (the odd one of
    # q's two neighbours): s's last bit is RNE(q)'s parity (1.5 * 2**23 is even), the step
    # is +-1 with r's sign or a zero (s + -0 is s), and s +- 1 stays below 2**24. (No
    # conversion: trunc(|q|) | inexact took three, with the sign put back.)
    cdef float s = q + <float>12582912.0
    cdef float r = q - (s - <float>12582912.0)
    cdef uint32_t step = ((<uint32_t>0x3F800000 & <uint32_t>(-(<int32_t>(r != <float>0.0)))
                           & ((float_bits(s) & 1) - 1)) | (float_bits(r) & <uint32_t>0x80000000))
    return <int32_t>float_bits(s + bits_float(step)) - <int32_t>ROUND_MAGIC_BITS



# Double helpers of the staged datapath loops (_quantize.pyx, run_datapath_wide),
# branch-free so that those loops vectorize (AVX2 has 64-bit add, and, compare).
cdef inline int64_t select_i64(bint condition, int64_t if_true, int64_t if_false) noexcept nogil:
    cdef int64_t m = -(<int64_t>condition)
    return (if_true & m) | (if_false & ~m)


cdef inline double flush_subnormal_f64(double v, double min_normal) noexcept nogil:
    # v with |v| < min_normal replaced by a zero of its sign (min_normal 0: v unchanged;
    # NaN compares false and stays). The double form of flush_subnormal_f32.
    cdef int64_t b = <int64_t>double_bits(v)
    return bits_double(<uint64_t>select_i64(fabs(v) < min_normal,
                                            b & <int64_t>(<uint64_t>1 << 63), b))


cdef inline float double_to_float_odd_staged(double q) noexcept nogil:
    # q rounded to odd at float32's 24 bits (Boldo and Melquiond, as double_to_float_odd):
    # the 29 double bits below float32's last place are cleared, which truncates the
    # magnitude, and the last kept bit is set when any of them was set. A finite |q| is
    # first clamped into [2**-100, 2**100]: every quantizer output rounds a value there as
    # it rounds the values beyond (an integer or small-float code saturates or overflows
    # above 2**20; below 2**-40 a nonzero value is less than a quarter of every ulp, so each
    # mode rounds it by its sign alone), and inside it the result is a float32 normal, so
    # the final conversion is exact. inf and the (quiet) NaNs of the arithmetic pass.
    cdef int64_t b = <int64_t>double_bits(q)
    cdef int64_t sign = b & <int64_t>(<uint64_t>1 << 63)
    cdef int64_t a = b & <int64_t>0x7FFFFFFFFFFFFFFF
    cdef int64_t low
    a = select_i64((a > <int64_t>0x4630000000000000) & (a < <int64_t>0x7FF0000000000000),
                   <int64_t>0x4630000000000000, a)   # 2**100
    a = select_i64((a < <int64_t>0x39B0000000000000) & (a != 0), <int64_t>0x39B0000000000000, a)  # 2**-100
    low = a & <int64_t>0x1FFFFFFF
    a = (a - low) | select_i64(low != 0, <int64_t>0x20000000, 0)
    return <float>bits_double(<uint64_t>(sign | a))


# Double helpers of DequantizeLinear's datapath loops (_dequantize_datapath_loops.pxi),
# branch-free so that those loops vectorize.
cdef inline double select_f64(bint condition, double if_true, double if_false) noexcept nogil:
    return bits_double(<uint64_t>select_i64(condition, <int64_t>double_bits(if_true),
                                            <int64_t>double_bits(if_false)))


cdef inline int32_t stochastic_carry_f64(double frac, uint32_t random_word) noexcept nogil:
    # stochastic_carry_f32 on a double fraction (0 <= frac < 1, exact): W = floor(frac *
    # 2**32), the first 32 bits of the fraction, plus the word carries out of 32 bits. f is
    # exact; from 2**31 up f - 2**31 is exact (Sterbenz) and below it f itself is taken:
    # either way the truncation to int32 is in range and is the floor, and bit 31 put back
    # gives W - 2**31 as a signed int32, compared as stochastic_carry_f32 does.
    cdef double f = frac * 4294967296.0
    cdef bint big = f >= 2147483648.0
    cdef double low = f - select_f64(big, 2147483648.0, 0.0)
    cdef int32_t below = <int32_t>low | select_i32(big, 0, <int32_t>(<uint32_t>0x80000000))
    return below > <int32_t>(<uint32_t>0x7FFFFFFF - random_word)


cdef inline uint16_t float16_bits_of_value(float v) noexcept nogil:
    # float_to_float16_bits (the same bits: v a binary16 value, inf or NaN) without
    # branches. The subnormal product is formed on a magnitude selected below 2**-14 only,
    # so that its conversion is always in range.
    cdef uint32_t b = float_bits(v)
    cdef uint32_t sign = (b >> 16) & 0x8000
    cdef uint32_t magnitude = b & 0x7FFFFFFF
    cdef bint subnormal = magnitude < 0x38800000
    cdef float small = select_f32(subnormal, fabsf(v), <float>0.0)
    cdef int32_t h = select_i32(subnormal, <int32_t>(small * <float>16777216.0),
                                <int32_t>((magnitude >> 13) - (112 << 10)))
    h = select_i32(magnitude >= 0x7F800000,
                   select_i32(magnitude == 0x7F800000, 0x7C00, <int32_t>(0x7E00 | ((magnitude >> 13) & 0x3FF))),
                   h)
    return <uint16_t>(sign | <uint32_t>h)


cdef inline uint16_t bfloat16_bits_of_value(float v) noexcept nogil:
    # float_to_bfloat16_bits without a branch: a NaN stays quiet
    cdef uint32_t b = float_bits(v)
    return <uint16_t>select_i32((b & 0x7FFFFFFF) > 0x7F800000, <int32_t>((b >> 16) | 0x0040),
                                <int32_t>(b >> 16))


# The float64 quotient of float32 operands without a double (_quantize.pyx,
# run_datapath_wide; docs/semantics.md, "Staged quotients"): q = x / s in float32, the
# remainder r = x - q * s, and from them the exact quotient rounded to odd at 24 bits,
# which is what double_to_float_odd_staged makes of the double quotient. The callers keep
# to the lanes where r is exact (float32_remainder_unsafe): there fmaf's one rounding and
# the double form's (the product exact in 48 bits, the difference a float32) both return
# it. fmaf where the level has FMA (GCC inlines and vectorizes it; -ffp-contract=off
# forbids nothing written out), the double form elsewhere (fmaf would be a libm call).
cdef extern from *:
    """
    QEMU_Q_ALWAYS_INLINE float qemu_q_division_remainder_f32(float x, float q, float s) {
    #if defined(__FMA__)
        return fmaf(-q, s, x);
    #else
        return (float)((double)x - (double)q * (double)s);
    #endif
    }
    """
    float division_remainder_f32 "qemu_q_division_remainder_f32" (float x, float q, float s) noexcept nogil


# A product whose NaN is decided by its operands' order: a NaN `a` wins over a NaN `b`
# (its sign and payload kept), as x86's multiply returns its first source operand's NaN
# and the division x / s returns x's. A commutative multiply alone leaves the choice to
# the compiler, which swaps the operands where it likes (vectorized loops did where
# scalar code did not): the sign of x * (1 / s)'s NaN for a NaN x and a NaN scale, which
# the small floats' NaN codes carry, then hung on the element's position and the
# instruction-set level (docs/semantics.md, "Datapath options", step 2). The select is
# on the bits, with an integer NaN test (both sides below 2**31 or 2**63: a signed
# compare, which SSE2 has): as a float select (a != a ? a : product, or on an integer
# condition) GCC kept a branch and the loops went scalar, 7x slower. a's NaN is not
# quieted: every caller's next step reads only its sign, or quiets it.
cdef extern from *:
    """
    #define QEMU_Q_PRODUCT_NAN_FIRST(name, type, bits_type, signed_type, magnitude_mask, inf_bits) \
        QEMU_Q_ALWAYS_INLINE type name(type a, type b) { \
            type product = a * b; \
            bits_type a_bits, product_bits, nan, bits; \
            type result; \
            memcpy(&a_bits, &a, sizeof(type)); \
            memcpy(&product_bits, &product, sizeof(type)); \
            nan = (bits_type)0 - (bits_type)((signed_type)(a_bits & (magnitude_mask)) > (signed_type)(inf_bits)); \
            bits = (product_bits & ~nan) | (a_bits & nan); \
            memcpy(&result, &bits, sizeof(type)); \
            return result; \
        }
    QEMU_Q_PRODUCT_NAN_FIRST(qemu_q_product_nan_first_f32, float, uint32_t, int32_t, 0x7FFFFFFFu, 0x7F800000)
    QEMU_Q_PRODUCT_NAN_FIRST(qemu_q_product_nan_first_f64, double, uint64_t, int64_t, 0x7FFFFFFFFFFFFFFFull,
                             0x7FF0000000000000ll)
    """
    float product_nan_first_f32 "qemu_q_product_nan_first_f32" (float a, float b) noexcept nogil
    double product_nan_first_f64 "qemu_q_product_nan_first_f64" (double a, double b) noexcept nogil


# The error of a float32 product, for DequantizeLinear's one-pass float32 datapath loops
# (_dequantize_datapath_loops.pxi.tp; docs/semantics.md, "DequantizeLinear under a
# datapath"): f = RN32(d * s) and e = d * s - f, the product's error-free transformation
# (e exact whenever it is a float32, which holds for the lanes those loops keep: f finite
# and d an integer below 2**17, or |f| >= 2**-100). fmaf where the level has FMA, else the
# double form: d * s is exact in double (at most 17 + 24 bits), and so is its difference
# with f (a multiple of its last bit, below f's ulp), so one rounding to float32 gives e.
cdef extern from *:
    """
    QEMU_Q_ALWAYS_INLINE float qemu_q_product_residual_f32(float d, float s, float f) {
    #if defined(__FMA__)
        return fmaf(d, s, -f);
    #else
        return (float)((double)d * (double)s - (double)f);
    #endif
    }
    """
    float product_residual_f32 "qemu_q_product_residual_f32" (float d, float s, float f) noexcept nogil


# The same error with the other sign, r = f - d * s, for the half_up / half_down loops'
# tie test (docs/semantics.md, "The one-pass float32 loops"): exact where e is (its
# negation), and +0, not -0, where f is exact (an exact zero sum is +0 under round to
# nearest), so that f - 2r is f's own bits there, -0 included.
cdef extern from *:
    """
    QEMU_Q_ALWAYS_INLINE float qemu_q_product_overshoot_f32(float d, float s, float f) {
    #if defined(__FMA__)
        return fmaf(-d, s, f);
    #else
        return (float)((double)f - (double)d * (double)s);
    #endif
    }
    """
    float product_overshoot_f32 "qemu_q_product_overshoot_f32" (float d, float s, float f) noexcept nogil


cdef inline float quotient_rounded_to_odd(float x, float q, float r) noexcept nogil:
    # q = RN32(x / s) and r = x - q * s (exact): the exact quotient x / s rounded to odd at
    # 24 bits, i.e. its truncation to 24 bits with the last bit set when inexact. r = 0:
    # x / s is q. Otherwise x / s is not a 24-bit number (else it would be q), and its
    # truncation is q when |q| < |x / s|, i.e. when r has x's sign (q has the sign of
    # x / s), else q one step down in magnitude: its bits less one.
    # Masks and selects, not ands of compares: GCC narrowed those to booleans and left
    # the loops scalar.
    cdef int32_t inexact = -(<int32_t>(r != <float>0.0))
    cdef int32_t truncated = <int32_t>float_bits(q) + (
        ((<int32_t>float_bits(r) ^ <int32_t>float_bits(x)) >> 31) & inexact)
    return bits_float(<uint32_t>(truncated | <int32_t>(<uint32_t>inexact >> 31)))


cdef inline uint32_t exact_even_quotient(float x, float q, float r) noexcept nogil:
    # 1 where x / s is exactly q (r = 0), q is even and x is not zero: where the double
    # product of an inexact reciprocal, x * RN64(1 / s), may lie on either side of x / s
    # and so round to odd otherwise. min(., |x|'s bits) is the "x not zero".
    cdef uint32_t candidate = ~(<uint32_t>(-(<int32_t>(r != <float>0.0))) | float_bits(q)) & 1
    cdef uint32_t ax = float_bits(x) & 0x7FFFFFFF
    return candidate if candidate < ax else ax
