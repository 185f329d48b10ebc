"""qemu_q.mx_quantize / mx_dequantize against the exact oracle of tests/mx_oracle.py (the OCP
MX v1.0 section 6.3 text and docs/semantics.md "MX", in Fractions), on inputs that stress
every scale rule, then the ONNX round trip, packing, threads and bad arguments."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import mx_oracle as mo
import qemu_q
from support import assert_same_bits, bits, divergence_entry

hypothesis = pytest.importorskip("hypothesis", reason="property tests need hypothesis (test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow], print_blob=True)
ELEMENTS = list(mo.ELEMENTS)
RULES = list(mo.RULES)
DTYPES = {"float8e4m3fn": ml_dtypes.float8_e4m3fn, "float8e5m2": ml_dtypes.float8_e5m2,
          "float6e2m3": ml_dtypes.float6_e2m3fn, "float6e3m2": ml_dtypes.float6_e3m2fn,
          "float4e2m1": ml_dtypes.float4_e2m1fn, "int8": np.int8}
BITS = {"float8e4m3fn": 8, "float8e5m2": 8, "float6e2m3": 6, "float6e3m2": 6, "float4e2m1": 4, "int8": 8}


def f32(bits_list) -> np.ndarray:
    return np.array(bits_list, dtype=np.uint32).view(np.float32)


def f32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def check(x, element, rule, axis=-1, block_size=32, **kwargs):
    codes, scales = qemu_q.mx_quantize(x, element, axis=axis, block_size=block_size, scale_rule=rule, **kwargs)
    want_codes, want_scales = mo.mx_quantize(x, element, axis, block_size, rule)
    assert codes.dtype == DTYPES[element] and scales.dtype == ml_dtypes.float8_e8m0fnu
    assert_same_bits(scales.view(np.uint8), want_scales, f"{element} {rule} scales")
    assert_same_bits(bits(codes).astype(np.uint8), want_codes, f"{element} {rule} codes")
    return codes, scales


# --- inputs that stress the rules ----------------------------------------------------------------

def boundary_amaxes(element: str) -> np.ndarray:
    """float32 magnitudes one and two ulps around every place a rule changes its answer:
    powers of two (floor, ceil), the element max times a power of two (rceil, rceil_f32),
    the rounding point 2**k * (2 - 2**-(bits + 1)) of "even"; over the whole float32 range,
    subnormals included."""
    _, _, largest, fraction_bits = mo.ELEMENTS[element]
    centres = []
    for k in list(range(-149, 128, 7)) + [-149, -148, -127, -126, -125, -120, 0, 1, 120, 126, 127]:
        centres.append(Fraction(2) ** k)
        centres.append(largest * Fraction(2) ** (k - mo.floor_log2(largest)))
        centres.append(Fraction(2) ** k * (2 - Fraction(1, 2 ** (fraction_bits + 1))))
    out = set()
    for c in centres:
        if c >= Fraction(2) ** 128:
            continue
        v = float(c)  # exact for these: at most 24 significant bits
        if v >= 2.0 ** 128 or v < 2.0 ** -149:
            continue
        b = f32_bits(v)
        if float(np.array(b, dtype=np.uint32).view(np.float32)) != c:
            continue
        for d in (-2, -1, 0, 1, 2):
            if 0 < b + d < 0x7F800000:
                out.add(b + d)
    return f32(sorted(out))


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("rule", RULES)
def test_rules_at_every_boundary(element, rule):
    # Each block: the amax (either sign), an element tie of the grid below it, a small
    # value and a zero; every boundary amax gives one block.
    amax = boundary_amaxes(element)
    n = amax.size
    x = np.zeros((n, 4), dtype=np.float32)
    x[:, 0] = np.where(np.arange(n) % 2, -amax, amax)
    x[:, 1] = amax * np.float32(0.3)
    x[:, 2] = amax * np.float32(-0.0625)
    x[:, 3] = np.where(np.arange(n) % 3 == 0, np.float32(-0.0), np.float32(0.0))
    check(x, element, rule, block_size=4)


def test_floor_is_the_ocp_shared_exponent_one_ulp_below_powers_of_two():
    # The flaw of a float32 log2: just below 2**k the shared exponent is still k - 1 - emax.
    for k in (-100, -10, -1, 0, 1, 7, 100):
        below = f32([f32_bits(2.0 ** k) - 1, f32_bits(2.0 ** k) - 2])
        for v in below:
            codes, scales = qemu_q.mx_quantize(np.array([v], dtype=np.float32), "float8e4m3fn", block_size=1)
            assert int(scales.view(np.uint8)[0]) == max(0, k - 1 - 8 + 127)


@pytest.mark.parametrize("element", ELEMENTS)
def test_element_ties_round_to_even_and_clamp(element):
    # X = 1 (amax in [2**emax, 2**(emax+1))): every midpoint of the element grid and its
    # float32 neighbours, plus values above max (clamped) in each block.
    fmt, emax, largest, _ = mo.ELEMENTS[element]
    if fmt is None:
        grid = [Fraction(n, 64) for n in range(0, 128)]
    else:
        grid = sorted({v for v in (mo.fo.decode(fmt, c) for c in range(1 << mo.fo.FORMATS[fmt].n_bits))
                       if isinstance(v, Fraction) and v >= 0})
    mids = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
    values = []
    for m in mids + [largest + Fraction(1, 8)]:
        b = f32_bits(float(m))
        values += [b - 1, b, b + 1]
    vals = f32(values)
    top = np.float32(2.0 ** emax)  # fixes the block's exponent at 0 under "floor"
    x = np.concatenate([np.stack([np.full(vals.size, top), vals, -vals, vals * np.float32(1.5)], axis=1)])
    x = np.minimum(np.abs(x), np.float32(float(largest) * 1.9)) * np.sign(x)
    check(x.astype(np.float32), element, "floor", block_size=4)


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("rule", RULES)
def test_special_blocks(element, rule):
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    tiny = f32([1, 2, 0x00400000, 0x007FFFFF, 0x00800000, 0x00800001])
    blocks = [
        [0.0, -0.0, 0.0, -0.0],                       # all zero: X = 2**-127, codes +-0
        [tiny[0], -tiny[1], tiny[2], 0.0],            # float32 subnormals
        [tiny[3], tiny[4], -tiny[5], tiny[0]],
        [1.0, nan, 2.0, -3.0],                        # NaN anywhere: X = NaN
        [1.0, -inf, 2.0, 0.0],                        # inf: X = NaN
        [inf, 1.0, 1.0, 1.0],
        [f32([0x7F7FFFFF])[0], 1.0, -1.0, 0.0],       # FLT_MAX: the exponent clamps at 127
        [f32([0x7F000001])[0], -2.0 ** 126, 0.0, 1.0],
        [2.0 ** -120, 2.0 ** -127, 2.0 ** -140, 0.0],  # exponents below -127 clamp up
    ]
    x = np.array(blocks, dtype=np.float32)
    codes, scales = check(x, element, rule, block_size=4)
    s = scales.view(np.uint8)
    assert s[0, 0] == 0 and s[3, 0] == 0xFF and s[4, 0] == 0xFF and s[5, 0] == 0xFF
    assert (bits(codes[3]) == mo.NAN_BLOCK_CODE[element]).all()


@pytest.mark.parametrize("element", ELEMENTS)
def test_partial_last_block_and_axes(element):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 37, 5)) * np.exp2(rng.integers(-30, 30, (3, 1, 5)))).astype(np.float32)
    # the negative axes with one block size: they name the same axes as 2 and 1
    layouts = [(axis, block_size) for axis in (0, 1, 2) for block_size in (1, 4, 32, 37, 64)]
    for axis, block_size in layouts + [(-1, 4), (-2, 37)]:
        for rule in ("floor", "rceil"):
            codes, scales = check(x, element, rule, axis=axis, block_size=block_size)
            d = x.shape[axis]
            expected_shape = list(x.shape)
            expected_shape[axis] = -(-d // block_size)
            assert scales.shape == tuple(expected_shape)


@pytest.mark.parametrize("element", ELEMENTS)
def test_rceil_f32_differs_from_rceil_at_the_bottom_of_the_range(element):
    # amax one ulp above max * 2**-127: the exact quotient is just above 2**-127,
    # so rceil gives 2**-126; NVIDIA's float32 product amax * float32(1 / max) lands in the
    # subnormals, whose ulp (2**-149) is too coarse to stay above 2**-127, so it rounds up
    # to 2**-127 only.
    largest = mo.ELEMENTS[element][2]
    base = f32_bits(float(largest * Fraction(2) ** -127))
    assert float(f32([base])[0]) == largest * Fraction(2) ** -127
    x = f32([base + 1]).reshape(1, 1)
    exact = check(x, element, "rceil", block_size=1)[1].view(np.uint8).ravel().tolist()
    nvidia = check(x, element, "rceil_f32", block_size=1)[1].view(np.uint8).ravel().tolist()
    assert exact == [1] and nvidia == [0]


def test_mxint8_minus_128_is_never_written_and_decodes_to_minus_2x():
    x = np.array([[1.0, -1.9921875, -1.99609375, -1.999]], dtype=np.float32)  # -127.5/64, -127.75/64, ...
    for rule in RULES:
        codes, scales = check(x, "int8", rule, block_size=4)
        assert codes.min() >= -127
    codes = np.array([[-128, 127, 0, 1]], dtype=np.int8)
    scales = np.array([[2.0 ** 3]], dtype=ml_dtypes.float8_e8m0fnu)
    y = qemu_q.mx_dequantize(codes, scales, block_size=4)
    assert y.tolist() == [[-16.0, 127 / 8, 0.0, 1 / 8]]


@pytest.mark.parametrize("element", ELEMENTS)
def test_float16_and_bfloat16_inputs_are_their_float32_values(element):
    rng = np.random.default_rng(3)
    x32 = (rng.standard_normal((4, 64)) * 3).astype(np.float32)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = x32.astype(dtype)
        codes, scales = qemu_q.mx_quantize(x, element, scale_rule="even")
        want_codes, want_scales = mo.mx_quantize(x.astype(np.float32), element, -1, 32, "even")
        assert_same_bits(scales.view(np.uint8), want_scales)
        assert_same_bits(bits(codes).astype(np.uint8), want_codes)


# --- hypothesis over shapes, axes, block positions and value patterns ----------------------------

@st.composite
def mx_cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1))
    block_size = draw(st.integers(1, 12))
    element = draw(st.sampled_from(ELEMENTS))
    rule = draw(st.sampled_from(RULES))
    n = math.prod(shape)
    pattern = draw(st.sampled_from(["normal", "binades", "boundary", "outlier", "specials"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if pattern == "normal":
        x = rng.standard_normal(n).astype(np.float32)
    elif pattern == "binades":
        x = (rng.standard_normal(n) * np.exp2(rng.integers(-140, 126, n).astype(np.float64))).astype(np.float32)
    elif pattern == "boundary":
        pool = boundary_amaxes(element)
        x = rng.choice(pool, n) * rng.choice(np.array([-1, 1], dtype=np.float32), n)
    elif pattern == "outlier":
        x = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        x[rng.integers(0, n)] = np.float32(rng.choice([1e4, -3e30, 7.0]))
    else:
        x = rng.choice(np.array([0.0, -0.0, 1.0, -2.5, np.nan, np.inf, -np.inf, 1e-42, 6.0],
                                dtype=np.float32), n)
    return x.astype(np.float32).reshape(shape), element, rule, axis, block_size


@settings(max_examples=400, **SETTINGS)
@given(mx_cases())
def test_hypothesis_against_the_oracle(case):
    x, element, rule, axis, block_size = case
    x_before = x.copy()
    codes, scales = check(x, element, rule, axis=axis, block_size=block_size)
    assert x.tobytes() == x_before.tobytes()
    # packed: the raw_data of the same codes
    packed, packed_scales = qemu_q.mx_quantize(x, element, axis=axis, block_size=block_size,
                                               scale_rule=rule, packed=True)
    assert_same_bits(packed, qemu_q.pack(codes))
    assert_same_bits(packed_scales, scales)
    # mx_dequantize: the exact products rounded once
    y = qemu_q.mx_dequantize(codes, scales, axis=axis, block_size=block_size)
    assert_same_bits(y.view(np.uint32), mo.dequantize_bits(bits(codes).astype(np.uint8),
                                                           scales.view(np.uint8), element, axis, block_size))
    y_packed = qemu_q.mx_dequantize(packed, scales, axis=axis, block_size=block_size, packed=True,
                                    element=element, shape=x.shape)
    assert_same_bits(y_packed, y)


# --- the ONNX round trip ---------------------------------------------------------------------------

def reference_dequantize(codes, scales, element, axis, block_size, output_dtype="float"):
    pytest.importorskip("onnx", reason="the peer runs need onnx (test extra)")
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = qemu_q.mx_dequantize_graph(element, axis=axis, block_size=block_size, output_dtype=output_dtype)
    inputs = [helper.make_tensor_value_info(name, qemu_q.element_type(t).onnx_id, None)
              for name, t in graph["inputs"]]
    nodes = [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in graph["nodes"]]
    inits = [numpy_helper.from_array(v, name) for name, v in graph["initializers"].items()]
    out_name, out_type = graph["output"]
    out_id = qemu_q.element_type(out_type).onnx_id
    model = helper.make_model(
        helper.make_graph(nodes, "mx", inputs, [helper.make_tensor_value_info(out_name, out_id, None)], inits),
        opset_imports=[helper.make_opsetid("", graph["opset"])])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, {"codes": codes, "scales": scales})[0]


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("output_dtype", ["float", "float16", "bfloat16"])
def test_round_trip_through_onnx_reference(element, output_dtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 70)) * np.exp2(rng.integers(-20, 20, (6, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 5] = 2.0 ** -130
    for axis in (-1, 0):
        for rule in ("floor", "rceil"):
            codes, scales = qemu_q.mx_quantize(x, element, axis=axis, block_size=32, scale_rule=rule)
            ours = qemu_q.mx_dequantize(codes, scales, axis=axis, block_size=32, output_dtype=output_dtype)
            theirs = reference_dequantize(codes, scales, element, axis, 32, output_dtype)
            assert_same_bits(theirs, ours, f"{element} axis={axis} {rule} -> {output_dtype}")


def test_dequantize_is_dequantize_linear():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    codes, scales = qemu_q.mx_quantize(x, "float8e4m3fn")
    direct = qemu_q.dequantize_linear(codes, scales, axis=-1, block_size=32, output_dtype=1, opset=24)
    assert_same_bits(qemu_q.mx_dequantize(codes, scales), direct)


# --- threads ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("element", ["float8e4m3fn", "float4e2m1", "float6e3m2", "int8"])
def test_thread_count_independence(element):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((300, 520)) * np.exp2(rng.integers(-8, 8, (300, 1)))).astype(np.float32)
    x[7, 3] = np.nan
    for axis in (-1, 0):
        for packed in (False, True):
            results = [qemu_q.mx_quantize(x, element, axis=axis, packed=packed, scale_rule="even", n_threads=n)
                       for n in (1, 2, 3, 8)]
            for codes, scales in results[1:]:
                assert_same_bits(codes, results[0][0])
                assert_same_bits(scales, results[0][1])
    codes, scales = results[0]
    assert_same_bits(codes, qemu_q.pack(qemu_q.mx_quantize(x, element, axis=0, scale_rule="even")[0]))


def test_packed_fallback_when_blocks_do_not_start_on_whole_bytes():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 33)).astype(np.float32)  # axis_len * inner = 33: not a multiple of 4
    for element in ("float4e2m1", "float6e2m3"):
        codes, scales = qemu_q.mx_quantize(x, element, block_size=3)
        packed, packed_scales = qemu_q.mx_quantize(x, element, block_size=3, packed=True)
        assert_same_bits(packed, qemu_q.pack(codes))
        assert_same_bits(packed_scales, scales)


def test_out_arguments():
    x = np.linspace(-4, 4, 128, dtype=np.float32).reshape(2, 64)
    codes = np.empty((2, 64), dtype=ml_dtypes.float8_e4m3fn)
    scales = np.empty((2, 2), dtype=ml_dtypes.float8_e8m0fnu)
    got = qemu_q.mx_quantize(x, "float8e4m3fn", out=(codes, scales))
    assert got[0] is codes and got[1] is scales
    want = qemu_q.mx_quantize(x, "float8e4m3fn")
    assert_same_bits(codes, want[0])
    assert_same_bits(scales, want[1])


def test_empty_and_one_block_longer_than_the_axis():
    codes, scales = qemu_q.mx_quantize(np.zeros((3, 0), np.float32), "float8e4m3fn")
    assert codes.shape == (3, 0) and scales.shape == (3, 0)
    x = np.array([[1.0, 3.0, -7.0]], dtype=np.float32)
    check(x, "float4e2m1", "floor", block_size=32)


# --- bad arguments -------------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, text", [
    (lambda x: qemu_q.mx_quantize(x, "uint8"), ValueError, "not an MX element"),
    (lambda x: qemu_q.mx_quantize(x, "float8e4m3fnuz"), ValueError, "allowed: float8e4m3fn"),
    (lambda x: qemu_q.mx_quantize(x, "nonsense"), ValueError, "MX elements"),
    (lambda x: qemu_q.mx_quantize(x, "int8", scale_rule="round"), ValueError, "scale_rule='round'"),
    (lambda x: qemu_q.mx_quantize(x, "int8", scale_rule=1), TypeError, "scale_rule must be a str"),
    (lambda x: qemu_q.mx_quantize(x, "int8", axis=2), ValueError, "axis=2 is out of range"),
    (lambda x: qemu_q.mx_quantize(x, "int8", axis=1.0), TypeError, "axis must be an int"),
    (lambda x: qemu_q.mx_quantize(x, "int8", block_size=0), ValueError, "block_size=0"),
    (lambda x: qemu_q.mx_quantize(x, "int8", block_size=True), TypeError, "block_size must be an int"),
    (lambda x: qemu_q.mx_quantize(x.astype(np.float64), "int8"), TypeError, "float64"),
    (lambda x: qemu_q.mx_quantize(x.astype(np.int32), "int8"), TypeError, "int32"),
    (lambda x: qemu_q.mx_quantize(x.tolist(), "int8"), TypeError, "x must be a numpy array"),
    (lambda x: qemu_q.mx_quantize(np.float32(1.0), "int8"), ValueError, "rank 0"),
    (lambda x: qemu_q.mx_quantize(x, "int8", packed=1), TypeError, "packed must be True or False"),
    (lambda x: qemu_q.mx_quantize(x, "int8", n_threads=0), ValueError, "n_threads=0"),
    (lambda x: qemu_q.mx_quantize(x, "int8", out=np.empty(3)), TypeError, "out must be a tuple"),
    (lambda x: qemu_q.mx_quantize(x, "int8", out=(np.empty((2, 40), np.int8), np.empty((2, 1), np.uint8))),
     ValueError, "float8_e8m0fnu"),
    (lambda x: qemu_q.mx_quantize(x, "int8", out=(x, np.empty((2, 2), ml_dtypes.float8_e8m0fnu))),
     ValueError, "the codes must have dtype int8"),
    (lambda x: qemu_q.mx_dequantize(np.zeros((2, 40), np.int8), np.zeros((2, 2), np.uint8)), TypeError,
     "scales has dtype uint8"),
    (lambda x: qemu_q.mx_dequantize(np.zeros((2, 40), np.int16), np.zeros((2, 2), ml_dtypes.float8_e8m0fnu)),
     TypeError, "codes has dtype int16"),
    (lambda x: qemu_q.mx_dequantize(b"\0" * 40, np.zeros((2, 2), ml_dtypes.float8_e8m0fnu), packed=True),
     TypeError, "needs element= and shape="),
    (lambda x: qemu_q.mx_dequantize(np.zeros((2, 40), np.int8), np.zeros((2, 2), ml_dtypes.float8_e8m0fnu),
                                    output_dtype="int8"), ValueError, "output_dtype='int8'"),
    (lambda x: qemu_q.mx_dequantize(np.zeros((2, 40), np.int8), np.zeros((2, 3), ml_dtypes.float8_e8m0fnu)),
     ValueError, "block_size=32 does not fit"),
])
def test_bad_arguments(call, error, text):
    x = np.ones((2, 40), dtype=np.float32)
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        call(x)
    assert (x == 1).all()


def test_out_overlapping_an_input_or_the_other_output_is_refused():
    x = np.ones((2, 64), np.float32)
    x_bytes = x.view(np.uint8).reshape(-1)
    codes = np.empty((2, 64), np.int8)
    scales = np.empty((2, 2), ml_dtypes.float8_e8m0fnu)
    words = np.zeros((2, 64), np.uint32)
    stochastic = qemu_q.Datapath(rounding="stochastic")
    cases = [
        ((x_bytes[:128].view(np.int8).reshape(2, 64), scales), {}, "out: the codes overlap x"),
        ((codes, x_bytes[:4].view(ml_dtypes.float8_e8m0fnu).reshape(2, 2)), {}, "out: the scales overlap x"),
        ((codes, codes.view(np.uint8).reshape(-1)[:4].view(ml_dtypes.float8_e8m0fnu).reshape(2, 2)), {},
         "out: the scales overlap codes"),
        ((words.view(np.int8).reshape(-1)[:128].reshape(2, 64), scales),
         dict(datapath=stochastic, random_bits=words), "out: the codes overlap random_bits"),
    ]
    for out, extra, text in cases:
        before = x.copy(), words.copy()
        with pytest.raises(ValueError, match=text):
            qemu_q.mx_quantize(x, "int8", out=out, **extra)
        assert (x == before[0]).all() and (words == before[1]).all()


def test_x_dtype_message_names_float64_only_for_float64():
    with pytest.raises(TypeError, match=r"x has dtype int32; mx_quantize takes float32, float16 or bfloat16$"):
        qemu_q.mx_quantize(np.ones(8, np.int32), "float8e4m3fn")
    with pytest.raises(TypeError, match=r"x has dtype float64; .*float64 would be rounded before the scale"):
        qemu_q.mx_quantize(np.ones(8), "float8e4m3fn")


@pytest.mark.parametrize("fraction, codes", [
    # amax = fraction * 2**-127, a float32 subnormal; MXINT8's max_elem is 127/64. The
    # scale codes under floor, ceil, even, rceil: 0 is 2**-127, 1 is 2**-126
    (Fraction(5, 4), (0, 1, 0, 0)),
    (Fraction(127, 64), (0, 1, 0, 0)),                         # amax = max_elem * 2**-127
    (Fraction(127, 64) + Fraction(1, 2**22), (0, 1, 0, 1)),    # one subnormal ulp above
    (Fraction(255, 128) - Fraction(1, 2**22), (0, 1, 0, 1)),   # 6 fraction bits round down
    (Fraction(255, 128), (0, 1, 1, 1)),                        # the tie carries (odd last bit)
    (Fraction(2) - Fraction(1, 2**22), (0, 1, 1, 1)),
])
def test_mxint8_scale_of_a_subnormal_amax(fraction, codes):
    mantissa = fraction * 2**22  # the subnormal's integer significand: amax = mantissa * 2**-149
    assert mantissa.denominator == 1
    x = np.array([int(mantissa)], np.uint32).view(np.float32)
    got = tuple(int(qemu_q.mx_quantize(x, "int8", block_size=1, scale_rule=rule)[1].view(np.uint8)[0])
                for rule in ("floor", "ceil", "even", "rceil"))
    assert got == codes


# --- levels, layouts, hostile values ----------------------------------------------------------------

def test_every_instruction_set_level_gives_the_same_bits():
    from qemu_q import _kernels

    rng = np.random.default_rng(13)
    x = (rng.standard_normal((96, 700)) * np.exp2(rng.integers(-40, 40, (96, 1)))).astype(np.float32)
    x[3, 40] = np.inf
    previous = _kernels.active.level
    try:
        results = {}
        for level in _kernels.available_levels():
            _kernels.use(level)
            results[level] = [qemu_q.mx_quantize(x, element, axis=axis, scale_rule=rule, packed=packed)
                              for element in ELEMENTS for rule in RULES
                              for axis in (-1, 0) for packed in (False, True)]
    finally:
        _kernels.use(previous)
    assert "baseline" in results
    for level, got in results.items():
        for (codes, scales), (want_codes, want_scales) in zip(got, results["baseline"]):
            assert_same_bits(codes, want_codes, level)
            assert_same_bits(scales, want_scales, level)


def test_non_contiguous_and_read_only_inputs():
    rng = np.random.default_rng(4)
    base = rng.standard_normal((40, 66)).astype(np.float32)
    for x in (base.T, base[:, ::2], base[::-1]):
        x_ro = x.copy()
        x_ro.flags.writeable = False
        for view in (x, x_ro):
            codes, scales = qemu_q.mx_quantize(view, "float6e2m3", axis=0, block_size=8)
            want = qemu_q.mx_quantize(np.ascontiguousarray(x), "float6e2m3", axis=0, block_size=8)
            assert_same_bits(codes, want[0])
            assert_same_bits(scales, want[1])
    check(base.T, "float8e5m2", "ceil", axis=1, block_size=5)


HOSTILE = dict(
    element=["float8e4m3fn", "int8", "float4e2m1", 17, ml_dtypes.float6_e3m2fn, "int4", "float8e8m0",
             "bfloat16", None, 3.5, object(), 999, "float8e4m3fnuz"],
    axis=[-1, 0, 1, -2, 2, -3, 2**63, -(2**63) - 1, 1.0, None, True, np.int64(1)],
    block_size=[32, 1, 3, 2**62, 2**63 - 1, 2**63, 0, -1, -(2**63), 1.5, None, False, np.int32(4)],
    scale_rule=[*RULES, "FLOOR", "", None, b"floor", 0],
    packed=[False, True, 1, None, np.bool_(True)],
    n_threads=[None, 1, 2, 1024, 1025, 0, -1, 2.0, True],
)


@settings(max_examples=600, **SETTINGS)
@given(st.fixed_dictionaries({name: st.sampled_from(values) for name, values in HOSTILE.items()}),
       st.sampled_from([(2, 40), (0, 5), (3, 0), (7,), (1, 1, 9)]),
       st.sampled_from([np.float32, np.float16, np.float64, np.int8, ml_dtypes.float8_e4m3fn]))
def test_hostile_arguments_are_rejected_by_name_or_computed(kwargs, shape, dtype):
    x = np.linspace(-3, 3, math.prod(shape)).reshape(shape).astype(dtype)
    before = x.tobytes()
    try:
        codes, scales = qemu_q.mx_quantize(x, **kwargs)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert any(word in message for word in ("element", "axis", "block_size", "scale_rule", "packed",
                                                "n_threads", "x ", "x has", "rank")), message
    else:
        assert x.dtype in (np.float32, np.float16)
        assert scales.dtype == ml_dtypes.float8_e8m0fnu
    assert x.tobytes() == before


# --- peers ------------------------------------------------------------------------------------------

def torchao_floor_e4m3(x: np.ndarray, block_size: int):
    """torchao's `to_mx` FLOOR path for float32 into MXFP8 e4m3, transcribed statement by
    statement into numpy from its source (torchao needs PyTorch, absent here)."""
    blocks = x.reshape(-1, block_size)
    with np.errstate(invalid="ignore"):
        max_abs = np.abs(blocks).max(axis=1)  # torch.amax propagates NaN, as np.max does
    extracted_pow2 = ((max_abs.view(np.int32) >> 23) & 0xFF) - 127
    unbiased = np.clip(extracted_pow2 - 8, -127, 128)  # target_max_pow2 of e4m3: 8
    biased = (unbiased + 127).astype(np.uint8)
    biased = np.where(np.isnan(max_abs), np.uint8(255), biased)
    scale_fp32 = (biased.astype(np.int32) << 23).view(np.float32)
    scale_fp32 = np.maximum(scale_fp32, np.float32(2.0 ** -126))  # clamp(min=F32_MIN_NORMAL)
    with np.errstate(invalid="ignore", over="ignore"):
        data_lp = np.clip(blocks / scale_fp32[:, None], np.float32(-448), np.float32(448))
    return data_lp.astype(ml_dtypes.float8_e4m3fn).reshape(x.shape), biased


@divergence_entry("MX FLOOR: torchao divides 2^-127 blocks by 2^-126 and gives inf blocks a finite scale")
def test_torchao_floor_transcription_differs_on_tiny_and_inf_blocks():
    x = np.array([2.0 ** -120, 2.0 ** -122, 1.0, np.inf], dtype=np.float32)
    codes, scales = check(x, "float8e4m3fn", "floor", block_size=2)
    assert scales.view(np.uint8).tolist() == [0x00, 0xFF]
    assert codes.view(np.uint8).tolist() == [0x70, 0x60, 0x7F, 0x7F]
    t_codes, t_scales = torchao_floor_e4m3(x, 2)
    assert t_scales.tolist() == [0x00, 0xF7]
    assert t_codes.view(np.uint8).tolist() == [0x68, 0x58, 0x00, 0x7E]
    # Elsewhere the transcription and qemu_q agree bit for bit (ordinary and boundary data).
    rng = np.random.default_rng(21)
    y = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 100, np.repeat(boundary_amaxes("float8e4m3fn"), 32)])
    y = y[: y.size // 32 * 32]
    y = y[np.abs(y).reshape(-1, 32).max(axis=1).repeat(32) >= 2.0 ** -118]
    ours_codes, ours_scales = qemu_q.mx_quantize(y, "float8e4m3fn")
    t_codes, t_scales = torchao_floor_e4m3(y, 32)
    assert_same_bits(ours_scales.view(np.uint8), t_scales)
    assert_same_bits(ours_codes, t_codes)
