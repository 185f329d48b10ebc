"""Every official ONNX backend node test of the quantization family and of Cast/CastLike,
through run_op, bit-exact."""

import pathlib

import numpy as np
import pytest

import qemu_q

onnx = pytest.importorskip("onnx", reason="the ONNX node tests are read with onnx (test extra)")
from onnx import numpy_helper  # noqa: E402

NODE_TESTS = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "onnx-node-tests"
CASES = sorted(p.name for p in NODE_TESTS.iterdir() if p.is_dir()) if NODE_TESTS.is_dir() else []
CAST_TESTS = NODE_TESTS.parent / "onnx-node-tests-cast"
CAST_CASES = sorted(p.name for p in CAST_TESTS.iterdir() if p.is_dir()) if CAST_TESTS.is_dir() else []


def test_node_tests_present(shared_dir):
    # shared_dir fails with a clear message when ../shared is missing.
    folders = sorted(p.name for p in (shared_dir / "onnx-node-tests").iterdir() if p.is_dir())
    assert len(folders) == 33, f"expected the 33 folders of ../shared/onnx-node-tests, found {len(folders)}"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def test_cast_node_tests_present(shared_dir):
    folders = sorted(p.name for p in (shared_dir / "onnx-node-tests-cast").iterdir() if p.is_dir())
    assert len(folders) == 116, f"expected the 116 folders of ../shared/onnx-node-tests-cast, found {len(folders)}"


def _load_case(name, root=NODE_TESTS):
    folder = root / name
    model = onnx.load(str(folder / "model.onnx"))
    data = folder / "test_data_set_0"
    inputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("input_*.pb"))]
    outputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("output_*.pb"))]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return model, inputs, outputs, opset


def _run_graph(model, inputs, opset):
    """Run a single-node graph through run_op."""
    graph = model.graph
    values = {vi.name: arr for vi, arr in zip(graph.input, inputs)}
    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        args = [values[n] if n else None for n in node.input]
        results = qemu_q.run_op(node.op_type, args, attrs, opset)
        values.update(zip(node.output, results))
    return [values[o.name] for o in graph.output]


@pytest.mark.parametrize("name", CASES)
def test_node_case(name):
    model, inputs, expected, opset = _load_case(name)
    if name.endswith("_expanded"):
        # The expanded form is DynamicQuantizeLinear written out as a graph of Reduce/Div/
        # Round/... nodes; its inputs and expected outputs are those of the op itself.
        assert name.startswith("test_dynamicquantizelinear")
        got = qemu_q.run_op("DynamicQuantizeLinear", inputs, {}, 11)
    else:
        assert len(model.graph.node) == 1
        got = _run_graph(model, inputs, opset)
    assert_same_outputs(got, expected)


def assert_same_outputs(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert g.shape == e.shape, (g.shape, e.shape)
        np.testing.assert_array_equal(_bits(g), _bits(e))


@pytest.mark.parametrize("name", CAST_CASES)
def test_cast_node_case(name):
    # Every folder, float4e2m1 NaN included: the Cast rules follow these vectors where the
    # Cast text is silent (docs/semantics.md, "Cast").
    model, inputs, expected, opset = _load_case(name, CAST_TESTS)
    assert len(model.graph.node) == 1 and model.graph.node[0].op_type in ("Cast", "CastLike")
    assert_same_outputs(_run_graph(model, inputs, opset), expected)


# ------------------------------------------ the integer datapath ops (../shared/onnx-node-tests-integer)
# Each folder was checked against its schema text: every expected output is the spec's
# exact requantization (round once, ties to even, then the zero point, then saturate), so
# none is listed as predating an upstream fix (see that folder's SOURCE.txt).

INTEGER_TESTS = NODE_TESTS.parent / "onnx-node-tests-integer"
INTEGER_CASES = sorted(p.name for p in INTEGER_TESTS.iterdir() if p.is_dir()) if INTEGER_TESTS.is_dir() else []


def test_integer_node_tests_present(shared_dir):
    folders = sorted(p.name for p in (shared_dir / "onnx-node-tests-integer").iterdir() if p.is_dir())
    assert len(folders) == 12, f"expected the 12 folders of ../shared/onnx-node-tests-integer, found {folders}"


@pytest.mark.parametrize("name", INTEGER_CASES)
def test_integer_node_case(name):
    folder = INTEGER_TESTS / name
    model = onnx.load(str(folder / "model.onnx"))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert len(model.graph.node) == 1
    data_sets = sorted(folder.glob("test_data_set_*"))
    assert data_sets
    for data in data_sets:
        inputs = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("input_*.pb"))]
        expected = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("output_*.pb"))]
        got = _run_graph(model, inputs, opset)
        assert len(got) == len(expected) == 1
        assert got[0].dtype == expected[0].dtype and got[0].shape == expected[0].shape
        np.testing.assert_array_equal(_bits(got[0]), _bits(expected[0]))
