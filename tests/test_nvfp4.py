"""NVFP4 quantization (three recipes) and dequantization (the two-DequantizeLinear graph),
bit for bit against tests/nvfp4_oracle.py, onnx.reference and hand-derived values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import qemu_q
from qemu_q.ops.nvfp4 import RECIPES

import nvfp4_oracle as oracle
from support import assert_same_bits, bits, divergence_entry

F4 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn


def _check(x, recipe, axis=-1, block_shape=(1, 16), global_amax=None, n_threads=None):
    codes, scales, g = qemu_q.nvfp4_quantize(x, recipe=recipe, axis=axis, block_shape=block_shape,
                                             global_amax=global_amax, n_threads=n_threads)
    e_codes, e_scales, e_g = oracle.quantize(np.asarray(x, dtype=np.float32), recipe, axis, block_shape, global_amax)
    assert codes.dtype == F4 and scales.dtype == E4M3 and g.dtype == np.float32 and g.shape == ()
    assert_same_bits(g.reshape(1).view(np.uint32), np.array([e_g], dtype=np.float32).view(np.uint32),
                     f"{recipe} global scale")
    assert_same_bits(scales.view(np.uint8), e_scales, f"{recipe} block scales")
    assert_same_bits(codes.view(np.uint8), e_codes, f"{recipe} codes")
    return codes, scales, g


# ---------------------------------------------------------------- value patterns

def _pattern(draw, shape):
    n = int(np.prod(shape))
    kind = draw(st.sampled_from(["normal", "outlier", "zero_blocks", "subnormal", "special",
                                 "bfloat16", "ties", "tiny"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "outlier":
        x[rng.integers(n)] = np.float32(rng.choice([1e4, -3e5, 7e30, 2.0**-100]))
    elif kind == "zero_blocks":
        mask = rng.random(n) < 0.6
        x[mask] = np.float32(0.0)
        x[rng.random(n) < 0.1] = np.float32(-0.0)
    elif kind == "subnormal":
        x = (x * np.float32(2.0**-140)).astype(np.float32)
        x[rng.random(n) < 0.2] *= np.float32(2.0**100)
    elif kind == "special":
        picks = rng.random(n)
        x[picks < 0.1] = np.nan
        x[(picks >= 0.1) & (picks < 0.15)] = np.inf
        x[(picks >= 0.15) & (picks < 0.2)] = -np.inf
    elif kind == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    elif kind == "ties":
        # multiples of a quarter: many land on the e2m1 midpoints once scaled by powers of two
        x = (rng.integers(-24, 25, n) / np.float32(4.0)).astype(np.float32)
    elif kind == "tiny":
        x = (x * np.float32(1e-30)).astype(np.float32)
    return x.reshape(shape)


@st.composite
def cases(draw):
    block_shape = draw(st.sampled_from([(1, 16), (1, 16), (16, 16)]))
    if block_shape == (16, 16):
        shape = (draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    else:
        shape = tuple(draw(st.lists(st.integers(1, 37), min_size=1, max_size=3)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    x = _pattern(draw, shape)
    amax = None
    if draw(st.integers(0, 4)) == 0:
        amax = np.float32(draw(st.sampled_from([0.0, 1.0, 3.5, 1e-20, 1e30, float("inf"), float("nan")])))
    return x, axis, block_shape, amax


@pytest.mark.parametrize("recipe", RECIPES)
@given(case=cases())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_quantize_matches_oracle(recipe, case):
    x, axis, block_shape, amax = case
    _check(x, recipe, axis, block_shape, amax)


def _step(v: np.float32, k: int) -> np.float32:
    for _ in range(abs(k)):
        v = np.nextafter(v, np.float32(np.inf if k > 0 else 0.0), dtype=np.float32)
    return v


def _neighbourhoods(recipe, global_amax, rng):
    """Blocks whose scale lands within 3 float32 ulps of every float8e4m3fn midpoint, with
    elements within 2 ulps of the float4e2m1 midpoints once scaled: where the operation
    order and each rounding decide the bits (a reordered product or a divide for a
    reciprocal multiply fails here)."""
    g = float(oracle.global_parameters(recipe, np.float32(global_amax))["decode"])
    rows = []
    for m in oracle._E4M3_MIDS[:-1]:
        for k in range(-3, 4):
            amax = _step(np.float32(float(m) * 6.0 * g), k)
            row = [amax]
            for e in rng.choice(oracle._E2M1_MIDS[:-1], 15):
                v = _step(np.float32(float(e) * float(amax) / 6.0), int(rng.integers(-2, 3)))
                row.append(v if rng.random() < 0.5 else -v)
            rows.append(row)
    x = np.array(rows, dtype=np.float32)
    return x[np.isfinite(x).all(axis=1)]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("global_amax", [2688.0, 1.0, 3.0e-3, 12345.678, 5.0e-30])
def test_rounding_neighbourhoods(recipe, global_amax):
    rng = np.random.default_rng(int(global_amax * 1000) % 2**32)
    x = _neighbourhoods(recipe, global_amax, rng)
    assert x.shape[0] > 100
    _check(x, recipe, global_amax=np.float32(global_amax))
    _check(x.T.copy(), recipe, axis=0, global_amax=np.float32(global_amax))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_inputs_are_their_float32_values(recipe, dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 48)).astype(dtype)
    got = qemu_q.nvfp4_quantize(x, recipe=recipe)
    want = qemu_q.nvfp4_quantize(x.astype(np.float32), recipe=recipe)
    for a, b in zip(got, want):
        assert_same_bits(a, b, recipe)
    _check(x.astype(np.float32), recipe)


# ------------------------------------------------------- hand-derived values per recipe

def test_transformer_engine_zero_tensor_uses_encode_scale_one():
    # CUDA: global_amax == 0 -> S_enc = 1, so S_dec = 1; block amax 0 -> e4m3 0, the
    # inverse 1/0 = inf -> FLT_MAX, codes +-0 by the input's sign.
    x = np.array([0.0, -0.0] * 8, dtype=np.float32)
    codes, scales, g = qemu_q.nvfp4_quantize(x)
    assert bits(g) == 0x3F800000
    assert scales.view(np.uint8).tolist() == [0]
    assert codes.view(np.uint8).tolist() == [0x0, 0x8] * 8


def test_transformer_engine_single_value():
    # amax 6: S_enc = 2688/6 = 448; S_dec = 1/448; the block scale 6 * (448 * RN(1/6))
    # rounds to 448 (0x7E); the inverse 1/(448 * RN(1/448)) is 1 or 1 - ulp, 6 * it -> 6.
    x = np.zeros(16, dtype=np.float32)
    x[3] = 6.0
    x[4] = -3.0
    x[5] = 0.25  # a tie between 0 and 0.5: even 0
    x[6] = 0.75  # between 0.5 and 1: even 1.0
    codes, scales, g = _check(x, "transformer_engine")
    assert scales.view(np.uint8).tolist() == [0x7E]
    assert codes.view(np.uint8)[3:7].tolist() == [0x7, 0xD, 0x0, 0x2]


def test_torchao_clamps_block_scales_to_two_to_the_minus_six():
    # One outlier sets the tensor amax; the other block's scaled scale is far below 2**-6
    # and torch.clamp(min=E4M3_EPS) lifts it to 0x08, where TransformerEngine keeps the
    # rounded small scale (here 0: the block's values quantize to 0).
    x = np.full(32, 1e-3, dtype=np.float32)
    x[0] = 1e6
    _, ao_scales, _ = _check(x, "torchao")
    _, te_scales, _ = _check(x, "transformer_engine")
    assert ao_scales.view(np.uint8).tolist()[1] == 0x08
    assert te_scales.view(np.uint8).tolist()[1] == 0x00


def test_modelopt_negative_zero_is_positive_code_and_zero_scale_is_one():
    # sign_bit = (weight < 0): -0.0 gives code 0; an all-zero block: per_block_scale 0 -> 1.0
    x = np.zeros(32, dtype=np.float32)
    x[16:] = -0.0
    x[0] = 1.0
    codes, scales, _ = _check(x, "modelopt")
    assert scales.view(np.uint8).tolist()[1] == 0x38  # 1.0
    assert codes.view(np.uint8)[16:].tolist() == [0] * 16


def test_nan_codes_per_recipe():
    x = np.ones(16, dtype=np.float32)
    x[2] = np.nan
    te = qemu_q.nvfp4_quantize(x, recipe="transformer_engine")
    assert te[0].view(np.uint8)[2] == 0x7 and te[1].view(np.uint8)[0] == 0x7E
    ao = qemu_q.nvfp4_quantize(x, recipe="torchao")  # the tensor amax is NaN: all NaN
    assert ao[1].view(np.uint8)[0] == 0x7F and set(ao[0].view(np.uint8).tolist()) == {0x4}
    mo = qemu_q.nvfp4_quantize(x, recipe="modelopt")
    assert mo[1].view(np.uint8)[0] == 0x7F and set(mo[0].view(np.uint8).tolist()) == {0x7}
    for recipe, result in (("transformer_engine", te), ("torchao", ao), ("modelopt", mo)):
        _check(x, recipe)


def test_two_dimensional_tiles_share_one_scale():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((33, 40)).astype(np.float32)
    x[17, 20] = 50.0
    for recipe in RECIPES:
        codes, scales, _ = _check(x, recipe, block_shape=(16, 16))
        s = scales.view(np.uint8)
        assert (s[16:32, 1] == s[16, 1]).all() and s[16, 1] != s[0, 1]
        _check(x, recipe, axis=0, block_shape=(16, 16))


# ------------------------------------------------------------ dequantization

def _onnx_graph(codes, scales, g, axis, output_dtype):
    import onnx
    from onnx import TensorProto, helper

    tp = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
          np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}[np.dtype(output_dtype)]
    nodes = [
        helper.make_node("DequantizeLinear", ["scales", "global"], ["block"]),
        helper.make_node("DequantizeLinear", ["codes", "block"], ["y"], axis=axis, block_size=16,
                         output_dtype=tp),
    ]
    graph = helper.make_graph(
        nodes, "nvfp4",
        [helper.make_tensor_value_info("codes", TensorProto.FLOAT4E2M1, codes.shape),
         helper.make_tensor_value_info("scales", TensorProto.FLOAT8E4M3FN, scales.shape),
         helper.make_tensor_value_info("global", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", tp, codes.shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape,axis,block_shape", [((3, 40), -1, (1, 16)), ((40, 5), 0, (1, 16)),
                                                    ((2, 3, 18), 1, (1, 16)), ((20, 33), 1, (16, 16))])
@pytest.mark.parametrize("output_dtype", [np.float32, np.float16])
def test_dequantize_is_the_onnx_graph(recipe, shape, axis, block_shape, output_dtype):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    codes, scales, g = qemu_q.nvfp4_quantize(x, recipe=recipe, axis=axis, block_shape=block_shape)
    y = qemu_q.nvfp4_dequantize(codes, scales, g, axis=axis, block_shape=block_shape, output_dtype=output_dtype)
    model = _onnx_graph(codes, scales, g, axis, output_dtype)
    (want,) = ReferenceEvaluator(model).run(None, {"codes": codes, "scales": scales, "global": g})
    assert_same_bits(y, want.astype(output_dtype), f"{recipe} dequantize vs onnx.reference")
    if output_dtype is np.float32:
        assert_same_bits(y, oracle.dequantize_exact(codes.view(np.uint8), scales.view(np.uint8), g, axis),
                         f"{recipe} dequantize vs exact")


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 5), cols=st.integers(1, 50),
       g=st.sampled_from([1.0, 2.0**-10, 3.7e-3, -0.5, float("inf"), 1e30, 0.0, float("nan")]))
@settings(max_examples=60, deadline=None)
def test_dequantize_any_bytes_is_the_onnx_graph(seed, rows, cols, g):
    # every code and every scale byte (NaN 0x7F/0xFF, negative scales, subnormals) and odd
    # global scales: the two DequantizeLinear calls give onnx.reference's bits
    from onnx.reference import ReferenceEvaluator

    from qemu_q.ops.nvfp4 import dequantize_model

    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (rows, cols)).astype(np.uint8).view(F4)
    scales = rng.integers(0, 256, (rows, -(-cols // 16))).astype(np.uint8).view(E4M3)
    g = np.array(g, np.float32)
    y = qemu_q.nvfp4_dequantize(codes, scales, g)
    with np.errstate(all="ignore"):
        (want,) = ReferenceEvaluator(dequantize_model(codes.shape)).run(
            None, {"codes": codes, "block_scales": scales, "global_scale": g})
    assert_same_bits(y, want, "nvfp4_dequantize vs onnx.reference")


def test_dequantize_model_runs_in_onnx_reference():
    from onnx.reference import ReferenceEvaluator

    from qemu_q.ops.nvfp4 import dequantize_model

    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    for recipe in RECIPES:
        codes, scales, g = qemu_q.nvfp4_quantize(x, recipe=recipe)
        for output_dtype in (np.float32, ml_dtypes.bfloat16):
            model = dequantize_model(codes.shape, output_dtype=output_dtype)
            (want,) = ReferenceEvaluator(model).run(None, {"codes": codes, "block_scales": scales, "global_scale": g})
            got = qemu_q.nvfp4_dequantize(codes, scales, g, output_dtype=output_dtype)
            assert_same_bits(got, want.astype(output_dtype), recipe)
    with pytest.raises(ValueError, match="output_dtype=int8"):
        dequantize_model((2, 16), output_dtype=np.int8)


# ------------------------------------------------------------ threads, levels, outputs

@pytest.mark.parametrize("recipe", RECIPES)
def test_threads_do_not_change_bits(recipe):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 1000)).astype(np.float32)
    x[5, 5] = 1e5
    with_nan = x.copy()
    with_nan[::7, ::13] = np.nan  # torchao and ModelOpt: a NaN tensor amax, all NaN codes
    for data in (x, with_nan):
        one = qemu_q.nvfp4_quantize(data, recipe=recipe, n_threads=1)
        for n in (2, 3, 8):
            many = qemu_q.nvfp4_quantize(data, recipe=recipe, n_threads=n)
            for a, b in zip(one, many):
                assert_same_bits(a, b, f"{recipe} n_threads={n}")
    for kwargs in (dict(block_shape=(16, 16)), dict(block_shape=(16, 16), axis=0), dict(axis=0)):
        runs = [qemu_q.nvfp4_quantize(x, recipe=recipe, n_threads=n, **kwargs) for n in (1, 4)]
        for a, b in zip(*runs):
            assert_same_bits(a, b, f"{recipe} {kwargs}")
    y = x.reshape(30, 100, 100)
    runs = [qemu_q.nvfp4_quantize(y, recipe=recipe, axis=1, n_threads=n) for n in (1, 3)]
    for a, b in zip(*runs):
        assert_same_bits(a, b, f"{recipe} 3-D axis=1")


def test_every_kernel_level_gives_the_same_bits():
    from qemu_q import _kernels

    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    results = {}
    previous = _kernels.active.level
    try:
        for level in _kernels.available_levels():
            _kernels.use(level)
            results[level] = [qemu_q.nvfp4_quantize(x, recipe=r) for r in RECIPES]
    finally:
        _kernels.use(previous)
    first = next(iter(results.values()))
    for level, got in results.items():
        for a, b in zip(first, got):
            for u, v in zip(a, b):
                assert_same_bits(u, v, level)


def test_packed_and_out():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 21)).astype(np.float32)
    codes, scales, g = qemu_q.nvfp4_quantize(x)
    packed, _, _ = qemu_q.nvfp4_quantize(x, packed=True)
    assert_same_bits(packed, qemu_q.pack(codes))
    out = (np.empty((3, 21), F4), np.empty((3, 2), E4M3))
    got = qemu_q.nvfp4_quantize(x, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert_same_bits(out[0], codes)
    assert_same_bits(out[1], scales)
    packed_out = (np.empty(32, np.uint8), np.empty((3, 2), E4M3))
    got = qemu_q.nvfp4_quantize(x, out=packed_out, packed=True)
    assert got[0] is packed_out[0] and got[1] is packed_out[1]
    assert_same_bits(packed_out[0], packed)
    assert_same_bits(packed_out[1], scales)
    with pytest.raises(ValueError, match=r"out\[0\] \(codes\) has shape \(31,\)"):
        qemu_q.nvfp4_quantize(x, out=(np.empty(31, np.uint8), packed_out[1]), packed=True)
    empty = qemu_q.nvfp4_quantize(np.zeros((0, 16), np.float32), recipe="torchao")
    assert empty[0].shape == (0, 16) and empty[1].shape == (0, 1)


def test_input_is_not_modified_and_read_only_input_works():
    x = np.linspace(-9, 9, 64, dtype=np.float32)
    x.flags.writeable = False
    before = x.copy()
    qemu_q.nvfp4_quantize(x, recipe="modelopt")
    assert_same_bits(x, before)


def test_global_scale_function_matches_quantize():
    for recipe in RECIPES:
        for amax in (0.0, 1.0, 2688.0, 1e-30, 3e38, float("inf")):
            x = np.zeros(16, np.float32)
            want = oracle.global_parameters(recipe, np.float32(amax))["decode"]
            got = qemu_q.nvfp4_global_scale(np.float32(amax), recipe=recipe)
            assert bits(got) == np.array(want, np.float32).view(np.uint32)
            assert bits(qemu_q.nvfp4_quantize(x, recipe=recipe, global_amax=np.float32(amax))[2]) == bits(got)


# ------------------------------------------------------------ bad arguments

@pytest.mark.parametrize("kwargs,error,words", [
    (dict(recipe="te"), ValueError, ["recipe='te'", "transformer_engine"]),
    (dict(recipe=3), TypeError, ["recipe must be a str"]),
    (dict(axis=2), ValueError, ["axis=2", "[-2, 1]"]),
    (dict(axis=1.0), TypeError, ["axis must be an int"]),
    (dict(block_shape=(1, 32)), ValueError, ["block_shape=(1, 32)", "(16, 16)"]),
    (dict(block_shape="x"), TypeError, ["block_shape"]),
    (dict(global_amax=-1.0), ValueError, ["global_amax=-1.0", "negative"]),
    (dict(global_amax=np.float32(-0.0)), ValueError, ["global_amax=-0.0", "+0.0 not -0.0"]),
    (dict(global_amax=-0.0, recipe="torchao"), ValueError, ["global_amax=-0.0"]),
    (dict(global_amax=0.1), ValueError, ["global_amax=0.1", "float32"]),
    (dict(global_amax="1"), TypeError, ["global_amax"]),
    (dict(out=np.empty(3)), TypeError, ["out must be None or a tuple"]),
    (dict(out=(np.empty((2, 16), np.uint8), np.empty((2, 1), E4M3))), TypeError, ["out[0] (codes)", "float4_e2m1fn"]),
    (dict(out=(np.empty((2, 16), F4), np.empty((2, 2), E4M3))), ValueError, ["out[1] (block_scales)", "(2, 1)"]),
    (dict(packed=1), TypeError, ["packed must be True or False"]),
    (dict(n_threads=0), ValueError, ["n_threads"]),
])
def test_bad_arguments(kwargs, error, words):
    x = np.ones((2, 16), np.float32)
    with pytest.raises(error) as info:
        qemu_q.nvfp4_quantize(x, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_inputs():
    with pytest.raises(TypeError, match="x has dtype float64"):
        qemu_q.nvfp4_quantize(np.ones(16))
    with pytest.raises(TypeError, match="must be a numpy array"):
        qemu_q.nvfp4_quantize([1.0] * 16)
    with pytest.raises(ValueError, match="scalar"):
        qemu_q.nvfp4_quantize(np.float32(1.0))
    with pytest.raises(ValueError, match="2-D tensor"):
        qemu_q.nvfp4_quantize(np.ones((2, 2, 16), np.float32), block_shape=(16, 16))
    codes, scales, g = qemu_q.nvfp4_quantize(np.ones((2, 32), np.float32))
    with pytest.raises(TypeError, match="codes has dtype uint8"):
        qemu_q.nvfp4_dequantize(codes.view(np.uint8), scales, g)
    with pytest.raises(TypeError, match="block_scales has dtype"):
        qemu_q.nvfp4_dequantize(codes, scales.astype(np.float32), g)
    with pytest.raises(ValueError, match=r"block_scales has shape \(2, 1\)"):
        qemu_q.nvfp4_dequantize(codes, scales[:, :1], g)
    with pytest.raises(TypeError, match="global_scale has dtype float64"):
        qemu_q.nvfp4_dequantize(codes, scales, np.float64(1.0))
    with pytest.raises(TypeError, match="global_scale must be"):
        qemu_q.nvfp4_dequantize(codes, scales, 1.0)
    with pytest.raises(ValueError, match="global_scale has shape"):
        qemu_q.nvfp4_dequantize(codes, scales, np.ones(2, np.float32))


# ------------------------------------------------- docs/divergences.md: recipes compared

def _diff(a, b) -> int:
    return int((np.asarray(a).view(np.uint8) != np.asarray(b).view(np.uint8)).sum())


def _all_recipes_checked(x):
    """Each recipe by qemu_q, asserted equal to the oracle's transcription of its source."""
    results = {}
    for recipe in RECIPES:
        results[recipe] = _check(x, recipe)
    return results


