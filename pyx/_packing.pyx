# Packing of one-code-per-byte arrays into the ONNX raw_data layout and back (the codecs
# live in _subbyte.pxd, shared with the fused quantize / dequantize paths).

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.stdint cimport uint8_t

from _subbyte cimport pack_codes, unpack_codes
from _tasks cimport run_tasks

cdef enum:
    # Codes per task: a multiple of 8, so that every task starts on a whole byte of every
    # packed layout.
    PACK_CHUNK = 65536


cdef struct CodeWork:
    const uint8_t* source
    uint8_t* dest
    Py_ssize_t n
    int bits
    bint packing


cdef void code_task(const void* work, Py_ssize_t task) noexcept nogil:
    # Codes [task * PACK_CHUNK, ...) packed from one per byte in source into dest, or
    # unpacked from source into one per byte in dest. Integer work only: the
    # floating-point environment the runner sets plays no part here.
    cdef const CodeWork* w = <const CodeWork*>work
    cdef Py_ssize_t start = task * PACK_CHUNK
    cdef Py_ssize_t count = min(<Py_ssize_t>PACK_CHUNK, w.n - start)
    if w.packing:
        pack_codes(w.source + start, count, w.dest + start * w.bits // 8, w.bits)
    else:
        unpack_codes(w.source + start * w.bits // 8, count, w.dest + start, w.bits)


cdef void run_code_tasks(const uint8_t* source, uint8_t* dest, Py_ssize_t n, int bits, bint packing,
                         int n_threads) noexcept nogil:
    cdef CodeWork work
    work.source = source
    work.dest = dest
    work.n = n
    work.bits = bits
    work.packing = packing
    run_tasks(code_task, &work, (n + PACK_CHUNK - 1) // PACK_CHUNK, n_threads)


cdef int check_sizes(Py_ssize_t n_codes, Py_ssize_t n_bytes, int bits) except -1:
    if bits not in (2, 4, 6):
        raise ValueError(f"bits must be 2, 4 or 6, not {bits}")
    if n_bytes != (n_codes * bits + 7) // 8:
        raise ValueError(f"{n_codes} codes of {bits} bits take {(n_codes * bits + 7) // 8} bytes, not {n_bytes}")
    return 0


def pack(const uint8_t[::1] codes, uint8_t[::1] out, int bits, int n_threads):
    """Pack one-code-per-byte `codes` (low `bits` bits used) into `out` (ceil(n*bits/8) bytes)."""
    if codes.shape[0] == 0:
        return
    check_sizes(codes.shape[0], out.shape[0], bits)
    with nogil:
        run_code_tasks(&codes[0], &out[0], codes.shape[0], bits, True, n_threads)


def unpack(const uint8_t[::1] packed, uint8_t[::1] out, int bits, int n_threads):
    """Unpack `out.shape[0]` codes of `bits` bits from the ONNX layout in `packed`."""
    if out.shape[0] == 0:
        return
    check_sizes(out.shape[0], packed.shape[0], bits)
    with nogil:
        run_code_tasks(&packed[0], &out[0], out.shape[0], bits, False, n_threads)
