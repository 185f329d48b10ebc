"""Every validation error of the public API: its type, and a message that names the argument,
the offending value and what is allowed (docs/semantics.md, STYLE "errors name argument,
value and what is allowed")."""

import ml_dtypes
import numpy as np
import pytest

import qemu_q

F32 = np.float32
ql = qemu_q.quantize_linear
dql = qemu_q.dequantize_linear


def x46():
    return np.zeros((4, 6), dtype=F32)


def one():
    return np.array(1.0, dtype=F32)


# --- granularity and shapes ---------------------------------------------------------------

def test_per_axis_scale_length_must_match_axis_dimension():
    with pytest.raises(ValueError, match=r"per-axis y_scale must be 1-D of length x\.shape\[1\] = 6, got shape \(5,\)"):
        ql(x46(), np.ones(5, F32), axis=1)


def test_per_axis_scale_must_be_one_dimensional():
    # A 2-D scale without block_size is not per-axis.
    with pytest.raises(ValueError, match=r"y_scale of shape \(4, 6\) needs block_size > 0"):
        ql(x46(), np.ones((4, 6), F32), axis=1)


def test_per_axis_dequantize_scale_length():
    with pytest.raises(ValueError, match=r"x_scale must be 1-D of length x\.shape\[0\] = 4, got shape \(6,\)"):
        dql(np.zeros((4, 6), np.int8), np.ones(6, F32), axis=0)


def test_blocked_scale_rank_must_match_x():
    with pytest.raises(ValueError, match=r"blocked y_scale must have the rank of x \(2\), got shape \(2,\)"):
        ql(x46(), np.ones(2, F32), axis=1, block_size=3)


def test_blocked_scale_other_dimensions_must_match_x():
    with pytest.raises(ValueError, match=r"blocked y_scale shape \(3, 2\) must equal x shape \(4, 6\) except on axis 1"):
        ql(x46(), np.ones((3, 2), F32), axis=1, block_size=3)


@pytest.mark.parametrize("block_size", [2, 1])
def test_block_size_below_range(block_size):
    # Di = 6, Si = 2: allowed [ceil(6/2), ceil(6/1) - 1] = [3, 5].
    with pytest.raises(ValueError, match=rf"block_size={block_size} does not fit x\.shape\[1\] = 6 with 2 scales.*allowed \[3, 5\]"):
        ql(x46(), np.ones((4, 2), F32), axis=1, block_size=block_size)


@pytest.mark.parametrize("block_size", [6, 7])
def test_block_size_above_range(block_size):
    with pytest.raises(ValueError, match=rf"block_size={block_size} does not fit .*allowed \[3, 5\]"):
        ql(x46(), np.ones((4, 2), F32), axis=1, block_size=block_size)


@pytest.mark.parametrize("block_size", [3, 4, 5])
def test_block_size_range_edges_accepted(block_size):
    y = ql(x46(), np.ones((4, 2), F32), axis=1, block_size=block_size)
    assert y.dtype == np.uint8 and y.shape == (4, 6)


def test_block_size_above_range_dequantize():
    # Di = 7, Si = 3: allowed [3, ceil(7/2) - 1] = [3, 3].
    with pytest.raises(ValueError, match=r"block_size=4 does not fit x\.shape\[0\] = 7 with 3 scales.*allowed \[3, 3\]"):
        dql(np.zeros((7, 2), np.int8), np.ones((3, 2), F32), axis=0, block_size=4)


def test_negative_block_size():
    with pytest.raises(ValueError, match=r"block_size=-1 must be >= 0"):
        ql(x46(), np.ones((4, 2), F32), axis=1, block_size=-1)


def test_zero_point_shape_must_equal_scale_shape():
    with pytest.raises(ValueError, match=r"y_zero_point shape \(4,\) must equal y_scale shape \(6,\)"):
        ql(x46(), np.ones(6, F32), np.zeros(4, np.uint8), axis=1)


def test_dequantize_zero_point_shape_must_equal_scale_shape():
    with pytest.raises(ValueError, match=r"x_zero_point shape \(4, 3\) must equal x_scale shape \(4, 2\)"):
        dql(np.zeros((4, 6), np.int8), np.ones((4, 2), F32), np.zeros((4, 3), np.int8),
            axis=1, block_size=3)


@pytest.mark.parametrize("axis", [2, -3])
def test_axis_out_of_range(axis):
    with pytest.raises(ValueError, match=rf"axis={axis} is out of range for x of rank 2; allowed \[-2, 1\]"):
        ql(x46(), np.ones(4, F32), axis=axis)


