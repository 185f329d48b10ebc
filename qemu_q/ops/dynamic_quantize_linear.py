"""DynamicQuantizeLinear-11: (y uint8, y_scale, y_zero_point) from the range of x."""

from __future__ import annotations

import math

import numpy as np

from .. import _coerce, _dynamic
from .._dtypes import array_element_type
from .._opspec import get_spec, normalize_opset
from .._registry import register
from .._threads import in_default_fp_environment, resolve_threads
from .._typing import Array
from .._validate import check_type
from .quantize_linear import quantize_linear


@in_default_fp_environment
def dynamic_quantize_linear(x: Array, *, opset: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear-11: (y uint8, y_scale float32 scalar, y_zero_point uint8 scalar).

    The range is [min(0, min x), max(0, max x)] over the non-NaN values; a zero range gives
    scale 1 and zero point 0 (docs/semantics.md).
    """
    opset = normalize_opset(opset)
    spec = get_spec("DynamicQuantizeLinear", opset)
    x = _coerce.as_array(x, "x")
    check_type(spec, opset, "x", array_element_type(x, "x"))
    flat = np.require(x, requirements=("C", "A")).reshape(-1)
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
    # Saturate, then round half to even. The intermediate is NaN in two cases, each given
    # its limit: min x = -inf (0 - (-inf) / inf), where the zero point tends to 255 (both
    # onnx.reference and onnxruntime give 255 too); and lo = 0 with a scale that
    # underflows to 0 (0 - 0 / 0), where it is 0 for every positive scale.
    if math.isnan(intermediate):
        zp_value = 255.0 if math.isinf(low) else 0.0
    else:
        zp_value = min(max(float(intermediate), 0.0), 255.0)
    y_zero_point = np.array(round(zp_value), dtype=np.uint8)
    y_scale = np.array(scale, dtype=np.float32)
    y = quantize_linear(x, y_scale, y_zero_point, opset=13)
    return y, y_scale, y_zero_point


@register("DynamicQuantizeLinear")
def _run_node(inputs, attributes, opset):
    return list(dynamic_quantize_linear(inputs[0], opset=opset))
