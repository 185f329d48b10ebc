"""Differential tests: qemu_q against onnx.reference and onnxruntime, bit for bit.

Inputs are restricted to the region where the ONNX text is unambiguous and the peer follows
it (docs/divergences.md has the cases outside it):

* finite x, positive normal scales, quotients that do not overflow the division precision;
* QuantizeLinear: x and the scale of one type (onnx.reference divides in numpy's promoted
  type), and `precision` only where converting x to it is exact (onnx.reference converts x
  first);
* DequantizeLinear: onnx.reference multiplies in float32 and then casts, so outputs narrower
  than float32 are compared only where the float32 product is exact, and int32 codes only
  where float32 holds them;
* onnxruntime (for the versions onnx.reference lacks, 10 and 13): float32 x, int8/uint8
  codes, int32 codes below 2**24.

Structure (opset, types, shapes, axis, granularity, block size) is drawn by hypothesis; the
values come from a numpy generator seeded by a drawn integer. Values include exact ties
(k + 0.5) * scale: scales with a small odd significand make the product exact.
"""

import warnings

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from support import assert_same_bits

onnx = pytest.importorskip("onnx", reason="the peer implementations need onnx (test extra)")
hypothesis = pytest.importorskip("hypothesis", reason="property tests need hypothesis (test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow], print_blob=True)

INT_RANGES = {
    "int8": (np.int8, -128, 127, 10), "uint8": (np.uint8, 0, 255, 10),
    "int16": (np.int16, -32768, 32767, 21), "uint16": (np.uint16, 0, 65535, 21),
    "int4": (ml_dtypes.int4, -8, 7, 21), "uint4": (ml_dtypes.uint4, 0, 15, 21),
    "int2": (ml_dtypes.int2, -2, 1, 25), "uint2": (ml_dtypes.uint2, 0, 3, 25),
}
FLOATS = {  # name: (dtype, ONNX data type, significand bits, smallest normal exponent, max exponent)
    "float": (np.dtype(np.float32), TensorProto.FLOAT, 24, -126, 127),
    "float16": (np.dtype(np.float16), TensorProto.FLOAT16, 11, -14, 15),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), TensorProto.BFLOAT16, 8, -126, 127),
}


def elem_type(array):
    return helper.np_dtype_to_tensor_dtype(array.dtype)


def one_node_model(op_type, opset, inputs, attributes, output_type=TensorProto.UNDEFINED, ir_version=None):
    """A model of one node; `inputs` is [(name, array or None)] in node order."""
    node_inputs = [name if value is not None else "" for name, value in inputs]
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    graph_inputs = [helper.make_tensor_value_info(name, elem_type(value), value.shape)
                    for name, value in inputs if value is not None]
    node = helper.make_node(op_type, node_inputs, ["y"], **attributes)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info("y", output_type, None)])
    kwargs = {} if ir_version is None else {"ir_version": ir_version}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kwargs)


def run_reference(model, feeds):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)[0]


# --- shared strategies -----------------------------------------------------------------------------

