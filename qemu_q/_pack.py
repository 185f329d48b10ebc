"""Conversion between arrays and the ONNX raw_data byte layout (sub-byte types packed)."""

from __future__ import annotations

import math
import operator

import numpy as np

from . import _dispatch
from ._coerce import plain_array
from .codecs import check_codes, is_family
from ._dtypes import array_element_type, element_type
from ._threads import resolve_threads
from ._typing import Shape, TypeSpec


def packed_size(etype, count: int) -> int:
    """Bytes of ONNX raw_data for `count` elements of `etype`."""
    return (count * etype.bits + 7) // 8


def normalize_shape(shape, argument: str = "shape") -> tuple[int, ...]:
    """A shape given as an int or a sequence of ints, as a tuple; no negative dimension."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (int(shape),)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
        raise TypeError(f"{argument} must be an int or a tuple of ints, got {type(shape).__name__} {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)):
            raise TypeError(f"{argument} {shape!r} holds {d!r}; dimensions are ints")
        try:
            dims.append(operator.index(d))
        except TypeError:
            raise TypeError(f"{argument} {shape!r} holds {type(d).__name__} {d!r}; dimensions are ints") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{argument} {tuple(dims)} has a negative dimension")
    return tuple(dims)


def raw_bytes(buffer, etype, count: int, argument: str) -> np.ndarray:
    """`buffer` (bytes or a uint8 array) as 1-D uint8, checked to be the raw_data of `count`
    elements of `etype`; `argument` names it in the errors."""
    if isinstance(buffer, (bytes, bytearray)):
        data = np.frombuffer(buffer, dtype=np.uint8)
    elif isinstance(buffer, memoryview):
        # Any memoryview, strided or of another item format: its bytes in logical order.
        try:
            items = np.asarray(buffer)
        except (TypeError, ValueError, BufferError) as error:
            raise TypeError(f"{argument}: a memoryview numpy cannot read ({error})") from None
        data = np.ascontiguousarray(items).reshape(-1).view(np.uint8)
    elif isinstance(buffer, np.ndarray):
        buffer = plain_array(buffer, argument)
        if buffer.dtype != np.uint8:
            raise TypeError(f"{argument} must hold uint8 bytes, got dtype {buffer.dtype}")
        data = np.ascontiguousarray(buffer).reshape(-1)
    else:
        raise TypeError(f"{argument} must be bytes or a uint8 numpy array, got {type(buffer).__name__}")
    expected = packed_size(etype, count)
    if data.size != expected:
        raise ValueError(f"{argument} has {data.size} bytes; {count} elements of {etype.name} take {expected}")
    return data


def pack(array: np.ndarray, *, out: np.ndarray | None = None, n_threads: int | None = None,
         dtype: TypeSpec | None = None) -> np.ndarray:
    """The ONNX raw_data bytes of `array` as a 1-D uint8 array.

    int4/uint4/float4e2m1: two per byte, element 0 in the low nibble; int2/uint2: four per
    byte, element 0 in bits 0-1; float6: LSB-first bit stream, four values in three bytes.
    Other types: their little-endian bytes.

    `dtype`: the codec-family type (qemu_q.integer_type, qemu_q.minifloat_type) whose codes
    `array` holds in its storage dtype; family codes of 2, 4, 6, 8 or 16 bits pack as the
    ONNX types of those widths do, other widths have no raw_data layout (ValueError). A
    value that is not a code of the type (an integer outside its range, narrow-range ends
    included; a minifloat code wider than its bits) is a ValueError: packing would keep
    only its low bits, another code.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array must be a numpy array, got {type(array).__name__}")
    array = plain_array(array, "array")
    etype = array_element_type(array, "array") if dtype is None else _family_layout(dtype, "dtype")
    if dtype is not None and array.dtype != etype.dtype:
        raise TypeError(f"array has dtype {array.dtype}; codes of {etype.name} are stored as {etype.dtype}")
    if dtype is not None and is_family(etype):
        check_codes(array, etype, "pack", "array")
    n_threads = resolve_threads(n_threads, array.size)
    flat = np.ascontiguousarray(array).reshape(-1)
    size = packed_size(etype, flat.size)
    if out is not None:
        wanted = f"a writeable contiguous uint8 array of shape ({size},)"
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be {wanted}, got {type(out).__name__}")
        if out.dtype != np.uint8 or out.shape != (size,):
            raise ValueError(f"out must be {wanted}, got dtype {out.dtype} and shape {out.shape}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out must be {wanted}; it is not contiguous or not writeable")
        if np.may_share_memory(out, array):
            raise ValueError("out overlaps array; pack does not work in place")
    if not etype.packed:
        data = flat.astype(flat.dtype.newbyteorder("<"), copy=False).view(np.uint8)
        if out is None:
            return data
        out[...] = data
        return out
    result = np.empty(size, dtype=np.uint8) if out is None else out
    _dispatch.run(_dispatch.Path.PACK, flat.view(np.uint8), result, etype.bits, n_threads)
    return result


def unpack(buffer: bytes | np.ndarray, dtype: TypeSpec, shape: Shape, *,
           n_threads: int | None = None) -> np.ndarray:
    """The array of `dtype` and `shape` whose ONNX raw_data bytes are `buffer`. For a
    narrow-range family integer, a field holding the type's excluded minimum is a
    ValueError (it is no code of the type; every other field of 2, 4, 6, 8 or 16 bits is)."""
    if dtype is None:
        raise TypeError("dtype=None: give the element type of the codes (a type name, an ONNX "
                        "data-type int or a dtype)")
    etype = _family_layout(dtype, "dtype")
    values = unpack_fields(buffer, etype, shape, n_threads)
    if is_family(etype):
        check_codes(values, etype, "unpack", "buffer")
    return values


def unpack_fields(buffer: bytes | np.ndarray, etype, shape: Shape, n_threads: int | None) -> np.ndarray:
    """unpack's array, every field as the type's storage holds it, codes or not (callers
    that check the codes themselves, naming their own argument)."""
    shape = normalize_shape(shape)
    count = math.prod(shape)
    n_threads = resolve_threads(n_threads, count)
    data = raw_bytes(buffer, etype, count, "buffer")
    if not etype.packed:
        return data.view(etype.dtype.newbyteorder("<")).astype(etype.dtype, copy=True).reshape(shape)
    codes = np.empty(count, dtype=np.uint8)
    _dispatch.run(_dispatch.Path.UNPACK, data, codes, etype.bits, n_threads)
    if is_family(etype) and etype.kind == "integer" and etype.signed:
        # family integers are stored as their values: sign-extended
        return etype.code_values(codes).astype(etype.dtype).reshape(shape)
    return codes.view(etype.dtype).reshape(shape)


def _family_layout(dtype, argument: str):
    etype = element_type(dtype, argument)
    if etype.onnx_id == 0 and etype.kind in ("integer", "small_float") and etype.bits not in (2, 4, 6, 8, 16):
        raise ValueError(f"{argument}={etype.name}: codes of {etype.bits} bits have no ONNX raw_data "
                         "layout; the codec family packs widths 2, 4, 6, 8 and 16")
    return etype
