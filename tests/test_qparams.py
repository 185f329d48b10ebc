"""choose_qparams against an exact computation in Python fractions (its documented rules,
each rounding done on exact rationals), and the round trip through quantize_linear and
dequantize_linear within the documented error."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import qemu_q

INTEGER_TYPES = {  # name: (qmin, qmax), from the ONNX type definitions
    "int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
    "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3),
}
FLOAT_TYPES = {  # name: (largest finite value, mantissa bits, smallest subnormal)
    "float8e4m3fn": (448, 3, Fraction(1, 2**9)), "float8e4m3fnuz": (240, 3, Fraction(1, 2**10)),
    "float8e5m2": (57344, 2, Fraction(1, 2**16)), "float8e5m2fnuz": (57344, 2, Fraction(1, 2**17)),
    "float6e2m3": (Fraction(15, 2), 3, Fraction(1, 8)), "float6e3m2": (28, 2, Fraction(1, 16)),
    "float4e2m1": (6, 1, Fraction(1, 2)),
}

# Codec-family types (issue 15): (factory arguments, range or largest finite value), each
# range and value worked out from the family's definition (docs/semantics.md, "Codec family").
FAMILY_INTEGERS = {
    "int5": ((5, True, False), (-16, 15)), "uint12": ((12, False, False), (0, 4095)),
    "int8_narrow": ((8, True, True), (-127, 127)), "uint4_narrow": ((4, False, True), (0, 14)),
    "int3_narrow": ((3, True, True), (-3, 3)),
}
FAMILY_FLOATS = {
    # e3m4, bias 3, IEEE NaNs, no inf: exponent field 6 at most: 2**3 * (1 + 15/16)
    "float8e3m4b3_ieee": ((3, 4, None, False, "ieee", True), (Fraction(31, 2), 4, Fraction(1, 2**6))),
    # e5m3 FNUZ, bias 16: the all-ones magnitude is finite: 2**15 * (1 + 7/8)
    "float9e5m3b16_fnuz": ((5, 3, None, False, "fnuz", False), (61440, 3, Fraction(1, 2**18))),
    # e4m3 with IEEE inf and NaN, bias 7: exponent field 14 at most: 2**7 * (1 + 7/8)
    "float8e4m3b7_ieee_inf": ((4, 3, None, True, "ieee", True), (240, 3, Fraction(1, 2**9))),
}
INTEGER_TYPES.update({name: limits for name, (_, limits) in FAMILY_INTEGERS.items()})
FLOAT_TYPES.update({name: limits for name, (_, limits) in FAMILY_FLOATS.items()})


def type_argument(name):
    """What choose_qparams is given for a table name: the ONNX name, or the family type."""
    if name in FAMILY_INTEGERS:
        return qemu_q.integer_type(*FAMILY_INTEGERS[name][0])
    if name in FAMILY_FLOATS:
        e, m, bias, inf, nan, negative_zero = FAMILY_FLOATS[name][0]
        return qemu_q.minifloat_type(e, m, bias, inf=inf, nan=nan, negative_zero=negative_zero)
    return name


def round_binary(value: Fraction, precision: int, emin: int) -> Fraction:
    """value rounded to nearest, ties to even, to `precision` significant bits, subnormals
    below 2**emin (no overflow in these tests)."""
    if value == 0:
        return Fraction(0)
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, emin) - precision + 1)
    rounded = round(magnitude / quantum) * quantum  # round() on a Fraction: ties to even
    return rounded if value > 0 else -rounded


def f64(value: Fraction) -> Fraction:
    return round_binary(value, 53, -1022)


def f32(value: Fraction) -> Fraction:
    return round_binary(value, 24, -126)


SMALLEST_F32 = Fraction(1, 2**149)


def group_of(index, axis, block_size):
    if axis is None:
        return ()
    if block_size == 0:
        return (index[axis],)
    return index[:axis] + (index[axis] // block_size,) + index[axis + 1:]


def expected_qparams(x, name, axis, block_size, symmetric, reduce_range):
    """{group: (scale, zero point, largest magnitude)} as Fractions / ints, from the
    documented rules."""
    lo, hi = {}, {}
    for index in np.ndindex(x.shape):
        key = group_of(index, axis, block_size)
        lo.setdefault(key, Fraction(0))
        hi.setdefault(key, Fraction(0))
        value = float(x[index])
        if value == value:
            lo[key] = min(lo[key], Fraction(value))
            hi[key] = max(hi[key], Fraction(value))

    def finish(scale, numerator):
        if numerator == 0:
            return Fraction(1)
        return SMALLEST_F32 if scale == 0 else scale

    result = {}
    for key in lo:
        amax = max(-lo[key], hi[key])
        if name in FLOAT_TYPES:
            result[key] = (finish(f32(amax / FLOAT_TYPES[name][0]), amax), 0, amax)
            continue
        qmin, qmax = INTEGER_TYPES[name]
        if reduce_range:
            qmin, qmax = qmin // 2, qmax // 2
        if symmetric:
            zero = (qmin + qmax + 1) // 2
            result[key] = (finish(f32(amax / (qmax - zero)), amax), zero, amax)
        else:
            span = hi[key] - lo[key]
            scale = finish(f32(f64(f64(span) / (qmax - qmin))), span)
            zero = round(f64(qmin - f64(lo[key] / scale)))
            result[key] = (scale, min(max(zero, qmin), qmax), amax)
    return result


def expected_shape(shape, axis, block_size):
    if axis is None:
        return ()
    if block_size == 0:
        return (shape[axis],)
    return shape[:axis] + (-(-shape[axis] // block_size),) + shape[axis + 1:]


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(set(INTEGER_TYPES) - set(FAMILY_INTEGERS))
                                + sorted(set(FLOAT_TYPES) - set(FAMILY_FLOATS))))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=7))
    # Wide magnitudes (subnormal to huge), NaN, and tensors whose groups are all zero.
    elements = st.one_of(
        st.floats(width=32, allow_infinity=False),
        st.floats(-4.0, 4.0, width=32),
        st.just(0.0),
    )
    x = draw(hnp.arrays(np.float32, shape, elements=elements))
    axis = draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
    block_size = 0 if axis is None else draw(st.sampled_from([0, 0, 1, 2, 3, 4]))
    if name in FLOAT_TYPES:
        symmetric, reduce_range = None, False
    else:
        symmetric = draw(st.sampled_from([None, False, True]))
        reduce_range = name not in ("int2", "uint2") and draw(st.booleans())
    return x, name, axis, block_size, symmetric, reduce_range


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_choose_qparams_matches_exact_rules(case):
    x, name, axis, block_size, symmetric, reduce_range = case
    scale, zero_point = qemu_q.choose_qparams(x, name, axis=axis, block_size=block_size,
                                              symmetric=symmetric, reduce_range=reduce_range)
    shape = expected_shape(x.shape, axis, block_size)
    assert scale.dtype == np.float32 and scale.shape == shape
    assert zero_point.dtype == qemu_q.element_type(name).dtype and zero_point.shape == shape
    expected = expected_qparams(x, name, axis, block_size, symmetric, reduce_range)
    for key, (want_scale, want_zero, _) in expected.items():
        assert Fraction(float(scale[key])) == want_scale, key
        assert Fraction(float(zero_point[key])) == want_zero, key

    # Round trip within the documented error.
    kwargs = {} if axis is None else {"axis": axis, "block_size": block_size}
    y = qemu_q.quantize_linear(x, scale, zero_point, **kwargs)
    back = qemu_q.dequantize_linear(y, scale, zero_point, **kwargs)
    for index in np.ndindex(x.shape):
        value = float(x[index])
        key = group_of(index, axis, block_size)
        if value != value or expected[key][2] > 2**127 or float(scale[key]) < 2.0**-126:
            # NaN; a group beyond 2**127 may dequantize to inf; a subnormal float32 scale
            # has too few significant bits for the bound (both documented).
            continue
        s = Fraction(float(scale[key]))
        result = Fraction(float(back[index]))
        ulp = Fraction(float(np.spacing(np.abs(back[index]))))
        division = abs(Fraction(value)) / 2**23  # the float32 rounding of x / scale
        if name in FLOAT_TYPES:
            _, mantissa, subnormal = FLOAT_TYPES[name]
            bound = max(abs(Fraction(value)) / 2 ** (mantissa + 1), subnormal * s / 2)
        else:
            bound = s
        assert abs(result - Fraction(value)) <= bound + division + ulp, (index, value, float(back[index]))


def bits(array):
    return array.view(np.uint8).tolist() if array.dtype.itemsize == 1 else array.tolist()


def test_documented_examples():
    # Worked by hand from the rules.
    x = np.array([-1.0, 0.5, 2.0, np.nan], dtype=np.float32)
    scale, zero_point = qemu_q.choose_qparams(x, "uint8")
    assert scale == np.float32(3 / 255) and zero_point == 85  # 0 - (-1) / (3/255) = 85
    scale, zero_point = qemu_q.choose_qparams(x, "int8", symmetric=True)
    assert scale == np.float32(2 / 127) and zero_point == 0
    scale, zero_point = qemu_q.choose_qparams(x, "uint4", symmetric=True)
    assert scale == np.float32(2 / 7) and zero_point == 8
    scale, zero_point = qemu_q.choose_qparams(x, "float8e4m3fn")
    assert scale == np.float32(2 / 448) and zero_point.dtype == ml_dtypes.float8_e4m3fn
    assert bits(zero_point) == 0
    # An all-zero (or all-NaN) group: scale 1; the asymmetric zero point is qmin.
    scale, zero_point = qemu_q.choose_qparams(np.array([[0, 0], [np.nan, 1]], np.float32), "int8", axis=0)
    assert scale.tolist() == [1.0, np.float32(1 / 255)] and zero_point.tolist() == [-128, -128]
    # A range whose scale underflows float32: the smallest positive float32.
    tiny = np.array([np.float32(2**-149)], dtype=np.float32)
    scale, _ = qemu_q.choose_qparams(tiny, "uint8")
    assert scale.view(np.uint32) == 1


@pytest.mark.parametrize("name", sorted(FAMILY_INTEGERS) + sorted(FAMILY_FLOATS))
def test_codec_family_types(name):
    etype = type_argument(name)
    x = np.array([[-1.0, 0.5, 2.0, np.nan, 3.25], [0.0, 1.0, 4.0, 3.0, -7.5],
                  [2.0**-140, -3e38, 0.0, 1e-3, 0.0]], dtype=np.float32)
    settings_ = ([(None, False)] if name in FAMILY_FLOATS else
                 [(symmetric, reduce_range) for symmetric in (None, False, True)
                  for reduce_range in (False, True)])
    for axis, block_size in ((None, 0), (0, 0), (1, 2)):
        for symmetric, reduce_range in settings_:
            scale, zero_point = qemu_q.choose_qparams(x, etype, axis=axis, block_size=block_size,
                                                      symmetric=symmetric, reduce_range=reduce_range)
            assert zero_point.dtype == etype.dtype and scale.shape == expected_shape(x.shape, axis, block_size)
            expected = expected_qparams(x, name, axis, block_size, symmetric, reduce_range)
            for key, (want_scale, want_zero, _) in expected.items():
                assert Fraction(float(scale[key])) == want_scale, (key, symmetric, reduce_range)
                assert int(zero_point[key]) == want_zero, (key, symmetric, reduce_range)
            kwargs = {} if axis is None else {"axis": axis, "block_size": block_size}
            # quantize_linear takes them as they are (a family zero point in its storage)
            assert qemu_q.quantize_linear(x, scale, zero_point, output_dtype=etype, **kwargs).shape == x.shape


def test_codec_family_two_bit_reduce_range_refused():
    with pytest.raises(ValueError, match="reduce_range=True with dtype='uint2_narrow'"):
        qemu_q.choose_qparams(np.ones(3, np.float32), qemu_q.integer_type(2, False, True), reduce_range=True)


def test_blocked_shape_and_partial_block():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    scale, zero_point = qemu_q.choose_qparams(x, "int8", axis=1, block_size=2, symmetric=True)
    assert scale.shape == (2, 3)
    # Row 1 is 5..9: blocks [5, 6], [7, 8], [9]
    assert scale[1].tolist() == [np.float32(6 / 127), np.float32(8 / 127), np.float32(9 / 127)]


@pytest.mark.parametrize("kwargs, error, words", [
    ({"x": [1.0]}, TypeError, "x must be a numpy array"),
    ({"x": np.ones(3)}, TypeError, "float64"),
    ({"dtype": "int32"}, ValueError, "dtype='int32' is not a QuantizeLinear output type"),
    ({"dtype": "float8e8m0"}, ValueError, "not a QuantizeLinear output type"),
    ({"axis": 2}, ValueError, "axis=2 is out of range"),
    ({"block_size": 2}, ValueError, "block_size=2 needs an axis"),
    ({"axis": 0, "block_size": -1}, ValueError, "block_size=-1"),
    ({"x": np.array([1, np.inf], np.float32)}, ValueError, "infinite"),
    ({"dtype": "float8e5m2", "symmetric": False}, ValueError, "float type"),
    ({"dtype": "float4e2m1", "reduce_range": True}, ValueError, "float type"),
    ({"dtype": "int2", "reduce_range": True}, ValueError, "reduce_range=True with dtype='int2'"),
    ({"symmetric": 1}, TypeError, "symmetric must be True or False"),
])
def test_errors_name_the_argument(kwargs, error, words):
    arguments = {"x": np.ones((2, 3), np.float32), "dtype": "int8", **kwargs}
    with pytest.raises(error, match=words.replace("(", r"\(")):
        qemu_q.choose_qparams(arguments.pop("x"), arguments.pop("dtype"), **arguments)
