"""qemu_q's ops as onnx.reference op implementations.

    ReferenceEvaluator(model, new_ops=qemu_q.onnx_ops())

runs a whole model with qemu_q's bits at every node qemu_q implements (every op type the
op families register for run_op: new families appear here by themselves) and
onnx.reference's everywhere else. Each node runs through qemu_q.run_op with its own
attributes, as the NodeProto holds them, and the opset the model imports for the default
domain. Needs only the `onnx` extra; `import qemu_q` does not import onnx.
"""

from __future__ import annotations

from ._registry import RUNNERS, run_op

_CLASSES: list | None = None


def onnx_ops() -> list:
    """The onnx.reference OpRun classes of every op qemu_q implements."""
    global _CLASSES
    if _CLASSES is None:
        from onnx import helper
        from onnx.reference.op_run import OpRun

        def _run(self, *inputs, **_defaults):
            # The node's own attributes, not onnx.reference's defaults: run_op applies the
            # spec's defaults of the resolved version itself.
            attributes = {}
            for attribute in self.onnx_node.attribute:
                value = helper.get_attribute_value(attribute)
                attributes[attribute.name] = value.decode() if isinstance(value, bytes) else value
            opset = self.run_params["opsets"].get("", None)
            return tuple(run_op(self.onnx_node.op_type, list(inputs), attributes, opset))

        _CLASSES = [type(op_type, (OpRun,), {"op_domain": "", "_run": _run})
                    for op_type in sorted(RUNNERS)]
    return list(_CLASSES)
