# DequantizeLinear kernels: y = (x - zero_point) * scale, rounded once to the output type
# (which, from version 19 on, is also the precision of the multiplication).
#
# Codes come one per element, or packed in the ONNX layout (unpacked piece by piece into
# a stack buffer). Integer codes of 8 bits or fewer are decoded arithmetically (a
# sign-extending shift pair) so that the float32 loop vectorizes; small-float codes go
# through a 256-entry table.

import numpy as np

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.math cimport fabs, fabsf, fma, copysign, ldexp, isinf, INFINITY
from libc.float cimport FLT_MAX
from libc.stdint cimport int8_t, uint8_t, uint16_t, int16_t, int32_t, uint32_t, int64_t, uint64_t

from _codecs cimport (
    y_storage_t,
    SmallFloat32Decoder, small_float32_decoder, decode_small_float32, select_f32,
    FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, SF_COUNT, round_to_value_format, valid_small_float_id,
    pack_value_format, bits_float, exact_parts, round_exact_to_format, DP_HALF_EVEN, DP_HALF_AWAY,
    DP_HALF_UP, DP_HALF_DOWN, DP_TOWARD_ZERO, DP_DOWN, DP_UP, DP_TO_ODD, DP_STOCHASTIC,
    double_bits, bits_double, float_bits, select_i32, select_i64, select_f64, stochastic_carry_f64,
    product_residual_f32, product_overshoot_f32, quotient_rounded_to_odd,
    float16_bits_of_value, bfloat16_bits_of_value, flush_subnormal_f32, flush_subnormal_f64,
)
from _layout cimport (
    Layout, Segment, Cursor, PER_TENSOR, PER_AXIS, BLOCKED, make_layout, check_layout, set_task_size,
    layout_tasks, layout_parameters, cursor_at, next_segment, next_block_run,
)
from _tasks cimport run_tasks
from _subbyte cimport unpack_codes
from _memory cimport (
    stream_store, stream_fence, check_aligned, line_head, random_words, HAVE_STREAM, STREAM_MIN_BYTES,
    STREAM_PIECE,
    NO_DOUBLE, NO_FLOAT, float64_parameters, float32_parameters,
)

cdef enum:
    # Codes unpacked into a stack buffer before they are dequantized: a multiple of 8.
    UNPACK_BUFFER = 4096
    # Exact products staged in L1 between the datapath's two loops (4 KiB of doubles).
    DATAPATH_CHUNK = 512
    # Blocks along the last axis at most this long share the one-pass float32 loops'
    # pieces (datapath_fused_f32_range); longer ones take a call each.
    FUSED_SHARED_BLOCK = 128
    # The segments (runs of one scale, or of one scale per element) of a streamed output
    # at least this long are streamed from the one-pass loops' registers (fused_stream):
    # the partial 64-byte lines at their ends take plain stores.
    FUSED_STREAM_SEGMENT = 512


# What the datapath rounding loops read (DequantizePlan.round_fields).
cdef struct DatapathRounding:
    int32_t to_float32         # the product first rounded to float32 (scale_precision)
    int64_t min_exponent_bits  # the output's smallest normal exponent, as double bits
    double out_max             # the output's largest finite
    double flush_below         # the output's smallest normal (flush_outputs), else 0
    int32_t canonical_nan
    uint32_t nan_bits


# What the one-pass float32 loops read (fused_f32_*, DequantizePlan.fused).
cdef struct FusedF32:
    int code_shift             # integer codes in bytes: 32 - bits (see integer_code)
    SmallFloat32Decoder decoder  # subnormal_step 0 where the datapath flushes inputs
    Py_ssize_t block_size      # FUSED_BLOCKS: elements per scale


cdef enum:
    # The code kinds of the one-pass float32 loops (fused_f32_loop_for).
    FUSED_SBYTE = 0
    FUSED_UBYTE = 1
    FUSED_SWORD = 2
    FUSED_UWORD = 3
    FUSED_SMALL = 4
    FUSED_INT8 = 5
    FUSED_UINT8 = 6
    # Their parameter layouts: one scale and zero point, one per element, one per block.
    FUSED_ONE = 0
    FUSED_VARY = 1
    FUSED_BLOCKS = 2


include "_dequantize_datapath_loops.pxi"
# Cast's float32 -> float16 / bfloat16 datapath loops (run_cast_half), which round the
# float32 products of half_products_run
include "_cast_loops.pxi"


# Storage of DequantizeLinear's x: 8-bit codes of every kind (decoded through a 256-entry
# table, or arithmetically for integers), 16-bit integers, int32.
ctypedef fused dq_code_t:
    uint8_t
    uint16_t
    int32_t


# The parameters the staged datapath loop reads: float64, or float32 where the plan
# converted them so for the one-pass float32 loops (exact either way).
ctypedef fused param_t:
    float
    double


# The precision datapath_products forms its products in: double (exact for every code the
# fast datapath takes), or float32 where the caller knows each product is a float32
# (half_products_run).
ctypedef fused product_t:
    float
    double


cdef inline product_t flush_product(product_t v, product_t min_normal) noexcept nogil:
    if product_t is float:
        return flush_subnormal_f32(v, min_normal)
    else:
        return flush_subnormal_f64(v, min_normal)


cdef inline product_t select_product(bint condition, product_t if_true, product_t if_false) noexcept nogil:
    if product_t is float:
        return select_f32(condition, if_true, if_false)
    else:
        return select_f64(condition, if_true, if_false)


# Integer codes of 8 bits or fewer into float32, written with streaming stores straight
# from the registers (AVX2 and AVX-512 builds, on the vector types and QEMU_Q_V* macros of
# _dequantize_datapath_loops.pxi): the arithmetic of run_integer_bytes_f32, operation for
# operation (the code's bits moved to the top of an int32 and back, the conversion,
# x - zero_point, the product). Faster than computing into an L1 buffer and streaming that,
# which the outputs of 8 MiB or more that no register loop writes still do
# (docs/performance.md). The output is aligned to its elements (check_aligned), so the
# head before the first 64-byte line is a whole number of values.
cdef extern from *:
    """
    #if QEMU_Q_HAVE_FUSED_STREAM
    #define QEMU_Q_HAVE_STREAM_VALUES 1
    static inline __attribute__((always_inline)) void qemu_q_stream_integer_values_body(
            const uint8_t *x, float *y, Py_ssize_t n, const float *scale,
            const float *zero_point, const int params_vary, int shift, const int is_signed) {
        qemu_q_vf s = QEMU_Q_VSET_F32(scale[0]), z = QEMU_Q_VSET_F32(zero_point[0]);
        Py_ssize_t i;
        for (i = 0; i < n; i += QEMU_Q_LANES) {
            qemu_q_vu top = QEMU_Q_VLOAD_U8(x + i) << shift;
            qemu_q_vi code = (qemu_q_vi)(top >> shift);
            if (is_signed)
                code = (qemu_q_vi)top >> shift;
            if (params_vary) {
                s = QEMU_Q_VLOAD_F32(scale + i);
                z = QEMU_Q_VLOAD_F32(zero_point + i);
            }
            QEMU_Q_VSTREAM(y + i, (__builtin_convertvector(code, qemu_q_vf) - z) * s);
        }
    }
    /* n values (a multiple of 16) into y, 64-byte aligned; the parameters per element
       (params_vary) or one for all. */
    static inline void qemu_q_stream_integer_values(const uint8_t *x, float *y, Py_ssize_t n,
                                                    const float *scale, const float *zero_point,
                                                    int params_vary, int shift, int is_signed) {
        if (params_vary)
            is_signed ? qemu_q_stream_integer_values_body(x, y, n, scale, zero_point, 1, shift, 1)
                      : qemu_q_stream_integer_values_body(x, y, n, scale, zero_point, 1, shift, 0);
        else
            is_signed ? qemu_q_stream_integer_values_body(x, y, n, scale, zero_point, 0, shift, 1)
                      : qemu_q_stream_integer_values_body(x, y, n, scale, zero_point, 0, shift, 0);
    }
    #else
    #define QEMU_Q_HAVE_STREAM_VALUES 0
    static inline void qemu_q_stream_integer_values(const uint8_t *x, float *y, Py_ssize_t n,
                                                    const float *scale, const float *zero_point,
                                                    int params_vary, int shift, int is_signed) {
        (void)x; (void)y; (void)n; (void)scale; (void)zero_point; (void)params_vary;
        (void)shift; (void)is_signed;
    }
    #endif
    """
    void stream_integer_values "qemu_q_stream_integer_values" (
        const uint8_t* x, float* y, Py_ssize_t n, const float* scale, const float* zero_point,
        int params_vary, int shift, int is_signed) noexcept nogil
    enum: HAVE_STREAM_VALUES "QEMU_Q_HAVE_STREAM_VALUES"


