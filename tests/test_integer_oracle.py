"""MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv against an oracle written from
the spec text and docs/semantics.md ("Integer datapath"): Python integers and Fractions,
direct loops, never qemu_q. Seeded random cases over shapes, broadcasting, conv geometry,
zero points, int32 overflow and requantization ties."""

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo
import qemu_q

BF16 = ml_dtypes.bfloat16


def wrap32(n: int) -> int:
    n %= 1 << 32
    return n - (1 << 32) if n >= 1 << 31 else n


def rne(q: Fraction) -> int:
    return fo.round_half_even(q)


# ------------------------------------------------------------------ oracle: accumulation


def matmul_oracle(a, b, a_zp, b_zp):
    """numpy matmul semantics on Python ints; a_zp per row ([M]) or scalar, b_zp per column
    ([N]) or scalar; the sum wrapped to int32."""
    a = np.asarray(a, dtype=object)
    b = np.asarray(b, dtype=object)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    out = np.empty(batch + (m, n), dtype=object)
    za = np.broadcast_to(np.asarray(a_zp, dtype=object).reshape(-1, 1) if np.ndim(a_zp) else a_zp, (m, 1))
    zb = np.broadcast_to(np.asarray(b_zp, dtype=object).reshape(1, -1) if np.ndim(b_zp) else b_zp, (1, n))
    def item(operand, index):
        # numpy broadcasting: batch dimensions align from the right; size 1 repeats
        dims = operand.shape[:-2]
        offset = len(index) - len(dims)
        return operand[tuple(index[offset + i] if s > 1 else 0 for i, s in enumerate(dims))]

    for index in np.ndindex(*batch):
        ai, bi = item(a2, index), item(b2, index)
        for r in range(m):
            for c in range(n):
                total = sum((int(ai[r, t]) - int(za[r, 0])) * (int(bi[t, c]) - int(zb[0, c]))
                            for t in range(k))
                out[index + (r, c)] = wrap32(total)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def conv_geometry(in_sizes, kernel, strides, dilations, pads, auto_pad):
    """(begin pads, output sizes) by the ONNX Conv text."""
    n = len(in_sizes)
    begins, outs = [], []
    for i in range(n):
        dk = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-in_sizes[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + dk - in_sizes[i])
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            begin, out = 0, (in_sizes[i] - dk) // strides[i] + 1
        else:
            begin = pads[i]
            out = (in_sizes[i] + pads[i] + pads[i + n] - dk) // strides[i] + 1
        begins.append(begin)
        outs.append(out)
    return begins, outs


def conv_oracle(x, w, x_zp, w_zp, group, strides, dilations, pads, auto_pad, bias=None):
    x = np.asarray(x, dtype=object)
    w = np.asarray(w, dtype=object)
    batch, channels = x.shape[:2]
    out_channels, per_group = w.shape[:2]
    kernel = w.shape[2:]
    begins, outs = conv_geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    m_per_group = out_channels // group
    wz = list(np.broadcast_to(np.asarray(w_zp, dtype=object).reshape(-1), (out_channels,)))
    y = np.empty((batch, out_channels) + tuple(outs), dtype=object)
    for nb, oc in itertools.product(range(batch), range(out_channels)):
        g = oc // m_per_group
        for pos in itertools.product(*(range(o) for o in outs)):
            total = 0 if bias is None else int(bias[oc])
            for ic in range(per_group):
                for tap in itertools.product(*(range(k) for k in kernel)):
                    coords = [pos[i] * strides[i] + tap[i] * dilations[i] - begins[i] for i in range(len(pos))]
                    inside = all(0 <= c < s for c, s in zip(coords, x.shape[2:]))
                    xv = int(x[(nb, g * per_group + ic) + tuple(coords)]) if inside else int(x_zp)
                    total += (xv - int(x_zp)) * (int(w[(oc, ic) + tap]) - int(wz[oc]))
            y[(nb, oc) + pos] = wrap32(total)
    return y


# ------------------------------------------------------------------ oracle: requantization


def requantize(acc, sa, sb, sy, zp, lo, hi, rule, scale_type=np.float32):
    """One output element by the named rule (docs/semantics.md)."""
    if rule == "exact":
        v = Fraction(int(acc)) * Fraction(float(sa)) * Fraction(float(sb)) / Fraction(float(sy))
        return min(max(rne(v) + int(zp), lo), hi)
    if rule == "float32":
        f = np.float32
        m = f(f(f(sa) * f(sb)) / f(sy))
        v = f(f(acc) * m)
        return min(max(rne(Fraction(float(v))) + int(zp), lo), hi)
    t = np.dtype(scale_type).type
    m = float(t(t(t(sa) * t(sb)) / t(sy)))
    d = float(acc) * m + float(int(zp))
    return min(max(rne(Fraction(d)), lo), hi)


# ------------------------------------------------------------------ tests

RNG = np.random.default_rng(2026)
CODES = {np.uint8: (0, 255), np.int8: (-128, 127)}


