# OCP Microscaling (MX v1.0) scalar codecs: the shared scale of a block from its amax, as
# integer operations on the float32 bit pattern of the amax (never a floating-point log2,
# which is wrong one or two ulps below a power of two), and the power of two that divides
# the block's elements. docs/semantics.md ("MX") states every rule these implement.

from libc.stdint cimport int32_t, uint32_t

from _codecs cimport float_bits, bits_float, select_i32, SmallFloat32Encoder

cdef extern from *:
    """
    #include <stdint.h>
    /* Index of the highest set bit of a nonzero 32-bit word. */
    static inline int qemu_q_top_bit(uint32_t v) {
    #if defined(__GNUC__) || defined(__clang__)
        return 31 - __builtin_clz(v);
    #else
        int n = 0;
        while (v >>= 1) n++;
        return n;
    #endif
    }
    """
    int top_bit "qemu_q_top_bit" (uint32_t v) noexcept nogil


cdef enum MXScaleRule:
    MX_FLOOR = 0      # OCP v1.0 section 6.3: floor(log2(amax)) - emax_elem
    MX_CEIL = 1       # ceil(log2(amax)) - emax_elem
    MX_EVEN = 2       # floor(log2(amax rounded to the element's fraction bits)) - emax_elem
    MX_RCEIL = 3      # ceil(log2(amax / element max)), exact quotient
    MX_RCEIL_F32 = 4  # ceil(log2(float32(amax * float32(1 / element max)))) (NVIDIA)


cdef enum:
    MX_SCALE_NAN = 0xFF      # the e8m0 NaN: a block holding a NaN or an infinity
    MX_EXPONENT_MIN = -127   # e8m0's range of exponents (codes 0 to 254)
    MX_EXPONENT_MAX = 127


# What a scale rule needs of the element format.
cdef struct MXElement:
    int emax                # OCP's emax_elem: the exponent of the largest normal
    int fraction_bits       # the element's fraction bits ("even"; MXINT8: 6)
    uint32_t max_fraction   # the 23-bit fraction of the element's largest magnitude
    float max_reciprocal    # float32(1 / largest magnitude), NVIDIA's constant


cdef inline int32_t log2_floor_bits(uint32_t magnitude, uint32_t* fraction) noexcept nogil:
    # floor(log2(v)) of a finite nonzero float32 magnitude, and v's fraction normalized to
    # 23 bits (v = (1 + fraction / 2**23) * 2**result): subnormals included.
    cdef int top
    if magnitude >= 0x00800000:
        fraction[0] = magnitude & 0x7FFFFF
        return <int32_t>(magnitude >> 23) - 127
    top = top_bit(magnitude)
    fraction[0] = (magnitude << (23 - top)) & 0x7FFFFF
    return top - 149


cdef inline int mx_scale_code(uint32_t amax, int rule, const MXElement* element) noexcept nogil:
    # The e8m0 code of a block's shared scale from the float32 bits of its amax (sign
    # cleared; NaN magnitudes sort above inf). NaN or inf -> NaN; zero -> 2**-127; an
    # exponent outside [-127, 127] is clamped into it.
    cdef uint32_t fraction = 0
    cdef uint32_t q
    cdef int32_t e
    if amax >= 0x7F800000:
        return MX_SCALE_NAN
    if amax == 0:
        return 0
    if rule == MX_RCEIL_F32:
        # cvt.rp.satfinite.ue8m0 of the float32 product: 0 -> 2**-127, round up.
        q = float_bits(bits_float(amax) * element.max_reciprocal)
        if q == 0:
            return 0
        e = log2_floor_bits(q, &fraction)
        e += fraction != 0
    else:
        e = log2_floor_bits(amax, &fraction)
        if rule == MX_CEIL:
            e += fraction != 0
        elif rule == MX_EVEN:
            # Rounding the fraction to nearest at fraction_bits carries into the exponent
            # exactly when it is at least 2**23 - 2**(22 - fraction_bits): that tie has an
            # odd last kept bit, so ties-to-even and ties-away agree on the carry.
            e += <int32_t>((fraction + (<uint32_t>1 << (22 - element.fraction_bits))) >> 23)
        elif rule == MX_RCEIL:
            # amax / max = (a / m) * 2**(e - emax) with a, m in [1, 2): one binade up
            # exactly when a > m.
            e += fraction > element.max_fraction
        e -= element.emax
    if e < MX_EXPONENT_MIN:
        e = MX_EXPONENT_MIN
    if e > MX_EXPONENT_MAX:
        e = MX_EXPONENT_MAX
    return e + 127


