"""run_op: one ONNX node, the way an ONNX runtime runs it (conformance tools call this)."""

from __future__ import annotations

from ._opspec import get_spec
from ._ops import dequantize_linear, dynamic_quantize_linear, quantize_linear


def run_op(op_type: str, inputs: list, attributes: dict, opset: int) -> list:
    """Run one node: inputs in node order (None for an absent optional input, trailing ones
    may be omitted), attributes as NodeProto ints, `opset` the model's default-domain opset."""
    spec = get_spec(op_type, opset)
    label = f"{op_type}-{spec.since_version} (opset {opset})"
    attributes = dict(attributes or {})
    unknown = sorted(set(attributes) - set(spec.attributes))
    if unknown:
        allowed = ", ".join(spec.attributes) or "none"
        raise ValueError(f"{label} has no attribute {unknown[0]!r}; its attributes: {allowed}")
    inputs = list(inputs)
    if len(inputs) > len(spec.inputs):
        raise ValueError(f"{label} takes at most {len(spec.inputs)} inputs, got {len(inputs)}")
    inputs += [None] * (len(spec.inputs) - len(inputs))
    for formal, value in zip(spec.inputs, inputs):
        if value is None and not formal.optional:
            raise ValueError(f"{label}: input {formal.name!r} is required")
    values = {**{k: v for k, v in spec.attributes.items() if v is not None}, **attributes}
    if op_type == "QuantizeLinear":
        return [quantize_linear(*inputs, opset=opset, **values)]
    if op_type == "DequantizeLinear":
        return [dequantize_linear(*inputs, opset=opset, **values)]
    return list(dynamic_quantize_linear(inputs[0], opset=opset))
