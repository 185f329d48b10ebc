"""The integer datapath ops refuse bad input with errors naming the argument and what is allowed."""

import numpy as np
import pytest

import qemu_q

U8 = np.uint8


def _qmm(a=None, b=None, **kw):
    a = np.zeros((2, 3), U8) if a is None else a
    b = np.zeros((3, 4), U8) if b is None else b
    args = dict(a_scale=np.float32(1), a_zero_point=U8(0), b_scale=np.float32(1),
                b_zero_point=U8(0), y_scale=np.float32(1), y_zero_point=U8(0))
    args.update(kw)
    return qemu_q.qlinear_matmul(a, args["a_scale"], args["a_zero_point"], b, args["b_scale"],
                                 args["b_zero_point"], args["y_scale"], args["y_zero_point"])


def test_matmul_shape_mismatch_names_both():
    with pytest.raises(ValueError, match=r"A has shape \(2, 3\) and B \(4, 4\)"):
        qemu_q.matmul_integer(np.zeros((2, 3), U8), np.zeros((4, 4), U8))


def test_matmul_zero_point_shape():
    with pytest.raises(ValueError, match=r"a_zero_point has shape \(3,\); allowed"):
        qemu_q.matmul_integer(np.zeros((2, 3), U8), np.zeros((3, 4), U8), np.zeros(3, U8))
    with pytest.raises(ValueError, match=r"b_zero_point has shape \(2,\)"):
        qemu_q.matmul_integer(np.zeros((2, 3), U8), np.zeros((3, 4), U8), None, np.zeros(2, U8))


def test_matmul_types_and_choices():
    with pytest.raises(TypeError, match="int16"):
        qemu_q.matmul_integer(np.zeros((2, 3), np.int16), np.zeros((3, 4), U8))
    with pytest.raises(ValueError, match="accumulator='int64'"):
        qemu_q.matmul_integer(np.zeros((2, 3), U8), np.zeros((3, 4), U8), accumulator="int64")
    with pytest.raises(ValueError, match="requantization='nearest'"):
        qemu_q.qlinear_matmul(np.zeros((2, 3), U8), np.float32(1), U8(0), np.zeros((3, 4), U8),
                              np.float32(1), U8(0), np.float32(1), U8(0), requantization="nearest")


def test_qlinear_matmul_scale_types_must_agree():
    with pytest.raises(TypeError, match="share one type"):
        _qmm(a_scale=np.float16(1))


def test_qlinear_matmul_float8_zero_point_must_be_zero():
    import ml_dtypes
    a = np.zeros((2, 3), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="a_zero_point of a float8 type must be"):
        _qmm(a=a, a_zero_point=np.array(1.0, ml_dtypes.float8_e4m3fn))


def test_conv_geometry_errors():
    x = np.zeros((1, 4, 5, 5), U8)
    w = np.zeros((2, 4, 3, 3), U8)
    with pytest.raises(ValueError, match="group=2"):
        qemu_q.conv_integer(x, w, group=2)
    with pytest.raises(ValueError, match="kernel_shape"):
        qemu_q.conv_integer(x, w, kernel_shape=[2, 2])
    with pytest.raises(ValueError, match="pads cannot be used"):
        qemu_q.conv_integer(x, w, auto_pad="VALID", pads=[1, 1, 1, 1])
    with pytest.raises(ValueError, match="auto_pad='SAME'"):
        qemu_q.conv_integer(x, w, auto_pad="SAME")
    with pytest.raises(ValueError, match="strides"):
        qemu_q.conv_integer(x, w, strides=[0, 1])
    with pytest.raises(ValueError, match="no output"):
        qemu_q.conv_integer(x, np.zeros((2, 4, 7, 7), U8))
    # a geometry beyond what numpy can index is the attributes' error, named
    with pytest.raises(ValueError, match=r"pads \[1099511627776, 1099511627776\] \+ .* make the padded x "
                                         r"\d+ elements; at most \d+ can be indexed"):
        qemu_q.conv_integer(x, w, pads=[2**40] * 4)
    with pytest.raises(ValueError, match=r"auto_pad=.SAME_UPPER.*dilations \[1099511627776, 1099511627776\] make"):
        qemu_q.conv_integer(x, w, auto_pad="SAME_UPPER", dilations=[2**40] * 2)
    with pytest.raises(ValueError, match=r"w_zero_point has shape \(3,\)"):
        qemu_q.conv_integer(x, w, None, np.zeros(3, U8))
    with pytest.raises(ValueError, match=r"B has shape \(3,\)"):
        qemu_q.qlinear_conv(x, np.float32(1), U8(0), w, np.float32(1), U8(0), np.float32(1), U8(0),
                            np.zeros(3, np.int32))


def test_conv_same_padding_split():
    # SAME_UPPER puts the odd padding at the end, SAME_LOWER at the beginning: with a 2-wide
    # kernel of ones over [1, 2, 3] the outputs are [1+2, 2+3, 3+0] and [0+1, 1+2, 2+3].
    x = np.array([[[1, 2, 3]]], U8)
    w = np.ones((1, 1, 2), U8)
    assert qemu_q.conv_integer(x, w, auto_pad="SAME_UPPER").ravel().tolist() == [3, 5, 3]
    assert qemu_q.conv_integer(x, w, auto_pad="SAME_LOWER").ravel().tolist() == [1, 3, 5]


def test_inputs_are_not_modified():
    a = np.arange(6, dtype=U8).reshape(2, 3)
    a.flags.writeable = False
    b = np.arange(12, dtype=U8).reshape(3, 4)
    before = b.copy()
    qemu_q.matmul_integer(a, b, U8(1), U8(2))
    np.testing.assert_array_equal(b, before)


def test_zero_point_of_a_one_d_operand_must_be_scalar():
    a, b = np.zeros((2, 33), np.int8), np.zeros(33, np.int8)
    with pytest.raises(ValueError, match=r"b_zero_point has shape \(3, 3\); a 1-D b takes a scalar"):
        qemu_q.qlinear_matmul(a, np.float32(0.5), np.int8(0), b, np.float32(0.25), np.zeros((3, 3), np.int8),
                              np.float32(0.125), np.uint8(0), accumulator="x86-u8s8-pairs")


@pytest.mark.parametrize("a_shape, b_shape", [((0, 5), (5, 2)), ((3, 0), (0, 2)), ((2, 0, 4), (4, 3)), ((3, 4), (4, 0))])
@pytest.mark.parametrize("accumulator", ["int32", "x86-u8s8-pairs"])
def test_empty_operands(a_shape, b_shape, accumulator):
    a, b = np.zeros(a_shape, U8), np.zeros(b_shape, np.int8)
    expected = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
    acc = qemu_q.matmul_integer(a, b, accumulator=accumulator)
    assert acc.shape == expected and acc.dtype == np.int32 and not acc.any()
    y = qemu_q.qlinear_matmul(a, np.float32(1), U8(0), b, np.float32(1), np.int8(0), np.float32(1), U8(9),
                              accumulator=accumulator)
    assert y.shape == expected and (y == 9).all()
    with pytest.raises(ValueError, match="n_threads"):
        qemu_q.qlinear_matmul(a, np.float32(1), U8(0), b, np.float32(1), np.int8(0), np.float32(1), U8(9), n_threads=0)