def test_axis_out_of_range_dequantize():
    with pytest.raises(ValueError, match=r"axis=3 is out of range for x of rank 3; allowed \[-3, 2\]"):
        dql(np.zeros((2, 3, 4), np.uint8), np.ones(4, F32), axis=3)


def test_per_axis_needs_opset_13():
    with pytest.raises(ValueError, match=r"DequantizeLinear-10 \(opset 10\) supports per-tensor .*got shape \(3,\); per-axis needs opset >= 13"):
        dql(np.zeros(3, np.int8), np.ones(3, F32), axis=0, opset=10)


# --- types ----------------------------------------------------------------------------------

def test_zero_point_type_must_match_dequantize_input():
    with pytest.raises(TypeError, match=r"x_zero_point must have the type of x \(int8\), got uint8"):
        dql(np.zeros(3, np.int8), one(), np.zeros((), np.uint8))


def test_output_dtype_conflicts_with_zero_point():
    with pytest.raises(TypeError, match=r"output_dtype int8 conflicts with y_zero_point of type uint8"):
        ql(x46(), np.ones(6, F32), np.zeros(6, np.uint8), output_dtype="int8")


def test_output_dtype_conflicts_with_zero_point_given_as_onnx_int():
    with pytest.raises(TypeError, match=r"output_dtype int4 conflicts with y_zero_point of type int8"):
        ql(x46(), one(), np.zeros((), np.int8), output_dtype=22)


def test_int4_needs_opset_21():
    with pytest.raises(TypeError, match=r"QuantizeLinear-19 \(opset 20\) does not accept .*\bint4; int4 needs opset >= 21\. Allowed: .*int8"):
        ql(x46(), one(), np.zeros((), ml_dtypes.int4), opset=20)


def test_int2_needs_opset_25_dequantize():
    with pytest.raises(TypeError, match=r"does not accept x of type int2; int2 needs opset >= 25"):
        dql(np.zeros(3, ml_dtypes.int2), one(), opset=24)


def test_int16_output_dtype_needs_opset_21():
    # output_dtype itself appears in 21, so at 19 the attribute is what is rejected.
    with pytest.raises(ValueError, match=r"QuantizeLinear-19 \(opset 19\) has no attribute 'output_dtype' .*it appears in opset 21"):
        ql(x46(), one(), output_dtype="int16", opset=19)


def test_float16_x_needs_opset_19():
    with pytest.raises(TypeError, match=r"does not accept x of type float16; float16 needs opset >= 19\. Allowed: float, int32"):
        ql(x46().astype(np.float16), one(), opset=13)


def test_quantize_x_and_scale_share_type_at_19():
    with pytest.raises(TypeError, match=r"x and y_scale share type T1; got x float and y_scale float16"):
        ql(x46(), np.array(1.0, np.float16), opset=19)


def test_float16_scale_needs_opset_19_dequantize():
    with pytest.raises(TypeError, match=r"does not accept x_scale of type float16; float16 needs opset >= 19"):
        dql(np.zeros(3, np.int8), np.array(1.0, np.float16), opset=13)


def test_unknown_dtype_of_x():
    with pytest.raises(TypeError, match=r"QuantizeLinear-28 \(opset 28\) does not accept x of type double \(dtype float64\)\. Allowed: bfloat16, float, float16, int32"):
        ql(np.zeros(3), one())
    with pytest.raises(TypeError, match=r"x has dtype complex64, which no ONNX quantization op accepts"):
        ql(np.zeros(3, np.complex64), one())


def test_unknown_output_dtype_name():
    with pytest.raises(ValueError, match=r"output_dtype='int3' is not a known type name"):
        ql(x46(), one(), output_dtype="int3")


def test_output_dtype_not_a_quantized_type():
    with pytest.raises(TypeError, match=r"QuantizeLinear-28 \(opset 28\) does not accept .*\bfloat16\. Allowed: .*uint8"):
        ql(x46(), one(), output_dtype="float16")


def test_int32_zero_point_is_no_quantize_output():
    with pytest.raises(TypeError, match=r"QuantizeLinear-28 \(opset 28\) does not accept .*\bint32\. Allowed: .*int8"):
        ql(x46(), one(), np.zeros((), np.int32))


def test_x_as_python_list():
    with pytest.raises(TypeError, match=r"x must be a numpy array .*got list"):
        ql([1.0, 2.0], one())


