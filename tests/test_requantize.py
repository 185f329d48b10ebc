"""qemu_q.requantize and qemu_q.quantize_multiplier against tests/requantize_oracle.py, an
independent Python-integer transcription of each scheme's source (docs/semantics.md,
"Integer-only requantization"): every shift of each scheme's range with the multiplier
extremes, int32-extreme, boundary and random accumulators, every output type with its
zero point and saturation, per-channel layouts, thread counts and instruction-set levels,
the elements a source leaves undefined, bad arguments, and quantize_multiplier against
Fraction arithmetic."""

import importlib
import math
import random
import re

import ml_dtypes
import numpy as np
import pytest

import qemu_q
import requantize_oracle as oracle
from qemu_q import _kernels
from support import assert_same_bits

# the module, which qemu_q.ops' function of the same name hides
requantize_module = importlib.import_module("qemu_q.ops.requantize")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
SCHEMES = ["tosa32", "tosa16", "gemmlowp", "tflite_single", "tvm_upward", "tvm_tonearest"]
# (scheme, double_round) pairs: tosa32 both ways
VARIANTS = [("tosa32", False), ("tosa32", True)] + [(s, None) for s in SCHEMES[1:]]
SHIFTS = {"tosa32": (2, 62), "tosa16": (2, 62), "gemmlowp": (-31, 30), "tflite_single": (-31, 30),
          "tvm_upward": (-32, 31), "tvm_tonearest": (-32, 31)}
MULTIPLIERS = {
    "tosa32": [0, 1, 2**30, 2**30 + 1, INT32_MAX],
    "tosa16": [0, 1, 2**14, 2**14 + 1, 32767],
    "gemmlowp": [INT32_MIN, INT32_MIN + 1, -(2**30), -1, 0, 1, 2**30, 2**30 + 1, INT32_MAX],
    "tflite_single": [0, 1, 2**30, 2**30 + 1, INT32_MAX],
    "tvm_upward": [INT32_MIN, INT32_MIN + 1, -(2**30), -1, 0, 1, 2**30, 2**30 + 1, INT32_MAX],
    "tvm_tonearest": [INT32_MIN, INT32_MIN + 1, -(2**30), -1, 0, 1, 2**30, 2**30 + 1, INT32_MAX],
}
OUT_TYPES = {
    "int8": (np.int8, -128, 127), "uint8": (np.uint8, 0, 255), "int16": (np.int16, -32768, 32767),
    "uint16": (np.uint16, 0, 65535), "int4": (ml_dtypes.int4, -8, 7), "uint4": (ml_dtypes.uint4, 0, 15),
    "int2": (ml_dtypes.int2, -2, 1), "uint2": (ml_dtypes.uint2, 0, 3), "int32": (np.int32, INT32_MIN, INT32_MAX),
}


def _accumulators(shift, rng):
    values = {INT32_MIN, INT32_MIN + 1, -(2**30), -65537, -65536, -3, -2, -1, 0, 1, 2, 3, 65535,
              65536, 2**30, INT32_MAX - 1, INT32_MAX}
    for s in (abs(shift), abs(shift) - 1, 31 - shift if shift <= 31 else 0):
        if 0 < s <= 31:  # the boundaries around 2^(s-1) (TOSA's REQUIRE, ties of the shift)
            for base in (2 ** (s - 1), -(2 ** (s - 1))):
                for d in (-1, 0, 1):
                    values.add(max(INT32_MIN, min(INT32_MAX, base + d)))
    for _ in range(24):
        bits = rng.randrange(1, 32)
        values.add(rng.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1)))
    return sorted(values)


def _run(acc, multiplier, shift, scheme, double_round, **kw):
    return qemu_q.requantize(np.asarray(acc, dtype=np.int32), multiplier, shift, scheme=scheme,
                             double_round=double_round, **kw)


def test_kernel_tables_match_the_python_layer():
    module = _kernels.active.requantize
    assert module.SHIFT_RANGES == requantize_module.SHIFT_RANGES
    assert module.MULTIPLIER_RANGES == requantize_module.MULTIPLIER_RANGES
    assert tuple(module.SCHEMES) == requantize_module.SCHEMES
    assert requantize_module.SHIFT_RANGES == SHIFTS


