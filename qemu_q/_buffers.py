"""The arrays that cross into the kernels: inputs as flat aligned storage, outputs (out=,
packed raw_data) checked before anything is computed, and packed inputs read from bytes.

The kernels read and write each type as its plain storage dtype (_dtypes.ElementType
.storage) and refuse arrays that are not aligned to their elements (pyx/_memory.pxd):
every array is made so here, copying where a caller's buffer is not.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ._coerce import plain_array
from ._dtypes import ElementType, array_element_type, element_type
from ._pack import normalize_shape, raw_bytes

# The storage of every type is its ONNX raw_data on a little-endian host: the packed
# options then view instead of copying.
LITTLE_ENDIAN = sys.byteorder == "little"


def flat_storage(array: np.ndarray, etype: ElementType) -> np.ndarray:
    """The elements of `array`, C order, contiguous and aligned (a copy otherwise), as
    the kernels' storage dtype."""
    if not (array.flags.c_contiguous and array.flags.aligned):
        array = np.require(array, requirements=("C", "A"))
    return array.reshape(-1).view(etype.storage)


def _check_out(out, inputs) -> np.ndarray:
    # What every out= must be, whatever its type and shape.
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    for name, array in inputs:
        if array is not None and np.may_share_memory(out, array):
            raise ValueError(f"out overlaps {name}; the kernels do not work in place")
    return out


def prepare_output(out, shape, etype: ElementType, inputs) -> np.ndarray:
    """The output array: `out` checked against what the call produces, or a new one.
    `inputs` are (name, array) pairs out= must not overlap."""
    if out is None:
        return np.empty(shape, dtype=etype.dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    out = plain_array(out, "out")
    if out.dtype != etype.dtype:
        raise TypeError(f"out has dtype {out.dtype}; this call produces {etype.dtype} ({etype.name})")
    if out.shape != tuple(shape):
        raise ValueError(f"out has shape {out.shape}; this call produces shape {tuple(shape)}")
    return _check_out(out, inputs)


def prepare_packed_output(out, size: int, etype: ElementType, inputs) -> np.ndarray:
    """As prepare_output, for the raw_data bytes of `etype` (packed=True)."""
    if out is None:
        return np.empty(size, dtype=np.uint8)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    out = plain_array(out, "out")
    if out.dtype != np.uint8 or out.shape != (size,):
        raise ValueError(
            f"with packed=True, out must be a uint8 array of shape ({size},) (the raw_data "
            f"of {etype.name}); got dtype {out.dtype} and shape {out.shape}"
        )
    return _check_out(out, inputs)


def kernel_output(storage: np.ndarray) -> np.ndarray:
    """What a kernel writes for the flat storage view of an output: the view itself, or,
    where the caller's buffer is not aligned to its elements (an out= made at an odd
    offset), an aligned temporary that finish_output copies into it."""
    if storage.flags.aligned:
        return storage
    return np.empty_like(storage)


def finish_output(storage: np.ndarray, written: np.ndarray) -> None:
    if written is not storage:
        storage[...] = written


def packed_input(x, dtype, shape, zero_point, where: str):
    """The element type, shape and bytes of a packed (ONNX raw_data) DequantizeLinear input."""
    if shape is None:
        raise TypeError(f"{where}: packed=True needs shape= (the shape of x; the bytes do not carry it)")
    shape = normalize_shape(shape, f"{where}: shape")
    zp_type = None if zero_point is None else array_element_type(zero_point, "x_zero_point")
    if dtype is None and zp_type is None:
        raise TypeError(
            f"{where}: packed=True needs dtype= (the element type of x) when there is no "
            f"x_zero_point to give it"
        )
    x_type = element_type(dtype, "dtype") if dtype is not None else zp_type
    if zp_type is not None and zp_type is not x_type:
        raise TypeError(f"{where}: dtype {x_type.name} conflicts with x_zero_point of type {zp_type.name}")
    data = raw_bytes(x, x_type, math.prod(shape), f"{where}: with packed=True, x")
    return x_type, shape, data
