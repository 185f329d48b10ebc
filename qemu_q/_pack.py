"""Conversion between arrays and the ONNX raw_data byte layout (sub-byte types packed)."""

from __future__ import annotations

import math

import numpy as np

from . import _packing
from ._dtypes import array_element_type, element_type
from ._threads import resolve_threads


def packed_size(etype, count: int) -> int:
    """Bytes of ONNX raw_data for `count` elements of `etype`."""
    return (count * etype.bits + 7) // 8


def pack(array, *, out=None, n_threads=None) -> np.ndarray:
    """The ONNX raw_data bytes of `array` as a 1-D uint8 array.

    int4/uint4/float4e2m1: two per byte, element 0 in the low nibble; int2/uint2: four per
    byte, element 0 in bits 0-1; float6: LSB-first bit stream, four values in three bytes.
    Other types: their little-endian bytes.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array must be a numpy array, got {type(array).__name__}")
    etype = array_element_type(array, "array")
    flat = np.ascontiguousarray(array).reshape(-1)
    size = packed_size(etype, flat.size)
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != (size,) \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out must be a writeable contiguous uint8 array of shape ({size},)")
    if not etype.packed:
        data = flat.astype(flat.dtype.newbyteorder("<"), copy=False).view(np.uint8)
        if out is None:
            return data if out is None else out
        out[...] = data
        return out
    result = np.empty(size, dtype=np.uint8) if out is None else out
    _packing.pack(flat.view(np.uint8), result, etype.bits, resolve_threads(n_threads, flat.size))
    return result


def unpack(buffer, dtype, shape, *, n_threads=None) -> np.ndarray:
    """The array of `dtype` and `shape` whose ONNX raw_data bytes are `buffer`."""
    etype = element_type(dtype, "dtype")
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape {shape} has a negative dimension")
    count = math.prod(shape)
    if isinstance(buffer, (bytes, bytearray, memoryview)):
        data = np.frombuffer(buffer, dtype=np.uint8)
    elif isinstance(buffer, np.ndarray):
        if buffer.dtype != np.uint8:
            raise TypeError(f"buffer must hold uint8 bytes, got dtype {buffer.dtype}")
        data = np.ascontiguousarray(buffer).reshape(-1)
    else:
        raise TypeError(f"buffer must be bytes or a uint8 numpy array, got {type(buffer).__name__}")
    expected = packed_size(etype, count)
    if data.size != expected:
        raise ValueError(
            f"buffer has {data.size} bytes; {count} elements of {etype.name} take {expected}"
        )
    if not etype.packed:
        return data.view(etype.dtype.newbyteorder("<")).astype(etype.dtype, copy=True).reshape(shape)
    codes = np.empty(count, dtype=np.uint8)
    _packing.unpack(data, codes, etype.bits, resolve_threads(n_threads, count))
    return codes.view(etype.dtype).reshape(shape)
