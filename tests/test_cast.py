"""Cast and CastLike against exact oracles written from the spec text and docs/semantics.md
("Cast"): fractions and Python integers, tests/float_oracle.py for the small floats; never
ml_dtypes' conversions, onnx.reference or qemu_q itself."""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo
import qemu_q
from support import bits

F32, F16, F64, BF16 = np.float32, np.float16, np.float64, ml_dtypes.bfloat16
SMALL = [f for f in fo.FORMATS.values() if f.kind != "e8m0"]
CAST_OPSETS = {"float8_e4m3fn": (19, 21, 23, 24, 25, 28), "float8_e4m3fnuz": (19, 23, 24, 28),
               "float8_e5m2": (19, 25, 28), "float8_e5m2fnuz": (19, 21, 24, 28),
               "float4_e2m1fn": (23, 25, 28), "float6_e2m3fn": (28,), "float6_e3m2fn": (28,)}
ROUND_MODES = ("up", "down", "nearest")


def f64(x) -> np.ndarray:
    """float64 values of x, exactly (ml_dtypes flags its NaNs as invalid casts)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(x).astype(np.float64)


def every(dtype) -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)


def cast_codes(fmt, x, saturate, opset):
    """The Cast oracle for a small float: QuantizeLinear's table rows, NaN into float4/float6
    as the negative-zero code (docs/semantics.md)."""
    want = fo.encode_array(fmt, f64(x), saturate, opset=opset)
    if fmt.kind == "none":
        want = np.where(np.isnan(f64(x)), fmt.sign_mask, want)
    return want


def e8m0_oracle(x: np.ndarray, mode: str, saturate: int) -> np.ndarray:
    """Cast's float8e8m0 rows on x itself, then the round mode between powers of two. frexp
    is exact: x = m * 2**e with 0.5 <= m < 1."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        m, e = np.frexp(np.where(np.isfinite(x) & (x > 0), x, 1.0))
    k = e.astype(np.int64) - 1                     # x = (2m) * 2**k, 1 <= 2m < 2
    step = {"up": m > 0.5, "down": np.zeros_like(m, bool), "nearest": m >= 0.75}[mode]
    code = k + step + 127
    out_low = 0x00 if saturate else 0xFF
    out_high = 0xFE if saturate else 0xFF
    code = np.where(x > 2.0 ** 127, out_high, code)
    code = np.where(~(x >= 2.0 ** -127), out_low, code)   # 0, -0, negatives, -inf, tiny
    code = np.where(np.isnan(x), 0xFF, code)
    return code.astype(np.uint8)


# ------------------------------------------------------------------ small floats and e8m0


@pytest.mark.parametrize("source", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_every_half_into_small_floats(source, fmt):
    x = every(source)
    for opset in CAST_OPSETS[fmt.name]:
        for saturate in (0, 1):
            got = qemu_q.cast(x, fo.ONNX_NAME[fmt.name], saturate=saturate, opset=opset)
            want = cast_codes(fmt, f64(x), saturate, opset)
            bad = np.nonzero(got.view(np.uint8) != want)[0]
            assert bad.size == 0, (fmt.name, opset, saturate, [
                (hex(int(x.view(np.uint16)[i])), hex(int(got.view(np.uint8)[i])), hex(int(want[i])))
                for i in bad[:5]])


def float32_neighbourhoods(points) -> np.ndarray:
    """Each float32 point and its neighbours one ulp away, both signs."""
    p = np.asarray(points, np.float32)
    near = np.concatenate([p, np.nextafter(p, F32(np.inf)), np.nextafter(p, F32(-np.inf))])
    return np.concatenate([near, -near])


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_float32_midpoints_into_small_floats(fmt):
    # every midpoint between neighbouring codes, every code, the overflow thresholds
    points = [float(v) for v in fo.midpoints(fmt)] + [float(v) for v in fo.positive_values(fmt)[0]]
    points += [float(fmt.max_finite) * 2, 65504.0, 3.0e38, 1e-30]
    x = float32_neighbourhoods(points)
    x = np.concatenate([x, np.float32([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0])])
    for opset in CAST_OPSETS[fmt.name]:
        for saturate in (0, 1):
            got = qemu_q.cast(x, fo.ONNX_NAME[fmt.name], saturate=saturate, opset=opset)
            np.testing.assert_array_equal(got.view(np.uint8), cast_codes(fmt, x, saturate, opset))
            # the general (scalar) kernel path gives the same bits as the float32 loop
            general = qemu_q.cast(x.astype(F64), fo.ONNX_NAME[fmt.name], saturate=saturate, opset=opset)
            np.testing.assert_array_equal(general.view(np.uint8), got.view(np.uint8))


@pytest.mark.parametrize("mode", ROUND_MODES)
@pytest.mark.parametrize("saturate", [0, 1])
def test_e8m0_every_half_and_float32_boundary(mode, saturate):
    powers = [2.0 ** k for k in range(-149, 128)]
    mids = [1.5 * 2.0 ** k for k in range(-149, 127)]
    x32 = float32_neighbourhoods(powers + mids + [3.4e38])
    x32 = np.concatenate([x32, np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0])])
    for x in (every(F16), every(BF16), x32, x32.astype(F64)):
        got = qemu_q.cast(x, "float8e8m0", saturate=saturate, round_mode=mode, opset=25)
        want = e8m0_oracle(f64(x), mode, saturate)
        np.testing.assert_array_equal(got.view(np.uint8), want, err_msg=f"{x.dtype} {mode} {saturate}")


