# Cast kernels: every numeric ONNX type into every other, element by element, with the
# rules of docs/semantics.md ("Cast"). The Python layer (qemu_q/ops/cast.py) resolves the
# version, validates and hands over contiguous arrays as raw bytes (one element per byte
# for the sub-byte types, as ml_dtypes stores them) and one CastConfig.
#
# The general path decodes each element to a double (exact for every type but the 64-bit
# integers, which are rounded to odd) or to a 64-bit integer, then encodes it; the hot
# cases have their own loops over the same codecs, decided once per plan (CastConfig's
# path): float32 into a small float or float8e8m0, float32 into float16 / bfloat16 / 8- and
# 16-bit integers, float16 / bfloat16 into float32, and a Datapath into a small float, a
# float16 or a bfloat16 from float32 (float16 / bfloat16 widened first, float64 rounded to
# odd into float32 but under stochastic rounding), one loop per rounding mode
# (_cast_loops.pxi).

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.math cimport trunc, isnan, isinf, fabs, copysign, ldexp, INFINITY
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t

from _tasks cimport run_tasks
from _codecs cimport (
    CAST_FLOAT64, CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16, CAST_SMALL_FLOAT, CAST_E8M0,
    CAST_SIGNED, CAST_UNSIGNED, CAST_BOOL, CAST_PATH_GENERAL, CAST_PATH_F32_SMALL_FLOAT,
    CAST_PATH_F32_E8M0, CAST_PATH_SMALL_FLOAT_DATAPATH, CAST_PATH_F32_F16, CAST_PATH_F32_BF16,
    CAST_PATH_F32_INTEGER, CAST_PATH_F16_F32, CAST_PATH_BF16_F32, CAST_PATH_HALF_DATAPATH, SF_COUNT, SF_RULE_NAN_SIGN, SF_RULE_FNUZ_INF_NAN,
    SF_RULE_NAN_NEGATIVE_ZERO, SF_RULE_NAN_OPPOSITE_ZERO, E8M0_UP, E8M0_NEAREST,
    SmallFloat32Encoder, small_float32_encoder, encode_small_float32, encode_float8_onnxruntime,
    SF_E4M3FN, SF_E4M3FNUZ, SF_E5M2, SF_E5M2FNUZ,
    SmallFloat32Decoder, small_float32_decoder, decode_small_float32,
    encode_e8m0, decode_e8m0, double_to_float_odd, uint64_to_double_odd, int64_to_double_odd,
    float_bits, bits_float, double_bits, bits_double, float16_to_float, bfloat16_to_float,
    round_half_even, round_to_float16_value, round_to_bfloat16_value, float_to_float16_bits,
    float_to_bfloat16_bits, SmallFloatFormat, small_float_format, exact_parts,
    round_exact_to_format, round_exact_units, DP_HALF_EVEN, DP_STOCHASTIC,
    float_to_float16_rne, float_to_bfloat16_rne, float16_to_float_select, bfloat16_to_float_quiet,
    CastSmallFloatDatapath,
)
from _memory cimport check_aligned, random_words, prefetch_run, PREFETCH_RUN, PREFETCH_RUN_SMALL

cdef enum:
    # Elements per task: large enough that scheduling is noise, small enough to balance.
    CAST_CHUNK = 32768
    # float16 / bfloat16 inputs of the small-float datapath loops are widened to float32
    # this many at a time, into a buffer that stays in L1
    WIDEN_CHUNK = 1024

include "_cast_loops.pxi"


cdef struct CastPlan:
    int path
    int source_kind
    int source_bytes
    int source_bits
    int target_kind
    int target_bytes
    int target_bits
    uint64_t target_mask
    int round_mode
    bint saturate
    # integer targets of 8 bits and more: the saturation bounds of a truncated float
    int64_t int_lo
    uint64_t int_hi
    double float_lo     # the type's minimum, exactly
    double float_above  # its maximum + 1, a power of two
    SmallFloat32Decoder decoder
    SmallFloat32Encoder encoder
    # qemu_q.Datapath, when it changes a step of Cast: the datapath loop reads these.
    bint datapath
    int rounding              # DatapathRounding of every rounding to nearest but e8m0's
    bint flush_inputs
    bint flush_outputs
    bint canonical_nan
    double source_min_normal  # 0: the source has no subnormals
    int target_mantissa_bits  # float targets: the format the value is rounded to
    int target_min_exponent
    double target_max
    uint64_t nan_bits         # the canonical NaN of an IEEE target
    # float8_encoder="onnxruntime" into a float8 target (target_format): the input as
    # onnxruntime reads it into a float, then encode_float8_onnxruntime.
    bint onnxruntime_float8
    int target_format
    int source_format
    # CAST_PATH_SMALL_FLOAT_DATAPATH's and CAST_PATH_HALF_DATAPATH's loop invariants
    CastSmallFloatDatapath small_float_datapath
    # CAST_PATH_HALF_DATAPATH: the NaN code is (its quiet code, sign and payload) & nan_keep
    int32_t nan_keep