def test_scale_as_python_float():
    with pytest.raises(TypeError, match=r"x_scale must be a numpy array .*got float"):
        dql(np.zeros(3, np.int8), 1.0)


def test_dynamic_quantize_rejects_float16():
    with pytest.raises(TypeError, match=r"DynamicQuantizeLinear-11 \(opset 11\) does not accept x of type float16\. Allowed: float"):
        qemu_q.dynamic_quantize_linear(np.zeros(3, np.float16))


# --- attributes -------------------------------------------------------------------------------

def test_block_size_not_in_opset_19():
    with pytest.raises(ValueError, match=r"QuantizeLinear-19 \(opset 19\) has no attribute 'block_size' \(got block_size=2\); it appears in opset 21"):
        ql(x46(), one(), block_size=2, opset=19)


def test_block_size_not_in_dequantize_opset_20():
    with pytest.raises(ValueError, match=r"DequantizeLinear-19 \(opset 20\) has no attribute 'block_size' \(got block_size=3\); it appears in opset 21"):
        dql(np.zeros((4, 6), np.int8), np.ones((4, 2), F32), block_size=3, opset=20)


def test_precision_not_in_opset_21():
    with pytest.raises(ValueError, match=r"QuantizeLinear-21 \(opset 22\) has no attribute 'precision' \(got precision=1\); it appears in opset 23"):
        ql(x46(), one(), precision=1, opset=22)


def test_saturate_not_in_opset_13():
    with pytest.raises(ValueError, match=r"QuantizeLinear-13 \(opset 13\) has no attribute 'saturate' \(got saturate=0\); it appears in opset 19"):
        ql(x46(), one(), saturate=0, opset=13)


def test_dequantize_output_dtype_not_in_opset_21():
    with pytest.raises(ValueError, match=r"DequantizeLinear-21 \(opset 21\) has no attribute 'output_dtype' .*it appears in opset 23"):
        dql(np.zeros(3, np.int8), one(), output_dtype="float16", opset=21)


def test_default_attribute_values_accepted_where_absent():
    # The attribute's default is not "given": opset 10 accepts saturate=1, block_size=0, precision=0.
    y = ql(x46(), one(), saturate=1, block_size=0, precision=0, output_dtype=0, opset=10)
    assert y.dtype == np.uint8


@pytest.mark.parametrize("precision", [2, 7, -1])
def test_bad_precision_value(precision):
    with pytest.raises(ValueError, match=rf"precision={precision}; allowed 0 \(the scale's type\), 1 \(float\), 10 \(float16\), 16 \(bfloat16\)"):
        ql(x46(), one(), precision=precision)


@pytest.mark.parametrize("saturate", [2, -1])
def test_saturate_not_0_or_1(saturate):
    with pytest.raises(ValueError, match=rf"saturate={saturate}; allowed 0 or 1"):
        ql(x46(), one(), output_dtype="float8e4m3fn", saturate=saturate)


def test_attribute_must_be_int():
    with pytest.raises(TypeError, match=r"axis must be an int, got float 1\.0"):
        ql(x46(), np.ones(6, F32), axis=1.0)


# --- zero points --------------------------------------------------------------------------------

def test_nonzero_float8_zero_point():
    with pytest.raises(ValueError, match=r"y_zero_point of type float8e4m3fn must be zero \(\+0 or -0\), got 1"):
        ql(x46(), one(), np.array(1.0, ml_dtypes.float8_e4m3fn))


def test_nonzero_float4_zero_point_dequantize():
    with pytest.raises(ValueError, match=r"x_zero_point of type float4e2m1 must be zero \(\+0 or -0\), got -0\.5"):
        dql(np.zeros(2, ml_dtypes.float4_e2m1fn), np.ones(2, F32),
            np.array([0.0, -0.5], ml_dtypes.float4_e2m1fn), axis=0)


def test_nonzero_int32_dequantize_zero_point():
    with pytest.raises(ValueError, match=r"x_zero_point of int32 x must be 0 .*got 2"):
        dql(np.zeros(3, np.int32), one(), np.array(2, np.int32))


def test_zero_int32_dequantize_zero_point_accepted():
    y = dql(np.array([5], np.int32), one(), np.array(0, np.int32))
    assert y.view(np.uint32).tolist() == [0x40A00000]


# --- run_op and get_spec ---------------------------------------------------------------------------