@pytest.mark.parametrize("scheme,double_round", VARIANTS)
def test_every_shift_and_multiplier_extreme(scheme, double_round):
    rng = random.Random(hash((scheme, double_round)) & 0xFFFF)
    lo, hi = SHIFTS[scheme]
    checked = undefined = 0
    for shift in range(lo, hi + 1):
        accs = _accumulators(shift, rng)
        for m in MULTIPLIERS[scheme]:
            expected = [oracle.apply(scheme, x, m, shift, bool(double_round)) for x in accs]
            good = [x for x, e in zip(accs, expected) if e is not None]
            if good:
                got = _run(good, m, shift, scheme, double_round, output_dtype="int32")
                want = np.array([e for e in expected if e is not None], dtype=np.int32)
                assert_same_bits(got, want, f"{scheme} dr={double_round} m={m} shift={shift}")
                checked += len(good)
            for x in [x for x, e in zip(accs, expected) if e is None][:2]:
                with pytest.raises(ValueError, match=rf"requantize\[{scheme}\]: acc\[0\]={x} with multiplier={m}, shift={shift}"):
                    _run([x], m, shift, scheme, double_round, output_dtype="int32")
                undefined += 1
    assert checked > 1000


def test_pinned_corners():
    # gemmlowp: INT32_MIN x INT32_MIN saturates in SaturatingRoundingDoublingHighMul
    assert int(_run([INT32_MIN], INT32_MIN, 0, "gemmlowp", None, output_dtype="int32")[0]) == INT32_MAX
    # TVM: the same product is 2^62; + 2^30, >> 31 gives 2^31, whose low 32 bits are INT32_MIN
    assert int(_run([INT32_MIN], INT32_MIN, 0, "tvm_upward", None, output_dtype="int32")[0]) == INT32_MIN
    # ties: -1.5 and +1.5 (x = -3 / 3, multiplier 2^30 = 0.5, no shift)
    half = 2**30
    assert _run([-3, 3], half, 0, "gemmlowp", None, output_dtype="int32").tolist() == [-1, 2]
    assert _run([-3, 3], half, 0, "tflite_single", None, output_dtype="int32").tolist() == [-1, 2]
    assert _run([-3, 3], half, 0, "tvm_upward", None, output_dtype="int32").tolist() == [-1, 2]
    assert _run([-3, 3], half, 0, "tvm_tonearest", None, output_dtype="int32").tolist() == [-2, 2]
    # gemmlowp's second rounding: x = -5, multiplier 2^30, shift -1: SRDHM gives -2 (-2.5 up),
    # RoundingDivideByPOT(-2, 1) gives -1 (-1 away from zero is -1: remainder 0)
    assert _run([-5, 5], half, -1, "gemmlowp", None, output_dtype="int32").tolist() == [-1, 2]
    # tosa32 double rounding adds +-2^30 only when shift > 31; its sign follows the value:
    # +-3 * (2^31 - 1) / 2^32 = +-1.4999999993 rounds to +-2 with it, +-1 without
    assert _run([3, -3], 2**31 - 1, 32, "tosa32", True, output_dtype="int32").tolist() == [2, -2]
    assert _run([3, -3], 2**31 - 1, 32, "tosa32", False, output_dtype="int32").tolist() == [1, -1]