@st.composite
def layouts(draw, opset):
    """(shape, axis, block_size, param_shape, kind)"""
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1))
    kinds = ["tensor", "tensor1", "axis"] + (["block"] if opset >= 21 else [])
    kind = draw(st.sampled_from(kinds))
    d = shape[axis]
    if kind == "tensor":
        return shape, axis, 0, (), kind
    if kind == "tensor1":
        return shape, axis, 0, (1,), kind
    if kind == "axis":
        return shape, axis, 0, (d,), kind
    block_size = draw(st.integers(1, d))
    pshape = list(shape)
    pshape[axis] = -(-d // block_size)  # ceil: the last block may be partial
    return shape, axis, block_size, tuple(pshape), kind


def expand(param, shape, axis, block_size):
    param = np.asarray(param)
    if block_size == 0 and param.size == 1:
        return np.broadcast_to(param.reshape(()), shape)
    axis %= len(shape)
    if block_size == 0:
        view = [1] * len(shape)
        view[axis] = -1
        return np.broadcast_to(param.reshape(view), shape)
    return np.take(np.repeat(param, block_size, axis=axis), np.arange(shape[axis]), axis=axis)


def make_scales(rng, pshape, fmt, small_significand, exp_range):
    """Positive normal scales of `fmt`: a significand of `small_significand` bits (odd), or
    a full random one when it is None."""
    n = int(np.prod(pshape, dtype=np.int64))
    sig_bits = FLOATS[fmt][2]
    if small_significand is None:
        mant = rng.integers(2 ** (sig_bits - 1), 2**sig_bits, n).astype(np.float64) / 2 ** (sig_bits - 1)
    else:
        b = min(small_significand, sig_bits)
        mant = (rng.integers(2 ** (b - 1), 2**b, n) | 1).astype(np.float64) / 2 ** (b - 1)
    exps = rng.integers(exp_range[0], exp_range[1] + 1, n).astype(np.float64)
    values = mant * np.exp2(exps)
    scale = values.astype(FLOATS[fmt][0]).reshape(pshape)
    assert np.array_equal(scale.astype(np.float64).reshape(-1), values), "scales must be exact"
    return scale


# --- QuantizeLinear vs onnx.reference ------------------------------------------------------------------

@st.composite
def quantize_cases(draw):
    opset = draw(st.integers(13, 28))
    outs = [name for name, (_, _, _, since) in INT_RANGES.items() if since <= opset]
    out_name = draw(st.sampled_from(outs))
    x_fmt = "float" if opset < 19 else draw(st.sampled_from(list(FLOATS)))
    shape, axis, block_size, pshape, kind = draw(layouts(opset))
    with_zp = draw(st.booleans()) if (opset >= 21 or out_name == "uint8") else True
    precisions = [0]
    if opset >= 23:
        # only precisions that hold x exactly (onnx.reference converts x to it first)
        precisions += [1] + ({"float16": [10], "bfloat16": [16], "float": []}[x_fmt])
    precision = draw(st.sampled_from(precisions))
    small = draw(st.sampled_from([None, 1, 2, 3, 4]))
    seed = draw(st.integers(0, 2**32 - 1))
    return opset, out_name, x_fmt, shape, axis, block_size, pshape, kind, with_zp, precision, small, seed


def build_quantize_inputs(out_name, x_fmt, shape, axis, block_size, pshape, with_zp, precision, small, seed):
    rng = np.random.default_rng(seed)
    dtype, lo, hi, _ = INT_RANGES[out_name]
    division = {0: x_fmt, 1: "float", 10: "float16", 16: "bfloat16"}[precision]
    # Keep |quotient| and |x| finite in every format involved.
    exp_range = {"float": (-30, 20), "bfloat16": (-30, 20), "float16": (-12, -1)}[x_fmt]
    scale = make_scales(rng, pshape, x_fmt, small, exp_range)
    zero_point = rng.integers(lo, hi + 1, pshape).astype(dtype) if with_zp else None
    zp = 0 if zero_point is None else expand(zero_point.astype(np.int64), shape, axis, block_size)
    codes = rng.integers(lo - 2, hi + 3, shape)
    frac = rng.choice([0.0, 0.5, -0.5, 0.25, -0.75], shape)
    frac = np.where(rng.random(shape) < 0.25, rng.uniform(-1, 1, shape), frac)
    q = (codes - zp) + frac
    if "float16" in (x_fmt, division):
        q = np.clip(q, -65000, 65000)
    x = (q * expand(scale.astype(np.float64), shape, axis, block_size)).astype(FLOATS[x_fmt][0])
    assert np.all(np.isfinite(x.astype(np.float64)))
    return x, scale, zero_point


@settings(max_examples=700, **SETTINGS)
@given(quantize_cases())
def test_quantize_vs_onnx_reference(case):
    opset, out_name, x_fmt, shape, axis, block_size, pshape, kind, with_zp, precision, small, seed = case
    x, scale, zero_point = build_quantize_inputs(out_name, x_fmt, shape, axis, block_size, pshape,
                                                 with_zp, precision, small, seed)
    attrs = {"axis": axis}
    if block_size:
        attrs["block_size"] = block_size
    if precision:
        attrs["precision"] = precision
    output_dtype = None
    if zero_point is None and opset >= 21:
        output_dtype = helper.np_dtype_to_tensor_dtype(np.dtype(INT_RANGES[out_name][0]))
        attrs["output_dtype"] = output_dtype
    model = one_node_model("QuantizeLinear", opset, [("x", x), ("s", scale), ("z", zero_point)], attrs)
    feeds = {"x": x, "s": scale} | ({} if zero_point is None else {"z": zero_point})
    expected = run_reference(model, feeds)
    got = qemu_q.quantize_linear(x, scale, zero_point, axis=axis, block_size=block_size,
                                 precision=precision, output_dtype=output_dtype, opset=opset)
    assert_same_bits(got, expected, f"{case}")
    # run_op with the model's attributes gives the same bits
    got2 = qemu_q.run_op("QuantizeLinear", [x, scale, zero_point], attrs, opset)[0]
    assert_same_bits(got2, expected, "run_op")


# --- DequantizeLinear vs onnx.reference ----------------------------------------------------------------

@st.composite
def dequantize_cases(draw):
    opset = draw(st.integers(19, 28))
    codes = [name for name, (_, _, _, since) in INT_RANGES.items() if since <= opset] + ["int32"]
    code_name = draw(st.sampled_from(codes))
    scale_fmt = draw(st.sampled_from(list(FLOATS)))
    out_fmt = draw(st.sampled_from([None] + list(FLOATS))) if opset >= 23 else None
    shape, axis, block_size, pshape, kind = draw(layouts(opset))
    zp_kind = draw(st.sampled_from(["none", "random"] if code_name != "int32" else ["none", "zero"]))
    small = draw(st.sampled_from([None, 1, 3, 6, 8]))
    seed = draw(st.integers(0, 2**32 - 1))
    return opset, code_name, scale_fmt, out_fmt, shape, axis, block_size, pshape, kind, zp_kind, small, seed


@settings(max_examples=700, **SETTINGS)
@given(dequantize_cases())
def test_dequantize_vs_onnx_reference(case):
    opset, code_name, scale_fmt, out_fmt, shape, axis, block_size, pshape, kind, zp_kind, small, seed = case
    rng = np.random.default_rng(seed)
    result_fmt = out_fmt or scale_fmt
    if code_name == "int32":
        dtype, lo, hi = np.int32, -(2**31), 2**31 - 1
    else:
        dtype, lo, hi, _ = INT_RANGES[code_name]
    # Code magnitudes and scale significands sized so that onnx.reference's float32
    # x - zp and float32 product are exact when the output is narrower than float32
    # (it rounds again when casting); for a float32 output one float32 rounding is right.
    if result_fmt == "float":
        code_bits = 24
        scale_sig = small
    else:
        scale_sig = min(small or FLOATS[scale_fmt][2], FLOATS[scale_fmt][2], 12)
        code_bits = 24 - scale_sig
    if code_name == "int32":
        bound = 2 ** min(code_bits, 24)
        x = rng.integers(-bound, bound + 1, shape).astype(np.int32)
        zero_point = np.zeros(pshape, np.int32) if zp_kind == "zero" else None
    else:
        x = rng.integers(lo, hi + 1, shape).astype(dtype)
        zero_point = rng.integers(lo, hi + 1, pshape).astype(dtype) if zp_kind == "random" else None
        if result_fmt != "float" and hi - lo >= 2**code_bits:
            # 16-bit codes: keep |x - zp| below 2**code_bits
            zp64 = 0 if zero_point is None else expand(zero_point.astype(np.int64), shape, axis, block_size)
            half = 2 ** (code_bits - 1)
            d = rng.integers(-half, half, shape)
            x = np.clip(zp64 + d, lo, hi).astype(dtype)
    exp_range = {"float": (-40, 40), "bfloat16": (-40, 40), "float16": (-14, -2)}[scale_fmt]
    if result_fmt == "float16":
        exp_range = (max(exp_range[0], -24), min(exp_range[1], -2))
    scale = make_scales(rng, pshape, scale_fmt, scale_sig, exp_range)

    # The premise: float32 products exact whenever the output is narrower.
    d = x.astype(np.int64) - (0 if zero_point is None else expand(zero_point.astype(np.int64), shape, axis, block_size))
    exact = d.astype(np.float64) * expand(scale.astype(np.float64), shape, axis, block_size)
    if result_fmt != "float":
        assert np.array_equal(exact.astype(np.float32).astype(np.float64), exact), "premise: exact float32 product"
    assert np.all(np.abs(d) <= 2**24)

    attrs = {"axis": axis}
    if block_size:
        attrs["block_size"] = block_size
    if out_fmt is not None:
        attrs["output_dtype"] = FLOATS[out_fmt][1]
    model = one_node_model("DequantizeLinear", opset, [("x", x), ("s", scale), ("z", zero_point)], attrs)
    feeds = {"x": x, "s": scale} | ({} if zero_point is None else {"z": zero_point})
    expected = run_reference(model, feeds)
    assert expected.dtype == FLOATS[result_fmt][0]
    got = qemu_q.dequantize_linear(x, scale, zero_point, axis=axis, block_size=block_size,
                                   output_dtype=out_fmt, opset=opset)
    assert_same_bits(got, expected, f"{case}")
    got2 = qemu_q.run_op("DequantizeLinear", [x, scale, zero_point], attrs, opset)[0]
    assert_same_bits(got2, expected, "run_op")


# --- DynamicQuantizeLinear vs onnx.reference ----------------------------------------------------------------

@settings(max_examples=100, **SETTINGS)
@given(st.integers(0, 5), st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(0, 2**32 - 1))
def test_dynamic_quantize_vs_onnx_reference(kind, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal([0.0, 3.0, -3.0, 0.0, 0.0, 100.0][kind], [1.0, 1.0, 1.0, 1e-3, 1e4, 1.0][kind], shape)
    x = x.astype(np.float32)
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in ("y", "s", "z")],
        ),
        opset_imports=[helper.make_opsetid("", 11)],
    )
    with np.errstate(all="ignore"):
        y_ref, s_ref, z_ref = ReferenceEvaluator(model).run(None, {"x": x})
    y, s, z = qemu_q.dynamic_quantize_linear(x)
    assert_same_bits(np.asarray(s), np.asarray(s_ref, np.float32), "scale")
    assert_same_bits(np.asarray(z), np.asarray(z_ref, np.uint8), "zero point")
    assert_same_bits(y, y_ref, "y")


