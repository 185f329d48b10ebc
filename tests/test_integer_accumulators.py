"""The named accumulators of the integer datapath (`accumulator="int<N>"` and
`"int<N>-saturate"`, N in 8..32) against an oracle written from docs/semantics.md
("Accumulator profiles"): Python integers, a sequential loop over k = 0..K-1 that wraps or
saturates the register after every addition, the bias as the register's initial value.
Never qemu_q. Matmul and conv shapes, overflow at each width in both directions, order
dependence, thread-count and instruction-set-level independence, bad values."""

import itertools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo
import qemu_q
from qemu_q import _kernels

WIDTHS = (8, 12, 16, 24, 31, 32)
NAMED = ["int32-saturate", "int24", "int24-saturate", "int16", "int16-saturate"]


# ------------------------------------------------------------------ oracle


def register(width: int, saturate: bool):
    """R: one addition's result into a width-bit two's complement register."""
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1

    def reduce(v: int) -> int:
        if saturate:
            return max(lo, min(hi, v))
        return (v - lo) % (1 << width) + lo
    return reduce


def parse(name: str):
    saturate = name.endswith("-saturate")
    return int(name[3:].split("-")[0]), saturate


def sequential(products, reduce, start=0) -> int:
    acc = reduce(start)
    for p in products:
        acc = reduce(acc + p)
    return acc


def matmul_oracle(a, b, a_zp, b_zp, name, n=None):
    """a [M, K], b [K, N] (lists of ints), a_zp per row ([M]) or scalar, b_zp per column or
    scalar; each output summed in k order through the register."""
    reduce = register(*parse(name))
    m, k = len(a), len(b)
    n = len(b[0]) if n is None else n
    azp = a_zp if isinstance(a_zp, list) else [a_zp] * m
    bzp = b_zp if isinstance(b_zp, list) else [b_zp] * n
    return [[sequential(((a[r][j] - azp[r]) * (b[j][c] - bzp[c]) for j in range(k)), reduce)
             for c in range(n)] for r in range(m)]


def conv_oracle(x, w, x_zp, w_zp, bias, group, pads, strides, dilations, name):
    """ONNX Conv geometry on nested numpy object arrays; k runs over w's [C/group, k1..kn]
    in row-major order (channel outer, kernel positions inner); a padded element is the
    zero point (a zero product)."""
    reduce = register(*parse(name))
    x = np.asarray(x, dtype=object)
    w = np.asarray(w, dtype=object)
    n_img, channels = x.shape[:2]
    out_ch, c_g = w.shape[:2]
    kernel = w.shape[2:]
    rank = len(kernel)
    spatial = x.shape[2:]
    begin, end = pads[:rank], pads[rank:]
    out_spatial = [(spatial[i] + begin[i] + end[i] - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1
                   for i in range(rank)]
    m_g = out_ch // group
    wzp = w_zp if isinstance(w_zp, list) else [w_zp] * out_ch
    y = np.zeros((n_img, out_ch) + tuple(out_spatial), dtype=object)
    for img, m in itertools.product(range(n_img), range(out_ch)):
        g = m // m_g
        for pos in itertools.product(*[range(o) for o in out_spatial]):
            def products():
                for c in range(c_g):
                    for tap in itertools.product(*[range(kk) for kk in kernel]):
                        idx = [pos[i] * strides[i] - begin[i] + tap[i] * dilations[i] for i in range(rank)]
                        inside = all(0 <= idx[i] < spatial[i] for i in range(rank))
                        xv = x[(img, g * c_g + c) + tuple(idx)] - x_zp if inside else 0
                        yield xv * (w[(m, c) + tap] - wzp[m])
            y[(img, m) + pos] = sequential(products(), reduce, 0 if bias is None else int(bias[m]))
    return y


def requantize_oracle(acc, scale: Fraction, zp: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, fo.round_half_even(acc * scale) + zp))


def ints(array):
    return np.asarray(array).astype(np.int64).tolist()


