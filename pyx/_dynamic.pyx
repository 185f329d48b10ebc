# DynamicQuantizeLinear's reduction: the minimum and maximum of a float32 tensor, with
# NaN reported separately so that the answer does not depend on where NaNs sit relative to
# the thread split.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from cython.parallel cimport prange
from libc.math cimport INFINITY

cdef enum:
    REDUCE_CHUNK = 65536


def min_max(const float[::1] x, int n_threads):
    """(min, max, has_nan) of x over its non-NaN values; (+inf, -inf, ...) when none."""
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t n_chunks = (n + REDUCE_CHUNK - 1) // REDUCE_CHUNK
    cdef Py_ssize_t c, i, end
    cdef float lo, hi, v
    cdef int nan
    import numpy as np
    partial_lo = np.full(max(n_chunks, 1), INFINITY, dtype=np.float32)
    partial_hi = np.full(max(n_chunks, 1), -INFINITY, dtype=np.float32)
    partial_nan = np.zeros(max(n_chunks, 1), dtype=np.intc)
    cdef float[::1] plo = partial_lo
    cdef float[::1] phi = partial_hi
    cdef int[::1] pnan = partial_nan
    for c in prange(n_chunks, nogil=True, schedule='dynamic', num_threads=max(1, n_threads)):
        lo = INFINITY
        hi = -INFINITY
        nan = 0
        end = min((c + 1) * REDUCE_CHUNK, n)
        for i in range(c * REDUCE_CHUNK, end):
            v = x[i]
            lo = v if v < lo else lo
            hi = v if v > hi else hi
            nan = nan | (v != v)
        plo[c] = lo
        phi[c] = hi
        pnan[c] = nan
    return float(partial_lo.min()), float(partial_hi.max()), bool(partial_nan.any())
