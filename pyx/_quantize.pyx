# QuantizeLinear kernels: per-tensor, per-axis and blocked, for every x storage and every
# quantized encoding, into one code per element or straight into the packed ONNX layout.
# The Python layer (qemu_q/_ops.py) validates, resolves the op version and hands over
# contiguous arrays, double-precision scales and zero points.
#
# The common case, float32 x divided in float32, has its own branch-free loops (integer
# codes, small-float codes) that the compiler vectorizes; everything else goes through the
# general scalar path. Both give the same bits (tests/test_kernels.py runs them side by side).

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.math cimport fabs, fabsf, copysign, fma, frexp, isnan, isinf
from libc.stdint cimport uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t

from _layout cimport (
    Layout, Segment, Cursor, PER_TENSOR, PER_AXIS, BLOCKED, make_layout, check_layout, set_task_size,
    layout_tasks, layout_parameters, cursor_at, next_segment, next_block_run,
)
from _tasks cimport run_tasks
from _codecs cimport (
    x_storage_t, code_storage_t,
    SmallFloat32Encoder, small_float32_encoder, encode_small_float32, encode_float8_onnxruntime,
    SF_E4M3FN, SF_E4M3FNUZ, SF_E5M2, SF_E5M2FNUZ,
    FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, FMT_INT32, CODE_INTEGER, CODE_SMALL_FLOAT, SF_COUNT,
    PATH_GENERAL, PATH_F32_INTEGER, PATH_F32_SMALL_FLOAT, SF_RULE_NAN_SIGN, SF_RULE_FNUZ_INF_NAN,
    SF_RULE_NAN_OPPOSITE_ZERO,
    float16_to_float, bfloat16_to_float, divide_to_value_format,
    encode_integer, round_biased, saturate_biased, ROUND_MAGIC_BITS,
    SmallFloatFormat, small_float_format, round_to_value_format, round_magnitude,
    round_to_minifloat_value, valid_small_float_id, DP_HALF_EVEN, DP_STOCHASTIC, DP_NAN_MIN, DP_NAN_ZERO, DP_NAN_MAX,
    DP_HALF_AWAY, DP_HALF_UP, DP_HALF_DOWN, DP_TOWARD_ZERO, DP_DOWN, DP_UP, DP_TO_ODD,
    select_i32, select_f32, float_bits, bits_float, pow2, flush_subnormal_f32,
    rounded_count, half_even_count,
    select_i64, flush_subnormal_f64, double_to_float_odd_staged, double_bits, bits_double,
    division_remainder_f32, quotient_rounded_to_odd, exact_even_quotient,
    product_nan_first_f32, product_nan_first_f64,
)
from _subbyte cimport pack_codes
from _memory cimport (
    prefetch, stream_fence, check_aligned, line_head, random_words, PREFETCH_BLOCK, PREFETCH_AHEAD,
    STREAM_MIN_BYTES,
    NO_DOUBLE, NO_FLOAT, NO_INT32, float64_parameters, float32_parameters, int32_parameters,
)

cdef enum:
    # Codes quantized into a stack buffer (L1-resident) before they are packed: a multiple
    # of 8, so that every piece starts on a whole byte of every packed layout.
    PACK_BUFFER = 4096
    # The datapath's buffered feeding (quantize_datapath_f32): at most this many elements
    # per loop call; runs shorter than DATAPATH_DIRECT_RUN gathered into one call (a
    # vectorized loop's set-up and scalar tail cost about as much as 32 elements); the
    # converted parameters kept per task (as many as a 4096-wide row has).
    DATAPATH_PIECE = 1024
    DATAPATH_DIRECT_RUN = 256
    DATAPATH_PARAMETERS = 4096

cdef enum DatapathFeed:
    # How quantize_range feeds a plan's datapath loops.
    FEED_PIECES = 0      # the general cursor's pieces (the scalar datapath_one, the staged loops)
    FEED_BUFFERED = 1    # quantize_datapath_f32: every float32 loop plan (runs in L1-sized chunks)
    FEED_STAGED = 2      # quantize_datapath_staged: QUOTIENT64_REMAINDER plans (float64 quotients
                         # of float32-valued x and scale), the same windows and pieces

# Test and benchmark hook (set_datapath_feed): False gives every plan FEED_PIECES, the
# feeding before the buffered one, so that the two compare in one build.
cdef bint datapath_feed_enabled = True

# Integer codes from float32 with one scale, written with streaming stores straight from
# the registers (AVX-512 builds only). The arithmetic is run_f32_integer's, operation for
# operation (round_biased, saturate_biased in _codecs.pxd): the quotient, the add of
# 1.5 * 2**23, NaN to INT32_MIN, the clamp in the biased domain, the offset back, the
# mask. Streaming a QuantizeLinear output of 8 MiB or more (int8 and int16 codes) skips
# the read of each output line before it is written; through an L1 buffer, as
# DequantizeLinear does, the streaming stores stall in bursts, and GCC's vectorizer cannot
# emit them itself (docs/performance.md). The arrays are aligned to their elements
# (check_aligned), so the head before the first 64-byte line is a whole number of codes.
cdef extern from *:
    """
    #if defined(__AVX512F__) && defined(__AVX512BW__)
    #include <immintrin.h>
    #define QEMU_Q_HAVE_STREAM_CODES 1
    #define QEMU_Q_CODES_AHEAD 1024  /* PREFETCH_AHEAD: the input prefetched as quantize_range does */
    static inline __m512i qemu_q_codes16(const float *x, __m512 scale, __m512i biased_lo,
                                         __m512i biased_hi, __m512i offset, __m512i mask) {
        __m512 t = _mm512_add_ps(_mm512_div_ps(_mm512_loadu_ps(x), scale),
                                 _mm512_set1_ps(12582912.0f));
        __mmask16 number = _mm512_cmp_ps_mask(t, t, _CMP_EQ_OQ);
        __m512i b = _mm512_mask_blend_epi32(number, _mm512_set1_epi32(INT32_MIN),
                                            _mm512_castps_si512(t));
        b = _mm512_min_epi32(_mm512_max_epi32(b, biased_lo), biased_hi);
        return _mm512_and_si512(_mm512_sub_epi32(b, offset), mask);
    }
    /* n codes (a multiple of 64 / code_size) into y, 64-byte aligned. */
    static inline void qemu_q_stream_integer_codes(const float *x, void *y, Py_ssize_t n,
                                                   int code_size, float scale, int32_t biased_lo,
                                                   int32_t biased_hi, int32_t offset, int32_t mask) {
        __m512 s = _mm512_set1_ps(scale);
        __m512i lo = _mm512_set1_epi32(biased_lo), hi = _mm512_set1_epi32(biased_hi);
        __m512i off = _mm512_set1_epi32(offset), m = _mm512_set1_epi32(mask);
        char *out = (char *)y;
        Py_ssize_t i;
        if (code_size == 1) {
            for (i = 0; i < n; i += 64, out += 64) {
                _mm_prefetch((const char *)(x + i + QEMU_Q_CODES_AHEAD), _MM_HINT_NTA);
                _mm_prefetch((const char *)(x + i + QEMU_Q_CODES_AHEAD + 16), _MM_HINT_NTA);
                _mm_prefetch((const char *)(x + i + QEMU_Q_CODES_AHEAD + 32), _MM_HINT_NTA);
                _mm_prefetch((const char *)(x + i + QEMU_Q_CODES_AHEAD + 48), _MM_HINT_NTA);
                __m128i c0 = _mm512_cvtepi32_epi8(qemu_q_codes16(x + i, s, lo, hi, off, m));
                __m128i c1 = _mm512_cvtepi32_epi8(qemu_q_codes16(x + i + 16, s, lo, hi, off, m));
                __m128i c2 = _mm512_cvtepi32_epi8(qemu_q_codes16(x + i + 32, s, lo, hi, off, m));
                __m128i c3 = _mm512_cvtepi32_epi8(qemu_q_codes16(x + i + 48, s, lo, hi, off, m));
                __m512i line = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_set_m128i(c1, c0)), _mm256_set_m128i(c3, c2), 1);
                _mm512_stream_si512((__m512i *)out, line);
            }
        } else {
            for (i = 0; i < n; i += 32, out += 64) {
                _mm_prefetch((const char *)(x + i + QEMU_Q_CODES_AHEAD), _MM_HINT_NTA);
                _mm_prefetch((const char *)(x + i + QEMU_Q_CODES_AHEAD + 16), _MM_HINT_NTA);
                __m256i c0 = _mm512_cvtepi32_epi16(qemu_q_codes16(x + i, s, lo, hi, off, m));
                __m256i c1 = _mm512_cvtepi32_epi16(qemu_q_codes16(x + i + 16, s, lo, hi, off, m));
                _mm512_stream_si512((__m512i *)out,
                                    _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1));
            }
        }
    }
    #else
    #define QEMU_Q_HAVE_STREAM_CODES 0
    static inline void qemu_q_stream_integer_codes(const float *x, void *y, Py_ssize_t n,
                                                   int code_size, float scale, int32_t biased_lo,
                                                   int32_t biased_hi, int32_t offset, int32_t mask) {
        (void)x; (void)y; (void)n; (void)code_size; (void)scale;
        (void)biased_lo; (void)biased_hi; (void)offset; (void)mask;
    }
    #endif
    """
    void stream_integer_codes "qemu_q_stream_integer_codes" (
        const float* x, void* y, Py_ssize_t n, int code_size, float scale, int32_t biased_lo,
        int32_t biased_hi, int32_t offset, int32_t mask) noexcept nogil
    enum: HAVE_STREAM_CODES "QEMU_Q_HAVE_STREAM_CODES"


cdef struct DatapathF32:
    # run_datapath_f32's loop invariants, from the plan (QuantizeConfig).
    float x_min_normal        # subnormals flush_inputs: below it x is flushed (0: kept)
    float scale_min_normal
    int32_t lo
    int32_t hi
    int32_t mask
    int32_t nan_override      # 1: a NaN quotient gives nan_code (nan_to_integer min, max)
    int32_t nan_code
    int32_t shift             # small floats: 23 - mantissa bits
    int32_t min_normal_bits   # float32 bits of the target's smallest normal
    int32_t min_normal_code   # its code, 1 << mantissa bits
    int32_t flush_outputs     # 1: a result below the smallest normal becomes zero