@pytest.mark.parametrize("name", list(OUT_TYPES))
@pytest.mark.parametrize("scheme", ["tosa32", "gemmlowp", "tvm_tonearest"])
def test_output_types_zero_point_and_saturation(name, scheme):
    dtype, lo, hi = OUT_TYPES[name]
    rng = random.Random(7)
    accs = [INT32_MIN + 1, -1000000, -70000, -300, -129, -5, -1, 0, 1, 5, 127, 128, 300, 70000, 1000000, INT32_MAX]
    accs += [rng.randrange(-(2**20), 2**20) for _ in range(50)]
    m, shift = (2**30, 33) if scheme == "tosa32" else (2**30, 0)
    zero_points = sorted({lo, hi, 0 if lo <= 0 <= hi else lo, (lo + hi) // 2})
    for zp in zero_points:
        got = _run(accs, m, shift, scheme, None, zero_point=zp, output_dtype=name)
        want = [min(hi, max(lo, oracle.apply(scheme, x, m, shift) + zp)) for x in accs]
        assert_same_bits(got, np.array(want, dtype=np.int64).astype(dtype), f"{scheme} {name} zp={zp}")


@pytest.mark.parametrize("scheme,double_round", VARIANTS)
@pytest.mark.parametrize("shape,axis", [((3, 5, 7), 1), ((4, 6), -1), ((5, 3), 0), ((2, 3, 4, 5), 2)])
def test_per_channel(scheme, double_round, shape, axis):
    rng = np.random.default_rng(11)
    channels = shape[axis]
    lo, hi = SHIFTS[scheme]
    mlo, mhi = requantize_module.MULTIPLIER_RANGES[scheme]
    if scheme.startswith("tosa"):
        shifts = rng.integers(33, hi + 1, channels)
    else:
        shifts = rng.integers(max(lo, -20), 1, channels)
    multipliers = rng.integers(max(mlo, 0), mhi, channels, endpoint=True)
    zero_points = rng.integers(-100, 100, channels)
    acc = rng.integers(-(2**24), 2**24, shape).astype(np.int32)
    got = qemu_q.requantize(acc, multipliers, shifts, scheme=scheme, zero_point=zero_points,
                            output_dtype="int16", axis=axis, double_round=double_round)
    moved = np.moveaxis(acc, axis, -1)
    want = np.empty(moved.shape, dtype=np.int64)
    for index in np.ndindex(moved.shape):
        c = index[-1]
        r = oracle.apply(scheme, int(moved[index]), int(multipliers[c]), int(shifts[c]), bool(double_round))
        want[index] = min(32767, max(-32768, r + int(zero_points[c])))
    assert_same_bits(got, np.moveaxis(want, -1, axis).astype(np.int16), f"{scheme} {shape} axis={axis}")
    # scalars broadcast beside a per-channel array
    got = qemu_q.requantize(acc, int(multipliers[0]), shifts, scheme=scheme, axis=axis,
                            output_dtype="int32", double_round=double_round)
    for index in np.ndindex(moved.shape):
        c = index[-1]
        expected = oracle.apply(scheme, int(moved[index]), int(multipliers[0]), int(shifts[c]), bool(double_round))
        assert int(np.moveaxis(got, axis, -1)[index]) == expected


@pytest.fixture
def restore_level():
    level = _kernels.active.level
    yield
    _kernels.use(level)


@pytest.mark.parametrize("scheme,double_round", VARIANTS)
@pytest.mark.parametrize("layout", ["last_axis", "runs_across_tasks"])
def test_threads_and_levels(scheme, double_round, layout, restore_level):
    # last_axis: a channel change every element; runs_across_tasks: runs of 70001 elements
    # per channel, which the 32768-element tasks cut in the middle
    rng = np.random.default_rng(5)
    shape, axis = ((3 * 32768 + 517, 3), 1) if layout == "last_axis" else ((3, 70001), 0)
    acc = rng.integers(-(2**20), 2**20, shape).astype(np.int32)
    acc.reshape(-1)[:3] = [-1, 0, 1]
    if not scheme.startswith("tosa"):
        acc.reshape(-1)[3:5] = [INT32_MIN, INT32_MAX]   # the tosa REQUIRE with shift 33 excludes them
    if scheme.startswith("tosa"):
        multipliers, shifts = np.array([2**30 if scheme == "tosa32" else 2**14, 12345, 32767]), np.array([40, 33, 50])
    else:
        multipliers, shifts = np.array([2**30, 1234567891, 7]), np.array([-1, -20, 0])
    expected = None
    for level in _kernels.available_levels():
        _kernels.use(level)
        for n in (1, 2, 8):
            got = qemu_q.requantize(acc, multipliers, shifts, scheme=scheme, axis=axis, zero_point=3,
                                    output_dtype="int16", double_round=double_round, n_threads=n)
            if expected is None:
                flat = acc.reshape(-1)
                sample = sorted(set(range(0, flat.size, 331)) | set(range(flat.size - 40, flat.size))
                                | {k * 32768 + d for k in range(1, 9) for d in (-1, 0) if k * 32768 < flat.size})
                for i in sample:
                    index = np.unravel_index(i, shape)
                    c = index[axis]
                    r = oracle.apply(scheme, int(flat[i]), int(multipliers[c]), int(shifts[c]), bool(double_round))
                    assert int(got[index]) == min(32767, max(-32768, r + 3)), (i, c)
                expected = got
            assert_same_bits(got, expected, f"{scheme} level={level} n_threads={n}")


def test_undefined_element_reported_is_the_first_whatever_the_threads():
    acc = np.zeros(4 * 32768 + 3, dtype=np.int32)
    acc[3 * 32768 + 7] = INT32_MAX   # x * 2^1 overflows int32 (gemmlowp left shift)
    acc[40000] = INT32_MIN
    for n in (1, 2, 8):
        with pytest.raises(ValueError, match=r"acc\[40000\]=-2147483648 with multiplier=5, shift=1: x \* \(1 << left_shift\)"):
            qemu_q.requantize(acc, 5, 1, scheme="gemmlowp", n_threads=n)


def test_inputs_not_modified():
    acc = np.arange(-50, 50, dtype=np.int32).reshape(10, 10)
    multipliers = np.full(10, 2**30, dtype=np.int64)
    shifts = np.arange(-9, 1, dtype=np.int32)
    zps = np.arange(10, dtype=np.int16)
    copies = [a.copy() for a in (acc, multipliers, shifts, zps)]
    qemu_q.requantize(acc, multipliers, shifts, scheme="gemmlowp", zero_point=zps, axis=1)
    for a, c in zip((acc, multipliers, shifts, zps), copies):
        assert_same_bits(a, c)


def test_out_argument_and_read_only_inputs():
    acc = np.arange(-40, 40, dtype=np.int32)
    acc.flags.writeable = False
    out = np.empty(80, dtype=np.int8)
    got = qemu_q.requantize(acc, 2**30, -1, scheme="tflite_single", out=out)
    assert got is out
    assert out.tolist() == [oracle.tflite_single(int(x), 2**30, -1) for x in acc]
    with pytest.raises(TypeError, match="out has dtype int16"):
        qemu_q.requantize(acc, 2**30, -1, scheme="tflite_single", out=np.empty(80, np.int16))
    empty = qemu_q.requantize(np.zeros((0, 3), np.int32), 1, 0, scheme="gemmlowp")
    assert empty.shape == (0, 3) and empty.dtype == np.int8


@pytest.mark.parametrize("call,error,pattern", [
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="nope"), ValueError, r"scheme='nope'; allowed 'tosa32'"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme=3), TypeError, r"scheme must be a str, got int 3"),
    (lambda a: qemu_q.requantize(a.astype(np.int64), 1, 0, scheme="gemmlowp"), TypeError, r"acc must be an int32 array.*int64"),
    (lambda a: qemu_q.requantize(a.tolist(), 1, 0, scheme="gemmlowp"), TypeError, r"acc must be a numpy array"),
    (lambda a: qemu_q.requantize(a, -1, 40, scheme="tosa32"), ValueError, r"multiplier=-1 is outside the tosa32 multiplier range \[0, 2147483647\]"),
    (lambda a: qemu_q.requantize(a, 32768, 40, scheme="tosa16"), ValueError, r"multiplier=32768 is outside the tosa16 multiplier range \[0, 32767\]"),
    (lambda a: qemu_q.requantize(a, 2**31, 0, scheme="gemmlowp"), ValueError, r"multiplier=2147483648 is outside"),
    (lambda a: qemu_q.requantize(a, 1, 1, scheme="tosa32"), ValueError, r"shift=1 is outside the tosa32 shift range \[2, 62\]"),
    (lambda a: qemu_q.requantize(a, 1, 63, scheme="tosa16"), ValueError, r"shift=63 is outside the tosa16 shift range \[2, 62\]"),
    (lambda a: qemu_q.requantize(a, 1, 31, scheme="tflite_single"), ValueError, r"shift=31 is outside the tflite_single shift range \[-31, 30\]"),
    (lambda a: qemu_q.requantize(a, 1, -33, scheme="tvm_upward"), ValueError, r"shift=-33 is outside the tvm_upward shift range \[-32, 31\]"),
    (lambda a: qemu_q.requantize(a, 1, np.array([0, 0, 31]), scheme="gemmlowp"), ValueError, r"shift\[2\]=31 is outside the gemmlowp shift range"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", zero_point=128), ValueError, r"zero_point=128 is outside the int8 range \[-128, 127\]"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", zero_point=-1, output_dtype="uint4"), ValueError, r"zero_point=-1 is outside the uint4 range \[0, 15\]"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", double_round=True), ValueError, r"double_round=True applies to scheme 'tosa32' only"),
    (lambda a: qemu_q.requantize(a, 1, 40, scheme="tosa32", double_round=1), TypeError, r"double_round must be True or False, got int 1"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", output_dtype="float32"), ValueError, r"output_dtype='float32' \(float\); allowed int8"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", output_dtype="int64"), ValueError, r"output_dtype='int64' \(int64\); allowed"),
    (lambda a: qemu_q.requantize(a, 1.5, 0, scheme="gemmlowp"), TypeError, r"multiplier must be an int or an integer array, got float 1.5"),
    (lambda a: qemu_q.requantize(a, True, 0, scheme="gemmlowp"), TypeError, r"multiplier must be an int or an integer array, got bool"),
    (lambda a: qemu_q.requantize(a, np.array([1.0]), 0, scheme="gemmlowp"), TypeError, r"multiplier must have an integer dtype, got float64"),
    (lambda a: qemu_q.requantize(a, np.ones((3, 4), np.int32), 0, scheme="gemmlowp"), ValueError, r"multiplier must be a scalar or 1-D .* got shape \(3, 4\)"),
    (lambda a: qemu_q.requantize(a, np.ones(5, np.int32), 0, scheme="gemmlowp"), ValueError, r"per-channel parameters have 5 entries; they must have acc.shape\[1\] = 4"),
    (lambda a: qemu_q.requantize(a, np.ones(3, np.int32), 0, scheme="gemmlowp", axis=2), ValueError, r"axis=2 is out of range for acc of rank 2; allowed \[-2, 1\]"),
    (lambda a: qemu_q.requantize(a, np.ones(4, np.int32), np.zeros(3, np.int32), scheme="gemmlowp"), ValueError, r"per-channel parameters differ in length: multiplier has 4, shift has 3"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", axis=1.0), TypeError, r"axis must be an int, got float 1.0"),
    (lambda a: qemu_q.requantize(a, 1, 0, scheme="gemmlowp", n_threads=0), ValueError, r"n_threads"),
    (lambda a: qemu_q.requantize(a[:0], 1, 0, scheme="gemmlowp", n_threads=-1), ValueError, r"n_threads"),
])
def test_bad_arguments(call, error, pattern):
    acc = np.arange(12, dtype=np.int32).reshape(3, 4)
    before = acc.copy()
    with pytest.raises(error, match=pattern):
        call(acc)
    assert_same_bits(acc, before)