def test_e8m0_spec_table_rows():
    # The two columns of the Cast-24 table, row by row (docs/semantics.md).
    x = np.float32([0.0, np.nan, np.inf, 2.0 ** 127 * 1.5, 2.0 ** -128])
    up = qemu_q.cast(x, "float8e8m0", saturate=1, round_mode="up", opset=24)
    assert up.view(np.uint8).tolist() == [0x00, 0xFF, 0xFE, 0xFE, 0x00]
    nearest = qemu_q.cast(x, "float8e8m0", saturate=0, round_mode="nearest", opset=24)
    assert nearest.view(np.uint8).tolist() == [0xFF] * 5
    # the cases peers disagree on (docs/divergences.md)
    assert qemu_q.cast(np.float32([2.0 ** -127]), "float8e8m0").view(np.uint8).tolist() == [0x00]
    assert qemu_q.cast(np.float32([-2.0]), "float8e8m0").view(np.uint8).tolist() == [0x00]
    assert qemu_q.cast(np.float32([-2.0]), "float8e8m0", saturate=0).view(np.uint8).tolist() == [0xFF]
    down = qemu_q.cast(np.float32([1.5 * 2.0 ** 127]), "float8e8m0", saturate=0, round_mode="down")
    assert down.view(np.uint8).tolist() == [0xFF]


@pytest.mark.parametrize("fmt", [*SMALL, fo.E8M0], ids=lambda f: f.name)
@pytest.mark.parametrize("target", [F32, F16, BF16, F64], ids=["float", "float16", "bfloat16", "double"])
def test_every_code_out(fmt, target):
    codes = np.arange(fmt.n_codes, dtype=np.uint8)
    x = codes.view(fo.FORMATS[fmt.name].dtype if hasattr(fmt, "dtype") else getattr(ml_dtypes, fmt.name))
    opset = 28 if fmt.name.startswith("float6") else 25
    got = qemu_q.cast(x, np.dtype(target), opset=opset)
    name = {F32: "float", F16: "float16", BF16: "bfloat16", F64: None}[target]
    for c, g in zip(codes.tolist(), got.tolist()):
        v = fo.decode(fmt, c)
        if v == "nan":
            assert math.isnan(g) and math.copysign(1, g) == (-1 if fo.sign_bit(fmt, c) else 1), (fmt.name, c)
            continue
        want = {"+inf": math.inf, "-inf": -math.inf}.get(v) if isinstance(v, str) else v
        if name is not None and not isinstance(want, float):
            want = fo.round_to_binary(Fraction(want), name)  # exact for every format but e8m0 into float16/bfloat16
        assert Fraction(g) == want if not isinstance(want, float) else g == want, (fmt.name, hex(c), g, want)
        if want == 0:
            assert math.copysign(1, g) == (-1 if fo.sign_bit(fmt, c) else 1)


# ------------------------------------------------------------------ IEEE targets, one rounding


def test_float64_into_halves_rounds_once():
    # For float16 midpoints m (exact in float64): m +- 2**-40 * ulp, which float32 would
    # round to m itself (a tie) before float16 rounds it again.
    halves = every(F16).astype(np.float64)
    halves = np.unique(halves[np.isfinite(halves) & (halves >= 0)])
    mids = (halves[:-1] + halves[1:]) / 2
    tiny = (halves[1:] - halves[:-1]) * 2.0 ** -30
    # every fifth midpoint, and every one of the lowest and highest binades
    keep = np.zeros(mids.size, bool)
    keep[::5] = keep[:1024] = keep[-1024:] = True
    mids, tiny = mids[keep], tiny[keep]
    x = np.concatenate([mids, mids + tiny, mids - tiny, -(mids + tiny), [65520.0 - 1e-9, 65520.0]])
    for target, name in ((F16, "float16"), (BF16, "bfloat16"), (F32, "float")):
        got = qemu_q.cast(x, np.dtype(target))
        want = [fo.round_to_binary(Fraction(float(v)), name) for v in x]
        for v, g, w in zip(x.tolist(), got.tolist(), want):
            assert (g == w) if isinstance(w, float) else Fraction(g) == w, (name, v, g, w)