cdef struct QuantizePlan:
    int path
    int x_format
    int precision
    bint fast_divide
    int code_kind
    float lo
    float hi
    int mask
    SmallFloat32Encoder encoder  # with the Cast table's codes for NaN, inf and overflow
    bint stream             # integer codes with one scale per run: streamed (see above)
    Layout layout
    const double* scale
    const double* zero_point
    const float* scale32       # the same values as float32 (exact on the float32 paths)
    const float* zero_point32
    const int32_t* zero_point_int  # integer zero points as int32
    # qemu_q.Datapath, when it is not ONNX's: the general path's datapath loop reads these.
    bint datapath
    int rounding              # DatapathRounding
    bint reciprocal           # x * (1 / scale) instead of x / scale
    bint float64_quotient     # the quotient (and reciprocal) in float64, not `precision`
    bint f32_operands         # x and the scale are float32 values: float32 operations are exact roundings
    int nan_to_integer        # DatapathNanToInteger
    bint flush_inputs
    bint flush_outputs
    double x_min_normal       # 0: x's type has no subnormals
    double scale_min_normal
    int sf_mantissa_bits      # the small-float format's, for the datapath's own rounding
    int sf_min_exponent
    int sf_clamp_exponent     # above the format's largest value (qemu_q.minifloat_type's reach 2**127)
    const uint32_t* random_bits  # one word per element of x (stochastic rounding), else NULL
    # float8_encoder="onnxruntime" into a float8 type: encode_float8_onnxruntime rounds
    # and encodes the quotient (the datapath's own rounding is half_even there).
    bint onnxruntime_float8
    int small_float_id
    bint saturate
    # float32 x and scale, the quotient in float32 (x / s, or x * (1 / s)): the datapath's
    # vectorized float32 loops (run_datapath_f32) instead of datapath_one.
    bint datapath_f32
    DatapathF32 dp32
    # The other datapaths the float32 loops serve through a staging loop (run_datapath_wide,
    # _datapath_loops_f64.pxi): WIDE_X, WIDE_HALF, WIDE_F64; 0 (WIDE_NONE): datapath_one.
    int datapath_wide
    int quotient64            # WIDE_F64: QUOTIENT64_DOUBLE or QUOTIENT64_REMAINDER (_datapath_loops_f64.pxi)
    int datapath_feed         # DatapathFeed


cdef inline double load_double(x_storage_t v, int x_format) noexcept nogil:
    if x_storage_t is float:
        return v
    elif x_storage_t is uint16_t:
        if x_format == FMT_FLOAT16:
            return float16_to_float(v)
        return bfloat16_to_float(v)
    else:
        return v


cdef inline int quantize_one(x_storage_t v, double scale, double zero_point, const QuantizePlan* p) noexcept nogil:
    cdef float q
    cdef double x = load_double(v, p.x_format)
    if p.fast_divide:
        # x and the scale are float32 values and the division precision is float32: one
        # IEEE float division is the correctly rounded quotient.
        q = <float>x / <float>scale
    else:
        q = divide_to_value_format(x, scale, p.precision)
    if p.code_kind == CODE_INTEGER:
        return encode_integer(q, <float>zero_point, p.lo, p.hi, p.mask)
    # The zero point of a float type is +0 or -0 (or absent: -0, the additive identity);
    # adding it as the formula says decides the sign of a zero quotient.
    return encode_small_float32(q + <float>zero_point, &p.encoder)


cdef inline void run_general(const x_storage_t* x, code_storage_t* y, Py_ssize_t n,
                             const double* scale, const double* zero_point, bint params_vary,
                             const QuantizePlan* plan) noexcept nogil:
    # The plan is copied to the stack: stores through y (a character type may alias
    # anything) would otherwise force the compiler to reload every field per element.
    cdef QuantizePlan p = plan[0]
    cdef Py_ssize_t i
    if params_vary:
        for i in range(n):
            y[i] = <code_storage_t>quantize_one(x[i], scale[i], zero_point[i], &p)
    else:
        for i in range(n):
            y[i] = <code_storage_t>quantize_one(x[i], scale[0], zero_point[0], &p)


cdef inline double datapath_quotient(double x, double scale, const QuantizePlan* p) noexcept nogil:
    # The quotient as the datapath forms it (docs/semantics.md, "Datapath options"): the
    # inputs flushed, then x / scale or x * (1 / scale), each operation rounded once to the
    # datapath's precision. x and the reciprocal have at most 31 and 24 significant bits,
    # so the double product is exact but for int32 x, whose product error FMA recovers.
    cdef double r, product
    if p.flush_inputs:
        if fabs(x) < p.x_min_normal:
            x = copysign(0.0, x)
        if fabs(scale) < p.scale_min_normal:
            scale = copysign(0.0, scale)
    if not p.reciprocal:
        if p.float64_quotient:
            return x / scale
        if p.f32_operands and p.precision == FMT_FLOAT32:
            # one IEEE float division of float32 values: the correctly rounded quotient
            return <float>x / <float>scale
        return divide_to_value_format(x, scale, p.precision)
    # (x's NaN over the reciprocal's, as in the division: product_nan_first)
    if p.float64_quotient:
        return product_nan_first_f64(x, 1.0 / scale)
    if p.f32_operands:
        # each float32 operation rounds its exact result once, as the definition says
        return product_nan_first_f32(<float>x, <float>1.0 / <float>scale)
    r = divide_to_value_format(1.0, scale, FMT_FLOAT32)
    product = product_nan_first_f64(x, r)
    if isnan(product) or isinf(product):
        return product
    return round_to_value_format(product, fma(x, r, -product), FMT_FLOAT32)


cdef inline int datapath_one(x_storage_t v, double scale, double zero_point, uint32_t random_word,
                             const QuantizePlan* p) noexcept nogil:
    cdef double q = datapath_quotient(load_double(v, p.x_format), scale, p)
    cdef double n
    if p.code_kind == CODE_INTEGER:
        if isnan(q):
            # What round(NaN) reads as: -inf (x86's INT32_MIN), 0 (Arm's), +inf.
            if p.nan_to_integer == DP_NAN_MIN:
                return (<int>p.lo) & p.mask
            if p.nan_to_integer == DP_NAN_MAX:
                return (<int>p.hi) & p.mask
            q = 0.0
        if fabs(q) > 1099511627776.0:
            # 2**40: beyond every code and zero point, whatever the rounding; keeps
            # round_magnitude inside 2**53.
            q = copysign(1099511627776.0, q)
        n = round_magnitude(fabs(q), q < 0.0, p.rounding, random_word)
        n = (-n if q < 0.0 else n) + zero_point
        if n < p.lo:
            n = p.lo
        if n > p.hi:
            n = p.hi
        return (<int>n) & p.mask
    # The zero point of a float type is +0 or -0: it decides the sign of a zero quotient.
    q = q + zero_point
    if p.onnxruntime_float8:
        # the constructor's `float v`: a float64 quotient (scale_precision="float64") is
        # rounded to float32 first, as onnxruntime's caller would
        return encode_float8_onnxruntime(<float>q, &p.encoder, p.small_float_id, p.saturate)
    if not isnan(q) and not isinf(q):
        q = round_to_minifloat_value(q, p.sf_mantissa_bits, p.sf_min_exponent, p.sf_clamp_exponent,
                                     p.rounding, random_word, p.flush_outputs)
    # q is now a value of the format (or beyond its max, or inf/NaN): the encoder rounds
    # nothing and applies the Cast table's rows.
    return encode_small_float32(<float>q, &p.encoder)


cdef inline void run_datapath(const x_storage_t* x, code_storage_t* y, Py_ssize_t n,
                              const double* scale, const double* zero_point, bint params_vary,
                              const uint32_t* random_bits, const QuantizePlan* plan) noexcept nogil:
    # run_general's loop for a non-ONNX datapath; random_bits is x's word array at x[0],
    # or NULL.
    cdef QuantizePlan p = plan[0]
    cdef Py_ssize_t i
    cdef uint32_t word = 0
    for i in range(n):
        if random_bits != NULL:
            word = random_bits[i]
        if params_vary:
            y[i] = <code_storage_t>datapath_one(x[i], scale[i], zero_point[i], word, &p)
        else:
            y[i] = <code_storage_t>datapath_one(x[i], scale[0], zero_point[0], word, &p)


# The datapath's float32 loops. Where x and the scale are float32 values and the quotient
# is formed in float32 (the ONNX float32 division, or scale_precision="float32"), each
# step of datapath_one is one float32 operation or an integer operation on the bits:
# the quotient x / s or x * (1 / s) (one IEEE rounding each, as datapath_quotient's
# float32 branch), the input flush as a select; integer codes: q clamped in float32 to the
# codes' range less the zero point, then rounded by mode to one integer
# (datapath_round_f32_<mode> in _codecs.pxd); small floats: the count of the target's ulps
# rounded on q's bits (half_even_count, rounded_count in _codecs.pxd). No branch
# depends on an element, and the rounding mode, the scale mode and the parameter layout
# are constants of each loop (_datapath_loops.pxi.tp), so the compiler vectorizes every
# one of them. The bits are datapath_one's (tests/test_datapath_fast.py runs both
# against the exact oracle).
# run_datapath_f32 and its loops, one per rounding mode, scale mode and parameter layout,
# generated from _datapath_loops.pxi.tp by setup.py.
include "_datapath_loops.pxi"
# Test and benchmark hooks of the float64 quotients (set_quotient64_remainder,
# count_quotient64_pieces): False stages every piece with the double loop, as before the
# float32-remainder loops, so that the two compare in one build; the counts say how many
# pieces the remainder loops staged and how many they handed to the double loop. Counting
# is off unless a test turns it on (a relaxed atomic add per piece of 512 elements).
cdef bint quotient64_remainder_enabled = True
# Test and benchmark hook (set_fused_staging): False finishes every staged piece with a
# second float32 loop pass (stage_buffered, then the `_one` or buffered loop), True lets
# integer pieces of one zero point take the fused loop (stage_round).
cdef bint fused_staging_enabled = True
# Test and benchmark hook (set_nearest_quotients): False sends the integer pieces of one
# scale in the nearest modes under a float64 divide straight to the fused loop, True lets
# nearest_divide_one write them from the float32 quotient first.
cdef bint nearest_quotients_enabled = True
cdef extern from *:
    """
    static Py_ssize_t qemu_q_quotient64_pieces[4];
    static int qemu_q_quotient64_counting;
    static inline void qemu_q_count_quotient64(int fell_back) {
        if (qemu_q_quotient64_counting) {
    #if defined(__GNUC__) || defined(__clang__)
            __atomic_fetch_add(&qemu_q_quotient64_pieces[fell_back != 0], 1, __ATOMIC_RELAXED);
    #else
            qemu_q_quotient64_pieces[fell_back != 0] += 1;
    #endif
        }
    }
    /* the pieces the fused loop (stage_round) finished, counted among the staged too */
    static inline void qemu_q_count_fused(void) {
        if (qemu_q_quotient64_counting) {
    #if defined(__GNUC__) || defined(__clang__)
            __atomic_fetch_add(&qemu_q_quotient64_pieces[2], 1, __ATOMIC_RELAXED);
    #else
            qemu_q_quotient64_pieces[2] += 1;
    #endif
        }
    }
    /* the pieces nearest_divide_one finished (neither staged nor fused) */
    static inline void qemu_q_count_nearest(void) {
        if (qemu_q_quotient64_counting) {
    #if defined(__GNUC__) || defined(__clang__)
            __atomic_fetch_add(&qemu_q_quotient64_pieces[3], 1, __ATOMIC_RELAXED);
    #else
            qemu_q_quotient64_pieces[3] += 1;
    #endif
        }
    }
    """
    Py_ssize_t quotient64_pieces "qemu_q_quotient64_pieces"[4]
    void count_fused "qemu_q_count_fused" () noexcept nogil
    void count_nearest "qemu_q_count_nearest" () noexcept nogil
    int quotient64_counting "qemu_q_quotient64_counting"
    void count_quotient64 "qemu_q_count_quotient64" (int fell_back) noexcept nogil