cdef struct DequantizePlan:
    const float* table      # value of each 8-bit code
    bint integer_bytes      # 8-bit storage of an integer type: decode arithmetically
    bint small_float_bytes  # 8-bit storage of a small float: decode on the bits
    SmallFloat32Decoder decoder
    int code_shift          # 32 - bits: the code's bits are moved to the top of an int32 ...
    bint code_signed        # ... and back, arithmetically (signed) or logically (unsigned)
    bint signed16           # uint16_t storage holds int16
    bint small_float16      # uint16_t storage holds codes of a 9- to 16-bit family minifloat
    int out_format
    bint fast               # False forces the table and the general loops (tests)
    bint stream             # a large output: computed piecewise into L1, streamed out ...
    bint stream_direct      # ... or, integer bytes into float32, streamed from the registers
    Layout layout
    const double* scale
    const double* zero_point
    const float* scale32       # float32 copies, exact where the output is float32
    const float* zero_point32
    # qemu_q.Datapath, when it changes a step of DequantizeLinear: the datapath loop reads
    # these (float64 parameters, no fast loop).
    bint datapath
    int rounding               # DatapathRounding: the product into the output type
    bint product_rounded       # scale_precision wider than the output: the product is first
    int product_mantissa_bits  # rounded to nearest even to that precision
    int product_min_exponent
    double product_max
    bint flush_inputs
    bint flush_outputs
    bint canonical_nan
    double x_min_normal        # small-float codes below it (nonzero) are subnormal; 0: none
    double scale_min_normal
    int out_mantissa_bits
    int out_min_exponent
    double out_max
    uint32_t nan_bits          # the canonical NaN of the output format
    const uint32_t* random_bits  # one word per element of x (stochastic rounding), else NULL
    # The datapath's vectorized loops (8- and 16-bit integer codes, 8-bit small floats):
    # the exact products staged (datapath_products), then rounded by round_loop.
    bint fast_datapath
    # ... of which those into float16 / bfloat16 where every product of an 8-bit code and
    # a scale is a float32 (set by the caller, which knows the types): the products in
    # float32, rounded by Cast's loops (half_products_run)
    bint half_from_float32
    # ... or, 8-bit integer codes times a float32 scale (products of up to 32 bits), the
    # products rounded to odd at 24 bits (odd_products), rounded by the same loops but
    # stochastic's, which needs more of the dropped bits (half_products_run)
    bint half_odd_products
    CastSmallFloatDatapath half_cast  # their fields: no input flush (the codes' and the
    int32_t half_nan_keep             # scales' are the product's), the output flush; the NaN mask
    int32_t code_wrap          # added to a negative sign-extended code of an unsigned type
    datapath_round_loop round_loop
    DatapathRounding round_fields
    # float32 outputs of the fast datapath: one pass per mode, code kind and parameter
    # layout (fused_one, fused_vary, fused_blocks) on float32 parameters; the pieces those loops flag
    # go through datapath_products and round_loop (unless not fused_fallback: tests only).
    bint fused_f32
    bint fused_fallback
    fused_f32_loop fused_one
    fused_f32_loop fused_vary
    fused_f32_loop fused_blocks
    int fused_kind
    FusedF32 fused
    # ... and, for a streamed output of long segments (AVX2 and AVX-512 builds), the loop
    # of the mode and kind that streams each result from its register, reading
    # stream_fields
    bint fused_stream
    fused_stream_loop stream_loop
    FusedStreamFields stream_fields
    int stream_finish          # the result pass in the streamed loops: 1 flush, 2 canonical NaN
    bint stream_finite_only    # the streamed loop assumes finite products (integer codes, a
                               # mode that would hand back an infinite or NaN one)
    # stochastic rounding: the streamed loop for calls whose every nonzero product of finite
    # codes is at least 2**-103 and below 2**127 in magnitude (NULL for the other modes)
    fused_stream_loop stream_carry_loop


cdef inline float code_value(dq_code_t c, const float* table, bint signed16) noexcept nogil:
    if dq_code_t is uint8_t:
        return table[c]
    elif dq_code_t is uint16_t:
        return <float>(<int16_t>c) if signed16 else <float>c
    else:
        return <float>c  # unused: int32 codes take the exact path


cdef inline int32_t integer_code(uint8_t c, int shift, bint signed) noexcept nogil:
    # The value of a `32 - shift`-bit integer code stored in a byte (bits above it ignored,
    # as ml_dtypes does): shifted to the top of an int32 and back.
    cdef uint32_t top = (<uint32_t>c) << shift
    if signed:
        return (<int32_t>top) >> shift
    return <int32_t>(top >> shift)


cdef inline float dequantize_int32(int32_t c, double scale, double zero_point, int out_format) noexcept nogil:
    # x - zero_point needs 33 bits; times a 24-bit scale that can exceed the 53 bits of a
    # double, so the product's rounding error is recovered with an FMA and breaks ties.
    cdef double d = <double>(<int64_t>c - <int64_t>zero_point)
    cdef double product = d * scale
    cdef double error = 0.0
    if fabs(d) >= 536870912.0:  # 2**29: below it the product is exact
        error = fma(d, scale, -product)
    return round_to_value_format(product, error, out_format)


cdef inline void store(y_storage_t* y, Py_ssize_t i, float v, int out_format) noexcept nogil:
    if y_storage_t is float:
        y[i] = v
    else:
        y[i] = pack_value_format(v, out_format)


cdef inline void run_integer_bytes_f32_streamed(const uint8_t* x, float* y, Py_ssize_t n,
                                                const float* scale, const float* zero_point,
                                                bint params_vary, int shift, bint signed) noexcept nogil:
    # As run_integer_bytes_f32, the whole 64-byte lines of y written by stream_integer_values.
    cdef Py_ssize_t head = min(n, line_head(y, sizeof(float)))
    cdef Py_ssize_t lines = (n - head) // 16 * 16
    cdef Py_ssize_t k = head if params_vary else 0
    cdef Py_ssize_t t = head + lines if params_vary else 0
    run_integer_bytes_f32(x, y, head, scale, zero_point, params_vary, shift, signed)
    stream_integer_values(x + head, y + head, lines, scale + k, zero_point + k, params_vary,
                          shift, signed)
    run_integer_bytes_f32(x + head + lines, y + head + lines, n - head - lines, scale + t,
                          zero_point + t, params_vary, shift, signed)


cdef inline void run_integer_bytes_f32(const uint8_t* x, float* y, Py_ssize_t n, const float* scale,
                                       const float* zero_point, bint params_vary, int shift,
                                       bint signed) noexcept nogil:
    # Integer codes of 8 bits or fewer, float32 output: x - zero_point is an exact small
    # integer and its float32 product with a float32 scale is the correctly rounded exact
    # product. No NaN can come from the code.
    cdef Py_ssize_t i
    cdef float s, z
    if params_vary:
        if signed:
            for i in range(n):
                y[i] = (<float>integer_code(x[i], shift, True) - zero_point[i]) * scale[i]
        else:
            for i in range(n):
                y[i] = (<float>integer_code(x[i], shift, False) - zero_point[i]) * scale[i]
    else:
        s = scale[0]
        z = zero_point[0]
        if signed:
            for i in range(n):
                y[i] = (<float>integer_code(x[i], shift, True) - z) * s
        else:
            for i in range(n):
                y[i] = (<float>integer_code(x[i], shift, False) - z) * s


cdef inline void run_small_float_bytes_f32(const uint8_t* x, float* y, Py_ssize_t n, const float* scale,
                                          const float* zero_point, bint params_vary,
                                          const SmallFloat32Decoder* decoder) noexcept nogil:
    # Small-float codes decoded on the bits; x - zero_point (a +-0) and the product are
    # exact or correctly rounded in float32. A NaN code wins over a NaN scale: the
    # select is on the decoded value, written branch-free so that the loop vectorizes.
    cdef SmallFloat32Decoder dec = decoder[0]
    cdef Py_ssize_t i
    cdef float s, z, d
    if params_vary:
        for i in range(n):
            d = decode_small_float32(x[i], &dec) - zero_point[i]
            y[i] = select_f32(d == d, d * scale[i], d)
    else:
        s = scale[0]
        z = zero_point[0]
        for i in range(n):
            d = decode_small_float32(x[i], &dec) - z
            y[i] = select_f32(d == d, d * s, d)


cdef inline double datapath_value(double d, double s, uint32_t random_word,
                                  const DequantizePlan* p) noexcept nogil:
    # (x - zero_point) * scale as the datapath forms it (docs/semantics.md, "Datapath
    # options"): d = x - zero_point and s exact (x already flushed), s flushed, the exact product rounded (to the
    # product precision first, when it is wider than the output), overflow to +-inf, the
    # output flushed. Zeros, infinities and NaNs are IEEE products: nothing to round.
    cdef uint64_t md, ms
    cdef int kd, ks
    cdef bint negative
    cdef double r
    if p.flush_inputs and fabs(s) < p.scale_min_normal:
        s = copysign(0.0, s)
    if d != d:
        return d  # a NaN code wins over a NaN scale, as on the ONNX path
    if d == 0.0 or s == 0.0 or isinf(d) or isinf(s) or s != s:
        return d * s
    negative = (d < 0.0) != (s < 0.0)
    exact_parts(d, &md, &kd)
    exact_parts(s, &ms, &ks)
    md = md * ms  # at most 34 + 24 bits
    kd = kd + ks
    if p.product_rounded:
        r = round_exact_to_format(md, kd, negative, p.product_mantissa_bits, p.product_min_exponent,
                                  DP_HALF_EVEN, 0)
        if r > p.product_max:
            return -INFINITY if negative else INFINITY
        if r == 0.0:  # below half the precision's smallest subnormal
            return -0.0 if negative else 0.0
        exact_parts(r, &md, &kd)
    r = round_exact_to_format(md, kd, negative, p.out_mantissa_bits, p.out_min_exponent,
                              p.rounding, random_word)
    if r > p.out_max:
        r = INFINITY
    elif p.flush_outputs and r < ldexp(1.0, p.out_min_exponent):
        r = 0.0
    return -r if negative else r


