"""Step 4: the scales and zero points as the kernels read them, per call.

The general kernel paths read float64 scales and zero points (exact for every type); the
float32 paths read float32 ones (exact there: the scale is a float32, float16, bfloat16 or
e8m0 value) and, for integer codes, int32 zero points.
"""

from __future__ import annotations

import threading

import numpy as np

from ._dtypes import ElementType

# Per-thread scratch arrays for the conversions: reused call after call, so that
# converting a large blocked scale does not cost fresh pages (and their faults) every
# time. The kernels keep no reference to them past the call. Only arrays up to
# SCRATCH_RETAINED_BYTES stay between calls: a larger one is the call's own and freed.
_scratch = threading.local()
SCRATCH_RETAINED_BYTES = 1 << 20


def scratch_array(slot: str, n: int, dtype) -> np.ndarray:
    arrays = getattr(_scratch, "arrays", None)
    if arrays is None:
        arrays = _scratch.arrays = {}
    array = arrays.get(slot)
    if array is None or array.size < n or array.dtype != dtype:
        array = np.empty(max(n, 1), dtype)
        if array.nbytes <= SCRATCH_RETAINED_BYTES:
            arrays[slot] = array
        else:
            arrays.pop(slot, None)
    return array[:n]


def as_parameter(array: np.ndarray, dtype, slot: str) -> np.ndarray:
    """The values of `array`, flat and contiguous in `dtype`: a view when they already
    are, else converted into a scratch array. A signalling NaN is quieted by the
    conversion, as by any arithmetic on it."""
    flat = array.reshape(-1)
    if flat.dtype == dtype and flat.flags.c_contiguous and flat.flags.aligned:
        return flat
    values = scratch_array(slot, flat.size, np.dtype(dtype))
    if flat.dtype.kind in "iub":
        np.copyto(values, flat, casting="unsafe")
    else:
        with np.errstate(invalid="ignore"):
            np.copyto(values, flat, casting="unsafe")
    return values


def check_zero_point_values(zero_point, etype: ElementType, where: str, zp_name: str) -> None:
    """Float zero points must be +-0; an int32 x has no zero point (it must be 0)."""
    if zero_point is None or not (etype.kind == "small_float" or etype.name == "int32"):
        return
    values = as_parameter(zero_point, np.float64, "check")
    if etype.kind == "small_float" and not np.all(values == 0.0):
        bad = zero_point.reshape(-1)[~(values == 0.0)][0]
        raise ValueError(
            f"{where}: {zp_name} of type {etype.name} must be zero (+0 or -0), got {bad!r}; "
            f"qemu_q rejects nonzero float zero points (docs/semantics.md)"
        )
    if etype.name == "int32" and not np.all(values == 0.0):
        raise ValueError(
            f"{where}: {zp_name} of int32 x must be 0 (the spec gives int32 no zero point), "
            f"got {int(values[values != 0.0][0])}"
        )


def kernel_parameters(scale, zero_point, n: int, absent: float, float32: bool,
                      zero_point_int: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero_point) as a kernel path reads them: float64 both (the general paths),
    float32 both, or float32 and int32 (`zero_point_int`: integer codes on a float32 path).

    `absent` stands in for a missing zero point: QuantizeLinear adds -0.0 to a float
    quotient, the additive identity even for -0, so a missing zero point changes no bit.
    """
    if not float32:
        scale_dtype, zero_point_dtype = np.dtype(np.float64), np.dtype(np.float64)
    else:
        scale_dtype = np.dtype(np.float32)
        zero_point_dtype = np.dtype(np.int32 if zero_point_int else np.float32)
    values = as_parameter(scale, scale_dtype, "scale" + scale_dtype.char)
    if zero_point is None:
        zero_points = scratch_array("absent" + zero_point_dtype.char, n, zero_point_dtype)
        zero_points.fill(0 if zero_point_int else absent)
    else:
        zero_points = as_parameter(zero_point, zero_point_dtype, "zero_point" + zero_point_dtype.char)
    return values, zero_points