# ------------------------------------------------------------------ hand-written cases


def test_order_decides_saturation_and_wrap_does_not():
    # products +30000, +30000, -30000 in that order: the int16 register saturates at 32767
    # after the second add and ends at 2767; reversed it never overflows and ends at 30000.
    # Wrapping ends at 30000 either way (the exact sum fits).
    a = np.uint8([[250, 250, 250]])
    up = np.int8([[120], [120], [-120]])
    down = np.int8([[-120], [120], [120]])
    assert qemu_q.matmul_integer(a, up, accumulator="int16-saturate").tolist() == [[32767 - 30000]]
    assert qemu_q.matmul_integer(a, down, accumulator="int16-saturate").tolist() == [[30000]]
    assert qemu_q.matmul_integer(a, up, accumulator="int16").tolist() == [[30000]]
    assert qemu_q.matmul_integer(a, down, accumulator="int16").tolist() == [[30000]]
    # the same through zero points: a - a_zp = -150, b - b_zp = +-120 around b_zp = -8
    a_zp, b_zp = np.uint8(250), np.int8(-8)
    a2 = np.uint8([[100, 100, 100]])
    b2 = (up.astype(np.int16) + -8).astype(np.int8)  # b - b_zp = up: products -18000, -18000, +18000
    assert qemu_q.matmul_integer(a2, b2, a_zp, b_zp, accumulator="int16-saturate").tolist() == [[-32768 + 18000]]
    assert qemu_q.matmul_integer(a2, b2, a_zp, b_zp, accumulator="int16").tolist() == [[-18000]]


