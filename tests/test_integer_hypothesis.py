"""The integer datapath ops over hypothesis-drawn geometry against the oracle of
tests/test_integer_oracle.py (Python ints and Fractions from the spec text, never qemu_q):
matmul broadcasting (1-D operands, batch dimensions of 1), per-row / per-column zero points;
convolution rank 1 to 3, every auto_pad, strides, dilations, pads, groups; requantization
with every rule, ties included."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qemu_q
from test_integer_oracle import conv_geometry, conv_oracle, matmul_oracle, requantize

TYPES = {"uint8": (np.uint8, 0, 255), "int8": (np.int8, -128, 127)}
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _codes(draw, type_name, shape):
    dtype, lo, hi = TYPES[type_name]
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    values = draw(st.lists(st.integers(lo, hi), min_size=count, max_size=count))
    return np.array(values, dtype=np.int64).reshape(shape).astype(dtype)


@st.composite
def matmul_cases(draw):
    m, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(1, 4))
    a_batch = draw(st.lists(st.integers(1, 3), max_size=2))
    # b's batch dimensions align with a's last ones: each is 1 or a's dimension there
    b_rank = draw(st.integers(0, len(a_batch)))
    b_batch = [draw(st.sampled_from([1, d])) for d in a_batch[len(a_batch) - b_rank:]]
    a_shape = (k,) if draw(st.booleans()) else tuple(a_batch) + (m, k)
    b_shape = (k,) if draw(st.booleans()) else tuple(b_batch) + (k, n)
    a_type, b_type = draw(st.sampled_from(sorted(TYPES))), draw(st.sampled_from(sorted(TYPES)))
    a, b = _codes(draw, a_type, a_shape), _codes(draw, b_type, b_shape)
    per_row = len(a_shape) == 2 and draw(st.booleans())
    per_column = len(b_shape) == 2 and draw(st.booleans())
    a_zp = _codes(draw, a_type, (m,) if per_row else ())
    b_zp = _codes(draw, b_type, (n,) if per_column else ())
    return a, b, a_zp, b_zp


@SETTINGS
@given(matmul_cases())
def test_matmul_integer_geometry(case):
    a, b, a_zp, b_zp = case
    got = qemu_q.matmul_integer(a, b, a_zp, b_zp)
    want = matmul_oracle(a, b, a_zp, b_zp)
    assert got.dtype == np.int32 and got.shape == want.shape
    assert got.tolist() == want.tolist()


@st.composite
def conv_cases(draw):
    rank = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    per_group = draw(st.integers(1, 2))
    m_per_group = draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    auto_pad = draw(st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)] if auto_pad == "NOTSET" else None
    # input sizes at least the dilated kernel (every auto_pad then has an output)
    sizes = [(k - 1) * d + 1 + draw(st.integers(0, 3)) for k, d in zip(kernel, dilations)]
    x_type, w_type = draw(st.sampled_from(sorted(TYPES))), draw(st.sampled_from(sorted(TYPES)))
    x = _codes(draw, x_type, (draw(st.integers(1, 2)), group * per_group) + tuple(sizes))
    w = _codes(draw, w_type, (group * m_per_group, per_group) + tuple(kernel))
    x_zp = _codes(draw, x_type, ())
    w_zp = _codes(draw, w_type, (w.shape[0],) if draw(st.booleans()) else ())
    attrs = dict(group=group, strides=strides, dilations=dilations, auto_pad=auto_pad)
    if pads is not None:
        attrs["pads"] = pads
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    return x, w, x_zp, w_zp, attrs


@SETTINGS
@given(conv_cases(), st.sampled_from(["exact", "float32", "float64"]), st.booleans())
def test_conv_geometry_and_requantization(case, rule, with_bias):
    x, w, x_zp, w_zp, attrs = case
    rank = x.ndim - 2
    pads = attrs.get("pads", [0] * (2 * rank))
    oracle_args = (attrs["group"], attrs["strides"], attrs["dilations"], pads, attrs["auto_pad"])
    got = qemu_q.conv_integer(x, w, x_zp, w_zp, **attrs)
    want = conv_oracle(x, w, x_zp, w_zp, *oracle_args)
    _, outs = conv_geometry(x.shape[2:], w.shape[2:], attrs["strides"], attrs["dilations"],
                            pads, attrs["auto_pad"])
    assert got.dtype == np.int32 and got.shape == want.shape == x.shape[:1] + w.shape[:1] + tuple(outs)
    assert got.tolist() == want.tolist()
    # QLinearConv: scales whose products hit ties (1 * 1 / 2) with an odd zero point
    bias = np.arange(w.shape[0], dtype=np.int32) * 3 - 4 if with_bias else None
    acc = conv_oracle(x, w, x_zp, w_zp, *oracle_args, bias)
    one, two = np.float32(1.0), np.float32(2.0)
    y_dtype, lo, hi = TYPES["int8" if x.dtype == np.int8 else "uint8"]
    y_zp = y_dtype(3)
    y = qemu_q.qlinear_conv(x, one, x_zp, w, one, w_zp, two, y_zp, bias, requantization=rule,
                            **attrs)
    expected = [requantize(v, one, one, two, y_zp, lo, hi, rule) for v in acc.reshape(-1)]
    assert y.dtype == y_dtype and y.reshape(-1).tolist() == expected