@divergence_entry("NVFP4 recipes: one outlier dominates the tensor amax (torchao's 2^-6 clamp)")
def test_recipes_outlier():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    x[0, 0] = 1e6
    r = _all_recipes_checked(x)
    te, ao, mo = r["transformer_engine"], r["torchao"], r["modelopt"]
    assert {bits(v[2]).item() for v in r.values()} == {0x43BA030C}
    assert (_diff(te[1], ao[1]), _diff(te[0], ao[0])) == (4095, 62118)
    assert (_diff(te[1], mo[1]), _diff(te[0], mo[0])) == (0, 0)
    # torchao lifts every small block's scale to 2**-6 (0x08); TransformerEngine and ModelOpt
    # round it to the e4m3 subnormals 0 or 2**-9 (0x00 / 0x01).
    assert set(ao[1].view(np.uint8).ravel()[1:].tolist()) == {0x08}
    assert set(te[1].view(np.uint8).ravel()[1:].tolist()) == {0x00, 0x01}


@divergence_entry("NVFP4 recipes: bfloat16-rounded N(0,1), TransformerEngine vs ModelOpt vs torchao")
def test_recipes_bfloat16_normal():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 1024)).astype(ml_dtypes.bfloat16).astype(np.float32)
    r = _all_recipes_checked(x)
    te, ao, mo = r["transformer_engine"], r["torchao"], r["modelopt"]
    # 1 / (2688 / A) and A / 2688 differ by one ulp for this amax
    assert bits(te[2]).item() == 988158049 and bits(mo[2]).item() == bits(ao[2]).item() == 988158050
    assert (_diff(te[1], mo[1]), _diff(te[0], mo[0])) == (0, 507)
    assert (_diff(te[1], ao[1]), _diff(te[0], ao[0])) == (0, 0)
    assert (_diff(ao[1], mo[1]), _diff(ao[0], mo[0])) == (0, 507)