@pytest.mark.parametrize("width", [8, 12, 16, 24, 32])
def test_overflow_each_width_both_directions(width):
    # K products of +-(255 * 127) = +-32385 cross the register's top and bottom; the expected
    # registers are written out from the rule: saturate pins at the limit, wrap reduces
    # the exact sum modulo 2**width (order-free).
    hi, lo = (1 << (width - 1)) - 1, -(1 << (width - 1))
    p = 255 * 127
    k = (hi // p) + 2          # enough adds to pass hi (and lo with negated b)
    a = np.full((1, k), 255, np.uint8)
    up = np.full((k, 1), 127, np.int8)
    down = np.full((k, 1), -127, np.int8)
    modulus = 1 << width
    for b, exact, limit in ((up, k * p, hi), (down, -k * p, lo)):
        assert abs(exact) > hi  # the case overflows
        got_sat = qemu_q.matmul_integer(a, b, accumulator=f"int{width}-saturate")
        assert got_sat.tolist() == [[limit]]
        wrapped = (exact - lo) % modulus + lo
        name = "int32" if width == 32 else f"int{width}"
        assert qemu_q.matmul_integer(a, b, accumulator=name).tolist() == [[wrapped]]
    # down to the bottom then back up: saturation forgets what it clipped
    a2 = np.full((1, 2 * k), 255, np.uint8)
    b2 = np.concatenate([down, up])
    assert qemu_q.matmul_integer(a2, b2, accumulator=f"int{width}-saturate").tolist() == [[lo + k * p if lo + k * p <= hi else hi]]
    assert qemu_q.matmul_integer(a2, b2, accumulator="int32" if width == 32 else f"int{width}").tolist() == [[0]]


def test_one_product_beyond_a_narrow_register():
    # 255 * -128 = -32640 does not fit int8/int12: the sum is reduced, never the product first
    a, b = np.uint8([[255]]), np.int8([[-128]])
    assert qemu_q.matmul_integer(a, b, accumulator="int8-saturate").tolist() == [[-128]]
    assert qemu_q.matmul_integer(a, b, accumulator="int8").tolist() == [[(-32640 + 128) % 256 - 128]]
    assert qemu_q.matmul_integer(a, b, accumulator="int12").tolist() == [[(-32640 + 2048) % 4096 - 2048]]
    assert qemu_q.matmul_integer(a, b, accumulator="int16-saturate").tolist() == [[-32640]]


def test_qlinear_conv_bias_is_the_initial_register():
    # bias 40000 into int16-saturate is 32767 before any product; the product -100 then
    # gives 32667, requantized by the exact rule: 32667 / 256 = 127.6 -> 128 (with the bias
    # added after the sum, as an int32 register, it would be 39900 / 256 -> 156).
    x = np.uint8([[[[1]]]])
    w = np.int8([[[[-100]]]])
    one = np.float32(1.0)
    y = qemu_q.qlinear_conv(x, one, np.uint8(0), w, one, np.int8(0), np.float32(256.0), np.uint8(0),
                            np.int32([40000]), accumulator="int16-saturate")
    assert y.tolist() == [[[[128]]]]
    acc = conv_oracle([[[[1]]]], [[[[-100]]]], 0, 0, [40000], 1, [0, 0, 0, 0], [1, 1], [1, 1], "int16-saturate")
    assert acc.tolist() == [[[[32667]]]]
    # wrapped: 40000 -> 40000 - 65536 = -25536, then -25636; exact rule: -100.14 -> -100, + 200
    y = qemu_q.qlinear_conv(x, one, np.uint8(0), w, one, np.int8(0), np.float32(256.0), np.uint8(200),
                            np.int32([40000]), accumulator="int16")
    assert y.tolist() == [[[[200 - 100]]]]


# ------------------------------------------------------------------ random cases vs oracle


MATMUL_SHAPES = [(1, 1, 1), (3, 7, 5), (4, 40, 9), (2, 3, 260), (5, 1, 17), (2, 0, 3), (3, 2, 0)]
CASES = [(w, s) for w in WIDTHS for s in (False, True) if (w, s) != (32, False)]


def _name(width, saturate):
    return f"int{width}" + ("-saturate" if saturate else "")


@pytest.mark.parametrize("width, saturate", CASES)
def test_matmul_against_oracle(width, saturate):
    name = _name(width, saturate)
    rng = np.random.default_rng(width * 2 + saturate)
    overflowed = False
    for m, k, n in MATMUL_SHAPES + [(2, 700, 3)]:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        a_zp = rng.integers(0, 256, m, dtype=np.uint8)
        b_zp = rng.integers(-128, 128, n, dtype=np.int8)
        if k == 700:
            # sums up to 700 * 255 * 255: past 2**23 from either side, then back
            a[0], a_zp[0] = 255, 0
            b[:, 0], b[:, 1], b_zp[:2] = 127, -128, (-128, 127)
            b[350:, 2], b_zp[2] = -128, 127
        a_before, b_before = a.copy(), b.copy()
        got = qemu_q.matmul_integer(a, b, a_zp, b_zp, accumulator=name)
        want = matmul_oracle(ints(a), ints(b), ints(a_zp), ints(b_zp), name, n)
        assert got.dtype == np.int32 and got.shape == (m, n) and got.tolist() == want, (name, m, k, n)
        assert np.array_equal(a, a_before) and np.array_equal(b, b_before)
        # int64-wide register: the exact sums of these K
        exact = [[sum((x - ints(a_zp)[r]) * (ints(b)[j][c] - ints(b_zp)[c]) for j, x in enumerate(ints(a)[r]))
                  for c in range(n)] for r in range(m)]
        overflowed |= want != exact
    assert overflowed or width >= 31, "no case overflowed the register"


@pytest.mark.parametrize("width, saturate", CASES)
def test_matmul_batched_broadcast_and_signed_a(width, saturate):
    # int8 a, uint8 b, batch broadcasting [2, 1, M, K] x [3, K, N] and a 1-D b; large
    # products (|a - zp| up to 255) so every width overflows
    name = _name(width, saturate)
    rng = np.random.default_rng(100 + width)
    a = rng.integers(-128, 128, (2, 1, 5, 30), dtype=np.int8)
    b = rng.integers(0, 256, (3, 30, 4), dtype=np.uint8)
    a_zp, b_zp = np.int8(127), np.uint8(0)
    got = qemu_q.matmul_integer(a, b, a_zp, b_zp, accumulator=name)
    assert got.shape == (2, 3, 5, 4)
    for i, j in itertools.product(range(2), range(3)):
        assert got[i, j].tolist() == matmul_oracle(ints(a[i, 0]), ints(b[j]), 127, 0, name)
    v = rng.integers(0, 256, 30, dtype=np.uint8)
    got1 = qemu_q.matmul_integer(a[0, 0], v, a_zp, b_zp, accumulator=name)
    assert got1.shape == (5,)
    assert got1.tolist() == [row[0] for row in matmul_oracle(ints(a[0, 0]), [[x] for x in ints(v)], 127, 0, name)]


CONV_CASES = [
    # x shape, w shape, group, pads, strides, dilations
    ((1, 3, 7, 6), (4, 3, 3, 3), 1, [1, 0, 2, 1], [1, 1], [1, 1]),
    ((2, 4, 9, 9), (6, 2, 3, 2), 2, [0, 1, 1, 0], [2, 1], [1, 2]),
    ((1, 3, 5, 5), (3, 1, 3, 3), 3, [1, 1, 1, 1], [1, 2], [1, 1]),   # depthwise
    ((2, 5, 20), (3, 5, 4), 1, [2, 1], [3], [2]),                    # 1-D
    ((1, 2, 3, 4, 4), (2, 2, 2, 2, 2), 1, [0, 1, 0, 1, 0, 1], [1, 1, 2], [1, 1, 1]),  # 3-D
]


@pytest.mark.parametrize("width, saturate", CASES)
def test_conv_integer_against_oracle(width, saturate):
    name = _name(width, saturate)
    rng = np.random.default_rng(200 + width * 2 + saturate)
    overflowed = False
    for x_shape, w_shape, group, pads, strides, dilations in CONV_CASES:
        x = rng.integers(0, 256, x_shape, dtype=np.uint8)
        w = rng.integers(-128, 128, w_shape, dtype=np.int8)
        x_zp = np.uint8(rng.integers(0, 256))
        w_zp = rng.integers(-128, 128, w_shape[0], dtype=np.int8)
        got = qemu_q.conv_integer(x, w, x_zp, w_zp, group=group, pads=pads, strides=strides,
                                  dilations=dilations, accumulator=name)
        want = conv_oracle(ints(x), ints(w), int(x_zp), ints(w_zp), None, group, pads, strides, dilations, name)
        assert got.dtype == np.int32 and got.shape == want.shape and got.tolist() == want.tolist(), (name, x_shape)
        exact = conv_oracle(ints(x), ints(w), int(x_zp), ints(w_zp), None, group, pads, strides, dilations,
                            "int32-saturate")
        overflowed |= want.tolist() != exact.tolist()
    assert overflowed or width >= 24, "no case overflowed the register"


@pytest.mark.parametrize("width, saturate", CASES)
def test_qlinear_conv_against_oracle(width, saturate):
    # the bias is the register's initial value (beyond the narrow range on purpose), the
    # requantization the "exact" rule on the register's final value
    name = _name(width, saturate)
    rng = np.random.default_rng(300 + width * 2 + saturate)
    x_shape, w_shape, group, pads, strides, dilations = CONV_CASES[1]
    x = rng.integers(0, 256, x_shape, dtype=np.uint8)
    w = rng.integers(-128, 128, w_shape, dtype=np.int8)
    x_zp, w_zp = np.uint8(17), np.int8(-3)
    bias = rng.integers(-(1 << 31), 1 << 31, w_shape[0], dtype=np.int64).astype(np.int32)
    bias[0], bias[1] = 2**31 - 1, -2**31
    sx, sw, sy = np.float32(0.5), np.float32(0.25), np.float32(64.0)
    y = qemu_q.qlinear_conv(x, sx, x_zp, w, sw, w_zp, sy, np.uint8(128), bias, group=group, pads=pads,
                            strides=strides, dilations=dilations, accumulator=name)
    acc = conv_oracle(ints(x), ints(w), 17, -3, ints(bias), group, pads, strides, dilations, name)
    scale = Fraction(1, 2) * Fraction(1, 4) / 64
    want = np.vectorize(lambda v: requantize_oracle(v, scale, 128, 0, 255), otypes=[object])(acc)
    assert y.dtype == np.uint8 and y.tolist() == want.tolist()


@pytest.mark.parametrize("name", NAMED + ["int8", "int12-saturate"])
@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
def test_qlinear_matmul_requantizes_the_register(name, rule):
    # per-row a scale, per-column b scale; a unit multiplier (0.5 * 4 / 2) keeps every rule
    # exact, so y = clip(acc + y_zp) for each rule
    rng = np.random.default_rng(400)
    a = rng.integers(0, 256, (6, 50), dtype=np.uint8)
    b = rng.integers(-128, 128, (50, 7), dtype=np.int8)
    a_zp, b_zp = np.uint8(3), np.int8(5)
    y = qemu_q.qlinear_matmul(a, np.float32(0.5), a_zp, b, np.float32(4.0), b_zp, np.float32(2.0), np.int8(-7),
                              requantization=rule, accumulator=name)
    acc = matmul_oracle(ints(a), ints(b), 3, 5, name)
    assert y.dtype == np.int8
    assert y.tolist() == [[max(-128, min(127, v - 7)) for v in row] for row in acc]


# ------------------------------------------------------------------ independence


def test_int32_is_order_independent_and_unchanged():
    # "int32" wraps the exact sum (any order); the sequential oracle agrees with that sum
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (3, 80000), dtype=np.uint8)
    b = np.full((80000, 2), 127, np.int8)
    b[::3, 1] = -128
    got = qemu_q.matmul_integer(a, b, np.uint8(0), np.int8(-128))
    wrap = register(32, False)
    for r in range(3):
        for c in range(2):
            exact = sum(int(x) * (int(b[j, c]) + 128) for j, x in enumerate(a[r]))
            assert exact > 2**31 or c == 1
            assert got[r, c] == wrap(exact)
    # the same products in reverse order give the same register
    assert np.array_equal(qemu_q.matmul_integer(a[:, ::-1], b[::-1], np.uint8(0), np.int8(-128)), got)


