"""The rules the op-spec table states as data, interpreted in one place.

Each OpSpec field that is a rule (division_precision, multiplication_precision,
output_type_rule, saturate_types, granularities) is read here and nowhere else: the ops,
golden generation and the command line all ask these functions. Rules the spec leaves
open are in docs/semantics.md.
"""

from __future__ import annotations

from ._dtypes import ELEMENT_TYPES, ElementType
from ._opspec import PRECISION_TYPES, OpSpec

_FLOAT32 = ELEMENT_TYPES["float"]
_UINT8 = ELEMENT_TYPES["uint8"]


def label(spec: OpSpec, opset: int | None) -> str:
    """How errors name an op: "QuantizeLinear-21 (opset 23)"."""
    return f"{spec.op_type}-{spec.since_version} (opset {spec.since_version if opset is None else opset})"


def shares_input_type(spec: OpSpec) -> bool:
    """QuantizeLinear-19 and -21: x and y_scale are both T1, so their types must agree."""
    return spec.division_precision == "scale"


def precision_type(code: int, where: str) -> ElementType:
    """The type a QuantizeLinear-23+ `precision` attribute names (not 0)."""
    name = PRECISION_TYPES.get(code)
    if name is None:
        raise ValueError(
            f"{where}: precision={code}; allowed 0 (the scale's type), "
            + ", ".join(f"{k} ({v})" for k, v in PRECISION_TYPES.items())
        )
    return ELEMENT_TYPES[name]


def division_precision(spec: OpSpec, scale_type: ElementType, precision: int = 0,
                       where: str = "QuantizeLinear") -> ElementType:
    """QuantizeLinear: the type the quotient x / y_scale is rounded to.

    float32 before version 19; the scale's type at 19 and 21; from 23 the `precision`
    attribute, else the scale's type. int32 and float8e8m0 scales cannot be a precision:
    float32 (docs/semantics.md)."""
    rule = spec.division_precision
    if rule == "float32":
        return _FLOAT32
    if rule == "precision_or_scale" and precision:
        return precision_type(precision, where)
    if rule not in ("scale", "precision_or_scale"):
        raise AssertionError(f"unknown division_precision rule {rule!r}")
    return scale_type if scale_type.kind == "value" else _FLOAT32


def quantize_output_type(spec: OpSpec, output_dtype: ElementType | None,
                         zero_point_type: ElementType | None, where: str) -> ElementType:
    """QuantizeLinear's y: output_dtype (21+), else the zero point's type, else uint8."""
    rule = spec.output_type_rule
    if rule not in ("zero_point_or_uint8", "output_dtype_or_zero_point_or_uint8"):
        raise AssertionError(f"unknown output_type_rule {rule!r}")
    if output_dtype is not None and rule == "output_dtype_or_zero_point_or_uint8":
        if zero_point_type is not None and zero_point_type is not output_dtype:
            raise TypeError(
                f"{where}: output_dtype {output_dtype.name} conflicts with y_zero_point of type "
                f"{zero_point_type.name}; when both are given they must agree"
            )
        return output_dtype
    return zero_point_type if zero_point_type is not None else _UINT8


def _dequantize_type(rule: str, output_dtype: ElementType | None,
                     scale_type: ElementType) -> ElementType:
    if rule == "float32":
        return _FLOAT32
    if rule == "output_dtype_or_scale" and output_dtype is not None:
        return output_dtype
    if rule not in ("scale", "output_dtype_or_scale"):
        raise AssertionError(f"unknown DequantizeLinear rule {rule!r}")
    # A float8e8m0 scale is no output type: float32 (docs/semantics.md).
    return scale_type if scale_type.kind == "value" else _FLOAT32


def dequantize_output_type(spec: OpSpec, output_dtype: ElementType | None,
                           scale_type: ElementType) -> ElementType:
    """DequantizeLinear's y: float32 (10, 13), the scale's type (19, 21), output_dtype
    else the scale's type (23+)."""
    return _dequantize_type(spec.output_type_rule, output_dtype, scale_type)


def multiplication_precision(spec: OpSpec, output_dtype: ElementType | None,
                             scale_type: ElementType) -> ElementType:
    """DequantizeLinear: the type (x - x_zero_point) * x_scale is computed in. Every
    version's text makes it the output type; the table states it separately."""
    return _dequantize_type(spec.multiplication_precision, output_dtype, scale_type)


def cast_output_type(spec: OpSpec, to: ElementType | None,
                     target_type: ElementType | None) -> ElementType:
    """Cast's output is the `to` attribute's type; CastLike's the target_type input's."""
    rule = spec.output_type_rule
    if rule == "to":
        chosen = to
    elif rule == "target_type":
        chosen = target_type
    else:
        raise AssertionError(f"unknown Cast output_type_rule {rule!r}")
    if chosen is None:
        raise AssertionError(f"{spec.op_type}: the {rule} that names the output type is missing")
    return chosen


def saturate_applies(spec: OpSpec, out_type: ElementType) -> bool:
    """Whether `saturate` is read for this output type (the float8 types from 19 on)."""
    return out_type.onnx_type in spec.saturate_types


def has_granularity(spec: OpSpec, granularity: str) -> bool:
    return granularity in spec.granularities


def integer_datapath_output_type(spec: OpSpec, zero_point_type: ElementType) -> ElementType:
    """MatMulInteger/ConvInteger: int32; QLinearMatMul/QLinearConv: y_zero_point's type."""
    rule = spec.output_type_rule
    if rule == "int32":
        return ELEMENT_TYPES["int32"]
    if rule != "zero_point":
        raise AssertionError(f"unknown output_type_rule {rule!r}")
    return zero_point_type