def test_float64_into_small_floats_rounds_once():
    fmt = fo.FORMATS["float8_e4m3fn"]
    mids = np.array([float(m) for m in fo.midpoints(fmt)])
    tiny = np.abs(mids) * 2.0 ** -40
    x = np.concatenate([mids + tiny, mids - tiny])
    got = qemu_q.cast(x, "float8e4m3fn", opset=25)
    np.testing.assert_array_equal(got.view(np.uint8), cast_codes(fmt, x, 1, 25))
    # float32 would round each of these onto the midpoint, and a tie goes to even
    assert np.any(fo.encode_array(fmt, x.astype(F32).astype(F64), 1) != got.view(np.uint8))


def test_64_bit_integers_into_floats_round_once():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.integers(-2**63, 2**63 - 1, 2000, dtype=np.int64, endpoint=True),
                        np.int64([2**63 - 1, -2**63, 2**53 + 1, 2**24 + 1, -(2**24 + 3), 0])])
    u = np.concatenate([rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64, endpoint=True),
                        np.uint64([2**64 - 1, 2**63 + 2**39 + 1, 2**53 + 1])])
    for source in (x, u):
        for target, name in ((F32, "float"), (F16, "float16"), (BF16, "bfloat16")):
            got = f64(qemu_q.cast(source, np.dtype(target))).tolist()
            want = [fo.round_to_binary(Fraction(int(v)), name) for v in source]
            assert all((g == w) if isinstance(w, float) else Fraction(g) == w
                       for g, w in zip(got, want)), (source.dtype, name)
        got64 = qemu_q.cast(source, F64).tolist()
        assert all(Fraction(g) == round_to_double(int(v)) for g, v in zip(got64, source.tolist()))
        codes = qemu_q.cast(source, "float8e5m2", saturate=0).view(np.uint8)
        want8 = [fo.encode("float8_e5m2", Fraction(int(v)), 0) for v in source]
        assert codes.tolist() == want8


def round_to_double(n: int) -> Fraction:
    a = abs(n)
    if a < 2**53:
        return Fraction(n)
    shift = a.bit_length() - 53
    q = fo.round_half_even(Fraction(a, 2**shift))
    return Fraction(q * 2**shift * (1 if n > 0 else -1))


# ------------------------------------------------------------------ integers and bool