def _te_python_reference(x: np.ndarray):
    """transformer_engine/pytorch/custom_recipes/reference_nvfp4.py, _quantize_blockwise_reference
    (1x16, no 4over6), transcribed for one row of whole blocks; global_amax = torch.amax."""
    f = np.float32
    with np.errstate(all="ignore"):
        global_amax = f(np.nan) if np.isnan(x).any() else f(np.abs(x).max())
        encode = f(448.0) * f(6.0) / global_amax  # torch.div(GLOBAL_SCALE_E4M3_MAX * FLOAT4_E2M1_MAX, amax)
        encode = encode if np.isnan(encode) else min(encode, f(np.finfo(f).max))  # torch.min
        if encode == f(0.0):
            encode = f(1.0)
        decode_global = f(1.0) / encode
        codes, scales = [], []
        for block in x.reshape(-1, 16):
            vec_max = f(np.nan) if np.isnan(block).any() else f(np.abs(block).max())
            s = vec_max * (encode * (f(1.0) / f(6.0)))
            s = s if np.isnan(s) else min(s, f(np.finfo(f).max))
            s = s if np.isnan(s) else min(max(s, f(-448.0)), f(448.0))
            code = int(oracle.e4m3_rne(s, saturate=False))
            e = f(1.0) / (oracle.e4m3_value(code) * decode_global)
            e = e if np.isnan(e) else min(e, f(np.finfo(f).max))
            scaled = np.clip(block * e, f(-6.0), f(6.0))
            # cast_to_fp4x2's ranges: -0.0 lands in [0, 0.25] (code 0); NaN in none (0)
            c = np.zeros(16, dtype=np.int64)
            table = [((scaled >= 0.0) & (scaled <= 0.25), 0), ((scaled > 0.25) & (scaled < 0.75), 1),
                     ((scaled >= 0.75) & (scaled <= 1.25), 2), ((scaled > 1.25) & (scaled < 1.75), 3),
                     ((scaled >= 1.75) & (scaled <= 2.5), 4), ((scaled > 2.5) & (scaled < 3.5), 5),
                     ((scaled >= 3.5) & (scaled <= 5.0), 6), (scaled > 5.0, 7),
                     ((scaled >= -0.25) & (scaled < -0.0), 8), ((scaled < -0.25) & (scaled > -0.75), 9),
                     ((scaled <= -0.75) & (scaled >= -1.25), 10), ((scaled < -1.25) & (scaled > -1.75), 11),
                     ((scaled <= -1.75) & (scaled >= -2.5), 12), ((scaled < -2.5) & (scaled > -3.5), 13),
                     ((scaled <= -3.5) & (scaled >= -5.0), 14), (scaled < -5.0, 15)]
            for mask, value in table:
                c[mask] = value
            codes.append(c)
            scales.append(code)
    return np.concatenate(codes).astype(np.uint8), np.array(scales, dtype=np.uint8), decode_global