cdef struct CastWork:
    const uint8_t* x
    uint8_t* y
    Py_ssize_t n
    CastPlan plan
    const uint32_t* random_bits  # one word per element (stochastic rounding), else NULL


cdef inline uint64_t load(const uint8_t* base, Py_ssize_t i, int nbytes) noexcept nogil:
    if nbytes == 1:
        return base[i]
    if nbytes == 2:
        return (<const uint16_t*>base)[i]
    if nbytes == 4:
        return (<const uint32_t*>base)[i]
    return (<const uint64_t*>base)[i]


cdef inline void store(uint8_t* base, Py_ssize_t i, int nbytes, uint64_t v) noexcept nogil:
    if nbytes == 1:
        base[i] = <uint8_t>v
    elif nbytes == 2:
        (<uint16_t*>base)[i] = <uint16_t>v
    elif nbytes == 4:
        (<uint32_t*>base)[i] = <uint32_t>v
    else:
        (<uint64_t*>base)[i] = v


cdef inline uint64_t float_to_integer(double v, const CastPlan* p) noexcept nogil:
    cdef double r
    if p.target_bits < 8:
        # int4/uint4/int2/uint2: round half to even, then keep the low bits (the ONNX
        # int4/int2 notes: "rounding to the nearest-even integer and truncating"). NaN and
        # +-inf have no low bits: 0. A double of 2**63 or more is a multiple of 2**11.
        if isnan(v) or isinf(v):
            return 0
        r = round_half_even(v)
        if fabs(r) >= 9223372036854775808.0:
            return 0
        return (<uint64_t><int64_t>r) & p.target_mask
    # 8 bits and more: truncate toward zero, saturate, NaN -> 0 (spec: "undefined if OOR").
    if v != v:
        return 0
    r = trunc(v)
    if r >= p.float_above:
        return p.int_hi & p.target_mask
    if r < p.float_lo:
        return (<uint64_t>p.int_lo) & p.target_mask
    if r >= 9223372036854775808.0:  # uint64 above INT64_MAX
        return <uint64_t>r
    return (<uint64_t><int64_t>r) & p.target_mask


cdef inline uint64_t encode_value(double v, const CastPlan* p) noexcept nogil:
    # v is the exact input value, or (64-bit integer inputs) the input rounded to odd.
    cdef int k = p.target_kind
    if k == CAST_FLOAT32:
        return float_bits(<float>v)
    if k == CAST_FLOAT16:
        return float_to_float16_bits(round_to_float16_value(v, 0.0))
    if k == CAST_BFLOAT16:
        return float_to_bfloat16_bits(round_to_bfloat16_value(v, 0.0))
    if k == CAST_SMALL_FLOAT:
        return <uint64_t>encode_small_float32(double_to_float_odd(v), &p.encoder)
    if k == CAST_E8M0:
        return <uint64_t>encode_e8m0(double_to_float_odd(v), p.round_mode, p.saturate)
    if k == CAST_BOOL:
        return v != 0.0  # NaN is true, +-0 false
    if k == CAST_FLOAT64:
        return double_bits(v)
    return float_to_integer(v, p)


cdef inline uint64_t encode_integer_value(uint64_t bits, bint unsigned_source, const CastPlan* p) noexcept nogil:
    # bits: the input integer in two's complement (read as unsigned when unsigned_source).
    cdef int k = p.target_kind
    if k == CAST_SIGNED or k == CAST_UNSIGNED:
        return bits & p.target_mask  # "discard higher bits and reinterpret"
    if k == CAST_BOOL:
        return bits != 0
    if k == CAST_FLOAT64:
        # one IEEE conversion, rounded to nearest even
        if unsigned_source:
            return double_bits(<double>bits)
        return double_bits(<double><int64_t>bits)
    if unsigned_source:
        return encode_value(uint64_to_double_odd(bits), p)
    return encode_value(int64_to_double_odd(<int64_t>bits), p)


cdef inline uint64_t convert(uint64_t raw, const CastPlan* p) noexcept nogil:
    cdef int k = p.source_kind
    cdef int shift
    if k == CAST_SIGNED:
        shift = 64 - p.source_bits  # sign-extend the stored bits (int4 -1 may be 0x0F or 0xFF)
        return encode_integer_value(<uint64_t>((<int64_t>(raw << shift)) >> shift), False, p)
    if k == CAST_UNSIGNED:
        return encode_integer_value(raw & ((<uint64_t>1 << p.source_bits) - 1) if p.source_bits < 64 else raw, True, p)
    if k == CAST_BOOL:
        return encode_integer_value(raw != 0, True, p)
    if k == CAST_FLOAT64:
        return encode_value(bits_double(raw), p)
    if k == CAST_FLOAT32:
        return encode_value(bits_float(<uint32_t>raw), p)
    if k == CAST_FLOAT16:
        return encode_value(float16_to_float(<uint16_t>raw), p)
    if k == CAST_BFLOAT16:
        return encode_value(bfloat16_to_float(<uint16_t>raw), p)
    if k == CAST_SMALL_FLOAT:
        return encode_value(decode_small_float32(<uint32_t>raw, &p.decoder), p)
    return encode_value(decode_e8m0(<uint32_t>raw), p)


