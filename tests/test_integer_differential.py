"""The integer datapath ops against the peers, bit for bit, with the rule that models each
(docs/semantics.md): onnx.reference with requantization="float64", onnxruntime with
"float32" (and accumulator="x86-u8s8-pairs" for u8 x s8 where its CPU path saturates)."""

import pathlib
import warnings

import numpy as np
import pytest

import qemu_q

onnx = pytest.importorskip("onnx", reason="the peers need the onnx extra")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is a test dependency")
from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ONNX_TYPE = {np.dtype(np.uint8): onnx.TensorProto.UINT8, np.dtype(np.int8): onnx.TensorProto.INT8,
             np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.int32): onnx.TensorProto.INT32}
RNG = np.random.default_rng(77)


def _model(op, inputs, attrs, opset, out_type):
    inputs = [np.asarray(a) for a in inputs]  # onnxruntime takes arrays, not numpy scalars
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "integer",
        [helper.make_tensor_value_info(n, ONNX_TYPE[a.dtype], a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", out_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, dict(zip(names, inputs))


def reference(op, inputs, attrs, opset, out_type):
    model, feeds = _model(op, inputs, attrs, opset, out_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


def runtime(op, inputs, attrs, opset, out_type):
    model, feeds = _model(op, inputs, attrs, opset, out_type)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def cpu_flags() -> set:
    path = pathlib.Path("/proc/cpuinfo")
    if not path.exists():
        return set()
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def u8(shape):
    return RNG.integers(0, 256, size=shape).astype(np.uint8)


def s8(shape):
    return RNG.integers(-128, 128, size=shape).astype(np.int8)


def test_matmul_integer_u8u8_agrees_with_both():
    a, b = u8((16, 32)), u8((32, 8))
    inputs = [a, b, np.uint8(7), np.uint8(200)]
    ours = qemu_q.matmul_integer(*inputs)
    np.testing.assert_array_equal(ours, reference("MatMulInteger", inputs, {}, 10, onnx.TensorProto.INT32))
    np.testing.assert_array_equal(ours, runtime("MatMulInteger", inputs, {}, 10, onnx.TensorProto.INT32))


@pytest.mark.parametrize("opset", [10, 21])
def test_qlinear_matmul_u8u8_rules_match_each_peer(opset):
    a, b = u8((24, 40)), u8((40, 16))
    scales = [np.float32(0.0213), np.float32(0.0071), np.float32(0.093)]
    inputs = [a, scales[0], np.uint8(131), b, scales[1], np.uint8(97), scales[2], np.uint8(120)]
    out = onnx.TensorProto.UINT8
    np.testing.assert_array_equal(qemu_q.qlinear_matmul(*inputs, requantization="float64", opset=opset),
                                  reference("QLinearMatMul", inputs, {}, opset, out))
    np.testing.assert_array_equal(qemu_q.qlinear_matmul(*inputs, requantization="float32", opset=opset),
                                  runtime("QLinearMatMul", inputs, {}, opset, out))


def test_qlinear_conv_u8u8_rules_match_each_peer():
    x, w = u8((1, 4, 7, 7)), u8((6, 4, 3, 3))
    inputs = [x, np.float32(0.017), np.uint8(120), w, np.float32(0.0043), np.uint8(128),
              np.float32(0.061), np.uint8(90), RNG.integers(-3000, 3000, size=6).astype(np.int32)]
    attrs = dict(pads=[1, 1, 1, 1], strides=[2, 1])
    out = onnx.TensorProto.UINT8
    mine64 = qemu_q.qlinear_conv(*inputs[:8], inputs[8], requantization="float64", **attrs)
    np.testing.assert_array_equal(mine64, reference("QLinearConv", inputs, attrs, 10, out))
    mine32 = qemu_q.qlinear_conv(*inputs[:8], inputs[8], requantization="float32", **attrs)
    np.testing.assert_array_equal(mine32, runtime("QLinearConv", inputs, attrs, 10, out))


def test_qlinear_matmul_u8s8_pairs_model_onnxruntime():
    flags = cpu_flags()
    if "avx2" not in flags or flags & {"avx_vnni", "avx512_vnni", "avx512vnni"}:
        pytest.skip("onnxruntime's u8 x s8 pair saturation is the AVX2-without-VNNI path; "
                    f"this CPU has flags {sorted(flags & {'avx2', 'avx_vnni', 'avx512_vnni'})}")
    a = np.full((8, 64), 250, np.uint8)
    a[::2] = u8((4, 64))
    b = np.where(RNG.random((64, 8)) < 0.5, 127, -128).astype(np.int8)
    inputs = [a, np.float32(0.02), np.uint8(128), b, np.float32(0.01), np.int8(0), np.float32(0.5), np.uint8(100)]
    theirs = runtime("QLinearMatMul", inputs, {}, 21, onnx.TensorProto.UINT8)
    pairs = qemu_q.qlinear_matmul(*inputs, requantization="float32", accumulator="x86-u8s8-pairs")
    np.testing.assert_array_equal(pairs, theirs)
    exact_acc = qemu_q.qlinear_matmul(*inputs, requantization="float32")
    assert not np.array_equal(exact_acc, theirs)  # the saturation is visible on these inputs