# --- versions 10 and 13 vs onnxruntime ------------------------------------------------------------------------

def ort_run(model, feeds):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the peer for versions 10 and 13")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@st.composite
def ort_cases(draw):
    opset = draw(st.sampled_from([10, 13]))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1))
    per_axis = opset == 13 and draw(st.booleans())
    pshape = (shape[axis],) if per_axis else draw(st.sampled_from([(), (1,)]))
    with_zp = draw(st.booleans())
    small = draw(st.sampled_from([None, 1, 3, 8]))
    seed = draw(st.integers(0, 2**32 - 1))
    return opset, shape, axis, per_axis, pshape, with_zp, small, seed


@settings(max_examples=500, **SETTINGS)
@given(ort_cases(), st.sampled_from(["int8", "uint8", "int32"]))
def test_dequantize_10_13_vs_onnxruntime(case, code_name):
    opset, shape, axis, per_axis, pshape, with_zp, small, seed = case
    rng = np.random.default_rng(seed)
    if code_name == "int32":
        x = rng.integers(-(2**24), 2**24 + 1, shape).astype(np.int32)
        zero_point = np.zeros(pshape, np.int32) if with_zp else None
    else:
        dtype, lo, hi, _ = INT_RANGES[code_name]
        x = rng.integers(lo, hi + 1, shape).astype(dtype)
        zero_point = rng.integers(lo, hi + 1, pshape).astype(dtype) if with_zp else None
    scale = make_scales(rng, pshape, "float", small, (-40, 40))
    attrs = {"axis": axis} if per_axis or (opset == 13 and axis != 1) else {}
    model = one_node_model("DequantizeLinear", opset, [("x", x), ("s", scale), ("z", zero_point)], attrs,
                           TensorProto.FLOAT, ir_version=7)
    feeds = {"x": x, "s": scale} | ({} if zero_point is None else {"z": zero_point})
    expected = ort_run(model, feeds)
    got = qemu_q.dequantize_linear(x, scale, zero_point, axis=axis, opset=opset)
    assert_same_bits(got, expected, f"{case} {code_name}")