# ---------------------------------------------------------------------------------------
# quantize_multiplier

def _scales():
    tiny = math.ldexp(1.0, -1074)
    values = [0.0, 1.0, 0.5, 0.75, 1 / 3, 2 / 3, 0.1, 0.999999999, 1 - 2**-33, 1 - 2**-32, 1 - 2**-31,
              2.0**-31, 2.0**-32, 2.0**-33, 2.0**-31 * (1 - 2**-40), 2.0**-32 * (1 - 2**-40),
              2.0**-40, 2.0**-60, 2.0**-100, tiny, 3 * tiny, math.ldexp(1.0, -1030), 2.2250738585072014e-308,
              2.0**13 - 1, 2.0**13, 2.0**29 - 1, 2.0**29, 2.0**30, 2.0**30 - 0.5, 2.0**31, 1e300, 1.7976931348623157e308,
              0.5 + 2**-32, 0.5 + 2**-33, 0.5 + 3 * 2**-33, 0.75 + 2**-17, 0.75 + 2**-16]
    rng = random.Random(3)
    values += [math.ldexp(rng.random() + 0.5, rng.randrange(-80, 40)) for _ in range(300)]
    return values + [-v for v in values if v]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantize_multiplier_against_fractions(scheme):
    rejected = 0
    for scale in _scales():
        want = oracle.quantize_multiplier(scale, scheme)
        if want is None:
            with pytest.raises(ValueError, match=re.escape(f"real_scale={scale!r}")):
                qemu_q.quantize_multiplier(scale, scheme)
            rejected += 1
            continue
        got = qemu_q.quantize_multiplier(scale, scheme)
        assert got == want, (scheme, scale, got, want)
        assert all(type(v) is int for v in got)
        lo, hi = SHIFTS[scheme]
        assert lo <= got[1] <= hi
    assert rejected > 0
    good = [s for s in _scales() if oracle.quantize_multiplier(s, scheme) is not None]
    multipliers, shifts = qemu_q.quantize_multiplier(np.array(good), scheme)
    assert multipliers.dtype == np.int32 and shifts.dtype == np.int32
    assert list(zip(multipliers.tolist(), shifts.tolist())) == [oracle.quantize_multiplier(s, scheme) for s in good]


