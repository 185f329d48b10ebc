"""Step 3: validation against the resolved spec entry, on types and shapes only.

What a plan is built from: the element types of the arrays, their shapes, and the
normalized attributes. Every check here depends on nothing else, so the plans that call
them are cached per signature (`cached_plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._dtypes import BLOCKED, PER_AXIS, PER_TENSOR, ElementType
from ._opspec import OpSpec, first_version_allowing, first_version_with_attribute
from ._rules import has_granularity, label


@dataclass(frozen=True)
class ArraySpec:
    """What validation reads of an array: its dtype and shape (a hashable cache key)."""
    dtype: np.dtype
    shape: tuple

    @staticmethod
    def of_signature(signature) -> "ArraySpec | None":
        return None if signature is None else ArraySpec(*signature)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)


def signature(array) -> tuple | None:
    """What a plan key holds of an array: (dtype, shape); None for an absent input."""
    return None if array is None else (array.dtype, array.shape)


def cached_plan(plan_fn, key):
    """plan_fn(*key), from its cache when the key is hashable (an unhashable attribute
    value is validated, and rejected, uncached). Arrays enter the key as signatures,
    which plan builders read through ArraySpec.of_signature."""
    try:
        return plan_fn(*key)
    except TypeError:
        try:
            hash(key)
        except TypeError:
            return plan_fn.__wrapped__(*key)
        raise


def check_type(spec: OpSpec, opset: int | None, param: str, etype: ElementType) -> None:
    allowed = spec.allowed_types(param)
    if etype.onnx_type in allowed:
        return
    names = ", ".join(sorted(t[7:-1] for t in allowed))
    needs = first_version_allowing(spec.op_type, param, etype.onnx_type)
    hint = f"; {etype.name} needs opset >= {needs}" if needs and needs > spec.since_version else ""
    what = "output type" if param == "y" else f"{param} of type"
    # The numpy spelling too, where it differs (double is float64 to numpy users).
    dtype = f" (dtype {etype.dtype})" if str(etype.dtype) != etype.name else ""
    raise TypeError(f"{label(spec, opset)} does not accept {what} {etype.name}{dtype}{hint}. Allowed: {names}")


def check_attribute(spec: OpSpec, opset: int, name: str, value, default) -> None:
    if name in spec.attributes or value == default:
        return
    needs = first_version_with_attribute(spec.op_type, name)
    raise ValueError(
        f"{label(spec, opset)} has no attribute {name!r} (got {name}={value!r}); "
        f"it appears in opset {needs}"
    )


@dataclass(frozen=True)
class Granularity:
    kind: int
    outer: int
    axis_len: int
    inner: int
    block_size: int


def resolve_granularity(spec: OpSpec, opset: int, x_shape, scale: ArraySpec,
                        zero_point: ArraySpec | None, axis: int, block_size: int,
                        scale_name: str, zp_name: str) -> Granularity:
    size = math.prod(x_shape)
    where = label(spec, opset)
    # A scalar and a 1-element 1-D tensor are the same per-tensor parameter (the ONNX node
    # tests pair a () scale with a (1,) zero point).
    same_scalar = zero_point is not None and zero_point.size == scale.size == 1 and max(zero_point.ndim, scale.ndim) <= 1
    if zero_point is not None and zero_point.shape != scale.shape and not same_scalar:
        raise ValueError(
            f"{where}: {zp_name} shape {zero_point.shape} must equal {scale_name} shape {scale.shape}"
        )
    if block_size < 0:
        raise ValueError(f"{where}: block_size={block_size} must be >= 0 (0 means not blocked)")
    rank = len(x_shape)
    if block_size == 0 and scale.ndim <= 1 and scale.size == 1:
        return Granularity(PER_TENSOR, 1, size, 1, 0)
    if block_size == 0 and scale.ndim > 1:
        raise ValueError(
            f"{where}: {scale_name} of shape {scale.shape} needs block_size > 0 for blocked "
            f"quantization; per-tensor takes a scalar and per-axis a 1-D {scale_name}"
        )
    kind = BLOCKED if block_size > 0 else PER_AXIS
    if kind == PER_AXIS and not has_granularity(spec, "per_axis"):
        raise ValueError(
            f"{where} supports per-tensor quantization only: {scale_name} must be a scalar, "
            f"got shape {scale.shape}; per-axis needs opset >= 13"
        )
    if kind == BLOCKED and not has_granularity(spec, "blocked"):
        raise ValueError(
            f"{where} has no blocked quantization (block_size={block_size}); it needs opset >= 21"
        )
    if rank == 0:
        raise ValueError(f"{where}: a scalar x takes a scalar {scale_name}, got shape {scale.shape}")
    if not -rank <= axis < rank:
        raise ValueError(f"{where}: axis={axis} is out of range for x of rank {rank}; allowed [{-rank}, {rank - 1}]")
    axis = axis % rank
    axis_len = x_shape[axis]
    outer = math.prod(x_shape[:axis])
    inner = math.prod(x_shape[axis + 1:])
    if kind == PER_AXIS:
        if scale.ndim != 1 or scale.shape[0] != axis_len:
            raise ValueError(
                f"{where}: per-axis {scale_name} must be 1-D of length x.shape[{axis}] = {axis_len}, "
                f"got shape {scale.shape}"
            )
        return Granularity(PER_AXIS, outer, axis_len, inner, 0)
    if scale.ndim != rank:
        raise ValueError(
            f"{where}: blocked {scale_name} must have the rank of x ({rank}), got shape {scale.shape}"
        )
    for d in range(rank):
        if d != axis and scale.shape[d] != x_shape[d]:
            raise ValueError(
                f"{where}: blocked {scale_name} shape {scale.shape} must equal x shape "
                f"{tuple(x_shape)} except on axis {axis}"
            )
    n_scales = scale.shape[axis]
    low = -(-axis_len // n_scales) if n_scales > 0 else None
    high = -(-axis_len // (n_scales - 1)) - 1 if n_scales > 1 else None
    if low is None or block_size < low or (high is not None and block_size > high):
        allowed = f"[{low}, {high if high is not None else 'inf'}]" if low is not None else "none"
        raise ValueError(
            f"{where}: block_size={block_size} does not fit x.shape[{axis}] = {axis_len} with "
            f"{n_scales} scales along the axis; allowed {allowed} = [ceil(Di/Si), ceil(Di/(Si-1))-1]"
        )
    # One block along the axis accepts any block_size >= the axis length (the range above
    # has no upper bound): all of them mean the same block, and the kernels see it as such.
    return Granularity(BLOCKED, outer, axis_len, inner, min(block_size, axis_len))
