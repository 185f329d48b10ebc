"""qemu_q.Datapath in the integer ops (docs/semantics.md, "Datapath options", "which op
reads which option"): its accumulator is theirs; the QLinear ops also read requantization,
rounding (of the rule's value to the output), nan_to_integer and nan, and refuse scale,
scale_precision, subnormals and stochastic rounding; MatMulInteger and ConvInteger ignore
everything but the accumulator. Oracles: exact Fractions (tests/datapath_oracle.py's
rounding table), written from the docs, not from the kernels."""

import ml_dtypes
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


# --- the QLinear ops' datapath options -------------------------------------------------------

from fractions import Fraction  # noqa: E402

import datapath_oracle as do  # noqa: E402

MODES = ("half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd")
INT8 = (-128, 127)


def fl32(v: Fraction) -> Fraction:
    return do.round_nearest_even_to(v, "float32")


def fl64(v: Fraction) -> Fraction:
    return do.round_nearest_even_to(v, "float64")


def round_mode(v: Fraction, mode: str) -> int:
    """v rounded to an integer by the mode (the rounding table of docs/semantics.md)."""
    negative = v < 0
    n = do.round_magnitude(*do.split(abs(v), 0), negative, mode, 0)
    return -n if negative else n


def oracle_code(acc: int, sa: float, sb: float, sy: float, zp: int, rule: str, mode: str) -> int:
    """One output of the QLinear ops' requantization rules (docs/semantics.md,
    "Requantization rules") with the datapath's rounding in place of ties-to-even."""
    sa, sb, sy = (Fraction(float(np.float32(s))) for s in (sa, sb, sy))  # the float32 scales
    if rule == "exact":
        r = round_mode(acc * sa * sb / sy, mode) + zp
    elif rule == "float32":
        m = fl32(fl32(sa * sb) / sy)
        r = round_mode(fl32(fl32(Fraction(acc)) * m), mode) + zp
    else:  # "float64" with float32 scales: the multiplier in float32, then zp added in float64
        m = fl32(fl32(sa * sb) / sy)
        r = round_mode(fl64(fl64(acc * m) + zp), mode)
    return min(max(r, INT8[0]), INT8[1])


A_CODES = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
B_CODES = np.array([[1, -3, 7, 127, -128]], np.int8)


@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
@pytest.mark.parametrize("mode", MODES)
def test_qlinear_matmul_rounding_of_the_requantized_result(rule, mode):
    # y_scale 4 and 10 put many accumulators on ties (acc / 4 = k + 1/2) and in between;
    # per-column b_scales run the element loop, a shared one the row loop; an odd zero
    # point tells the float64 rule's order (zero point added before rounding).
    zp = 3
    for b_scale, y_scale in ((np.float32(1.0), np.float32(4.0)),
                             (np.float32([1.0, 0.5, 0.25, 0.1, 3.0]), np.float32(10.0))):
        datapath = qemu_q.Datapath(rounding=mode, requantization=rule)
        for threads in (1, 2):
            b_zp = np.zeros(b_scale.shape, np.int8)
            y = qemu_q.qlinear_matmul(A_CODES, np.float32(1.0), np.int8(0), B_CODES, b_scale, b_zp,
                                      y_scale, np.int8(zp), datapath=datapath, n_threads=threads)
            sb = np.broadcast_to(b_scale, (5,))
            want = [[oracle_code(int(a) * int(b), 1.0, float(sb[j]), float(y_scale), zp, rule, mode)
                     for j, b in enumerate(B_CODES[0])] for a in A_CODES[:, 0]]
            assert y.view(np.uint8).tolist() == np.array(want, np.int8).view(np.uint8).tolist()


@pytest.mark.parametrize("mode", ["half_away", "down", "to_odd"])
def test_qlinear_conv_rounding_of_the_requantized_result(mode):
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 16, 16)
    w = np.array([1, 3], np.int8).reshape(2, 1, 1, 1)
    bias = np.array([0, 1], np.int32)
    w_scale = np.float32([0.5, 0.125])
    w_zp = np.zeros(2, np.int8)
    for rule in ("exact", "float32", "float64"):
        for threads in (1, 2):
            y = qemu_q.qlinear_conv(x, np.float32(1.0), np.int8(0), w, w_scale, w_zp, np.float32(1.0),
                                    np.int8(-1), bias, datapath=qemu_q.Datapath(rounding=mode),
                                    requantization=rule, n_threads=threads)
            want = [[oracle_code(int(v) * int(w[c, 0, 0, 0]) + int(bias[c]), float(w_scale[c]), 1.0, 1.0,
                                 -1, rule, mode) for v in x.reshape(-1)] for c in range(2)]
            assert y.reshape(2, 256).view(np.uint8).tolist() == np.array(want, np.int8).view(np.uint8).tolist()


