# The integer datapath's kernels (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv):
# the exact int16 GEMM with int32 sums wrapping modulo 2**32, the VPMADDUBSW
# pair-saturating accumulation profile, the narrow/saturating accumulators (summed in
# order), and the requantization under the three named rules
# of docs/semantics.md. Built once per instruction-set level (setup.py: ISA_MODULES); the
# levels differ in vector width only, never in a bit.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.math cimport fabs, fabsf, nearbyint, nearbyintf, isnan, isinf, isfinite, copysign, ldexp
from libc.stdint cimport int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t

from _codecs cimport (float_bits, bits_float, round_to_value_format, FMT_FLOAT32,
                      FMT_FLOAT16, FMT_BFLOAT16, round_magnitude, DP_HALF_EVEN, DP_STOCHASTIC,
                      DP_NAN_MIN, DP_NAN_ZERO, DP_NAN_MAX, round_to_small_float_value,
                      small_float_format, valid_small_float_id, SmallFloatFormat, SF_COUNT,
                      product_nan_first_f32, product_nan_first_f64)
from _tasks cimport run_tasks


cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #include <float.h>
    typedef unsigned __int128 qq_u128;

    static inline int qq_bitlen64(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }
    static inline int qq_bitlen128(qq_u128 x) {
        uint64_t hi = (uint64_t)(x >> 64);
        return hi ? 64 + qq_bitlen64(hi) : qq_bitlen64((uint64_t)x);
    }

    /* (-1)^neg * n * 2^e / d rounded to odd with p significant bits (p <= 53), as a
       double. n < 2^80, 0 < d < 2^25. Round to odd keeps every later rounding to at most
       p - 2 bits correct: the result is exact, or an odd multiple of 2^-p of its binade,
       which never sits on a midpoint of a coarser format. The quotient is exact integer
       arithmetic: n * 2^s has at most p + 25 bits when s >= 0, and d * 2^-s at most
       bitlen(n) - p bits when s < 0. */
    static inline double qq_to_odd(int neg, qq_u128 n, int e, uint64_t d, int p) {
        int s, sticky;
        qq_u128 q;
        uint64_t qi;
        double v;
        if (n == 0) return neg ? -0.0 : 0.0;
        s = p + qq_bitlen64(d) - qq_bitlen128(n);
        /* n * 2^s / d lies in [2^(p-1), 2^(p+1)) */
        if (s >= 0) {
            qq_u128 num = n << s;
            q = num / d;
            sticky = (num % d) != 0;
        } else {
            qq_u128 den = (qq_u128)d << (-s);
            q = n / den;
            sticky = (n % den) != 0;
        }
        if (q >> p) {
            sticky |= (int)(q & 1);
            q >>= 1;
            s -= 1;
        }
        qi = (uint64_t)q | (uint64_t)sticky;
        v = ldexp((double)qi, e - s);
        return neg ? -v : v;
    }

    /* A finite nonzero float32 as m * 2^e, m an integer below 2^24. */
    static inline void qq_decode(float f, uint64_t *m, int *e) {
        uint32_t b;
        memcpy(&b, &f, 4);
        uint32_t field = (b >> 23) & 0xFF;
        if (field == 0) { *m = b & 0x7FFFFF; *e = -149; }
        else { *m = (b & 0x7FFFFF) | 0x800000; *e = (int)field - 150; }
    }

    /* acc * sa * sb / sy exactly, rounded to odd with p bits (finite scales, sy != 0). */
    static inline double qq_exact_value(int64_t acc, float sa, float sb, float sy, int p) {
        uint64_t ma, mb, my;
        int ea, eb, ey;
        int neg;
        uint64_t a;
        if (acc == 0 || sa == 0.0f || sb == 0.0f) return 0.0;
        neg = (acc < 0) ^ (sa < 0.0f) ^ (sb < 0.0f) ^ (sy < 0.0f);
        a = acc < 0 ? (uint64_t)0 - (uint64_t)acc : (uint64_t)acc;
        qq_decode(fabsf(sa), &ma, &ea);
        qq_decode(fabsf(sb), &mb, &eb);
        qq_decode(fabsf(sy), &my, &ey);
        return qq_to_odd(neg, (qq_u128)a * ma * mb, ea + eb - ey, my, p);
    }

    /* A double as a float32 rounded to odd (the float8 encoders round it once more). */
    static inline float qq_float_to_odd(double v) {
        float f;
        uint32_t b;
        if (!isfinite(v)) return (float)v;
        if (fabs(v) > (double)FLT_MAX) return v > 0 ? FLT_MAX : -FLT_MAX;
        /* far below every float8 subnormal: a signed value that rounds to zero */
        if (fabs(v) < 0x1p-126) return v == 0.0 ? (float)v : (v > 0 ? 0x1p-126f : -0x1p-126f);
        f = (float)v;
        if ((double)f == v) return f;
        if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f);
        memcpy(&b, &f, 4);
        b |= 1;
        memcpy(&f, &b, 4);
        return f;
    }
    """
    double exact_value "qq_exact_value" (int64_t acc, float sa, float sb, float sy, int p) noexcept nogil
    float float_to_odd "qq_float_to_odd" (double v) noexcept nogil


cdef enum:
    RULE_EXACT = 0
    RULE_FLOAT32 = 1
    RULE_FLOAT64 = 2

cdef enum:
    ROW_BLOCK = 64

# The multiplier a_scale * b_scale / y_scale: the rule's own arithmetic, or the datapath's
# scale / scale_precision (docs/semantics.md, "The integer ops under a datapath").
cdef enum:
    MULT_RULE = 0
    MULT_F32_DIVIDE = 1
    MULT_F32_RECIPROCAL = 2
    MULT_F64_DIVIDE = 3
    MULT_F64_RECIPROCAL = 4

RULES = {"exact": RULE_EXACT, "float32": RULE_FLOAT32, "float64": RULE_FLOAT64}
SCALE_FORMATS = {"float": FMT_FLOAT32, "float16": FMT_FLOAT16, "bfloat16": FMT_BFLOAT16}


# --- the exact int16 GEMM ---------------------------------------------------------------
#
# out[t] = a[a_item[t]] @ b[b_item[t]] with int16 operand values (8-bit codes minus their
# zero points: |v| <= 255) and int32 sums that wrap modulo 2**32. VPMADDWD multiplies two
# pairs of int16 and adds the two exact products into one int32 lane (|sum| <= 2 * 255**2
# < 2**31, so that add never overflows); VPADDD then wraps modulo 2**32, which is the
# spec's int32 accumulation whatever the order, so the sums are exact modulo 2**32 for any
# K and never depend on the thread count or the vector width.
#
# The operands are packed first (in parallel) so that the micro-kernel reads both
# sequentially: a in panels of MR rows, each k-pair (k, k+1) of a row one 32-bit word
# (broadcast to every lane), b in panels of NR columns, each k-pair of a column one 32-bit
# word (NR columns = two vectors). The micro-kernel keeps an MR x NR tile of int32 sums in
# registers over the whole K; a task covers a block of row panels times a block of column
# panels, so one column panel stays in L1 while the block's row panels stream from L2.

cdef extern from *:
    """
    #if defined(__AVX512BW__)
    #include <immintrin.h>
    #define QQ_VL 16
    #define QQ_MR 12
    typedef __m512i qq_vec;
    #define QQ_ZERO() _mm512_setzero_si512()
    #define QQ_LOAD(p) _mm512_loadu_si512((const void *)(p))
    #define QQ_STORE(p, v) _mm512_storeu_si512((void *)(p), (v))
    #define QQ_BCAST(x) _mm512_set1_epi32(x)
    #define QQ_MADD(a, b) _mm512_madd_epi16((a), (b))
    #define QQ_ADD(a, b) _mm512_add_epi32((a), (b))
    #elif defined(__AVX2__)
    #include <immintrin.h>
    #define QQ_VL 8
    #define QQ_MR 6
    typedef __m256i qq_vec;
    #define QQ_ZERO() _mm256_setzero_si256()
    #define QQ_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
    #define QQ_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
    #define QQ_BCAST(x) _mm256_set1_epi32(x)
    #define QQ_MADD(a, b) _mm256_madd_epi16((a), (b))
    #define QQ_ADD(a, b) _mm256_add_epi32((a), (b))
    #elif defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #define QQ_VL 4
    #define QQ_MR 6
    typedef __m128i qq_vec;
    #define QQ_ZERO() _mm_setzero_si128()
    #define QQ_LOAD(p) _mm_loadu_si128((const __m128i *)(p))
    #define QQ_STORE(p, v) _mm_storeu_si128((__m128i *)(p), (v))
    #define QQ_BCAST(x) _mm_set1_epi32(x)
    #define QQ_MADD(a, b) _mm_madd_epi16((a), (b))
    #define QQ_ADD(a, b) _mm_add_epi32((a), (b))
    #endif

    #ifdef QQ_VL
    #define QQ_NR (2 * QQ_VL)
    #define QQ_DECL(r) qq_vec c##r##_0 = QQ_ZERO(), c##r##_1 = QQ_ZERO();
    #define QQ_STEP(r) a = QQ_BCAST(ap[r]); \\
        c##r##_0 = QQ_ADD(c##r##_0, QQ_MADD(a, b0)); c##r##_1 = QQ_ADD(c##r##_1, QQ_MADD(a, b1));
    #define QQ_STEP_DP(r) a = QQ_BCAST(ap[r]); \\
        c##r##_0 = QQ_DPWSSD(c##r##_0, a, b0); c##r##_1 = QQ_DPWSSD(c##r##_1, a, b1);
    #define QQ_OUT(r) QQ_STORE(tile + (r) * QQ_NR, c##r##_0); QQ_STORE(tile + (r) * QQ_NR + QQ_VL, c##r##_1);
    #if QQ_MR == 12
    #define QQ_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
    #else
    #define QQ_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
    #endif
    /* tile[MR][NR] = the int32 (wrapping) sums of one packed row panel times one packed
       column panel over `pairs` k-pairs. */
    #define QQ_KERNEL_BODY(STEP) \\
        qq_vec a, b0, b1; \\
        Py_ssize_t p; \\
        QQ_ROWS(QQ_DECL) \\
        for (p = 0; p < pairs; p++) { \\
            b0 = QQ_LOAD(bp); \\
            b1 = QQ_LOAD(bp + QQ_VL); \\
            QQ_ROWS(STEP) \\
            ap += QQ_MR; \\
            bp += QQ_NR; \\
        } \\
        QQ_ROWS(QQ_OUT)
    static void qq_micro_plain(const int32_t *ap, const int32_t *bp, Py_ssize_t pairs, int32_t *tile) {
        QQ_KERNEL_BODY(QQ_STEP)
    }
    /* VPDPWSSD (AVX-VNNI, AVX512-VNNI) is VPMADDWD and VPADDD in one instruction, the add
       wrapping as VPADDD does (the saturating form is VPDPWSSDS): the same bits in half the
       instructions. Neither x86-64 level includes it, so it is chosen at run time. */
    #if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512BW__)
    #define QQ_DP_TARGET "avx512vnni"
    #define QQ_DP_FEATURE "avx512vnni"
    #define QQ_DPWSSD(c, a, b) _mm512_dpwssd_epi32((c), (a), (b))
    #elif defined(__GNUC__) && !defined(__clang__) && defined(__AVX2__) && __GNUC__ >= 11
    #define QQ_DP_TARGET "avxvnni"
    #define QQ_DP_FEATURE "avxvnni"
    #define QQ_DPWSSD(c, a, b) _mm256_dpwssd_avx_epi32((c), (a), (b))
    #endif
    #ifdef QQ_DP_TARGET
    __attribute__((target(QQ_DP_TARGET)))
    static void qq_micro_dp(const int32_t *ap, const int32_t *bp, Py_ssize_t pairs, int32_t *tile) {
        QQ_KERNEL_BODY(QQ_STEP_DP)
    }
    static int qq_has_dp(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports(QQ_DP_FEATURE) != 0;
    }
    static const char *qq_dp_name(void) { return QQ_DP_FEATURE; }
    #else
    #define qq_micro_dp qq_micro_plain
    static int qq_has_dp(void) { return 0; }
    static const char *qq_dp_name(void) { return ""; }
    #endif
    #else
    /* Portable C: the same sums, wrapping in uint32. */
    #define QQ_MR 4
    #define QQ_NR 8
    static void qq_micro_plain(const int32_t *ap, const int32_t *bp, Py_ssize_t pairs, int32_t *tile) {
        uint32_t acc[QQ_MR * QQ_NR];
        Py_ssize_t p;
        int r, c;
        memset(acc, 0, sizeof acc);
        for (p = 0; p < pairs; p++) {
            for (r = 0; r < QQ_MR; r++) {
                int32_t lo = (int16_t)(ap[r] & 0xFFFF), hi = (int16_t)((uint32_t)ap[r] >> 16);
                for (c = 0; c < QQ_NR; c++)
                    acc[r * QQ_NR + c] += (uint32_t)(lo * (int16_t)(bp[c] & 0xFFFF)
                                                     + hi * (int16_t)((uint32_t)bp[c] >> 16));
            }
            ap += QQ_MR;
            bp += QQ_NR;
        }
        memcpy(tile, acc, sizeof acc);
    }
    #define qq_micro_dp qq_micro_plain
    static int qq_has_dp(void) { return 0; }
    static const char *qq_dp_name(void) { return ""; }
    #endif
    """
    enum:
        QQ_MR
        QQ_NR
    void micro_plain "qq_micro_plain" (const int32_t* ap, const int32_t* bp, Py_ssize_t pairs,
                                       int32_t* tile) noexcept nogil
    void micro_dp "qq_micro_dp" (const int32_t* ap, const int32_t* bp, Py_ssize_t pairs,
                                 int32_t* tile) noexcept nogil
    int has_dot_product "qq_has_dp" () noexcept nogil
    const char* dot_product_name "qq_dp_name" () noexcept nogil

ctypedef void (*micro_fn)(const int32_t* ap, const int32_t* bp, Py_ssize_t pairs,
                          int32_t* tile) noexcept nogil

cdef extern from "<stdlib.h>" nogil:
    void* malloc(size_t size)
    void free(void* p)

cdef extern from "<string.h>" nogil:
    void* memcpy(void* dst, const void* src, size_t n)

cdef enum:
    # Row panels per task (MR rows each) and columns per task: a task's row panels
    # (MR * ROW_PANELS * K int16) stay in L2 while one column panel is reused from L1.
    ROW_PANELS = 8
    TASK_COLS = 256

MR = QQ_MR
NR = QQ_NR
# The CPU feature whose VPDPWSSD this module's GEMM uses ("" when it uses VPMADDWD + VPADDD).
DOT_PRODUCT = dot_product_name().decode() if has_dot_product() else ""


cdef class GemmConfig:
    """The geometry of one exact int16 GEMM call: `items` products of [rows, depth] by
    [depth, cols]."""
    cdef readonly Py_ssize_t items
    cdef readonly Py_ssize_t rows
    cdef readonly Py_ssize_t depth
    cdef readonly Py_ssize_t cols
    cdef readonly bint dot_product

    def __init__(self, *, Py_ssize_t items, Py_ssize_t rows, Py_ssize_t depth, Py_ssize_t cols,
                 bint dot_product=True):
        """dot_product=False keeps VPMADDWD + VPADDD where VPDPWSSD exists (the tests
        compare both)."""
        if items < 0 or rows < 0 or depth < 0 or cols < 0:
            raise ValueError(f"GemmConfig: negative size (items={items}, rows={rows}, "
                             f"depth={depth}, cols={cols})")
        self.items = items
        self.rows = rows
        self.depth = depth
        self.cols = cols
        self.dot_product = dot_product and bool(DOT_PRODUCT)


cdef struct GemmWork:
    micro_fn micro
    const int16_t* a         # [a_items, rows, depth]
    const int16_t* b          # b's values, read through the offsets below
    const Py_ssize_t* b_base  # [b_items]: where item i's b starts
    const Py_ssize_t* k_off   # [depth]: b[i][k][n] = b[b_base[i] + k_off[k] + n_off[n]]
    const Py_ssize_t* n_off   # [cols]
    const Py_ssize_t* a_item  # [items]: the a operand of each output item
    const Py_ssize_t* b_item
    int32_t* out              # [items, rows, cols]
    int32_t* packed_a         # [a_items, row panels, pairs, MR]
    int32_t* packed_b         # [b_items, column panels, pairs, NR]
    Py_ssize_t a_items
    Py_ssize_t b_items
    Py_ssize_t rows
    Py_ssize_t depth
    Py_ssize_t cols
    Py_ssize_t pairs
    Py_ssize_t row_panels
    Py_ssize_t col_panels
    Py_ssize_t row_blocks
    Py_ssize_t col_blocks
    Py_ssize_t cols_per_block  # a multiple of NR


cdef inline int32_t pair_word(int16_t lo, int16_t hi) noexcept nogil:
    # Little-endian lanes: VPMADDWD multiplies the low int16 by the low one of the other
    # operand and the high by the high.
    return <int32_t>(<uint32_t><uint16_t>lo | (<uint32_t><uint16_t>hi << 16))


cdef void pack_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const GemmWork* w = <const GemmWork*>work
    cdef Py_ssize_t a_tasks = w.a_items * w.row_panels
    cdef Py_ssize_t item, panel, p, i, row, col, k, first
    cdef bint contiguous
    cdef const int16_t* base
    cdef const int16_t* src
    cdef const int16_t* next_row
    cdef int32_t* dst
    cdef int16_t lo, hi
    if task < a_tasks:
        item = task // w.row_panels
        panel = task % w.row_panels
        dst = w.packed_a + (item * w.row_panels + panel) * w.pairs * QQ_MR
        src = w.a + item * w.rows * w.depth
        for p in range(w.pairs):
            k = 2 * p
            for i in range(QQ_MR):
                row = panel * QQ_MR + i
                if row < w.rows:
                    lo = src[row * w.depth + k]
                    hi = src[row * w.depth + k + 1] if k + 1 < w.depth else 0
                    dst[p * QQ_MR + i] = pair_word(lo, hi)
                else:
                    dst[p * QQ_MR + i] = 0
        return
    task -= a_tasks
    item = task // w.col_panels
    panel = task % w.col_panels
    dst = w.packed_b + (item * w.col_panels + panel) * w.pairs * QQ_NR
    base = w.b + w.b_base[item]
    first = panel * QQ_NR
    # A panel whose columns are adjacent in memory (every matmul; a convolution's output
    # positions within a row at stride 1) packs as an interleave of two runs, which
    # vectorizes; otherwise (a row's end, strides) element by element.
    contiguous = first + QQ_NR <= w.cols
    if contiguous:
        for i in range(1, QQ_NR):
            if w.n_off[first + i] != w.n_off[first] + i:
                contiguous = False
                break
    for p in range(w.pairs):
        k = 2 * p
        src = base + w.k_off[k]
        next_row = base + w.k_off[k + 1] if k + 1 < w.depth else NULL
        if contiguous and next_row != NULL:
            src = src + w.n_off[first]
            next_row = next_row + w.n_off[first]
            for i in range(QQ_NR):
                dst[p * QQ_NR + i] = pair_word(src[i], next_row[i])
            continue
        for i in range(QQ_NR):
            col = first + i
            if col < w.cols:
                hi = next_row[w.n_off[col]] if next_row != NULL else 0
                dst[p * QQ_NR + i] = pair_word(src[w.n_off[col]], hi)
            else:
                dst[p * QQ_NR + i] = 0


cdef void gemm_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const GemmWork* w = <const GemmWork*>work
    cdef Py_ssize_t per_item = w.row_blocks * w.col_blocks
    cdef Py_ssize_t item = task // per_item
    cdef Py_ssize_t row_block = (task % per_item) // w.col_blocks
    cdef Py_ssize_t col_block = task % w.col_blocks
    cdef Py_ssize_t first_col = col_block * w.cols_per_block
    cdef Py_ssize_t col_end = min(first_col + w.cols_per_block, w.cols)
    cdef Py_ssize_t row_end = min((row_block + 1) * ROW_PANELS * QQ_MR, w.rows)
    cdef const int32_t* a_base = w.packed_a + w.a_item[item] * w.row_panels * w.pairs * QQ_MR
    cdef const int32_t* b_base = w.packed_b + w.b_item[item] * w.col_panels * w.pairs * QQ_NR
    cdef int32_t* out = w.out + item * w.rows * w.cols
    cdef int32_t tile[QQ_MR * QQ_NR]
    cdef Py_ssize_t col, row, r, width, height
    col = first_col
    while col < col_end:
        width = min(<Py_ssize_t>QQ_NR, w.cols - col)
        row = row_block * ROW_PANELS * QQ_MR
        while row < row_end:
            height = min(<Py_ssize_t>QQ_MR, w.rows - row)
            w.micro(a_base + (row // QQ_MR) * w.pairs * QQ_MR,
                         b_base + (col // QQ_NR) * w.pairs * QQ_NR, w.pairs, tile)
            for r in range(height):
                memcpy(out + (row + r) * w.cols + col, tile + r * QQ_NR, width * sizeof(int32_t))
            row += QQ_MR
        col += QQ_NR


def gemm_s16(const int16_t[:, :, ::1] a, const int16_t[::1] b, const Py_ssize_t[::1] b_base,
             const Py_ssize_t[::1] k_off, const Py_ssize_t[::1] n_off,
             const Py_ssize_t[::1] a_item, const Py_ssize_t[::1] b_item,
             int32_t[:, :, ::1] out, GemmConfig config, int n_threads):
    """out[t] = a[a_item[t]] @ B(b_item[t]), exact products of int16 values with
    |v| <= 255, int32 sums wrapping modulo 2**32. B(i)[k, n] = b[b_base[i] + k_off[k] +
    n_off[n]]: a [depth, cols] matrix, or a convolution's im2col columns read in place."""
    cdef GemmWork work
    cdef Py_ssize_t t, n_pack, reach = 0
    cdef Py_ssize_t lowest_k = 0, lowest_n = 0, lowest_base = 0, highest_k = 0, highest_n = 0
    if (a.shape[1] != config.rows or a.shape[2] != config.depth or k_off.shape[0] != config.depth
            or n_off.shape[0] != config.cols or out.shape[0] != config.items
            or out.shape[1] != config.rows or out.shape[2] != config.cols
            or a_item.shape[0] != config.items or b_item.shape[0] != config.items):
        raise ValueError("gemm_s16: the arrays do not match the configuration")
    for t in range(config.items):
        if not (0 <= a_item[t] < a.shape[0] and 0 <= b_item[t] < b_base.shape[0]):
            raise ValueError("gemm_s16: an item index is out of range")
    if out.size == 0:
        return
    if config.depth == 0:
        out[:, :, :] = 0
        return
    # every element the offsets name lies inside b
    for t in range(b_base.shape[0]):
        reach = max(reach, b_base[t])
        lowest_base = min(lowest_base, b_base[t])
    for t in range(config.depth):
        lowest_k = min(lowest_k, k_off[t])
        highest_k = max(highest_k, k_off[t])
    for t in range(config.cols):
        lowest_n = min(lowest_n, n_off[t])
        highest_n = max(highest_n, n_off[t])
    if lowest_base < 0 or lowest_k < 0 or lowest_n < 0 or reach + highest_k + highest_n >= b.shape[0]:
        raise ValueError("gemm_s16: the offsets reach outside b")
    work.micro = micro_dp if config.dot_product else micro_plain
    work.a = &a[0, 0, 0]
    work.b = &b[0]
    work.b_base = &b_base[0]
    work.k_off = &k_off[0]
    work.n_off = &n_off[0]
    work.a_item = &a_item[0]
    work.b_item = &b_item[0]
    work.out = &out[0, 0, 0]
    work.a_items = a.shape[0]
    work.b_items = b_base.shape[0]
    work.rows = config.rows
    work.depth = config.depth
    work.cols = config.cols
    work.pairs = (config.depth + 1) // 2
    work.row_panels = (config.rows + QQ_MR - 1) // QQ_MR
    work.col_panels = (config.cols + QQ_NR - 1) // QQ_NR
    work.cols_per_block = max(<Py_ssize_t>QQ_NR, TASK_COLS // QQ_NR * QQ_NR)
    work.row_blocks = (work.row_panels + ROW_PANELS - 1) // ROW_PANELS
    work.col_blocks = (config.cols + work.cols_per_block - 1) // work.cols_per_block
    work.packed_a = <int32_t*>malloc(work.a_items * work.row_panels * work.pairs * QQ_MR * sizeof(int32_t))
    work.packed_b = <int32_t*>malloc(work.b_items * work.col_panels * work.pairs * QQ_NR * sizeof(int32_t))
    if work.packed_a == NULL or work.packed_b == NULL:
        free(work.packed_a)
        free(work.packed_b)
        raise MemoryError("gemm_s16: no memory for the packed operands")
    n_pack = work.a_items * work.row_panels + work.b_items * work.col_panels
    try:
        with nogil:
            run_tasks(pack_task, &work, n_pack, n_threads)
            run_tasks(gemm_task, &work, config.items * work.row_blocks * work.col_blocks, n_threads)
    finally:
        free(work.packed_a)
        free(work.packed_b)


# --- the VPMADDUBSW pair profile ---------------------------------------------------------

cdef struct PairsWork:
    const uint8_t* a     # [batch, rows, depth] raw codes
    const int8_t* bt     # [batch, cols, depth] raw codes, transposed
    int32_t* out         # [batch, rows, cols]
    Py_ssize_t batch
    Py_ssize_t rows
    Py_ssize_t cols
    Py_ssize_t depth


cdef void pairs_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const PairsWork* w = <const PairsWork*>work
    cdef Py_ssize_t item = task // w.rows
    cdef Py_ssize_t r = task % w.rows
    cdef const uint8_t* arow = w.a + (item * w.rows + r) * w.depth
    cdef const int8_t* bcol
    cdef Py_ssize_t c, k
    cdef int32_t pair
    cdef uint32_t total
    for c in range(w.cols):
        bcol = w.bt + (item * w.cols + c) * w.depth
        total = 0
        k = 0
        while k + 1 < w.depth:
            # VPMADDUBSW: the two u8 x s8 products summed with int16 saturation
            pair = <int32_t>arow[k] * bcol[k] + <int32_t>arow[k + 1] * bcol[k + 1]
            pair = 32767 if pair > 32767 else (-32768 if pair < -32768 else pair)
            total = total + <uint32_t>pair
            k += 2
        if k < w.depth:
            total = total + <uint32_t>(<int32_t>arow[k] * bcol[k])
        w.out[(item * w.rows + r) * w.cols + c] = <int32_t>total


def pair_sums_u8s8(const uint8_t[:, :, ::1] a, const int8_t[:, :, ::1] bt, int32_t[:, :, ::1] out,
                   int n_threads):
    """out[i, r, c] = the int32 (wrapping) sum over k of sat16(a[i,r,k]*bt[i,c,k] +
    a[i,r,k+1]*bt[i,c,k+1]) for even k: raw codes, no zero points."""
    cdef PairsWork work
    if (a.shape[0] != bt.shape[0] or a.shape[2] != bt.shape[2] or out.shape[0] != a.shape[0]
            or out.shape[1] != a.shape[1] or out.shape[2] != bt.shape[1]):
        raise ValueError("pair_sums_u8s8: operand shapes do not match")
    work.batch = a.shape[0]
    work.rows = a.shape[1]
    work.cols = bt.shape[1]
    work.depth = a.shape[2]
    if out.size == 0:
        return
    if work.depth == 0:
        out[:, :, :] = 0
        return
    work.a = &a[0, 0, 0]
    work.bt = &bt[0, 0, 0]
    work.out = &out[0, 0, 0]
    with nogil:
        run_tasks(pairs_task, &work, work.batch * work.rows, n_threads)


# --- narrow and saturating accumulators ----------------------------------------------------
#
# A MAC array's accumulator register of `width` bits (8..32) that wraps modulo 2**width or
# saturates at [-2**(width-1), 2**(width-1) - 1] after every addition. Saturation makes the
# result depend on the order, so each output is summed by one thread in the documented
# order k = 0, 1, ..., K-1 (docs/semantics.md, "Accumulator profiles"): a task holds one row
# of a against a block of columns and walks K once, every column's register updated per k.
# The same operand layout as gemm_s16 (codes minus zero points as int16, B read through
# offsets), so convolutions read their im2col columns in place here too.

cdef enum:
    ACC_COLS = 256


cdef class AccumulatorConfig:
    """The geometry of one sequential accumulation (as GemmConfig) and its accumulator:
    `width` bits, wrapping (saturate=False) or saturating after every addition."""
    cdef readonly Py_ssize_t items
    cdef readonly Py_ssize_t rows
    cdef readonly Py_ssize_t depth
    cdef readonly Py_ssize_t cols
    cdef readonly int width
    cdef readonly bint saturate

    def __init__(self, *, Py_ssize_t items, Py_ssize_t rows, Py_ssize_t depth, Py_ssize_t cols,
                 int width, bint saturate):
        if items < 0 or rows < 0 or depth < 0 or cols < 0:
            raise ValueError(f"AccumulatorConfig: negative size (items={items}, rows={rows}, "
                             f"depth={depth}, cols={cols})")
        if not 8 <= width <= 32:
            raise ValueError(f"AccumulatorConfig: width={width}; allowed 8..32")
        self.items = items
        self.rows = rows
        self.depth = depth
        self.cols = cols
        self.width = width
        self.saturate = saturate


cdef struct AccumulateWork:
    const int16_t* a
    const int16_t* b
    const Py_ssize_t* b_base
    const Py_ssize_t* k_off
    const Py_ssize_t* n_off
    const Py_ssize_t* a_item
    const Py_ssize_t* b_item
    const int32_t* init       # [items, rows]: each register's initial value (a bias)
    int32_t* out              # [items, rows, cols]
    Py_ssize_t rows
    Py_ssize_t depth
    Py_ssize_t cols
    Py_ssize_t col_blocks
    int64_t lo
    int64_t hi
    uint64_t mask
    bint saturate


cdef inline int64_t wrap_to(int64_t v, int64_t lo, uint64_t mask) noexcept nogil:
    # (v - lo) mod 2**width + lo, in unsigned arithmetic (no signed overflow to rely on)
    return <int64_t>((<uint64_t>v - <uint64_t>lo) & mask) + lo


cdef inline int64_t saturate_to(int64_t v, int64_t lo, int64_t hi) noexcept nogil:
    return lo if v < lo else (hi if v > hi else v)


cdef void accumulate_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const AccumulateWork* w = <const AccumulateWork*>work
    cdef Py_ssize_t per_item = w.rows * w.col_blocks
    cdef Py_ssize_t item = task // per_item
    cdef Py_ssize_t row = (task % per_item) // w.col_blocks
    cdef Py_ssize_t first = (task % w.col_blocks) * ACC_COLS
    cdef Py_ssize_t width = min(<Py_ssize_t>ACC_COLS, w.cols - first)
    cdef const int16_t* arow = w.a + (w.a_item[item] * w.rows + row) * w.depth
    cdef const int16_t* base = w.b + w.b_base[w.b_item[item]]
    cdef const int16_t* src
    cdef const Py_ssize_t* n_off = w.n_off + first
    cdef int32_t* out = w.out + (item * w.rows + row) * w.cols + first
    cdef int64_t acc[ACC_COLS]
    cdef int64_t start, av
    cdef int64_t lo = w.lo, hi = w.hi
    cdef uint64_t mask = w.mask
    cdef Py_ssize_t c, k
    cdef bint contiguous = True
    start = <int64_t>w.init[item * w.rows + row]
    # the bias is loaded into the register: it is reduced to the width like every sum
    start = saturate_to(start, lo, hi) if w.saturate else wrap_to(start, lo, mask)
    for c in range(width):
        acc[c] = start
        if n_off[c] != n_off[0] + c:
            contiguous = False
    for k in range(w.depth):
        av = arow[k]
        # a zero product leaves every register unchanged under both rules (it holds a
        # value of the range already)
        if av == 0:
            continue
        src = base + w.k_off[k]
        # adjacent columns (every matmul, a convolution's row at stride 1) read as a run,
        # which vectorizes; otherwise through the offsets
        if contiguous:
            src = src + n_off[0]
            if w.saturate:
                for c in range(width):
                    acc[c] = saturate_to(acc[c] + av * src[c], lo, hi)
            else:
                for c in range(width):
                    acc[c] = wrap_to(acc[c] + av * src[c], lo, mask)
        elif w.saturate:
            for c in range(width):
                acc[c] = saturate_to(acc[c] + av * src[n_off[c]], lo, hi)
        else:
            for c in range(width):
                acc[c] = wrap_to(acc[c] + av * src[n_off[c]], lo, mask)
    for c in range(width):
        out[c] = <int32_t>acc[c]


def accumulate(const int16_t[:, :, ::1] a, const int16_t[::1] b, const Py_ssize_t[::1] b_base,
               const Py_ssize_t[::1] k_off, const Py_ssize_t[::1] n_off,
               const Py_ssize_t[::1] a_item, const Py_ssize_t[::1] b_item,
               const int32_t[:, ::1] init, int32_t[:, :, ::1] out, AccumulatorConfig config,
               int n_threads):
    """out[t, r, n] = the register after K additions, in order k = 0..K-1, starting from
    init[t, r]: acc <- R(acc + a[a_item[t], r, k] * B(b_item[t])[k, n]), R the config's wrap
    or saturation to `width` bits (init reduced by R first). B as in gemm_s16."""
    cdef AccumulateWork work
    cdef Py_ssize_t t, reach = 0
    cdef Py_ssize_t lowest_k = 0, lowest_n = 0, lowest_base = 0, highest_k = 0, highest_n = 0
    if (a.shape[1] != config.rows or a.shape[2] != config.depth or k_off.shape[0] != config.depth
            or n_off.shape[0] != config.cols or out.shape[0] != config.items
            or out.shape[1] != config.rows or out.shape[2] != config.cols
            or a_item.shape[0] != config.items or b_item.shape[0] != config.items
            or init.shape[0] != config.items or init.shape[1] != config.rows):
        raise ValueError("accumulate: the arrays do not match the configuration")
    for t in range(config.items):
        if not (0 <= a_item[t] < a.shape[0] and 0 <= b_item[t] < b_base.shape[0]):
            raise ValueError("accumulate: an item index is out of range")
    if out.size == 0:
        return
    if config.depth > 0:
        for t in range(b_base.shape[0]):
            reach = max(reach, b_base[t])
            lowest_base = min(lowest_base, b_base[t])
        for t in range(config.depth):
            lowest_k = min(lowest_k, k_off[t])
            highest_k = max(highest_k, k_off[t])
        for t in range(config.cols):
            lowest_n = min(lowest_n, n_off[t])
            highest_n = max(highest_n, n_off[t])
        if lowest_base < 0 or lowest_k < 0 or lowest_n < 0 or reach + highest_k + highest_n >= b.shape[0]:
            raise ValueError("accumulate: the offsets reach outside b")
        work.a = &a[0, 0, 0]
        work.b = &b[0]
        work.k_off = &k_off[0]
    else:
        work.a = NULL
        work.b = NULL
        work.k_off = NULL
    work.b_base = &b_base[0]
    work.n_off = &n_off[0]
    work.a_item = &a_item[0]
    work.b_item = &b_item[0]
    work.init = &init[0, 0]
    work.out = &out[0, 0, 0]
    work.rows = config.rows
    work.depth = config.depth
    work.cols = config.cols
    work.col_blocks = (config.cols + ACC_COLS - 1) // ACC_COLS
    work.lo = -(<int64_t>1 << (config.width - 1))
    work.hi = (<int64_t>1 << (config.width - 1)) - 1
    work.mask = (<uint64_t>1 << config.width) - 1
    work.saturate = config.saturate
    with nogil:
        run_tasks(accumulate_task, &work, config.items * config.rows * work.col_blocks, n_threads)


# 128-bit sums and the wide exact products of the requantization (QLinearMatMul-21 float8
# operands, the datapath's multiplier).
cdef extern from *:
    """
    typedef __int128 qq_i128;

    /* |n| * 2^e (n != 0) rounded to p <= 53 significant bits, to odd or to nearest even,
       as a double (exact: the caller's exponents stay far from the double's limits). */
    static inline double qq_round_i128(qq_i128 n, int e, int p, int to_odd) {
        int neg = n < 0, len, drop;
        qq_u128 m = neg ? (qq_u128)0 - (qq_u128)n : (qq_u128)n;
        uint64_t q;
        double v;
        if (m == 0) return 0.0;
        len = qq_bitlen128(m);
        drop = len > p ? len - p : 0;
        q = (uint64_t)(m >> drop);
        if (drop) {
            qq_u128 rest = m & ((((qq_u128)1) << drop) - 1);
            qq_u128 half = ((qq_u128)1) << (drop - 1);
            if (to_odd) q |= (uint64_t)(rest != 0);
            else if (rest > half || (rest == half && (q & 1))) q += 1;  /* q <= 2^53: exact */
        }
        v = ldexp((double)q, e + drop);
        return neg ? -v : v;
    }

    /* A 192-bit unsigned integer, little-endian 64-bit limbs. */
    typedef struct { uint64_t w[3]; } qq_u192;

    static inline int qq_bitlen192(const qq_u192 *x) {
        if (x->w[2]) return 128 + qq_bitlen64(x->w[2]);
        if (x->w[1]) return 64 + qq_bitlen64(x->w[1]);
        return qq_bitlen64(x->w[0]);
    }

    static inline void qq_shl192(qq_u192 *x, int s) {
        while (s >= 64) { x->w[2] = x->w[1]; x->w[1] = x->w[0]; x->w[0] = 0; s -= 64; }
        if (s) {
            x->w[2] = (x->w[2] << s) | (x->w[1] >> (64 - s));
            x->w[1] = (x->w[1] << s) | (x->w[0] >> (64 - s));
            x->w[0] <<= s;
        }
    }

    /* x / d in place (0 < d < 2^32); returns whether a remainder was left. */
    static inline int qq_div192(qq_u192 *x, uint64_t d) {
        qq_u128 rem = 0, cur;
        int i;
        for (i = 2; i >= 0; i--) {
            cur = (rem << 64) | x->w[i];
            x->w[i] = (uint64_t)(cur / d);
            rem = cur % d;
        }
        return rem != 0;
    }

    /* n * 2^e * sa * sb / sy exactly, rounded to odd with p <= 53 bits (finite scales,
       sy != 0, n != 0 or not): |n| * ma * mb has at most 128 + 48 bits, and is shifted
       left until the quotient by my (< 2^24) has at least p + 1 bits. */
    static inline double qq_exact_value_wide(qq_i128 n, int e, float sa, float sb, float sy, int p) {
        uint64_t ma, mb, my, k;
        int ea, eb, ey, neg, s, len, drop, sticky;
        qq_u128 m, lo, hi, mid;
        qq_u192 x;
        uint64_t q;
        double v;
        if (n == 0 || sa == 0.0f || sb == 0.0f) return 0.0;
        neg = (n < 0) ^ (sa < 0.0f) ^ (sb < 0.0f) ^ (sy < 0.0f);
        m = n < 0 ? (qq_u128)0 - (qq_u128)n : (qq_u128)n;
        qq_decode(fabsf(sa), &ma, &ea);
        qq_decode(fabsf(sb), &mb, &eb);
        qq_decode(fabsf(sy), &my, &ey);
        k = ma * mb;  /* < 2^48 */
        lo = (qq_u128)(uint64_t)m * k;
        hi = (qq_u128)(uint64_t)(m >> 64) * k;
        mid = (lo >> 64) + (qq_u128)(uint64_t)hi;
        x.w[0] = (uint64_t)lo;
        x.w[1] = (uint64_t)mid;
        x.w[2] = (uint64_t)(hi >> 64) + (uint64_t)(mid >> 64);
        len = qq_bitlen192(&x);
        s = p + 2 + qq_bitlen64(my) - len;
        if (s < 0) s = 0;
        qq_shl192(&x, s);  /* len + s <= max(176, p + 2 + 24) < 192 */
        sticky = qq_div192(&x, my);
        len = qq_bitlen192(&x);  /* >= p + 1 */
        drop = len - p;
        q = 0;
        {
            /* the top p bits of x, and whether anything below them is set */
            qq_u192 t = x;
            int i, bit;
            for (i = 0; i < p; i++) {
                bit = len - 1 - i;
                q = (q << 1) | ((t.w[bit >> 6] >> (bit & 63)) & 1);
            }
            for (bit = 0; bit < drop; bit++)
                if ((t.w[bit >> 6] >> (bit & 63)) & 1) { sticky = 1; break; }
        }
        q |= (uint64_t)sticky;
        v = ldexp((double)q, drop - s + e + ea + eb - ey);
        return neg ? -v : v;
    }
    /* n * 2^e * mul exactly (mul a finite double: a datapath's multiplier), rounded to odd
       with p <= 53 bits: |n| * mantissa(mul) has at most 128 + 53 bits, held in 192. */
    static inline double qq_times_wide(qq_i128 n, int e, double mul, int p) {
        int neg, len, drop, sticky = 0, em, i, bit;
        uint64_t k, q = 0;
        qq_u128 m, lo, hi, mid;
        qq_u192 x;
        double v;
        if (n == 0 || mul == 0.0) return 0.0;
        neg = (n < 0) ^ (mul < 0.0);
        m = n < 0 ? (qq_u128)0 - (qq_u128)n : (qq_u128)n;
        k = (uint64_t)ldexp(frexp(fabs(mul), &em), 53);  /* |mul| = k * 2^(em - 53), exact */
        em -= 53;
        if ((m >> 64) == 0) {
            /* an int32 accumulator (or a small sum): the product fits 117 bits */
            qq_u128 prod = m * k;
            len = qq_bitlen128(prod);
            drop = len > p ? len - p : 0;
            q = (uint64_t)(prod >> drop);
            if (drop) q |= (uint64_t)((prod & ((((qq_u128)1) << drop) - 1)) != 0);
            v = ldexp((double)q, drop + e + em);
            return neg ? -v : v;
        }
        lo = (qq_u128)(uint64_t)m * k;
        hi = (qq_u128)(uint64_t)(m >> 64) * k;
        mid = (lo >> 64) + (qq_u128)(uint64_t)hi;
        x.w[0] = (uint64_t)lo;
        x.w[1] = (uint64_t)mid;
        x.w[2] = (uint64_t)(hi >> 64) + (uint64_t)(mid >> 64);
        len = qq_bitlen192(&x);
        drop = len > p ? len - p : 0;
        for (i = 0; i < len - drop; i++) {
            bit = len - 1 - i;
            q = (q << 1) | ((x.w[bit >> 6] >> (bit & 63)) & 1);
        }
        for (bit = 0; bit < drop; bit++)
            if ((x.w[bit >> 6] >> (bit & 63)) & 1) { sticky = 1; break; }
        q |= (uint64_t)sticky;
        v = ldexp((double)q, drop + e + em);
        return neg ? -v : v;
    }
    """
    ctypedef long long i128 "qq_i128"
    double round_i128 "qq_round_i128" (i128 n, int e, int p, int to_odd) noexcept nogil
    double exact_value_wide "qq_exact_value_wide" (i128 n, int e, float sa, float sb, float sy,
                                                   int p) noexcept nogil
    double times_wide "qq_times_wide" (i128 n, int e, double mul, int p) noexcept nogil


# --- requantization ----------------------------------------------------------------------

cdef class RequantizeConfig:
    """How accumulators become output codes: the rule, the scale type (for the "float64"
    rule's multiplier), and either an integer output (zero point, range, code mask) or
    float32 values for a float8 encoder (float_output; with the rounding "stochastic" the
    values are already rounded onto the grid of the ONNX float8 type small_float_id)."""
    cdef readonly int rule
    cdef readonly int scale_format
    cdef readonly bint float_output
    cdef readonly int32_t zero_point
    cdef readonly int32_t lo
    cdef readonly int32_t hi
    cdef readonly int rounding
    cdef readonly int nan_to_integer
    cdef readonly int multiplier
    cdef readonly int small_float_id

    def __init__(self, *, str rule, str scale_format, bint float_output, int zero_point=0,
                 int lo=0, int hi=0, int rounding=DP_HALF_EVEN, int nan_to_integer=DP_NAN_MIN,
                 int multiplier=MULT_RULE, int small_float_id=-1):
        if rule not in RULES:
            raise ValueError(f"RequantizeConfig: unknown rule {rule!r}")
        if scale_format not in SCALE_FORMATS:
            raise ValueError(f"RequantizeConfig: unknown scale format {scale_format!r}")
        if not float_output and not (lo <= zero_point <= hi):
            raise ValueError("RequantizeConfig: zero point outside [lo, hi]")
        check_datapath_codes("RequantizeConfig", rounding, nan_to_integer, multiplier, RULES[rule])
        check_float8_output("RequantizeConfig", float_output, rounding, small_float_id)
        self.small_float_id = small_float_id
        self.multiplier = multiplier
        self.rounding = rounding
        self.nan_to_integer = nan_to_integer
        self.rule = RULES[rule]
        self.scale_format = SCALE_FORMATS[scale_format]
        self.float_output = float_output
        self.zero_point = zero_point
        self.lo = lo
        self.hi = hi


cdef struct RequantizeWork:
    const int32_t* acc       # [rows, cols]
    const float* row_scale   # [rows]
    const float* col_scale   # [cols]
    float y_scale
    Py_ssize_t rows
    Py_ssize_t cols
    int rule
    int scale_format
    bint float_output
    int32_t zero_point
    int32_t lo
    int32_t hi
    uint8_t* codes           # integer output, the low byte of each code
    float* values            # float output
    bint uniform_cols        # every column scale has the same bits
    int rounding             # DatapathRounding of the rule's value to an integer
    int32_t nan_code         # the code a NaN value gives (datapath nan_to_integer)
    int multiplier           # MULT_RULE, or the datapath's multiplier
    const uint32_t* words    # rounding "stochastic": one word per output element, else NULL
    # float_output under "stochastic": the float8 format the kernel rounds onto (its
    # mantissa bits, smallest normal exponent, and half its smallest subnormal)
    bint float_stochastic
    int sf_mantissa_bits
    int sf_min_exponent
    float sf_below_zero


cdef inline void check_datapath_codes(str where, int rounding, int nan_to_integer, int multiplier,
                                      int rule) except *:
    if not (DP_HALF_EVEN <= rounding <= DP_STOCHASTIC):
        raise ValueError(f"{where}: rounding code {rounding}; allowed {DP_HALF_EVEN}..{DP_STOCHASTIC}")
    if not (DP_NAN_MIN <= nan_to_integer <= DP_NAN_MAX):
        raise ValueError(f"{where}: nan_to_integer code {nan_to_integer}; allowed {DP_NAN_MIN}..{DP_NAN_MAX}")
    if not (MULT_RULE <= multiplier <= MULT_F64_RECIPROCAL):
        raise ValueError(f"{where}: multiplier code {multiplier}; allowed {MULT_RULE}..{MULT_F64_RECIPROCAL}")
    # the "float32" rule multiplies a float32 accumulator by a float32 multiplier
    if rule == RULE_FLOAT32 and multiplier > MULT_F32_RECIPROCAL:
        raise ValueError(f"{where}: the float32 rule takes a float32 multiplier, not code {multiplier}")


cdef inline void check_float8_output(str where, bint float_output, int rounding,
                                     int small_float_id) except *:
    # Only "stochastic" is rounded here for a float output (the float8 encoder rounds the
    # other modes), onto one of the ONNX float8/float4/float6 grids.
    if float_output and rounding == DP_STOCHASTIC and not 0 <= small_float_id < SF_COUNT:
        raise ValueError(f"{where}: small_float_id={small_float_id}; a float output under the "
                         f"rounding 'stochastic' needs an ONNX small-float id 0..{SF_COUNT - 1}")


cdef inline void set_float8_rounding(RequantizeWork* w, bint float_output, int rounding,
                                     int small_float_id) noexcept:
    cdef SmallFloatFormat f
    w.float_stochastic = float_output and rounding == DP_STOCHASTIC
    w.sf_mantissa_bits = 0
    w.sf_min_exponent = 0
    w.sf_below_zero = 0.0
    if w.float_stochastic:
        f = small_float_format(small_float_id)
        w.sf_mantissa_bits = f.mantissa_bits
        w.sf_min_exponent = f.min_exponent
        w.sf_below_zero = <float>ldexp(1.0, f.min_exponent - f.mantissa_bits - 1)


cdef inline const uint32_t* random_words(int rounding, bint float_output, object random_bits,
                                         Py_ssize_t size, str where) except? NULL:
    # One word per output under "stochastic", integer or float8 (the kernel rounds both).
    cdef const uint32_t[::1] words
    if (rounding == DP_STOCHASTIC) != (random_bits is not None):
        raise ValueError(f"{where}: random_bits go with the rounding 'stochastic', and only with it")
    if random_bits is None:
        return NULL
    words = random_bits
    if words.shape[0] != size:
        raise ValueError(f"{where}: random_bits has {words.shape[0]} words; the output has {size}")
    return &words[0] if size else NULL


cdef inline int32_t nan_code_of(int nan_to_integer, int32_t zero_point, int32_t lo, int32_t hi) noexcept:
    # "zero": round(NaN) read as 0, then the zero point added (within [lo, hi] already).
    if nan_to_integer == DP_NAN_ZERO:
        return zero_point
    return hi if nan_to_integer == DP_NAN_MAX else lo


cdef inline double round_by(double v, int mode, uint32_t word) noexcept nogil:
    # v rounded to an integer by the datapath mode (half_even: the FPU's default, as the
    # ONNX rules; stochastic: with the output's word). Non-finite v and |v| >= 2**52
    # (integers already) pass through.
    if mode == DP_HALF_EVEN:
        return nearbyint(v)
    if not isfinite(v) or fabs(v) >= 4503599627370496.0:
        return v
    return copysign(round_magnitude(fabs(v), v < 0.0, mode, word), v)


cdef inline double exact_limit(int mode) noexcept nogil:
    # Beyond it an exact value rounded to odd at 53 bits saturates whatever the mode (8-bit
    # outputs, |zero point| <= 255). Below it the value's ulp is at most 2**-23, and for
    # "stochastic", which truncates the fraction at 2**-32, at most 2**-35: fine enough that
    # rounding the 53-bit odd value gives what the exact value gives.
    return 262144.0 if mode == DP_STOCHASTIC else 1073741824.0


cdef inline double datapath_multiplier(float sa, float sb, float sy, int mode) noexcept nogil:
    # The datapath's multiplier, each operation one IEEE rounding in its precision:
    # divide round_P(round_P(sa * sb) / sy), reciprocal round_P(round_P(sa * sb) *
    # round_P(1 / sy)). float32 operands make C compute in float32 (SSE: FLT_EVAL_METHOD 0).
    # A NaN operand wins over a NaN later one (sa over sb, the product over the
    # reciprocal), as over a NaN divisor: product_nan_first.
    cdef float one32 = 1.0
    cdef float p32, r32
    cdef double p64
    if mode == MULT_F32_DIVIDE:
        p32 = product_nan_first_f32(sa, sb)
        return p32 / sy
    if mode == MULT_F32_RECIPROCAL:
        p32 = product_nan_first_f32(sa, sb)
        r32 = one32 / sy
        return product_nan_first_f32(p32, r32)
    p64 = product_nan_first_f64(<double>sa, <double>sb)  # exact: two 24-bit significands
    if mode == MULT_F64_DIVIDE:
        return p64 / <double>sy
    return product_nan_first_f64(p64, 1.0 / <double>sy)


cdef inline float float8_value(const RequantizeWork* w, double v, uint32_t word) noexcept nogil:
    # The rule's value v for the float8 encoder (docs/semantics.md, "The integer ops under
    # a datapath"): the exact value rounded to odd at 53 bits, the float64 rule's value, or
    # the float32 rule's. Without "stochastic": v rounded to odd at float32's 24 bits, which
    # the encoder rounds by any other mode as it would v. With "stochastic": v rounded here
    # onto the float8 grid (QuantizeLinear's step 3, the word added to the first 32 dropped
    # bits), unbounded above; the encoder then rounds nothing (it truncates: "toward_zero")
    # and applies saturation, NaN and flush. The 53-bit odd value holds the exact value's
    # first 32 dropped bits: they end at its bit 1 + 3 + 32 = 36 (e4m3; 35 for e5m2; a
    # subnormal result keeps fewer bits, so they end higher), above its sticky bit 53.
    # A nonzero v that rounds to 0 is passed as half the smallest subnormal with v's sign,
    # which the truncation makes a zero of v's sign, as "v + zero point, then round" gives
    # (a stored -0 plus a +0 zero point would be +0).
    cdef double r
    if not w.float_stochastic:
        return float_to_odd(v)
    if v == 0.0 or not isfinite(v):
        return <float>v
    r = round_to_small_float_value(v, w.sf_mantissa_bits, w.sf_min_exponent, DP_STOCHASTIC, word, False)
    if r == 0.0:
        return -w.sf_below_zero if v < 0.0 else w.sf_below_zero
    return <float>r


cdef inline int32_t saturate_code(double r, const RequantizeWork* w) noexcept nogil:
    # r: an integer value (or +-inf, NaN). NaN gives the datapath's code (ONNX: the
    # minimum, as QuantizeLinear).
    if isnan(r):
        return w.nan_code
    if r >= <double>w.hi:
        return w.hi
    if r <= <double>w.lo:
        return w.lo
    return <int32_t>r


cdef inline double ieee_value(double s, float sa, float sb, float sy) noexcept nogil:
    # (s * sa * sb) / sy in IEEE double, for non-finite or zero scales: of two NaN
    # operands the first wins (s's over sa's over sb's, then the division's own order),
    # product_nan_first, not the compiler's choice of operand order.
    return product_nan_first_f64(product_nan_first_f64(s, <double>sa), <double>sb) / <double>sy


cdef inline int32_t exact_code(int32_t acc, float sa, float sb, float sy,
                               const RequantizeWork* w, uint32_t word) noexcept nogil:
    cdef double p, t, v, r
    if not (isfinite(sa) and isfinite(sb) and isfinite(sy)) or sy == 0.0:
        v = ieee_value(<double>acc, sa, sb, sy)
        return saturate_code(v if isnan(v) else v + w.zero_point, w)
    if w.rounding != DP_HALF_EVEN:
        # Rounded to odd at 53 bits, below exact_limit: any mode then rounds it to an
        # integer as it would the exact value (Boldo and Melquiond).
        v = exact_value(acc, sa, sb, sy, 53)
        if fabs(v) >= exact_limit(w.rounding):
            return w.hi if v > 0 else w.lo
        return saturate_code(round_by(v, w.rounding, word) + w.zero_point, w)
    # A fast estimate, exact unless it lies within its error of a rounding midpoint:
    # p is exact (two 24-bit significands), t and v each add one rounding, so
    # |v - exact| <= 2**-51 |v| while nothing underflows (|t| >= 2**-960).
    p = <double>sa * <double>sb
    t = <double>acc * p
    v = t / <double>sy
    if isfinite(v) and fabs(v) >= 1073741824.0:
        return w.hi if v > 0 else w.lo
    if isfinite(v) and (acc == 0 or fabs(t) >= 1.0e-289):
        r = nearbyint(v)
        if fabs(fabs(v - r) - 0.5) > fabs(v) * 1.7763568394002505e-15 + 1e-300:
            return saturate_code(r + w.zero_point, w)
    v = exact_value(acc, sa, sb, sy, 53)
    if fabs(v) >= 1073741824.0:
        return w.hi if v > 0 else w.lo
    return saturate_code(nearbyint(v) + w.zero_point, w)


cdef inline float multiplier32(float sa, float sb, float sy) noexcept nogil:
    cdef float product = product_nan_first_f32(sa, sb)
    return product / sy


cdef inline double multiplier_in_format(float sa, float sb, float sy, int fmt) noexcept nogil:
    # numpy's a_scale * b_scale / y_scale on arrays of the scale type: each operation
    # rounded once to it (float16/bfloat16 products are exact in double; a double quotient
    # rounded again to 11 or 8 bits is the correctly rounded quotient, 53 >= 2p + 2).
    cdef float product
    if fmt == FMT_FLOAT32:
        return multiplier32(sa, sb, sy)
    product = round_to_value_format(product_nan_first_f64(<double>sa, <double>sb), 0.0, fmt)
    return round_to_value_format(<double>product / <double>sy, 0.0, fmt)


cdef void requantize_row_float32(const int32_t* acc, float m32, uint8_t* codes, Py_ssize_t n,
                                 const RequantizeWork* w) noexcept nogil:
    # The "float32" rule with one finite multiplier, branch-free so that it vectorizes.
    # The zero point is added in float32: exact while |round(v)| < 2**24, and beyond that
    # the sum, however rounded, stays outside [lo, hi] (a range within +-2**16), so the
    # clamp gives what the exact sum would.
    cdef Py_ssize_t c
    cdef float f
    cdef float zp = <float>w.zero_point
    cdef float lo = <float>w.lo
    cdef float hi = <float>w.hi
    for c in range(n):
        f = nearbyintf(<float>acc[c] * m32) + zp
        f = lo if f < lo else f
        f = hi if f > hi else f
        codes[c] = <uint8_t>(<int32_t>f & 0xFF)


cdef void requantize_row_float64(const int32_t* acc, double m64, uint8_t* codes, Py_ssize_t n,
                                 const RequantizeWork* w) noexcept nogil:
    # The "float64" rule with one finite multiplier (no NaN can arise), branch-free.
    cdef Py_ssize_t c
    cdef double d
    cdef double zp = <double>w.zero_point
    cdef double lo = <double>w.lo
    cdef double hi = <double>w.hi
    for c in range(n):
        d = nearbyint(<double>acc[c] * m64 + zp)
        d = lo if d < lo else d
        d = hi if d > hi else d
        codes[c] = <uint8_t>(<int32_t>d & 0xFF)


cdef bint requantize_row_exact(const int32_t* acc, float sa, float sb, uint8_t* codes, Py_ssize_t n,
                               const RequantizeWork* w) noexcept nogil:
    # The "exact" rule for a row with one scale product: v = acc * q, q = fl(sa * sb / sy)
    # (sa * sb is exact in double), is within |v| * 2**-51 of the exact value (two
    # roundings), so wherever v lies farther than |v| * 2**-49 from a rounding midpoint the
    # exact value rounds to the same integer; elsewhere exact_code decides. False when q
    # is not a normal double far from the limits (the caller then goes element by element).
    cdef double q, v, r
    cdef Py_ssize_t c
    if not (isfinite(sa) and isfinite(sb) and isfinite(w.y_scale)) or w.y_scale == 0.0:
        return False
    q = (<double>sa * <double>sb) / <double>w.y_scale
    if not (fabs(q) >= 1e-290 and fabs(q) <= 1e290):
        return False
    for c in range(n):
        v = <double>acc[c] * q
        if fabs(v) >= 1073741824.0:
            codes[c] = <uint8_t>((w.hi if v > 0 else w.lo) & 0xFF)
            continue
        r = nearbyint(v)
        if fabs(fabs(v - r) - 0.5) > fabs(v) * 1.7763568394002505e-15 + 1e-300:
            codes[c] = <uint8_t>(saturate_code(r + w.zero_point, w) & 0xFF)
        else:
            codes[c] = <uint8_t>(exact_code(acc[c], sa, sb, w.y_scale, w, 0) & 0xFF)
    return True


cdef void requantize_with_multiplier(const RequantizeWork* w, Py_ssize_t i, bint finite, i128 n,
                                     int shift, double s, float sa, float sb) noexcept nogil:
    # One output under the datapath's multiplier m (docs/semantics.md, "The integer ops
    # under a datapath"): the value S = n * 2**-shift (finite; an int32 accumulator has
    # shift 0) or the IEEE sum s, times m by the rule: "exact" S * m exactly, rounded once
    # (a non-finite m: the IEEE product), "float32" fl32(fl32(S) * m), "float64"
    # fl64(fl64(S) * m) + zp.
    cdef double m = datapath_multiplier(sa, sb, w.y_scale, w.multiplier)
    cdef double v, d
    cdef float v32
    cdef uint32_t word = w.words[i] if w.words != NULL else 0
    if w.rule == RULE_EXACT:
        if finite and isfinite(m):
            v = times_wide(n, -shift, m, 53)
            if w.float_output:
                w.values[i] = float8_value(w, v, word)
            elif fabs(v) >= exact_limit(w.rounding):
                w.codes[i] = <uint8_t>((w.hi if v > 0 else w.lo) & 0xFF)
            else:
                w.codes[i] = <uint8_t>(saturate_code(round_by(v, w.rounding, word) + w.zero_point, w) & 0xFF)
            return
        if finite:
            s = round_i128(n, -shift, 53, 0)  # only its sign and zeroness matter: m is not finite
        v = s * m
        if w.float_output:
            w.values[i] = <float>v
        else:
            w.codes[i] = <uint8_t>(saturate_code(v if isnan(v) else v + w.zero_point, w) & 0xFF)
        return
    if w.rule == RULE_FLOAT32:
        if finite:
            s = round_i128(n, -shift, 53, 1)  # to odd: the float32 conversion is then fl32(S)
        v32 = <float>s * <float>m  # m is a float32 value (check_datapath_codes)
        if w.float_output:
            w.values[i] = float8_value(w, v32, word) if w.float_stochastic else v32
        else:
            w.codes[i] = <uint8_t>(saturate_code(v32 if isnan(v32) else round_by(v32, w.rounding, word) + w.zero_point, w) & 0xFF)
        return
    if finite:
        s = round_i128(n, -shift, 53, 0)  # fl64(S)
    d = s * m
    if w.float_output:
        w.values[i] = float8_value(w, d, word)
    else:
        w.codes[i] = <uint8_t>(saturate_code(round_by(d + <double>w.zero_point, w.rounding, word), w) & 0xFF)


cdef void requantize_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const RequantizeWork* w = <const RequantizeWork*>work
    cdef Py_ssize_t r, c, i
    cdef int32_t acc, code
    cdef float sa, sb, m32, v32
    cdef double m64, d
    cdef uint32_t word
    for r in range(task * ROW_BLOCK, min((task + 1) * ROW_BLOCK, w.rows)):
        sa = w.row_scale[r]
        # One multiplier for the whole row (the columns share a scale: QLinearConv's
        # x_scale, a per-tensor b_scale): the rule's per-element arithmetic without the
        # per-element division.
        if (w.uniform_cols and not w.float_output and w.rule == RULE_EXACT and w.rounding == DP_HALF_EVEN
                and w.multiplier == MULT_RULE):
            if requantize_row_exact(w.acc + r * w.cols, sa, w.col_scale[0], w.codes + r * w.cols, w.cols, w):
                continue
        if (w.uniform_cols and not w.float_output and w.rule != RULE_EXACT and w.rounding == DP_HALF_EVEN
                and w.multiplier == MULT_RULE):
            if w.rule == RULE_FLOAT32:
                m32 = multiplier32(sa, w.col_scale[0], w.y_scale)
                if isfinite(m32):
                    requantize_row_float32(w.acc + r * w.cols, m32, w.codes + r * w.cols, w.cols, w)
                    continue
            else:
                m64 = multiplier_in_format(sa, w.col_scale[0], w.y_scale, w.scale_format)
                if isfinite(m64):
                    requantize_row_float64(w.acc + r * w.cols, m64, w.codes + r * w.cols, w.cols, w)
                    continue
        for c in range(w.cols):
            i = r * w.cols + c
            acc = w.acc[i]
            sb = w.col_scale[c]
            word = w.words[i] if w.words != NULL else 0
            if w.multiplier != MULT_RULE:
                requantize_with_multiplier(w, i, True, acc, 0, 0.0, sa, sb)
                continue
            if w.rule == RULE_EXACT:
                if w.float_output:
                    if not (isfinite(sa) and isfinite(sb) and isfinite(w.y_scale)) or w.y_scale == 0.0:
                        w.values[i] = <float>ieee_value(<double>acc, sa, sb, w.y_scale)
                    else:
                        w.values[i] = float8_value(w, exact_value(acc, sa, sb, w.y_scale, 53), word)
                    continue
                code = exact_code(acc, sa, sb, w.y_scale, w, word)
            elif w.rule == RULE_FLOAT32:
                m32 = multiplier32(sa, sb, w.y_scale)
                v32 = <float>acc * m32
                if w.float_output:
                    w.values[i] = float8_value(w, v32, word) if w.float_stochastic else v32
                    continue
                code = saturate_code(v32 if isnan(v32) else round_by(v32, w.rounding, word) + w.zero_point, w)
            else:
                m64 = multiplier_in_format(sa, sb, w.y_scale, w.scale_format)
                d = <double>acc * m64
                if w.float_output:
                    w.values[i] = float8_value(w, d, word)
                    continue
                d = d + <double>w.zero_point
                code = saturate_code(round_by(d, w.rounding, word), w)
            w.codes[i] = <uint8_t>(code & 0xFF)


def requantize(const int32_t[:, ::1] acc, const float[::1] row_scale, const float[::1] col_scale,
               float y_scale, out, RequantizeConfig config, int n_threads,
               const uint32_t[::1] random_bits=None):
    """Accumulators to output codes (uint8 storage of int8/uint8 codes) or, with
    config.float_output, to float32 values rounded to odd for the float8 encoder;
    random_bits (one word per accumulator, C order) with the rounding "stochastic"."""
    cdef RequantizeWork work
    cdef Py_ssize_t i
    cdef uint8_t[:, ::1] codes
    cdef float[:, ::1] values
    if row_scale.shape[0] != acc.shape[0] or col_scale.shape[0] != acc.shape[1]:
        raise ValueError("requantize: scales differ from the accumulator's shape")
    work.acc = &acc[0, 0] if acc.size else NULL
    work.row_scale = &row_scale[0] if row_scale.shape[0] else NULL
    work.col_scale = &col_scale[0] if col_scale.shape[0] else NULL
    work.y_scale = y_scale
    work.rows = acc.shape[0]
    work.cols = acc.shape[1]
    work.rule = config.rule
    work.scale_format = config.scale_format
    work.float_output = config.float_output
    work.zero_point = config.zero_point
    work.lo = config.lo
    work.hi = config.hi
    work.codes = NULL
    work.values = NULL
    work.uniform_cols = True
    work.rounding = config.rounding
    work.nan_code = nan_code_of(config.nan_to_integer, config.zero_point, config.lo, config.hi)
    work.multiplier = config.multiplier
    work.words = random_words(config.rounding, config.float_output, random_bits, acc.size, "requantize")
    set_float8_rounding(&work, config.float_output, config.rounding, config.small_float_id)
    for i in range(1, col_scale.shape[0]):
        if float_bits(col_scale[i]) != float_bits(col_scale[0]):
            work.uniform_cols = False
            break
    if config.float_output:
        values = out
        if values.shape[0] != acc.shape[0] or values.shape[1] != acc.shape[1]:
            raise ValueError("requantize: out differs from the accumulator's shape")
        work.values = &values[0, 0] if values.size else NULL
    else:
        codes = out
        if codes.shape[0] != acc.shape[0] or codes.shape[1] != acc.shape[1]:
            raise ValueError("requantize: out differs from the accumulator's shape")
        work.codes = &codes[0, 0] if codes.size else NULL
    if acc.size == 0:
        return
    with nogil:
        run_tasks(requantize_task, &work, (work.rows + ROW_BLOCK - 1) // ROW_BLOCK, n_threads)


# --- QLinearMatMul-21 with float8 operands -------------------------------------------------
#
# Each operand value (a float8 code decoded, or an integer code minus its zero point) is an
# integer multiple of 2**-F with F the operand type's fraction bits (2**-F its smallest
# subnormal; F = 0 for integer codes), and |value| * 2**F < 2**34 (float8e5m2fnuz:
# 57344 * 2**17 < 2**33). A product of two such integers is below 2**67 in magnitude, so a
# signed 128-bit sum of K of them is exact for K < 2**60: S = n * 2**-(Fa + Fb) exactly. The
# rules then read S as docs/semantics.md states: "exact" rounds S * sa * sb / sy once,
# "float32" starts from fl32(S), "float64" from fl64(S).



cdef class FloatMatmulConfig:
    """QLinearMatMul-21 with a float8 operand: the requantization (as RequantizeConfig)
    and `shift`, the fraction bits Fa + Fb of the operands' fixed-point integers."""
    cdef readonly int rule
    cdef readonly int scale_format
    cdef readonly bint float_output
    cdef readonly int32_t zero_point
    cdef readonly int32_t lo
    cdef readonly int32_t hi
    cdef readonly int shift
    cdef readonly int rounding
    cdef readonly int nan_to_integer
    cdef readonly int multiplier
    cdef readonly int small_float_id

    def __init__(self, *, str rule, str scale_format, bint float_output, int shift,
                 int zero_point=0, int lo=0, int hi=0, int rounding=DP_HALF_EVEN,
                 int nan_to_integer=DP_NAN_MIN, int multiplier=MULT_RULE, int small_float_id=-1):
        if rule not in RULES:
            raise ValueError(f"FloatMatmulConfig: unknown rule {rule!r}")
        if scale_format not in SCALE_FORMATS:
            raise ValueError(f"FloatMatmulConfig: unknown scale format {scale_format!r}")
        if not float_output and not (lo <= zero_point <= hi):
            raise ValueError("FloatMatmulConfig: zero point outside [lo, hi]")
        if not 0 <= shift <= 40:
            raise ValueError(f"FloatMatmulConfig: shift={shift}; allowed 0..40")
        check_datapath_codes("FloatMatmulConfig", rounding, nan_to_integer, multiplier, RULES[rule])
        check_float8_output("FloatMatmulConfig", float_output, rounding, small_float_id)
        self.small_float_id = small_float_id
        self.multiplier = multiplier
        self.rounding = rounding
        self.nan_to_integer = nan_to_integer
        self.rule = RULES[rule]
        self.scale_format = SCALE_FORMATS[scale_format]
        self.float_output = float_output
        self.zero_point = zero_point
        self.lo = lo
        self.hi = hi
        self.shift = shift


cdef struct FloatMatmulWork:
    RequantizeWork rq          # rule, output range and pointers; acc unused
    const int64_t* a_fixed     # [a_items, rows, depth]
    const int64_t* bt_fixed    # [b_items, cols, depth]
    const double* a_values     # the same operands as IEEE values (read for non-finite rows)
    const double* bt_values
    const uint8_t* row_special  # [a_items, rows]: the row holds a NaN or an infinity
    const uint8_t* col_special  # [b_items, cols]
    const Py_ssize_t* a_item
    const Py_ssize_t* b_item
    const float* col_scales    # [items, cols]
    Py_ssize_t depth
    int shift


cdef inline double bits_double_nan() noexcept nogil:
    cdef uint64_t b = 0x7FF8000000000000
    cdef double d
    memcpy(&d, &b, 8)
    return d


cdef inline void requantize_sum(const RequantizeWork* w, Py_ssize_t i, bint finite, i128 n,
                                int shift, double s, float sa, float sb) noexcept nogil:
    # One output from the exact sum n * 2**-shift (finite) or the IEEE sum s (a NaN or an
    # infinity), under the rule.
    cdef double v, m64, d
    cdef float m32, v32
    cdef bint scales_ok = isfinite(sa) and isfinite(sb) and isfinite(w.y_scale) and w.y_scale != 0.0
    cdef uint32_t word = w.words[i] if w.words != NULL else 0
    if w.multiplier != MULT_RULE:
        requantize_with_multiplier(w, i, finite, n, shift, s, sa, sb)
        return
    if w.rule == RULE_EXACT:
        if finite and scales_ok:
            v = exact_value_wide(n, -shift, sa, sb, w.y_scale, 53)
            if w.float_output:
                w.values[i] = float8_value(w, v, word)
            elif fabs(v) >= exact_limit(w.rounding):
                w.codes[i] = <uint8_t>((w.hi if v > 0 else w.lo) & 0xFF)
            else:
                w.codes[i] = <uint8_t>(saturate_code(round_by(v, w.rounding, word) + w.zero_point, w) & 0xFF)
            return
        if finite:
            s = round_i128(n, -shift, 53, 0)
        v = ieee_value(s, sa, sb, w.y_scale)
        if w.float_output:
            w.values[i] = <float>v
        else:
            w.codes[i] = <uint8_t>(saturate_code(v if isnan(v) else v + w.zero_point, w) & 0xFF)
        return
    if w.rule == RULE_FLOAT32:
        if finite:
            s = round_i128(n, -shift, 53, 1)  # to odd: the float32 conversion is then fl32(S)
        m32 = multiplier32(sa, sb, w.y_scale)
        v32 = <float>s * m32
        if w.float_output:
            w.values[i] = float8_value(w, v32, word) if w.float_stochastic else v32
        else:
            w.codes[i] = <uint8_t>(saturate_code(v32 if isnan(v32) else round_by(v32, w.rounding, word) + w.zero_point, w) & 0xFF)
        return
    if finite:
        s = round_i128(n, -shift, 53, 0)  # fl64(S)
    m64 = multiplier_in_format(sa, sb, w.y_scale, w.scale_format)
    d = s * m64
    if w.float_output:
        w.values[i] = float8_value(w, d, word)
    else:
        w.codes[i] = <uint8_t>(saturate_code(round_by(d + <double>w.zero_point, w.rounding, word), w) & 0xFF)


cdef void float_matmul_task(const void* work, Py_ssize_t task) noexcept nogil:
    # One output row: task = item * rows + row.
    cdef const FloatMatmulWork* w = <const FloatMatmulWork*>work
    cdef Py_ssize_t rows = w.rq.rows
    cdef Py_ssize_t cols = w.rq.cols
    cdef Py_ssize_t item = task // rows
    cdef Py_ssize_t r = task % rows
    cdef Py_ssize_t ai = w.a_item[item]
    cdef Py_ssize_t bi = w.b_item[item]
    cdef const int64_t* arow = w.a_fixed + (ai * rows + r) * w.depth
    cdef const double* avals = w.a_values + (ai * rows + r) * w.depth
    cdef bint row_special = w.row_special[ai * rows + r]
    cdef const int64_t* bcol
    cdef const double* bvals
    cdef Py_ssize_t c, k
    cdef i128 n
    cdef double s
    cdef float sa = w.rq.row_scale[task]
    for c in range(cols):
        if row_special or w.col_special[bi * cols + c]:
            bvals = w.bt_values + (bi * cols + c) * w.depth
            s = 0.0
            for k in range(w.depth):
                s = s + avals[k] * bvals[k]
            if isnan(s):
                s = bits_double_nan()  # one NaN whatever the order: quiet, sign clear
            requantize_sum(&w.rq, task * cols + c, False, 0, w.shift, s, sa,
                           w.col_scales[item * cols + c])
            continue
        bcol = w.bt_fixed + (bi * cols + c) * w.depth
        n = 0
        for k in range(w.depth):
            n = n + <i128>arow[k] * bcol[k]
        requantize_sum(&w.rq, task * cols + c, True, n, w.shift, 0.0, sa,
                       w.col_scales[item * cols + c])


def float_matmul_requantize(const int64_t[:, :, ::1] a_fixed, const int64_t[:, :, ::1] bt_fixed,
                            const double[:, :, ::1] a_values, const double[:, :, ::1] bt_values,
                            const uint8_t[:, ::1] row_special, const uint8_t[:, ::1] col_special,
                            const Py_ssize_t[::1] a_item, const Py_ssize_t[::1] b_item,
                            const float[::1] row_scale, const float[:, ::1] col_scale,
                            float y_scale, out, FloatMatmulConfig config, int n_threads,
                            const uint32_t[::1] random_bits=None):
    """QLinearMatMul-21 with a float8 operand: for each item t, row r, column c the exact
    sum S of a_fixed[a_item[t], r, :] * bt_fixed[b_item[t], c, :] * 2**-shift (or, where
    the row or column holds a NaN or an infinity, the IEEE sum of the values), requantized
    under the config's rule into out [items * rows, cols] (uint8 codes, or float32 values
    rounded to odd for the float8 encoder)."""
    cdef FloatMatmulWork work
    cdef Py_ssize_t items = a_item.shape[0]
    cdef Py_ssize_t rows = a_fixed.shape[1]
    cdef Py_ssize_t depth = a_fixed.shape[2]
    cdef Py_ssize_t cols = bt_fixed.shape[1]
    cdef Py_ssize_t t
    cdef uint8_t[:, ::1] codes
    cdef float[:, ::1] values
    if (bt_fixed.shape[2] != depth or a_values.shape[0] != a_fixed.shape[0]
            or a_values.shape[1] != rows or a_values.shape[2] != depth
            or bt_values.shape[0] != bt_fixed.shape[0] or bt_values.shape[1] != cols
            or bt_values.shape[2] != depth or row_special.shape[0] != a_fixed.shape[0]
            or row_special.shape[1] != rows or col_special.shape[0] != bt_fixed.shape[0]
            or col_special.shape[1] != cols or b_item.shape[0] != items
            or row_scale.shape[0] != items * rows or col_scale.shape[0] != items
            or col_scale.shape[1] != cols):
        raise ValueError("float_matmul_requantize: the arrays do not match")
    for t in range(items):
        if not (0 <= a_item[t] < a_fixed.shape[0] and 0 <= b_item[t] < bt_fixed.shape[0]):
            raise ValueError("float_matmul_requantize: an item index is out of range")
    work.rq.acc = NULL
    work.rq.row_scale = &row_scale[0] if row_scale.shape[0] else NULL
    work.rq.col_scale = NULL
    work.rq.y_scale = y_scale
    work.rq.rows = rows
    work.rq.cols = cols
    work.rq.rule = config.rule
    work.rq.scale_format = config.scale_format
    work.rq.float_output = config.float_output
    work.rq.zero_point = config.zero_point
    work.rq.lo = config.lo
    work.rq.hi = config.hi
    work.rq.codes = NULL
    work.rq.values = NULL
    work.rq.uniform_cols = False
    work.rq.rounding = config.rounding
    work.rq.nan_code = nan_code_of(config.nan_to_integer, config.zero_point, config.lo, config.hi)
    work.rq.multiplier = config.multiplier
    work.rq.words = random_words(config.rounding, config.float_output, random_bits, items * rows * cols,
                                 "float_matmul_requantize")
    set_float8_rounding(&work.rq, config.float_output, config.rounding, config.small_float_id)
    if config.float_output:
        values = out
        if values.shape[0] != items * rows or values.shape[1] != cols:
            raise ValueError("float_matmul_requantize: out has the wrong shape")
        work.rq.values = &values[0, 0] if values.size else NULL
    else:
        codes = out
        if codes.shape[0] != items * rows or codes.shape[1] != cols:
            raise ValueError("float_matmul_requantize: out has the wrong shape")
        work.rq.codes = &codes[0, 0] if codes.size else NULL
    if items * rows == 0 or cols == 0:
        return
    work.a_fixed = &a_fixed[0, 0, 0] if a_fixed.size else NULL
    work.bt_fixed = &bt_fixed[0, 0, 0] if bt_fixed.size else NULL
    work.a_values = &a_values[0, 0, 0] if a_values.size else NULL
    work.bt_values = &bt_values[0, 0, 0] if bt_values.size else NULL
    work.row_special = &row_special[0, 0]
    work.col_special = &col_special[0, 0]
    work.a_item = &a_item[0]
    work.b_item = &b_item[0]
    work.col_scales = &col_scale[0, 0]
    work.depth = depth
    work.shift = config.shift
    with nogil:
        run_tasks(float_matmul_task, &work, items * rows, n_threads)


def exact_to_odd(int64_t acc, float sa, float sb, float sy, int p):
    """The kernel's exact value acc*sa*sb/sy rounded to odd with p bits (tests use it)."""
    return exact_value(acc, sa, sb, sy, p)