@pytest.mark.parametrize("name", NAMED + ["int8", "int31-saturate"])
def test_threads_and_levels(name):
    rng = np.random.default_rng(11)
    a = rng.integers(0, 256, (2, 70, 300), dtype=np.uint8)
    b = rng.integers(-128, 128, (300, 530), dtype=np.int8)
    x = rng.integers(0, 256, (2, 6, 30, 30), dtype=np.uint8)
    w = rng.integers(-128, 128, (8, 3, 3, 3), dtype=np.int8)
    bias = rng.integers(-2**31, 2**31, 8, dtype=np.int64).astype(np.int32)
    one = np.float32(1.0)
    level = _kernels.active.level
    results = []
    try:
        for lv in _kernels.available_levels():
            _kernels.use(lv)
            for n in (1, 2, 3, 8):
                results.append((
                    qemu_q.matmul_integer(a, b, np.uint8(9), np.int8(-4), accumulator=name, n_threads=n),
                    qemu_q.qlinear_conv(x, one, np.uint8(5), w, one, np.int8(2), np.float32(3.0), np.uint8(1),
                                        bias, group=2, pads=[1, 1, 0, 2], accumulator=name, n_threads=n),
                ))
    finally:
        _kernels.use(level)
    for other in results[1:]:
        for first, got in zip(results[0], other):
            assert first.dtype == got.dtype and np.array_equal(first, got)
    # spot-check one output against the oracle so the comparison above is not of wrong bits
    row = ints(a[1, 33])
    col = [v - (-4) for v in ints(b[:, 517])]
    want = sequential(((x_ - 9) * y_ for x_, y_ in zip(row, col)), register(*parse(name)))
    assert results[0][0][1, 33, 517] == want


