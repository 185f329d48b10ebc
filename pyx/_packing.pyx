# Packing of sub-byte codes into the ONNX raw_data layout and back: int4/uint4/float4 two
# per byte (element 0 in the low nibble), int2/uint2 four per byte (element 0 in bits 0-1),
# float6 as an LSB-first bit stream (four codes in three bytes).

from cython.parallel cimport prange
from libc.stdint cimport uint8_t

cdef enum:
    # Bytes of packed output per task: whole groups for every width (a multiple of 3).
    PACK_CHUNK = 3 * 16384


cdef inline void pack_group(const uint8_t* codes, Py_ssize_t n_codes, uint8_t* out, int bits) noexcept nogil:
    # Packs the codes of one whole-byte group (2 nibbles, 4 crumbs, or 4 sextets in 3 bytes);
    # a short last group is padded with zero codes.
    cdef uint8_t c[4]
    cdef Py_ssize_t i
    cdef int per_group = 4 if bits != 4 else 2
    cdef int mask = (1 << bits) - 1
    for i in range(per_group):
        c[i] = (codes[i] & mask) if i < n_codes else 0
    if bits == 4:
        out[0] = c[0] | (c[1] << 4)
    elif bits == 2:
        out[0] = c[0] | (c[1] << 2) | (c[2] << 4) | (c[3] << 6)
    else:
        out[0] = c[0] | ((c[1] & 3) << 6)
        out[1] = (c[1] >> 2) | ((c[2] & 0xF) << 4)
        out[2] = (c[2] >> 4) | (c[3] << 2)


cdef inline void unpack_group(const uint8_t* packed, uint8_t* codes, Py_ssize_t n_codes, int bits) noexcept nogil:
    cdef uint8_t c[4]
    cdef Py_ssize_t i
    if bits == 4:
        c[0] = packed[0] & 0xF
        c[1] = packed[0] >> 4
    elif bits == 2:
        c[0] = packed[0] & 3
        c[1] = (packed[0] >> 2) & 3
        c[2] = (packed[0] >> 4) & 3
        c[3] = packed[0] >> 6
    else:
        c[0] = packed[0] & 0x3F
        c[1] = (packed[0] >> 6) | ((packed[1] & 0xF) << 2)
        c[2] = (packed[1] >> 4) | ((packed[2] & 0x3) << 4)
        c[3] = packed[2] >> 2
    for i in range(n_codes):
        codes[i] = c[i]


cdef inline Py_ssize_t group_codes(int bits) noexcept nogil:
    return 2 if bits == 4 else 4


cdef inline Py_ssize_t group_bytes(int bits) noexcept nogil:
    return 3 if bits == 6 else 1


def pack(const uint8_t[::1] codes, uint8_t[::1] out, int bits, int n_threads):
    """Pack one-code-per-byte `codes` (low `bits` bits used) into `out` (ceil(n*bits/8) bytes)."""
    cdef Py_ssize_t n = codes.shape[0]
    cdef Py_ssize_t per_group = group_codes(bits)
    cdef Py_ssize_t group_len = group_bytes(bits)
    cdef Py_ssize_t n_full = n // per_group
    cdef Py_ssize_t groups_per_task = PACK_CHUNK // group_len
    cdef Py_ssize_t n_tasks = (n_full + groups_per_task - 1) // groups_per_task
    cdef Py_ssize_t task, g, tail, i
    cdef uint8_t last[3]
    with nogil:
        for task in prange(n_tasks, schedule='static', num_threads=max(1, n_threads)):
            for g in range(task * groups_per_task, min((task + 1) * groups_per_task, n_full)):
                pack_group(&codes[g * per_group], per_group, &out[g * group_len], bits)
        # The last, partial group: padded with zero codes, and cut to the bytes the
        # stream still has (ceil(n * bits / 8) in all).
        tail = n - n_full * per_group
        if tail > 0:
            pack_group(&codes[n_full * per_group], tail, last, bits)
            for i in range(out.shape[0] - n_full * group_len):
                out[n_full * group_len + i] = last[i]


def unpack(const uint8_t[::1] packed, uint8_t[::1] out, int bits, int n_threads):
    """Unpack `out.shape[0]` codes of `bits` bits from the ONNX layout in `packed`."""
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t per_group = group_codes(bits)
    cdef Py_ssize_t group_len = group_bytes(bits)
    cdef Py_ssize_t n_full = n // per_group
    cdef Py_ssize_t groups_per_task = PACK_CHUNK // group_len
    cdef Py_ssize_t n_tasks = (n_full + groups_per_task - 1) // groups_per_task
    cdef Py_ssize_t task, g, tail, i
    cdef uint8_t last[3]
    with nogil:
        for task in prange(n_tasks, schedule='static', num_threads=max(1, n_threads)):
            for g in range(task * groups_per_task, min((task + 1) * groups_per_task, n_full)):
                unpack_group(&packed[g * group_len], &out[g * per_group], per_group, bits)
        tail = n - n_full * per_group
        if tail > 0:
            last[0] = 0
            last[1] = 0
            last[2] = 0
            for i in range(packed.shape[0] - n_full * group_len):
                last[i] = packed[n_full * group_len + i]
            unpack_group(last, &out[n_full * per_group], tail, bits)