cdef inline uint64_t encode_rounded(double r, bint negative, const CastPlan* p) noexcept nogil:
    # r: the rounded magnitude (a value of the target with an unbounded exponent, or inf):
    # overflow, the output flush and the sign, then the target's bits. Nothing is rounded
    # here.
    cdef int k = p.target_kind
    if p.flush_outputs and r != 0.0 and r < ldexp(1.0, p.target_min_exponent):
        r = 0.0
    if k == CAST_SMALL_FLOAT:
        # beyond every small float's range: an overflow row, never the inf row
        if r > 1048576.0:
            r = 1048576.0
        return <uint64_t>encode_small_float32(<float>(-r if negative else r), &p.encoder)
    if r > p.target_max:
        r = INFINITY  # "+/- infinity if OOR", decided on the rounded value
    if negative:
        r = -r
    if k == CAST_FLOAT64:
        return double_bits(r)
    if k == CAST_FLOAT32:
        return float_bits(<float>r)
    if k == CAST_FLOAT16:
        return float_to_float16_bits(<float>r)
    return float_to_bfloat16_bits(<float>r)


cdef inline bint float_target(int k) noexcept nogil:
    return (k == CAST_FLOAT64 or k == CAST_FLOAT32 or k == CAST_FLOAT16 or k == CAST_BFLOAT16
            or k == CAST_SMALL_FLOAT)


cdef inline uint64_t datapath_special(double v, const CastPlan* p) noexcept nogil:
    # +-0, +-inf and NaN into a float target: nothing to round; NaN by the `nan` option.
    cdef int k = p.target_kind
    if v != v and p.canonical_nan and k != CAST_SMALL_FLOAT:
        return p.nan_bits
    if k == CAST_SMALL_FLOAT:
        return <uint64_t>encode_small_float32(<float>v, &p.encoder)
    return encode_value(v, p)


cdef inline uint64_t datapath_from_value(double v, uint32_t word, const CastPlan* p) noexcept nogil:
    # A float input's exact value (docs/semantics.md, "Datapath options", Cast).
    cdef int k = p.target_kind
    cdef uint64_t m
    cdef int e
    cdef double r
    cdef bint negative
    if p.flush_inputs and fabs(v) < p.source_min_normal:
        v = copysign(0.0, v)
    if float_target(k):
        if v == 0.0 or v != v or isinf(v):
            return datapath_special(v, p)
        negative = v < 0.0
        exact_parts(v, &m, &e)
        r = round_exact_to_format(m, e, negative, p.target_mantissa_bits, p.target_min_exponent,
                                  p.rounding, word)
        return encode_rounded(r, negative, p)
    if (k == CAST_SIGNED or k == CAST_UNSIGNED) and p.target_bits < 8:
        # int4/uint4/int2/uint2: the spec's rounding to an integer, by the mode, then the
        # low bits; below 2**53 a double may have a fraction.
        if v == v and not isinf(v) and v != 0.0 and fabs(v) < 9007199254740992.0:
            negative = v < 0.0
            exact_parts(v, &m, &e)
            if e < 0:
                m = round_exact_units(m, -e, negative, p.rounding, word)
            else:
                m = m << e  # an integer below 2**53
            return ((~m + 1) if negative else m) & p.target_mask
    # e8m0 (its round_mode), bool, 8-bit-and-wider integers (truncation): the ONNX rules on
    # the flushed input.
    return encode_value(v, p)


cdef inline uint64_t onnxruntime_float8_convert(uint64_t raw, const CastPlan* p) noexcept nogil:
    # onnxruntime's Cast into float8 (onnxruntime/core/providers/cpu/tensor/cast_op.cc):
    # every input becomes a float (static_cast<float>: float64 and wide integers round to
    # nearest, ties to even) and goes through the float8 constructor. Its saturate=0 loop
    # reads bfloat16 with BFloat16::ToFloat, which returns a positive quiet NaN for every
    # NaN (include/onnxruntime/core/session/onnxruntime_float16.h); its saturate=1 loop
    # (Eigen's cast) keeps the sign.
    cdef int k = p.source_kind
    cdef int shift
    cdef float v
    if k == CAST_SMALL_FLOAT and p.source_format == p.target_format:
        # Cast::Compute copies the tensor when from == to: every code kept (e5m2's NaN
        # codes 0x7D / 0x7E and +-inf with saturate=1 included)
        return raw
    if k == CAST_SIGNED:
        shift = 64 - p.source_bits
        v = <float>((<int64_t>(raw << shift)) >> shift)
    elif k == CAST_UNSIGNED:
        v = <float>(raw & ((<uint64_t>1 << p.source_bits) - 1) if p.source_bits < 64 else raw)
    elif k == CAST_BOOL:
        v = 1.0 if raw != 0 else 0.0
    elif k == CAST_FLOAT64:
        v = <float>bits_double(raw)
    elif k == CAST_FLOAT32:
        v = bits_float(<uint32_t>raw)
    elif k == CAST_FLOAT16:
        v = float16_to_float(<uint16_t>raw)
    elif k == CAST_BFLOAT16:
        if not p.saturate and (raw & 0x7FFF) > 0x7F80:
            v = bits_float(0x7FC00000)
        else:
            v = bfloat16_to_float(<uint16_t>raw)
    elif k == CAST_SMALL_FLOAT:
        v = decode_small_float32(<uint32_t>raw, &p.decoder)
    else:
        v = decode_e8m0(<uint32_t>raw)
    if p.flush_inputs and fabs(v) < p.source_min_normal:
        v = copysign(0.0, v)
    return <uint64_t>encode_float8_onnxruntime(v, &p.encoder, p.target_format, p.saturate)


