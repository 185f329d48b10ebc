# The integer datapath's kernels (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv):
# the int32 wrap of exact sums (plus the bias), the VPMADDUBSW pair-saturating accumulation
# profile, and the requantization under the three named rules of docs/semantics.md.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.math cimport fabs, fabsf, nearbyint, nearbyintf, isnan, isinf, isfinite
from libc.stdint cimport int8_t, uint8_t, int32_t, uint32_t, int64_t, uint64_t

from _codecs cimport (float_bits, bits_float, round_to_value_format, FMT_FLOAT32,
                      FMT_FLOAT16, FMT_BFLOAT16)
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

RULES = {"exact": RULE_EXACT, "float32": RULE_FLOAT32, "float64": RULE_FLOAT64}
SCALE_FORMATS = {"float": FMT_FLOAT32, "float16": FMT_FLOAT16, "bfloat16": FMT_BFLOAT16}


# --- int32 wrap of exact sums ------------------------------------------------------------

cdef struct WrapWork:
    const double* sums
    const int32_t* bias   # NULL, or one per row / per column
    int bias_per_row
    Py_ssize_t rows
    Py_ssize_t cols
    int32_t* out


cdef void wrap_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const WrapWork* w = <const WrapWork*>work
    cdef Py_ssize_t r, c
    cdef int64_t s
    cdef uint32_t wrapped
    for r in range(task * ROW_BLOCK, min((task + 1) * ROW_BLOCK, w.rows)):
        for c in range(w.cols):
            # Exact integers below 2**53 (the caller's bound), so the conversion is exact.
            s = <int64_t>w.sums[r * w.cols + c]
            wrapped = <uint32_t>(<uint64_t>s)
            if w.bias != NULL:
                wrapped = wrapped + <uint32_t>(w.bias[r] if w.bias_per_row else w.bias[c])
            w.out[r * w.cols + c] = <int32_t>wrapped