@divergence_entry("NVFP4 transformer_engine: the Python reference vs the CUDA kernels")
def test_transformer_engine_python_reference():
    # (a) a zero tensor: CUDA S_enc = 1, the reference keeps FLT_MAX (S_dec 2**-128)
    zero = np.zeros(16, dtype=np.float32)
    _, _, g = _check(zero, "transformer_engine")
    _, _, ref_g = _te_python_reference(zero)
    assert bits(g).item() == 0x3F800000 and np.float32(ref_g).view(np.uint32) == 0x00200000
    # (b) -0.0: cvt keeps the sign (0x8), cast_to_fp4x2 gives 0
    x = np.array([-0.0, 1.0] + [0.5] * 14, dtype=np.float32)
    codes, _, _ = _check(x, "transformer_engine")
    ref_codes, _, _ = _te_python_reference(x)
    assert codes.view(np.uint8)[0] == 0x8 and ref_codes[0] == 0x0
    assert (codes.view(np.uint8)[1:] == ref_codes[1:]).all()
    # (c) a NaN element: CUDA ignores it in the amax (scale 0x7E, codes kept, NaN -> 0x7);
    # the reference's block scale is NaN and every code of the block 0
    x = np.array([np.nan, 6.0, -3.0] + [1.0] * 13, dtype=np.float32)
    codes, scales, _ = _check(x, "transformer_engine", global_amax=np.float32(6.0))
    assert scales.view(np.uint8).tolist() == [0x7E]
    assert codes.view(np.uint8)[:3].tolist() == [0x7, 0x7, 0xD]
    ref_block = np.array([np.nan, 6.0, -3.0] + [1.0] * 13, dtype=np.float32)
    with np.errstate(all="ignore"):
        vec_max = np.float32(np.nan)  # torch.amax of a block holding NaN
        s = vec_max * (np.float32(448.0) * (np.float32(1.0) / np.float32(6.0)))
    assert np.isnan(s) and int(oracle.e4m3_rne(s, saturate=False)) == 0x7F
    assert _te_python_reference(np.concatenate([ref_block, np.full(16, 6.0, np.float32)]))[0][:16].tolist() == [0] * 16