def test_quantize_multiplier_pinned():
    # 1.0 = 0.5 * 2^1: TFLite (2^30, 1); TOSA (2^30, 30) and (2^14, 14)
    assert qemu_q.quantize_multiplier(1.0, "gemmlowp") == (2**30, 1)
    assert qemu_q.quantize_multiplier(1.0, "tosa32") == (2**30, 30)
    assert qemu_q.quantize_multiplier(1.0, "tosa16") == (2**14, 14)
    # a mantissa that rounds up to 2^31 moves to the next exponent
    assert qemu_q.quantize_multiplier(1 - 2**-33, "tflite_single") == (2**30, 1)
    # below 2^-32 TFLite gives (0, 0); tflite_single saturates scales of 2^30 and more
    assert qemu_q.quantize_multiplier(2.0**-33, "gemmlowp") == (0, 0)
    assert qemu_q.quantize_multiplier(2.0**31, "tflite_single") == (2**31 - 1, 30)
    # TOSA caps the shift at 62, shifting the multiplier right instead
    assert qemu_q.quantize_multiplier(2.0**-40, "tosa32") == (2**22, 62)
    assert qemu_q.quantize_multiplier(0.0, "tosa32") == (0, 31)
    assert qemu_q.quantize_multiplier(5e-324, "tosa32") == (0, 62)