cdef inline float mx_inverse_scale(int code) noexcept nogil:
    # 2**(127 - code) = 1 / X, exactly, for codes 0..254 (code 254: 2**-127, a float32
    # subnormal). Multiplying by it is the exact division by X wherever the quotient is a
    # float32 normal; a quotient below 2**-126 rounds to zero in every element format.
    if code >= 254:
        return bits_float(0x00400000)
    return bits_float(<uint32_t>(254 - code) << 23)


cdef inline int encode_mx_small_float(float q, const SmallFloat32Encoder* e) noexcept nogil:
    # encode_small_float32 for a finite q = x / X of an MX block (NaN and inf blocks never
    # reach it), into a format with a signed zero: round to nearest even on the bits (the
    # subnormals through the FPU's rounding of |q| + magic), then clamp the magnitude to
    # the largest code (OCP: normals saturate). Fewer selects than the Cast encoder, so the
    # short per-block loops spend less on constants.
    cdef int32_t u = <int32_t>float_bits(q)
    cdef int32_t sign = <int32_t>((<uint32_t>u >> 31) << e.sign_shift)
    cdef int32_t a = u & 0x7FFFFFFF
    cdef uint32_t rounded = <uint32_t>a + <uint32_t>e.round_bias + ((<uint32_t>a >> e.shift) & 1)
    cdef int32_t normal = <int32_t>(rounded >> e.shift) - e.exponent_offset
    cdef int32_t sub = <int32_t>float_bits(bits_float(<uint32_t>a) + e.subnormal_magic) - e.subnormal_magic_bits
    cdef int32_t magnitude = select_i32(a < e.min_normal_bits, sub, normal)
    cdef int32_t max_code = e.max_code
    magnitude = magnitude if magnitude < max_code else max_code
    return sign | magnitude


