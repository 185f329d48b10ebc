# Packing of one-code-per-byte arrays into the ONNX raw_data layout and back (the codecs
# live in _subbyte.pxd, shared with the fused quantize / dequantize paths).

from cython.parallel cimport prange
from libc.stdint cimport uint8_t

from _subbyte cimport pack_codes, unpack_codes

cdef enum:
    # Codes per task: a multiple of 8, so that every task starts on a whole byte of every
    # packed layout.
    PACK_CHUNK = 65536


cdef inline void pack_task(const uint8_t* codes, Py_ssize_t n, uint8_t* out, int bits, Py_ssize_t task) noexcept nogil:
    cdef Py_ssize_t start = task * PACK_CHUNK
    pack_codes(codes + start, min(<Py_ssize_t>PACK_CHUNK, n - start), out + start * bits // 8, bits)


cdef inline void unpack_task(const uint8_t* packed, Py_ssize_t n, uint8_t* codes, int bits, Py_ssize_t task) noexcept nogil:
    cdef Py_ssize_t start = task * PACK_CHUNK
    unpack_codes(packed + start * bits // 8, min(<Py_ssize_t>PACK_CHUNK, n - start), codes + start, bits)


def pack(const uint8_t[::1] codes, uint8_t[::1] out, int bits, int n_threads):
    """Pack one-code-per-byte `codes` (low `bits` bits used) into `out` (ceil(n*bits/8) bytes)."""
    cdef Py_ssize_t n = codes.shape[0]
    cdef Py_ssize_t n_tasks = (n + PACK_CHUNK - 1) // PACK_CHUNK
    cdef Py_ssize_t task
    if n == 0:
        return
    if n_threads > 1 and n_tasks > 1:
        for task in prange(n_tasks, nogil=True, schedule='dynamic', num_threads=n_threads):
            pack_task(&codes[0], n, &out[0], bits, task)
    else:
        with nogil:
            for task in range(n_tasks):
                pack_task(&codes[0], n, &out[0], bits, task)


def unpack(const uint8_t[::1] packed, uint8_t[::1] out, int bits, int n_threads):
    """Unpack `out.shape[0]` codes of `bits` bits from the ONNX layout in `packed`."""
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t n_tasks = (n + PACK_CHUNK - 1) // PACK_CHUNK
    cdef Py_ssize_t task
    if n == 0:
        return
    if n_threads > 1 and n_tasks > 1:
        for task in prange(n_tasks, nogil=True, schedule='dynamic', num_threads=n_threads):
            unpack_task(&packed[0], n, &out[0], bits, task)
    else:
        with nogil:
            for task in range(n_tasks):
                unpack_task(&packed[0], n, &out[0], bits, task)
