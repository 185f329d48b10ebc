"""qemu_q.onnx_ops(): qemu_q's ops inside onnx.reference's ReferenceEvaluator."""

import numpy as np
import pytest

import qemu_q
from support import assert_same_bits

onnx = pytest.importorskip("onnx", reason="the plug-in is for onnx.reference (onnx extra)")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def _q_dq_model(opset: int, qtype: int, saturate: int = 1):
    """x -> QuantizeLinear (output_dtype qtype) -> DequantizeLinear; both results are outputs."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale"], ["q"], output_dtype=qtype,
                         saturate=saturate),
        helper.make_node("DequantizeLinear", ["q", "scale"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "q_dq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("q", qtype, [None]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_every_registered_op_has_a_class():
    names = {cls.__name__ for cls in qemu_q.onnx_ops()}
    assert names == set(qemu_q.OP_VERSIONS)
    assert all(cls.op_domain == "" for cls in qemu_q.onnx_ops())


def test_nodes_run_with_qemu_q_bits():
    # e4m3fnuz +-inf at opset 21: Cast-21's "Inf -> NaN" gives 0x80 in qemu_q, onnx.reference
    # gives +-max (docs/divergences.md), so the codes show which implementation ran the node.
    x = np.array([np.inf, -np.inf, 1.5, -3.0, 1e6], np.float32)
    scale = np.array(1.0, np.float32)
    model = _q_dq_model(21, TensorProto.FLOAT8E4M3FNUZ)
    q, y = ReferenceEvaluator(model, new_ops=qemu_q.onnx_ops()).run(None, {"x": x, "scale": scale})
    assert q.view(np.uint8).tolist() == [0x80, 0x80, 0x44, 0xCC, 0x7F]
    (expected_q,) = qemu_q.run_op("QuantizeLinear", [x, scale], {"output_dtype": TensorProto.FLOAT8E4M3FNUZ}, 21)
    (expected_y,) = qemu_q.run_op("DequantizeLinear", [expected_q, scale], {}, 21)
    assert_same_bits(q, expected_q, "q")
    assert_same_bits(y, expected_y, "y")
    plain_q, _ = ReferenceEvaluator(model).run(None, {"x": x, "scale": scale})
    assert plain_q.view(np.uint8)[:2].tolist() == [0x7F, 0xFF]


@pytest.mark.parametrize("opset, code", [(23, 0x80), (24, 0x7F)])
def test_the_model_opset_reaches_qemu_q(opset, code):
    # float8e4m3fnuz, saturate=1: +inf is NaN (0x80) in Cast-23's table, +max (0x7F) from 24.
    model = _q_dq_model(opset, TensorProto.FLOAT8E4M3FNUZ)
    q, _ = ReferenceEvaluator(model, new_ops=qemu_q.onnx_ops()).run(
        None, {"x": np.array([np.inf], np.float32), "scale": np.array(1.0, np.float32)})
    assert q.view(np.uint8).tolist() == [code]


def test_dynamic_quantize_linear_node():
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero_point"])
    graph = helper.make_graph(
        [node], "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [None]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("zero_point", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    x = np.array([-1.0, 0.0, 2.5, np.nan, 1.25], np.float32)
    got = ReferenceEvaluator(model, new_ops=qemu_q.onnx_ops()).run(None, {"x": x})
    for name, a, b in zip(("y", "scale", "zero_point"), got, qemu_q.dynamic_quantize_linear(x)):
        assert_same_bits(np.asarray(a), b, name)