cdef inline uint64_t datapath_convert(uint64_t raw, uint32_t word, const CastPlan* p) noexcept nogil:
    cdef int k = p.source_kind
    cdef int shift
    cdef uint64_t bits, magnitude
    cdef bint negative
    if p.onnxruntime_float8:
        return onnxruntime_float8_convert(raw, p)
    if k == CAST_SIGNED or k == CAST_UNSIGNED or k == CAST_BOOL:
        if k == CAST_SIGNED:
            shift = 64 - p.source_bits
            bits = <uint64_t>((<int64_t>(raw << shift)) >> shift)
            negative = <int64_t>bits < 0
        elif k == CAST_UNSIGNED:
            bits = raw & ((<uint64_t>1 << p.source_bits) - 1) if p.source_bits < 64 else raw
            negative = False
        else:
            bits = raw != 0
            negative = False
        if not float_target(p.target_kind) or bits == 0:
            return convert(raw, p)
        # An integer into a float: its exact value rounded by the mode (int64 into float32
        # or float64 may be inexact).
        magnitude = (~bits) + 1 if negative else bits
        return encode_rounded(round_exact_to_format(magnitude, 0, negative, p.target_mantissa_bits,
                                                    p.target_min_exponent, p.rounding, word),
                              negative, p)
    if k == CAST_FLOAT64:
        return datapath_from_value(bits_double(raw), word, p)
    if k == CAST_FLOAT32:
        return datapath_from_value(bits_float(<uint32_t>raw), word, p)
    if k == CAST_FLOAT16:
        return datapath_from_value(float16_to_float(<uint16_t>raw), word, p)
    if k == CAST_BFLOAT16:
        return datapath_from_value(bfloat16_to_float(<uint16_t>raw), word, p)
    if k == CAST_SMALL_FLOAT:
        return datapath_from_value(decode_small_float32(<uint32_t>raw, &p.decoder), word, p)
    return datapath_from_value(decode_e8m0(<uint32_t>raw), word, p)


cdef inline void run_datapath_loop(const CastPlan* p, const float* x, Py_ssize_t start, Py_ssize_t n,
                                   uint8_t* y, const uint32_t* words) noexcept nogil:
    # x[0:n] is the elements start.. of the cast; y and words are the whole arrays
    if p.path == CAST_PATH_HALF_DATAPATH:
        run_cast_half(x, (<uint16_t*>y) + start, n, words + start if words != NULL else NULL,
                      p.rounding, p.target_kind == CAST_BFLOAT16, &p.small_float_datapath, p.nan_keep)
    else:
        run_cast_small_float(x, y + start, n, words + start if words != NULL else NULL, p.rounding,
                             &p.small_float_datapath, &p.encoder)


cdef void narrow_odd(const double* x64, float* buffer, Py_ssize_t piece, Py_ssize_t end,
                     bint flush, bint big_to_inf) noexcept nogil:
    # float64 elements [piece, end) rounded to odd into float32 (double_to_float_odd as
    # selects), after the input flush (float64's own subnormals, below 2**-1022). Rounding
    # to odd at 24 bits keeps what every deterministic mode of the target reads: whether
    # the value is a float32 value at all (exact, or odd and strictly between two float32
    # values), hence whether it is a value of the target, which two of the target's values
    # enclose it, and on which side of their midpoint it lies (the target has at most 11
    # significant bits, its midpoints at most 12, both even at float32's 24: an odd
    # float32 is neither); the sign is kept. So the mode rounds the float32 as it would the
    # exact value (Boldo and Melquiond, "When double rounding is odd", for the nearest
    # modes; the directed modes and to_odd read only the enclosing values and exactness).
    # The float32 grid is finer than every target's in every binade, subnormals included
    # (2**-149 against bfloat16's 2**-133). stochastic reads the first 32 dropped bits,
    # which a float32 does not keep: it stays on the general loop. Beyond float32's range
    # the odd result is FLT_MAX, which float16 and the small floats see as an overflow in
    # every mode, but bfloat16's toward_zero / down / up / to_odd would keep finite:
    # big_to_inf gives +-inf there, as the exact value rounds to beyond bfloat16's largest.
    cdef Py_ssize_t i
    cdef double v
    cdef float f
    cdef uint32_t b
    cdef int32_t inexact, above
    for i in range(piece, end):
        v = x64[i]
        if flush:
            v = v if not (fabs(v) < 2.2250738585072014e-308) else copysign(0.0, v)
        f = <float>v
        b = float_bits(f)
        inexact = (<double>f != v) & (v == v)
        above = fabs(<double>f) > fabs(v)
        b = <uint32_t>select_i32(inexact, <int32_t>((b - <uint32_t>above) | 1), <int32_t>b)
        if big_to_inf:
            b = <uint32_t>select_i32(fabs(v) >= 3.4028236692093846e+38,  # 2**128
                                     <int32_t>(((b >> 31) << 31) | 0x7F800000), <int32_t>b)
        buffer[i - piece] = bits_float(b)