@divergence_entry("NVFP4 dequantize: TransformerEngine's dequantize kernel vs the ONNX graph")
def test_transformer_engine_dequantize_kernel():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((64, 64)) * 3).astype(np.float32)
    codes, scales, g = _check(x, "transformer_engine")
    y = qemu_q.nvfp4_dequantize(codes, scales, g)
    assert_same_bits(y, oracle.dequantize_exact(codes.view(np.uint8), scales.view(np.uint8), g))
    # dequantize_nvfp4.cuh: final_scale = static_cast<float>(scale) * amax * factor_inv,
    # factor_inv = 1.0f / (6.0f * 448.0f); out = code * final_scale
    f = np.float32
    amax = f(np.abs(x).max())
    factor_inv = f(1.0) / (f(6.0) * f(448.0))
    block = scales.astype(np.float32)
    final = (block * amax) * factor_inv
    y_te = codes.astype(np.float32) * np.repeat(final, 16, axis=1)
    graph_block = block * g
    assert int((final.view(np.uint32) != graph_block.view(np.uint32)).sum()) == 32
    assert int((y_te.view(np.uint32) != y.view(np.uint32)).sum()) == 468


@divergence_entry("NVFP4 torchao: a NaN quotient's code depends on the NaN's bits (GPU vs CPU)")
def test_torchao_nan_code_by_device():
    x = np.array([np.nan] + [1.0] * 15, dtype=np.float32)
    codes, scales, _ = _check(x, "torchao")
    assert set(codes.view(np.uint8).tolist()) == {0x4} and scales.view(np.uint8).tolist() == [0x7F]

    def f32_to_f4(bits_: int) -> int:
        # _f32_to_floatx_unpacked(ebits=2, mbits=1), the normal branch a NaN takes
        sign = bits_ & 0x80000000
        a = bits_ ^ sign
        odd = (a >> 22) & 1
        return ((((a + ((1 - 127) << 23) + (2**21 - 1)) + odd) >> 22) & 0xFF) | (sign >> 28)

    assert f32_to_f4(0x7FFFFFFF) == 0x4  # the GPU's canonical NaN: what qemu_q writes
    assert f32_to_f4(0xFFC00000) == 0xB  # x86's default NaN (torch on a CPU): -1.5
    assert f32_to_f4(0x7FC00000) == 0x3  # a quiet NaN input passed through on a CPU
