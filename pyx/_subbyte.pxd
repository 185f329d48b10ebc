# The ONNX raw_data layout of sub-byte codes, as inline codecs shared by the packing
# kernels and the fused quantize-and-pack / unpack-and-dequantize paths: int4/uint4/float4
# two per byte (element 0 in the low nibble), int2/uint2 four per byte (element 0 in bits
# 0-1), float6 as an LSB-first bit stream (four codes in three bytes).

from libc.stdint cimport uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    #define QEMU_Q_LITTLE_ENDIAN 1
    #else
    #define QEMU_Q_LITTLE_ENDIAN 0
    #endif
    """
    enum: QEMU_Q_LITTLE_ENDIAN


cdef inline Py_ssize_t group_codes(int bits) noexcept nogil:
    # Codes in a whole-byte group.
    return 2 if bits == 4 else 4


cdef inline Py_ssize_t group_bytes(int bits) noexcept nogil:
    return 3 if bits == 6 else 1


cdef inline Py_ssize_t packed_bytes(Py_ssize_t n_codes, int bits) noexcept nogil:
    return (n_codes * bits + 7) // 8


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


cdef inline void pack_codes(const uint8_t* codes, Py_ssize_t n, uint8_t* out, int bits) noexcept nogil:
    # Packs n codes into packed_bytes(n, bits) bytes; the last group is padded with zeros.
    # The whole groups of 4- and 2-bit codes are read as 16- and 32-bit words, so that the
    # loops are plain lane-wise shifts and masks the compiler vectorizes.
    cdef Py_ssize_t per_group = group_codes(bits)
    cdef Py_ssize_t n_full = n // per_group
    cdef Py_ssize_t g
    cdef uint16_t w16
    cdef uint32_t w32
    if QEMU_Q_LITTLE_ENDIAN and bits == 4:
        for g in range(n_full):
            memcpy(&w16, codes + 2 * g, 2)
            out[g] = <uint8_t>((w16 & 0x0F) | ((w16 >> 4) & 0xF0))
    elif QEMU_Q_LITTLE_ENDIAN and bits == 2:
        for g in range(n_full):
            memcpy(&w32, codes + 4 * g, 4)
            out[g] = <uint8_t>((w32 & 0x03) | ((w32 >> 6) & 0x0C) | ((w32 >> 12) & 0x30) | ((w32 >> 18) & 0xC0))
    else:
        for g in range(n_full):
            pack_group(codes + g * per_group, per_group, out + g * group_bytes(bits), bits)
    if n > n_full * per_group:
        pack_tail(codes + n_full * per_group, n - n_full * per_group, out + n_full * group_bytes(bits), bits)


cdef inline void pack_tail(const uint8_t* codes, Py_ssize_t n_codes, uint8_t* out, int bits) noexcept nogil:
    # The last, partial group: padded with zero codes and cut to the bytes the stream still
    # has (ceil(n * bits / 8) in all).
    cdef uint8_t last[3]
    cdef Py_ssize_t i
    pack_group(codes, n_codes, last, bits)
    for i in range(packed_bytes(n_codes, bits)):
        out[i] = last[i]


cdef inline void unpack_codes(const uint8_t* packed, Py_ssize_t n, uint8_t* codes, int bits) noexcept nogil:
    # Unpacks n codes from packed_bytes(n, bits) bytes.
    cdef Py_ssize_t per_group = group_codes(bits)
    cdef Py_ssize_t n_full = n // per_group
    cdef Py_ssize_t g, i
    cdef uint16_t w16
    cdef uint32_t w32
    cdef uint32_t b
    cdef uint8_t last[3]
    if QEMU_Q_LITTLE_ENDIAN and bits == 4:
        for g in range(n_full):
            b = packed[g]
            w16 = <uint16_t>((b & 0x0F) | ((b & 0xF0) << 4))
            memcpy(codes + 2 * g, &w16, 2)
    elif QEMU_Q_LITTLE_ENDIAN and bits == 2:
        for g in range(n_full):
            b = packed[g]
            w32 = (b & 0x03) | ((b & 0x0C) << 6) | ((b & 0x30) << 12) | ((b & 0xC0) << 18)
            memcpy(codes + 4 * g, &w32, 4)
    else:
        for g in range(n_full):
            unpack_group(packed + g * group_bytes(bits), codes + g * per_group, per_group, bits)
    if n > n_full * per_group:
        last[0] = 0
        last[1] = 0
        last[2] = 0
        for i in range(packed_bytes(n - n_full * per_group, bits)):
            last[i] = packed[n_full * group_bytes(bits) + i]
        unpack_group(last, codes + n_full * per_group, n - n_full * per_group, bits)