def wrap_sums(const double[:, ::1] sums, bias, bint bias_per_row, int32_t[:, ::1] out,
              int n_threads):
    """out = (sums + bias) modulo 2**32 as int32; sums are exact integers below 2**53."""
    cdef WrapWork work
    cdef const int32_t[::1] bias_view
    if sums.shape[0] != out.shape[0] or sums.shape[1] != out.shape[1]:
        raise ValueError("wrap_sums: sums and out differ in shape")
    work.sums = &sums[0, 0] if sums.size else NULL
    work.out = &out[0, 0] if out.size else NULL
    work.rows = sums.shape[0]
    work.cols = sums.shape[1]
    work.bias = NULL
    work.bias_per_row = bias_per_row
    if bias is not None:
        bias_view = bias
        if bias_view.shape[0] != (work.rows if bias_per_row else work.cols):
            raise ValueError("wrap_sums: bias length differs from its axis")
        work.bias = &bias_view[0] if bias_view.shape[0] else NULL
    if sums.size == 0:
        return
    with nogil:
        run_tasks(wrap_task, &work, (work.rows + ROW_BLOCK - 1) // ROW_BLOCK, n_threads)


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


# --- requantization ----------------------------------------------------------------------

cdef class RequantizeConfig:
    """How accumulators become output codes: the rule, the scale type (for the "float64"
    rule's multiplier), and either an integer output (zero point, range, code mask) or
    float32 values for a float8 encoder (float_output)."""
    cdef readonly int rule
    cdef readonly int scale_format
    cdef readonly bint float_output
    cdef readonly int32_t zero_point
    cdef readonly int32_t lo
    cdef readonly int32_t hi

    def __init__(self, *, str rule, str scale_format, bint float_output, int zero_point=0,
                 int lo=0, int hi=0):
        if rule not in RULES:
            raise ValueError(f"RequantizeConfig: unknown rule {rule!r}")
        if scale_format not in SCALE_FORMATS:
            raise ValueError(f"RequantizeConfig: unknown scale format {scale_format!r}")
        if not float_output and not (lo <= zero_point <= hi):
            raise ValueError("RequantizeConfig: zero point outside [lo, hi]")
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


cdef inline int32_t saturate_code(double r, const RequantizeWork* w) noexcept nogil:
    # r: an integer value (or +-inf, NaN). NaN gives the minimum, as QuantizeLinear.
    if isnan(r):
        return w.lo
    if r >= <double>w.hi:
        return w.hi
    if r <= <double>w.lo:
        return w.lo
    return <int32_t>r


cdef inline int32_t exact_code(int32_t acc, float sa, float sb, float sy,
                               const RequantizeWork* w) noexcept nogil:
    cdef double p, t, v, r
    if not (isfinite(sa) and isfinite(sb) and isfinite(sy)) or sy == 0.0:
        v = (<double>acc * sa * sb) / sy
        return saturate_code(v if isnan(v) else v + w.zero_point, w)
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
    cdef float product = sa * sb
    return product / sy


cdef inline double multiplier_in_format(float sa, float sb, float sy, int fmt) noexcept nogil:
    # numpy's a_scale * b_scale / y_scale on arrays of the scale type: each operation
    # rounded once to it (float16/bfloat16 products are exact in double; a double quotient
    # rounded again to 11 or 8 bits is the correctly rounded quotient, 53 >= 2p + 2).
    cdef float product
    if fmt == FMT_FLOAT32:
        return multiplier32(sa, sb, sy)
    product = round_to_value_format(<double>sa * <double>sb, 0.0, fmt)
    return round_to_value_format(<double>product / <double>sy, 0.0, fmt)


cdef void requantize_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const RequantizeWork* w = <const RequantizeWork*>work
    cdef Py_ssize_t r, c, i
    cdef int32_t acc, code
    cdef float sa, sb, m32, v32
    cdef double m64, d
    for r in range(task * ROW_BLOCK, min((task + 1) * ROW_BLOCK, w.rows)):
        sa = w.row_scale[r]
        for c in range(w.cols):
            i = r * w.cols + c
            acc = w.acc[i]
            sb = w.col_scale[c]
            if w.rule == RULE_EXACT:
                if w.float_output:
                    if not (isfinite(sa) and isfinite(sb) and isfinite(w.y_scale)) or w.y_scale == 0.0:
                        w.values[i] = <float>((<double>acc * sa * sb) / w.y_scale)
                    else:
                        w.values[i] = float_to_odd(exact_value(acc, sa, sb, w.y_scale, 53))
                    continue
                code = exact_code(acc, sa, sb, w.y_scale, w)
            elif w.rule == RULE_FLOAT32:
                m32 = multiplier32(sa, sb, w.y_scale)
                v32 = <float>acc * m32
                if w.float_output:
                    w.values[i] = v32
                    continue
                code = saturate_code(v32 if isnan(v32) else <double>nearbyintf(v32) + w.zero_point, w)
            else:
                m64 = multiplier_in_format(sa, sb, w.y_scale, w.scale_format)
                d = <double>acc * m64
                if w.float_output:
                    w.values[i] = float_to_odd(d)
                    continue
                d = d + <double>w.zero_point
                code = saturate_code(nearbyint(d), w)
            w.codes[i] = <uint8_t>(code & 0xFF)


def requantize(const int32_t[:, ::1] acc, const float[::1] row_scale, const float[::1] col_scale,
               float y_scale, out, RequantizeConfig config, int n_threads):
    """Accumulators to output codes (uint8 storage of int8/uint8 codes) or, with
    config.float_output, to float32 values rounded to odd for the float8 encoder."""
    cdef RequantizeWork work
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


def exact_to_odd(int64_t acc, float sa, float sb, float sy, int p):
    """The kernel's exact value acc*sa*sb/sy rounded to odd with p bits (tests use it)."""
    return exact_value(acc, sa, sb, sy, p)
