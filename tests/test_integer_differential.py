"""The integer datapath ops against the peers, bit for bit, with the rule that models each
(docs/semantics.md): onnx.reference with requantization="float64", onnxruntime with
"float32" (and accumulator="x86-u8s8-pairs" for u8 x s8 where its CPU path saturates)."""

import pathlib
import warnings
from fractions import Fraction

import numpy as np
import pytest

import float_oracle as fo
import qemu_q
from support import divergence_entry

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


def raises(fn, *args):
    """The exception a peer raises, or None (then its result is returned as the second item)."""
    try:
        return None, fn(*args)
    except Exception as error:  # noqa: BLE001 - any failure of the peer counts as "raises"
        return error, None


def assert_onnxruntime_model(theirs, pairs, exact):
    """onnxruntime's u8 x s8 products on this CPU: the exact int32 sums with VNNI
    (VPDPBUSD), the pairs model on AVX2 without it, one of the two on another instruction
    set."""
    flags = cpu_flags()
    if flags & {"avx_vnni", "avx512_vnni", "avx512vnni"}:
        np.testing.assert_array_equal(theirs, exact)
    elif "avx2" in flags:
        np.testing.assert_array_equal(theirs, pairs)
    else:
        assert np.array_equal(theirs, pairs) or np.array_equal(theirs, exact)


def test_qlinear_matmul_u8s8_pairs_model_onnxruntime():
    """onnxruntime's u8 x s8 QLinearMatMul is the pairs accumulator on AVX2 CPUs without
    VNNI and the exact int32 one with VNNI (VPDPBUSD); either way one of the two models."""
    a = np.full((8, 64), 250, np.uint8)
    a[::2] = u8((4, 64))
    b = np.where(RNG.random((64, 8)) < 0.5, 127, -128).astype(np.int8)
    inputs = [a, np.float32(0.02), np.uint8(128), b, np.float32(0.01), np.int8(0), np.float32(0.5), np.uint8(100)]
    theirs = runtime("QLinearMatMul", inputs, {}, 21, onnx.TensorProto.UINT8)
    pairs = qemu_q.qlinear_matmul(*inputs, requantization="float32", accumulator="x86-u8s8-pairs")
    exact_acc = qemu_q.qlinear_matmul(*inputs, requantization="float32")
    assert not np.array_equal(exact_acc, pairs)  # the saturation is visible on these inputs
    assert_onnxruntime_model(theirs, pairs, exact_acc)


# ------------------------------------------------------------------ divergences (docs/divergences.md)

def exact_matmul(a, b, a_zp_rows, b_zp):
    """sum_k (a[r, k] - a_zp[r]) * (b[k, c] - b_zp), Python ints: the zero point per row of a."""
    return [[sum((int(a[r, t]) - int(a_zp_rows[r])) * (int(b[t, c]) - int(b_zp)) for t in range(a.shape[1]))
             for c in range(b.shape[1])] for r in range(a.shape[0])]


@divergence_entry("MatMulInteger: per-row a_zero_point [M] (onnx.reference subtracts it along K)")
def test_matmul_integer_per_row_zero_point_axis():
    a = np.array([[10, 20, 30], [40, 50, 60], [70, 80, 90]], np.uint8)
    b = np.array([[1, 2], [3, 4], [5, 6]], np.uint8)
    a_zp = np.array([1, 2, 3], np.uint8)
    inputs = [a, b, a_zp, np.uint8(0)]
    want = exact_matmul(a, b, a_zp, 0)
    assert want == [[211, 268], [472, 616], [733, 964]]
    assert qemu_q.matmul_integer(*inputs).tolist() == want
    # onnx.reference broadcasts the [M] zero point against a's last axis (K): a[r, k] - zp[k]
    assert reference("MatMulInteger", inputs, {}, 10, onnx.TensorProto.INT32).tolist() == \
        [[198, 252], [468, 612], [738, 972]]
    error, _ = raises(runtime, "MatMulInteger", inputs, {}, 10, onnx.TensorProto.INT32)
    assert error is not None and "zero point must be a scalar" in str(error)


@divergence_entry("QLinearMatMul: per-row a_scale / a_zero_point [M] (onnx.reference raises)")
@pytest.mark.parametrize("opset", [10, 21])
def test_qlinear_matmul_per_row_scales(opset):
    a = np.array([[10, 20, 30], [40, 50, 60], [70, 80, 90]], np.uint8)
    b = np.array([[1, 2], [3, 4], [5, 6]], np.uint8)
    a_zp = np.array([1, 2, 3], np.uint8)
    a_scale = np.array([0.5, 0.25, 0.125], np.float32)
    inputs = [a, a_scale, a_zp, b, np.float32(0.5), np.uint8(0), np.float32(4.0), np.uint8(10)]
    acc = exact_matmul(a, b, a_zp, 0)
    want = [[min(max(fo.round_half_even(Fraction(acc[r][c]) * Fraction(float(a_scale[r])) * Fraction(1, 2) / 4) + 10,
                     0), 255) for c in range(2)] for r in range(3)]
    assert want == [[23, 27], [25, 29], [21, 25]]
    for rule in ("exact", "float32", "float64"):
        assert qemu_q.qlinear_matmul(*inputs, requantization=rule, opset=opset).tolist() == want
    error, _ = raises(reference, "QLinearMatMul", inputs, {}, opset, onnx.TensorProto.UINT8)
    assert isinstance(error, ValueError) and "could not be broadcast" in str(error)
    error, _ = raises(runtime, "QLinearMatMul", inputs, {}, opset, onnx.TensorProto.UINT8)
    assert error is not None and "zero point must be a scalar" in str(error)