# ------------------------------------------------------------------ bad values


@pytest.mark.parametrize("bad", ["int64", "int7", "int33", "int0", "int016", "INT16", "int16-sat",
                                 "int16-wrap", "int-16", "int+16", "int 16", "int１６", "saturate", "",
                                 16, b"int16", "int32-saturate ", "uint16"])
def test_bad_accumulator_values(bad):
    a, b = np.zeros((2, 3), np.uint8), np.zeros((3, 2), np.int8)
    x, w = np.zeros((1, 1, 3, 3), np.uint8), np.zeros((1, 1, 2, 2), np.int8)
    one = np.float32(1.0)
    pattern = r"accumulator=" + __import__("re").escape(repr(bad)) + r"; allowed: 'int32'.*'x86-u8s8-pairs'.*'int<N>'.*8\.\.32"
    calls = [
        lambda: qemu_q.matmul_integer(a, b, accumulator=bad),
        lambda: qemu_q.qlinear_matmul(a, one, np.uint8(0), b, one, np.int8(0), one, np.uint8(0), accumulator=bad),
        lambda: qemu_q.conv_integer(x, w, accumulator=bad),
        lambda: qemu_q.qlinear_conv(x, one, np.uint8(0), w, one, np.int8(0), one, np.uint8(0), accumulator=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=pattern):
            call()


def test_float8_operands_refuse_a_narrow_accumulator():
    e4m3 = ml_dtypes.float8_e4m3fn
    a = np.zeros((2, 3), e4m3)
    b = np.zeros((3, 2), e4m3)
    zero = np.zeros((), e4m3)
    with pytest.raises(ValueError, match=r"accumulator='int16-saturate' needs integer operands.*float8e4m3fn"):
        qemu_q.qlinear_matmul(a, np.float32(1), zero, b, np.float32(1), zero, np.float32(1), zero, opset=21,
                              accumulator="int16-saturate")


@pytest.mark.parametrize("level", _kernels.available_levels())
def test_kernel_entry_checks_its_arrays(level):
    module = _kernels.load(level).integer
    a = np.zeros((1, 2, 3), np.int16)
    b = np.zeros(12, np.int16)
    base, k_off, n_off = np.zeros(1, np.intp), np.arange(3, dtype=np.intp) * 4, np.arange(4, dtype=np.intp)
    index = np.zeros(1, np.intp)
    init = np.zeros((1, 2), np.int32)
    out = np.empty((1, 2, 4), np.int32)
    config = module.AccumulatorConfig(items=1, rows=2, depth=3, cols=4, width=16, saturate=True)
    for bad in ((base + 1, k_off, n_off), (base, k_off + 1, n_off), (base, k_off, n_off - 1)):
        with pytest.raises(ValueError, match="offsets reach outside b"):
            module.accumulate(a, b, *bad, index, index, init, out, config, 1)
    with pytest.raises(ValueError, match="do not match the configuration"):
        module.accumulate(a, b, base, k_off, n_off, index, index, np.zeros((1, 3), np.int32), out, config, 1)
    with pytest.raises(ValueError, match="width=33"):
        module.AccumulatorConfig(items=1, rows=2, depth=3, cols=4, width=33, saturate=False)
    # the initial value is reduced to the width before the first add (K = 0 shows it)
    for saturate, want in ((True, [32767, -32768]), (False, [70000 - 65536, -70000 + 65536])):
        cfg = module.AccumulatorConfig(items=1, rows=2, depth=0, cols=4, width=16, saturate=saturate)
        out0 = np.empty((1, 2, 4), np.int32)
        module.accumulate(np.zeros((1, 2, 0), np.int16), b, base, np.zeros(0, np.intp), n_off, index, index,
                          np.int32([[70000, -70000]]), out0, cfg, 2)
        assert out0[0, :, 0].tolist() == want and (out0 == out0[:, :, :1]).all()