# qemu_q.Datapath's element rounding for the block-scaled quantizers (MX, NVFP4), on the
# bits of an exact double: docs/semantics.md's rounding table with integer arithmetic, so
# that a mode costs a few integer operations instead of the general path's frexp and fmod.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* mode: a QEMU_Q_DP_ rounding code (_codecs.pxd) */
    /* Whether whole + rem / 2^s (0 < s < 64, rem < 2^s) rounds up by `mode`; neg is the
       value's sign; word the stochastic word, added to the first 32 bits of the fraction
       (rem / 2^s truncated to 32 bits): a carry out of bit 32 rounds up. */
    static inline int qq_round_up(uint64_t whole, uint64_t rem, int s, int neg, int mode,
                                  uint32_t word) {
        uint64_t half, top;
        if (rem == 0) return 0;
        half = (uint64_t)1 << (s - 1);
        switch (mode) {
        case QEMU_Q_DP_HALF_EVEN: return rem > half || (rem == half && (whole & 1));
        case QEMU_Q_DP_HALF_AWAY: return rem >= half;
        case QEMU_Q_DP_HALF_UP: return rem > half || (rem == half && !neg);
        case QEMU_Q_DP_HALF_DOWN: return rem > half || (rem == half && neg);
        case QEMU_Q_DP_TOWARD_ZERO: return 0;
        case QEMU_Q_DP_DOWN: return neg;
        case QEMU_Q_DP_UP: return !neg;
        case QEMU_Q_DP_TO_ODD: return !(whole & 1);
        default:
            top = s >= 32 ? rem >> (s - 32) : rem << (32 - s);
            return ((top + (uint64_t)word) >> 32) != 0;
        }
    }

    /* The code magnitude of q (a finite or infinite double, not NaN) rounded by `mode` to a
       binary format of m mantissa bits whose smallest normal is 2^emin, with an unbounded
       exponent, then clamped to max_code (codes are monotone in magnitude). `flush`: a
       nonzero subnormal result (code below 2^m) becomes 0. */
    /* mant / 2^s (s >= 1) split into whole and the dropped bits rem, over s bits; from
       s = 64 on (below 2^-11 of an ulp) the fraction's first 32 bits at s = 63 and a
       sticky bit (no tie is possible there). Returns the s rem is over. */
    static inline int qq_split(uint64_t mant, int s, uint64_t* whole, uint64_t* rem) {
        if (s >= 64) {
            *whole = 0;
            *rem = s - 63 >= 64 ? 1 : (mant >> (s - 63)) | ((mant & ((((uint64_t)1) << (s - 63)) - 1)) != 0);
            return 63;
        }
        *whole = mant >> s;
        *rem = mant & ((((uint64_t)1) << s) - 1);
        return s;
    }

    static inline int32_t qq_round_to_code(double q, int mode, uint32_t word, int m, int emin,
                                           int32_t max_code, int flush) {
        uint64_t b, mant, whole, rem;
        int exp, u, s, neg;
        int64_t code;
        memcpy(&b, &q, 8);
        neg = (int)(b >> 63);
        b &= 0x7FFFFFFFFFFFFFFFull;
        if (b == 0) return 0;
        exp = (int)(b >> 52) - 1023;
        if (exp > 30) return max_code;  /* beyond every element's range, inf included */
        /* q is a normal double (the callers' quotients are): value = mant * 2^(exp - 52) */
        mant = (b & 0xFFFFFFFFFFFFFull) | ((uint64_t)1 << 52);
        u = (exp > emin ? exp : emin) - m;  /* the exponent of the result's ulp */
        s = u - (exp - 52);                 /* >= 52 - m > 0 */
        s = qq_split(mant, s, &whole, &rem);
        whole += qq_round_up(whole, rem, s, neg, mode, word);
        code = (int64_t)whole + ((int64_t)(u - (emin - m)) << m);
        if (flush && code < ((int64_t)1 << m)) code = 0;
        return code > max_code ? max_code : (int32_t)code;
    }

    /* MXINT8: |q| * 2^6 rounded to an integer by `mode`, clamped to 127, with q's sign. */
    static inline int32_t qq_round_to_int8(double q, int mode, uint32_t word) {
        uint64_t b, mant, whole, rem;
        int exp, s, neg;
        memcpy(&b, &q, 8);
        neg = (int)(b >> 63);
        b &= 0x7FFFFFFFFFFFFFFFull;
        if (b == 0) return 0;
        exp = (int)(b >> 52) - 1023;
        if (exp > 1) return neg ? -127 : 127;  /* |q| >= 4: |q| * 64 >= 256 */
        mant = (b & 0xFFFFFFFFFFFFFull) | ((uint64_t)1 << 52);
        s = 46 - exp;  /* value * 2^6 = mant * 2^(exp + 6 - 52) */
        s = qq_split(mant, s, &whole, &rem);
        whole += qq_round_up(whole, rem, s, neg, mode, word);
        if (whole > 127) whole = 127;
        return neg ? -(int32_t)whole : (int32_t)whole;
    }
    """
    int32_t round_to_code "qq_round_to_code" (double q, int mode, uint32_t word, int m, int emin,
                                               int32_t max_code, bint flush) noexcept nogil
    int32_t round_to_int8 "qq_round_to_int8" (double q, int mode, uint32_t word) noexcept nogil
