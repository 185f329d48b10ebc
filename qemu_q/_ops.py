"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear: validation, spec resolution,
allocation, and dispatch to the Cython kernels.

Everything Python-level happens here, once per call; the kernels see contiguous storage
arrays, double-precision scales and zero points, and plain integer parameters.
"""

from __future__ import annotations

import math
import operator
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import _dequantize, _dynamic, _kernels
from ._dtypes import (
    BLOCKED, CODE_INTEGER, CODE_SMALL_FLOAT, ELEMENT_TYPES, FMT_FLOAT32, PER_AXIS, PER_TENSOR,
    SF_RULE_FNUZ_INF_NAN, SF_RULE_NAN_SIGN, ElementType, array_element_type, element_type,
)
from ._opspec import (
    OpSpec, cast_float8_table, first_version_allowing, first_version_with_attribute, get_spec,
)
from ._pack import normalize_shape, packed_size, raw_bytes
from ._threads import resolve_threads

_FLOAT32 = ELEMENT_TYPES["float"]
_UINT8 = ELEMENT_TYPES["uint8"]
_E8M0 = ELEMENT_TYPES["float8e8m0"]
# Values of `precision` (QuantizeLinear-23+): the division's precision type.
_PRECISION_TYPES = {1: "float", 10: "float16", 16: "bfloat16"}
# Values of quantize_linear's `nan`: the Cast table's signed NaN, or the one NaN code some
# hardware writes whatever the sign (0x7F; NVIDIA's conversion instructions).
_NAN_OPTIONS = ("spec", "canonical")
# The storage of every type is its ONNX raw_data on a little-endian host: the packed
# options then view instead of copying.
_LITTLE_ENDIAN = sys.byteorder == "little"
# False forces the kernels' general scalar paths (the tests compare both).
_FAST_KERNELS = True


def _label(spec: OpSpec, opset: int) -> str:
    return f"{spec.op_type}-{spec.since_version} (opset {opset})"


def _as_array(value, argument: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise TypeError(
        f"{argument} must be a numpy array (or numpy scalar) of an ONNX type, "
        f"got {type(value).__name__}"
    )


def _check_type(spec: OpSpec, opset: int, param: str, etype: ElementType) -> None:
    allowed = spec.allowed_types(param)
    if etype.onnx_type in allowed:
        return
    names = ", ".join(sorted(t[7:-1] for t in allowed))
    needs = first_version_allowing(spec.op_type, param, etype.onnx_type)
    hint = f"; {etype.name} needs opset >= {needs}" if needs and needs > spec.since_version else ""
    what = "output type" if param == "y" else f"{param} of type"
    raise TypeError(f"{_label(spec, opset)} does not accept {what} {etype.name}{hint}. Allowed: {names}")


def _check_attribute(spec: OpSpec, opset: int, name: str, value, default) -> None:
    if name in spec.attributes or value == default:
        return
    needs = first_version_with_attribute(spec.op_type, name)
    raise ValueError(
        f"{_label(spec, opset)} has no attribute {name!r} (got {name}={value!r}); "
        f"it appears in opset {needs}"
    )


def _int_attribute(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def _normalize_output_dtype(output_dtype):
    # The attribute's ONNX default 0 means "not given".
    if isinstance(output_dtype, (int, np.integer)) and not isinstance(output_dtype, (bool, np.bool_)) and output_dtype == 0:
        return None
    return output_dtype


@dataclass(frozen=True)
class _Granularity:
    kind: int
    outer: int
    axis_len: int
    inner: int
    block_size: int


def _resolve_granularity(spec: OpSpec, opset: int, x_shape, scale: np.ndarray, zero_point,
                         axis: int, block_size: int, scale_name: str, zp_name: str) -> _Granularity:
    size = math.prod(x_shape)
    label = _label(spec, opset)
    # A scalar and a 1-element 1-D tensor are the same per-tensor parameter (the ONNX node
    # tests pair a () scale with a (1,) zero point).
    same_scalar = zero_point is not None and zero_point.size == scale.size == 1 and max(zero_point.ndim, scale.ndim) <= 1
    if zero_point is not None and zero_point.shape != scale.shape and not same_scalar:
        raise ValueError(
            f"{label}: {zp_name} shape {zero_point.shape} must equal {scale_name} shape {scale.shape}"
        )
    if block_size < 0:
        raise ValueError(f"{label}: block_size={block_size} must be >= 0 (0 means not blocked)")
    rank = len(x_shape)
    if block_size == 0 and scale.ndim <= 1 and scale.size == 1:
        return _Granularity(PER_TENSOR, 1, size, 1, 0)
    if block_size == 0 and scale.ndim > 1:
        raise ValueError(
            f"{label}: {scale_name} of shape {scale.shape} needs block_size > 0 for blocked "
            f"quantization; per-tensor takes a scalar and per-axis a 1-D {scale_name}"
        )
    kind = BLOCKED if block_size > 0 else PER_AXIS
    if kind == PER_AXIS and "per_axis" not in spec.granularities:
        raise ValueError(
            f"{label} supports per-tensor quantization only: {scale_name} must be a scalar, "
            f"got shape {scale.shape}; per-axis needs opset >= 13"
        )
    if kind == BLOCKED and "blocked" not in spec.granularities:
        raise ValueError(
            f"{label} has no blocked quantization (block_size={block_size}); it needs opset >= 21"
        )
    if rank == 0:
        raise ValueError(f"{label}: a scalar x takes a scalar {scale_name}, got shape {scale.shape}")
    if not -rank <= axis < rank:
        raise ValueError(f"{label}: axis={axis} is out of range for x of rank {rank}; allowed [{-rank}, {rank - 1}]")
    axis = axis % rank
    axis_len = x_shape[axis]
    outer = math.prod(x_shape[:axis])
    inner = math.prod(x_shape[axis + 1:])
    if kind == PER_AXIS:
        if scale.ndim != 1 or scale.shape[0] != axis_len:
            raise ValueError(
                f"{label}: per-axis {scale_name} must be 1-D of length x.shape[{axis}] = {axis_len}, "
                f"got shape {scale.shape}"
            )
        return _Granularity(PER_AXIS, outer, axis_len, inner, 0)
    if scale.ndim != rank:
        raise ValueError(
            f"{label}: blocked {scale_name} must have the rank of x ({rank}), got shape {scale.shape}"
        )
    for d in range(rank):
        if d != axis and scale.shape[d] != x_shape[d]:
            raise ValueError(
                f"{label}: blocked {scale_name} shape {scale.shape} must equal x shape "
                f"{tuple(x_shape)} except on axis {axis}"
            )
    n_scales = scale.shape[axis]
    low = -(-axis_len // n_scales) if n_scales > 0 else None
    high = -(-axis_len // (n_scales - 1)) - 1 if n_scales > 1 else None
    if low is None or block_size < low or (high is not None and block_size > high):
        allowed = f"[{low}, {high if high is not None else 'inf'}]" if low is not None else "none"
        raise ValueError(
            f"{label}: block_size={block_size} does not fit x.shape[{axis}] = {axis_len} with "
            f"{n_scales} scales along the axis; allowed {allowed} = [ceil(Di/Si), ceil(Di/(Si-1))-1]"
        )
    return _Granularity(BLOCKED, outer, axis_len, inner, block_size)


# Per-thread scratch arrays for the per-call parameter conversions: reused call after call,
# so that converting a large blocked scale does not cost fresh pages (and their faults)
# every time. The kernels keep no reference to them past the call.
_scratch = threading.local()
_NO_FLOAT64 = np.zeros(1, np.float64)
_NO_FLOAT32 = np.zeros(1, np.float32)
_NO_INT32 = np.zeros(1, np.int32)


def _scratch_array(slot: str, n: int, dtype) -> np.ndarray:
    arrays = getattr(_scratch, "arrays", None)
    if arrays is None:
        arrays = _scratch.arrays = {}
    array = arrays.get(slot)
    if array is None or array.size < n or array.dtype != dtype:
        array = arrays[slot] = np.empty(max(n, 1), dtype)
    return array[:n]


def _as_parameter(array: np.ndarray, dtype, slot: str) -> np.ndarray:
    """The values of `array`, flat and contiguous in `dtype`: a view when they already
    are, else converted into a scratch array. A signalling NaN is quieted by the
    conversion, as by any arithmetic on it."""
    flat = array.reshape(-1)
    if flat.dtype == dtype and flat.flags.c_contiguous:
        return flat
    values = _scratch_array(slot, flat.size, np.dtype(dtype))
    with np.errstate(invalid="ignore"):
        np.copyto(values, flat, casting="unsafe")
    return values


def _check_zero_point_values(zero_point, etype: ElementType, label: str, zp_name: str) -> None:
    """Float zero points must be +-0; an int32 x has no zero point (it must be 0)."""
    if zero_point is None or not (etype.kind == "small_float" or etype.name == "int32"):
        return
    values = _as_parameter(zero_point, np.float64, "check")
    if etype.kind == "small_float" and not np.all(values == 0.0):
        bad = zero_point.reshape(-1)[~(values == 0.0)][0]
        raise ValueError(
            f"{label}: {zp_name} of type {etype.name} must be zero (+0 or -0), got {bad!r}; "
            f"qemu_q rejects nonzero float zero points (docs/semantics.md)"
        )
    if etype.name == "int32" and not np.all(values == 0.0):
        raise ValueError(
            f"{label}: {zp_name} of int32 x must be 0 (the spec gives int32 no zero point), "
            f"got {int(values[values != 0.0][0])}"
        )


def _kernel_parameters(scale, zero_point, n: int, absent: float, float32: bool, zero_point_int: bool):
    """(scale, zero_point, scale32, zero_point32, zero_point_int) for a kernel call.

    The general paths read float64 scales and zero points (exact for every type); the
    float32 paths read float32 ones (exact there: the scale is a float32, float16,
    bfloat16 or e8m0 value) and, for integer codes, int32 zero points. Only the arrays the
    call reads are filled in; the others are one-element placeholders. `absent` stands in
    for a missing zero point: QuantizeLinear adds -0.0 to a float quotient, the additive
    identity even for -0, so a missing zero point changes no bit.
    """
    if not float32:
        scale64 = _as_parameter(scale, np.float64, "scale64")
        if zero_point is None:
            zp64 = _scratch_array("zp64", n, np.dtype(np.float64))
            zp64.fill(absent)
        else:
            zp64 = _as_parameter(zero_point, np.float64, "zp64")
        return scale64, zp64, _NO_FLOAT32, _NO_FLOAT32, _NO_INT32
    scale32 = _as_parameter(scale, np.float32, "scale32")
    zp32, zpi = _NO_FLOAT32, _NO_INT32
    if zero_point_int:
        if zero_point is None:
            zpi = _scratch_array("zpi", n, np.dtype(np.int32))
            zpi.fill(0)
        else:
            zpi = _as_parameter(zero_point, np.int32, "zpi")
    elif zero_point is None:
        zp32 = _scratch_array("zp32", n, np.dtype(np.float32))
        zp32.fill(absent)
    else:
        zp32 = _as_parameter(zero_point, np.float32, "zp32")
    return _NO_FLOAT64, _NO_FLOAT64, scale32, zp32, zpi


def _check_out(out, inputs) -> np.ndarray:
    # What every out= must be, whatever its type and shape.
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    for name, array in inputs:
        if np.may_share_memory(out, array):
            raise ValueError(f"out overlaps {name}; the kernels do not work in place")
    return out


def _prepare_output(out, shape, etype: ElementType, inputs) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=etype.dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != etype.dtype:
        raise TypeError(f"out has dtype {out.dtype}; this call produces {etype.dtype} ({etype.name})")
    if out.shape != tuple(shape):
        raise ValueError(f"out has shape {out.shape}; this call produces shape {tuple(shape)}")
    return _check_out(out, inputs)


def _prepare_packed_output(out, size: int, etype: ElementType, inputs) -> np.ndarray:
    if out is None:
        return np.empty(size, dtype=np.uint8)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != np.uint8 or out.shape != (size,):
        raise ValueError(
            f"with packed=True, out must be a uint8 array of shape ({size},) (the raw_data "
            f"of {etype.name}); got dtype {out.dtype} and shape {out.shape}"
        )
    return _check_out(out, inputs)


def _packed_input(x, dtype, shape, zero_point, label: str):
    """The element type, shape and bytes of a packed (ONNX raw_data) DequantizeLinear input."""
    if shape is None:
        raise TypeError(f"{label}: packed=True needs shape= (the shape of x; the bytes do not carry it)")
    shape = normalize_shape(shape, f"{label}: shape")
    zp_type = None if zero_point is None else array_element_type(zero_point, "x_zero_point")
    if dtype is None and zp_type is None:
        raise TypeError(
            f"{label}: packed=True needs dtype= (the element type of x) when there is no "
            f"x_zero_point to give it"
        )
    x_type = element_type(dtype, "dtype") if dtype is not None else zp_type
    if zp_type is not None and zp_type is not x_type:
        raise TypeError(f"{label}: dtype {x_type.name} conflicts with x_zero_point of type {zp_type.name}")
    data = raw_bytes(x, x_type, math.prod(shape), f"{label}: with packed=True, x")
    return x_type, shape, data


def _flat_storage(array: np.ndarray, etype: ElementType) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(etype.storage)


@dataclass(frozen=True)
class _ArraySpec:
    """What validation reads of an array: its dtype and shape (a hashable cache key)."""
    dtype: np.dtype
    shape: tuple

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)


def _plan_cached(plan_fn, key):
    """plan_fn(*key), from its cache when the key is hashable (an unhashable attribute
    value is validated, and rejected, uncached). Arrays enter the key as (dtype, shape)."""
    try:
        return plan_fn(*key)
    except TypeError:
        try:
            hash(key)
        except TypeError:
            return plan_fn.__wrapped__(*key)
        raise


@dataclass(frozen=True)
class _QuantizePlan:
    label: str
    x_type: ElementType
    out_type: ElementType
    gran: _Granularity
    precision_format: int
    fast_divide: bool
    code_kind: int
    lo: int
    hi: int
    mask: int
    small_float_id: int
    small_float_rules: int


@lru_cache(maxsize=512)
def _quantize_plan(opset, x_dtype, x_shape, scale_dtype, scale_shape, zp_dtype, zp_shape, axis,
                   block_size, saturate, precision, output_dtype, nan="spec"):
    # Everything that depends on types, shapes and attributes only, validated once per
    # signature: repeated calls (a model's layers, a sweep) skip straight to the kernel.
    x = _ArraySpec(x_dtype, x_shape)
    scale = _ArraySpec(scale_dtype, scale_shape)
    zero_point = None if zp_dtype is None else _ArraySpec(zp_dtype, zp_shape)
    spec = get_spec("QuantizeLinear", opset)
    opset = spec.since_version if opset is None else opset
    label = _label(spec, opset)
    _check_attribute(spec, opset, "block_size", block_size, 0)
    _check_attribute(spec, opset, "saturate", saturate, 1)
    _check_attribute(spec, opset, "precision", precision, 0)
    _check_attribute(spec, opset, "output_dtype", output_dtype, None)
    if saturate not in (0, 1):
        raise ValueError(f"{label}: saturate={saturate}; allowed 0 or 1")
    if not isinstance(nan, str) or nan not in _NAN_OPTIONS:
        raise ValueError(f"{label}: nan={nan!r}; allowed 'spec' or 'canonical'")

    x_type = array_element_type(x, "x")
    scale_type = array_element_type(scale, "y_scale")
    _check_type(spec, opset, "x", x_type)
    _check_type(spec, opset, "y_scale", scale_type)
    if spec.division_precision == "scale" and scale_type is not x_type:
        raise TypeError(f"{label}: x and y_scale share type T1; got x {x_type.name} and y_scale {scale_type.name}")

    out_type = _quantize_output_type(spec, opset, output_dtype, zero_point, label)
    _check_type(spec, opset, "y", out_type)
    if zero_point is not None:
        _check_type(spec, opset, "y_zero_point", array_element_type(zero_point, "y_zero_point"))

    precision_type = _division_precision(spec, label, precision, x_type, scale_type)
    gran = _resolve_granularity(spec, opset, x.shape, scale, zero_point, axis, block_size,
                                "y_scale", "y_zero_point")
    fast_divide = (
        precision_type.value_format == FMT_FLOAT32
        and x_type.name in ("float", "float16", "bfloat16")
        and scale_type.name in ("float", "float16", "bfloat16", "float8e8m0")
    )
    small_float_rules = 0
    if out_type.kind == "integer":
        code_kind, lo, hi, mask = CODE_INTEGER, out_type.lo, out_type.hi, (1 << out_type.bits) - 1
        small_float_id = 0
    else:
        code_kind, lo, hi, mask = CODE_SMALL_FLOAT, 0, 0, 0
        small_float_id = out_type.small_float_id
        if opset >= 19:  # float4/float6 arrive later; float8 at 19 with the Cast tables
            table = cast_float8_table(opset)
            if table.negative_nan_row and nan == "spec":
                small_float_rules |= SF_RULE_NAN_SIGN
            if table.fnuz_inf_to_nan:
                small_float_rules |= SF_RULE_FNUZ_INF_NAN
    return _QuantizePlan(label, x_type, out_type, gran, precision_type.value_format, fast_divide,
                         code_kind, lo, hi, mask, small_float_id, small_float_rules)


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                    saturate=1, precision=0, opset=None, out=None, packed=False,
                    n_threads=None, nan="spec") -> np.ndarray:
    """ONNX QuantizeLinear: y = saturate(round(x / y_scale) + y_zero_point), bit-exact.

    `opset` selects the version (newest since-version <= opset; None: 28). Types follow
    that version's schema; `output_dtype` takes an ONNX data-type int, a name ("int4",
    "float8e4m3fn") or a dtype. Rules the spec leaves open are in docs/semantics.md.

    `out` receives the result (no allocation). With `packed=True` the result is the ONNX
    raw_data of y instead: a 1-D uint8 array of `pack(y)`'s bytes (ceil(n * bits / 8);
    int4/uint4/float4 two per byte, int2/uint2 four, float6 four in three), quantized and
    packed in one pass; `out` must then be such a uint8 array. `n_threads` overrides the
    default thread count (`set_num_threads`); the bits never depend on it.

    `nan` (not an ONNX attribute) picks the NaN codes of e4m3fn and e5m2: "spec" (default)
    follows the Cast table in force at `opset` (a NaN keeps its sign: 0x7F / 0xFF, and
    -Inf with saturate=0 gives 0xFF in e4m3fn); "canonical" writes 0x7F for every NaN
    result, as NVIDIA's conversion instructions do. See docs/semantics.md.
    """
    x = _as_array(x, "x")
    scale = _as_array(y_scale, "y_scale")
    zero_point = None if y_zero_point is None else _as_array(y_zero_point, "y_zero_point")
    saturate = _int_attribute(saturate, "saturate")
    key = (opset, x.dtype, x.shape, scale.dtype, scale.shape,
           None if zero_point is None else zero_point.dtype,
           None if zero_point is None else zero_point.shape,
           _int_attribute(axis, "axis"), _int_attribute(block_size, "block_size"), saturate,
           _int_attribute(precision, "precision"), _normalize_output_dtype(output_dtype), nan)
    plan = _plan_cached(_quantize_plan, key)
    label, x_type, out_type, gran = plan.label, plan.x_type, plan.out_type, plan.gran
    fast_divide = plan.fast_divide
    _check_zero_point_values(zero_point, out_type, label, "y_zero_point")
    # float32 x divided in float32: the kernels' vectorized paths, on float32 parameters.
    float32_path = _FAST_KERNELS and fast_divide and x_type.name == "float"
    params = _kernel_parameters(scale, zero_point, scale.size, -0.0, float32_path,
                                zero_point_int=out_type.kind == "integer")
    args = (
        gran.outer, gran.axis_len, gran.inner, gran.kind, gran.block_size,
        x_type.value_format, plan.precision_format, fast_divide,
        plan.code_kind, plan.lo, plan.hi, plan.mask, plan.small_float_id, saturate,
        plan.small_float_rules, resolve_threads(n_threads, x.size), float32_path,
    )
    kernels = _kernels.active.quantize
    flat_x = _flat_storage(x, x_type)
    inputs = [("x", x), ("y_scale", scale)]
    if packed and (out_type.packed or not _LITTLE_ENDIAN):
        raw = _prepare_packed_output(out, packed_size(out_type, x.size), out_type, inputs)
        if out_type.packed:
            # Quantized and packed piece by piece: the one-per-byte codes never exist.
            kernels.quantize_packed(flat_x, *params, raw, out_type.bits, *args)
        else:
            y = np.empty(x.shape, dtype=out_type.dtype)
            kernels.quantize(flat_x, *params, y.reshape(-1).view(out_type.storage), *args)
            raw[...] = y.reshape(-1).astype(y.dtype.newbyteorder("<")).view(np.uint8)
        return raw
    if packed:
        # Whole-byte types: the storage is the raw_data; write it in place.
        raw = _prepare_packed_output(out, packed_size(out_type, x.size), out_type, inputs)
        kernels.quantize(flat_x, *params, raw.view(out_type.storage), *args)
        return raw
    y = _prepare_output(out, x.shape, out_type, inputs)
    kernels.quantize(flat_x, *params, y.reshape(-1).view(out_type.storage), *args)
    return y


def _quantize_output_type(spec, opset, output_dtype, zero_point, label) -> ElementType:
    zp_type = None if zero_point is None else array_element_type(zero_point, "y_zero_point")
    if output_dtype is not None:
        requested = element_type(output_dtype, "output_dtype")
        if zp_type is not None and zp_type is not requested:
            raise TypeError(
                f"{label}: output_dtype {requested.name} conflicts with y_zero_point of type "
                f"{zp_type.name}; when both are given they must agree"
            )
        return requested
    return zp_type if zp_type is not None else _UINT8


def _division_precision(spec, label, precision, x_type, scale_type) -> ElementType:
    if spec.division_precision == "float32":
        return _FLOAT32
    if spec.division_precision == "scale":
        return scale_type if scale_type.kind == "value" else _FLOAT32
    if precision:
        name = _PRECISION_TYPES.get(precision)
        if name is None:
            raise ValueError(
                f"{label}: precision={precision}; allowed 0 (the scale's type), "
                + ", ".join(f"{k} ({v})" for k, v in _PRECISION_TYPES.items())
            )
        return ELEMENT_TYPES[name]
    # int32 and float8e8m0 scales cannot be a division precision: float32 (docs/semantics.md).
    return scale_type if scale_type.kind == "value" else _FLOAT32


@lru_cache(maxsize=None)
def _decode_table(type_name: str) -> np.ndarray:
    etype = ELEMENT_TYPES[type_name]
    if etype.kind == "small_float":
        table = _dequantize.decode_table(etype.small_float_id)
    else:
        codes = np.arange(256, dtype=np.int64) & ((1 << etype.bits) - 1)
        if etype.lo < 0:
            codes = np.where(codes >= 1 << (etype.bits - 1), codes - (1 << etype.bits), codes)
        table = codes.astype(np.float32)
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class _DequantizePlan:
    label: str
    x_type: ElementType
    out_type: ElementType
    gran: _Granularity
    table: np.ndarray
    integer_bits: int
    integer_signed: bool
    small_float_id: int
    float32_parameters: bool


@lru_cache(maxsize=512)
def _dequantize_plan(opset, x_dtype, x_shape, scale_dtype, scale_shape, zp_dtype, zp_shape, axis,
                     block_size, output_dtype):
    # As _quantize_plan: validated once per signature.
    spec = get_spec("DequantizeLinear", opset)
    opset = spec.since_version if opset is None else opset
    label = _label(spec, opset)
    scale = _ArraySpec(scale_dtype, scale_shape)
    zero_point = None if zp_dtype is None else _ArraySpec(zp_dtype, zp_shape)
    _check_attribute(spec, opset, "block_size", block_size, 0)
    _check_attribute(spec, opset, "output_dtype", output_dtype, None)

    x_type = array_element_type(_ArraySpec(x_dtype, x_shape), "x")
    scale_type = array_element_type(scale, "x_scale")
    _check_type(spec, opset, "x", x_type)
    _check_type(spec, opset, "x_scale", scale_type)
    if zero_point is not None:
        zp_type = array_element_type(zero_point, "x_zero_point")
        if zp_type is not x_type:
            raise TypeError(f"{label}: x_zero_point must have the type of x ({x_type.name}), got {zp_type.name}")

    if spec.multiplication_precision == "float32":
        out_type = _FLOAT32
    elif output_dtype is not None:
        out_type = element_type(output_dtype, "output_dtype")
        _check_type(spec, opset, "y", out_type)
    elif scale_type is _E8M0:
        out_type = _FLOAT32  # e8m0 is no output type: documented default (docs/semantics.md)
    else:
        out_type = scale_type

    gran = _resolve_granularity(spec, opset, x_shape, scale, zero_point, axis, block_size,
                                "x_scale", "x_zero_point")
    if x_type.storage.itemsize == 1:
        table = _decode_table(x_type.name)
    else:
        table = _decode_table("uint8")  # unused by 16- and 32-bit codes
    return _DequantizePlan(
        label, x_type, out_type, gran, table,
        # Integer codes of 8 bits or fewer, and small floats, are decoded on their bits.
        x_type.bits if x_type.kind == "integer" and x_type.bits <= 8 else 0,
        x_type.kind == "integer" and x_type.lo < 0,
        x_type.small_float_id if x_type.kind == "small_float" else -1,
        # float32 outputs from 8- and 16-bit codes read float32 parameters (exact there).
        out_type.value_format == FMT_FLOAT32 and x_type.storage.itemsize <= 2,
    )


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                      opset=None, out=None, packed=False, dtype=None, shape=None,
                      n_threads=None) -> np.ndarray:
    """ONNX DequantizeLinear: y = (x - x_zero_point) * x_scale, rounded once to the output type.

    `opset` selects the version (None: 28). The output type is float32 (10, 13), the
    scale's type (19, 21), or `output_dtype` / the scale's type (23+).

    `out` receives the result (no allocation). With `packed=True`, x is the ONNX raw_data
    of the codes (bytes or a uint8 array, as `pack` gives and `quantize_linear(...,
    packed=True)` returns): `shape` is the shape of x and `dtype` its element type (or
    x_zero_point's type); sub-byte codes are unpacked piece by piece, never as a whole
    array. `n_threads` overrides the default thread count; the bits never depend on it.
    """
    scale = _as_array(x_scale, "x_scale")
    zero_point = None if x_zero_point is None else _as_array(x_zero_point, "x_zero_point")
    raw = None
    if packed:
        spec = get_spec("DequantizeLinear", opset)
        label = _label(spec, spec.since_version if opset is None else opset)
        x_type, x_shape, raw = _packed_input(x, dtype, shape, zero_point, label)
        x_dtype = x_type.dtype
        if x_type.packed:
            x = None  # read from raw by the packed kernel
        elif _LITTLE_ENDIAN:
            x = raw.view(x_type.dtype).reshape(x_shape)  # whole-byte types: a view
        else:
            x = raw.view(x_type.dtype.newbyteorder("<")).astype(x_type.dtype).reshape(x_shape)
    else:
        if dtype is not None or shape is not None:
            spec = get_spec("DequantizeLinear", opset)
            label = _label(spec, spec.since_version if opset is None else opset)
            raise TypeError(f"{label}: dtype= and shape= describe packed input; pass packed=True")
        x = _as_array(x, "x")
        x_dtype, x_shape = x.dtype, x.shape
    key = (opset, x_dtype, x_shape, scale.dtype, scale.shape,
           None if zero_point is None else zero_point.dtype,
           None if zero_point is None else zero_point.shape,
           _int_attribute(axis, "axis"), _int_attribute(block_size, "block_size"),
           _normalize_output_dtype(output_dtype))
    plan = _plan_cached(_dequantize_plan, key)
    x_type, out_type, gran = plan.x_type, plan.out_type, plan.gran
    _check_zero_point_values(zero_point, x_type, plan.label, "x_zero_point")
    params = _kernel_parameters(scale, zero_point, scale.size, 0.0, plan.float32_parameters,
                                zero_point_int=False)[:4]
    size = math.prod(x_shape)
    y = _prepare_output(out, x_shape, out_type, [("x", x if raw is None else raw), ("x_scale", scale)])
    n_threads = resolve_threads(n_threads, size)
    if x is None:
        _kernels.active.dequantize.dequantize_packed(
            raw, x_type.bits, size, *params, y.reshape(-1).view(out_type.storage),
            gran.outer, gran.axis_len, gran.inner, gran.kind, gran.block_size,
            plan.table, out_type.value_format, n_threads, plan.integer_bits, plan.integer_signed,
            plan.small_float_id, _FAST_KERNELS,
        )
        return y
    _kernels.active.dequantize.dequantize(
        _flat_storage(x, x_type), *params, y.reshape(-1).view(out_type.storage),
        gran.outer, gran.axis_len, gran.inner, gran.kind, gran.block_size,
        plan.table, x_type.name == "int16", out_type.value_format, n_threads,
        plan.integer_bits, plan.integer_signed, plan.small_float_id, _FAST_KERNELS,
    )
    return y


def dynamic_quantize_linear(x, *, opset=None):
    """ONNX DynamicQuantizeLinear-11: (y uint8, y_scale float32 scalar, y_zero_point uint8 scalar).

    The range is [min(0, min x), max(0, max x)] over the non-NaN values; a zero range gives
    scale 1 and zero point 0 (docs/semantics.md).
    """
    spec = get_spec("DynamicQuantizeLinear", opset)
    x = _as_array(x, "x")
    x_type = array_element_type(x, "x")
    _check_type(spec, spec.since_version if opset is None else opset, "x", x_type)
    flat = np.ascontiguousarray(x).reshape(-1)
    lo, hi, _ = _dynamic.min_max(flat, resolve_threads(None, flat.size))
    f32 = np.float32
    low = f32(min(f32(0.0), f32(lo)))
    high = f32(max(f32(0.0), f32(hi)))
    with np.errstate(all="ignore"):
        span = f32(high - low)
        # A zero range has no scale in the formula (0 / 0 below): use 1, as onnxruntime.
        # A nonzero range whose scale underflows to 0 follows the formula.
        scale = f32(1.0) if span == 0.0 else span / f32(255.0)
        intermediate = f32(0.0) - low / scale
    # Saturate, then round half to even. The intermediate is NaN only when min x is -inf
    # (0 - (-inf) / inf): the zero point of a range whose minimum goes to -inf tends to
    # 255, and both onnx.reference and onnxruntime give 255 too.
    zp_value = 255.0 if math.isnan(intermediate) else min(max(float(intermediate), 0.0), 255.0)
    y_zero_point = np.array(round(zp_value), dtype=np.uint8)
    y_scale = np.array(scale, dtype=np.float32)
    y = quantize_linear(x, y_scale, y_zero_point, opset=13)
    return y, y_scale, y_zero_point