INTEGERS = {"int8": (8, True), "uint8": (8, False), "int16": (16, True), "uint16": (16, False),
            "int32": (32, True), "uint32": (32, False), "int64": (64, True), "uint64": (64, False),
            "int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}


def wrap(n: int, target: str) -> int:
    width, signed = INTEGERS[target]
    n %= 1 << width
    return n - (1 << width) if signed and n >= 1 << (width - 1) else n


def integer_values(name: str) -> np.ndarray:
    width, signed = INTEGERS[name]
    dtype = qemu_q.element_type(name).dtype
    if width <= 16:
        lo = -(1 << (width - 1)) if signed else 0
        return np.arange(lo, lo + (1 << width), dtype=np.int64).astype(dtype)
    edges = [0, 1, 2, 127, 128, 255, 256, 32767, 32768, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
             2**32, 2**63 - 1]
    values = edges + [-v for v in edges] if signed else edges + [2**63, 2**64 - 1]
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    return np.array([v for v in values if lo <= v <= hi], dtype=object).astype(dtype)


@pytest.mark.parametrize("source", list(INTEGERS))
def test_integer_wrap_every_pair(source):
    x = integer_values(source)
    values = [int(v) for v in x.tolist()]
    for target in INTEGERS:
        opset = 25
        got = qemu_q.cast(x, target, opset=opset)
        assert [int(v) for v in got.tolist()] == [wrap(v, target) for v in values], (source, target)
    assert qemu_q.cast(np.int16([200]), "int8").tolist() == [-56]  # the spec's example


def test_float_into_integers():
    x = np.float64([2.7, -2.7, 0.5, -0.5, 1e20, -1e20, np.nan, np.inf, -np.inf, -0.0, 255.9, 256.0,
                    2.0 ** 63, -(2.0 ** 63), 2.0 ** 64, 127.5])
    for target in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
        width, signed = INTEGERS[target]
        lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
        for source in (F64, F32):
            got = [int(v) for v in qemu_q.cast(x.astype(source), target).tolist()]
            want = []
            for v in x.astype(source).tolist():
                if math.isnan(v):
                    want.append(0)
                elif math.isinf(v):
                    want.append(hi if v > 0 else lo)
                else:
                    want.append(min(max(math.trunc(v), lo), hi))
            assert got == want, (target, source)


def test_float_into_sub_byte_integers():
    # round half to even, then the low bits (the int4 / int2 notes; the opset-25 vectors)
    x = np.float32([-9, 8, 9, 2.5, 3.5, -2.5, 0.5, 1.5, 15.5, 1e10, np.nan, np.inf, -np.inf, 7.49])
    for target in ("int4", "uint4", "int2", "uint2"):
        for opset in (21, 25) if "4" in target else (25,):
            got = [int(v) for v in qemu_q.cast(x, target, opset=opset).tolist()]
            want = [0 if not math.isfinite(v) else wrap(fo.round_half_even(Fraction(v)), target)
                    for v in x.tolist()]
            assert got == want, target


def test_bool_both_ways():
    x = np.float32([0.0, -0.0, np.nan, 1e-45, -3.0, np.inf])
    assert qemu_q.cast(x, "bool").tolist() == [False, False, True, True, True, True]
    codes = np.uint8([0x00, 0x80, 0x7F, 0x01]).view(ml_dtypes.float8_e4m3fn)
    assert qemu_q.cast(codes, "bool", opset=19).tolist() == [False, False, True, True]
    assert qemu_q.cast(np.int64([0, -1, 2**40]), np.bool_).tolist() == [False, True, True]
    b = np.array([True, False])
    for target in ("float", "double", "float16", "bfloat16", "int4", "uint64", "float8e5m2"):
        assert f64(qemu_q.cast(b, target, opset=25)).tolist() == [1.0, 0.0], target
    assert np.array_equal(bits(qemu_q.cast(b, "float8e8m0", opset=25)), np.uint8([127, 0x00]))


# ------------------------------------------------------------------ QuantizeLinear consistency

# The one place the two ops' texts differ: NaN into float4/float6 (Cast: the opset-25 vectors'
# negative zero; QuantizeLinear: +max, the float4 note). Listed here, nowhere else.
EXCEPTIONS = {"float4_e2m1fn": "NaN", "float6_e2m3fn": "NaN", "float6_e3m2fn": "NaN"}


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name)
def test_quantize_linear_with_scale_one_is_cast(fmt):
    sample = np.random.default_rng(3).standard_normal(4096).astype(F32) * 64
    for source in (every(F16), every(BF16), sample):
        for opset in CAST_OPSETS[fmt.name]:
            if opset < 21 and source.dtype != F32 and fmt.name.startswith("float4"):
                continue
            for saturate in (0, 1):
                cast = qemu_q.cast(source, fo.ONNX_NAME[fmt.name], saturate=saturate, opset=opset)
                quantized = qemu_q.quantize_linear(source, np.array(1, source.dtype),
                                                   output_dtype=fo.ONNX_NAME[fmt.name],
                                                   saturate=saturate, opset=max(opset, 21))
                differ = cast.view(np.uint8) != quantized.view(np.uint8)
                allowed = np.isnan(f64(source)) if fmt.name in EXCEPTIONS else np.zeros_like(differ)
                assert not np.any(differ & ~allowed), (fmt.name, opset, saturate)
                if fmt.name in EXCEPTIONS and np.isnan(f64(source)).any():
                    assert np.all(differ[np.isnan(f64(source))])


# ------------------------------------------------------------------ API, versions, errors


def test_run_op_and_cast_like():
    x = np.float32([1.0, 3.0, np.nan])
    (y,) = qemu_q.run_op("Cast", [x], {"to": 24, "round_mode": b"down", "saturate": 1}, 25)
    assert y.view(np.uint8).tolist() == [127, 128, 0xFF]
    (z,) = qemu_q.run_op("CastLike", [x, np.zeros(0, ml_dtypes.float8_e8m0fnu)], {"round_mode": "down"}, 25)
    assert np.array_equal(bits(z), bits(y))
    assert qemu_q.cast_like(np.float64([2.5]), np.zeros((), F16)).dtype == F16


