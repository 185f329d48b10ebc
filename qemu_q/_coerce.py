"""Step 1 of every op: the caller's arguments as the types the rest of the pipeline reads.

Arrays stay numpy arrays (never copied here); attributes become Python ints, bools and
ElementTypes, normalized before anything is cached, so that validation never depends on
what was called before (docs/semantics.md, "Attributes and the plan cache").
"""

from __future__ import annotations

import operator

import numpy as np

from ._dtypes import ElementType, element_type

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def plain_array(array: np.ndarray, argument: str) -> np.ndarray:
    """An ndarray as a base-class ndarray over the same memory: a subclass's own reshape
    and indexing rules (np.matrix stays 2-D through reshape(-1)) must not reach the
    kernels; np.memmap and the like become a view, never a copy. A masked array is
    refused: its mask would be ignored."""
    if type(array) is np.ndarray:
        return array
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(f"{argument} is a numpy masked array; qemu_q would ignore its mask: pass "
                        f"{argument}.filled(value) or {argument}.data")
    return np.asarray(array)


def as_array(value, argument: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return plain_array(value, argument)
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise TypeError(
        f"{argument} must be a numpy array (or numpy scalar) of an ONNX type, "
        f"got {type(value).__name__}"
    )


def optional_array(value, argument: str) -> np.ndarray | None:
    return None if value is None else as_array(value, argument)


def int_attribute(value, name: str, allow_bool: bool = False) -> int:
    """An ONNX int attribute as a Python int: an int64, as a NodeProto holds it. A bool is
    a flag's value (saturate), never an axis or a size."""
    if isinstance(value, (bool, np.bool_)):
        if allow_bool:
            return int(value)
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"{name}={number} is not an int64 (ONNX attributes are 64-bit)")
    return number


def flag(value, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def output_dtype(value) -> ElementType | None:
    """A requested output type; the attribute's ONNX default 0 means "not given"."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value == 0:
        return None
    return element_type(value, "output_dtype")


def block_axis(value, rank: int, what: str) -> int:
    """The axis along which `what` (MX blocks, NVFP4 blocks) run, normalized to [0, rank)."""
    axis = int_attribute(value, "axis")
    if rank == 0:
        raise ValueError(f"x is a scalar (rank 0); {what} run along an axis of an array of rank >= 1")
    if not -rank <= axis < rank:
        raise ValueError(f"axis={axis} is out of range for rank {rank}; allowed [{-rank}, {rank - 1}]")
    return axis % rank
