"""A real quantized model, made by onnxruntime's own quantization tool (quantize_static, QDQ,
per-channel int8 weights, uint8 activations): its QuantizeLinear / DequantizeLinear nodes
give qemu_q's bits through the onnx.reference plug-in, and onnxruntime's bits agree node by
node; `qemu-q run` dumps every tensor of it."""

import json
import subprocess
import sys

import numpy as np
import pytest

import qemu_q
import real_model
from support import bits

onnx = pytest.importorskip("onnx", reason="the real-model test needs the onnx extra")
ort = pytest.importorskip("onnxruntime", reason="the model is made by onnxruntime's quantizer")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

QDQ = ("QuantizeLinear", "DequantizeLinear")
# Q/DQ nodes where qemu_q and onnxruntime may differ, with the docs/divergences.md entry
# that says why. None for this model: uint8 / int8 per-tensor and per-channel with float32
# scales, and int32 bias codes far below 2**24.
KNOWN_DIVERGENT_NODES: dict = {}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return real_model.quantized_model(tmp_path_factory.mktemp("real_model"))


@pytest.fixture(scope="module")
def model(model_path):
    return onnx.load(model_path)


def _with_every_output(model):
    """A copy whose graph outputs are every node output (typed by shape inference)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.output[:]
    for node in model.graph.node:
        for name in node.output:
            copy.graph.output.append(typed[name])
    return copy


def _ort_run(model, feeds) -> dict:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(_with_every_output(model).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _node_inputs(node, values, initializers):
    return [values[n] if n in values else initializers[n] for n in node.input]


def _attributes(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _first_mismatch(got, want):
    g, w = bits(got).reshape(-1), bits(want).reshape(-1)
    index = int(np.nonzero(g != w)[0][0])
    return index, np.unravel_index(index, got.shape), hex(int(w[index])), hex(int(g[index]))


def _assert_node(node, got, want, who):
    assert got.dtype == want.dtype and got.shape == want.shape, (node.name, got.dtype, want.dtype)
    if not np.array_equal(bits(got), bits(want)):
        index, where, expected, actual = _first_mismatch(got, want)
        pytest.fail(f"{node.op_type} node {node.name!r} output {node.output[0]!r}: qemu_q differs "
                    f"from {who} at flat index {index} {where}: {who} {expected}, qemu_q {actual}")


def test_model_has_the_tool_s_qdq_nodes(model):
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 7 and ops.count("DequantizeLinear") >= 14
    per_channel = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
                   and n.input[0] in ("conv1_w_quantized", "fc1_w_quantized")]
    assert len(per_channel) == 2  # the tool's per-channel weights


@pytest.mark.parametrize("seed", [10, 11])
def test_qdq_nodes_agree_with_onnxruntime(model, seed):
    # Each Q/DQ node is fed onnxruntime's own inputs to it (the float Conv/MatMul between the
    # nodes are not qemu_q's to emulate), then its output compared bit for bit.
    feeds = {real_model.INPUT: real_model.batches(1, seed)[0]}
    values = {**feeds, **_ort_run(model, feeds)}
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    checked = 0
    for node in model.graph.node:
        if node.op_type not in QDQ or node.name in KNOWN_DIVERGENT_NODES:
            continue
        (got,) = qemu_q.run_op(node.op_type, _node_inputs(node, values, initializers),
                               _attributes(node), opset)
        _assert_node(node, got, values[node.output[0]], "onnxruntime")
        checked += 1
    assert checked >= 21


def test_whole_model_runs_with_qemu_q_bits(model):
    feeds = {real_model.INPUT: real_model.batches(1, 12)[0]}
    results = ReferenceEvaluator(model, new_ops=qemu_q.onnx_ops()).run(None, feeds, intermediate=True)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for node in model.graph.node:
        if node.op_type in QDQ:
            (want,) = qemu_q.run_op(node.op_type, [results[n] for n in node.input],
                                    _attributes(node), opset)
            _assert_node(node, results[node.output[0]], want, "run_op")
    logits = results["logits"]
    assert logits.shape == (1, 10) and logits.dtype == np.float32 and np.isfinite(logits).all()


def _cli(package_home, *args):
    return subprocess.run([sys.executable, "-m", "qemu_q", *map(str, args)], cwd=package_home,
                          capture_output=True, text=True)


def test_qemu_q_run_dumps_every_tensor(model_path, model, tmp_path, package_home):
    from qemu_q.golden import writers

    image = tmp_path / "image.npy"
    np.save(image, real_model.batches(1, 13)[0])
    dump_dir = tmp_path / "dump"
    done = _cli(package_home, "run", model_path, "--input", f"image={image}", "--dump", dump_dir)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((dump_dir / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["tensors"]}
    for node in model.graph.node:
        for name in node.output:
            assert entries[name]["producer"] == node.name and entries[name]["op_type"] == node.op_type
    assert entries["image"]["producer"] == "input"

    def load(name):
        entry = entries[name]
        array = writers.read_tensor_proto((dump_dir / entry["pb"]).read_bytes())
        text = (dump_dir / entry["hex"]).read_text()
        from_hex = writers.read_hex(text, *writers.hex_type_and_shape(text))
        assert np.array_equal(bits(from_hex), bits(array)) and from_hex.dtype == array.dtype, name
        assert entry["type"] == qemu_q.element_type(array.dtype).name
        return array

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            inputs = [load(n) for n in node.input]
            (want,) = qemu_q.run_op(node.op_type, inputs, _attributes(node), opset)
            got = load(node.output[0])
            assert np.array_equal(bits(got), bits(want)), node.name


def test_qemu_q_run_errors(model_path, tmp_path, package_home):
    image = tmp_path / "image.npy"
    np.save(image, real_model.batches(1, 13)[0])
    wrong_shape = tmp_path / "small.npy"
    np.save(wrong_shape, np.zeros((1, 3, 8, 8), np.float32))
    wrong_type = tmp_path / "f64.npy"
    np.save(wrong_type, np.zeros(real_model.SHAPE))
    cases = [
        (["--dump", tmp_path / "a"], "missing image"),
        ([f"--input=image={image}", "--input", f"other={image}", "--dump", tmp_path / "b"],
         "unknown other"),
        (["--input", f"image={wrong_shape}", "--dump", tmp_path / "c"], "has shape (1, 3, 8, 8)"),
        (["--input", f"image={wrong_type}", "--dump", tmp_path / "d"], "has type double"),
        (["--input", "image", "--dump", tmp_path / "e"], "expected NAME=FILE"),
    ]
    for extra, message in cases:
        done = _cli(package_home, "run", model_path, *extra)
        assert done.returncode == 2 and message in done.stderr, (extra, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    done = _cli(package_home, "run", tmp_path / "none.onnx", "--input", f"image={image}",
                "--dump", tmp_path / "f")
    assert done.returncode == 1 and "no such model file" in done.stderr