def codes(dtype, shape, extreme=False):
    lo, hi = CODES[dtype]
    if extreme:
        return RNG.choice([lo, hi], size=shape).astype(dtype)
    return RNG.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 1, 3, 4), (3, 4, 2)),
                 ((5,), (5,)), ((1, 2, 3), (2, 3, 1))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8), (np.int8, np.uint8)],
                         ids=lambda t: f"{np.dtype(t[0])}x{np.dtype(t[1])}")
def test_matmul_integer(shapes, types):
    a, b = codes(types[0], shapes[0]), codes(types[1], shapes[1])
    m = 1 if len(shapes[0]) == 1 else shapes[0][-2]
    n = 1 if len(shapes[1]) == 1 else shapes[1][-1]
    for a_zp, b_zp in [(None, None), (codes(types[0], ()), codes(types[1], ())),
                       (codes(types[0], (m,)) if len(shapes[0]) > 1 else codes(types[0], ()),
                        codes(types[1], (n,)) if len(shapes[1]) > 1 else codes(types[1], ()))]:
        got = qemu_q.matmul_integer(a, b, a_zp, b_zp)
        want = matmul_oracle(a, b, 0 if a_zp is None else a_zp, 0 if b_zp is None else b_zp)
        assert got.dtype == np.int32 and got.shape == want.shape
        assert got.tolist() == want.tolist()
        (via_run_op,) = qemu_q.run_op("MatMulInteger", [a, b, a_zp, b_zp], {}, 10)
        assert via_run_op.tolist() == want.tolist()


def test_matmul_integer_int32_wrap():
    # K large with extreme codes: the exact sum leaves int32 and wraps.
    k = 70_000
    a = np.full((1, k), 255, np.uint8)
    b = np.full((k, 2), 255, np.uint8)
    got = qemu_q.matmul_integer(a, b, np.uint8(0), np.uint8(0))
    assert got.tolist() == [[wrap32(255 * 255 * k)] * 2]
    assert 255 * 255 * k > 2**31  # it really overflows


CONV_CASES = [  # x shape, w shape, group, strides, dilations, pads, auto_pad
    ((1, 2, 5), (3, 2, 3), 1, (1,), (1,), (0, 0), "NOTSET"),
    ((2, 2, 6), (2, 1, 2), 2, (2,), (1,), (1, 0), "NOTSET"),
    ((1, 3, 5, 4), (4, 3, 3, 2), 1, (1, 1), (1, 1), (1, 0, 1, 1), "NOTSET"),
    ((1, 2, 6, 5), (2, 2, 3, 3), 1, (2, 1), (1, 2), None, "SAME_UPPER"),
    ((1, 2, 6, 5), (2, 2, 3, 3), 1, (2, 2), (1, 1), None, "SAME_LOWER"),
    ((1, 4, 5, 5), (4, 1, 3, 3), 4, (1, 1), (1, 1), None, "VALID"),  # depthwise
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), 1, (1, 2, 1), (1, 1, 1), (0, 1, 0, 1, 0, 1), "NOTSET"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-{c[6]}-g{c[2]}")
def test_conv_integer_and_qlinear_conv(case):
    x_shape, w_shape, group, strides, dilations, pads, auto_pad = case
    rank = len(x_shape) - 2
    pads_list = list(pads) if pads is not None else [0] * (2 * rank)
    x, w = codes(np.uint8, x_shape), codes(np.int8, w_shape)
    x_zp = codes(np.uint8, ())
    w_zp = codes(np.int8, (w_shape[0],))
    attrs = dict(group=group, strides=list(strides), dilations=list(dilations), auto_pad=auto_pad)
    if pads is not None:
        attrs["pads"] = list(pads)
    got = qemu_q.conv_integer(x, w, x_zp, w_zp, **attrs)
    want = conv_oracle(x, w, x_zp, w_zp, group, strides, dilations, pads_list, auto_pad)
    assert got.shape == want.shape and got.tolist() == want.tolist()
    # QLinearConv: per-channel weight scales, a bias, every rule
    bias = RNG.integers(-5000, 5000, size=w_shape[0]).astype(np.int32)
    acc = conv_oracle(x, w, x_zp, w_zp, group, strides, dilations, pads_list, auto_pad, bias)
    x_scale, y_scale = np.float32(0.05), np.float32(0.2)
    w_scale = (RNG.random(w_shape[0]) * 0.1 + 0.01).astype(np.float32)
    y_zp = np.uint8(128)
    for rule in ("exact", "float32", "float64"):
        y = qemu_q.qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias,
                                requantization=rule, **attrs)
        expected = np.empty(acc.shape, dtype=object)
        for index in np.ndindex(*acc.shape):
            expected[index] = requantize(acc[index], x_scale, w_scale[index[1]], y_scale, y_zp, 0, 255, rule)
        assert y.dtype == np.uint8 and y.tolist() == expected.tolist(), rule