@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
def test_qlinear_nan_to_integer(rule):
    # y_scale 0: 0 / 0 is NaN (the code nan_to_integer names), +-acc / 0 is +-inf (saturated).
    a = np.array([[0], [2], [-2]], np.int8)
    b = np.ones((1, 1), np.int8)
    zp = np.int8(5)
    for nan_rule, nan_code in (("min", -128), ("zero", 5), ("max", 127)):
        datapath = qemu_q.Datapath(nan_to_integer=nan_rule)
        y = qemu_q.qlinear_matmul(a, np.float32(1.0), np.int8(0), b, np.float32(1.0), np.int8(0),
                                  np.float32(0.0), zp, datapath=datapath, requantization=rule)
        assert y.ravel().tolist() == [nan_code, 127, -128]
        x = a.reshape(1, 3, 1, 1)[:, :1]
        y = qemu_q.qlinear_conv(x, np.float32(1.0), np.int8(0), b.reshape(1, 1, 1, 1), np.float32(1.0),
                                np.int8(0), np.float32(0.0), zp, datapath=datapath, requantization=rule)
        assert y.ravel().tolist() == [nan_code]


def test_qlinear_float8_output_takes_the_rounding_and_nan():
    # QLinearMatMul-21, float8e4m3fn y: the exact value acc / 16 rounded by the mode to
    # e4m3fn (saturate=1), as QuantizeLinear would round it.
    a = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
    b = np.array([[1, 37]], np.int8)
    zp = np.zeros((), ml_dtypes.float8_e4m3fn)
    for mode in ("half_away", "toward_zero", "up", "to_odd"):
        y = qemu_q.qlinear_matmul(a, np.float32(1.0), np.int8(0), b, np.float32(1.0), np.int8(0),
                                  np.float32(16.0), zp, opset=21, datapath=qemu_q.Datapath(rounding=mode))
        want = []
        for v in a[:, 0]:
            for c in b[0]:
                q = Fraction(int(v) * int(c), 16)
                want.append(do.to_small_float(q, q < 0, "float8_e4m3fn", {"rounding": mode}, 0, 1, 21))
        assert y.view(np.uint8).ravel().tolist() == want
    # y_scale 0: 0 / 0 is NaN; "canonical" writes NVIDIA's one NaN code 0x7F whatever its sign
    zero_acc = np.zeros((1, 1), np.int8)
    import platform

    spec_nan = (0xFF,) if platform.machine() in ("x86_64", "AMD64") else (0x7F, 0xFF)  # x86: negative
    for nan, allowed in (("spec", spec_nan), ("canonical", (0x7F,))):
        y = qemu_q.qlinear_matmul(zero_acc, np.float32(1.0), np.int8(0), zero_acc, np.float32(1.0), np.int8(0),
                                  np.float32(0.0), zp, opset=21, datapath=qemu_q.Datapath(nan=nan))
        assert int(y.view(np.uint8)[0, 0]) in allowed


