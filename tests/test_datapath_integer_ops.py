"""qemu_q.Datapath in the integer ops: its accumulator is theirs (docs/semantics.md,
"Datapath options"); its other options are refused there, and QuantizeLinear ignores it."""

import numpy as np
import pytest

import qemu_q


def saturating_sum(products, bits):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    acc = 0
    for p in products:
        acc = min(max(acc + p, lo), hi)
    return acc


def test_the_datapath_accumulator_runs_the_integer_ops():
    a = np.array([[100, 100, 100, 100, -100]], np.int8)
    b = np.array([[100], [100], [100], [100], [100]], np.int8)
    products = [100 * 100] * 4 + [-100 * 100]
    want = saturating_sum(products, 16)  # 32767 after the fourth product, then 22767
    assert want == 22767
    datapath = qemu_q.Datapath(accumulator="int16-saturate")
    assert qemu_q.matmul_integer(a, b, datapath=datapath).tolist() == [[want]]
    assert qemu_q.matmul_integer(a, b, accumulator="int16-saturate").tolist() == [[want]]
    assert qemu_q.matmul_integer(a, b).tolist() == [[sum(products)]]  # int32 by default
    x = a.reshape(1, 5, 1, 1)
    w = b.reshape(1, 5, 1, 1)
    assert qemu_q.conv_integer(x, w, datapath=datapath).reshape(-1).tolist() == [want]
    one = np.float32(1.0)
    y = qemu_q.qlinear_matmul(a, one, np.int8(0), b, one, np.int8(0), np.float32(256.0),
                              np.int8(0), datapath=datapath)
    assert y.tolist() == [[round(want / 256)]]  # 88.93... -> 89
    y = qemu_q.qlinear_conv(x, one, np.int8(0), w, one, np.int8(0), np.float32(256.0),
                            np.int8(0), datapath=datapath)
    assert y.reshape(-1).tolist() == [89]


def test_datapath_refusals_in_the_integer_ops():
    a, b = np.ones((1, 2), np.int8), np.ones((2, 1), np.int8)
    with pytest.raises(ValueError, match="MatMulInteger: datapath rounding='half_away'"):
        qemu_q.matmul_integer(a, b, datapath=qemu_q.Datapath(rounding="half_away"))
    with pytest.raises(ValueError, match="accumulator='int24' and datapath accumulator='int16'"):
        qemu_q.matmul_integer(a, b, accumulator="int24", datapath=qemu_q.Datapath(accumulator="int16"))
    with pytest.raises(TypeError, match="expected a qemu_q.Datapath"):
        qemu_q.conv_integer(a.reshape(1, 2, 1, 1), b.reshape(1, 2, 1, 1), datapath="int16")
    with pytest.raises(ValueError, match="Datapath: accumulator='int99'"):
        qemu_q.Datapath(accumulator="int99")
    # the same accumulator given both ways is no conflict
    same = qemu_q.matmul_integer(a, b, accumulator="int16", datapath=qemu_q.Datapath(accumulator="int16"))
    assert same.tolist() == [[2]]


def test_quantize_linear_ignores_the_accumulator():
    x = np.float32([1.5, 2.5, -0.5])
    plain = qemu_q.quantize_linear(x, np.float32(1.0), np.int8(0))
    with_acc = qemu_q.quantize_linear(x, np.float32(1.0), np.int8(0),
                                      datapath=qemu_q.Datapath(accumulator="int16-saturate"))
    assert plain.tolist() == with_acc.tolist() == [2, 2, 0]
