# DynamicQuantizeLinear's reduction: the minimum and maximum of a float32 tensor, with
# NaN reported separately so that the answer does not depend on where NaNs sit relative to
# the thread split.

from cython.parallel cimport parallel, prange
from libc.math cimport INFINITY

from _fpenv cimport fp_state, fp_enter, fp_leave

cdef enum:
    REDUCE_CHUNK = 65536


cdef inline void chunk_min_max(const float* x, Py_ssize_t c, Py_ssize_t n, float* lo_out,
                               float* hi_out, int* nan_out) noexcept nogil:
    cdef float lo = INFINITY
    cdef float hi = -INFINITY
    cdef int nan = 0
    cdef float v
    cdef Py_ssize_t i
    for i in range(c * REDUCE_CHUNK, min((c + 1) * REDUCE_CHUNK, n)):
        v = x[i]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
        nan = nan | (v != v)
    lo_out[0] = lo
    hi_out[0] = hi
    nan_out[0] = nan


def min_max(const float[::1] x, int n_threads):
    """(min, max, has_nan) of x over its non-NaN values; (+inf, -inf, ...) when none."""
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t n_chunks = (n + REDUCE_CHUNK - 1) // REDUCE_CHUNK
    cdef Py_ssize_t c
    import numpy as np
    partial_lo = np.full(max(n_chunks, 1), INFINITY, dtype=np.float32)
    partial_hi = np.full(max(n_chunks, 1), -INFINITY, dtype=np.float32)
    partial_nan = np.zeros(max(n_chunks, 1), dtype=np.intc)
    cdef float[::1] plo = partial_lo
    cdef float[::1] phi = partial_hi
    cdef int[::1] pnan = partial_nan
    cdef const float* xp = &x[0] if n > 0 else NULL
    cdef fp_state fp
    cdef int team = <int>min(<Py_ssize_t>max(1, n_threads), n_chunks)
    with nogil:
        if team > 1:
            with parallel(num_threads=team):
                # Comparisons too read DAZ: the caller's mode must not decide them.
                fp = fp_enter()
                for c in prange(n_chunks, schedule='dynamic'):
                    chunk_min_max(xp, c, n, &plo[c], &phi[c], &pnan[c])
                fp_leave(fp)
        else:
            fp = fp_enter()
            for c in range(n_chunks):
                chunk_min_max(xp, c, n, &plo[c], &phi[c], &pnan[c])
            fp_leave(fp)
    return float(partial_lo.min()), float(partial_hi.max()), bool(partial_nan.any())