def test_run_op_unknown_op():
    with pytest.raises(ValueError, match=r"unknown op 'Gemm'; known ops are Cast, CastLike, ConvInteger, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, QLinearConv, QLinearMatMul, QuantizeLinear"):
        qemu_q.run_op("Gemm", [], {}, 21)


def test_run_op_opset_too_old():
    with pytest.raises(ValueError, match=r"QuantizeLinear has versions 10, 13, 19, 21, 23, 24, 25, 28; opset 9 is older than all of them"):
        qemu_q.run_op("QuantizeLinear", [x46(), one()], {}, 9)


def test_run_op_opset_too_new():
    with pytest.raises(ValueError, match=r"DequantizeLinear has versions .*; opset 29 is newer than the newest opset this table knows \(28\)"):
        qemu_q.run_op("DequantizeLinear", [np.zeros(3, np.int8), one()], {}, 29)


def test_get_spec_unknown_op():
    with pytest.raises(ValueError, match=r"unknown op 'Quantize'; known ops are"):
        qemu_q.get_spec("Quantize")


def test_get_spec_opset_too_old():
    with pytest.raises(ValueError, match=r"DynamicQuantizeLinear has versions 11; opset 10 is older than all of them"):
        qemu_q.get_spec("DynamicQuantizeLinear", 10)


def test_get_spec_opset_not_int():
    with pytest.raises(TypeError, match=r"opset must be an int or None, got str"):
        qemu_q.get_spec("QuantizeLinear", "21")


def test_run_op_unknown_attribute():
    with pytest.raises(ValueError, match=r"QuantizeLinear-21 \(opset 21\) has no attribute 'precision'; its attributes: axis, saturate, block_size, output_dtype"):
        qemu_q.run_op("QuantizeLinear", [x46(), one()], {"precision": 1}, 21)


def test_run_op_missing_required_input():
    with pytest.raises(ValueError, match=r"QuantizeLinear-21 \(opset 21\): input 'y_scale' is required"):
        qemu_q.run_op("QuantizeLinear", [x46()], {}, 21)


def test_run_op_required_input_given_as_none():
    with pytest.raises(ValueError, match=r"DequantizeLinear-13 \(opset 13\): input 'x' is required"):
        qemu_q.run_op("DequantizeLinear", [None, one()], {}, 13)


def test_run_op_too_many_inputs():
    with pytest.raises(ValueError, match=r"takes at most 3 inputs, got 4"):
        qemu_q.run_op("QuantizeLinear", [x46(), one(), None, None], {}, 21)


# --- out= ----------------------------------------------------------------------------------------------

def test_out_wrong_dtype():
    with pytest.raises(TypeError, match=r"out has dtype int8; this call produces uint8"):
        ql(x46(), one(), out=np.empty((4, 6), np.int8))


def test_out_wrong_dtype_dequantize():
    with pytest.raises(TypeError, match=r"out has dtype float16; this call produces float32"):
        dql(np.zeros(3, np.int8), one(), out=np.empty(3, np.float16))


def test_out_wrong_shape():
    with pytest.raises(ValueError, match=r"out has shape \(6, 4\); this call produces shape \(4, 6\)"):
        ql(x46(), one(), out=np.empty((6, 4), np.uint8))


def test_out_not_contiguous():
    with pytest.raises(ValueError, match=r"out must be C-contiguous"):
        ql(x46(), one(), out=np.empty((4, 12), np.uint8)[:, ::2])


def test_out_fortran_order_rejected():
    with pytest.raises(ValueError, match=r"out must be C-contiguous"):
        ql(x46(), one(), out=np.empty((4, 6), np.uint8, order="F"))


def test_out_read_only():
    out = np.empty((4, 6), np.uint8)
    out.setflags(write=False)
    with pytest.raises(ValueError, match=r"out is read-only"):
        ql(x46(), one(), out=out)


def test_out_not_an_array():
    with pytest.raises(TypeError, match=r"out must be a numpy array, got list"):
        ql(x46(), one(), out=[0] * 24)


def test_out_overlapping_x():
    buffer = np.zeros(96, np.uint8)
    x = buffer[:24].view(np.int8).reshape(4, 6)
    out = buffer.view(F32).reshape(4, 6)
    with pytest.raises(ValueError, match=r"out overlaps x; the kernels do not work in place"):
        dql(x, one(), out=out)


def test_out_overlapping_x_quantize():
    buffer = np.zeros(24, F32)
    out = buffer.view(np.uint8)[:24].reshape(4, 6)
    with pytest.raises(ValueError, match=r"out overlaps x"):
        ql(buffer.reshape(4, 6), one(), out=out)


