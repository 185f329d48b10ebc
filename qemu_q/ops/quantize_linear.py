"""QuantizeLinear (10, 13, 19, 21, 23, 24, 25, 28): y = saturate(round(x / y_scale) + y_zero_point)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _coerce, _dispatch
from .._buffers import (
    LITTLE_ENDIAN, finish_output, flat_storage, kernel_output, prepare_output, prepare_packed_output,
)
from .._dispatch import Path
from .._dtypes import CODE_INTEGER, CODE_SMALL_FLOAT, FMT_FLOAT32, ElementType, array_element_type
from .._opspec import get_spec, normalize_opset
from .._pack import packed_size
from .._params import check_zero_point_values, kernel_parameters
from .._registry import register
from .._rules import (
    division_precision, label, quantize_output_type, saturate_applies, shares_input_type,
)
from .._threads import in_default_fp_environment, resolve_threads
from .._validate import (
    ArraySpec, Granularity, cached_plan, check_attribute, check_type, resolve_granularity,
)

_FLOAT32_DIVISION_X = ("float", "float16", "bfloat16")
_FLOAT32_DIVISION_SCALES = ("float", "float16", "bfloat16", "float8e8m0")


@dataclass(frozen=True)
class QuantizePlan:
    label: str
    x_type: ElementType
    out_type: ElementType
    gran: Granularity
    precision_format: int
    fast_divide: bool  # x and the scale are float32 values divided in float32
    code_kind: int
    lo: int
    hi: int
    mask: int
    small_float_id: int
    saturate: int

    def kernel_config(self, n_threads: int, float32_path: bool) -> tuple:
        g = self.gran
        return (g.outer, g.axis_len, g.inner, g.kind, g.block_size, self.x_type.value_format,
                self.precision_format, self.fast_divide, self.code_kind, self.lo, self.hi,
                self.mask, self.small_float_id, self.saturate, n_threads, float32_path)


@lru_cache(maxsize=512)
def quantize_plan(opset, x: ArraySpec, scale: ArraySpec, zero_point: ArraySpec | None, axis,
                  block_size, saturate, precision, output_dtype) -> QuantizePlan:
    # Everything that depends on types, shapes and attributes only, validated once per
    # signature: repeated calls (a model's layers, a sweep) skip straight to the kernel.
    spec = get_spec("QuantizeLinear", opset)
    opset = spec.since_version if opset is None else opset
    where = label(spec, opset)
    check_attribute(spec, opset, "block_size", block_size, 0)
    check_attribute(spec, opset, "saturate", saturate, 1)
    check_attribute(spec, opset, "precision", precision, 0)
    check_attribute(spec, opset, "output_dtype", output_dtype, None)
    if saturate not in (0, 1):
        raise ValueError(f"{where}: saturate={saturate}; allowed 0 or 1")

    x_type = array_element_type(x, "x")
    scale_type = array_element_type(scale, "y_scale")
    check_type(spec, opset, "x", x_type)
    check_type(spec, opset, "y_scale", scale_type)
    if shares_input_type(spec) and scale_type is not x_type:
        raise TypeError(f"{where}: x and y_scale share type T1; got x {x_type.name} and y_scale {scale_type.name}")

    zp_type = None if zero_point is None else array_element_type(zero_point, "y_zero_point")
    out_type = quantize_output_type(spec, output_dtype, zp_type, where)
    check_type(spec, opset, "y", out_type)
    if zp_type is not None:
        check_type(spec, opset, "y_zero_point", zp_type)

    precision_type = division_precision(spec, scale_type, precision, where)
    gran = resolve_granularity(spec, opset, x.shape, scale, zero_point, axis, block_size,
                               "y_scale", "y_zero_point")
    fast_divide = (
        precision_type.value_format == FMT_FLOAT32
        and x_type.name in _FLOAT32_DIVISION_X
        and scale_type.name in _FLOAT32_DIVISION_SCALES
    )
    if out_type.kind == "integer":
        code_kind, lo, hi, mask = CODE_INTEGER, out_type.lo, out_type.hi, (1 << out_type.bits) - 1
        small_float_id = 0
    else:
        code_kind, lo, hi, mask = CODE_SMALL_FLOAT, 0, 0, 0
        small_float_id = out_type.small_float_id
    return QuantizePlan(where, x_type, out_type, gran, precision_type.value_format, fast_divide,
                        code_kind, lo, hi, mask, small_float_id,
                        saturate if saturate_applies(spec, out_type) else 1)


@in_default_fp_environment
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=None,
                    saturate=1, precision=0, opset=None, out=None, packed=False,
                    n_threads=None) -> np.ndarray:
    """ONNX QuantizeLinear: y = saturate(round(x / y_scale) + y_zero_point), bit-exact.

    `opset` selects the version (newest since-version <= opset; None: 28). Types follow
    that version's schema; `output_dtype` takes an ONNX data-type int, a name ("int4",
    "float8e4m3fn") or a dtype. Rules the spec leaves open are in docs/semantics.md.

    `out` receives the result (no allocation). With `packed=True` the result is the ONNX
    raw_data of y instead: a 1-D uint8 array of `pack(y)`'s bytes (ceil(n * bits / 8);
    int4/uint4/float4 two per byte, int2/uint2 four, float6 four in three), quantized and
    packed in one pass; `out` must then be such a uint8 array. `n_threads` overrides the
    default thread count (`set_num_threads`); the bits never depend on it.
    """
    x = _coerce.as_array(x, "x")
    scale = _coerce.as_array(y_scale, "y_scale")
    zero_point = _coerce.optional_array(y_zero_point, "y_zero_point")
    packed = _coerce.flag(packed, "packed")
    plan = cached_plan(quantize_plan, (
        normalize_opset(opset), ArraySpec(x.dtype, x.shape), ArraySpec(scale.dtype, scale.shape),
        None if zero_point is None else ArraySpec(zero_point.dtype, zero_point.shape),
        _coerce.int_attribute(axis, "axis"), _coerce.int_attribute(block_size, "block_size"),
        _coerce.int_attribute(saturate, "saturate", allow_bool=True),
        _coerce.int_attribute(precision, "precision"), _coerce.output_dtype(output_dtype),
    ))
    out_type = plan.out_type
    n_threads = resolve_threads(n_threads, x.size)
    # The output is checked before anything is converted or allocated.
    inputs = [("x", x), ("y_scale", scale), ("y_zero_point", zero_point)]
    if packed:
        result = prepare_packed_output(out, packed_size(out_type, x.size), out_type, inputs)
    else:
        result = prepare_output(out, x.shape, out_type, inputs)
    if x.size == 0:
        return result
    check_zero_point_values(zero_point, out_type, plan.label, "y_zero_point")
    # float32 x divided in float32: the kernels' vectorized paths, on float32 parameters.
    float32_path = _dispatch.FAST_KERNELS and plan.fast_divide and plan.x_type.name == "float"
    params = kernel_parameters(scale, zero_point, scale.size, -0.0, float32_path,
                               zero_point_int=out_type.kind == "integer")
    config = plan.kernel_config(n_threads, float32_path)
    flat_x = flat_storage(x, plan.x_type)
    if packed and out_type.packed:
        # Quantized and packed piece by piece: the one-per-byte codes never exist.
        _dispatch.run(Path.QUANTIZE_PACKED, flat_x, *params, result, out_type.bits, *config)
    elif packed and not LITTLE_ENDIAN:
        codes = np.empty(x.size, dtype=out_type.dtype)
        _dispatch.run(Path.QUANTIZE, flat_x, *params, codes.view(out_type.storage), *config)
        result[...] = codes.astype(codes.dtype.newbyteorder("<")).view(np.uint8)
    else:
        # Whole-byte packed types: the storage is the raw_data, written in place.
        storage = result.view(out_type.storage) if packed else result.reshape(-1).view(out_type.storage)
        written = kernel_output(storage)
        _dispatch.run(Path.QUANTIZE, flat_x, *params, written, *config)
        finish_output(storage, written)
    return result


@register("QuantizeLinear")
def _run_node(inputs, attributes, opset):
    return [quantize_linear(*inputs, opset=opset, **attributes)]
