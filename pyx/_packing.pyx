# Packing of one-code-per-byte arrays into the ONNX raw_data layout and back (the codecs
# live in _subbyte.pxd, shared with the fused quantize / dequantize paths).

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from cython.parallel cimport prange
from libc.stdint cimport uint8_t

from _subbyte cimport pack_codes, unpack_codes

cdef enum:
    # Codes per task: a multiple of 8, so that every task starts on a whole byte of every
    # packed layout.
    PACK_CHUNK = 65536


cdef inline void code_task(const uint8_t* source, uint8_t* dest, Py_ssize_t n, int bits,
                           bint packing, Py_ssize_t task) noexcept nogil:
    # Codes [task * PACK_CHUNK, ...) packed from one per byte in source into dest, or
    # unpacked from source into one per byte in dest.
    cdef Py_ssize_t start = task * PACK_CHUNK
    cdef Py_ssize_t count = min(<Py_ssize_t>PACK_CHUNK, n - start)
    if packing:
        pack_codes(source + start, count, dest + start * bits // 8, bits)
    else:
        unpack_codes(source + start * bits // 8, count, dest + start, bits)


cdef void run_tasks(const uint8_t* source, uint8_t* dest, Py_ssize_t n, int bits, bint packing,
                    int n_threads) noexcept nogil:
    cdef Py_ssize_t n_tasks = (n + PACK_CHUNK - 1) // PACK_CHUNK
    cdef Py_ssize_t task
    if n_threads > 1 and n_tasks > 1:
        for task in prange(n_tasks, schedule='dynamic', num_threads=n_threads):
            code_task(source, dest, n, bits, packing, task)
    else:
        for task in range(n_tasks):
            code_task(source, dest, n, bits, packing, task)


def pack(const uint8_t[::1] codes, uint8_t[::1] out, int bits, int n_threads):
    """Pack one-code-per-byte `codes` (low `bits` bits used) into `out` (ceil(n*bits/8) bytes)."""
    if codes.shape[0] == 0:
        return
    with nogil:
        run_tasks(&codes[0], &out[0], codes.shape[0], bits, True, n_threads)


def unpack(const uint8_t[::1] packed, uint8_t[::1] out, int bits, int n_threads):
    """Unpack `out.shape[0]` codes of `bits` bits from the ONNX layout in `packed`."""
    if out.shape[0] == 0:
        return
    with nogil:
        run_tasks(&packed[0], &out[0], out.shape[0], bits, False, n_threads)