@pytest.mark.parametrize("value,scheme,error,pattern", [
    (float("nan"), "gemmlowp", ValueError, r"real_scale=nan is not finite"),
    (float("inf"), "tosa32", ValueError, r"real_scale=inf is not finite"),
    (-0.5, "tosa32", ValueError, r"real_scale=-0.5 is negative; scheme 'tosa32' takes multipliers >= 0 only"),
    (-0.5, "tflite_single", ValueError, r"real_scale=-0.5 is negative"),
    (2.0**30, "tosa32", ValueError, r"real_scale=1073741824.0 is too large for tosa32"),
    (2.0**31, "gemmlowp", ValueError, r"real_scale=2147483648.0 is too large for gemmlowp"),
    (2.0**-40, "tvm_upward", ValueError, r"gives tvm_upward the shift -39, outside \[-32, 31\]"),
    (10**400, "gemmlowp", ValueError, r"is not a finite float64"),
    ("0.5", "gemmlowp", TypeError, r"real_scale must be a float or a float array, got str"),
    (True, "gemmlowp", TypeError, r"real_scale must be a float or a float array, got bool"),
    (np.array(["a"]), "gemmlowp", TypeError, r"real_scale must have a float dtype"),
    (0.5, "tvm", ValueError, r"scheme='tvm'; allowed"),
    (np.array([0.5, np.nan]), "gemmlowp", ValueError, r"real_scale\[1\] \(flat index\): real_scale=nan is not finite"),
    (np.array([[0.5], [-0.25]], np.float32), "tosa16", ValueError, r"real_scale\[1\] \(flat index\): real_scale=-0.25 is negative"),
])
def test_quantize_multiplier_bad_arguments(value, scheme, error, pattern):
    with pytest.raises(error, match=pattern):
        qemu_q.quantize_multiplier(value, scheme)