def test_out_overlapping_scale():
    scale = np.ones(8, F32)
    out = scale.view(np.uint8)[:6]
    with pytest.raises(ValueError, match=r"out overlaps y_scale"):
        ql(np.zeros(6, F32), scale[:1].reshape(()), out=out)


STOCHASTIC = qemu_q.Datapath(rounding="stochastic")


def _words_and_overlapping_out(dtype):
    # random words and an out= over the last bytes of the same buffer
    words = np.arange(1, 33, dtype=np.uint32).reshape(4, 8) * np.uint32(0x9E3779B9)
    size = np.dtype(dtype).itemsize * 32
    return words, words.view(np.uint8).reshape(-1)[128 - size:].view(dtype).reshape(4, 8)


@pytest.mark.parametrize("call, out_dtype", [
    (lambda x, words, out: ql(x, np.float32(0.3), np.int8(0), datapath=STOCHASTIC, random_bits=words, out=out),
     np.int8),
    (lambda x, words, out: qemu_q.cast(x, "float8e4m3fn", datapath=STOCHASTIC, random_bits=words, out=out),
     ml_dtypes.float8_e4m3fn),
    (lambda x, words, out: dql(np.arange(32, dtype=np.int8).reshape(4, 8), np.float16(0.3),
                               datapath=STOCHASTIC, random_bits=words, out=out), np.float16),
    (lambda x, words, out: qemu_q.mx_quantize(x, "int8", datapath=STOCHASTIC, random_bits=words,
                                              out=(out, np.empty((4, 1), ml_dtypes.float8_e8m0fnu))), np.int8),
    (lambda x, words, out: qemu_q.nvfp4_quantize(x, datapath=STOCHASTIC, random_bits=words,
                                                 out=(out, np.empty((4, 1), ml_dtypes.float8_e4m3fn))),
     ml_dtypes.float4_e2m1fn),
])
def test_out_overlapping_random_bits(call, out_dtype):
    """The kernels read each word after writing earlier outputs: an out= over the words
    would feed outputs back in as random bits."""
    x = (np.arange(32, dtype=F32).reshape(4, 8) - 16) / F32(7)
    words, out = _words_and_overlapping_out(out_dtype)
    before = words.copy()
    with pytest.raises(ValueError, match=r"overlaps? random_bits"):
        call(x, words, out)
    assert words.tolist() == before.tolist()


def test_out_overlapping_random_bits_integer_ops():
    a = np.arange(16, dtype=np.uint8).reshape(4, 4)
    words, out = _words_and_overlapping_out(np.uint8)
    with pytest.raises(ValueError, match=r"out overlaps random_bits"):
        qemu_q.qlinear_matmul(a, np.float32(0.1), np.uint8(0), np.ones((4, 8), np.uint8), np.float32(0.1),
                              np.uint8(0), np.float32(0.2), np.uint8(0), datapath=STOCHASTIC,
                              random_bits=words, out=out)


def test_random_bits_must_be_an_array():
    with pytest.raises(TypeError, match=r"random_bits must be a numpy uint32 array of x's shape, got "
                                        r"int 7"):
        ql(np.zeros((), F32), one(), datapath=STOCHASTIC, random_bits=7)
    # a numpy scalar is the 0-d array it is, as for x: 2.5 rounds up with a word of half
    # (0x80000000 added to the dropped half carries), down with one less
    x = np.float32(2.5)
    assert ql(x, one(), np.int8(0), datapath=STOCHASTIC, random_bits=np.uint32(0x80000000)).tolist() == 3
    assert ql(x, one(), np.int8(0), datapath=STOCHASTIC, random_bits=np.uint32(0x7FFFFFFF)).tolist() == 2
    with pytest.raises(TypeError, match=r"random_bits must be a numpy uint32 array, got int32"):
        ql(x, one(), np.int8(0), datapath=STOCHASTIC, random_bits=np.int32(7))
    with pytest.raises(ValueError, match=r"random_bits has shape \(\); x has shape \(3,\)"):
        ql(np.zeros(3, F32), one(), datapath=STOCHASTIC, random_bits=np.uint32(7))
    with pytest.raises(TypeError, match=r"random_bits must be a numpy uint32 array, got int32"):
        ql(np.zeros(3, F32), one(), datapath=STOCHASTIC, random_bits=np.zeros(3, np.int32))