# run_datapath_wide: float16/bfloat16 x, their own division precision and float64
# quotients, staged piece by piece into a float32 buffer for the loops above
# (_datapath_loops_f64.pxi.tp).
include "_datapath_loops_f64.pxi"


cdef inline void run_f32_integer_constant(const float* x, code_storage_t* y, Py_ssize_t n,
                                          float s, int32_t z, int32_t lo, int32_t hi,
                                          int32_t mask) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = <code_storage_t>(saturate_biased(round_biased(x[i] / s), z, lo, hi) & mask)


cdef inline void run_f32_integer(const float* x, code_storage_t* y, Py_ssize_t n,
                                 const float* scale, const int32_t* zero_point, bint params_vary,
                                 int32_t lo, int32_t hi, int32_t mask, bint stream) noexcept nogil:
    # One float32 division (the correctly rounded quotient), one add that rounds it, then
    # integer operations: vdivps, vaddps, a compare and blend for NaN, vpmaxsd, vpminsd,
    # two adds. `stream`: the whole 64-byte lines of y are written by stream_integer_codes.
    cdef Py_ssize_t i, head, lines
    cdef Py_ssize_t per_line = 64 // sizeof(code_storage_t)
    if params_vary:
        for i in range(n):
            y[i] = <code_storage_t>(saturate_biased(round_biased(x[i] / scale[i]), zero_point[i], lo, hi) & mask)
    elif not stream:
        run_f32_integer_constant(x, y, n, scale[0], zero_point[0], lo, hi, mask)
    else:
        head = min(n, line_head(y, sizeof(code_storage_t)))
        lines = (n - head) // per_line * per_line
        run_f32_integer_constant(x, y, head, scale[0], zero_point[0], lo, hi, mask)
        stream_integer_codes(x + head, y + head, lines, sizeof(code_storage_t), scale[0],
                             <int32_t>ROUND_MAGIC_BITS + lo - zero_point[0],
                             <int32_t>ROUND_MAGIC_BITS + hi - zero_point[0],
                             <int32_t>ROUND_MAGIC_BITS - zero_point[0], mask)
        run_f32_integer_constant(x + head + lines, y + head + lines, n - head - lines, scale[0],
                                 zero_point[0], lo, hi, mask)


cdef inline void run_f32_small_float(const float* x, uint8_t* y, Py_ssize_t n,
                                     const float* scale, const float* zero_point, bint params_vary,
                                     const SmallFloat32Encoder* encoder) noexcept nogil:
    # The zero point (+0 or -0) is added as the formula says: it decides the sign of an
    # exact zero quotient.
    cdef SmallFloat32Encoder e = encoder[0]
    cdef Py_ssize_t i
    cdef float s, z
    if params_vary:
        for i in range(n):
            y[i] = <uint8_t>encode_small_float32(x[i] / scale[i] + zero_point[i], &e)
    else:
        s = scale[0]
        z = zero_point[0]
        for i in range(n):
            y[i] = <uint8_t>encode_small_float32(x[i] / s + z, &e)


cdef inline void run_segment(const x_storage_t* x, code_storage_t* y, Py_ssize_t n,
                             Py_ssize_t param_index, bint params_vary, Py_ssize_t first,
                             const QuantizePlan* p) noexcept nogil:
    # first: the index of x[0] in the whole x (where its random bits are).
    if p.datapath:
        if x_storage_t is float:
            if p.datapath_f32:
                run_datapath_f32(x, y, n, p.scale + param_index, p.zero_point + param_index, params_vary,
                                 p.random_bits + first if p.random_bits != NULL else NULL, p)
                return
        if p.datapath_wide != WIDE_NONE:
            run_datapath_wide(x, y, n, p.scale + param_index, p.zero_point + param_index, params_vary,
                              p.random_bits + first if p.random_bits != NULL else NULL, p)
            return
        run_datapath(x, y, n, p.scale + param_index, p.zero_point + param_index, params_vary,
                     p.random_bits + first if p.random_bits != NULL else NULL, p)
        return
    if x_storage_t is float:
        if p.path == PATH_F32_INTEGER:
            run_f32_integer(x, y, n, p.scale32 + param_index, p.zero_point_int + param_index,
                            params_vary, <int32_t>p.lo, <int32_t>p.hi, p.mask, p.stream)
            return
        if code_storage_t is uint8_t:
            if p.path == PATH_F32_SMALL_FLOAT:
                run_f32_small_float(x, y, n, p.scale32 + param_index, p.zero_point32 + param_index,
                                    params_vary, &p.encoder)
                return
    run_general(x, y, n, p.scale + param_index, p.zero_point + param_index, params_vary, p)


cdef inline void run_f32_integer_blocks(const float* x, code_storage_t* y, Py_ssize_t n_blocks,
                                        Py_ssize_t block_size, const float* scale,
                                        const int32_t* zero_point, int32_t lo, int32_t hi,
                                        int32_t mask) noexcept nogil:
    # run_f32_integer over whole blocks, one scale and zero point each. Called with a
    # constant block_size: the inner loop then becomes straight vector code on the
    # broadcast scale, with no per-block loop set-up and no per-element parameters.
    cdef Py_ssize_t b, k
    cdef float s
    cdef int32_t z
    for b in range(n_blocks):
        s = scale[b]
        z = zero_point[b]
        for k in range(b * block_size, (b + 1) * block_size):
            y[k] = <code_storage_t>(saturate_biased(round_biased(x[k] / s), z, lo, hi) & mask)


cdef inline void run_f32_small_float_blocks(const float* x, uint8_t* y, Py_ssize_t n_blocks,
                                           Py_ssize_t block_size, const float* scale,
                                           const float* zero_point,
                                           const SmallFloat32Encoder* encoder) noexcept nogil:
    # run_f32_small_float over whole blocks, as run_f32_integer_blocks.
    cdef SmallFloat32Encoder e = encoder[0]
    cdef Py_ssize_t b, k
    cdef float s, z
    for b in range(n_blocks):
        s = scale[b]
        z = zero_point[b]
        for k in range(b * block_size, (b + 1) * block_size):
            y[k] = <uint8_t>encode_small_float32(x[k] / s + z, &e)


cdef inline void run_blocks_of(const float* x, code_storage_t* y, Py_ssize_t n_blocks,
                               Py_ssize_t block_size, Py_ssize_t param,
                               const QuantizePlan* p) noexcept nogil:
    # Whole blocks on the plan's float32 path. Inlined into run_whole_blocks
    # (_whole_blocks.pxi) with a constant block_size each.
    if p.path == PATH_F32_INTEGER:
        run_f32_integer_blocks(x, y, n_blocks, block_size, p.scale32 + param,
                               p.zero_point_int + param, <int32_t>p.lo, <int32_t>p.hi, p.mask)
    elif code_storage_t is uint8_t:
        run_f32_small_float_blocks(x, y, n_blocks, block_size, p.scale32 + param,
                                   p.zero_point32 + param, &p.encoder)


# run_whole_blocks and whole_block_size, one constant-size loop per block size, generated
# from _whole_blocks.pxi.tp by setup.py.
include "_whole_blocks.pxi"


cdef inline bint whole_blocks(const Layout* L) noexcept nogil:
    # Blocks along the last axis that tile every row and every PREFETCH_BLOCK piece: each
    # piece (which starts at a multiple of PREFETCH_BLOCK) holds whole blocks, and the
    # block of element i is i // block_size, across rows too.
    return L.inner == 1 and L.axis_len % L.block_size == 0 and whole_block_size(L.block_size)


cdef inline void quantize_whole_blocks(const float* x, code_storage_t* y, Py_ssize_t start,
                                       Py_ssize_t end, const QuantizePlan* p) noexcept nogil:
    # Blocked along the last axis, whole_blocks(), on a float32 path.
    cdef Py_ssize_t block_size = p.layout.block_size
    cdef Py_ssize_t piece = start
    cdef Py_ssize_t piece_end
    cdef Py_ssize_t params_ahead = PREFETCH_AHEAD // block_size
    cdef Py_ssize_t params_per_block = PREFETCH_BLOCK // block_size
    cdef Py_ssize_t param
    while piece < end:
        piece_end = min(piece + <Py_ssize_t>PREFETCH_BLOCK, end)
        param = piece // block_size
        prefetch(x + piece + PREFETCH_AHEAD, PREFETCH_BLOCK * sizeof(float))
        prefetch(p.scale32 + param + params_ahead, params_per_block * sizeof(float))
        if p.path == PATH_F32_INTEGER:
            prefetch(p.zero_point_int + param + params_ahead, params_per_block * sizeof(int32_t))
        else:
            prefetch(p.zero_point32 + param + params_ahead, params_per_block * sizeof(float))
        run_whole_blocks(x + piece, y + (piece - start), (piece_end - piece) // block_size,
                         block_size, param, p)
        piece = piece_end


