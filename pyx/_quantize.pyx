# QuantizeLinear kernels: per-tensor, per-axis and blocked, for every x storage and every
# quantized encoding. The Python layer (qemu_q/_ops.py) validates, resolves the op version
# and hands over contiguous arrays, double-precision scales and zero points.

from cython.parallel cimport prange
from libc.stdint cimport uint8_t, uint16_t, int32_t

from _layout cimport Layout, Segment, make_layout, layout_tasks, next_segment

from _codecs cimport (
    x_storage_t, code_storage_t, SmallFloatFormat, small_float_format,
    FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, FMT_INT32, CODE_INTEGER,
    float16_to_float, bfloat16_to_float, divide_to_value_format,
    encode_integer, encode_small_float,
)

# Elements per task where the work is a flat run: large enough to amortise the
# scheduling, small enough to balance two to sixteen threads on megabyte tensors.
cdef struct QuantizePlan:
    int x_format
    int precision
    bint fast_divide
    int code_kind
    float lo
    float hi
    int mask
    bint saturate
    SmallFloatFormat small_float


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
    return encode_small_float(q + <float>zero_point, &p.small_float, p.saturate)


cdef inline void quantize_run(const x_storage_t* x, code_storage_t* y, Py_ssize_t n,
                              const double* scale, const double* zero_point, bint scale_varies,
                              const QuantizePlan* plan) noexcept nogil:
    # The plan is copied to the stack: stores through y (a character type may alias
    # anything) would otherwise force the compiler to reload every field per element.
    cdef QuantizePlan p = plan[0]
    cdef Py_ssize_t i
    cdef float s = <float>scale[0]
    cdef float z = <float>zero_point[0]
    if x_storage_t is float:
        if p.fast_divide and p.code_kind == CODE_INTEGER:
            if scale_varies:
                for i in range(n):
                    y[i] = <code_storage_t>encode_integer(x[i] / <float>scale[i], <float>zero_point[i], p.lo, p.hi, p.mask)
            else:
                for i in range(n):
                    y[i] = <code_storage_t>encode_integer(x[i] / s, z, p.lo, p.hi, p.mask)
            return
    if scale_varies:
        for i in range(n):
            y[i] = <code_storage_t>quantize_one(x[i], scale[i], zero_point[i], &p)
    else:
        for i in range(n):
            y[i] = <code_storage_t>quantize_one(x[i], scale[0], zero_point[0], &p)


cdef inline void quantize_task(const x_storage_t* x, code_storage_t* y, const double* scale,
                               const double* zero_point, const Layout* layout,
                               const QuantizePlan* p, Py_ssize_t task) noexcept nogil:
    cdef Segment seg
    cdef Py_ssize_t k = 0
    while next_segment(layout, task, k, &seg):
        quantize_run(x + seg.start, y + seg.start, seg.length, scale + seg.param_index,
                     zero_point + seg.param_index, seg.params_vary, p)
        k += 1


def quantize(const x_storage_t[::1] x, const double[::1] scale, const double[::1] zero_point,
             code_storage_t[::1] out, Py_ssize_t outer, Py_ssize_t axis_len, Py_ssize_t inner,
             int granularity, Py_ssize_t block_size, int x_format, int precision,
             bint fast_divide, int code_kind, double lo, double hi, int mask,
             int small_float_id, bint saturate, int n_threads):
    """Quantize x (flattened, C order, viewed as outer x axis_len x inner) into `out`.

    scale and zero_point hold one value per tensor, per axis index, or per block
    (outer x n_blocks x inner). Integer codes are clamped to [lo, hi] and masked with
    `mask` (the storage of int4/int2 keeps only the low bits); small-float codes follow
    `small_float_id` and `saturate`.
    """
    cdef QuantizePlan p
    cdef Layout layout = make_layout(x.shape[0], outer, axis_len, inner, granularity, block_size)
    cdef Py_ssize_t n_tasks = layout_tasks(&layout)
    cdef Py_ssize_t task
    p.x_format = x_format
    p.precision = precision
    p.fast_divide = fast_divide
    p.code_kind = code_kind
    p.lo = <float>lo
    p.hi = <float>hi
    p.mask = mask
    p.saturate = saturate
    p.small_float = small_float_format(small_float_id if code_kind != CODE_INTEGER else 0)
    if n_tasks == 0:
        return
    if n_threads > 1:
        for task in prange(n_tasks, nogil=True, schedule='static', num_threads=n_threads):
            quantize_task(&x[0], &out[0], &scale[0], &zero_point[0], &layout, &p, task)
    else:
        with nogil:
            for task in range(n_tasks):
                quantize_task(&x[0], &out[0], &scale[0], &zero_point[0], &layout, &p, task)
