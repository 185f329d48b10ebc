"""The division-precision rule of docs/semantics.md: q = RNE_P(x / scale), the exact quotient
rounded once to the precision P, then rounded to an integer. Expected values are computed
here with exact rational arithmetic."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo  # noqa: E402

import qemu_q  # noqa: E402

round_to_precision = fo.round_to_binary
round_half_even = fo.round_half_even


def expected_int16(x: np.ndarray, scale, precision: str) -> np.ndarray:
    out = []
    for v in x.astype(np.float64):
        q = round_to_precision(Fraction(float(v)) / Fraction(float(scale)), precision)
        if isinstance(q, float):
            out.append(32767 if q > 0 else -32768)
        else:
            out.append(min(max(round_half_even(q), -32768), 32767))
    return np.array(out, dtype=np.int16)


def test_quotient_is_rounded_once_to_float16_not_the_operands():
    # x = 70000 is beyond float16, the quotient 70 is not: rounding x to float16 first would
    # give inf and saturate.
    x = np.array([70000.0, 1e6, -70000.0], dtype=np.float32)
    y = qemu_q.quantize_linear(x, np.float16(1000.0), output_dtype="int16", opset=23)
    assert y.view(np.uint16).tolist() == np.array([70, 1000, -70], np.int16).view(np.uint16).tolist()


def test_float16_precision_rounds_the_quotient_before_the_integer():
    # 2049 is no float16 (ulp 2 above 2048): the quotient rounds to 2048 (tie, even) and then
    # stays 2048; 2051 rounds to 2052. With precision=1 (float) the division keeps 2049.
    x = np.array([2049.0, 2051.0, 4097.0, -2049.0], dtype=np.float32)
    y = qemu_q.quantize_linear(x, np.float16(1.0), output_dtype="int16", opset=23)
    assert y.tolist() == [2048, 2052, 4096, -2048]
    y32 = qemu_q.quantize_linear(x, np.float16(1.0), output_dtype="int16", precision=1, opset=23)
    assert y32.tolist() == [2049, 2051, 4097, -2049]


@pytest.mark.parametrize("precision,attribute", [("float16", 10), ("bfloat16", 16), ("float", 1)])
def test_precision_attribute_against_exact_rounding(precision, attribute):
    rng = np.random.default_rng(1234)
    x = (rng.standard_normal(4000) * 3000).astype(np.float32)
    scale = np.float32(0.37)
    y = qemu_q.quantize_linear(x, scale, output_dtype="int16", precision=attribute, opset=23)
    np.testing.assert_array_equal(y.view(np.uint16), expected_int16(x, scale, precision).view(np.uint16))


@pytest.mark.parametrize("dtype,name", [(np.float16, "float16"), (ml_dtypes.bfloat16, "bfloat16")])
@pytest.mark.parametrize("opset", [19, 21, 23])
def test_scale_type_sets_the_precision(dtype, name, opset):
    # At 19 and 21 x and the scale share T1; from 23 the scale's type is the default.
    rng = np.random.default_rng(opset)
    x = (rng.standard_normal(3000) * 500).astype(dtype)
    scale = np.array(0.3, dtype=dtype)
    zp = np.array(0, np.int8) if opset < 21 else np.array(0, np.int16)
    y = qemu_q.quantize_linear(x, scale, zp, opset=opset)
    expected = expected_int16(x, scale, name)
    if opset < 21:
        expected = np.clip(expected, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))


def test_int32_scale_divides_in_float32():
    x = np.array([2**24 + 1, 2**30 + 3, -(2**31), 7], dtype=np.int32)
    scale = np.array(3, dtype=np.int32)
    y = qemu_q.quantize_linear(x, scale, np.array(0, np.int16), opset=21)
    expected = expected_int16(x, Fraction(3), "float")
    np.testing.assert_array_equal(y.view(np.uint16), expected.view(np.uint16))
    x_small = np.array([7, -8, 9, 10], dtype=np.int32)
    y = qemu_q.quantize_linear(x_small, scale, np.array(0, np.int16), opset=21)
    assert y.tolist() == [2, -3, 3, 3]  # 7/3=2.33, -8/3=-2.67, 9/3=3, 10/3=3.33


def test_e8m0_scale_divides_in_float32_by_default():
    # 2**-20 as an e8m0 scale; float16 x. P = float32: the quotient 3 * 2**20 is exact.
    scale = np.array(127 - 20, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    x = np.array([3.0, -1.5, 0.5], dtype=np.float16)
    y = qemu_q.quantize_linear(x, scale, output_dtype="int16", opset=24)
    assert y.tolist() == [32767, -32768, 32767]
    y = qemu_q.quantize_linear(x * np.float16(2**-20), np.array(127, np.uint8).view(ml_dtypes.float8_e8m0fnu),
                               output_dtype="int16", opset=24)
    assert y.tolist() == [0, 0, 0]


def test_newer_opset_than_the_table_is_rejected():
    with pytest.raises(ValueError, match="newer"):
        qemu_q.quantize_linear(np.float32([1.0]), np.float32(1.0), opset=29)


def test_signalling_nan_scale_is_quieted_without_a_warning():
    # pytest turns warnings into errors here (filterwarnings = error).
    snan = np.array(0x7F800001, np.uint32).view(np.float32)
    y = qemu_q.quantize_linear(np.float32([1.0, -2.0]), snan, np.int8(5))
    assert y.view(np.uint8).tolist() == [0x80, 0x80]  # NaN -> the minimum
    d = qemu_q.dequantize_linear(np.int8([1, 2]), snan)
    assert d.view(np.uint32).tolist() == [0x7FC00001, 0x7FC00001]  # quiet, payload kept