def test_opset_resolution_and_attributes():
    x = np.float32([1e30])
    with pytest.raises(ValueError, match=r"Cast-13 \(opset 18\) has no attribute 'saturate'.*opset 19"):
        qemu_q.cast(x, "float16", saturate=0, opset=18)
    with pytest.raises(ValueError, match=r"has no attribute 'round_mode'.*opset 24"):
        qemu_q.cast(x, "float", round_mode="down", opset=23)
    with pytest.raises(TypeError, match=r"Cast-19 \(opset 19\) does not accept output of type int4; int4 needs opset >= 21"):
        qemu_q.cast(x, "int4", opset=19)
    with pytest.raises(TypeError, match=r"Cast-9 \(opset 12\) does not accept input of type bfloat16"):
        qemu_q.cast(np.zeros(2, BF16), "float", opset=12)
    with pytest.raises(ValueError, match=r"round_mode='sideways'; allowed 'up', 'down', 'nearest'"):
        qemu_q.cast(x, "float8e8m0", round_mode="sideways")
    with pytest.raises(ValueError, match=r"saturate=2; allowed 0 or 1"):
        qemu_q.cast(x, "float8e4m3fn", saturate=2)
    with pytest.raises(TypeError, match=r"to=8: tensor\(string\) is not supported"):
        qemu_q.cast(x, 8)
    with pytest.raises(TypeError, match=r"x has dtype <U1: tensor\(string\) is not supported"):
        qemu_q.cast(np.array(["a"]), "float")
    with pytest.raises(ValueError, match=r"CastLike has versions 15, 19, 21, 23, 24, 25"):
        qemu_q.cast_like(x, np.zeros(1, F16), opset=14)
    # saturate is read only where the table has it: float16 overflows to inf either way
    assert qemu_q.cast(x, "float16", saturate=0, opset=25).tolist() == [math.inf]


def test_cast_to_the_same_type_keeps_every_bit():
    for dtype in (F16, BF16, F32, np.float64):
        x = every(dtype)[:256] if dtype != np.float64 else np.uint64(
            [0x7FF0000000000001, 0xFFF8000000000001, 0x3FF0000000000001]).view(np.float64)
        y = qemu_q.cast(x, np.dtype(dtype), opset=25)
        assert y is not x and np.array_equal(bits(y), bits(x)), dtype  # signalling NaNs too
    x = np.uint16([0x7C01, 0xFC01]).view(F16)
    assert bits(qemu_q.cast(x, F16)).tolist() == [0x7C01, 0xFC01]


def test_cast_e5m2_to_e5m2_applies_the_table():
    # The table's rows apply to x whatever its type: "Inf -> FLT_MAX" with saturate, the
    # NaN code 0x7E / 0xFE; every finite code is its own value.
    codes = np.arange(256, dtype=np.uint8)
    x = codes.view(ml_dtypes.float8_e5m2)
    finite = (codes & 0x7C) != 0x7C
    inf = (codes & 0x7F) == 0x7C
    nan = ((codes & 0x7C) == 0x7C) & ~inf
    for saturate in (1, 0):
        y = bits(qemu_q.cast(x, ml_dtypes.float8_e5m2, saturate=saturate, opset=25))
        assert np.array_equal(y[finite], codes[finite])
        top = 0x7B if saturate else 0x7C
        assert y[inf].tolist() == [top, top | 0x80]
        assert y[nan].tolist() == [0x7E] * 3 + [0xFE] * 3


def test_input_unchanged_and_out():
    x = np.float32([[1.5, -2.25], [np.nan, 7.0]])
    before = x.copy()
    out = np.empty((2, 2), ml_dtypes.float8_e4m3fn)
    y = qemu_q.cast(x, "float8e4m3fn", out=out)
    assert y is out and np.array_equal(bits(x), bits(before))
    assert out.view(np.uint8).tolist() == [[0x3C, 0xC1], [0x7F, 0x4E]]
    with pytest.raises(TypeError, match="out has dtype float32"):
        qemu_q.cast(x, "float8e4m3fn", out=np.empty((2, 2), F32))
    strided = np.float32(np.arange(12)).reshape(3, 4)[:, ::2]
    assert qemu_q.cast(strided, "int8").tolist() == [[0, 2], [4, 6], [8, 10]]


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_thread_count_changes_no_bit(n_threads):
    x = np.random.default_rng(7).standard_normal(300_001).astype(F32) * 100
    ref = {t: qemu_q.cast(x, t, n_threads=1) for t in ("float8e4m3fn", "float8e8m0", "int4", "bfloat16")}
    for t, want in ref.items():
        assert np.array_equal(bits(qemu_q.cast(x, t, n_threads=n_threads)), bits(want)), t