@divergence_entry("MatMulInteger / QLinearMatMul u8 x s8: onnxruntime's int16 pair saturation (AVX2 without VNNI)")
def test_u8s8_pair_saturation():
    a = np.full((1, 4), 255, np.uint8)
    b = np.full((4, 1), 127, np.int8)
    inputs = [a, b, np.uint8(0), np.int8(0)]
    exact = 4 * 255 * 127
    assert exact == 129540
    pairs = 2 * 32767  # each pair 2 * 255 * 127 = 64770 saturates to 32767
    assert qemu_q.matmul_integer(*inputs).tolist() == [[exact]]
    assert qemu_q.matmul_integer(*inputs, accumulator="x86-u8s8-pairs").tolist() == [[pairs]]
    assert reference("MatMulInteger", inputs, {}, 10, onnx.TensorProto.INT32).tolist() == [[exact]]
    ql = [a, np.float32(1.0), np.uint8(0), b, np.float32(1.0), np.int8(0), np.float32(1024.0), np.uint8(0)]
    # requantized: 129540 / 1024 = 126.5039 -> 127; 65534 / 1024 = 63.998 -> 64
    assert qemu_q.qlinear_matmul(*ql).tolist() == [[127]]
    assert qemu_q.qlinear_matmul(*ql, accumulator="x86-u8s8-pairs").tolist() == [[64]]
    assert reference("QLinearMatMul", ql, {}, 21, onnx.TensorProto.UINT8).tolist() == [[127]]
    flags = cpu_flags()
    theirs = runtime("MatMulInteger", inputs, {}, 10, onnx.TensorProto.INT32).tolist()
    theirs_ql = runtime("QLinearMatMul", ql, {}, 21, onnx.TensorProto.UINT8).tolist()
    if flags & {"avx_vnni", "avx512_vnni", "avx512vnni"}:
        # VPDPBUSD accumulates u8 x s8 products in int32 without the int16 step: exact
        assert (theirs, theirs_ql) == ([[exact]], [[127]])
    elif "avx2" in flags:
        assert (theirs, theirs_ql) == ([[pairs]], [[64]])
    else:  # another instruction set: onnxruntime's path there is one of the two models
        assert (theirs, theirs_ql) in (([[exact]], [[127]]), ([[pairs]], [[64]]))


@divergence_entry("ConvInteger s8 x u8: onnxruntime's int16 pair saturation (AVX2 without VNNI)")
def test_conv_integer_s8u8_pair_saturation():
    # x int8 [[-64]] (one element, one channel), x_zp 127, w uint8 255 x 4 taps, pads 2 above
    # and 1 below: the one output's K runs (pad, pad, x, pad) as raw codes (127, 127, -64,
    # 127). Exact: only x contributes, (-64 - 127) * 255. Pairs: 127 * 255 * 2 = 64770
    # saturates to 32767; -64 * 255 + 127 * 255 = 16065; minus x_zp * sum(w).
    x = np.array([[[[-64]]]], np.int8)
    w = np.full((1, 1, 4, 1), 255, np.uint8)
    inputs = [x, w, np.int8(127), np.uint8(0)]
    attrs = {"pads": [2, 0, 1, 0]}
    exact = (-64 - 127) * 255
    pairs = 32767 + 16065 - 127 * 4 * 255
    assert (exact, pairs) == (-48705, -80708)
    assert qemu_q.conv_integer(*inputs, **attrs).tolist() == [[[[exact]]]]
    assert qemu_q.conv_integer(*inputs, accumulator="x86-u8s8-pairs", **attrs).tolist() == [[[[pairs]]]]
    assert reference("ConvInteger", inputs, attrs, 10, onnx.TensorProto.INT32).tolist() == [[[[exact]]]]
    assert_onnxruntime_model(runtime("ConvInteger", inputs, attrs, 10, onnx.TensorProto.INT32),
                             [[[[pairs]]]], [[[[exact]]]])


