"""choose_qparams: a scale and zero point from data, for quantize_linear.

A convenience outside the ONNX ops: ONNX defines how to quantize with a given scale and
zero point (and DynamicQuantizeLinear's one uint8 recipe), not how to choose them. The
rules below are this library's own, stated exactly so that the bits are reproducible.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import _coerce, codecs
from ._dtypes import ElementType, element_type
from ._opspec import get_spec
from ._threads import in_default_fp_environment

# The input types quantize_linear divides (x of every QuantizeLinear version but int32).
_X_TYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
# A nonzero range whose scale rounds to 0 in float32 gets the smallest positive float32.
_SMALLEST_SCALE = np.float32(np.finfo(np.float32).smallest_subnormal)


def _output_type(dtype) -> ElementType:
    etype = element_type(dtype, "dtype")
    if codecs.is_family(etype):
        return etype
    allowed = get_spec("QuantizeLinear").allowed_types("y")
    if etype.onnx_type not in allowed:
        names = ", ".join(sorted(t[len("tensor("):-1] for t in allowed))
        raise ValueError(f"dtype={etype.name!r} is not a QuantizeLinear output type; allowed: {names}, "
                         f"or a codec-family type (qemu_q.integer_type, qemu_q.minifloat_type)")
    return etype


def _integer_range(etype: ElementType, reduce_range: bool) -> tuple[int, int]:
    qmin, qmax = int(etype.lo or 0), int(etype.hi or 0)
    if not reduce_range:
        return qmin, qmax
    if etype.bits <= 2:
        raise ValueError(f"reduce_range=True with dtype={etype.name!r}: one bit less leaves no "
                         f"symmetric range; allowed with integer types of 3 to 16 bits")
    # One bit less, as onnxruntime's reduce_range does for 8-bit types.
    return qmin >> 1, qmax >> 1


def _reduce(x: np.ndarray, axis: int | None, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """lo = min(0, min x) and hi = max(0, max x) over the non-NaN values of each group, as
    float64 arrays of the scale's shape (all-NaN and empty groups give 0, 0)."""
    values = x.astype(np.float64)  # exact for float32, float16, bfloat16
    groups: np.ndarray
    if axis is None:
        groups, over = values.reshape(1, -1), (1,)
        shape: tuple[int, ...] = ()
    elif block_size == 0:
        groups = np.moveaxis(values, axis, 0).reshape(x.shape[axis], -1)
        over, shape = (1,), (x.shape[axis],)
    else:
        length = x.shape[axis]
        n_blocks = -(-length // block_size)
        moved = np.moveaxis(values, axis, -1)
        # NaN padding: ignored like NaN data, so a partial last block is its own elements.
        pad = np.full(moved.shape[:-1] + (n_blocks * block_size - length,), np.nan)
        groups = np.concatenate([moved, pad], axis=-1).reshape(moved.shape[:-1] + (n_blocks, block_size))
        over = (groups.ndim - 1,)
        shape = x.shape[:axis] + (n_blocks,) + x.shape[axis + 1:]
    lo = np.fmin.reduce(groups, axis=over, initial=0.0)
    hi = np.fmax.reduce(groups, axis=over, initial=0.0)
    if axis is not None and block_size:
        lo, hi = np.moveaxis(lo, -1, axis), np.moveaxis(hi, -1, axis)
    return lo.reshape(shape), hi.reshape(shape)


def _scale(numerator: np.ndarray, divisor: float) -> np.ndarray:
    with np.errstate(under="ignore"):
        scale = np.asarray(numerator / divisor).astype(np.float32)
    return np.where(numerator == 0, np.float32(1.0),
                    np.where(scale == 0, _SMALLEST_SCALE, scale)).astype(np.float32)


@in_default_fp_environment
def choose_qparams(x: np.ndarray, dtype: object = "int8", *, axis: int | None = None,
                   block_size: int = 0, symmetric: bool | None = None,
                   reduce_range: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A float32 scale and a zero point for quantizing `x` to `dtype` with quantize_linear.

    A convenience outside the ONNX ops (ONNX does not say how to choose them); the rules
    are this library's, stated here exactly. Pass the results with the same `axis` and
    `block_size` to quantize_linear.

    x: a float32, float16 or bfloat16 array. dtype: a QuantizeLinear output type (name,
    ONNX data-type int or dtype): int8, uint8, int16, uint16, int4, uint4, int2, uint2, a
    float8/float6/float4 type, or a codec-family type (`qemu_q.integer_type(bits, signed,
    narrow_range)`, `qemu_q.minifloat_type(...)`), whose range or largest finite value the
    rules below read as they read an ONNX type's. Groups: per tensor (axis=None), per axis (axis=k: one
    pair per index along k) or blocked (axis=k, block_size=B > 0: one pair per B
    consecutive elements along k, the last block possibly shorter).

    Per group, over the non-NaN values (none: the group counts as all zero), in float64
    (exact for the input types): lo = min(0, min x), hi = max(0, max x), amax = max(-lo, hi).
    An infinite value is refused (no finite scale covers it).

    Integer types, range [qmin, qmax] (a narrow-range type's: [-127, 127] for int8 narrow;
    reduce_range: [qmin >> 1, qmax >> 1], as onnxruntime; not for 2-bit types):
      asymmetric (symmetric None or False): scale = float32((hi - lo) / (qmax - qmin)),
        the difference and the quotient each rounded to float64, then to float32;
        zero_point = clamp(round_half_even(qmin - lo / scale), qmin, qmax), with lo / scale
        and the subtraction each rounded to float64.
      symmetric=True: zero_point = (qmin + qmax + 1) // 2 (0 for signed types, 128 for
        uint8, 8 for uint4, 2 for uint2), scale = float32(amax / (qmax - zero_point)),
        the exact quotient rounded once to float32.
    Float types (always symmetric; symmetric=False is refused): zero_point = 0 of that
      type, scale = float32(amax / max_finite), rounded once (max_finite: 448 for
      float8e4m3fn, 240 fnuz, 57344 e5m2 and fnuz, 7.5 float6e2m3, 28 float6e3m2, 6
      float4e2m1; a family minifloat's largest finite code).
    A group whose range is zero (all zero or all NaN) gets scale 1; a nonzero range whose
    scale rounds to 0 in float32 gets the smallest positive float32, 2**-149.

    Round trip: for finite x in a group whose largest magnitude is at most 2**127 (beyond,
    a dequantized value may overflow to inf) and whose scale is a normal float32 (at least
    2**-126: a subnormal scale has too few significant bits), dequantize_linear(quantize_linear(x, scale,
    zero_point)) differs from x by at most one scale for integer types (half a scale from
    rounding, up to half a scale from the rounded zero point at the range's ends), and for
    float types by at most 2**-(m+1) * |x| (m mantissa bits) or half the smallest
    subnormal step times the scale, whichever is larger; plus, in both cases, the float32
    roundings of x / scale and of the dequantized value.

    Returns (scale, zero_point): scale float32 (QuantizeLinear-10, 13 and 23+ take it with
    any x; at 19 and 21 x and y_scale share one type), zero_point of `dtype`, both of shape ()
    per tensor, (x.shape[axis],) per axis, x.shape with x.shape[axis] replaced by
    ceil(x.shape[axis] / block_size) blocked.

    Raises TypeError for a non-array or an x of another dtype, ValueError for an unknown
    or non-output dtype, an axis out of range, block_size < 0, block_size without axis,
    an infinite x, symmetric=False or reduce_range=True with a float type.
    """
    x = _coerce.as_array(x, "x")
    if x.dtype not in _X_TYPES:
        raise TypeError(f"x has dtype {x.dtype}; allowed float32, float16 or bfloat16 (the types "
                        f"quantize_linear divides): cast it first, e.g. x.astype(np.float32)")
    etype = _output_type(dtype)
    block_size = _coerce.int_attribute(block_size, "block_size")
    if block_size < 0:
        raise ValueError(f"block_size={block_size}; allowed 0 (no blocks) or a positive int")
    if axis is not None:
        axis = _coerce.int_attribute(axis, "axis")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis={axis} is out of range for x of rank {x.ndim}; allowed "
                             f"[{-x.ndim}, {x.ndim - 1}]")
        axis %= x.ndim
    elif block_size:
        raise ValueError(f"block_size={block_size} needs an axis (the blocks run along it)")
    if symmetric is not None:
        symmetric = _coerce.flag(symmetric, "symmetric")
    reduce_range = _coerce.flag(reduce_range, "reduce_range")
    if np.isinf(x).any():
        raise ValueError("x contains an infinite value; no finite scale covers it")

    lo, hi = _reduce(x, axis, block_size)
    amax = np.maximum(-lo, hi)
    if etype.kind == "small_float":
        if symmetric is False or reduce_range:
            raise ValueError(f"dtype={etype.name!r} is a float type: its zero point is 0 (symmetric) "
                             f"and its range is fixed; leave symmetric=None and reduce_range=False")
        scale = _scale(amax, float(codecs.max_finite(etype)))
        return scale, np.zeros(scale.shape, dtype=etype.dtype)
    qmin, qmax = _integer_range(etype, reduce_range)
    if symmetric:
        zero = (qmin + qmax + 1) // 2
        scale = _scale(amax, float(qmax - zero))
        zero_point = np.full(scale.shape, zero, dtype=np.int64)
    else:
        scale = _scale(hi - lo, float(qmax - qmin))
        zero_point = np.clip(np.rint(qmin - lo / scale.astype(np.float64)), qmin, qmax).astype(np.int64)
    return scale, np.asarray(zero_point).astype(etype.dtype)