@settings(max_examples=500, **SETTINGS)
@given(ort_cases(), st.sampled_from(["int8", "uint8"]), st.booleans())
def test_quantize_10_13_vs_onnxruntime(case, out_name, specials):
    opset, shape, axis, per_axis, pshape, with_zp, small, seed = case
    rng = np.random.default_rng(seed)
    dtype, lo, hi, _ = INT_RANGES[out_name]
    if not with_zp and out_name == "int8":
        with_zp = True  # without a zero point the output is uint8
    scale = make_scales(rng, pshape, "float", small, (-30, 20))
    zero_point = rng.integers(lo, hi + 1, pshape).astype(dtype) if with_zp else None
    zp = 0 if zero_point is None else expand(zero_point.astype(np.int64), shape, axis if per_axis else 0, 0)
    q = rng.integers(lo - 3, hi + 4, shape) - zp + rng.choice([0.0, 0.5, -0.5, 0.3], shape)
    x = (q * expand(scale.astype(np.float64), shape, axis if per_axis else 0, 0)).astype(np.float32)
    if specials:
        # NaN -> minimum and +-inf -> +-saturation: onnxruntime and qemu_q agree here
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30], 3)
    attrs = {"axis": axis} if per_axis or (opset == 13 and axis != 1) else {}
    out_type = TensorProto.UINT8 if zero_point is None else elem_type(zero_point)
    model = one_node_model("QuantizeLinear", opset, [("x", x), ("s", scale), ("z", zero_point)], attrs,
                           out_type, ir_version=7)
    feeds = {"x": x, "s": scale} | ({} if zero_point is None else {"z": zero_point})
    expected = ort_run(model, feeds)
    got = qemu_q.quantize_linear(x, scale, zero_point, axis=axis, opset=opset)
    assert_same_bits(got, expected, f"{case} {out_name}")


