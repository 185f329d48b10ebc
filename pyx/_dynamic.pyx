# DynamicQuantizeLinear's reduction: the minimum and maximum of a float32 tensor, with
# NaN reported separately so that the answer does not depend on where NaNs sit relative to
# the thread split.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.math cimport INFINITY

from _tasks cimport run_tasks

cdef enum:
    REDUCE_CHUNK = 65536


cdef struct MinMaxWork:
    const float* x
    Py_ssize_t n
    float* lo
    float* hi
    int* nan


cdef void min_max_task(const void* work, Py_ssize_t c) noexcept nogil:
    # Chunk c's minimum, maximum and whether it holds a NaN (comparisons too read DAZ: the
    # runner's default floating-point environment decides them, not the caller's).
    cdef const MinMaxWork* w = <const MinMaxWork*>work
    cdef float lo = INFINITY
    cdef float hi = -INFINITY
    cdef int nan = 0
    cdef float v
    cdef Py_ssize_t i
    for i in range(c * REDUCE_CHUNK, min((c + 1) * REDUCE_CHUNK, w.n)):
        v = w.x[i]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
        nan = nan | (v != v)
    w.lo[c] = lo
    w.hi[c] = hi
    w.nan[c] = nan


def min_max(const float[::1] x, int n_threads):
    """(min, max, has_nan) of x over its non-NaN values; (+inf, -inf, ...) when none."""
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t n_chunks = (n + REDUCE_CHUNK - 1) // REDUCE_CHUNK
    cdef MinMaxWork work
    import numpy as np
    partial_lo = np.full(max(n_chunks, 1), INFINITY, dtype=np.float32)
    partial_hi = np.full(max(n_chunks, 1), -INFINITY, dtype=np.float32)
    partial_nan = np.zeros(max(n_chunks, 1), dtype=np.intc)
    cdef float[::1] plo = partial_lo
    cdef float[::1] phi = partial_hi
    cdef int[::1] pnan = partial_nan
    work.x = &x[0] if n > 0 else NULL
    work.n = n
    work.lo = &plo[0]
    work.hi = &phi[0]
    work.nan = &pnan[0]
    with nogil:
        run_tasks(min_max_task, &work, n_chunks, n_threads)
    return float(partial_lo.min()), float(partial_hi.max()), bool(partial_nan.any())
