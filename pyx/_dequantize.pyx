# DequantizeLinear kernels: y = (x - zero_point) * scale, rounded once to the output type
# (which, from version 19 on, is also the precision of the multiplication).

from cython.parallel cimport prange
from libc.math cimport fabs, fma
from libc.stdint cimport uint8_t, uint16_t, int16_t, int32_t, int64_t

from _codecs cimport (
    y_storage_t, SmallFloatFormat, small_float_format, decode_small_float,
    FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, round_to_value_format,
    pack_value_format,
)
from _layout cimport Layout, Segment, make_layout, layout_tasks, next_segment


# Storage of DequantizeLinear's x: 8-bit codes of every kind (decoded through a 256-entry
# table), 16-bit integers, int32.
ctypedef fused dq_code_t:
    uint8_t
    uint16_t
    int32_t


cdef struct DequantizePlan:
    const float* table      # value of each 8-bit code
    bint signed16           # uint16_t storage holds int16
    int out_format


cdef inline float code_value(dq_code_t c, const DequantizePlan* p) noexcept nogil:
    if dq_code_t is uint8_t:
        return p.table[c]
    elif dq_code_t is uint16_t:
        return <float>(<int16_t>c) if p.signed16 else <float>c
    else:
        return <float>c  # unused: int32 codes take the exact path


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


cdef inline void dequantize_run(const dq_code_t* x, y_storage_t* y, Py_ssize_t n,
                                const double* scale, const double* zero_point, bint params_vary,
                                const DequantizePlan* plan) noexcept nogil:
    # A stack copy of the plan: stores through y must not force reloads of its fields.
    cdef DequantizePlan p = plan[0]
    cdef Py_ssize_t i, k
    cdef float d, v
    cdef float s = <float>scale[0]
    cdef float z = <float>zero_point[0]
    if dq_code_t is int32_t:
        for i in range(n):
            k = i if params_vary else 0
            store(y, i, dequantize_int32(x[i], scale[k], zero_point[k], p.out_format), p.out_format)
        return
    if y_storage_t is float:
        # Codes and zero points below 2**17 and 4-bit-mantissa small floats make x - zp
        # exact in float32, and the float32 product of it with a float32 scale is the
        # correctly rounded exact product. A NaN code wins over a NaN scale, whatever
        # operand order the vectoriser picks.
        if params_vary:
            for i in range(n):
                d = code_value(x[i], &p) - <float>zero_point[i]
                v = d * <float>scale[i]
                y[i] = v if d == d else d
        else:
            for i in range(n):
                d = code_value(x[i], &p) - z
                v = d * s
                y[i] = v if d == d else d
        return
    # float16 / bfloat16 outputs: the exact product in double (at most 41 bits), rounded once.
    for i in range(n):
        k = i if params_vary else 0
        d = code_value(x[i], &p) - <float>zero_point[k]
        v = round_to_value_format(<double>d * scale[k], 0.0, p.out_format) if d == d else d
        y[i] = pack_value_format(v, p.out_format)


cdef inline void dequantize_task(const dq_code_t* x, y_storage_t* y, const double* scale,
                                 const double* zero_point, const Layout* layout,
                                 const DequantizePlan* p, Py_ssize_t task) noexcept nogil:
    cdef Segment seg
    cdef Py_ssize_t k = 0
    while next_segment(layout, task, k, &seg):
        dequantize_run(x + seg.start, y + seg.start, seg.length, scale + seg.param_index,
                       zero_point + seg.param_index, seg.params_vary, p)
        k += 1


def dequantize(const dq_code_t[::1] x, const double[::1] scale, const double[::1] zero_point,
               y_storage_t[::1] out, Py_ssize_t outer, Py_ssize_t axis_len, Py_ssize_t inner,
               int granularity, Py_ssize_t block_size, const float[::1] table, bint signed16,
               int out_format, int n_threads):
    """Dequantize codes x (flattened, C order, outer x axis_len x inner) into `out`.

    8-bit codes are decoded through `table` (256 values); 16-bit codes are int16 when
    `signed16`. `out` holds float32 values or float16/bfloat16 bit patterns (out_format).
    """
    cdef DequantizePlan p
    cdef Layout layout = make_layout(x.shape[0], outer, axis_len, inner, granularity, block_size)
    cdef Py_ssize_t n_tasks = layout_tasks(&layout)
    cdef Py_ssize_t task
    p.table = &table[0]
    p.signed16 = signed16
    p.out_format = out_format
    if n_tasks == 0:
        return
    if n_threads > 1:
        for task in prange(n_tasks, nogil=True, schedule='static', num_threads=n_threads):
            dequantize_task(&x[0], &out[0], &scale[0], &zero_point[0], &layout, &p, task)
    else:
        with nogil:
            for task in range(n_tasks):
                dequantize_task(&x[0], &out[0], &scale[0], &zero_point[0], &layout, &p, task)


def decode_table(int small_float_id):
    """float32 value of each of the 256 codes of a small-float format (one code per byte)."""
    cdef SmallFloatFormat f = small_float_format(small_float_id)
    cdef int n = 1 << f.width
    cdef int code
    import numpy as np
    values = np.zeros(256, dtype=np.float32)
    cdef float[::1] view = values
    for code in range(256):
        view[code] = <float>decode_small_float(code & (n - 1), &f)
    return values
