"""A small float model quantized by onnxruntime's own quantization tool (QDQ, per-channel
weights): the real-model tests and the `qemu-q run` tests share it."""

from __future__ import annotations

import pathlib

import numpy as np

INPUT = "image"
SHAPE = (1, 3, 16, 16)


def float_model():
    """Conv 3->8 3x3, Relu, Conv 8->8 3x3 stride 2, Relu, Flatten, MatMul, Add, Relu, MatMul:
    fixed seed."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2026)

    def weight(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    initializers = [
        weight("conv1_w", 8, 3, 3, 3), weight("conv1_b", 8, scale=0.1),
        weight("conv2_w", 8, 8, 3, 3, scale=0.15), weight("conv2_b", 8, scale=0.1),
        weight("fc1_w", 8 * 7 * 7, 32, scale=0.05), weight("fc1_b", 32, scale=0.1),
        weight("fc2_w", 32, 10, scale=0.2),
    ]
    nodes = [
        helper.make_node("Conv", [INPUT, "conv1_w", "conv1_b"], ["conv1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("Conv", ["relu1", "conv2_w", "conv2_b"], ["conv2"], name="conv2", strides=[2, 2]),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("Flatten", ["relu2"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc1_w"], ["fc1"], name="fc1"),
        helper.make_node("Add", ["fc1", "fc1_b"], ["fc1_biased"], name="fc1_bias"),
        helper.make_node("Relu", ["fc1_biased"], ["relu3"], name="relu3"),
        helper.make_node("MatMul", ["relu3", "fc2_w"], ["logits"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def batches(count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def quantized_model(directory: pathlib.Path) -> pathlib.Path:
    """The float model quantized by onnxruntime.quantization.quantize_static (QDQ, uint8
    activations, int8 per-channel weights, MinMax calibration on four seeded batches)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader, QuantFormat, QuantType, quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{INPUT: x} for x in batches(4, seed=1)])

        def get_next(self):
            return next(self.data, None)

    float_path = directory / "float.onnx"
    quantized_path = directory / "quantized.onnx"
    onnx.save(float_model(), float_path)
    quantize_static(str(float_path), str(quantized_path), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return quantized_path