# --- a few fixed checks that the peers and the hypothesis strategies are what they seem ----------------------

def test_reference_ties_are_exact_and_agree():
    # (k + 0.5) * scale with a small odd scale significand is exact; both implementations
    # round these ties to even.
    scale = np.array(0.375, np.float32)  # 3 * 2**-3
    k = np.arange(-130, 130)
    x = ((k + 0.5) * 0.375).astype(np.float32)
    assert np.array_equal(x.astype(np.float64) / 0.375, k + 0.5)
    zero_point = np.array(0, np.int8)
    model = one_node_model("QuantizeLinear", 21, [("x", x), ("s", scale), ("z", zero_point)], {})
    expected = run_reference(model, {"x": x, "s": scale, "z": zero_point})
    got = qemu_q.quantize_linear(x, scale, zero_point, opset=21)
    assert_same_bits(got, expected, "ties")
    assert got.astype(np.int64).tolist() == np.clip(np.rint(k + 0.5), -128, 127).astype(np.int64).tolist()


def test_blocked_partial_last_block_vs_reference():
    x = np.arange(-21, 21, dtype=np.float32).reshape(2, 21) * np.float32(0.75)
    scale = np.array([[0.5, 1.5, 0.25], [2.0, 0.125, 1.0]], np.float32)  # blocks 8, 8, 5
    zero_point = np.array([[1, -2, 3], [0, 7, -8]], ml_dtypes.int4)
    attrs = {"axis": 1, "block_size": 8}
    model = one_node_model("QuantizeLinear", 21, [("x", x), ("s", scale), ("z", zero_point)], attrs)
    expected = run_reference(model, {"x": x, "s": scale, "z": zero_point})
    got = qemu_q.quantize_linear(x, scale, zero_point, axis=1, block_size=8, opset=21)
    assert_same_bits(got, expected, "blocked int4")
    model = one_node_model("DequantizeLinear", 21, [("x", got), ("s", scale), ("z", zero_point)], attrs)
    expected = run_reference(model, {"x": got, "s": scale, "z": zero_point})
    assert_same_bits(qemu_q.dequantize_linear(got, scale, zero_point, axis=1, block_size=8, opset=21),
                     expected, "blocked int4 DQ")


def test_layout_strategy_block_sizes_are_valid():
    # Every block size the strategy makes lies in [ceil(D/S), ceil(D/(S-1)) - 1].
    for d in range(1, 6):
        for block_size in range(1, d + 1):
            s = -(-d // block_size)
            assert -(-d // s) <= block_size
            assert s == 1 or block_size <= -(-d // (s - 1)) - 1