cdef void datapath_task(const CastWork* w, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
    # float32 x straight into the mode's loop; float16 / bfloat16 x widened (exactly) a
    # piece at a time first, float64 x rounded to odd (narrow_odd). Each element's random
    # word is its own, whatever the pieces.
    cdef const CastPlan* p = &w.plan
    cdef const uint16_t* x16 = <const uint16_t*>w.x
    cdef float buffer[WIDEN_CHUNK]
    cdef Py_ssize_t piece, end
    if p.source_kind == CAST_FLOAT32:
        run_datapath_loop(p, <const float*>w.x + start, start, stop - start, w.y, w.random_bits)
        return
    piece = start
    while piece < stop:
        end = min(piece + <Py_ssize_t>WIDEN_CHUNK, stop)
        if p.source_kind == CAST_FLOAT64:
            narrow_odd(<const double*>w.x, buffer, piece, end, p.flush_inputs,
                       p.target_kind == CAST_BFLOAT16)
        else:
            widen(x16, buffer, piece, end, p.source_kind == CAST_FLOAT16)
        run_datapath_loop(p, buffer, piece, end - piece, w.y, w.random_bits)
        piece = end


cdef inline void widen(const uint16_t* x16, float* buffer, Py_ssize_t piece, Py_ssize_t end,
                       bint float16) noexcept nogil:
    # float16 / bfloat16 elements [piece, end) as float32 values (exact) into buffer[0:]
    cdef Py_ssize_t i
    if float16:
        for i in range(piece, end):
            buffer[i - piece] = float16_to_float_select(x16[i])
    else:
        for i in range(piece, end):
            buffer[i - piece] = bits_float((<uint32_t>x16[i]) << 16)


cdef void half_small_float_task(const CastWork* w, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
    # The default Cast from float16 / bfloat16 into a small float: the input widened
    # (exactly) a piece at a time, then the float32 loop's encoder.
    cdef const CastPlan* p = &w.plan
    cdef SmallFloat32Encoder encoder = p.encoder
    cdef float buffer[WIDEN_CHUNK]
    cdef uint8_t* y8
    cdef Py_ssize_t piece, end, i, n
    piece = start
    while piece < stop:
        end = min(piece + <Py_ssize_t>WIDEN_CHUNK, stop)
        widen(<const uint16_t*>w.x, buffer, piece, end, p.source_kind == CAST_FLOAT16)
        y8 = w.y + piece
        n = end - piece
        for i in range(n):
            y8[i] = <uint8_t>encode_small_float32(buffer[i], &encoder)
        piece = end


cdef void typed_task(const CastWork* w, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
    # The default (ONNX) conversions between float32 and the 16-bit floats and from
    # float32 into 8- and 16-bit integers, with the general path's bits (convert) in loops
    # the compiler vectorizes. Pointers and bounds in locals: a store through y may alias
    # anything reached through w.
    cdef const CastPlan* p = &w.plan
    cdef const float* x32 = <const float*>w.x
    cdef const uint16_t* x16 = <const uint16_t*>w.x
    cdef float* y32 = <float*>w.y
    cdef uint16_t* y16 = <uint16_t*>w.y
    cdef uint8_t* y8 = w.y
    cdef Py_ssize_t i
    cdef float v, lo, hi
    cdef int path = p.path
    if path == CAST_PATH_F32_F16:
        for i in range(start, stop):
            y16[i] = float_to_float16_rne(x32[i])
    elif path == CAST_PATH_F32_BF16:
        for i in range(start, stop):
            y16[i] = float_to_bfloat16_rne(x32[i])
    elif path == CAST_PATH_F16_F32:
        for i in range(start, stop):
            y32[i] = float16_to_float_select(x16[i])
    elif path == CAST_PATH_BF16_F32:
        for i in range(start, stop):
            y32[i] = bfloat16_to_float_quiet(x16[i])
    else:
        # float_to_integer on 8 and 16 bits: the type's bounds are float32 values, so
        # clamping before the truncation gives the saturated truncation (a value between
        # hi and hi + 1 truncates to hi either way), and NaN is sent to 0 first
        lo = <float>p.float_lo
        hi = <float>(p.float_above - 1.0)
        if p.target_bytes == 1:
            for i in range(start, stop):
                v = x32[i]
                v = v if v == v else <float>0.0
                v = v if v > lo else lo
                v = v if v < hi else hi
                y8[i] = <uint8_t><int32_t>v
        else:
            for i in range(start, stop):
                v = x32[i]
                v = v if v == v else <float>0.0
                v = v if v > lo else lo
                v = v if v < hi else hi
                y16[i] = <uint16_t><int32_t>v


cdef void cast_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const CastWork* w = <const CastWork*>work
    cdef const CastPlan* p = &w.plan
    cdef Py_ssize_t start = task * CAST_CHUNK
    cdef Py_ssize_t stop = min(start + CAST_CHUNK, w.n)
    cdef Py_ssize_t i
    # Locals: a store through uint8_t* may alias anything, so fields read through `w` in
    # the loop would be reloaded every iteration and the loop would not vectorize.
    cdef const float* x32 = <const float*>w.x
    cdef uint8_t* y8 = w.y
    cdef SmallFloat32Encoder encoder
    cdef int round_mode
    cdef bint saturate
    cdef uint32_t word = 0
    if p.path == CAST_PATH_SMALL_FLOAT_DATAPATH or p.path == CAST_PATH_HALF_DATAPATH:
        datapath_task(w, start, stop)
    elif CAST_PATH_F32_F16 <= p.path <= CAST_PATH_BF16_F32:
        typed_task(w, start, stop)
    elif p.datapath:
        for i in range(start, stop):
            if w.random_bits != NULL:
                word = w.random_bits[i]
            store(w.y, i, p.target_bytes, datapath_convert(load(w.x, i, p.source_bytes), word, p))
    elif p.path == CAST_PATH_F32_SMALL_FLOAT and p.source_kind != CAST_FLOAT32:
        half_small_float_task(w, start, stop)
    elif p.path == CAST_PATH_F32_SMALL_FLOAT:
        encoder = p.encoder  # a local copy: loop invariants the compiler can keep in registers
        for i in range(start, stop):
            y8[i] = <uint8_t>encode_small_float32(x32[i], &encoder)
    elif p.path == CAST_PATH_F32_E8M0:
        round_mode = p.round_mode
        saturate = p.saturate
        for i in range(start, stop):
            y8[i] = <uint8_t>encode_e8m0(x32[i], round_mode, saturate)
    else:
        for i in range(start, stop):
            store(w.y, i, p.target_bytes, convert(load(w.x, i, p.source_bytes), p))


_KINDS = {
    "float64": CAST_FLOAT64, "float32": CAST_FLOAT32, "float16": CAST_FLOAT16,
    "bfloat16": CAST_BFLOAT16, "small_float": CAST_SMALL_FLOAT, "e8m0": CAST_E8M0,
    "signed": CAST_SIGNED, "unsigned": CAST_UNSIGNED, "bool": CAST_BOOL,
}
_FLOAT_BYTES = {CAST_FLOAT64: 8, CAST_FLOAT32: 4, CAST_FLOAT16: 2, CAST_BFLOAT16: 2,
                CAST_SMALL_FLOAT: 1, CAST_E8M0: 1, CAST_BOOL: 1}


cdef class CastConfig:
    """One Cast plan, as qemu_q/ops/cast.py decides it; every field is checked here."""
    cdef CastPlan plan

    def __init__(self, *, int path, int source_kind, int source_bits, int source_format,
                 int target_kind, int target_bits, int target_format, int round_mode,
                 bint saturate, int small_float_rules, bint datapath=False,
                 int rounding=DP_HALF_EVEN, bint flush_inputs=False, bint flush_outputs=False,
                 bint canonical_nan=False, double source_min_normal=0.0,
                 bint onnxruntime_float8=False):
        cdef SmallFloatFormat f
        cdef CastSmallFloatDatapath* d
        if not CAST_PATH_GENERAL <= path <= CAST_PATH_HALF_DATAPATH:
            raise ValueError(f"CastConfig: unknown path {path}")
        for name, kind, bits, fmt in (("source", source_kind, source_bits, source_format),
                                      ("target", target_kind, target_bits, target_format)):
            if kind not in _KINDS.values():
                raise ValueError(f"CastConfig: unknown {name}_kind {kind}")
            if kind in (CAST_SIGNED, CAST_UNSIGNED):
                if bits not in (2, 4, 8, 16, 32, 64):
                    raise ValueError(f"CastConfig: {name}_bits={bits}; allowed 2, 4, 8, 16, 32, 64")
            elif kind == CAST_SMALL_FLOAT and not 0 <= fmt < SF_COUNT:
                raise ValueError(f"CastConfig: {name}_format={fmt} is not a small-float format")
        if round_mode not in (E8M0_UP, 1, E8M0_NEAREST):
            raise ValueError(f"CastConfig: unknown round_mode {round_mode}")
        if small_float_rules & ~(SF_RULE_NAN_SIGN | SF_RULE_FNUZ_INF_NAN | SF_RULE_NAN_NEGATIVE_ZERO
                                 | SF_RULE_NAN_OPPOSITE_ZERO):
            raise ValueError(f"CastConfig: unknown small_float_rules bits {small_float_rules:#x}")
        if path == CAST_PATH_F32_SMALL_FLOAT and not (
                source_kind in (CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16) and target_kind == CAST_SMALL_FLOAT):
            raise ValueError("CastConfig: the small-float path needs float32, float16 or bfloat16 into a small float")
        if path == CAST_PATH_F32_E8M0 and not (source_kind == CAST_FLOAT32 and target_kind == CAST_E8M0):
            raise ValueError("CastConfig: the float32 e8m0 path needs float32 into float8e8m0")
        # (source kinds, target kinds, target bits) each typed path serves
        needs = {CAST_PATH_F32_F16: ((CAST_FLOAT32,), (CAST_FLOAT16,), None),
                 CAST_PATH_F32_BF16: ((CAST_FLOAT32,), (CAST_BFLOAT16,), None),
                 CAST_PATH_F32_INTEGER: ((CAST_FLOAT32,), (CAST_SIGNED, CAST_UNSIGNED), (8, 16)),
                 CAST_PATH_F16_F32: ((CAST_FLOAT16,), (CAST_FLOAT32,), None),
                 CAST_PATH_BF16_F32: ((CAST_BFLOAT16,), (CAST_FLOAT32,), None),
                 CAST_PATH_SMALL_FLOAT_DATAPATH: ((CAST_FLOAT64, CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16),
                                                  (CAST_SMALL_FLOAT,), None),
                 CAST_PATH_HALF_DATAPATH: ((CAST_FLOAT64, CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16),
                                           (CAST_FLOAT16, CAST_BFLOAT16), None)}
        if path in needs:
            sources, targets, widths = needs[path]
            if source_kind not in sources or target_kind not in targets or (
                    widths is not None and target_bits not in widths):
                raise ValueError(f"CastConfig: path {path} does not serve source_kind {source_kind} "
                                 f"into target_kind {target_kind} of {target_bits} bits")
        datapath_paths = (CAST_PATH_SMALL_FLOAT_DATAPATH, CAST_PATH_HALF_DATAPATH)
        if datapath != (path in datapath_paths) and path != CAST_PATH_GENERAL:
            raise ValueError(f"CastConfig: path {path} " + ("needs" if path in datapath_paths
                                                             else "runs without") + " a datapath")
        if path in datapath_paths and source_kind == CAST_FLOAT64 and rounding == DP_STOCHASTIC:
            raise ValueError("CastConfig: a float64 source under stochastic rounding runs the general "
                             "loop (the float32 rounded to odd keeps too few of the dropped bits)")
        if path == CAST_PATH_HALF_DATAPATH and source_kind == target_kind:
            raise ValueError("CastConfig: the float16 / bfloat16 datapath loops serve float32 and the "
                             "other 16-bit float")
        if path == CAST_PATH_SMALL_FLOAT_DATAPATH and (onnxruntime_float8 or target_format >= SF_COUNT):
            raise ValueError("CastConfig: the small-float datapath loops serve the ONNX small floats "
                             "without float8_encoder='onnxruntime'")
        if not DP_HALF_EVEN <= rounding <= DP_STOCHASTIC:
            raise ValueError(f"CastConfig: rounding {rounding} is not a datapath rounding")
        # encode_float8_onnxruntime relies on the Cast-24 rows in the encoder and rounds
        # half to even itself, without a flush of its results.
        if onnxruntime_float8 and not (
                datapath and target_kind == CAST_SMALL_FLOAT
                and target_format in (SF_E4M3FN, SF_E4M3FNUZ, SF_E5M2, SF_E5M2FNUZ)
                and small_float_rules == SF_RULE_NAN_SIGN and rounding == DP_HALF_EVEN
                and not flush_outputs and not canonical_nan):
            raise ValueError("CastConfig: onnxruntime_float8 needs the datapath path into a float8 "
                             "type, the Cast-24 rows (small_float_rules=SF_RULE_NAN_SIGN), "
                             "rounding half_even, no flush of the outputs and no canonical NaN")
        p = &self.plan
        p.onnxruntime_float8 = onnxruntime_float8
        p.target_format = target_format
        p.source_format = source_format
        p.path = path
        p.source_kind = source_kind
        p.source_bits = source_bits
        p.source_bytes = max(1, source_bits // 8) if source_kind in (CAST_SIGNED, CAST_UNSIGNED) else _FLOAT_BYTES[source_kind]
        p.target_kind = target_kind
        p.target_bits = target_bits
        p.target_bytes = max(1, target_bits // 8) if target_kind in (CAST_SIGNED, CAST_UNSIGNED) else _FLOAT_BYTES[target_kind]
        p.target_mask = ((<uint64_t>1 << target_bits) - 1) if 0 < target_bits < 64 else <uint64_t>0xFFFFFFFFFFFFFFFF
        p.round_mode = round_mode
        p.saturate = saturate
        if target_kind == CAST_SIGNED:
            p.int_lo = -(<int64_t>1 << (target_bits - 1)) if target_bits < 64 else <int64_t>(-9223372036854775807 - 1)
            p.int_hi = (<uint64_t>1 << (target_bits - 1)) - 1
            p.float_lo = -(2.0 ** (target_bits - 1))
            p.float_above = 2.0 ** (target_bits - 1)
        else:
            p.int_lo = 0
            p.int_hi = p.target_mask
            p.float_lo = 0.0
            p.float_above = 2.0 ** target_bits
        p.decoder = small_float32_decoder(source_format if source_kind == CAST_SMALL_FLOAT else 0)
        p.encoder = small_float32_encoder(target_format if target_kind == CAST_SMALL_FLOAT else 0,
                                          saturate, small_float_rules)
        p.datapath = datapath
        p.rounding = rounding if datapath else DP_HALF_EVEN
        p.flush_inputs = datapath and flush_inputs
        p.flush_outputs = datapath and flush_outputs
        p.canonical_nan = datapath and canonical_nan
        p.source_min_normal = source_min_normal if datapath else 0.0
        # (mantissa bits, smallest normal exponent, largest finite, canonical NaN) of a
        # float target; the small floats' overflow is their encoder's.
        targets = {CAST_FLOAT64: (52, -1022, 1.7976931348623157e308, 0x7FF8000000000000),
                   CAST_FLOAT32: (23, -126, (2.0 - 2.0 ** -23) * 2.0 ** 127, 0x7FC00000),
                   CAST_FLOAT16: (10, -14, 65504.0, 0x7E00),
                   CAST_BFLOAT16: (7, -126, (2.0 - 2.0 ** -7) * 2.0 ** 127, 0x7FC0)}
        if target_kind == CAST_SMALL_FLOAT:
            f = small_float_format(target_format)
            targets[target_kind] = (f.mantissa_bits, f.min_exponent, f.max_finite, 0)
        (p.target_mantissa_bits, p.target_min_exponent, p.target_max,
         p.nan_bits) = targets.get(target_kind, (0, 0, 0.0, 0))
        d = &p.small_float_datapath
        d.x_min_normal = <float>p.source_min_normal if p.flush_inputs else <float>0.0
        d.flush_outputs = p.flush_outputs
        if (p.flush_outputs and float_target(target_kind) and p.target_mantissa_bits > 0
                and p.source_min_normal <= 2.0 ** p.target_min_exponent * (1.0 - 2.0 ** -p.target_mantissa_bits)):
            # The datapath loops skip an input flush that the output flush makes redundant:
            # an input below the source's smallest normal, at most the target's largest
            # subnormal, rounds in every mode to at most that subnormal, which the output
            # flush turns into the same zero of x's sign (float32 sources into every ONNX
            # small float and float16). The general loop keeps both steps.
            d.x_min_normal = <float>0.0
        if (p.flush_inputs and p.flush_outputs and float_target(target_kind)
                and 2.0 ** p.target_min_exponent <= p.source_min_normal):
            # and the output flush that the input flush makes redundant: an input kept is
            # at least the source's smallest normal, at least the target's, a value of
            # the target, and no mode rounds below it (float32 and float16 into bfloat16).
            d.flush_outputs = 0
        p.nan_keep = (0x7E00 if target_kind == CAST_FLOAT16 else 0x7FC0) if p.canonical_nan else 0xFFFF
        d.shift = 23 - p.target_mantissa_bits
        d.fraction_mask = (1 << d.shift) - 1
        d.min_normal_bits = (p.target_min_exponent + 127) << 23 if target_kind == CAST_SMALL_FLOAT else 0
        d.min_normal_code = 1 << p.target_mantissa_bits

    @property
    def path(self):
        """The loop this plan runs (a CastPath: qemu_q._dtypes.CAST_PATH_*)."""
        return self.plan.path

    @property
    def stochastic(self):
        return self.plan.datapath and self.plan.rounding == DP_STOCHASTIC

    @property
    def source_bytes(self):
        return self.plan.source_bytes

    @property
    def target_bytes(self):
        return self.plan.target_bytes


def cast(const uint8_t[::1] x, uint8_t[::1] y, CastConfig config, int n_threads, random_bits=None):
    """y = Cast(x) on raw element bytes (one element per byte for sub-byte types);
    random_bits (uint32, one per element) only for a stochastic datapath."""
    cdef CastWork work
    cdef Py_ssize_t n
    work.plan = config.plan
    work.random_bits = NULL
    if x.shape[0] % work.plan.source_bytes or y.shape[0] % work.plan.target_bytes:
        raise ValueError("cast: x and y must hold whole elements of the configured types")
    n = x.shape[0] // work.plan.source_bytes
    if y.shape[0] // work.plan.target_bytes != n:
        raise ValueError(f"cast: x has {n} elements, y {y.shape[0] // work.plan.target_bytes}")
    work.random_bits = random_words(random_bits, config.stochastic, n, "cast: ")
    if n == 0:
        return
    check_aligned(&x[0], work.plan.source_bytes, "x")
    check_aligned(&y[0], work.plan.target_bytes, "y")
    work.x = &x[0]
    work.y = &y[0]
    work.n = n
    with nogil:
        run_tasks(cast_task, &work, (n + CAST_CHUNK - 1) // CAST_CHUNK, n_threads)