def test_quantize_multiplier_takes_only_float64_values_of_a_longdouble():
    """A longdouble scale is not rounded to float64 silently. Where longdouble is float64
    itself (MSVC, Apple arm64) every longdouble is a float64 value, and 1/10 is accepted."""
    tenth = np.longdouble(1) / np.longdouble(10)
    assert qemu_q.quantize_multiplier(np.longdouble(0.375), "gemmlowp") == \
        qemu_q.quantize_multiplier(0.375, "gemmlowp")
    assert [a.tolist() for a in qemu_q.quantize_multiplier(np.array([0.375, 0.1], np.longdouble), "gemmlowp")] \
        == [a.tolist() for a in qemu_q.quantize_multiplier(np.array([0.375, 0.1]), "gemmlowp")]
    if np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant:
        for value in (tenth, np.array([0.5, tenth], np.longdouble)):
            with pytest.raises(ValueError, match="which is not a float64 value"):
                qemu_q.quantize_multiplier(value, "gemmlowp")
    else:
        assert qemu_q.quantize_multiplier(tenth, "gemmlowp") == qemu_q.quantize_multiplier(0.1, "gemmlowp")


def test_hostile_calls_raise_clear_errors_or_give_the_oracle():
    """Random mixes of valid and invalid arguments: every call returns the oracle's bits or
    raises TypeError/ValueError (never another exception, never a modified input)."""
    rng = random.Random(2024)
    nrng = np.random.default_rng(2024)
    invalid = {
        "acc": [lambda: np.arange(12, dtype=">i4").reshape(3, 4), lambda: np.arange(12, dtype=np.int64),
                lambda: [1, 2, 3], lambda: np.arange(4, dtype=np.float32)],
        "multiplier": [-1, 2**31, -(2**31) - 1, 2**70, 1.0, None, "1", np.uint64(2**64 - 1),
                       np.array([2**64 - 1] * 4, np.uint64), np.array([2**30] * 3, np.int64),
                       np.ones((2, 2), np.int32), np.array([], np.int32), True],
        "shift": [31, 63, -33, 64, np.array([0.5]), np.array([40, 35, 33]), -(2**63)],
        "zero_point": [-129, 300, 2**40, np.array([1, 2, 3], np.int16), 1.5],
        "scheme": ["TOSA32", None, b"gemmlowp", "tvm"],
        "output_dtype": ["float16", "int64", 999, None, "uint32"],
        "axis": [2, -3, 1.0, True, 2**64],
        "double_round": [1, "yes", np.bool_(True)],
    }

    def valid(name, scheme):
        lo, hi = SHIFTS[scheme]
        mlo, mhi = requantize_module.MULTIPLIER_RANGES[scheme]
        if name == "acc":
            shape = rng.choice([(3, 4), (4,), (2, 4, 3), (), (0, 4)])
            acc = nrng.integers(-(2**12), 2**12, shape).astype(np.int32)
            return acc[:, ::-1] if acc.ndim == 2 and rng.random() < 0.3 else acc
        if name == "multiplier":
            return rng.choice([mlo, mhi, 1, 0 if mlo <= 0 else mlo, np.array([mhi, mlo, 7, 0 if mlo <= 0 else 1][:4])])
        if name == "shift":
            small = (max(lo, 33), hi) if scheme.startswith("tosa") else (lo, 0)
            return rng.choice([small[0], small[1], np.array([rng.randint(*small) for _ in range(4)], np.int16)])
        if name == "zero_point":
            return rng.choice([0, 1, np.int8(-3), np.array([0, 1, 0, 1], np.uint8)])
        if name == "output_dtype":
            return rng.choice(list(OUT_TYPES))
        if name == "axis":
            return rng.choice([1, -1, 0])
        if name == "double_round":
            return rng.choice([None, True, False]) if scheme == "tosa32" else None
        raise AssertionError(name)

    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(1500):
        scheme = rng.choice(SCHEMES)
        args = {"scheme": scheme if rng.random() > 0.05 else rng.choice(invalid["scheme"])}
        for name in ("acc", "multiplier", "shift", "zero_point", "output_dtype", "axis", "double_round"):
            args[name] = valid(name, scheme) if rng.random() > 0.08 else rng.choice(invalid[name])
        if callable(args["acc"]):
            args["acc"] = args["acc"]()
        arrays = [v for v in args.values() if isinstance(v, (np.ndarray, np.generic))]
        before = [np.array(v, copy=True) for v in arrays]
        kwargs = {k: v for k, v in args.items() if k not in ("acc", "multiplier", "shift")}
        try:
            got = qemu_q.requantize(args["acc"], args["multiplier"], args["shift"], **kwargs)
        except (TypeError, ValueError) as error:
            assert str(error), args
            outcomes["rejected"] += 1
        else:
            outcomes["ok"] += 1
            _check_against_oracle(args["acc"], got, args)
        for a, b in zip(before, arrays):
            assert_same_bits(np.asarray(b), a)
    assert outcomes["ok"] > 300 and outcomes["rejected"] > 300, outcomes