cdef inline void quantize_last_axis_blocks(const float* x, code_storage_t* y, Py_ssize_t start,
                                           Py_ssize_t end, const QuantizePlan* p) noexcept nogil:
    # Blocked along the last axis, on a float32 path, with blocks shorter than a prefetch
    # block: each PREFETCH_BLOCK piece gets its scales and zero points spread out per
    # element in L1-resident buffers, and runs as one per-element-parameter loop (a loop
    # per block of 32 would spend as long entering as running).
    cdef float scale_buf[PREFETCH_BLOCK]
    cdef float zero_point_buf[PREFETCH_BLOCK]
    cdef int32_t zero_point_int_buf[PREFETCH_BLOCK]
    cdef Cursor c
    cdef Segment run
    cdef Py_ssize_t piece, k, param
    cdef float s, zf
    cdef int32_t zi
    cdef bint integer_codes = p.path == PATH_F32_INTEGER
    # The parameters of the elements PREFETCH_AHEAD further on (consecutive blocks have
    # consecutive parameters), a prefetch block's worth of them.
    cdef Py_ssize_t params_ahead = PREFETCH_AHEAD // p.layout.block_size
    cdef Py_ssize_t params_per_block = PREFETCH_BLOCK // p.layout.block_size + 1
    cursor_at(&p.layout, start, start, &c)
    piece = start
    while piece < end:
        c.end = min(piece + <Py_ssize_t>PREFETCH_BLOCK, end)
        param = c.row_block
        prefetch(x + piece + PREFETCH_AHEAD, PREFETCH_BLOCK * sizeof(float))
        prefetch(p.scale32 + param + params_ahead, params_per_block * sizeof(float))
        if integer_codes:
            prefetch(p.zero_point_int + param + params_ahead, params_per_block * sizeof(int32_t))
        else:
            prefetch(p.zero_point32 + param + params_ahead, params_per_block * sizeof(float))
        while next_block_run(&p.layout, &c, &run):
            s = p.scale32[run.param_index]
            if integer_codes:
                zi = p.zero_point_int[run.param_index]
                for k in range(run.start - piece, run.start - piece + run.length):
                    scale_buf[k] = s
                    zero_point_int_buf[k] = zi
            else:
                zf = p.zero_point32[run.param_index]
                for k in range(run.start - piece, run.start - piece + run.length):
                    scale_buf[k] = s
                    zero_point_buf[k] = zf
        if p.path == PATH_F32_INTEGER:
            run_f32_integer(x + piece, y + (piece - start), c.end - piece, scale_buf,
                            zero_point_int_buf, True, <int32_t>p.lo, <int32_t>p.hi, p.mask, False)
        elif code_storage_t is uint8_t:
            run_f32_small_float(x + piece, y + (piece - start), c.end - piece, scale_buf,
                                zero_point_buf, True, &p.encoder)
        piece = c.end


# The datapath's float32 loops, per tensor, per axis and blocked. The general cursor's
# pieces gave them one call per block or per row piece, each converting its scale and
# forming its reciprocal; a block of 32 spent as long entering and leaving its loop (set-up,
# scalar tail) as in it. Here the runs come from the cursor uncut (next_segment up to the
# task's end), and:
# - a run of DATAPATH_DIRECT_RUN elements or more is one call per DATAPATH_PIECE chunk:
#   the `_one` loop on its one scale, or the buffered loop on its converted parameters (a
#   per-tensor run too: in chunks of 1024 the stochastic int8 loop took half the time of
#   one call over the task's 8M elements, and the other options 0.5-0.9x of the default;
#   docs/performance.md);
# - shorter runs (blocks, short rows) are gathered, their parameters spread out per
#   element in L1 buffers, into one buffered call per DATAPATH_PIECE elements.
# The parameters are converted (datapath_f32_parameters: the float32 scale flushed, its
# reciprocal, the zero point) once per parameter into a window of DATAPATH_PARAMETERS,
# not once per element: consecutive blocks have consecutive parameters, and the rows of a
# per-axis or blocked layout come back to the same ones. Every element is still computed
# from its own x, parameters and random word by the same operations: the bits are the
# `_vary` and `_one` loops' (tests/test_datapath_fast.py compares both feedings with
# datapath_one and the oracle). Blocks of 16, 32, 64 or 128 tiling the rows (whole_blocks)
# skip the cursor: each DATAPATH_PIECE piece holds whole blocks, spread out by constant-size
# stores (quantize_datapath_f32_whole_blocks). No software prefetch here: x is read in
# order and the parameters come from L1, and prefetching each piece ahead as
# quantize_range does made these loops 1.3-1.9x slower (docs/performance.md).

# The buffers live on the task's stack (40 KiB in all, one set per task): the zero
# points are int32 for integer codes or float32 for small floats, never both.
cdef union WindowZeroPoints:
    int32_t as_int[DATAPATH_PARAMETERS]
    float as_float[DATAPATH_PARAMETERS]


cdef union PendingZeroPoints:
    int32_t as_int[DATAPATH_PIECE]
    float as_float[DATAPATH_PIECE]


cdef struct DatapathParameters:
    # The converted parameters [first, first + count) of the call's arrays.
    Py_ssize_t first
    Py_ssize_t count
    float divisor[DATAPATH_PARAMETERS]
    WindowZeroPoints zero


cdef struct DatapathPending:
    # Gathered short runs: the elements [start, start + count), their parameters per element.
    Py_ssize_t start
    Py_ssize_t count
    float divisor[DATAPATH_PIECE]
    PendingZeroPoints zero


cdef inline void datapath_f32_parameters(const double* scale, const double* zero_point, Py_ssize_t n,
                                         const QuantizePlan* p, float* divisor, int32_t* zero_int,
                                         float* zero_float) noexcept nogil:
    # What the `_vary` loops compute per element from scale[i] and zero_point[i], the same
    # expressions, once per parameter.
    cdef float min_normal = p.dp32.scale_min_normal
    cdef float s
    cdef Py_ssize_t i
    if p.reciprocal:
        for i in range(n):
            s = flush_subnormal_f32(<float>scale[i], min_normal)
            divisor[i] = <float>1.0 / s
    else:
        for i in range(n):
            divisor[i] = flush_subnormal_f32(<float>scale[i], min_normal)
    if p.code_kind == CODE_INTEGER:
        for i in range(n):
            zero_int[i] = <int32_t>zero_point[i]
    else:
        for i in range(n):
            zero_float[i] = <float>zero_point[i]


cdef inline Py_ssize_t datapath_parameters_at(DatapathParameters* c, Py_ssize_t first, Py_ssize_t n,
                                              Py_ssize_t n_params, const QuantizePlan* p) noexcept nogil:
    # Where parameter `first` is in the window, with [first, first + n) converted
    # (n <= DATAPATH_PARAMETERS); a miss converts the window from `first` on.
    if first < c.first or first + n > c.first + c.count:
        c.first = first
        c.count = min(<Py_ssize_t>DATAPATH_PARAMETERS, n_params - first)
        datapath_f32_parameters(p.scale + first, p.zero_point + first, c.count, p, c.divisor,
                                c.zero.as_int, c.zero.as_float)
    return first - c.first


cdef inline const uint32_t* words_at(const QuantizePlan* p, Py_ssize_t element) noexcept nogil:
    # The random word of x's element `element` (the call's whole x): its own, wherever the
    # element lands in a buffer.
    return p.random_bits + element if p.random_bits != NULL else NULL


cdef inline void datapath_flush(const float* x, code_storage_t* y, Py_ssize_t start,
                                DatapathPending* b, const QuantizePlan* p) noexcept nogil:
    if b.count:
        run_datapath_f32_buffered(x + b.start, y + (b.start - start), b.count, b.divisor, b.zero.as_int,
                                  b.zero.as_float, words_at(p, b.start), p)
        b.count = 0


cdef inline void spread_blocks(DatapathPending* b, const DatapathParameters* w, Py_ssize_t at,
                               Py_ssize_t n_blocks, Py_ssize_t block_size, bint integer_codes) noexcept nogil:
    # Each block's converted parameters copied to each of its elements. Inlined with a
    # constant block_size (spread_whole_blocks): straight vector stores per block.
    cdef Py_ssize_t j, k
    cdef float divisor, zero_float
    cdef int32_t zero_int
    if integer_codes:
        for j in range(n_blocks):
            divisor = w.divisor[at + j]
            zero_int = w.zero.as_int[at + j]
            for k in range(j * block_size, (j + 1) * block_size):
                b.divisor[k] = divisor
                b.zero.as_int[k] = zero_int
    else:
        for j in range(n_blocks):
            divisor = w.divisor[at + j]
            zero_float = w.zero.as_float[at + j]
            for k in range(j * block_size, (j + 1) * block_size):
                b.divisor[k] = divisor
                b.zero.as_float[k] = zero_float


cdef inline void spread_whole_blocks(DatapathPending* b, const DatapathParameters* w, Py_ssize_t at,
                                     Py_ssize_t n_blocks, Py_ssize_t block_size,
                                     bint integer_codes) noexcept nogil:
    # block_size is one of whole_block_size's
    if block_size == 16:
        spread_blocks(b, w, at, n_blocks, 16, integer_codes)
    elif block_size == 32:
        spread_blocks(b, w, at, n_blocks, 32, integer_codes)
    elif block_size == 64:
        spread_blocks(b, w, at, n_blocks, 64, integer_codes)
    else:
        spread_blocks(b, w, at, n_blocks, 128, integer_codes)


