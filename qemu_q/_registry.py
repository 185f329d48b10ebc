"""run_op: one ONNX node, the way an ONNX runtime runs it (conformance tools call this).

Each op family registers, per op type, an adapter from a node's inputs and attributes to
its public function (`register`); run_op resolves the spec, checks the node against it and
calls the adapter. No op is named here.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ._opspec import get_spec, normalize_opset
from ._rules import label

NodeRunner = Callable[[list, dict, "int | None"], list]
RUNNERS: dict[str, NodeRunner] = {}


def register(op_type: str):
    """Decorator: `runner(inputs, attributes, opset) -> outputs` runs nodes of `op_type`.
    `inputs` has one entry per formal input (None where absent), `attributes` the spec's
    defaults overlaid with the node's."""
    def decorate(runner: NodeRunner) -> NodeRunner:
        if op_type in RUNNERS:
            raise RuntimeError(f"{op_type} registered twice")
        RUNNERS[op_type] = runner
        return runner
    return decorate


def run_op(op_type: str, inputs: Sequence[np.ndarray | None], attributes: Mapping[str, Any] | None,
           opset: int | None) -> list[np.ndarray]:
    """Run one node: inputs in node order (None for an absent optional input, trailing ones
    may be omitted), attributes as NodeProto values, `opset` the model's default-domain opset."""
    opset = normalize_opset(opset)
    spec = get_spec(op_type, opset)
    where = label(spec, opset)
    if attributes is not None and not isinstance(attributes, dict):
        raise TypeError(f"{where}: attributes must be a dict, got {type(attributes).__name__}")
    attributes = dict(attributes or {})
    unknown = sorted(set(attributes) - set(spec.attributes), key=str)
    if unknown:
        allowed = ", ".join(spec.attributes) or "none"
        raise ValueError(f"{where} has no attribute {unknown[0]!r}; its attributes: {allowed}")
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise TypeError(f"{where}: inputs must be a list of arrays, got {type(inputs).__name__}")
    inputs = list(inputs)
    if len(inputs) > len(spec.inputs):
        raise ValueError(f"{where} takes at most {len(spec.inputs)} inputs, got {len(inputs)}")
    inputs += [None] * (len(spec.inputs) - len(inputs))
    for formal, value in zip(spec.inputs, inputs):
        if value is None and not formal.optional:
            raise ValueError(f"{where}: input {formal.name!r} is required")
    values = {**{k: v for k, v in spec.attributes.items() if v is not None}, **attributes}
    runner = RUNNERS.get(op_type)
    if runner is None:
        raise NotImplementedError(f"{op_type} is in the spec table but no op family registers it")
    return runner(inputs, values, opset)