cdef inline double datapath_code(dq_code_t c, const DequantizePlan* p) noexcept nogil:
    if dq_code_t is uint8_t:
        return p.table[c]
    elif dq_code_t is uint16_t:
        if p.small_float16:
            # a 9- to 16-bit family minifloat: at most 15 significant bits, exact in float32
            return decode_small_float32(c, &p.decoder)
        return <double>(<int16_t>c) if p.signed16 else <double>c
    else:
        return <double>c


cdef inline void run_datapath(const dq_code_t* x, y_storage_t* y, Py_ssize_t n, Py_ssize_t param_index,
                              bint params_vary, Py_ssize_t first, const DequantizePlan* plan) noexcept nogil:
    # run_segment's loop for a datapath; first is the index of x[0] in the whole x (where
    # its random bits are).
    cdef DequantizePlan p = plan[0]
    cdef const double* scale = p.scale + param_index
    cdef const double* zero_point = p.zero_point + param_index
    cdef Py_ssize_t i, k
    cdef uint32_t word = 0
    cdef double c, v
    cdef float f
    for i in range(n):
        k = i if params_vary else 0
        if p.random_bits != NULL:
            word = p.random_bits[first + i]
        c = datapath_code(x[i], &p)
        # A subnormal code is read as a zero of its sign before the zero point (+-0) is
        # subtracted: -sub - (-0) is +0, as -0 - (-0) is.
        if p.flush_inputs and fabs(c) < p.x_min_normal:
            c = copysign(0.0, c)
        v = datapath_value(c - zero_point[k], scale[k], word, &p)
        if p.canonical_nan and v != v:
            if y_storage_t is float:
                y[i] = bits_float(p.nan_bits)
            else:
                y[i] = <uint16_t>p.nan_bits
            continue
        f = <float>v  # exact: a value of the output format, inf or NaN
        if y_storage_t is float:
            y[i] = f
        else:
            y[i] = pack_value_format(f, p.out_format)


cdef inline void datapath_products(const dq_code_t* x, product_t* products, Py_ssize_t n,
                                   const param_t* scale, const param_t* zero_point, bint params_vary,
                                   const DequantizePlan* p) noexcept nogil:
    # The first of the datapath's two loops: (x - zero_point) * scale, exact in double
    # (a code of at most 17 significant bits, or a small float of at most 8, times a
    # float32-exact scale; in float32 where the caller knows it is exact there), with
    # datapath_value's flushes of the code and the scale, and its IEEE results for zeros,
    # infinities and NaNs (a NaN code wins over a NaN scale: a select, the product's operand
    # order being the compiler's). The codes are decoded branch-free: sign-extended, plus
    # code_wrap where an unsigned code's top bit was set.
    cdef Py_ssize_t i
    cdef product_t scale_min = <product_t>p.scale_min_normal if p.flush_inputs else <product_t>0.0
    cdef float x_min = <float>p.x_min_normal if p.flush_inputs else <float>0.0
    cdef product_t s = flush_product(<product_t>scale[0], scale_min)
    cdef product_t z = <product_t>zero_point[0]
    cdef product_t d
    cdef int shift = p.code_shift
    cdef int32_t wrap = p.code_wrap
    cdef int32_t c
    cdef SmallFloat32Decoder dec = p.decoder
    if dq_code_t is int32_t:
        return  # not a fast datapath plan (the config refuses it)
    elif dq_code_t is uint8_t:
        if p.small_float_bytes:
            if params_vary:
                for i in range(n):
                    d = <product_t>flush_subnormal_f32(decode_small_float32(x[i], &dec), x_min) - <product_t>zero_point[i]
                    products[i] = select_product(d == d, d * flush_product(<product_t>scale[i], scale_min), d)
            else:
                for i in range(n):
                    d = <product_t>flush_subnormal_f32(decode_small_float32(x[i], &dec), x_min) - z
                    products[i] = select_product(d == d, d * s, d)
        elif params_vary:
            for i in range(n):
                c = integer_code(x[i], shift, True)
                c = c + ((c >> 31) & wrap)
                products[i] = (<product_t>c - <product_t>zero_point[i]) * flush_product(<product_t>scale[i], scale_min)
        else:
            for i in range(n):
                c = integer_code(x[i], shift, True)
                c = c + ((c >> 31) & wrap)
                products[i] = (<product_t>c - z) * s
    else:
        if params_vary:
            for i in range(n):
                c = <int16_t>x[i]
                c = c + ((c >> 31) & wrap)
                products[i] = (<product_t>c - <product_t>zero_point[i]) * flush_product(<product_t>scale[i], scale_min)
        else:
            for i in range(n):
                c = <int16_t>x[i]
                c = c + ((c >> 31) & wrap)
                products[i] = (<product_t>c - z) * s


cdef inline void finish_f32(float* y, Py_ssize_t n, float flush_below, bint canonical,
                            float nan) noexcept nogil:
    # What the one-pass loops leave to a second pass over the piece they wrote (in L1):
    # the result's flush (tininess after rounding: on the rounded value) and NaN code,
    # only where the datapath asks for them, so that the other options do not pay.
    # Both in one pass where both are asked for (a NaN is never flushed: it compares false).
    cdef Py_ssize_t i
    cdef float v
    if flush_below > 0 and canonical:
        for i in range(n):
            v = flush_subnormal_f32(y[i], flush_below)
            y[i] = select_f32(v != v, nan, v)
    elif flush_below > 0:
        for i in range(n):
            y[i] = flush_subnormal_f32(y[i], flush_below)
    elif canonical:
        for i in range(n):
            y[i] = select_f32(y[i] != y[i], nan, y[i])


cdef inline void round_products(const double* products, void* y, Py_ssize_t n, Py_ssize_t first,
                                const DequantizePlan* p) noexcept nogil:
    # The second loop: the mode's and output's, from the plan; first is the index of the
    # first product's element in the whole x (where its random word is).
    p.round_loop(products, y, n, p.random_bits + first if p.random_bits != NULL else NULL,
                 &p.round_fields)