@pytest.mark.parametrize("attrs", [{"pads": [1, 0, 2, 1]}, {"group": 3, "strides": [2, 1], "dilations": [1, 2]},
                                   {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, {"group": 6}])
def test_conv_integer_s8u8_pairs_model_onnxruntime(attrs):
    """onnxruntime's ConvInteger with an int8 x and a uint8 w is the pairs accumulator on AVX2
    CPUs without VNNI and the exact int32 one with VNNI; either way one of the two models."""
    group = attrs.get("group", 1)
    x = RNG.integers(-128, 128, size=(2, 6, 5, 7)).astype(np.int8)
    x[:, :, 1::2] = 127
    w = RNG.integers(150, 256, size=(2 * group, 6 // group, 3, 2)).astype(np.uint8)
    inputs = [x, w, np.int8(-128), np.uint8(60)]
    theirs = runtime("ConvInteger", inputs, attrs, 10, onnx.TensorProto.INT32)
    pairs = qemu_q.conv_integer(*inputs, accumulator="x86-u8s8-pairs", **attrs)
    exact_acc = qemu_q.conv_integer(*inputs, **attrs)
    assert not np.array_equal(exact_acc, pairs)  # the saturation is visible on these inputs
    assert_onnxruntime_model(theirs, pairs, exact_acc)


@divergence_entry("QLinearMatMul / QLinearConv requantization: float32 and float64 roundings")
@pytest.mark.parametrize("op", ["QLinearMatMul", "QLinearConv"])
def test_requantization_float32_float64_ties(op):
    # 1x1 products acc = a, scales sa, 1, 1. Case 1: acc * sa = 2.5 exactly, y_zero_point 1:
    # the spec rounds first (RNE(2.5) + 1 = 3), onnx.reference adds the zero point first
    # (RNE(3.5) = 4). Case 2: sa = fl32(0.1) = 13421773 * 2**-27, acc = 25: the exact value
    # 25 * sa = 2.5 + 5 * 2**-27 lies above the tie (3, as float64 sees it too); onnxruntime's
    # fl32(25 * sa) is 2.5 (float32 spacing 2**-22 there), a tie that rounds to even (2).
    cases = [(5, np.float32(0.5), 1, 3, 4, 3), (25, np.float32(0.1), 0, 3, 3, 2), (25, np.float32(0.1), 1, 4, 4, 3)]
    for acc, sa, zp, want_exact, want_reference, want_runtime in cases:
        exact = Fraction(acc) * Fraction(float(sa))
        assert fo.round_half_even(exact) + zp == want_exact
        if op == "QLinearMatMul":
            inputs = [np.array([[acc]], np.uint8), sa, np.uint8(0), np.array([[1]], np.uint8), np.float32(1.0),
                      np.uint8(0), np.float32(1.0), np.uint8(zp)]
            ours = {rule: qemu_q.qlinear_matmul(*inputs, requantization=rule) for rule in ("exact", "float32", "float64")}
            opset = 21
        else:
            inputs = [np.array([[[[acc]]]], np.uint8), sa, np.uint8(0), np.array([[[[1]]]], np.uint8),
                      np.float32(1.0), np.uint8(0), np.float32(1.0), np.uint8(zp)]
            ours = {rule: qemu_q.qlinear_conv(*inputs, requantization=rule) for rule in ("exact", "float32", "float64")}
            opset = 10
        assert int(ours["exact"].ravel()[0]) == want_exact
        assert int(ours["float64"].ravel()[0]) == want_reference
        assert int(ours["float32"].ravel()[0]) == want_runtime
        assert int(reference(op, inputs, {}, opset, onnx.TensorProto.UINT8).ravel()[0]) == want_reference
        assert int(runtime(op, inputs, {}, opset, onnx.TensorProto.UINT8).ravel()[0]) == want_runtime


@divergence_entry("QLinearMatMul-21 float8 operands: onnx.reference truncates them to integers")
def test_qlinear_matmul_float8_operands_reference():
    import ml_dtypes

    values = [Fraction(3, 2), Fraction(-11, 4), Fraction(3, 8)]  # exact in e4m3fn
    a = np.array([[float(v) for v in values]], np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = np.array([[2], [4], [8]], np.int8)
    one, half = np.float32(1.0), np.float32(0.5)
    zero8 = np.zeros((), np.uint8).view(ml_dtypes.float8_e4m3fn)
    inputs = [a, one, zero8, b, one, np.int8(0), half, np.int8(0)]
    # the exact rule: sum_k a_k b_k = 3 - 11 + 3 = -5, over y_scale 0.5: -10
    exact = sum(v * int(w) for v, w in zip(values, b[:, 0])) / Fraction(1, 2)
    ours = qemu_q.qlinear_matmul(*inputs, opset=21)
    assert ours.dtype == np.int8 and ours.tolist() == [[int(exact)]] == [[-10]]
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node("QLinearMatMul", names, ["y"])
    types = [onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT8E4M3FN,
             onnx.TensorProto.INT8, onnx.TensorProto.FLOAT, onnx.TensorProto.INT8,
             onnx.TensorProto.FLOAT, onnx.TensorProto.INT8]
    graph = helper.make_graph(
        [node], "float8",
        [helper.make_tensor_value_info(n, t, np.shape(x)) for n, t, x in zip(names, types, inputs)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT8, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    feeds = {n: np.asarray(x) for n, x in zip(names, inputs)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ReferenceEvaluator(model).run(None, feeds)[0]
    # a.astype(int32) truncates 1.5, -2.75, 0.375 to 1, -2, 0: (2 - 8) / 0.5 = -12
    assert np.asarray(got).tolist() == [[-12]]
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