@pytest.mark.parametrize("scale_type", [np.float32, np.float16, BF16], ids=["float", "float16", "bfloat16"])
@pytest.mark.parametrize("out_type", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_qlinear_matmul_rules_and_ties(scale_type, out_type):
    # a_scale * b_scale / y_scale = 0.5 exactly, so every odd accumulator is a tie; odd zero
    # points separate the spec's order from onnx.reference's (docs/semantics.md).
    a = codes(np.uint8, (4, 6))
    b = codes(np.int8, (6, 5))
    a_zp, b_zp = np.uint8(3), np.int8(-1)
    lo, hi = CODES[out_type]
    y_zp = np.array(7 if out_type is np.uint8 else -3, out_type)
    opset = 21 if scale_type is not np.float32 else 10
    acc = matmul_oracle(a, b, a_zp, b_zp)
    for sa, sb, sy in [(0.25, 1.0, 0.5), (0.0625, 0.5, 0.03125 * 2), (0.1, 0.3, 0.07)]:
        sa, sb, sy = (np.array(v, scale_type) for v in (sa, sb, sy))
        for rule in ("exact", "float32", "float64"):
            y = qemu_q.qlinear_matmul(a, sa, a_zp, b, sb, b_zp, sy, y_zp, requantization=rule,
                                      opset=opset)
            want = [[requantize(acc[r, c], sa, sb, sy, y_zp, lo, hi, rule, scale_type)
                     for c in range(5)] for r in range(4)]
            assert y.dtype == out_type and y.tolist() == want, (rule, float(sa), float(sb), float(sy))
    # the default rule of run_op is "exact"
    (y,) = qemu_q.run_op("QLinearMatMul", [a, sa, a_zp, b, sb, b_zp, sy, y_zp], {}, opset)
    assert y.tolist() == [[requantize(acc[r, c], sa, sb, sy, y_zp, lo, hi, "exact") for c in range(5)]
                          for r in range(4)]


def test_qlinear_matmul_per_row_and_per_column_scales():
    a, b = codes(np.uint8, (3, 4)), codes(np.uint8, (4, 2))
    a_zp = codes(np.uint8, (3,))
    b_zp = codes(np.uint8, (2,))
    a_scale = np.float32([0.1, 0.2, 0.3])
    b_scale = np.float32([0.05, 0.5])
    acc = matmul_oracle(a, b, a_zp, b_zp)
    y = qemu_q.qlinear_matmul(a, a_scale, a_zp, b, b_scale, b_zp, np.float32(0.25), np.uint8(100))
    want = [[requantize(acc[r, c], a_scale[r], b_scale[c], np.float32(0.25), 100, 0, 255, "exact")
             for c in range(2)] for r in range(3)]
    assert y.tolist() == want


def test_qlinear_matmul_float8():
    # QLinearMatMul-21 with float8 a, b and y: the exact real sum, rounded once to e4m3fn.
    fmt = fo.FORMATS["float8_e4m3fn"]
    a = RNG.integers(0, 0x7E, size=(2, 3)).astype(np.uint8) | (RNG.integers(0, 2, size=(2, 3)) * 0x80).astype(np.uint8)
    b = RNG.integers(0, 0x7E, size=(3, 2)).astype(np.uint8)
    ae, be = a.view(ml_dtypes.float8_e4m3fn), b.view(ml_dtypes.float8_e4m3fn)
    zero = np.zeros((), ml_dtypes.float8_e4m3fn)
    sa, sb, sy = np.float32(0.5), np.float32(0.25), np.float32(3.0)
    y = qemu_q.qlinear_matmul(ae, sa, zero, be, sb, zero, sy, zero, opset=21)
    for r, c in itertools.product(range(2), range(2)):
        s = sum(fo.decode(fmt, int(a[r, t])) * fo.decode(fmt, int(b[t, c])) for t in range(3))
        v = s * Fraction(0.5) * Fraction(0.25) / Fraction(3)
        assert int(y.view(np.uint8)[r, c]) == fo.encode(fmt, v, True, opset=21), (r, c)


@pytest.mark.parametrize("k, a_zp, b_zp", [(5, 10, -2), (301, 200, -100), (600, 255, 127)])
def test_x86_pairs_accumulator(k, a_zp, b_zp):
    # docs/semantics.md: raw-code pairs (k, k+1) saturated to int16, then exact zero points.
    # K * a_zp * b_zp beyond 8 bits: the correction is computed in wide integers.
    a = np.full((2, k), 255, np.uint8)
    a[1, ::3] = 17
    b = np.full((k, 3), 127, np.int8)
    b[:, 1] = -128
    b[::4, 2] = -3
    a_zp, b_zp = np.uint8(a_zp), np.int8(b_zp)

    def pairs_oracle(r, c):
        total = 0
        for t0 in range(0, k, 2):
            p = sum(int(a[r, t]) * int(b[t, c]) for t in range(t0, min(t0 + 2, k)))
            total += max(-32768, min(32767, p))
        col = sum(int(b[t, c]) for t in range(k))
        row = sum(int(a[r, t]) for t in range(k))
        return wrap32(total - int(a_zp) * col - int(b_zp) * row + k * int(a_zp) * int(b_zp))

    got = qemu_q.matmul_integer(a, b, a_zp, b_zp, accumulator="x86-u8s8-pairs")
    assert got.tolist() == [[pairs_oracle(r, c) for c in range(3)] for r in range(2)]
    exact = matmul_oracle(a, b, a_zp, b_zp)
    assert got.tolist() != exact.tolist()  # the saturation shows
    assert qemu_q.matmul_integer(a, b, a_zp, b_zp).tolist() == exact.tolist()


def conv_pairs_oracle(x, w, x_zp, w_zp, group, strides, dilations, pads, auto_pad):
    """ConvInteger int8 x, uint8 w under "x86-u8s8-pairs" (docs/semantics.md), Python ints:
    each output's raw codes along K in the filter's order (channel of the group outer,
    kernel positions inner; a padded element is x's raw zero point) in pairs (k, k+1) from
    k = 0, each pair's sum saturated to int16, summed, then the zero points' exact terms."""
    batch = x.shape[0]
    out_channels, per_group = w.shape[:2]
    kernel = w.shape[2:]
    begins, outs = conv_geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    m_per_group = out_channels // group
    y = np.empty((batch, out_channels) + tuple(outs), dtype=object)
    for nb, oc in itertools.product(range(batch), range(out_channels)):
        g = oc // m_per_group
        for pos in itertools.product(*(range(o) for o in outs)):
            xs, ws = [], []
            for ic in range(per_group):
                for tap in itertools.product(*(range(k) for k in kernel)):
                    coords = [pos[i] * strides[i] + tap[i] * dilations[i] - begins[i] for i in range(len(pos))]
                    inside = all(0 <= c < s for c, s in zip(coords, x.shape[2:]))
                    xs.append(int(x[(nb, g * per_group + ic) + tuple(coords)]) if inside else int(x_zp))
                    ws.append(int(w[(oc, ic) + tap]))
            total = 0
            for t0 in range(0, len(xs), 2):
                pair = sum(xs[t] * ws[t] for t in range(t0, min(t0 + 2, len(xs))))
                total += max(-32768, min(32767, pair))
            k = len(xs)
            y[(nb, oc) + pos] = wrap32(total - int(x_zp) * sum(ws) - int(w_zp) * sum(xs) + k * int(x_zp) * int(w_zp))
    return y


@pytest.mark.parametrize("geometry", [
    dict(group=1, strides=(1, 1), dilations=(1, 1), pads=(1, 0, 2, 1), auto_pad="NOTSET", kernel=(3, 3)),
    dict(group=3, strides=(2, 1), dilations=(1, 2), pads=(0, 0, 0, 0), auto_pad="NOTSET", kernel=(2, 2)),
    dict(group=1, strides=(2, 2), dilations=(1, 1), pads=None, auto_pad="SAME_LOWER", kernel=(3, 1)),
])
def test_x86_pairs_accumulator_conv_integer_s8u8(geometry):
    # ConvInteger with an int8 x and a uint8 w: onnxruntime's GEMM takes w as the uint8
    # operand, so the pairs run along the filter's own order; large raw codes and zero
    # points (the padding) saturate pairs.
    group, kernel = geometry["group"], geometry["kernel"]
    x = RNG.integers(-128, 128, size=(2, 6, 5, 6)).astype(np.int8)
    x[:, :, ::2] = 127
    w = RNG.integers(180, 256, size=(2 * group, 6 // group) + kernel).astype(np.uint8)
    x_zp, w_zp = np.int8(-128), np.uint8(201)
    pads = list(geometry["pads"]) if geometry["pads"] is not None else None
    got = qemu_q.conv_integer(x, w, x_zp, w_zp, group=group, strides=list(geometry["strides"]),
                              dilations=list(geometry["dilations"]), pads=pads,
                              auto_pad=geometry["auto_pad"], accumulator="x86-u8s8-pairs")
    args = (x, w, x_zp, w_zp, group, geometry["strides"], geometry["dilations"],
            geometry["pads"] or (0, 0, 0, 0), geometry["auto_pad"])
    want = conv_pairs_oracle(*args)
    assert got.tolist() == want.tolist()
    exact = conv_oracle(*args)
    assert want.tolist() != exact.tolist()  # the saturation shows
    assert qemu_q.conv_integer(x, w, x_zp, w_zp, group=group, strides=list(geometry["strides"]),
                               dilations=list(geometry["dilations"]), pads=pads,
                               auto_pad=geometry["auto_pad"]).tolist() == exact.tolist()


def test_x86_pairs_accumulator_conv_wide_zero_point_correction():
    # QLinearConv u8 x s8 with the pairs profile and an even C: small raw codes never
    # saturate a pair, so the result is the exact accumulation; K * x_zp * w_zp (36 * 200 *
    # -100) needs more than 8 bits.
    x = RNG.integers(0, 40, size=(1, 4, 4, 4)).astype(np.uint8)
    w = RNG.integers(-40, 40, size=(3, 4, 3, 3)).astype(np.int8)
    x_zp, w_zp = np.uint8(200), np.int8(-100)
    sx, sw, sy = np.float32(0.5), np.float32(0.25), np.float32(1024.0)
    y = qemu_q.qlinear_conv(x, sx, x_zp, w, sw, w_zp, sy, np.uint8(7), pads=[1, 1, 1, 1],
                            accumulator="x86-u8s8-pairs")
    acc = conv_oracle(x, w, x_zp, w_zp, 1, (1, 1), (1, 1), (1, 1, 1, 1), "NOTSET")
    want = np.vectorize(lambda v: requantize(v, sx, sw, sy, 7, 0, 255, "exact"), otypes=[object])(acc)
    assert y.tolist() == want.tolist()


# ------------------------------------------------------------------ QLinearMatMul-21, float8 operands

F8 = {"float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
      "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz"}
INT_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def operand_value(name, code, zp):
    """An operand element's exact value (docs/semantics.md): a float8 code decoded (its zero
    point is +-0), an integer code minus its zero point; "nan", "+inf", "-inf" otherwise."""
    if name in F8:
        return fo.decode(F8[name], int(code))
    return Fraction(int(code) - int(zp))


def special_sum(terms):
    """The sum of a dot product in which a NaN or an infinity takes part: NaN (positive,
    quiet) when a product is NaN (a NaN, inf * 0) or infinities of both signs meet,
    otherwise the infinity."""
    signs = set()
    for x, y in terms:
        if "nan" in (x, y):
            return math.nan
        if isinstance(x, str) or isinstance(y, str):
            other = y if isinstance(x, str) else x
            if not isinstance(other, str) and other == 0:
                return math.nan
            sx = (-1 if x == "-inf" else 1) if isinstance(x, str) else (1 if x > 0 else -1)
            sy_ = (-1 if y == "-inf" else 1) if isinstance(y, str) else (1 if y > 0 else -1)
            signs.add(sx * sy_)
    if len(signs) == 2:
        return math.nan
    return math.inf if signs == {1} else -math.inf


def float8_matmul_oracle(a, a_type, a_zp, b, b_type, b_zp, sa, sb, sy, y_type, y_zp, rule,
                         scale_type=np.float32):
    """QLinearMatMul-21 with a float8 operand, 2-D, scalar scales and zero points, by
    docs/semantics.md: the exact sum S (or the special sum), then the rule. Returns codes as
    Python ints (uint8 storage for float8 outputs)."""
    a = a.view(np.uint8) if a_type in F8 else a
    b = b.view(np.uint8) if b_type in F8 else b
    m, k = a.shape
    n = b.shape[1]
    f32 = np.float32
    out = np.empty((m, n), dtype=object)
    fy = F8.get(y_type)
    y_zero = (math.copysign(0.0, -1.0) if fo.sign_bit(fy, int(np.asarray(y_zp).view(np.uint8))) else 0.0) if fy else 0.0
    lo, hi = INT_RANGES.get(y_type, (0, 0))
    zp = 0 if fy else int(y_zp)
    for r in range(m):
        for c in range(n):
            terms = [(operand_value(a_type, a[r, t], a_zp), operand_value(b_type, b[t, c], b_zp)) for t in range(k)]
            finite = not any(isinstance(x, str) for pair in terms for x in pair)
            s_exact = sum((x * y for x, y in terms), Fraction(0)) if finite else None
            s_float = float(s_exact) if finite else special_sum(terms)  # float(Fraction) rounds once
            if rule == "exact":
                if finite and all(math.isfinite(float(v)) for v in (sa, sb, sy)) and float(sy) != 0:
                    real = s_exact * Fraction(float(sa)) * Fraction(float(sb)) / Fraction(float(sy))
                    if fy:
                        out[r, c] = fo.encode(fy, real, True, opset=21) if real != 0 else fo.encode(fy, 0.0 + y_zero, True, opset=21)
                    else:
                        out[r, c] = min(max(rne(real) + zp, lo), hi)
                    continue
                # the IEEE value of (S * sa * sb) / sy: numpy float64 arithmetic, whose NaNs
                # carry the sign the hardware gives (docs/semantics.md)
                with np.errstate(all="ignore"):
                    v = float(np.float64(s_float) * np.float64(float(sa)) * np.float64(float(sb))
                              / np.float64(float(sy)))
            elif rule == "float32":
                s32 = f32(fo.round_to_binary(s_exact, "float")) if finite else f32(s_float)
                with np.errstate(all="ignore"):
                    mult = f32(f32(f32(sa) * f32(sb)) / f32(sy))
                    v = float(f32(s32 * mult))
            else:
                t = np.dtype(scale_type).type
                with np.errstate(all="ignore"):
                    mult = float(t(t(t(sa) * t(sb)) / t(sy)))
                v = s_float * mult
            if fy:
                out[r, c] = fo.encode(fy, v + y_zero, True, opset=21)
            elif math.isnan(v):
                out[r, c] = lo
            elif math.isinf(v):
                out[r, c] = hi if v > 0 else lo
            elif rule == "float64":
                out[r, c] = min(max(rne(Fraction(v + zp)), lo), hi)
            else:
                out[r, c] = min(max(rne(Fraction(v)) + zp, lo), hi)
    return out


def operand_codes(name, shape, specials=False):
    if name in F8:
        fmt = F8[name]
        pool = fo.finite_codes(fmt)
        codes_ = RNG.choice(pool, size=shape).astype(np.uint8)
        if specials:
            special = [c for c in range(256) if not isinstance(fo.decode(fmt, c), Fraction)]
            mask = RNG.random(shape) < 0.15
            codes_[mask] = RNG.choice(special, size=int(mask.sum()))
        return codes_.view(getattr(ml_dtypes, F8[name]))
    lo, hi = INT_RANGES[name]
    return RNG.integers(lo, hi, size=shape, endpoint=True).astype(name)


def zero_point_of(name):
    if name in F8:
        return np.zeros((), getattr(ml_dtypes, F8[name]))
    lo, hi = INT_RANGES[name]
    return np.array(RNG.integers(lo, hi, endpoint=True), dtype=name)


FLOAT8_COMBOS = [("float8e4m3fn", "float8e4m3fn", "uint8"), ("float8e5m2", "float8e4m3fnuz", "float8e4m3fn"),
                 ("float8e5m2fnuz", "float8e5m2", "int8"), ("uint8", "float8e5m2fnuz", "float8e5m2"),
                 ("float8e4m3fnuz", "int8", "float8e4m3fnuz"), ("int8", "float8e4m3fn", "float8e5m2fnuz"),
                 ("float8e5m2", "float8e5m2", "float8e5m2")]


@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
@pytest.mark.parametrize("types", FLOAT8_COMBOS, ids="x".join)
@pytest.mark.parametrize("specials", [False, True])
def test_qlinear_matmul_float8_operands(types, rule, specials):
    a_type, b_type, y_type = types
    for trial in range(4):
        m, k, n = (int(v) for v in RNG.integers(1, 7, size=3))
        a = operand_codes(a_type, (m, k), specials)
        b = operand_codes(b_type, (k, n), specials)
        a_zp, b_zp, y_zp = zero_point_of(a_type), zero_point_of(b_type), zero_point_of(y_type)
        sa, sb, sy = (np.float32(v) for v in RNG.choice([0.5, 0.1, 3.0, 0.0625, 1.7, 0.013], size=3))
        got = qemu_q.qlinear_matmul(a, sa, a_zp, b, sb, b_zp, sy, y_zp, requantization=rule, opset=21)
        want = float8_matmul_oracle(a, a_type, a_zp, b, b_type, b_zp, sa, sb, sy, y_type, y_zp, rule)
        stored = got.view(np.uint8) if y_type in F8 else got
        assert stored.tolist() == want.tolist(), (trial, a.view(np.uint8).tolist(), b.view(np.uint8).tolist())


@pytest.mark.parametrize("n_threads", [1, 3])
def test_qlinear_matmul_float8_sum_beyond_53_bits(n_threads):
    # e5m2: 57344**2 = 49 * 2**26 and 2**-16 * 2**-16 = 2**-32 in one sum: S needs 58 bits.
    # With sa * sb / sy = 2**-27 the big term alone is the tie 24.5: "exact" sees S itself
    # (24.5 + 2**-59, rounds to 25); "float32" and "float64" start from fl32(S) / fl64(S),
    # which drop the tiny term, and round the tie to even (24).
    e5m2 = ml_dtypes.float8_e5m2
    a = np.array([[57344.0, 2.0**-16]], dtype=e5m2)
    b = np.array([[57344.0], [2.0**-16]], dtype=e5m2)
    zero = np.zeros((), e5m2)
    args = (a, np.float32(2.0**-27), zero, b, np.float32(1.0), zero, np.float32(1.0), np.uint8(0))
    want = {"exact": 25, "float32": 24, "float64": 24}
    for rule in want:
        y = qemu_q.qlinear_matmul(*args, requantization=rule, opset=21, n_threads=n_threads)
        assert y.tolist() == [[want[rule]]], rule


def test_qlinear_matmul_float8_wide_product():
    # K = 2**17 products of the largest e5m2fnuz value: |S| * 2**34 needs 83 bits, times two
    # 24-bit scale significands more than 128 bits: the exact rule's 192-bit path.
    k = 1 << 17
    t = ml_dtypes.float8_e5m2fnuz
    a = np.full((1, k), 57344.0, dtype=t)
    b = np.full((k, 2), 57344.0, dtype=t)
    b[::3, 1] = -57344.0
    zero = np.zeros((), t)
    sa, sb, sy = np.float32(0.1), np.float32(0.3), np.float32(7.0)
    s0 = Fraction(57344) ** 2 * k
    negatives = len(range(0, k, 3))
    s1 = Fraction(57344) ** 2 * (k - 2 * negatives)
    target = Fraction(40)  # scale S0 to about 40: sa' = 40 / (S0 * sb / sy), a float32
    sa = np.float32(float(target / (s0 * Fraction(float(sb)) / Fraction(float(sy)))))
    y = qemu_q.qlinear_matmul(a, sa, zero, b, sb, zero, sy, np.int8(3), opset=21)
    want = [min(max(rne(s * Fraction(float(sa)) * Fraction(float(sb)) / Fraction(float(sy))) + 3, -128), 127)
            for s in (s0, s1)]
    assert -128 < want[0] < 127 and -128 < want[1] < 127
    assert y.tolist() == [want]


# ------------------------------------------------------------------ the GEMM kernel at every level

def plain_b(b):
    """A [count, K, N] int16 array as the kernel's flat b with its offsets."""
    count, k, n = b.shape
    return (b.reshape(-1), np.arange(count, dtype=np.intp) * k * n, np.arange(k, dtype=np.intp) * n,
            np.arange(n, dtype=np.intp))


@pytest.mark.parametrize("level", qemu_q._kernels.available_levels())
@pytest.mark.parametrize("dot_product", [True, False])
def test_gemm_kernel_panel_boundaries(level, dot_product):
    # pyx/_integer.pyx gemm_s16 against Python ints, on sizes that straddle the row panels
    # (MR = 4, 6, 12), the column panels (NR = 8, 16, 32), a task's 256 columns and an odd K;
    # every level, VPDPWSSD and VPMADDWD + VPADDD, 1 and 3 threads; extreme values (255 * 255
    # products) with a K that wraps int32.
    module = qemu_q._kernels.load(level).integer
    rng = np.random.default_rng(5)
    for items, m, k, n in [(1, 1, 1, 1), (2, 5, 3, 7), (1, 13, 9, 33), (3, 25, 17, 65), (1, 7, 2, 257),
                           (1, 12, 1, 32), (2, 49, 6, 300)]:
        a = rng.integers(-255, 256, (items, m, k)).astype(np.int16)
        b = rng.integers(-255, 256, (1, k, n)).astype(np.int16)
        out = np.empty((items, m, n), np.int32)
        config = module.GemmConfig(items=items, rows=m, depth=k, cols=n, dot_product=dot_product)
        for threads in (1, 3):
            module.gemm_s16(a, *plain_b(b), np.arange(items, dtype=np.intp), np.zeros(items, dtype=np.intp), out,
                            config, threads)
            want = [[[wrap32(sum(int(a[t, r, j]) * int(b[0, j, c]) for j in range(k))) for c in range(n)]
                     for r in range(m)] for t in range(items)]
            assert out.tolist() == want, (level, items, m, k, n, threads)
    k = 33_001  # 33001 * 255**2 > 2**31: the sums wrap
    a = np.full((1, 3, k), -255, np.int16)
    b = np.full((1, k, 5), 255, np.int16)
    b[0, ::2, 1] = -255
    out = np.empty((1, 3, 5), np.int32)
    module.gemm_s16(a, *plain_b(b), np.zeros(1, np.intp), np.zeros(1, np.intp), out,
                    module.GemmConfig(items=1, rows=3, depth=k, cols=5, dot_product=dot_product), 2)
    col = [wrap32(-255 * 255 * k), wrap32(-255 * sum(int(v) for v in b[0, :, 1]))] + [wrap32(-255 * 255 * k)] * 3
    assert out.tolist() == [[col] * 3]


@pytest.mark.parametrize("level", qemu_q._kernels.available_levels())
def test_gemm_kernel_offsets_out_of_bounds_rejected(level):
    module = qemu_q._kernels.load(level).integer
    a = np.zeros((1, 2, 3), np.int16)
    b, base, k_off, n_off = plain_b(np.zeros((1, 3, 4), np.int16))
    out = np.empty((1, 2, 4), np.int32)
    config = module.GemmConfig(items=1, rows=2, depth=3, cols=4)
    index = np.zeros(1, np.intp)
    for bad in ((base + 1, k_off, n_off), (base, k_off + 1, n_off), (base, k_off, n_off - 1)):
        with pytest.raises(ValueError, match="offsets reach outside b"):
            module.gemm_s16(a, b, *bad, index, index, out, config, 1)


@pytest.mark.parametrize("scales", [
    (np.float32(1 / 3), np.float32(0.5), np.float32(1 / 3)),     # q = 0.5 exactly: ties at every odd acc
    (np.float32(0.1), np.float32(0.3), np.float32(0.0075)),       # q inexact, values near 4 * acc
    (np.float32(2.0**-20), np.float32(3.0), np.float32(1.5)),     # q = 2**-19: ties at acc = 2**18 (2k + 1)
    (np.float32(7e-3), np.float32(9e-4), np.float32(3e-7)),
    (np.float32(1e30), np.float32(1e8), np.float32(1e-8)),        # saturates
])
@pytest.mark.parametrize("zp", [0, 1, 127])
def test_exact_rule_rows_near_ties(scales, zp):
    # The "exact" rule's row path (one multiplier per row) against Fractions, on
    # accumulators that land on and next to rounding midpoints.
    sa, sb, sy = scales
    q = Fraction(float(sa)) * Fraction(float(sb)) / Fraction(float(sy))
    accs = set()
    for k in range(-40, 40):
        mid = (Fraction(2 * k + 1, 2)) / q  # the acc whose value is the midpoint k + 0.5
        base = mid.numerator // mid.denominator
        accs.update(v for v in range(base - 2, base + 3) if -2**31 <= v < 2**31)
    accs.update([0, 1, -1, 2_000_000, -2_000_000, 12345, -777])
    accs = [v for v in sorted(accs) if abs(v) <= 2_000_000][:240]
    # acc = 127 * (sum of 130 codes) + one code: b holds 130 x 127 and one 1
    k = 131
    a_codes = np.zeros((len(accs), k), np.int8)
    for row, target in enumerate(accs):
        low = ((target + 63) % 127) - 63
        high = (target - low) // 127
        for col in range(130):
            part = max(-127, min(127, high))
            a_codes[row, col] = part
            high -= part
        a_codes[row, 130] = low
    b = np.full((k, 1), 127, np.int8)
    b[130, 0] = 1
    acc = matmul_oracle(a_codes, b, 0, 0)
    assert [acc[r, 0] for r in range(len(accs))] == accs
    y = qemu_q.qlinear_matmul(a_codes, sa, np.int8(0), b, sb, np.int8(0), sy, np.uint8(zp))
    want = [[requantize(acc[r, 0], sa, sb, sy, zp, 0, 255, "exact")] for r in range(len(accs))]
    assert y.tolist() == want


@pytest.mark.parametrize("scale_type", [np.float16, BF16])
@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
@pytest.mark.parametrize("y_type", ["uint8", "float8e4m3fn"])
def test_qlinear_matmul_float8_narrow_scales(scale_type, rule, y_type):
    # float16 / bfloat16 scales: exact values for "exact" and "float32", the "float64"
    # rule's multiplier rounded to the scale type at each step (docs/semantics.md).
    for trial in range(4):
        m, k, n = (int(v) for v in RNG.integers(1, 6, size=3))
        a = operand_codes("float8e5m2", (m, k))
        b = operand_codes("int8", (k, n))
        a_zp, b_zp, y_zp = zero_point_of("float8e5m2"), zero_point_of("int8"), zero_point_of(y_type)
        sa, sb, sy = (scale_type(v) for v in RNG.choice([0.3, 0.1, 3.0, 0.0625, 1.7, 0.013, 7.0], size=3))
        got = qemu_q.qlinear_matmul(a, sa, a_zp, b, sb, b_zp, sy, y_zp, requantization=rule, opset=21)
        want = float8_matmul_oracle(a, "float8e5m2", a_zp, b, "int8", b_zp, sa, sb, sy, y_type, y_zp, rule,
                                    scale_type=scale_type)
        stored = got.view(np.uint8) if y_type in F8 else got
        assert stored.tolist() == want.tolist(), trial


@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
@pytest.mark.parametrize("y_type", ["int8", "float8e4m3fn"])
@pytest.mark.parametrize("scales", [(0.5, 0.25, 0.0), (np.inf, 0.25, 2.0), (0.5, 0.25, np.inf), (0.5, np.nan, 2.0)])
def test_qlinear_matmul_float8_non_finite_scales(rule, y_type, scales):
    # y_scale 0, infinite and NaN scales with float8 operands: the IEEE values of the
    # rule's arithmetic (docs/semantics.md), never an exception.
    a = np.array([[1.5, -2.0, 0.0], [0.0, 0.0, 0.0], [-448.0, 448.0, 3.0]], ml_dtypes.float8_e4m3fn)
    b = np.array([[2, -1], [1, 0], [0, 5]], np.int8)
    a_zp, b_zp, y_zp = zero_point_of("float8e4m3fn"), np.int8(0), zero_point_of(y_type)
    sa, sb, sy = (np.float32(v) for v in scales)
    got = qemu_q.qlinear_matmul(a, sa, a_zp, b, sb, b_zp, sy, y_zp, requantization=rule, opset=21)
    want = float8_matmul_oracle(a, "float8e4m3fn", a_zp, b, "int8", b_zp, sa, sb, sy, y_type, y_zp, rule)
    stored = got.view(np.uint8) if y_type in F8 else got
    assert stored.tolist() == want.tolist()