cdef inline void quantize_datapath_f32_whole_blocks(const float* x, code_storage_t* y, Py_ssize_t start,
                                                    Py_ssize_t end, DatapathParameters* window,
                                                    DatapathPending* pending, const QuantizePlan* p) noexcept nogil:
    # Blocked along the last axis with whole_blocks(): every piece of DATAPATH_PIECE elements
    # from a task's start (a multiple of 4096) holds whole blocks, the parameters of
    # element i are those of block i // block_size, consecutive from piece to piece.
    cdef Py_ssize_t n_params = layout_parameters(&p.layout)
    cdef Py_ssize_t block_size = p.layout.block_size
    cdef Py_ssize_t piece = start
    cdef Py_ssize_t piece_end, n_blocks, at
    cdef bint integer_codes = p.code_kind == CODE_INTEGER
    while piece < end:
        piece_end = min(piece + <Py_ssize_t>DATAPATH_PIECE, end)
        n_blocks = (piece_end - piece) // block_size
        at = datapath_parameters_at(window, piece // block_size, n_blocks, n_params, p)
        spread_whole_blocks(pending, window, at, n_blocks, block_size, integer_codes)
        run_datapath_f32_buffered(x + piece, y + (piece - start), piece_end - piece, pending.divisor,
                                  pending.zero.as_int, pending.zero.as_float, words_at(p, piece), p)
        piece = piece_end


cdef inline void quantize_datapath_f32(const float* x, code_storage_t* y, Py_ssize_t start,
                                       Py_ssize_t end, const QuantizePlan* p) noexcept nogil:
    # Elements [start, end) into y[0 : end - start] on a plan with FEED_BUFFERED (see above).
    cdef DatapathParameters window
    cdef DatapathPending pending
    cdef Cursor c
    cdef Segment seg
    cdef Py_ssize_t n_params = layout_parameters(&p.layout)
    cdef Py_ssize_t done, n, e, at, o, k
    cdef float divisor, zero_float
    cdef int32_t zero_int
    cdef bint integer_codes = p.code_kind == CODE_INTEGER
    window.first = 0
    window.count = 0
    if p.layout.granularity == BLOCKED and whole_blocks(&p.layout):
        quantize_datapath_f32_whole_blocks(x, y, start, end, &window, &pending, p)
        return
    pending.start = start
    pending.count = 0
    cursor_at(&p.layout, start, end, &c)
    while next_segment(&p.layout, &c, &seg):
        done = 0
        while done < seg.length:
            n = min(seg.length - done, <Py_ssize_t>DATAPATH_PIECE)
            e = seg.start + done
            if n >= DATAPATH_DIRECT_RUN:
                datapath_flush(x, y, start, &pending, p)
                if seg.params_vary:
                    at = datapath_parameters_at(&window, seg.param_index + done, n, n_params, p)
                    run_datapath_f32_buffered(x + e, y + (e - start), n, window.divisor + at,
                                              window.zero.as_int + at, window.zero.as_float + at,
                                              words_at(p, e), p)
                else:
                    run_datapath_f32(x + e, y + (e - start), n, p.scale + seg.param_index,
                                     p.zero_point + seg.param_index, False, words_at(p, e), p)
            else:
                if pending.count + n > DATAPATH_PIECE:
                    datapath_flush(x, y, start, &pending, p)
                if pending.count == 0:
                    pending.start = e
                o = pending.count
                if seg.params_vary:
                    at = datapath_parameters_at(&window, seg.param_index + done, n, n_params, p)
                    for k in range(n):
                        pending.divisor[o + k] = window.divisor[at + k]
                    if integer_codes:
                        for k in range(n):
                            pending.zero.as_int[o + k] = window.zero.as_int[at + k]
                    else:
                        for k in range(n):
                            pending.zero.as_float[o + k] = window.zero.as_float[at + k]
                else:
                    at = datapath_parameters_at(&window, seg.param_index, 1, n_params, p)
                    divisor = window.divisor[at]
                    for k in range(n):
                        pending.divisor[o + k] = divisor
                    if integer_codes:
                        zero_int = window.zero.as_int[at]
                        for k in range(n):
                            pending.zero.as_int[o + k] = zero_int
                    else:
                        zero_float = window.zero.as_float[at]
                        for k in range(n):
                            pending.zero.as_float[o + k] = zero_float
                pending.count += n
            done += n
    datapath_flush(x, y, start, &pending, p)


# The float32-remainder staging (QUOTIENT64_REMAINDER plans) fed as the float32 loops
# are. With the general cursor's pieces it took a run_datapath_wide call per 32-element
# block (a copy of the plan, a stage and a float32 loop call each) and, with per-element
# scales, a double scale read, converted, flushed and lane-checked per element. Here:
# - the scales are converted once per parameter into a window (the float32 scale
#   flushed: the remainder loop's divisor; the zero point as the float32 loops read it),
#   and their lane (a normal below 2**48 after the flush, docs/semantics.md "Staged
#   quotients") is checked there too, one flag per parameter, ORed over a piece's
#   parameters only when the window holds an unsafe one;
# - the pieces are quantize_datapath_f32's: runs of DATAPATH_DIRECT_RUN or more with
#   per-element parameters straight from the window, shorter runs gathered into a
#   DatapathPending piece, whole blocks spread (only the divisors where the zero points
#   are one value);
# - each piece is staged by stage_buffered (the remainder loop on the divisors, or the
#   double loop when an element or a scale of the piece is outside the lanes), then
#   finished by a float32 loop with the unit plan: the `_one` loop on a unit scale where
#   the piece's zero points are one value (bit for bit: +0 and -0 differ), as the per
#   tensor staging is, else the buffered loop on unit divisors and the piece's zero points.
#   The `_one` loop reads no parameter per element: the layouts quantized symmetrically
#   (zero points 0, and every float8 output) cost what a per-tensor call costs.
# Runs of one scale of DATAPATH_DIRECT_RUN or more (per tensor, per axis along an outer
# axis) stay on run_datapath_wide as before, with the unit plan made once per task.

cdef struct StagedParameters:
    # A DatapathParameters window whose divisors are the flushed float32 scales; whether
    # each parameter's scale is outside the remainder loops' lane; whether the window's
    # zero points are one value, bit for bit (then zero_value is it, as a double).
    DatapathParameters w
    bint any_unsafe
    bint uniform
    double zero_value
    uint8_t unsafe[DATAPATH_PARAMETERS]


cdef inline void staged_parameters(Py_ssize_t first, Py_ssize_t n, const QuantizePlan* p,
                                   StagedParameters* c) noexcept nogil:
    # Parameters [first, first + n) of the call's float32 scales and int32 or float32 zero
    # points (call_plan: FEED_STAGED plans take the float32 paths' arrays, exact for the
    # float32-valued scales these plans have): the scale as stage_remainder_*_vary reads
    # it (float32, flushed) and its lane check, once per parameter (a NaN or inf scale's
    # bits are above REMAINDER_S_END, a zero's below REMAINDER_S_MIN), the zero points as
    # the float32 loops read them.
    cdef float min_normal = p.dp32.scale_min_normal
    cdef const float* scale = p.scale32 + first
    cdef const int32_t* zero_int = p.zero_point_int + first
    cdef const float* zero_float = p.zero_point32 + first
    cdef float s
    cdef uint32_t a, differ = 0
    cdef uint8_t u, bad = 0
    cdef Py_ssize_t i
    for i in range(n):
        s = flush_subnormal_f32(scale[i], min_normal)
        c.w.divisor[i] = s
        a = float_bits(s) & 0x7FFFFFFF
        u = (a < <uint32_t>REMAINDER_S_MIN) | (a >= <uint32_t>REMAINDER_S_END)
        c.unsafe[i] = u
        bad |= u
    c.any_unsafe = bad
    if p.code_kind == CODE_INTEGER:
        for i in range(n):
            c.w.zero.as_int[i] = zero_int[i]
            differ |= <uint32_t>(zero_int[i] ^ zero_int[0])
        c.zero_value = <double>zero_int[0]
    else:
        for i in range(n):
            c.w.zero.as_float[i] = zero_float[i]
            differ |= float_bits(zero_float[i]) ^ float_bits(zero_float[0])
        c.zero_value = <double>zero_float[0]
    c.uniform = differ == 0


cdef inline Py_ssize_t staged_parameters_at(StagedParameters* c, Py_ssize_t first, Py_ssize_t n,
                                            Py_ssize_t n_params, const QuantizePlan* p) noexcept nogil:
    # datapath_parameters_at for the staged window.
    if first < c.w.first or first + n > c.w.first + c.w.count:
        c.w.first = first
        c.w.count = min(<Py_ssize_t>DATAPATH_PARAMETERS, n_params - first)
        staged_parameters(first, c.w.count, p, c)
    return first - c.w.first


cdef inline bint staged_unsafe(const StagedParameters* c, Py_ssize_t at, Py_ssize_t n) noexcept nogil:
    # Whether a scale among the window's [at, at + n) is outside the lane.
    cdef Py_ssize_t k
    cdef uint8_t bad = 0
    if not c.any_unsafe:
        return False
    for k in range(at, at + n):
        bad |= c.unsafe[k]
    return bad != 0


cdef inline void staged_piece(const x_storage_t* x, code_storage_t* y, Py_ssize_t n, const float* divisor,
                              const int32_t* zero_int, const float* zero_float, bint zero_one,
                              double zero_value, bint scale_unsafe, float* widened, float* staged,
                              const QuantizePlan* p, const QuantizePlan* unit) noexcept nogil:
    # zero_one: the piece's zero points are all zero_value (the `_one` loop), else the
    # buffered loop reads them per element. Integer codes with one zero point: the fused
    # loop (stage_round), one pass, and the two passes again where it refuses the piece.
    cdef const float* source
    cdef int32_t refused = 1
    if x_storage_t is not int32_t:
        if zero_one and not scale_unsafe and fused_staging_enabled:
            if x_storage_t is uint16_t:
                if p.x_format == FMT_FLOAT16:
                    widen_float16(x, widened, n)
                else:
                    widen_bfloat16(x, widened, n)
                source = widened
            else:
                source = x
            if p.code_kind == CODE_INTEGER:
                refused = stage_round(source, y, n, divisor, <int32_t>zero_value, p)
            elif code_storage_t is uint8_t:
                refused = stage_round_small_float(source, y, n, divisor, <float>zero_value, p)
            if refused == 0:
                count_quotient64(0)
                count_fused()
                return
            scale_unsafe = True  # refused: the double loop (stage_buffered counts it)
    stage_buffered(x, widened, staged, n, divisor, scale_unsafe, p)
    if zero_one:
        run_datapath_f32(staged, y, n, UNIT_SCALES, &zero_value, False, NULL, unit)
    else:
        run_datapath_f32_buffered(staged, y, n, UNIT_DIVISORS, zero_int, zero_float, NULL, unit)


cdef inline void spread_divisors(float* out, const float* divisor, Py_ssize_t n_blocks,
                                 Py_ssize_t block_size) noexcept nogil:
    # spread_blocks for the divisors alone (inlined with a constant block_size)
    cdef Py_ssize_t j, k
    cdef float d
    for j in range(n_blocks):
        d = divisor[j]
        for k in range(j * block_size, (j + 1) * block_size):
            out[k] = d


cdef inline void spread_whole_divisors(float* out, const float* divisor, Py_ssize_t n_blocks,
                                       Py_ssize_t block_size) noexcept nogil:
    if block_size == 16:
        spread_divisors(out, divisor, n_blocks, 16)
    elif block_size == 32:
        spread_divisors(out, divisor, n_blocks, 32)
    elif block_size == 64:
        spread_divisors(out, divisor, n_blocks, 64)
    else:
        spread_divisors(out, divisor, n_blocks, 128)


cdef inline double staged_zero_value(const StagedParameters* c, Py_ssize_t at, bint integer_codes) noexcept nogil:
    return <double>c.w.zero.as_int[at] if integer_codes else <double>c.w.zero.as_float[at]


cdef inline void quantize_datapath_staged(const x_storage_t* x, code_storage_t* y, Py_ssize_t start,
                                          Py_ssize_t end, const QuantizePlan* p) noexcept nogil:
    # Elements [start, end) into y[0 : end - start] on a plan with FEED_STAGED (see above).
    cdef StagedParameters window
    cdef DatapathPending pending
    cdef QuantizePlan unit
    cdef float widened[DATAPATH_PIECE]
    cdef float staged[DATAPATH_PIECE]
    cdef Cursor c
    cdef Segment seg
    cdef Py_ssize_t n_params = layout_parameters(&p.layout)
    cdef Py_ssize_t block_size = p.layout.block_size
    cdef Py_ssize_t done, n, e, at, o, k, piece, piece_end, n_blocks
    cdef float divisor, zero_float
    cdef int32_t zero_int
    cdef bint integer_codes = p.code_kind == CODE_INTEGER
    cdef bint pending_unsafe = False
    cdef bint pending_uniform = False  # the gathered runs' zero points are all pending_zero
    cdef double pending_zero = 0.0
    cdef double run_zero, scale_one, zero_one
    cdef bint unsafe, run_uniform
    unit_plan(p, &unit)
    window.w.first = 0
    window.w.count = 0
    window.any_unsafe = False
    window.uniform = False
    window.zero_value = 0.0
    if p.layout.granularity == BLOCKED and whole_blocks(&p.layout):
        # quantize_datapath_f32_whole_blocks' pieces
        piece = start
        while piece < end:
            piece_end = min(piece + <Py_ssize_t>DATAPATH_PIECE, end)
            n_blocks = (piece_end - piece) // block_size
            at = staged_parameters_at(&window, piece // block_size, n_blocks, n_params, p)
            if window.uniform:
                spread_whole_divisors(pending.divisor, window.w.divisor + at, n_blocks, block_size)
            else:
                spread_whole_blocks(&pending, &window.w, at, n_blocks, block_size, integer_codes)
            staged_piece(x + piece, y + (piece - start), piece_end - piece, pending.divisor,
                         pending.zero.as_int, pending.zero.as_float, window.uniform, window.zero_value,
                         staged_unsafe(&window, at, n_blocks), widened, staged, p, &unit)
            piece = piece_end
        return
    pending.start = start
    pending.count = 0
    cursor_at(&p.layout, start, end, &c)
    while next_segment(&p.layout, &c, &seg):
        if not seg.params_vary and seg.length >= DATAPATH_DIRECT_RUN:
            # one scale: the `_one` staging as before, whole runs cut into its pieces
            if pending.count:
                staged_piece(x + pending.start, y + (pending.start - start), pending.count, pending.divisor,
                             pending.zero.as_int, pending.zero.as_float, pending_uniform, pending_zero, pending_unsafe,
                             widened, staged, p, &unit)
                pending.count = 0
            scale_one = <double>p.scale32[seg.param_index]
            if integer_codes:
                zero_one = <double>p.zero_point_int[seg.param_index]
            else:
                zero_one = <double>p.zero_point32[seg.param_index]
            run_datapath_wide_unit(x + seg.start, y + (seg.start - start), seg.length, &scale_one, &zero_one,
                                   False, NULL, p, &unit)
            continue
        done = 0
        while done < seg.length:
            n = min(seg.length - done, <Py_ssize_t>DATAPATH_PIECE)
            e = seg.start + done
            if pending.count and (n >= DATAPATH_DIRECT_RUN or pending.count + n > DATAPATH_PIECE):
                staged_piece(x + pending.start, y + (pending.start - start), pending.count, pending.divisor,
                             pending.zero.as_int, pending.zero.as_float, pending_uniform, pending_zero, pending_unsafe,
                             widened, staged, p, &unit)
                pending.count = 0
            if n >= DATAPATH_DIRECT_RUN:
                # per-element parameters (a shorter run of one scale is gathered below)
                at = staged_parameters_at(&window, seg.param_index + done, n, n_params, p)
                staged_piece(x + e, y + (e - start), n, window.w.divisor + at, window.w.zero.as_int + at,
                             window.w.zero.as_float + at, window.uniform, window.zero_value,
                             staged_unsafe(&window, at, n), widened, staged, p, &unit)
            else:
                o = pending.count
                if seg.params_vary:
                    at = staged_parameters_at(&window, seg.param_index + done, n, n_params, p)
                    unsafe = staged_unsafe(&window, at, n)
                    run_uniform = window.uniform
                    run_zero = window.zero_value
                    for k in range(n):
                        pending.divisor[o + k] = window.w.divisor[at + k]
                    if integer_codes:
                        for k in range(n):
                            pending.zero.as_int[o + k] = window.w.zero.as_int[at + k]
                    else:
                        for k in range(n):
                            pending.zero.as_float[o + k] = window.w.zero.as_float[at + k]
                else:
                    at = staged_parameters_at(&window, seg.param_index, 1, n_params, p)
                    unsafe = staged_unsafe(&window, at, 1)
                    run_uniform = True
                    run_zero = staged_zero_value(&window, at, integer_codes)
                    divisor = window.w.divisor[at]
                    for k in range(n):
                        pending.divisor[o + k] = divisor
                    if integer_codes:
                        zero_int = window.w.zero.as_int[at]
                        for k in range(n):
                            pending.zero.as_int[o + k] = zero_int
                    else:
                        zero_float = window.w.zero.as_float[at]
                        for k in range(n):
                            pending.zero.as_float[o + k] = zero_float
                if o == 0:
                    pending.start = e
                    pending_unsafe = unsafe
                    pending_uniform = run_uniform
                    pending_zero = run_zero
                else:
                    pending_unsafe = pending_unsafe | unsafe
                    pending_uniform = (pending_uniform and run_uniform
                                       and double_bits(run_zero) == double_bits(pending_zero))
                pending.count += n
            done += n
    if pending.count:
        staged_piece(x + pending.start, y + (pending.start - start), pending.count, pending.divisor,
                     pending.zero.as_int, pending.zero.as_float, pending_uniform, pending_zero, pending_unsafe,
                     widened, staged, p, &unit)


cdef inline void quantize_range(const x_storage_t* x, code_storage_t* y, Py_ssize_t start,
                                Py_ssize_t end, const QuantizePlan* p) noexcept nogil:
    # Elements [start, end) into y[0 : end - start], PREFETCH_BLOCK elements at a time,
    # each block prefetching x PREFETCH_AHEAD elements further on.
    cdef Cursor c
    cdef Segment seg
    cdef Py_ssize_t block = start
    if x_storage_t is float:
        if p.datapath_feed == FEED_BUFFERED:
            quantize_datapath_f32(x, y, start, end, p)
            return
    if x_storage_t is not int32_t:
        if p.datapath_feed == FEED_STAGED:
            quantize_datapath_staged(x, y, start, end, p)
            return
    if p.quotient64 == QUOTIENT64_REMAINDER:
        # The float32-remainder staging: whole runs, which run_datapath_wide cuts into its
        # pieces, with no prefetch burst: x is read in order, which the hardware
        # prefetchers handle, and the burst stalled the loop on its fill buffers (the
        # float32 datapath loops' buffered feeding measured the same: docs/performance.md).
        cursor_at(&p.layout, start, end, &c)
        while next_segment(&p.layout, &c, &seg):
            run_segment(x + seg.start, y + (seg.start - start), seg.length, seg.param_index,
                        seg.params_vary, seg.start, p)
        return
    # The start of a task is not prefetched by the block before it.
    prefetch(x + start, PREFETCH_AHEAD * sizeof(x_storage_t))
    if x_storage_t is float:
        if (p.path != PATH_GENERAL and p.layout.granularity == BLOCKED and p.layout.inner == 1
                and p.layout.block_size < PREFETCH_BLOCK):
            if whole_blocks(&p.layout):
                quantize_whole_blocks(x, y, start, end, p)
            else:
                quantize_last_axis_blocks(x, y, start, end, p)
            return
    if p.stream:
        # Runs with one scale each, streamed by stream_integer_codes, which prefetches its
        # input itself: no PREFETCH_BLOCK pieces, whose heads and tails would cut the
        # streamed lines every 512 elements.
        cursor_at(&p.layout, start, end, &c)
        while next_segment(&p.layout, &c, &seg):
            run_segment(x + seg.start, y + (seg.start - start), seg.length, seg.param_index,
                        seg.params_vary, seg.start, p)
        return
    cursor_at(&p.layout, start, start, &c)
    while block < end:
        c.end = min(block + <Py_ssize_t>PREFETCH_BLOCK, end)
        prefetch(x + block + PREFETCH_AHEAD, PREFETCH_BLOCK * sizeof(x_storage_t))
        while next_segment(&p.layout, &c, &seg):
            run_segment(x + seg.start, y + (seg.start - start), seg.length, seg.param_index,
                        seg.params_vary, seg.start, p)
        block = c.end


cdef inline void quantize_task(const x_storage_t* x, code_storage_t* y, const QuantizePlan* p,
                               Py_ssize_t task) noexcept nogil:
    cdef Py_ssize_t start = task * p.layout.task_size
    cdef Py_ssize_t end = min(start + p.layout.task_size, p.layout.size)
    quantize_range(x, y + start, start, end, p)
    if p.stream:
        stream_fence()


cdef inline void quantize_packed_task(const x_storage_t* x, uint8_t* packed, int bits,
                                      const QuantizePlan* p, Py_ssize_t task) noexcept nogil:
    # Quantize a cache-sized piece into a stack buffer, pack it, go on: the one-per-byte
    # codes never reach memory.
    cdef uint8_t buffer[PACK_BUFFER]
    cdef Py_ssize_t start = task * p.layout.task_size
    cdef Py_ssize_t end = min(start + p.layout.task_size, p.layout.size)
    cdef Py_ssize_t piece, piece_end
    piece = start
    while piece < end:
        piece_end = min(piece + <Py_ssize_t>PACK_BUFFER, end)
        quantize_range(x, buffer, piece, piece_end, p)
        pack_codes(buffer, piece_end - piece, packed + piece * bits // 8, bits)
        piece = piece_end


cdef void set_datapath_f32(DatapathF32* d, const QuantizePlan* p, int small_float_id) noexcept:
    cdef SmallFloatFormat f = small_float_format(small_float_id)
    # The minimum normals are powers of two, float32 values: the float compare is the
    # double one of datapath_quotient.
    d.x_min_normal = <float>p.x_min_normal if p.flush_inputs else <float>0.0
    d.scale_min_normal = <float>p.scale_min_normal if p.flush_inputs else <float>0.0
    d.lo = <int32_t>p.lo
    d.hi = <int32_t>p.hi
    d.mask = p.mask
    d.nan_override = p.nan_to_integer != DP_NAN_ZERO
    d.nan_code = d.hi if p.nan_to_integer == DP_NAN_MAX else d.lo
    d.shift = 23 - f.mantissa_bits
    d.min_normal_bits = (f.min_exponent + 127) << 23
    d.min_normal_code = 1 << f.mantissa_bits
    d.flush_outputs = p.flush_outputs


cdef int check_datapath_wide(int wide, const QuantizePlan* p, int small_float_id) except -1:
    # What each staging loop computes, and what the float32 loops after it encode (integer
    # codes, the ONNX small floats): see run_datapath_wide.
    cdef bint half_x = p.x_format in (FMT_FLOAT16, FMT_BFLOAT16)
    if wide == WIDE_NONE:
        return 0
    if wide not in (WIDE_X, WIDE_HALF, WIDE_F64):
        raise ValueError(f"datapath_wide {wide} is not a staging loop")
    if not p.datapath or p.datapath_f32 or (p.code_kind != CODE_INTEGER and small_float_id >= SF_COUNT):
        raise ValueError("datapath_wide needs a datapath off the float32 loops, into integers or an ONNX small float")
    if wide == WIDE_X and not (half_x and p.f32_operands and not p.float64_quotient
                               and (p.reciprocal or p.precision == FMT_FLOAT32)):
        raise ValueError("datapath_wide WIDE_X needs float16/bfloat16 x and a float32 quotient")
    if wide == WIDE_HALF and not (half_x and p.precision == p.x_format and not p.reciprocal
                                  and not p.float64_quotient):
        raise ValueError("datapath_wide WIDE_HALF needs x divided in its own float16/bfloat16 precision")
    if wide == WIDE_F64 and not (p.float64_quotient and p.rounding != DP_STOCHASTIC):
        raise ValueError("datapath_wide WIDE_F64 needs a float64 quotient and a rounding other than stochastic")
    return 0


cdef int check_quotient64(int quotient64, int wide, const QuantizePlan* p) except -1:
    # The float32-remainder staging reads float32 storage (float16/bfloat16 widened) and
    # float32-valued scales.
    if quotient64 not in (QUOTIENT64_DOUBLE, QUOTIENT64_REMAINDER):
        raise ValueError(f"quotient64 {quotient64} is not a float64 quotient staging")
    if quotient64 == QUOTIENT64_REMAINDER and not (wide == WIDE_F64 and p.f32_operands):
        raise ValueError("quotient64 QUOTIENT64_REMAINDER needs datapath_wide WIDE_F64 with "
                         "float32-valued x and scale (not int32 x)")
    return 0


cdef class QuantizeConfig:
    """How a QuantizeLinear plan computes: built once per plan (qemu_q/ops/quantize_linear.py),
    checked here, then passed to every call of the plan with its arrays. Keyword
    arguments only, so that no two integers can be swapped.

    x (flattened, C order) is viewed as outer x axis_len x inner; the scale and zero point
    hold one value per tensor, per axis index, or per block (outer x n_blocks x inner).
    `path` says which parameter arrays a call passes: float64 scale and zero point
    (PATH_GENERAL), float32 scale and int32 zero point (PATH_F32_INTEGER) or float32 both
    (PATH_F32_SMALL_FLOAT). Integer codes are clamped to [lo, hi] and masked with
    `mask`; small-float codes follow `small_float_id`, `saturate` and `small_float_rules`
    (SmallFloatRule flags: the rows of the Cast table in force); `code_bits` is the width
    of a code in the packed ONNX layout.
    """
    cdef QuantizePlan plan
    cdef readonly int code_bits

    def __init__(self, *, Py_ssize_t outer, Py_ssize_t axis_len, Py_ssize_t inner, int granularity,
                 Py_ssize_t block_size, int x_format, int precision, bint fast_divide, int code_kind,
                 long long lo, long long hi, int mask, int small_float_id, bint saturate,
                 int small_float_rules, int path, int code_bits, bint datapath=False,
                 int rounding=DP_HALF_EVEN, bint reciprocal=False, bint float64_quotient=False,
                 int nan_to_integer=DP_NAN_MIN, bint flush_inputs=False, bint flush_outputs=False,
                 double x_min_normal=0.0, double scale_min_normal=0.0, bint f32_operands=False,
                 bint datapath_f32=False, bint onnxruntime_float8=False,
                 int datapath_wide=WIDE_NONE,
                 int quotient64=QUOTIENT64_DOUBLE):
        cdef int clamp
        if granularity not in (PER_TENSOR, PER_AXIS, BLOCKED):
            raise ValueError(f"granularity {granularity} is not one of the layout's")
        if x_format not in (FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, FMT_INT32):
            raise ValueError(f"x_format {x_format} is not a value format")
        if precision not in (FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16):
            raise ValueError(f"precision {precision} is not a division precision")
        if code_kind not in (CODE_INTEGER, CODE_SMALL_FLOAT):
            raise ValueError(f"code_kind {code_kind} is not a code kind")
        if not valid_small_float_id(small_float_id):
            raise ValueError(f"small_float_id {small_float_id} is not a small-float format")
        if path not in (PATH_GENERAL, PATH_F32_INTEGER, PATH_F32_SMALL_FLOAT):
            raise ValueError(f"path {path} is not a quantize path")
        if (path != PATH_GENERAL and (x_format != FMT_FLOAT32 or not fast_divide)) or (
                path == PATH_F32_INTEGER and code_kind != CODE_INTEGER) or (
                path == PATH_F32_SMALL_FLOAT and code_kind != CODE_SMALL_FLOAT):
            raise ValueError(f"path {path} does not fit x_format {x_format} and code_kind {code_kind}")
        if path == PATH_F32_SMALL_FLOAT and code_bits > 8:
            raise ValueError("the float32 small-float path writes one byte per code")
        if code_kind == CODE_INTEGER and not (-32768 <= lo <= hi <= 65535):
            raise ValueError(f"integer range [{lo}, {hi}] is not one of a 16-bit code")
        if code_bits not in (2, 4, 6, 8, 16):
            raise ValueError(f"code_bits {code_bits} is not a code width")
        if outer < 0 or axis_len < 0 or inner < 0:
            raise ValueError("outer, axis_len and inner must be >= 0")
        if outer and inner and axis_len > (<Py_ssize_t>1 << 62) // outer // inner:
            raise ValueError("the layout has more than 2**62 elements")
        self.plan.layout = make_layout(outer * axis_len * inner, outer, axis_len, inner,
                                       granularity, block_size)
        check_layout(&self.plan.layout)
        self.plan.path = path
        self.plan.x_format = x_format
        self.plan.precision = precision
        self.plan.fast_divide = fast_divide
        self.plan.code_kind = code_kind
        self.plan.lo = <float>lo
        self.plan.hi = <float>hi
        self.plan.mask = mask
        if small_float_rules & ~(SF_RULE_NAN_SIGN | SF_RULE_FNUZ_INF_NAN | SF_RULE_NAN_OPPOSITE_ZERO):
            raise ValueError(f"small_float_rules {small_float_rules} holds unknown flags")
        self.plan.encoder = small_float32_encoder(small_float_id if code_kind != CODE_INTEGER else 0,
                                                  saturate, small_float_rules)
        self.plan.stream = False
        self.code_bits = code_bits
        if not 0 <= rounding <= DP_STOCHASTIC:
            raise ValueError(f"rounding {rounding} is not a datapath rounding")
        if nan_to_integer not in (DP_NAN_MIN, DP_NAN_ZERO, DP_NAN_MAX):
            raise ValueError(f"nan_to_integer {nan_to_integer} is not a datapath NaN rule")
        if datapath and path != PATH_GENERAL:
            raise ValueError("a datapath runs on the general path only")
        if not (x_min_normal >= 0.0 and scale_min_normal >= 0.0):
            raise ValueError("x_min_normal and scale_min_normal must be >= 0")
        self.plan.datapath = datapath
        self.plan.rounding = rounding if datapath else DP_HALF_EVEN
        self.plan.reciprocal = reciprocal
        self.plan.float64_quotient = float64_quotient
        self.plan.f32_operands = f32_operands and x_format != FMT_INT32
        self.plan.nan_to_integer = nan_to_integer
        self.plan.flush_inputs = flush_inputs
        self.plan.flush_outputs = flush_outputs
        self.plan.x_min_normal = x_min_normal
        self.plan.scale_min_normal = scale_min_normal
        self.plan.sf_mantissa_bits = small_float_format(
            small_float_id if code_kind != CODE_INTEGER else 0).mantissa_bits
        self.plan.sf_min_exponent = small_float_format(
            small_float_id if code_kind != CODE_INTEGER else 0).min_exponent
        # the ONNX formats' values lie below 2**20 (the bound they have always used), a
        # family format's below 2**(exponent of its max + 1)
        self.plan.sf_clamp_exponent = 20
        if code_kind != CODE_INTEGER and small_float_id >= SF_COUNT:
            frexp(small_float_format(small_float_id).max_finite, &clamp)
            self.plan.sf_clamp_exponent = clamp
        self.plan.random_bits = NULL
        # The float32 loops compute what datapath_quotient's float32 branches compute: float32
        # x (the loops read float storage), float32-valued scales, and the quotient, or the
        # reciprocal and product, in float32.
        if datapath_f32 and not (datapath and x_format == FMT_FLOAT32 and self.plan.f32_operands
                                 and not float64_quotient
                                 and (reciprocal or precision == FMT_FLOAT32)):
            raise ValueError("datapath_f32 needs a datapath with float32 x and scale and a float32 quotient")
        self.plan.datapath_f32 = datapath_f32
        # encode_float8_onnxruntime relies on the Cast-24 rows in the encoder and rounds
        # half to even itself, without a flush of its results.
        if onnxruntime_float8 and not (
                datapath and not datapath_f32 and datapath_wide == WIDE_NONE
                and code_kind == CODE_SMALL_FLOAT
                and small_float_id in (SF_E4M3FN, SF_E4M3FNUZ, SF_E5M2, SF_E5M2FNUZ)
                and small_float_rules == SF_RULE_NAN_SIGN and rounding == DP_HALF_EVEN
                and not flush_outputs):
            raise ValueError("onnxruntime_float8 needs the general datapath path into a float8 "
                             "type, the Cast-24 rows (small_float_rules=SF_RULE_NAN_SIGN), "
                             "rounding half_even and no flush of the outputs")
        self.plan.onnxruntime_float8 = onnxruntime_float8
        self.plan.small_float_id = small_float_id
        self.plan.saturate = saturate
        check_datapath_wide(datapath_wide, &self.plan, small_float_id)
        self.plan.datapath_wide = datapath_wide
        check_quotient64(quotient64, datapath_wide, &self.plan)
        self.plan.quotient64 = quotient64
        self.plan.datapath_feed = (FEED_BUFFERED if datapath_f32 else
                                   FEED_STAGED if quotient64 == QUOTIENT64_REMAINDER else FEED_PIECES)
        set_datapath_f32(&self.plan.dp32, &self.plan, small_float_id if code_kind != CODE_INTEGER else 0)

    @property
    def datapath_feed(self):
        """How the float32 datapath loops are fed: "whole blocks" (blocks of 16, 32, 64 or
        128 tiling the rows: quantize_datapath_f32_whole_blocks), "buffered"
        (quantize_datapath_f32: per tensor and the other per-axis and blocked layouts),
        "staged whole blocks" and "staged buffered" (the float32-remainder staging of float64
        quotients fed as those: quantize_datapath_staged), "pieces" (the general cursor: the
        scalar path, the other staged loops, set_datapath_feed(False) or
        set_quotient64_remainder(False))."""
        if self.plan.datapath_feed == FEED_PIECES or not datapath_feed_enabled:
            return "pieces"
        if self.plan.datapath_feed == FEED_STAGED:
            if not quotient64_remainder_enabled:
                return "pieces"
            if self.plan.layout.granularity == BLOCKED and whole_blocks(&self.plan.layout):
                return "staged whole blocks"
            return "staged buffered"
        if self.plan.layout.granularity == BLOCKED and whole_blocks(&self.plan.layout):
            return "whole blocks"
        return "buffered"

    @property
    def float32_parameters(self):
        """Whether a call passes the float32 paths' parameter arrays (float32 scales, int32
        zero points for integer codes, float32 for small floats) on this general-path plan:
        the float32-remainder staging's buffered feeding reads those (its scales are
        float32 values; converting half a million of them to float64 per call cost more
        than a blocked 32 layout's staging). Read at each call (the test hooks)."""
        return (self.plan.datapath_feed == FEED_STAGED and datapath_feed_enabled
                and quotient64_remainder_enabled)

    @property
    def quotient64(self):
        """How a float64 quotient is staged for the float32 loops: "float32 remainder"
        (stage_remainder, the double loop for the pieces it cannot take), "double"
        (stage_quotients), or None (no float64 quotient on the staged loops)."""
        if self.plan.datapath_wide != WIDE_F64:
            return None
        if self.plan.quotient64 == QUOTIENT64_REMAINDER and quotient64_remainder_enabled:
            return "float32 remainder"
        return "double"

    @property
    def stochastic(self):
        return self.plan.datapath and self.plan.rounding == DP_STOCHASTIC

    @property
    def path(self):
        return self.plan.path

    @property
    def size(self):
        return self.plan.layout.size


cdef struct QuantizeWork:
    # One call, as its tasks see it: the storage types of x and y by size, since a task
    # function cannot be fused (the runner calls it through a plain pointer).
    const void* x
    void* y
    int x_size                # sizeof the x storage: 4 float32 or int32 (x_format), 2
    int y_size                # sizeof the code storage: 1 or 2
    int bits                  # > 0: y is the packed output of codes this wide
    const QuantizePlan* plan


cdef inline void run_x_task(const x_storage_t* x, const QuantizeWork* w, Py_ssize_t task) noexcept nogil:
    if w.bits:
        quantize_packed_task(x, <uint8_t*>w.y, w.bits, w.plan, task)
    elif w.y_size == 1:
        quantize_task(x, <uint8_t*>w.y, w.plan, task)
    else:
        quantize_task(x, <uint16_t*>w.y, w.plan, task)


cdef void quantize_work_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const QuantizeWork* w = <const QuantizeWork*>work
    if w.x_size == 2:
        run_x_task(<const uint16_t*>w.x, w, task)
    elif w.plan.x_format == FMT_INT32:
        run_x_task(<const int32_t*>w.x, w, task)
    else:
        run_x_task(<const float*>w.x, w, task)


cdef int check_x_storage(int x_format, bint is_int32, bint is_uint16) except -1:
    # x must be stored as the config's x_format says: tasks pick the storage from it.
    if is_int32 != (x_format == FMT_INT32) or is_uint16 != (x_format in (FMT_FLOAT16, FMT_BFLOAT16)):
        raise ValueError(f"x's storage does not hold x_format {x_format}")
    return 0


cdef QuantizePlan call_plan(QuantizeConfig config, object scale, object zero_point,
                            object random_bits, Py_ssize_t size, Py_ssize_t streamed_bytes,
                            int n_threads) except *:
    # The plan of one call: the config's, with this call's parameter arrays checked
    # against the layout and attached, and its tasks sized.
    cdef QuantizePlan p = config.plan
    cdef Py_ssize_t needed = layout_parameters(&p.layout)
    if size != p.layout.size:
        raise ValueError(f"x has {size} elements; the config's layout has {p.layout.size}")
    if not datapath_feed_enabled:
        p.datapath_feed = FEED_PIECES
    if not quotient64_remainder_enabled:
        p.quotient64 = QUOTIENT64_DOUBLE
        if p.datapath_feed == FEED_STAGED:
            p.datapath_feed = FEED_PIECES
    p.scale, p.zero_point = NO_DOUBLE, NO_DOUBLE
    p.scale32, p.zero_point32, p.zero_point_int = NO_FLOAT, NO_FLOAT, NO_INT32
    # (config.float32_parameters: the staged feeding reads the float32 paths' arrays)
    if p.path == PATH_GENERAL and p.datapath_feed != FEED_STAGED:
        p.scale = float64_parameters(scale, needed, "scales")
        p.zero_point = float64_parameters(zero_point, needed, "zero points")
    else:
        p.scale32 = float32_parameters(scale, needed, "scales")
        if p.code_kind == CODE_INTEGER:
            p.zero_point_int = int32_parameters(zero_point, needed, "zero points")
        else:
            p.zero_point32 = float32_parameters(zero_point, needed, "zero points")
    p.random_bits = random_words(random_bits, config.stochastic, size, "")
    set_task_size(&p.layout, n_threads)
    # streamed_bytes: the size of an output written straight to y (0: a packed output,
    # built in an L1 buffer, is never streamed).
    p.stream = (HAVE_STREAM_CODES and p.path == PATH_F32_INTEGER
                and streamed_bytes >= STREAM_MIN_BYTES
                and (p.layout.granularity == PER_TENSOR or p.layout.inner > 1))
    return p


cdef int run_call(const x_storage_t[::1] x, object scale, object zero_point, void* y, int y_size,
                  int bits, QuantizeConfig config, Py_ssize_t streamed_bytes, int n_threads,
                  object random_bits) except -1:
    # What both entries do once their output is checked: x against the config, the
    # call's plan, the tasks.
    cdef QuantizePlan p
    cdef QuantizeWork work
    if config.plan.path != PATH_GENERAL and x_storage_t is not float:
        raise ValueError("the float32 paths take float32 x")
    check_x_storage(config.plan.x_format, x_storage_t is int32_t, x_storage_t is uint16_t)
    check_aligned(&x[0], sizeof(x_storage_t), "x")
    p = call_plan(config, scale, zero_point, random_bits, x.shape[0], streamed_bytes, n_threads)
    work.x = &x[0]
    work.y = y
    work.x_size = sizeof(x_storage_t)
    work.y_size = y_size
    work.bits = bits
    work.plan = &p
    with nogil:
        run_tasks(quantize_work_task, &work, layout_tasks(&p.layout), n_threads)
    return 0


def set_datapath_feed(bint enabled):
    """Test and benchmark hook: False feeds the float32 datapath loops the general cursor's
    pieces again (the feeding before quantize_datapath_f32), True (the default) the
    buffered feeding; the same bits either way. Returns the previous setting."""
    global datapath_feed_enabled
    previous = datapath_feed_enabled
    datapath_feed_enabled = enabled
    return previous


def set_quotient64_remainder(bint enabled):
    """Test and benchmark hook: False stages every float64 quotient with the double loop
    (stage_quotients), True (the default) lets QUOTIENT64_REMAINDER plans use the float32
    remainder loops; the same bits either way. Returns the previous setting."""
    global quotient64_remainder_enabled
    previous = quotient64_remainder_enabled
    quotient64_remainder_enabled = enabled
    return previous


def count_fused_pieces():
    """Test hook: the pieces the fused loop (stage_round) finished since the last call,
    counted while count_quotient64_pieces(True) has counting on (they are among its
    staged pieces too)."""
    counted = quotient64_pieces[2]
    quotient64_pieces[2] = 0
    return counted


def count_nearest_pieces():
    """Test hook: the pieces nearest_divide_one finished since the last call (integer
    codes of one scale in the nearest modes under a float64 divide), counted while
    count_quotient64_pieces(True) has counting on; they are neither staged nor fused."""
    counted = quotient64_pieces[3]
    quotient64_pieces[3] = 0
    return counted


def set_nearest_quotients(bint enabled):
    """Test and benchmark hook: False sends every piece that nearest_divide_one would
    write to the fused loop instead; True (the default) lets it write them from the
    float32 quotient. The same bits either way. Returns the previous setting."""
    global nearest_quotients_enabled
    previous = nearest_quotients_enabled
    nearest_quotients_enabled = enabled
    return previous


def set_fused_staging(bint enabled):
    """Test and benchmark hook: False stages every piece of the float32-remainder loops'
    buffered feeding into a buffer and rounds it in a second pass; True (the default) lets
    integer pieces with one zero point stage and round in one loop (stage_round). The same
    bits either way. Returns the previous setting."""
    global fused_staging_enabled
    previous = fused_staging_enabled
    fused_staging_enabled = enabled
    return previous


def count_quotient64_pieces(enabled=None):
    """Test hook: the pieces (of at most 512 elements) the float32-remainder loops staged
    and those they handed to the double loop since the last call, as (staged, fell_back);
    enabled=True/False turns the counting on or off (off by default)."""
    global quotient64_counting
    counts = (quotient64_pieces[0], quotient64_pieces[1])
    quotient64_pieces[0] = 0
    quotient64_pieces[1] = 0
    if enabled is not None:
        quotient64_counting = 1 if enabled else 0
    return counts


def quantize(const x_storage_t[::1] x, scale, zero_point, code_storage_t[::1] out,
             QuantizeConfig config not None, int n_threads, random_bits=None):
    """Quantize x (flattened, C order) into `out`, one code per element, as `config` says;
    scale and zero_point are the arrays of the config's path; random_bits (uint32, one per
    element) only for a stochastic datapath. The kernel allocates nothing."""
    cdef Py_ssize_t size = x.shape[0]
    if size == 0:
        return
    if out.shape[0] != size:
        raise ValueError(f"out has {out.shape[0]} elements; x has {size}")
    check_aligned(&out[0], sizeof(code_storage_t), "out")
    run_call(x, scale, zero_point, &out[0], sizeof(code_storage_t), 0, config,
             size * sizeof(code_storage_t), n_threads, random_bits)


def quantize_packed(const x_storage_t[::1] x, scale, zero_point, uint8_t[::1] out,
                    QuantizeConfig config not None, int n_threads, random_bits=None):
    """As `quantize`, with the codes of config.code_bits bits (2, 4 or 6) packed into `out`
    in the ONNX raw_data layout (ceil(n * bits / 8) bytes). A packed output is built in an
    L1 buffer, never streamed."""
    cdef Py_ssize_t size = x.shape[0]
    cdef int bits = config.code_bits
    if size == 0:
        return
    if bits not in (2, 4, 6):
        raise ValueError(f"packed codes are 2, 4 or 6 bits wide, not {bits}")
    if out.shape[0] != (size * bits + 7) // 8:
        raise ValueError(f"out has {out.shape[0]} bytes; {size} codes of {bits} bits take {(size * bits + 7) // 8}")
    run_call(x, scale, zero_point, &out[0], 1, bits, config, 0, n_threads, random_bits)