cdef inline void fused_f32_plain(const dq_code_t* x, float* y, Py_ssize_t k, Py_ssize_t at,
                                 const float* scale, const float* zero_point, int layout,
                                 Py_ssize_t first_run, const DequantizePlan* p, float flush_below,
                                 bint canonical, float nan) noexcept nogil:
    # One piece of at most DATAPATH_CHUNK elements (the first one's index in the whole x:
    # at) through the one-pass loop of its parameter layout (FUSED_ONE, FUSED_VARY,
    # FUSED_BLOCKS: the piece's first first_run elements end the block of scale[0]); a
    # piece that loop flags (infinite or NaN products, tiny ones it cannot decide) is
    # recomputed by the staged loops, which take every product (a piece of blocks with its
    # parameters spread per element first, from the first_run offset).
    cdef double products[DATAPATH_CHUNK]
    cdef float scales[DATAPATH_CHUNK]
    cdef float zero_points[DATAPATH_CHUNK]
    cdef Py_ssize_t i
    cdef const uint32_t* words = p.random_bits + at if p.random_bits != NULL else NULL
    cdef fused_f32_loop loop = (p.fused_vary if layout == FUSED_VARY else
                                p.fused_blocks if layout == FUSED_BLOCKS else p.fused_one)
    cdef Py_ssize_t skipped
    cdef int32_t unsafe = loop(x, y, k, scale, zero_point, words, first_run, &p.fused)
    if unsafe and p.fused_fallback:
        if layout == FUSED_BLOCKS:
            skipped = p.fused.block_size - first_run
            for i in range(k):
                scales[i] = scale[(i + skipped) // p.fused.block_size]
                zero_points[i] = zero_point[(i + skipped) // p.fused.block_size]
            datapath_products(x, products, k, scales, zero_points, True, p)
        else:
            datapath_products(x, products, k, scale, zero_point, layout == FUSED_VARY, p)
        round_products(products, y, k, at, p)
    else:
        finish_f32(y, k, flush_below, canonical, nan)


cdef inline Py_ssize_t blocks_after(Py_ssize_t q, Py_ssize_t first_run, Py_ssize_t bs,
                                    Py_ssize_t* run) noexcept nogil:
    # Blocks of bs elements, the first one's first_run starting the piece: the block of
    # the piece's element q (its index from the first) and, in run, its elements from q on.
    if q < first_run:
        run[0] = first_run - q
        return 0
    run[0] = bs - (q - first_run) % bs
    return 1 + (q - first_run) // bs


cdef inline void fused_f32_piece(const dq_code_t* x, float* y, Py_ssize_t k, Py_ssize_t at,
                                 const float* scale, const float* zero_point, int layout,
                                 Py_ssize_t first_run, const DequantizePlan* p, float flush_below,
                                 bint canonical, float nan) noexcept nogil:
    # fused_f32_plain, or (p.fused_stream) its whole 64-byte lines of y by p.stream_loop,
    # the same bits streamed from the registers, and the partial lines at the ends by
    # fused_f32_plain. A piece the streamed loop flags is written again by fused_f32_plain,
    # after a fence (streaming stores are weakly ordered with the plain stores that replace
    # them).
    cdef Py_ssize_t head, lines, params, tail_params
    cdef Py_ssize_t run = 0
    cdef Py_ssize_t tail_run = 0
    cdef Py_ssize_t bs = p.fused.block_size
    cdef const uint32_t* words
    if not p.fused_stream:
        fused_f32_plain(x, y, k, at, scale, zero_point, layout, first_run, p, flush_below,
                        canonical, nan)
        return
    head = min(line_head(y, sizeof(float)), k)
    lines = (k - head) & ~(<Py_ssize_t>15)
    # the parameters of the lines' first element and of the tail's
    if layout == FUSED_BLOCKS:
        params = blocks_after(head, first_run, bs, &run)
        tail_params = blocks_after(head + lines, first_run, bs, &tail_run)
    else:
        params = head if layout == FUSED_VARY else 0
        tail_params = head + lines if layout == FUSED_VARY else 0
    if head:
        fused_f32_plain(x, y, head, at, scale, zero_point, layout, first_run, p, flush_below,
                        canonical, nan)
    if lines:
        words = p.random_bits + at + head if p.random_bits != NULL else NULL
        if p.stream_loop(x + head, y + head, lines, scale + params, zero_point + params, words,
                         &p.stream_fields, layout, bs, run, p.stream_finish) and p.fused_fallback:
            stream_fence()
            fused_f32_plain(x + head, y + head, lines, at + head, scale + params,
                            zero_point + params, layout, run, p, flush_below, canonical, nan)
    if head + lines < k:
        fused_f32_plain(x + head + lines, y + head + lines, k - head - lines, at + head + lines,
                        scale + tail_params, zero_point + tail_params, layout, tail_run, p,
                        flush_below, canonical, nan)


cdef inline bint shares_pieces(const Layout* L) noexcept nogil:
    # Short blocks along the last axis, gathered into the one-pass loops' pieces.
    return L.granularity == BLOCKED and L.inner == 1 and L.block_size <= <Py_ssize_t>FUSED_SHARED_BLOCK


cdef inline bint long_segments(const Layout* L) noexcept nogil:
    # The layout's segments (next_segment) hold FUSED_STREAM_SEGMENT elements or more.
    cdef Py_ssize_t length
    if L.granularity == PER_TENSOR:
        return True
    if L.inner > 1:
        length = L.inner
    elif L.granularity == PER_AXIS:
        length = L.axis_len
    else:
        length = L.block_size
    return length >= <Py_ssize_t>FUSED_STREAM_SEGMENT and not shares_pieces(L)


cdef inline bint products_stay_finite(const float* scale, Py_ssize_t n) noexcept nogil:
    # Every scale finite and below STREAM_FINITE_SCALE (2**110) in magnitude: times an
    # x - zero_point below 2**17 in magnitude (every integer code's; every finite
    # small-float code's, with zero points of +-0), every float32 product is below 2**127.
    cdef Py_ssize_t i
    cdef bint bounded = True
    for i in range(n):
        bounded = bounded & (fabsf(scale[i]) < STREAM_FINITE_SCALE)  # NaN compares false
    return bounded


cdef inline bint products_at_least(const DequantizePlan* p, Py_ssize_t n, double bound) noexcept nogil:
    # No nonzero product below bound (a power of two) in magnitude: every scale zero or at
    # least bound / d_min, d_min the smallest nonzero |x - zero_point| (1 for integer codes;
    # for small-float codes, with zero points of +-0 only, the smallest subnormal code, or
    # normal one where the inputs are flushed). A power of two over a power of two: exact.
    # At 2**-126 the output flush changes nothing (a result rounded from a product at or
    # above the smallest normal, itself a float32, is at or above it in every mode); 2**-103
    # is what the stochastic carry loops need.
    cdef Py_ssize_t i
    cdef double d_min = 1.0
    cdef float threshold
    cdef bint normal = True
    if p.small_float_bytes:
        for i in range(n):
            if p.zero_point32[i] != 0:
                return False
        d_min = p.x_min_normal if p.flush_inputs else <double>p.decoder.subnormal_step
        if not d_min > 0:
            return False
    threshold = <float>(bound / d_min)
    for i in range(n):
        normal = normal & ((p.scale32[i] == 0) | (fabsf(p.scale32[i]) >= threshold))
    return normal


cdef inline bint streamed_fused_layout(const DequantizePlan* p, const Layout* L) noexcept nogil:
    # Whether the one-pass float32 loops stream their results from the registers
    # (fused_stream) where the output is large: the build has the loops, and the layout's
    # segments are long, or its blocks of 16 or more tile the rows (the blocks loop).
    return (p.fused_f32 and p.stream_loop != NULL
            and (long_segments(L) or (shares_pieces(L) and whole_blocks(L) and L.block_size >= 16)))


cdef inline bint whole_blocks(const Layout* L) noexcept nogil:
    # ... in rows of whole blocks: the blocks loops (FUSED_BLOCKS) take them.
    return L.axis_len % L.block_size == 0


cdef inline void datapath_fused_f32_range(const dq_code_t* x, float* y, Py_ssize_t start,
                                          Py_ssize_t end, const DequantizePlan* p) noexcept nogil:
    # datapath_fast_range into float32: each segment in pieces of DATAPATH_CHUNK through
    # fused_f32_piece. Short blocks along the last axis (int4's 32) share a piece: their
    # scales and zero points spread into L1 rows, one per element, for the loop that reads
    # them per element (a call per block, with its reductions, vector tails and result
    # pass, took 1.5-1.8x the default; the bits are the same: the loops differ only in
    # where they read s and z).
    cdef float scales[DATAPATH_CHUNK]
    cdef float zero_points[DATAPATH_CHUNK]
    cdef Cursor c
    cdef Segment seg
    cdef Py_ssize_t offset, k, params, j
    cdef Py_ssize_t filled = 0
    cdef Py_ssize_t done = start
    cdef Py_ssize_t pos, bs, axis_len, in_row, in_block, block, piece, head
    cdef const float* scale32 = p.scale32
    cdef const float* zero_point32 = p.zero_point32
    cdef float sv, zv
    cdef float flush_below = <float>p.round_fields.flush_below
    # a NaN result comes from half_even's loops and from NaN small-float codes; the other
    # loops hand a NaN product of finite operands back
    cdef bint canonical = p.canonical_nan and (p.rounding == DP_HALF_EVEN or p.small_float_bytes)
    cdef float nan = bits_float(p.nan_bits)
    if dq_code_t is int32_t:
        return  # not a fast datapath plan (the config refuses it)
    cursor_at(&p.layout, start, end, &c)
    if shares_pieces(&p.layout):
        # Blocks in element order, each block's parameters the next ones (from one row to
        # the next too: next_block_run), stepped here on locals: the cursor's and plan's
        # fields, behind pointers that the float stores may alias (the build keeps
        # -fno-strict-aliasing), were stored and reloaded per block, as much work as the
        # loop's own.
        bs = p.layout.block_size
        axis_len = p.layout.axis_len
        in_row = c.j
        in_block = c.in_block
        block = c.row_block
        pos = start
        if whole_blocks(&p.layout):
            # Rows of whole blocks: the blocks loop (FUSED_BLOCKS) reads each block's scale
            # and zero point itself, on pieces ending on a block (spreading them per element
            # cost two stores per element, as much as the loop). A range starting inside a
            # block (the streamed pieces start on the output's lines) gives its first piece
            # that block's rest first, in the same call.
            head = bs - in_block
            piece = (<Py_ssize_t>DATAPATH_CHUNK // bs) * bs
            if p.fused_stream:
                # pieces ending on lines of y (the first one's end too), not on blocks
                piece = <Py_ssize_t>DATAPATH_CHUNK - 16 + line_head(y, sizeof(float))
            while pos < end:
                k = min(piece - bs + head if not p.fused_stream else piece, end - pos)
                fused_f32_piece(x + (pos - start), y + (pos - start), k, pos, scale32 + block,
                                zero_point32 + block, FUSED_BLOCKS, head, p, flush_below,
                                canonical, nan)
                pos += k
                block += blocks_after(k, head, bs, &head)
                piece = <Py_ssize_t>DATAPATH_CHUNK
            return
        while pos < end:
            k = min(min(bs - in_block, axis_len - in_row), min(end - pos, <Py_ssize_t>DATAPATH_CHUNK - filled))
            sv = scale32[block]
            zv = zero_point32[block]
            for j in range(k):
                scales[filled + j] = sv
                zero_points[filled + j] = zv
            filled += k
            pos += k
            in_row += k
            in_block += k
            if in_row == axis_len or in_block == bs:
                in_block = 0
                block += 1
                if in_row == axis_len:
                    in_row = 0
            if filled == DATAPATH_CHUNK:
                fused_f32_piece(x + (done - start), y + (done - start), filled, done, scales,
                                zero_points, FUSED_VARY, 0, p, flush_below, canonical, nan)
                done += filled
                filled = 0
        if filled:
            fused_f32_piece(x + (done - start), y + (done - start), filled, done, scales,
                            zero_points, FUSED_VARY, 0, p, flush_below, canonical, nan)
        return
    while next_segment(&p.layout, &c, &seg):
        offset = 0
        while offset < seg.length:
            k = min(seg.length - offset, <Py_ssize_t>DATAPATH_CHUNK)
            if p.fused_stream and offset == 0:
                # the first piece ends on a line of y: the next ones stream whole lines
                k = min(k, line_head(y + (seg.start - start), sizeof(float))
                        + <Py_ssize_t>DATAPATH_CHUNK - 16)
            params = seg.param_index + (offset if seg.params_vary else 0)
            fused_f32_piece(x + (seg.start + offset - start), y + (seg.start + offset - start), k,
                            seg.start + offset, p.scale32 + params, p.zero_point32 + params,
                            FUSED_VARY if seg.params_vary else FUSED_ONE, 0, p, flush_below,
                            canonical, nan)
            offset += k


cdef inline bint odd_products(const uint8_t* x, float* products, Py_ssize_t n, const double* scale,
                              const double* zero_point, bint params_vary,
                              const DequantizePlan* p) noexcept nogil:
    # 8-bit integer codes times float32 scales (p.half_odd_products): the exact product
    # P = d * s rounded to odd at 24 bits, from f = RN32(P) and its exact residual
    # e = P - f (docs/semantics.md, "float32 scales into float16 / bfloat16: products
    # rounded to odd"). e is exact for every finite f (a multiple of 2**-149 spanning at
    # most 9 bits); the odd step is quotient_rounded_to_odd's with P in place of the
    # quotient: |P| > |f| where e has f's sign. The scale's flush is datapath_products'.
    # Returns whether every f is finite; a piece with an infinite or NaN one (a NaN or
    # infinite scale, or a product beyond float32's range) is the caller's to redo.
    cdef Py_ssize_t i
    cdef float scale_min = <float>p.scale_min_normal if p.flush_inputs else <float>0.0
    cdef float s = flush_subnormal_f32(<float>scale[0], scale_min)
    cdef float z = <float>zero_point[0]
    cdef float d, f, si
    cdef int shift = p.code_shift
    cdef int32_t wrap = p.code_wrap
    cdef int32_t c
    cdef bint finite = True
    if params_vary:
        for i in range(n):
            c = integer_code(x[i], shift, True)
            c = c + ((c >> 31) & wrap)
            d = <float>c - <float>zero_point[i]
            si = flush_subnormal_f32(<float>scale[i], scale_min)
            f = d * si
            products[i] = quotient_rounded_to_odd(f, f, product_residual_f32(d, si, f))
            finite = finite & (fabsf(f) <= FLT_MAX)  # NaN compares false
    else:
        for i in range(n):
            c = integer_code(x[i], shift, True)
            c = c + ((c >> 31) & wrap)
            d = <float>c - z
            f = d * s
            products[i] = quotient_rounded_to_odd(f, f, product_residual_f32(d, s, f))
            finite = finite & (fabsf(f) <= FLT_MAX)
    return finite


cdef inline void half_products_run(const uint8_t* x, uint16_t* y, Py_ssize_t n, Py_ssize_t first,
                                  const double* scale, const double* zero_point, bint params_vary,
                                  const DequantizePlan* p) noexcept nogil:
    # Into float16 / bfloat16 where every product of a code and a scale is a float32
    # (p.half_from_float32: the caller's condition, that the code's and the scale's
    # significant bits fit in 24 and their last bits' product is at least 2**-149; a
    # product beyond float32's range is beyond the output's too): the products formed in
    # float32 by datapath_products (its input flushes and NaN order), in pieces of
    # DATAPATH_CHUNK, each rounded by Cast's loop of the mode (run_cast_half; the default's
    # is Cast's default conversion). The product being exact, its rounding to float32 or
    # float64 first (scale_precision) is itself, and Cast's rounding of a float32 value is
    # the datapath's of the exact product: the stochastic word's window is floor(frac *
    # 2**32) of the same dropped bits, a result beyond the largest finite is inf on the
    # rounded value, the output flush is on the rounded value, NaN keeps its sign and
    # payload's leading bits (or the canonical code). Double products and their rounding
    # on double vectors (round_products) took 2 ns an element.
    # p.half_odd_products: the products rounded to odd (odd_products) stand for the exact
    # ones, which no mode but stochastic tells apart; a piece odd_products hands back takes
    # the double products and their rounding.
    cdef float products[DATAPATH_CHUNK]
    cdef double exact[DATAPATH_CHUNK]
    cdef Py_ssize_t piece = 0
    cdef Py_ssize_t k
    cdef const uint32_t* words
    while piece < n:
        k = min(n - piece, <Py_ssize_t>DATAPATH_CHUNK)
        if not p.half_odd_products:
            datapath_products(x + piece, products, k, scale + (piece if params_vary else 0),
                              zero_point + (piece if params_vary else 0), params_vary, p)
        elif not odd_products(x + piece, products, k, scale + (piece if params_vary else 0),
                              zero_point + (piece if params_vary else 0), params_vary, p):
            datapath_products(x + piece, exact, k, scale + (piece if params_vary else 0),
                              zero_point + (piece if params_vary else 0), params_vary, p)
            round_products(exact, y + piece, k, first + piece, p)
            piece += k
            continue
        words = p.random_bits + first + piece if p.random_bits != NULL else NULL
        run_cast_half(products, y + piece, k, words, p.rounding, p.out_format == FMT_BFLOAT16,
                      &p.half_cast, p.half_nan_keep)
        piece += k


cdef inline void datapath_fast_range(const dq_code_t* x, y_storage_t* y, Py_ssize_t start,
                                     Py_ssize_t end, const DequantizePlan* p) noexcept nogil:
    # dequantize_range under a fast datapath: the segments' products gathered in chunks
    # of DATAPATH_CHUNK (short runs, such as blocks of 32, share one rounding loop call),
    # each chunk rounded into the contiguous y it covers.
    cdef double products[DATAPATH_CHUNK]
    cdef Cursor c
    cdef Segment seg
    cdef Py_ssize_t filled = 0
    cdef Py_ssize_t done = start
    cdef Py_ssize_t offset, k, params
    if y_storage_t is float:
        if p.fused_f32:
            datapath_fused_f32_range(x, y, start, end, p)
            return
    else:
        if dq_code_t is uint8_t:
            if p.half_from_float32 or p.half_odd_products:
                cursor_at(&p.layout, start, end, &c)
                while next_segment(&p.layout, &c, &seg):
                    half_products_run(x + (seg.start - start), y + (seg.start - start), seg.length,
                                      seg.start, p.scale + seg.param_index, p.zero_point + seg.param_index,
                                      seg.params_vary, p)
                return
    cursor_at(&p.layout, start, end, &c)
    while next_segment(&p.layout, &c, &seg):
        offset = 0
        while offset < seg.length:
            k = min(seg.length - offset, <Py_ssize_t>DATAPATH_CHUNK - filled)
            params = seg.param_index + (offset if seg.params_vary else 0)
            datapath_products(x + (seg.start + offset - start), products + filled, k,
                              p.scale + params, p.zero_point + params, seg.params_vary, p)
            filled += k
            offset += k
            if filled == DATAPATH_CHUNK:
                round_products(products, y + (done - start), filled, done, p)
                done += filled
                filled = 0
    if filled:
        round_products(products, y + (done - start), filled, done, p)


cdef inline void run_small_float16(const uint16_t* x, y_storage_t* y, Py_ssize_t n, const double* scale,
                                   const double* zero_point, bint params_vary,
                                   const SmallFloat32Decoder* decoder, int out_format) noexcept nogil:
    # Codes of a 9- to 16-bit family minifloat (qemu_q.minifloat_type): at most 15
    # significant bits, so x - zero_point (a +-0) and its product with a 24-bit scale are
    # exact in double, rounded once to the output type. A NaN code wins over a NaN scale.
    cdef SmallFloat32Decoder dec = decoder[0]
    cdef Py_ssize_t i, k
    cdef float d, v
    for i in range(n):
        k = i if params_vary else 0
        d = decode_small_float32(x[i], &dec) - <float>zero_point[k]
        v = round_to_value_format(<double>d * scale[k], 0.0, out_format) if d == d else d
        store(y, i, v, out_format)


cdef inline void run_segment(const dq_code_t* x, y_storage_t* y, Py_ssize_t n, Py_ssize_t param_index,
                             bint params_vary, Py_ssize_t first, const DequantizePlan* p) noexcept nogil:
    # Everything the loops need is read into locals first: stores through y (a character
    # type may alias anything) must not force reloads of the plan's fields.
    cdef const double* scale = p.scale + param_index
    cdef const double* zero_point = p.zero_point + param_index
    cdef const float* scale32 = p.scale32 + param_index
    cdef const float* zero_point32 = p.zero_point32 + param_index
    cdef const float* table = p.table
    cdef bint signed16 = p.signed16
    cdef int out_format = p.out_format
    cdef Py_ssize_t i, k
    cdef float d, v
    cdef float s = scale32[0]
    cdef float z = zero_point32[0]
    if p.datapath:
        run_datapath(x, y, n, param_index, params_vary, first, p)
        return
    if dq_code_t is int32_t:
        for i in range(n):
            k = i if params_vary else 0
            store(y, i, dequantize_int32(x[i], scale[k], zero_point[k], out_format), out_format)
        return
    if dq_code_t is uint16_t:
        if p.small_float16:
            run_small_float16(x, y, n, scale, zero_point, params_vary, &p.decoder, out_format)
            return
    if y_storage_t is float:
        if dq_code_t is uint8_t:
            if p.integer_bytes and p.fast:
                if p.stream_direct:
                    run_integer_bytes_f32_streamed(x, y, n, scale32, zero_point32, params_vary,
                                                   p.code_shift, p.code_signed)
                else:
                    run_integer_bytes_f32(x, y, n, scale32, zero_point32, params_vary, p.code_shift,
                                          p.code_signed)
                return
            if p.small_float_bytes and p.fast:
                run_small_float_bytes_f32(x, y, n, scale32, zero_point32, params_vary, &p.decoder)
                return
        # Codes and zero points below 2**17 and 4-bit-mantissa small floats make x - zp
        # exact in float32, and the float32 product of it with a float32 scale is the
        # correctly rounded exact product. A NaN code wins over a NaN scale, whatever
        # operand order the vectoriser picks.
        if params_vary:
            for i in range(n):
                d = code_value(x[i], table, signed16) - zero_point32[i]
                v = d * scale32[i]
                y[i] = v if d == d else d
        else:
            for i in range(n):
                d = code_value(x[i], table, signed16) - z
                v = d * s
                y[i] = v if d == d else d
        return
    # float16 / bfloat16 outputs: the exact product in double (at most 41 bits), rounded once.
    for i in range(n):
        k = i if params_vary else 0
        d = code_value(x[i], table, signed16) - <float>zero_point[k]
        v = round_to_value_format(<double>d * scale[k], 0.0, out_format) if d == d else d
        y[i] = pack_value_format(v, out_format)


cdef inline void dequantize_last_axis_blocks(const uint8_t* x, float* y, Py_ssize_t start,
                                             Py_ssize_t end, const DequantizePlan* p) noexcept nogil:
    # Blocked along the last axis, 8-bit codes decoded on the bits into float32: one short
    # run per block, one scale each, without the general segment's branches.
    cdef Cursor c
    cdef Segment run
    cursor_at(&p.layout, start, end, &c)
    while next_block_run(&p.layout, &c, &run):
        if p.integer_bytes:
            run_integer_bytes_f32(x + (run.start - start), y + (run.start - start), run.length,
                                  p.scale32 + run.param_index, p.zero_point32 + run.param_index,
                                  False, p.code_shift, p.code_signed)
        else:
            run_small_float_bytes_f32(x + (run.start - start), y + (run.start - start), run.length,
                                      p.scale32 + run.param_index, p.zero_point32 + run.param_index,
                                      False, &p.decoder)


cdef inline void dequantize_range(const dq_code_t* x, y_storage_t* y, Py_ssize_t start,
                                  Py_ssize_t end, const DequantizePlan* p) noexcept nogil:
    # Elements [start, end): codes read from x[0 : end - start], values written to
    # y[0 : end - start].
    cdef Cursor c
    cdef Segment seg
    if dq_code_t is not int32_t:
        if p.fast_datapath:
            datapath_fast_range(x, y, start, end, p)
            return
    if dq_code_t is uint8_t:
        if y_storage_t is float:
            if (p.fast and (p.integer_bytes or p.small_float_bytes) and p.layout.granularity == BLOCKED
                    and p.layout.inner == 1):
                dequantize_last_axis_blocks(x, y, start, end, p)
                return
    cursor_at(&p.layout, start, end, &c)
    while next_segment(&p.layout, &c, &seg):
        run_segment(x + (seg.start - start), y + (seg.start - start), seg.length,
                    seg.param_index, seg.params_vary, seg.start, p)


cdef inline void dequantize_streamed(const dq_code_t* x, y_storage_t* y, Py_ssize_t start,
                                     Py_ssize_t end, const DequantizePlan* p) noexcept nogil:
    # As dequantize_range, into y[start : end] through an L1-resident buffer streamed out
    # piece by piece (_memory.pxd). Not with p.stream_direct or p.fused_stream, which
    # would stream into the buffer. The first piece ends on a 64-byte line of y
    # (line_head), the others start on one: a line split between two pieces would take
    # plain stores for its ends (stream_store's head and tail) and streaming ones for the
    # rest, which costs as much again as the whole loop (numpy puts large arrays 16 bytes
    # past a page).
    cdef y_storage_t buffer[STREAM_PIECE]
    cdef Py_ssize_t piece = start
    cdef Py_ssize_t piece_end = start + line_head(y + start, sizeof(y_storage_t))
    if piece_end == start:
        piece_end = start + <Py_ssize_t>STREAM_PIECE
    while piece < end:
        piece_end = min(piece_end, end)
        dequantize_range(x + (piece - start), buffer, piece, piece_end, p)
        stream_store(y + piece, buffer, (piece_end - piece) * sizeof(y_storage_t))
        piece = piece_end
        piece_end = piece + <Py_ssize_t>STREAM_PIECE


cdef inline void dequantize_task(const dq_code_t* x, y_storage_t* y, const DequantizePlan* p,
                                 Py_ssize_t task) noexcept nogil:
    cdef Py_ssize_t start = task * p.layout.task_size
    cdef Py_ssize_t end = min(start + p.layout.task_size, p.layout.size)
    if p.stream_direct or p.fused_stream:
        dequantize_range(x + start, y + start, start, end, p)
        stream_fence()
    elif p.stream:
        dequantize_streamed(x + start, y, start, end, p)
        stream_fence()
    else:
        dequantize_range(x + start, y + start, start, end, p)


cdef inline void dequantize_packed_task(const uint8_t* packed, int bits, y_storage_t* y,
                                        const DequantizePlan* p, Py_ssize_t task) noexcept nogil:
    # Unpack a cache-sized piece into a stack buffer, dequantize it, go on: the
    # one-per-byte codes never reach memory.
    cdef uint8_t buffer[UNPACK_BUFFER]
    cdef Py_ssize_t start = task * p.layout.task_size
    cdef Py_ssize_t end = min(start + p.layout.task_size, p.layout.size)
    cdef Py_ssize_t piece, piece_end
    piece = start
    while piece < end:
        piece_end = min(piece + <Py_ssize_t>UNPACK_BUFFER, end)
        unpack_codes(packed + piece * bits // 8, piece_end - piece, buffer, bits)
        if p.stream and not (p.stream_direct or p.fused_stream):
            dequantize_streamed(buffer, y, piece, piece_end, p)
        else:
            dequantize_range(buffer, y + piece, piece, piece_end, p)
        piece = piece_end
    if p.stream:
        stream_fence()


cdef class DequantizeConfig:
    """How a DequantizeLinear plan computes: built once per plan
    (qemu_q/ops/dequantize_linear.py), checked here, passed to every call of the plan with
    its arrays. Keyword arguments only.

    Codes x (flattened, C order) are viewed as outer x axis_len x inner, stored in
    `code_size` bytes (1, 2 or 4: int32), or packed `code_bits` wide. 8-bit codes are
    decoded through `table` (256 values), or, for an integer type of `integer_bits` <= 8
    bits or the small float `small_float_id` (>= 0), on their bits (`fast`); 16-bit codes
    are int16 when `signed16`. The output holds float32 values or float16/bfloat16 bit
    patterns (`out_format`). A call passes float32 scales and zero points when
    `float32_parameters` (float32 outputs of 8- and 16-bit codes: exact there), float64
    ones otherwise.
    """
    cdef DequantizePlan plan
    cdef const float[::1] table_values
    cdef readonly int code_size
    cdef readonly int code_bits
    cdef readonly bint float32_parameters

    def __init__(self, *, Py_ssize_t outer, Py_ssize_t axis_len, Py_ssize_t inner, int granularity,
                 Py_ssize_t block_size, const float[::1] table not None, int code_size, int code_bits,
                 int integer_bits, bint integer_signed, int small_float_id, bint signed16,
                 int out_format, bint fast, bint float32_parameters, bint datapath=False,
                 int rounding=DP_HALF_EVEN, int scale_precision=0, bint flush_inputs=False,
                 bint flush_outputs=False, bint canonical_nan=False, double x_min_normal=0.0,
                 double scale_min_normal=0.0, bint fast_datapath=False, bint fused_fallback=True,
                 bint half_from_float32=False, bint half_odd_products=False):
        if granularity not in (PER_TENSOR, PER_AXIS, BLOCKED):
            raise ValueError(f"granularity {granularity} is not one of the layout's")
        if table.shape[0] != 256:
            raise ValueError("the decode table needs 256 values")
        if code_size not in (1, 2, 4) or code_bits not in (2, 4, 6, 8, 16, 32):
            raise ValueError(f"codes of {code_size} bytes, {code_bits} bits are not a storage")
        if not 0 <= integer_bits <= 8 or not (small_float_id == -1 or valid_small_float_id(small_float_id)):
            raise ValueError(f"integer_bits {integer_bits}, small_float_id {small_float_id}")
        if out_format not in (FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16):
            raise ValueError(f"out_format {out_format} is not an output format")
        if float32_parameters != (code_size <= 2 and out_format == FMT_FLOAT32
                                  and (not datapath or fast_datapath)
                                  and not (code_size == 2 and small_float_id >= 0)):
            raise ValueError("float32 parameters are read by float32 outputs of 8- and 16-bit "
                             "codes, 16-bit minifloat codes and the general datapath loop aside")
        if not DP_HALF_EVEN <= rounding <= DP_STOCHASTIC:
            raise ValueError(f"rounding {rounding} is not a datapath rounding")
        if scale_precision not in (0, 1, 2):
            raise ValueError(f"scale_precision {scale_precision}: 0 (the output type), 1 float32, 2 float64")
        if datapath and fast:
            raise ValueError("a datapath runs on the datapath loops only (fast=False)")
        if fast_datapath and not (datapath and (0 < integer_bits <= 8 or (code_size == 1 and small_float_id >= 0)
                                                or (code_size == 2 and small_float_id < 0))):
            raise ValueError("the fast datapath loops take 8- and 16-bit integer codes and 8-bit "
                             "small floats under a datapath")
        if half_from_float32 and not (fast_datapath and code_size == 1 and out_format != FMT_FLOAT32):
            raise ValueError("the float32 products into float16 / bfloat16 are for 8-bit codes on "
                             "the fast datapath loops")
        if half_odd_products and not (fast_datapath and 0 < integer_bits <= 8 and out_format != FMT_FLOAT32
                                      and not half_from_float32 and rounding != DP_STOCHASTIC
                                      and scale_precision != 1):
            raise ValueError("the products rounded to odd into float16 / bfloat16 are for 8-bit integer "
                             "codes on the fast datapath loops, neither stochastic nor a float32 "
                             "scale_precision")
        if outer < 0 or axis_len < 0 or inner < 0:
            raise ValueError("outer, axis_len and inner must be >= 0")
        if outer and inner and axis_len > (<Py_ssize_t>1 << 62) // outer // inner:
            raise ValueError("the layout has more than 2**62 elements")
        self.plan.layout = make_layout(outer * axis_len * inner, outer, axis_len, inner,
                                       granularity, block_size)
        check_layout(&self.plan.layout)
        self.table_values = table
        self.plan.table = &table[0]
        self.plan.integer_bytes = 0 < integer_bits <= 8
        self.plan.small_float_bytes = small_float_id >= 0
        self.plan.decoder = small_float32_decoder(small_float_id if small_float_id >= 0 else 0)
        self.plan.code_shift = 32 - integer_bits if self.plan.integer_bytes else 0
        self.plan.code_signed = integer_signed
        self.plan.signed16 = signed16
        self.plan.small_float16 = code_size == 2 and small_float_id >= 0
        self.plan.out_format = out_format
        self.plan.fast = fast
        p = &self.plan
        p.datapath = datapath
        p.rounding = rounding if datapath else DP_HALF_EVEN
        # (mantissa bits, smallest normal exponent, largest finite) of float32, float16, bfloat16
        formats = {FMT_FLOAT32: (23, -126, (2.0 - 2.0 ** -23) * 2.0 ** 127),
                   FMT_FLOAT16: (10, -14, 65504.0),
                   FMT_BFLOAT16: (7, -126, (2.0 - 2.0 ** -7) * 2.0 ** 127)}
        p.out_mantissa_bits, p.out_min_exponent, p.out_max = formats[out_format]
        p.nan_bits = {FMT_FLOAT32: 0x7FC00000, FMT_FLOAT16: 0x7E00, FMT_BFLOAT16: 0x7FC0}[out_format]
        # A product precision no wider than the output is the output's one rounding.
        p.product_rounded = datapath and (scale_precision == 2 or (scale_precision == 1 and out_format != FMT_FLOAT32))
        p.product_mantissa_bits, p.product_min_exponent, p.product_max = (
            (52, -1022, 1.7976931348623157e308) if scale_precision == 2 else formats[FMT_FLOAT32])
        p.flush_inputs = datapath and flush_inputs
        p.flush_outputs = datapath and flush_outputs
        p.canonical_nan = datapath and canonical_nan
        p.x_min_normal = x_min_normal if datapath else 0.0
        p.scale_min_normal = scale_min_normal if datapath else 0.0
        p.random_bits = NULL
        p.fast_datapath = fast_datapath
        p.half_from_float32 = half_from_float32
        p.half_odd_products = half_odd_products
        p.half_cast.x_min_normal = <float>0.0
        p.half_cast.flush_outputs = p.flush_outputs
        p.half_nan_keep = <int32_t>p.nan_bits if p.canonical_nan else 0xFFFF
        p.code_wrap = 0
        if code_size == 1 and self.plan.integer_bytes and not integer_signed:
            p.code_wrap = 1 << integer_bits
        elif code_size == 2 and not signed16:
            p.code_wrap = 1 << 16
        p.round_loop = datapath_round_loop_for(p.rounding, out_format)
        p.round_fields.to_float32 = p.product_rounded and scale_precision == 1
        p.round_fields.min_exponent_bits = (<int64_t>(p.out_min_exponent + 1023)) << 52
        p.round_fields.out_max = p.out_max
        p.round_fields.flush_below = 2.0 ** p.out_min_exponent if p.flush_outputs else 0.0
        p.round_fields.canonical_nan = p.canonical_nan
        p.round_fields.nan_bits = p.nan_bits
        p.fused_f32 = fast_datapath and out_format == FMT_FLOAT32
        p.fused_fallback = fused_fallback
        if self.plan.small_float_bytes:
            kind = FUSED_SMALL
        elif self.plan.integer_bytes and integer_bits == 8:
            kind = FUSED_INT8 if integer_signed else FUSED_UINT8
        elif self.plan.integer_bytes:
            kind = FUSED_SBYTE if integer_signed else FUSED_UBYTE
        else:
            kind = FUSED_SWORD if signed16 else FUSED_UWORD
        p.fused_kind = kind
        p.fused_one = fused_f32_loop_for(p.rounding, kind, FUSED_ONE)
        p.fused_vary = fused_f32_loop_for(p.rounding, kind, FUSED_VARY)
        p.fused_blocks = fused_f32_loop_for(p.rounding, kind, FUSED_BLOCKS)
        p.fused.block_size = self.plan.layout.block_size
        p.fused.code_shift = self.plan.code_shift
        p.fused.decoder = self.plan.decoder
        if p.flush_inputs:
            # subnormal codes decode to a zero of their sign: the input flush, with no
            # operation of its own in the loops
            p.fused.decoder.subnormal_step = 0.0
        p.stream_loop = fused_stream_loop_for(p.rounding, kind) if p.fused_f32 else NULL
        p.stream_carry_loop = (fused_stream_carry_loop_for(kind)
                               if p.fused_f32 and p.rounding == DP_STOCHASTIC else NULL)
        p.stream_fields.code_shift = p.fused.code_shift
        p.stream_fields.code_mask = p.fused.decoder.code_mask
        p.stream_fields.sign_shift = p.fused.decoder.sign_shift
        p.stream_fields.magnitude_mask = p.fused.decoder.magnitude_mask
        p.stream_fields.shift = p.fused.decoder.shift
        p.stream_fields.exponent_rebias = p.fused.decoder.exponent_rebias
        p.stream_fields.min_normal_magnitude = p.fused.decoder.min_normal_magnitude
        p.stream_fields.inf_magnitude = p.fused.decoder.inf_magnitude
        p.stream_fields.nan_magnitude = p.fused.decoder.nan_magnitude
        p.stream_fields.nan_code = p.fused.decoder.nan_code
        p.stream_fields.subnormal_step = p.fused.decoder.subnormal_step
        # the result pass of datapath_fused_f32_range (finish_f32): the flush, and the
        # canonical NaN where the one-pass loops can give a NaN (the others hand it back)
        p.stream_fields.flush_bits = <int32_t>float_bits(<float>p.round_fields.flush_below)
        p.stream_fields.nan_bits = <int32_t>p.nan_bits
        p.stream_finish = ((p.stream_fields.flush_bits != 0)
                           | (2 * (p.canonical_nan and (p.rounding == DP_HALF_EVEN or p.small_float_bytes))))
        p.stream_finite_only = (not self.plan.small_float_bytes
                                and p.rounding != DP_HALF_EVEN and p.rounding != DP_STOCHASTIC)
        p.fused_stream = False
        self.code_size = code_size
        self.code_bits = code_bits
        self.float32_parameters = float32_parameters

    @property
    def size(self):
        return self.plan.layout.size

    @property
    def fast_datapath(self):
        """Whether the datapath runs on the vectorized loops (else the general one)."""
        return bool(self.plan.fast_datapath)

    @property
    def half_from_float32(self):
        """Whether float16 / bfloat16 outputs round float32 products by Cast's loops
        (half_products_run)."""
        return bool(self.plan.half_from_float32)

    @property
    def half_odd_products(self):
        """Whether float16 / bfloat16 outputs round float32 products rounded to odd by
        Cast's loops (8-bit integer codes times float32 scales: half_products_run)."""
        return bool(self.plan.half_odd_products)

    @property
    def fused_float32(self):
        """Whether float32 outputs run the one-pass float32 loops (fused_f32_*)."""
        return bool(self.plan.fused_f32)

    @property
    def fused_loops(self):
        """(code kind, parameter layout) of the one-pass float32 loops this plan runs, as
        names ("sbyte", "ubyte", "sword", "uword", "small", "int8", "uint8"; "one", "vary",
        "blocks"); None where it runs none. "blocks": blocks along the last axis, at most
        FUSED_SHARED_BLOCK long, in rows of whole blocks (a range starting inside a block
        takes "one" for its rest); shorter last blocks spread their parameters ("vary"),
        longer blocks take a call of "one" each."""
        cdef Layout* L = &self.plan.layout
        if not self.plan.fused_f32:
            return None
        names = ("sbyte", "ubyte", "sword", "uword", "small", "int8", "uint8")
        if shares_pieces(L):
            layout = "blocks" if whole_blocks(L) else "vary"
        elif L.granularity == PER_TENSOR:
            layout = "one"
        elif L.inner > 1:
            layout = "one" if L.granularity == PER_AXIS else "vary"
        else:
            # longer blocks along the last axis: a call per block
            layout = "vary" if L.granularity == PER_AXIS else "one"
        return names[self.plan.fused_kind], layout

    @property
    def streams_fused_loops(self):
        """Whether outputs of STREAM_MIN_BYTES or more stream the one-pass float32 loops'
        results from their registers (fused_stream: an AVX2 or AVX-512 build; segments of
        FUSED_STREAM_SEGMENT elements or more, or blocks of 16 or more along the last axis
        in rows of whole blocks). Integer codes under a mode other than half_even and
        stochastic stream so only in calls whose every scale is finite and below 2**110."""
        return streamed_fused_layout(&self.plan, &self.plan.layout)

    @property
    def stochastic(self):
        return self.plan.datapath and self.plan.rounding == DP_STOCHASTIC


cdef DequantizePlan call_plan(DequantizeConfig config, object scale, object zero_point,
                              object random_bits, Py_ssize_t size, Py_ssize_t out_itemsize,
                              int n_threads) except *:
    # The plan of one call: the config's, with this call's parameter arrays checked
    # against the layout and attached, its tasks sized, its output streamed if large.
    cdef DequantizePlan p = config.plan
    cdef Py_ssize_t needed = layout_parameters(&p.layout)
    if size != p.layout.size:
        raise ValueError(f"x has {size} codes; the config's layout has {p.layout.size}")
    p.scale, p.zero_point = NO_DOUBLE, NO_DOUBLE
    p.scale32, p.zero_point32 = NO_FLOAT, NO_FLOAT
    if config.float32_parameters:
        p.scale32 = float32_parameters(scale, needed, "scales")
        p.zero_point32 = float32_parameters(zero_point, needed, "zero points")
    else:
        p.scale = float64_parameters(scale, needed, "scales")
        p.zero_point = float64_parameters(zero_point, needed, "zero points")
    p.random_bits = random_words(random_bits, config.stochastic, size, "")
    set_task_size(&p.layout, n_threads)
    p.stream = HAVE_STREAM and size * out_itemsize >= STREAM_MIN_BYTES
    # Not for blocks along the last axis: their short runs are better gathered in L1.
    p.stream_direct = (p.stream and HAVE_STREAM_VALUES and p.integer_bytes and p.fast
                       and p.out_format == FMT_FLOAT32
                       and not (p.layout.granularity == BLOCKED and p.layout.inner == 1))
    p.fused_stream = (p.stream and streamed_fused_layout(&p, &p.layout)
                      and (not p.stream_finite_only or products_stay_finite(p.scale32, needed)))
    if p.fused_stream and (p.stream_finish & 1) and products_at_least(&p, needed, 2.0 ** -126):
        p.stream_finish &= ~1
    if (p.fused_stream and p.stream_carry_loop != NULL and products_stay_finite(p.scale32, needed)
            and products_at_least(&p, needed, 2.0 ** -103)):
        p.stream_loop = p.stream_carry_loop
    return p


cdef struct DequantizeWork:
    # One call, as its tasks see it (see QuantizeWork in _quantize.pyx).
    const void* x
    void* y
    int x_size                # sizeof the code storage: 1, 2 or 4
    int y_size                # sizeof the output storage: 4 float32, 2 float16/bfloat16
    int bits                  # > 0: x is the packed input of codes this wide
    const DequantizePlan* plan


cdef inline void run_y_task(y_storage_t* y, const DequantizeWork* w, Py_ssize_t task) noexcept nogil:
    if w.bits:
        dequantize_packed_task(<const uint8_t*>w.x, w.bits, y, w.plan, task)
    elif w.x_size == 1:
        dequantize_task(<const uint8_t*>w.x, y, w.plan, task)
    elif w.x_size == 2:
        dequantize_task(<const uint16_t*>w.x, y, w.plan, task)
    else:
        dequantize_task(<const int32_t*>w.x, y, w.plan, task)


cdef void dequantize_work_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const DequantizeWork* w = <const DequantizeWork*>work
    if w.y_size == 4:
        run_y_task(<float*>w.y, w, task)
    else:
        run_y_task(<uint16_t*>w.y, w, task)


cdef int check_out_storage(int out_format, bint is_float) except -1:
    if is_float != (out_format == FMT_FLOAT32):
        raise ValueError(f"out's storage does not hold out_format {out_format}")
    return 0


cdef object flushed_scales(object scale, double min_normal):
    # The one-pass float32 loops read the scales flushed (subnormals="flush_inputs": an
    # x_scale below its type's smallest normal is a zero of its sign) once per call, not
    # per element. float32 values: the threshold (2**-126, 2**-14) is a float32. One typed
    # pass (a chain of numpy expressions took five over the 512K scales of a 16M blocked
    # case, 3-10% of the call).
    cdef const float[::1] values = np.ascontiguousarray(scale, dtype=np.float32).reshape(-1)
    flushed = np.empty(values.shape[0], np.float32)
    cdef float[::1] out = flushed
    cdef float below = <float>min_normal
    cdef Py_ssize_t i
    with nogil:
        for i in range(values.shape[0]):
            out[i] = flush_subnormal_f32(values[i], below)
    return flushed


cdef int run_call(const void* x, int x_size, int bits, object scale, object zero_point,
                  y_storage_t[::1] out, DequantizeConfig config, int n_threads,
                  object random_bits) except -1:
    # What both entries do once their input is checked: the output against the config,
    # the call's plan, the tasks.
    cdef Py_ssize_t size = out.shape[0]
    cdef DequantizePlan p
    cdef DequantizeWork work
    check_out_storage(config.plan.out_format, y_storage_t is float)
    check_aligned(&out[0], sizeof(y_storage_t), "out")
    if config.plan.fused_f32 and config.plan.flush_inputs:
        # held here, for the whole call
        scale = flushed_scales(scale, config.plan.scale_min_normal)
    p = call_plan(config, scale, zero_point, random_bits, size, sizeof(y_storage_t), n_threads)
    work.x = x
    work.y = &out[0]
    work.x_size = x_size
    work.y_size = sizeof(y_storage_t)
    work.bits = bits
    work.plan = &p
    with nogil:
        run_tasks(dequantize_work_task, &work, layout_tasks(&p.layout), n_threads)
    return 0


def dequantize(const dq_code_t[::1] x, scale, zero_point, y_storage_t[::1] out,
               DequantizeConfig config not None, int n_threads, random_bits=None):
    """Dequantize codes x (flattened, C order) into `out` as `config` says; scale and
    zero_point are float32 when config.float32_parameters, else float64; random_bits
    (uint32, one per element) only for a stochastic datapath. The kernel allocates
    nothing."""
    cdef Py_ssize_t size = x.shape[0]
    if size == 0:
        return
    if out.shape[0] != size:
        raise ValueError(f"out has {out.shape[0]} elements; x has {size}")
    if sizeof(dq_code_t) != config.code_size:
        raise ValueError(f"x's storage has {sizeof(dq_code_t)}-byte codes; the config's {config.code_size}")
    check_aligned(&x[0], sizeof(dq_code_t), "x")
    run_call(&x[0], sizeof(dq_code_t), 0, scale, zero_point, out, config, n_threads, random_bits)


def dequantize_packed(const uint8_t[::1] packed, scale, zero_point, y_storage_t[::1] out,
                      DequantizeConfig config not None, int n_threads, random_bits=None):
    """As `dequantize`, reading out.shape[0] codes of config.code_bits bits (2, 4 or 6)
    from the ONNX raw_data layout in `packed`."""
    cdef Py_ssize_t size = out.shape[0]
    cdef int bits = config.code_bits
    if size == 0:
        return
    if bits not in (2, 4, 6) or config.code_size != 1:
        raise ValueError(f"packed codes are 2, 4 or 6 bits wide, one per byte unpacked; not {bits}")
    if packed.shape[0] != (size * bits + 7) // 8:
        raise ValueError(f"{size} codes of {bits} bits take {(size * bits + 7) // 8} bytes; "
                         f"got {packed.shape[0]}")
    run_call(&packed[0], 1, bits, scale, zero_point, out, config, n_threads, random_bits)


def decode_table(int small_float_id):
    """float32 value of each of the 256 codes of a small-float format (one code per byte)."""
    cdef SmallFloat32Decoder decoder = small_float32_decoder(small_float_id)
    cdef int code
    values = np.zeros(256, dtype=np.float32)
    cdef float[::1] view = values
    for code in range(256):
        view[code] = decode_small_float32(code, &decoder)
    return values