def test_no_type_is_none():
    """np.dtype(None) is float64: None names no type, wherever a type is asked for."""
    for call, name in ((lambda: qemu_q.cast(np.float32(1.5), None), "to"),
                       (lambda: qemu_q.requantize(np.int32([5]), 1 << 30, 3, scheme="gemmlowp",
                                                  output_dtype=None), "output_dtype"),
                       (lambda: qemu_q.mx_quantize(np.ones(32, F32), None), "element")):
        with pytest.raises(TypeError, match=rf"{name}=None: expected an ONNX data-type int"):
            call()


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_ndarray_subclasses():
    """np.matrix stays 2-D through reshape(-1): the ops read it, and any other subclass
    (np.memmap), as the plain array over its memory; a masked array is refused (its mask
    would be ignored)."""
    x = (np.arange(12, dtype=F32).reshape(3, 4) - 6) / F32(3)
    want = ql(x, np.float32(0.1), np.int8(0)).view(np.uint8).tolist()
    assert ql(np.matrix(x), np.float32(0.1), np.int8(0)).view(np.uint8).tolist() == want
    out = np.matrix(np.zeros((3, 4), np.int8))
    assert np.asarray(ql(x, np.float32(0.1), np.int8(0), out=out)).view(np.uint8).tolist() == want
    assert np.asarray(out).view(np.uint8).tolist() == want
    words = np.arange(12, dtype=np.uint32).reshape(3, 4) << np.uint32(28)
    got = ql(x, np.float32(0.1), np.int8(0), datapath=STOCHASTIC, random_bits=np.matrix(words))
    assert got.tolist() == ql(x, np.float32(0.1), np.int8(0), datapath=STOCHASTIC, random_bits=words).tolist()
    codes = ql(x, np.float32(0.1), np.int8(0))
    assert dql(np.matrix(codes), np.float32(0.1)).tolist() == dql(codes, np.float32(0.1)).tolist()
    assert qemu_q.cast(np.matrix(x), "float16").tolist() == qemu_q.cast(x, "float16").tolist()
    for argument, call in (("x", lambda m: ql(m, np.float32(0.1))),
                           ("random_bits", lambda m: ql(x, np.float32(0.1), datapath=STOCHASTIC,
                                                        random_bits=np.ma.masked_array(words))),
                           ("array", lambda m: qemu_q.pack(m.astype(np.int8)))):
        with pytest.raises(TypeError, match=rf"{argument} is a numpy masked array"):
            call(np.ma.masked_array(x, mask=x > 0))


# --- n_threads ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", [0, -1, 1025, 2**31, 2**64])
def test_n_threads_out_of_range(n_threads):
    with pytest.raises(ValueError, match=rf"n_threads={n_threads}; it must be in \[1, 1024\]"):
        ql(x46(), one(), n_threads=n_threads)


@pytest.mark.parametrize("n_threads, shown", [(1.5, "float 1.5"), (True, "True"), ("2", "str '2'")])
def test_n_threads_not_int(n_threads, shown):
    with pytest.raises(TypeError, match=rf"n_threads must be an int in \[1, 1024\], got {shown}"):
        dql(np.zeros(3, np.int8), one(), n_threads=n_threads)


@pytest.mark.parametrize("n_threads", [0, -1, 1.5, True])
def test_set_num_threads_rejects(n_threads):
    with pytest.raises((TypeError, ValueError), match=r"n_threads"):
        qemu_q.set_num_threads(n_threads)


# --- pack / unpack -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, count, size, expected", [
    ("int4", 5, 2, 3), ("uint4", 4, 3, 2), ("int2", 5, 1, 2), ("float6e2m3", 5, 3, 4),
    ("int8", 3, 4, 3), ("float16", 3, 5, 6),
])
def test_unpack_wrong_buffer_length(dtype, count, size, expected):
    with pytest.raises(ValueError, match=rf"buffer has {size} bytes; {count} elements of {dtype} take {expected}"):
        qemu_q.unpack(bytes(size), dtype, (count,))


def test_unpack_buffer_wrong_dtype():
    with pytest.raises(TypeError, match=r"buffer must hold uint8 bytes, got dtype int8"):
        qemu_q.unpack(np.zeros(3, np.int8), "int4", (5,))


def test_unpack_negative_dimension():
    with pytest.raises(ValueError, match=r"shape \(-1,\) has a negative dimension"):
        qemu_q.unpack(b"", "int4", (-1,))


def test_pack_not_an_array():
    with pytest.raises(TypeError, match=r"array must be a numpy array, got list"):
        qemu_q.pack([1, 2])