def test_the_datapath_requantization_is_the_argument():
    a = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
    b = np.array([[3, -7]], np.int8)
    args = (np.float32(0.01), np.int8(0), b, np.float32(0.3), np.int8(0), np.float32(0.07), np.int8(1))
    for rule in ("exact", "float32", "float64"):
        by_argument = qemu_q.qlinear_matmul(a, *args, requantization=rule)
        by_datapath = qemu_q.qlinear_matmul(a, *args, datapath=qemu_q.Datapath(requantization=rule))
        assert by_argument.view(np.uint8).tolist() == by_datapath.view(np.uint8).tolist()
        want = [[oracle_code(int(v) * int(c), 0.01, 0.3, 0.07, 1, rule, "half_even") for c in b[0]]
                for v in a[:, 0]]
        assert by_datapath.view(np.uint8).tolist() == np.array(want, np.int8).view(np.uint8).tolist()
    # the rules differ here (the odd zero point added before or after rounding ties), so
    # the datapath's rule is really the one in force
    ties = (np.float32(1.0), np.int8(0), b, np.float32(1.0), np.int8(0), np.float32(2.0), np.int8(1))
    got = {rule: qemu_q.qlinear_matmul(a, *ties, datapath=qemu_q.Datapath(requantization=rule)).tolist()
           for rule in ("exact", "float64")}
    assert got["exact"] != got["float64"]
    for rule, y in got.items():
        assert y == [[oracle_code(int(v) * int(c), 1.0, 1.0, 2.0, 1, rule, "half_even") for c in b[0]]
                     for v in a[:, 0]]
    # the same rule both ways is no conflict; a different one is
    qemu_q.qlinear_matmul(a, *args, requantization="float32", datapath=qemu_q.Datapath(requantization="float32"))
    with pytest.raises(ValueError, match="requantization='float64' and datapath requantization='float32'"):
        qemu_q.qlinear_matmul(a, *args, requantization="float64",
                              datapath=qemu_q.Datapath(requantization="float32"))
    x = a.reshape(1, 256, 1, 1)[:, :1]
    with pytest.raises(ValueError, match="QLinearConv: requantization='float32' and datapath"):
        qemu_q.qlinear_conv(x, np.float32(1.0), np.int8(0), np.ones((1, 1, 1, 1), np.int8), np.float32(1.0),
                            np.int8(0), np.float32(1.0), np.int8(0), requantization="float32",
                            datapath=qemu_q.Datapath(requantization="exact"))


def test_matmul_integer_and_conv_integer_ignore_the_steps_they_lack():
    a = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    b = np.arange(127, -129, -1, dtype=np.int16).astype(np.int8).reshape(16, 16)
    want = (a.astype(np.int64) @ b.astype(np.int64)).tolist()  # |sum| < 2**31: no wrap
    x, w = a.reshape(1, 1, 16, 16), b[:2].reshape(2, 1, 1, 16)
    conv_plain = qemu_q.conv_integer(x, w)
    for datapath in (qemu_q.Datapath(rounding="stochastic"), qemu_q.Datapath(rounding="half_away"),
                     qemu_q.Datapath(scale="reciprocal", scale_precision="float32"),
                     qemu_q.Datapath(nan="canonical", nan_to_integer="max", subnormals="flush_both"),
                     qemu_q.Datapath(requantization="float32")):
        assert qemu_q.matmul_integer(a, b, datapath=datapath).tolist() == want
        assert qemu_q.conv_integer(x, w, datapath=datapath).tolist() == conv_plain.tolist()


@pytest.mark.parametrize("field,value", [("scale", "reciprocal"), ("scale_precision", "float32"),
                                         ("subnormals", "flush_inputs"), ("rounding", "stochastic")])
def test_qlinear_refuses_the_options_it_does_not_implement(field, value):
    kwargs = {field: value}
    if field == "scale":
        kwargs["scale_precision"] = "float64"
    datapath = qemu_q.Datapath(**kwargs)
    one, zero = np.float32(1.0), np.int8(0)
    a = np.ones((1, 1), np.int8)
    with pytest.raises(ValueError, match=f"QLinearMatMul: datapath {field}={value!r}"):
        qemu_q.qlinear_matmul(a, one, zero, a, one, zero, one, zero, datapath=datapath)
    x = a.reshape(1, 1, 1, 1)
    with pytest.raises(ValueError, match=f"QLinearConv: datapath {field}={value!r}"):
        qemu_q.qlinear_conv(x, one, zero, x, one, zero, one, zero, datapath=datapath)


def test_qlinear_scale_precision_float32_agrees_with_the_float32_rule():
    a = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
    b = np.array([[3, -7]], np.int8)
    args = (np.float32(0.01), np.int8(0), b, np.float32(0.3), np.int8(0), np.float32(0.07), np.int8(1))
    agreed = qemu_q.Datapath(requantization="float32", scale_precision="float32")
    y = qemu_q.qlinear_matmul(a, *args, datapath=agreed)
    assert y.tolist() == [[oracle_code(int(v) * int(c), 0.01, 0.3, 0.07, 1, "float32", "half_even") for c in b[0]]
                          for v in a[:, 0]]
    for rule in ("exact", "float64"):
        with pytest.raises(ValueError, match="QLinearMatMul: datapath scale_precision='float32'"):
            qemu_q.qlinear_matmul(a, *args, requantization=rule,
                                  datapath=qemu_q.Datapath(scale_precision="float32"))