def _check_against_oracle(acc, got, args):
    scheme = args["scheme"]
    _, lo, hi = OUT_TYPES[args["output_dtype"]]
    acc = np.asarray(acc)
    rank = acc.ndim
    axis = args["axis"] % rank if rank else 0

    def per(value, index):
        v = np.asarray(value).reshape(-1)
        return int(v[0]) if v.size == 1 else int(v[index[axis]])

    for index in np.ndindex(acc.shape):
        r = oracle.apply(scheme, int(acc[index]), per(args["multiplier"], index), per(args["shift"], index),
                         bool(args["double_round"]))
        assert r is not None, (index, args)
        want = min(hi, max(lo, r + per(args["zero_point"], index)))
        assert int(np.asarray(got)[index]) == want, (index, args)


def test_kernel_entry_checks_its_arguments():
    # The entry refuses what the Python layer would: no shift count outside C's defined range
    # reaches the loop, whoever calls it.
    module = _kernels.active.requantize
    config = module.RescaleConfig(scheme="tosa32", double_round=False, lo=-128, hi=127, out_bytes=1,
                                  mask=0xFF, channels=1, inner=4)
    acc = np.arange(4, dtype=np.int32)
    one = lambda v: np.array([v], np.int32)  # noqa: E731
    out = np.empty(4, np.uint8)
    with pytest.raises(ValueError, match=r"shift\[0\]=1 outside \[2, 62\]"):
        module.requantize(acc, one(1), one(1), one(0), out, config, 1)
    with pytest.raises(ValueError, match=r"multiplier\[0\]=-1 outside \[0, 2147483647\]"):
        module.requantize(acc, one(-1), one(40), one(0), out, config, 1)
    with pytest.raises(ValueError, match=r"zero_point has 2 entries"):
        module.requantize(acc, one(1), one(40), np.zeros(2, np.int32), out, config, 1)
    with pytest.raises(ValueError, match=r"out holds 3 bytes"):
        module.requantize(acc, one(1), one(40), one(0), out[:3], config, 1)
    assert module.requantize(acc, one(2**30), one(31), one(0), out, config, 1) == (-1, 0)
    assert out.tolist() == [0, 1, 1, 2]   # x / 2, ties up: 0.5 -> 1, 1.5 -> 2
    for kwargs, pattern in [({"scheme": "x"}, "scheme='x'"), ({"double_round": True, "scheme": "gemmlowp"}, "tosa32 only"),
                            ({"out_bytes": 3}, "out_bytes=3"), ({"channels": 0}, "channels=0")]:
        fields = dict(scheme="tosa32", double_round=False, lo=-128, hi=127, out_bytes=1, mask=0xFF,
                      channels=1, inner=4)
        fields.update(kwargs)
        with pytest.raises(ValueError, match=pattern):
            module.RescaleConfig(**fields)
