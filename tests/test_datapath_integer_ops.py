"""qemu_q.Datapath in the integer ops (docs/semantics.md, "Datapath options", "which op
reads which option"): its accumulator is theirs; the QLinear ops also read requantization,
rounding (of the rule's value to the output, stochastic included), nan_to_integer, nan,
scale, scale_precision and subnormals; MatMulInteger and ConvInteger ignore
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
    # an explicit "int32" is given too: refused beside another datapath accumulator, not
    # overridden by it (it had been the argument's default, indistinguishable from absent)
    with pytest.raises(ValueError, match="MatMulInteger: accumulator='int32' and datapath accumulator='int16-saturate'"):
        qemu_q.matmul_integer(a, b, accumulator="int32", datapath=qemu_q.Datapath(accumulator="int16-saturate"))
    with pytest.raises(ValueError, match="ConvInteger: accumulator='int32' and datapath accumulator='int24'"):
        qemu_q.conv_integer(a.reshape(1, 2, 1, 1), b.reshape(1, 2, 1, 1), accumulator="int32",
                            datapath=qemu_q.Datapath(accumulator="int24"))
    # a datapath at its default accumulator names none: the argument decides
    wide = np.full((1, 3), 120, np.int8), np.full((3, 1), 120, np.int8)
    assert qemu_q.matmul_integer(*wide, accumulator="int16", datapath=qemu_q.Datapath()).tolist() == [[43200 - 65536]]
    assert qemu_q.matmul_integer(*wide, accumulator=None).tolist() == [[43200]]


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
    # an explicit "exact" is given too (None is the argument's default, not "exact")
    with pytest.raises(ValueError, match="QLinearMatMul: requantization='exact' and datapath requantization='float64'"):
        qemu_q.qlinear_matmul(a, *ties, requantization="exact", datapath=qemu_q.Datapath(requantization="float64"))
    with pytest.raises(ValueError, match="QLinearMatMul: accumulator='int32' and datapath accumulator='int16'"):
        qemu_q.qlinear_matmul(a, *ties, accumulator="int32", datapath=qemu_q.Datapath(accumulator="int16"))
    assert qemu_q.qlinear_matmul(a, *ties, requantization=None, datapath=qemu_q.Datapath()).tolist() == got["exact"]
    assert qemu_q.qlinear_matmul(a, *ties, requantization="float64",
                                 datapath=qemu_q.Datapath(rounding="half_even")).tolist() == got["float64"]
    x = a.reshape(1, 256, 1, 1)[:, :1]
    with pytest.raises(ValueError, match="QLinearConv: requantization='exact' and datapath"):
        qemu_q.qlinear_conv(x, np.float32(1.0), np.int8(0), np.ones((1, 1, 1, 1), np.int8), np.float32(1.0),
                            np.int8(0), np.float32(1.0), np.int8(0), requantization="exact",
                            datapath=qemu_q.Datapath(requantization="float32"))
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


def test_qlinear_scale_precision_float32_agrees_with_the_float32_rule():
    a = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
    b = np.array([[3, -7]], np.int8)
    args = (np.float32(0.01), np.int8(0), b, np.float32(0.3), np.int8(0), np.float32(0.07), np.int8(1))
    agreed = qemu_q.Datapath(requantization="float32", scale_precision="float32")
    y = qemu_q.qlinear_matmul(a, *args, datapath=agreed)
    assert y.tolist() == [[oracle_code(int(v) * int(c), 0.01, 0.3, 0.07, 1, "float32", "half_even") for c in b[0]]
                          for v in a[:, 0]]
    # the float32 rule multiplies in float32: a float64 multiplier is refused with it
    for op in ("matmul", "conv"):
        with pytest.raises(ValueError, match="scale_precision='float64' with the 'float32' requantization rule"):
            qlinear(op, np.ones((1, 1), np.int8), 1.0, 1.0, 1.0, 0, requantization="float32",
                    datapath=qemu_q.Datapath(scale_precision="float64"))


# --- the multiplier (scale, scale_precision), subnormals and stochastic rounding -------------

def round_with(v: Fraction, mode: str, word: int) -> int:
    negative = v < 0
    n = do.round_magnitude(*do.split(abs(v), 0), negative, mode, word)
    return -n if negative else n


def multiplier_oracle(sa: Fraction, sb: Fraction, sy: Fraction, scale: str, precision: str) -> Fraction:
    """docs/semantics.md, "The integer ops under a datapath": divide
    round_P(round_P(sa * sb) / sy), reciprocal round_P(round_P(sa * sb) * round_P(1 / sy))."""
    rp = fl32 if precision == "float32" else fl64
    p = rp(sa * sb)
    if scale == "divide":
        return rp(p / sy)
    return rp(p * rp(1 / sy))


def datapath_code(acc: int, sa, sb, sy, zp: int, rule: str, mode: str, scale=None, precision=None,
                  word: int = 0) -> int:
    """One integer output (int8) under the rule, the datapath's multiplier (precision None:
    the rule's own) and rounding mode, with the output's word for "stochastic"."""
    sa, sb, sy = (Fraction(float(np.float32(s))) for s in (sa, sb, sy))
    if precision is None:
        if rule == "exact":
            v = acc * sa * sb / sy
        else:
            m = fl32(fl32(sa * sb) / sy)
    else:
        m = multiplier_oracle(sa, sb, sy, scale, precision)
        if rule == "exact":
            v = acc * m
    if rule == "exact":
        r = round_with(v, mode, word) + zp
    elif rule == "float32":
        r = round_with(fl32(fl32(Fraction(acc)) * m), mode, word) + zp
    else:
        r = round_with(fl64(fl64(acc * m) + zp), mode, word)
    return min(max(r, INT8[0]), INT8[1])


def qlinear(op: str, a: np.ndarray, sa, sb, sy, zp, b=None, **kw) -> np.ndarray:
    """QLinearMatMul of a [M, 1] by b [1, N] (default [[1]]), or the same products as a
    QLinearConv of a 1x1 kernel (N output channels, M positions), as y [M, N] int8."""
    b = np.ones((1, 1), np.int8) if b is None else b
    one = np.int8(0)
    sb_arr = np.float32(sb)
    if op == "matmul":
        b_zp = np.zeros(sb_arr.shape, np.int8)
        return qemu_q.qlinear_matmul(a, np.float32(sa), one, b, sb_arr, b_zp, np.float32(sy), np.int8(zp), **kw)
    x = np.ascontiguousarray(a.reshape(1, 1, a.shape[0], 1))
    w = np.ascontiguousarray(b.T.reshape(b.shape[1], 1, 1, 1))
    if "random_bits" in kw and kw["random_bits"] is not None:
        kw["random_bits"] = np.ascontiguousarray(kw["random_bits"].T.reshape(1, b.shape[1], a.shape[0], 1))
    w_zp = np.zeros(sb_arr.shape, np.int8)
    y = qemu_q.qlinear_conv(x, np.float32(sa), one, w, sb_arr, w_zp, np.float32(sy), np.int8(zp), **kw)
    return y.reshape(b.shape[1], a.shape[0]).T


# Scale sets whose multipliers differ by precision and by divide / reciprocal at exact ties
# (asserted below), so that the kernel's choice is visible; per-column b scales run the
# element loop. Set 1: sa * sb / sy = 15/16 exactly in column 0 (acc = 8 mod 16 are ties),
# fl32(1 / sy) puts the float32 reciprocal's m above 15/16, fl64(1 / sy) the float64 one
# below. Set 2: sa * sb = 1 - 2**-30 is 1 in float32, so m = 1/2 (odd acc are ties) in
# float32 and just below in float64.
SY1 = 1.5543136596679688
SCALE_SETS = [(1.0, np.float32([SY1 * 15 / 16, 0.3, 1.1, 0.013, 3.0]), SY1),
              (1.0 + 2.0 ** -15, np.float32([1.0 - 2.0 ** -15, 0.7, 0.1, 1.0, 2.5]), 2.0)]
SA, SB, SY = 0.1, np.float32([0.3, 0.7, 1.1, 0.013, 3.0]), 0.7
MULTIPLIERS = [("divide", "float32"), ("reciprocal", "float32"), ("divide", "float64"),
               ("reciprocal", "float64")]


def test_the_chosen_scales_tell_the_multipliers_apart():
    assert float(np.float32(SY1 * 15 / 16)) == SY1 * 15 / 16  # exact: 20 significant bits
    tables = {k: [[[datapath_code(int(v) * int(c), sa, float(sb_j), sy, 3, "exact", "half_even", *k)
                    for c, sb_j in zip(B_CODES[0], sb)] for v in A_CODES[:, 0]] for sa, sb, sy in SCALE_SETS]
              for k in MULTIPLIERS}
    assert len({str(t) for t in tables.values()}) == 4  # four different answers


@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
@pytest.mark.parametrize("scale,precision", MULTIPLIERS)
def test_qlinear_multiplier_by_the_datapath(rule, scale, precision):
    datapath = qemu_q.Datapath(scale=scale, scale_precision=precision, requantization=rule)
    if rule == "float32" and precision == "float64":
        with pytest.raises(ValueError, match="QLinearMatMul: datapath scale_precision='float64'"):
            qlinear("matmul", A_CODES, SA, SB, SY, 3, B_CODES, datapath=datapath)
        return
    # two of the three modes per case, in turn (each pair of cases covers all three)
    modes = ("half_even", "half_away", "down")
    start = (MULTIPLIERS.index((scale, precision)) + ["exact", "float32", "float64"].index(rule)) % 3
    for mode in (modes[start], modes[(start + 1) % 3]):
        dp_mode = qemu_q.Datapath(scale=scale, scale_precision=precision, requantization=rule, rounding=mode)
        for sa, sb_all, sy in SCALE_SETS + [(SA, SB, SY)]:
            for sb in (sb_all, np.float32(sb_all[0])):
                sbs = np.broadcast_to(sb, (5,))
                want = [[datapath_code(int(v) * int(c), sa, float(sbs[j]), sy, 3, rule, mode, scale,
                                       precision) for j, c in enumerate(B_CODES[0])] for v in A_CODES[:, 0]]
                for op in ("matmul", "conv"):
                    for threads in (1, 3):
                        y = qlinear(op, A_CODES, sa, sb, sy, 3, B_CODES, datapath=dp_mode, n_threads=threads)
                        assert y.tolist() == want, (op, mode, threads, sb.shape, sa, sy)


def test_qlinear_multiplier_extremes():
    # A zero multiplier (float32 underflow of sa * sb) gives the zero point; an infinite one
    # (1 / y_scale overflowing float32) saturates by the sign of acc, and 0 * inf is NaN
    # (nan_to_integer); float64 keeps both finite.
    a = np.array([[-3], [0], [5]], np.int8)
    tiny = float(np.float32(2.0 ** -100))
    for rule in ("exact", "float64"):
        y = qlinear("matmul", a, tiny, tiny, 1.0, 7, datapath=qemu_q.Datapath(
            scale_precision="float32", requantization=rule, nan_to_integer="max"))
        assert y.ravel().tolist() == [7, 7, 7]
        y = qlinear("matmul", a, 1.0, 1.0, 2.0 ** -140, 7, datapath=qemu_q.Datapath(
            scale="reciprocal", scale_precision="float32", requantization=rule, nan_to_integer="zero"))
        assert y.ravel().tolist() == [-128, 7, 127]
        y = qlinear("matmul", a, 1.0, 1.0, 2.0 ** -140, 7, datapath=qemu_q.Datapath(
            scale="reciprocal", scale_precision="float64", requantization=rule))
        assert y.ravel().tolist() == [-128, 7, 127]  # finite, huge: saturated; 0 -> zp
    # a 21-bit accumulator times a 24- or 53-bit multiplier: the exact product, rounded once
    acc_a = np.full((1, 64), 127, np.int8)
    acc_b = np.full((64, 1), 127, np.int8)
    sy = float(np.float32(127 * 127 * 64 / 100.5))
    for precision in ("float32", "float64"):
        for scale in ("divide", "reciprocal"):
            y = qemu_q.qlinear_matmul(acc_a, np.float32(1.0), np.int8(0), acc_b, np.float32(1.0), np.int8(0),
                                      np.float32(sy), np.int8(0), datapath=qemu_q.Datapath(
                                          scale=scale, scale_precision=precision, rounding="half_away"))
            want = datapath_code(127 * 127 * 64, 1.0, 1.0, sy, 0, "exact", "half_away", scale, precision)
            assert y.tolist() == [[want]]


@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
def test_qlinear_stochastic_rounding_with_random_bits(rule):
    rng = np.random.default_rng(15)
    for op in ("matmul", "conv"):
        words = rng.integers(0, 2**32, size=(256, 5), dtype=np.uint32)
        for multiplier in ((None, None), ("reciprocal", "float32")):
            datapath = qemu_q.Datapath(rounding="stochastic", requantization=rule, scale=multiplier[0] or "divide",
                                       scale_precision=multiplier[1])
            want = [[datapath_code(int(v) * int(c), SA, float(SB[j]), SY, 3, rule, "stochastic", *multiplier,
                                   word=int(words[i, j]))
                     for j, c in enumerate(B_CODES[0])] for i, v in enumerate(A_CODES[:, 0])]
            for threads in (1, 2, 3):
                y = qlinear(op, A_CODES, SA, SB, SY, 3, B_CODES, datapath=datapath, random_bits=words,
                            n_threads=threads)
                assert y.tolist() == want, (op, multiplier, threads)
    # the word is a 32-bit fraction of the output's unit: acc / 4 = k + 1/4 rounds up
    # exactly when the word is >= 0xC0000000
    a = np.full((4, 1), 5, np.int8)
    words = np.array([[0xBFFFFFFF], [0xC0000000], [0], [0xFFFFFFFF]], np.uint32)
    y = qlinear("matmul", a, 1.0, 1.0, 4.0, 0, random_bits=words,
                datapath=qemu_q.Datapath(rounding="stochastic", requantization=rule))
    assert y.ravel().tolist() == [1, 2, 1, 2]


def test_qlinear_stochastic_batched_words_follow_y():
    # a batched matmul with per-column, per-batch b scales runs one kernel call per item:
    # each takes its own slice of the words (y's C order)
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, size=(3, 4, 6), dtype=np.int8)
    b = rng.integers(-128, 128, size=(3, 6, 5), dtype=np.int8)
    b_scale = np.float32([0.3, 0.7, 1.1, 0.013, 3.0])
    words = rng.integers(0, 2**32, size=(3, 4, 5), dtype=np.uint32)
    y = qemu_q.qlinear_matmul(a, np.float32(0.1), np.int8(0), b, b_scale, np.zeros(5, np.int8), np.float32(0.7),
                              np.int8(-2), datapath=qemu_q.Datapath(rounding="stochastic"), random_bits=words)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    want = [[[datapath_code(int(acc[t, i, j]), 0.1, float(b_scale[j]), 0.7, -2, "exact", "stochastic",
                            word=int(words[t, i, j])) for j in range(5)] for i in range(4)] for t in range(3)]
    assert y.tolist() == want


def test_qlinear_random_bits_checks():
    a = np.ones((2, 1), np.int8)
    sto = qemu_q.Datapath(rounding="stochastic")
    for op in ("matmul", "conv"):
        with pytest.raises(ValueError, match="needs random_bits=, a uint32 array of y's shape"):
            qlinear(op, a, 1.0, 1.0, 1.0, 0, datapath=sto)
        with pytest.raises(ValueError, match="random_bits is given but datapath.rounding='half_even'"):
            qlinear(op, a, 1.0, 1.0, 1.0, 0, random_bits=np.zeros((2, 1), np.uint32))
        with pytest.raises(TypeError, match="random_bits must be a numpy uint32 array, got int64"):
            qlinear(op, a, 1.0, 1.0, 1.0, 0, datapath=sto, random_bits=np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match=r"random_bits has shape \(2,\); y has shape \(2, 1\)"):
        qlinear("matmul", a, 1.0, 1.0, 1.0, 0, datapath=sto, random_bits=np.zeros(2, np.uint32))
    x = np.ones((1, 1, 2, 1), np.int8)
    with pytest.raises(ValueError, match=r"random_bits has shape \(2, 1\); y has shape \(1, 1, 2, 1\)"):
        qemu_q.qlinear_conv(x, np.float32(1.0), np.int8(0), np.ones((1, 1, 1, 1), np.int8), np.float32(1.0),
                            np.int8(0), np.float32(1.0), np.int8(0), datapath=sto,
                            random_bits=np.zeros((2, 1), np.uint32))
    # the caller's words are read, never written
    words = np.arange(2, dtype=np.uint32).reshape(2, 1) * np.uint32(0x7FFFFFFF)
    before = words.copy()
    qlinear("matmul", a, 1.0, 1.0, 3.0, 0, datapath=sto, random_bits=words)
    assert words.tolist() == before.tolist()


def test_qlinear_subnormal_scales_flush():
    a = np.array([[-100], [0], [100]], np.int8)
    sub = float(np.float32(1e-39))  # float32 subnormal
    for rule in ("exact", "float32", "float64"):
        for flush in ("flush_inputs", "flush_both"):
            datapath = qemu_q.Datapath(subnormals=flush, requantization=rule)
            for op in ("matmul", "conv"):
                # a_scale (or x_scale) flushed: multiplier 0, every output the zero point
                assert qlinear(op, a, sub, 1.0, 1.0, 7, datapath=datapath).ravel().tolist() == [7, 7, 7]
                # y_scale flushed: +-acc / 0 saturates, 0 / 0 is NaN (nan_to_integer "min")
                assert qlinear(op, a, 1.0, 1.0, sub, 7, datapath=datapath).ravel().tolist() == [-128, -128, 127]
                # kept: a subnormal a_scale times a large b_scale is a normal multiplier
                kept = qlinear(op, a, sub, 2.0 ** 127, 1.0, 7, datapath=qemu_q.Datapath(requantization=rule))
                assert kept.ravel().tolist() == [datapath_code(int(v), sub, 2.0 ** 127, 1.0, 7, rule, "half_even")
                                                 for v in a[:, 0]]
                assert kept.ravel().tolist() != [7, 7, 7]
    # float16 scales (QLinearMatMul-21) flush below float16's smallest normal, 2**-14
    h = np.float16(2.0 ** -15)
    a3 = np.array([[-3], [0], [5]], np.int8)
    y = qemu_q.qlinear_matmul(a3, h, np.int8(0), np.ones((1, 1), np.int8), np.float16(32768.0), np.int8(0),
                              np.float16(1.0), np.int8(7), opset=21, datapath=qemu_q.Datapath(subnormals="flush_inputs"))
    assert y.ravel().tolist() == [7, 7, 7]
    y = qemu_q.qlinear_matmul(a3, h, np.int8(0), np.ones((1, 1), np.int8), np.float16(32768.0), np.int8(0),
                              np.float16(1.0), np.int8(7), opset=21)
    assert y.ravel().tolist() == [4, 7, 12]  # kept: the multiplier is 2**-15 * 2**15 = 1
    # flush_outputs changes no integer output
    y = qlinear("matmul", a, sub, 2.0 ** 127, 1.0, 7, datapath=qemu_q.Datapath(subnormals="flush_outputs"))
    assert y.ravel().tolist() == [datapath_code(int(v), sub, 2.0 ** 127, 1.0, 7, "exact", "half_even")
                                  for v in a[:, 0]]


def test_qlinear_float8_output_flush_and_stochastic():
    # QLinearMatMul-21 into float8e4m3fn: acc / 2**12 puts results among e4m3fn's
    # subnormals (below 2**-6), flushed to zeros of their sign after rounding.
    a = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
    b = np.array([[1, 3]], np.int8)
    zp = np.zeros((), ml_dtypes.float8_e4m3fn)
    for subnormals in ("flush_outputs", "flush_both", "keep"):
        for rule in ("exact", "float32", "float64"):
            y = qemu_q.qlinear_matmul(a, np.float32(1.0), np.int8(0), b, np.float32(1.0), np.int8(0),
                                      np.float32(4096.0), zp, opset=21, requantization=rule,
                                      datapath=qemu_q.Datapath(subnormals=subnormals, rounding="up"))
            want = []
            for v in a[:, 0]:
                for c in b[0]:
                    q = Fraction(int(v) * int(c), 4096)
                    want.append(do.to_small_float(q, q < 0, "float8_e4m3fn",
                                                  {"rounding": "up", "subnormals": subnormals}, 0, 1, 21))
            assert y.view(np.uint8).ravel().tolist() == want, (subnormals, rule)
    # stochastic into float8: the float32 rule's value, the word aligned on its dropped bits
    words = np.random.default_rng(4).integers(0, 2**32, size=(256, 2), dtype=np.uint32)
    sy = 0.37
    for threads in (1, 3):
        y = qemu_q.qlinear_matmul(a, np.float32(1.0), np.int8(0), b, np.float32(1.0), np.int8(0),
                                  np.float32(sy), zp, opset=21, requantization="float32", n_threads=threads,
                                  datapath=qemu_q.Datapath(rounding="stochastic"), random_bits=words)
        m = fl32(Fraction(1) / Fraction(float(np.float32(sy))))  # fl32(fl32(1 * 1) / sy)
        want = []
        for i, v in enumerate(a[:, 0]):
            for j, c in enumerate(b[0]):
                q = fl32(fl32(Fraction(int(v) * int(c))) * m)
                want.append(do.to_small_float(q, q < 0, "float8_e4m3fn", {"rounding": "stochastic"},
                                              int(words[i, j]), 1, 21))
        assert y.view(np.uint8).ravel().tolist() == want
    # the "exact" and "float64" rules: tests/test_qlinear_float8_stochastic.py


def test_qlinear_float8_operands_take_the_datapath_multiplier():
    # QLinearMatMul-21 with float8e4m3fn a: the exact sum S times the datapath's multiplier
    a = np.arange(0, 256, 3, dtype=np.uint8)[:80].view(ml_dtypes.float8_e4m3fn).reshape(80, 1)
    a = np.where(np.isfinite(a.astype(np.float32)), a, np.zeros_like(a)).astype(ml_dtypes.float8_e4m3fn)
    b = np.array([[1, -3]], np.int8)
    zp8 = np.zeros((), ml_dtypes.float8_e4m3fn)
    for rule in ("exact", "float64", "float32"):
        for scale, precision in (("reciprocal", "float32"), ("divide", "float64")):
            if rule == "float32" and precision == "float64":
                continue
            for mode in ("half_even", "stochastic"):
                words = np.random.default_rng(9).integers(0, 2**32, size=(80, 2), dtype=np.uint32) \
                    if mode == "stochastic" else None
                y = qemu_q.qlinear_matmul(a, np.float32(SA), zp8, b, np.float32(1.3), np.int8(0), np.float32(SY),
                                          np.int8(1), opset=21, requantization=rule, random_bits=words,
                                          datapath=qemu_q.Datapath(scale=scale, scale_precision=precision,
                                                                   rounding=mode))
                want = []
                for i, v in enumerate(a[:, 0]):
                    for j, c in enumerate(b[0]):
                        s = Fraction(float(v.astype(np.float32))) * int(c)
                        m = multiplier_oracle(Fraction(float(np.float32(SA))), Fraction(float(np.float32(1.3))),
                                              Fraction(float(np.float32(SY))), scale, precision)
                        word = int(words[i, j]) if words is not None else 0
                        if rule == "exact":
                            r = round_with(s * m, mode, word) + 1
                        elif rule == "float32":
                            r = round_with(fl32(fl32(s) * m), mode, word) + 1
                        else:
                            r = round_with(fl64(fl64(fl64(s) * m) + 1), mode, word)
                        want.append(min(max(r, -128), 127))
                assert y.ravel().tolist() == want, (rule, scale, precision, mode)


def test_qlinear_options_same_bits_on_every_level_and_thread_count():
    from qemu_q import _kernels

    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, size=(37, 29), dtype=np.int8)
    b = rng.integers(-128, 128, size=(29, 23), dtype=np.int8)
    words = rng.integers(0, 2**32, size=(37, 23), dtype=np.uint32)
    datapaths = [qemu_q.Datapath(rounding="stochastic", scale="reciprocal", scale_precision="float32"),
                 qemu_q.Datapath(rounding="stochastic", requantization="float64", subnormals="flush_both"),
                 qemu_q.Datapath(scale="reciprocal", scale_precision="float64", rounding="to_odd")]
    level = _kernels.active.level
    runs = {}
    try:
        for lv in _kernels.available_levels():
            _kernels.use(lv)
            for n in (1, 2, 3):
                for k, datapath in enumerate(datapaths):
                    bits = words if datapath.rounding == "stochastic" else None
                    y = qemu_q.qlinear_matmul(a, np.float32(0.02), np.int8(1), b, np.float32(0.05), np.int8(-2),
                                              np.float32(0.9), np.int8(3), n_threads=n, datapath=datapath,
                                              random_bits=bits)
                    runs.setdefault(k, []).append(y.tobytes())
    finally:
        _kernels.use(level)
    for k, results in runs.items():
        assert all(r == results[0] for r in results), datapaths[k]


def test_qlinear_default_datapath_changes_no_bit():
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, size=(17, 9), dtype=np.int8)
    b = rng.integers(-128, 128, size=(9, 11), dtype=np.int8)
    args = (np.float32(0.02), np.int8(1), b, np.float32(0.05), np.int8(-2), np.float32(0.9), np.int8(3))
    for rule in ("exact", "float32", "float64"):
        plain = qemu_q.qlinear_matmul(a, *args, requantization=rule)
        assert qemu_q.qlinear_matmul(a, *args, requantization=rule, datapath=qemu_q.Datapath()).tobytes() == plain.tobytes()
        acc = (a.astype(np.int64) - 1) @ (b.astype(np.int64) + 2)
        assert plain.tolist() == [[datapath_code(int(v), 0.02, 0.05, 0.9, 3, rule, "half_even") for v in row]
                                  for row in acc]


def test_qlinear_float8_sums_beyond_64_bits_take_the_exact_multiplier():
    # float8e5m2 operands: each value an integer times 2**-16, so a sum of four products of
    # values near 57344 is an integer times 2**-32 beyond 2**64: the exact product with the
    # datapath's multiplier runs in 192 bits.
    big = [57344.0, -57344.0, 49152.0, 40960.0, 61440.0 / 2, 57344.0]
    a = np.array([[big[(i + k) % 6] for k in range(4)] for i in range(6)], ml_dtypes.float8_e5m2)
    b = np.array([[57344.0, 49152.0], [57344.0, -57344.0], [49152.0, 40960.0], [57344.0, 57344.0]],
                 ml_dtypes.float8_e5m2)
    zp = np.zeros((), ml_dtypes.float8_e5m2)
    sa, sb, sy = 2.0 ** -15, 2.0 ** -15, 3.0
    sums = (a.astype(np.float64) @ b.astype(np.float64))
    assert np.abs(sums).max() * 2.0 ** 32 > 2.0 ** 64
    for scale, precision in (("divide", "float64"), ("reciprocal", "float32"), ("divide", "float32")):
        for mode in ("half_even", "half_away", "down"):
            y = qemu_q.qlinear_matmul(a, np.float32(sa), zp, b, np.float32(sb), zp, np.float32(sy), np.int8(-5),
                                      opset=21, datapath=qemu_q.Datapath(scale=scale, scale_precision=precision,
                                                                         rounding=mode))
            m = multiplier_oracle(Fraction(sa), Fraction(sb), Fraction(sy), scale, precision)
            want = [[min(max(round_with(sum(Fraction(float(a[i, k])) * Fraction(float(b[k, j])) for k in range(4))
                                        * m, mode, 0) - 5, -128), 127) for j in range(2)] for i in range(6)]
            assert y.tolist() == want, (scale, precision, mode)
            assert len({v for row in want for v in row}) > 3  # not all saturated


# NaN scales with a float8 output (QLinearMatMul-21): the NaN of the first operand in the
# formula carries its sign (docs/semantics.md, "Requantization rules"), on every level.
NEG_NAN, POS_NAN = np.uint32(0xFFC00000).view(np.float32), np.uint32(0x7FC00000).view(np.float32)


@pytest.mark.parametrize("requantization, datapath", [
    (rule, datapath) for rule in ("exact", "float32", "float64")
    for datapath in (None, dict(scale_precision="float32"), dict(scale="reciprocal", scale_precision="float32"),
                     dict(scale="reciprocal", scale_precision="float64"))
    # (the float32 rule refuses a float64 multiplier: test_datapath_refusals_in_the_integer_ops)
    if not (rule == "float32" and datapath and datapath["scale_precision"] == "float64")])
def test_nan_scales_first_operand_wins(requantization, datapath):
    from qemu_q import _kernels

    a = np.arange(24, dtype=np.uint8).reshape(3, 8)
    b = np.arange(80, dtype=np.uint8).reshape(8, 10)
    one = np.float32(1)
    # (sa, sb, sy) and the e4m3fn NaN code of the winning sign (Cast: 0xFF -NaN, 0x7F NaN)
    cases = [((NEG_NAN, POS_NAN, one), 0xFF), ((POS_NAN, NEG_NAN, one), 0x7F),
             ((one, NEG_NAN, POS_NAN), 0xFF), ((one, POS_NAN, NEG_NAN), 0x7F),
             ((POS_NAN, one, NEG_NAN), 0x7F)]
    dp = None if datapath is None else qemu_q.Datapath(**datapath)
    level = _kernels.active.level
    try:
        for lv in _kernels.available_levels():
            _kernels.use(lv)
            for (sa, sb, sy), code in cases:
                y = qemu_q.qlinear_matmul(a, sa, np.uint8(0), b, sb, np.uint8(0), sy,
                                          np.zeros((), ml_dtypes.float8_e4m3fn),
                                          requantization=requantization, datapath=dp)
                assert y.view(np.uint8).tolist() == [[code] * 10] * 3, (lv, sa, sb, sy)
    finally:
        _kernels.use(level)
