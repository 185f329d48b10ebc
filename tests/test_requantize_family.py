"""qemu_q.requantize into codec-family integer types (qemu_q.integer_type: any width 2..16,
signed or not, narrow_range; issue 15), against tests/requantize_oracle.py's independent
Python-integer transcription of each scheme. The ranges below are written from the type
definitions (docs/semantics.md, "Codec family": signed [-2^(b-1), 2^(b-1) - 1], unsigned
[0, 2^b - 1], narrow_range dropping the most negative / the largest code), not read from
the ElementType; the storage is the smallest numpy integer of the type's signedness,
holding the values themselves."""

import importlib
import random

import numpy as np
import pytest

import qemu_q
import requantize_oracle as oracle
from qemu_q import _kernels
from support import assert_same_bits

requantize_module = importlib.import_module("qemu_q.ops.requantize")

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
SCHEMES = ["tosa32", "tosa16", "gemmlowp", "tflite_single", "tvm_upward", "tvm_tonearest"]
VARIANTS = [("tosa32", False), ("tosa32", True)] + [(s, None) for s in SCHEMES[1:]]

# name -> (integer_type arguments, lo, hi, storage dtype)
TYPES = {
    "int3": ((3, True, False), -4, 3, np.int8),
    "uint5": ((5, False, False), 0, 31, np.uint8),
    "int12": ((12, True, False), -2048, 2047, np.int16),
    "uint16_narrow": ((16, False, True), 0, 65534, np.uint16),
    "int8_narrow": ((8, True, True), -127, 127, np.int8),
    "int4_narrow": ((4, True, True), -7, 7, np.int8),
    "uint2_narrow": ((2, False, True), 0, 2, np.uint8),
    "int16_narrow": ((16, True, True), -32767, 32767, np.int16),
}

# A (multiplier, shift) per scheme that scales by exactly 1 (r == acc: the saturation
# boundaries are then hit exactly), and one that scales by about 0.287 (ties and rounding).
IDENTITY = {"tosa32": (2**30, 30), "tosa16": (2**14, 14), "gemmlowp": (2**30, 1),
            "tflite_single": (2**30, 1), "tvm_upward": (2**30, 1), "tvm_tonearest": (2**30, 1)}
SCALED = {"tosa32": (1234567891, 32), "tosa16": (18838, 16), "gemmlowp": (1234567891, -1),
          "tflite_single": (1234567891, -1), "tvm_upward": (1234567891, -1),
          "tvm_tonearest": (1234567891, -1)}


def _type(name):
    args, lo, hi, dtype = TYPES[name]
    return qemu_q.integer_type(*args)


def _want(scheme, double_round, accs, m, s, zps, lo, hi, dtype):
    want = []
    for x, zp in zip(accs, zps):
        r = oracle.apply(scheme, int(x), int(m), int(s), bool(double_round))
        assert r is not None
        want.append(min(hi, max(lo, r + int(zp))))
    return np.array(want, dtype=np.int64).astype(dtype)


def test_family_types_are_what_the_tests_assume():
    for name, (args, lo, hi, dtype) in TYPES.items():
        etype = _type(name)
        assert (etype.name, etype.lo, etype.hi, etype.dtype) == (name, lo, hi, np.dtype(dtype))
        assert etype.onnx_id == 0


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("scheme,double_round", VARIANTS)
def test_saturation_at_the_range_ends_per_tensor(name, scheme, double_round):
    """r + zero_point at lo - 1, lo, hi, hi + 1 (and far beyond), for zero points at both
    range ends and inside; then a scaled multiplier over boundary and random accumulators."""
    _, lo, hi, dtype = TYPES[name]
    etype = _type(name)
    m, s = IDENTITY[scheme]
    for zp in sorted({lo, hi, (lo + hi) // 2}):
        accs = [lo - zp - 1, lo - zp, lo - zp + 1, hi - zp - 1, hi - zp, hi - zp + 1,
                -(2**28), 2**28, 0]
        sums = [oracle.apply(scheme, x, m, s, bool(double_round)) + zp for x in accs]
        assert {lo - 1, lo, hi, hi + 1} <= set(sums)   # the boundaries are really hit
        got = qemu_q.requantize(np.array(accs, np.int32), m, s, scheme=scheme, zero_point=zp,
                                output_dtype=etype, double_round=double_round)
        assert_same_bits(got, _want(scheme, double_round, accs, m, s, [zp] * len(accs), lo, hi, dtype),
                         f"{scheme} {name} zp={zp}")
        clamped = [min(hi, max(lo, v)) for v in sums]
        assert got.tolist() == clamped
    rng = random.Random(hash((name, scheme)) & 0xFFFF)
    m, s = SCALED[scheme]
    span = 4 * (hi - lo + 1) + 64
    accs = [rng.randrange(-span, span) for _ in range(120)] + [INT32_MIN + 1, INT32_MAX, -1, 0, 1]
    if scheme == "tosa32":
        accs = [x for x in accs if -(2 ** (s - 1)) <= x < 2 ** (s - 1)]   # its REQUIRE
    zp = lo if lo < 0 else hi // 3
    got = qemu_q.requantize(np.array(accs, np.int32), m, s, scheme=scheme, zero_point=zp,
                            output_dtype=etype, double_round=double_round)
    assert_same_bits(got, _want(scheme, double_round, accs, m, s, [zp] * len(accs), lo, hi, dtype),
                     f"{scheme} {name} scaled")


@pytest.mark.parametrize("scheme,double_round", VARIANTS)
def test_every_accumulator_of_a_span_into_small_types(scheme, double_round):
    # every r + zp from lo - 3 to hi + 3 of the narrow and odd-width 8-bit-stored types
    m, s = IDENTITY[scheme]
    for name in ("int3", "uint5", "int4_narrow", "int8_narrow", "uint2_narrow"):
        _, lo, hi, dtype = TYPES[name]
        zp = hi
        accs = list(range(lo - zp - 3, hi - zp + 4))
        got = qemu_q.requantize(np.array(accs, np.int32), m, s, scheme=scheme, zero_point=zp,
                                output_dtype=_type(name), double_round=double_round)
        assert_same_bits(got, _want(scheme, double_round, accs, m, s, [zp] * len(accs), lo, hi, dtype),
                         f"{scheme} {name}")


@pytest.mark.parametrize("name", ["int3", "uint5", "int12", "uint16_narrow", "int8_narrow", "int4_narrow"])
@pytest.mark.parametrize("scheme,double_round", VARIANTS)
def test_per_channel_zero_points_at_the_range_ends(name, scheme, double_round):
    _, lo, hi, dtype = TYPES[name]
    rng = np.random.default_rng(5)
    shape, axis = (3, 4, 5), 1
    m1, s1 = IDENTITY[scheme]
    m2, s2 = SCALED[scheme]
    multipliers = np.array([m1, m2, m1, m2])
    shifts = np.array([s1, s2, s1, s2])
    zero_points = np.array([lo, hi, hi, lo])
    span = 2 * (hi - lo + 1)
    acc = rng.integers(-span, span, shape).astype(np.int32)
    # channels 0 and 2 scale by 1 with zero points lo and hi: r + zp one beyond the end
    # (saturated), then exactly at it
    acc[0, :, 0] = [-1, 0, 1, 0]
    acc[0, :, 1] = 0
    acc[1, :, 0] = [-(2**20), 2**20, -(2**20), 2**20]
    got = qemu_q.requantize(acc, multipliers, shifts, scheme=scheme, zero_point=zero_points,
                            output_dtype=_type(name), axis=axis, double_round=double_round)
    moved = np.moveaxis(acc, axis, -1)
    want = np.empty(moved.shape, dtype=np.int64)
    for index in np.ndindex(moved.shape):
        c = index[-1]
        r = oracle.apply(scheme, int(moved[index]), int(multipliers[c]), int(shifts[c]), bool(double_round))
        want[index] = min(hi, max(lo, r + int(zero_points[c])))
    assert_same_bits(got, np.moveaxis(want, -1, axis).astype(dtype), f"{scheme} {name} per channel")
    assert {lo, hi} <= set(got.reshape(-1).tolist())


@pytest.mark.parametrize("name", ["int12", "int8_narrow", "uint5"])
def test_thread_counts_and_levels(name):
    """Several tasks (32768 elements each): the same bits on 1, 2 and 3 threads and every
    instruction-set level, checked against the oracle on a sample."""
    _, lo, hi, dtype = TYPES[name]
    scheme = "gemmlowp"
    rng = np.random.default_rng(9)
    acc = rng.integers(-(2**16), 2**16, (3, 32768 + 11)).astype(np.int32)
    multipliers, shifts, zero_points = np.array([2**30, 1234567891, 1]), np.array([-3, 0, 1]), np.array([lo, hi, 0 if lo < 0 else hi // 2])
    expected = None
    previous = _kernels.active.level
    try:
        for level in _kernels.available_levels():
            _kernels.use(level)
            for n in (1, 2, 3):
                got = qemu_q.requantize(acc, multipliers, shifts, scheme=scheme, zero_point=zero_points,
                                        output_dtype=_type(name), axis=0, n_threads=n)
                if expected is None:
                    for c in range(3):
                        sample = list(range(0, acc.shape[1], 97)) + list(range(32760, acc.shape[1]))
                        want = _want(scheme, None, acc[c, sample], multipliers[c], shifts[c],
                                     [zero_points[c]] * len(sample), lo, hi, dtype)
                        assert_same_bits(got[c, sample], want, f"{name} channel {c}")
                    expected = got
                assert_same_bits(got, expected, f"{name} level={level} n_threads={n}")
    finally:
        _kernels.use(previous)


def test_out_argument_and_the_onnx_types_are_family_instances():
    acc = np.arange(-300, 300, 7, dtype=np.int32)
    etype = _type("int12")
    out = np.empty(acc.shape, np.int16)
    got = qemu_q.requantize(acc, 2**30, 3, scheme="gemmlowp", zero_point=-2048, output_dtype=etype, out=out)
    assert got is out
    assert out.tolist() == [min(2047, max(-2048, oracle.gemmlowp(int(x), 2**30, 3) - 2048)) for x in acc]
    with pytest.raises(TypeError, match=r"out has dtype int8; this call produces int16 \(int12\)"):
        qemu_q.requantize(acc, 2**30, 3, scheme="gemmlowp", output_dtype=etype, out=np.empty(acc.shape, np.int8))
    # an out= at an odd offset (unaligned for 2-byte storage) is written through a temporary
    raw = np.zeros(2 * acc.size + 1, np.uint8)
    unaligned = raw[1:].view(np.int16)
    qemu_q.requantize(acc, 2**30, 3, scheme="gemmlowp", zero_point=-2048, output_dtype=etype, out=unaligned)
    assert_same_bits(unaligned, out)
    # integer_type of an ONNX width is the ONNX type: the same bits as its name
    for args, onnx in [((8,), "int8"), ((4, False), "uint4"), ((16,), "int16")]:
        assert_same_bits(qemu_q.requantize(acc, 2**30, 3, scheme="tvm_tonearest", output_dtype=qemu_q.integer_type(*args)),
                         qemu_q.requantize(acc, 2**30, 3, scheme="tvm_tonearest", output_dtype=onnx))
    empty = qemu_q.requantize(np.zeros((0, 3), np.int32), 1, 0, scheme="gemmlowp", output_dtype=etype)
    assert empty.shape == (0, 3) and empty.dtype == np.int16


@pytest.mark.parametrize("name,zero_point,pattern", [
    ("int3", -5, r"zero_point=-5 is outside the int3 range \[-4, 3\]"),
    ("int3", 4, r"zero_point=4 is outside the int3 range \[-4, 3\]"),
    ("uint5", -1, r"zero_point=-1 is outside the uint5 range \[0, 31\]"),
    ("uint5", 32, r"zero_point=32 is outside the uint5 range \[0, 31\]"),
    ("int8_narrow", -128, r"zero_point=-128 is outside the int8_narrow range \[-127, 127\]"),
    ("int8_narrow", 128, r"zero_point=128 is outside the int8_narrow range \[-127, 127\]"),
    ("int4_narrow", -8, r"zero_point=-8 is outside the int4_narrow range \[-7, 7\]"),
    ("uint16_narrow", 65535, r"zero_point=65535 is outside the uint16_narrow range \[0, 65534\]"),
    ("int12", np.array([0, 2048, 0, 0]), r"zero_point\[1\]=2048 is outside the int12 range \[-2048, 2047\]"),
])
def test_zero_points_outside_the_type_are_rejected(name, zero_point, pattern):
    acc = np.arange(12, dtype=np.int32).reshape(3, 4)
    with pytest.raises(ValueError, match=pattern):
        qemu_q.requantize(acc, 2**30, 1, scheme="gemmlowp", zero_point=zero_point, output_dtype=_type(name))


@pytest.mark.parametrize("output_dtype,shown", [
    (lambda: qemu_q.minifloat_type(4, 3, bias=11, nan="fnuz", negative_zero=False), r"float8e4m3b11_fnuz"),
    (lambda: qemu_q.minifloat_type(3, 4, inf=True), r"float8e3m4b3_ieee_inf"),
    (lambda: qemu_q.minifloat_type(4, 3, nan="fn"), r"float8e4m3fn"),
    (lambda: "float16", r"float16"),
    (lambda: "uint32", r"uint32"),
])
def test_minifloat_and_float_outputs_are_rejected(output_dtype, shown):
    acc = np.arange(4, dtype=np.int32)
    with pytest.raises(ValueError, match=rf"output_dtype=.*{shown}.*\); allowed int8, uint8, .*int32, or a "
                                         r"codec-family integer type \(qemu_q.integer_type\(bits, signed, "
                                         r"narrow_range\), bits 2..16\)"):
        qemu_q.requantize(acc, 2**30, 1, scheme="gemmlowp", output_dtype=output_dtype())


def test_rescale_config_takes_the_range_and_storage():
    """The kernel's configuration carries lo, hi, the storage bytes and the code mask (the
    plan decides them from the type); the kernel entry refuses inconsistent ones."""
    module = _kernels.active.requantize
    acc = np.array([-9, -8, -7, 0, 7, 8], np.int32)
    one = lambda v: np.array([v], np.int32)  # noqa: E731
    base = dict(scheme="gemmlowp", double_round=False, channels=1, inner=6)
    # int4 narrow stored as its value in a whole byte
    config = module.RescaleConfig(lo=-7, hi=7, out_bytes=1, mask=0xFF, **base)
    out = np.empty(6, np.uint8)
    assert module.requantize(acc, one(2**30), one(1), one(0), out, config, 1) == (-1, 0)
    assert out.tolist() == [0xF9, 0xF9, 0xF9, 0, 7, 7]
    # the ONNX int4: the low nibble
    config = module.RescaleConfig(lo=-8, hi=7, out_bytes=1, mask=0xF, **base)
    module.requantize(acc, one(2**30), one(1), one(0), out, config, 1)
    assert out.tolist() == [0x8, 0x8, 0x9, 0, 7, 7]
    plan = requantize_module.requantize_plan("gemmlowp", False, _type("uint16_narrow"), (6,), 1, 0)
    fields = dict(plan.kernel_fields)
    assert (fields["lo"], fields["hi"], fields["out_bytes"], fields["mask"]) == (0, 65534, 2, 0xFFFF)
    for kwargs, pattern in [
        (dict(lo=-8, hi=7, out_bytes=3, mask=0xF), r"out_bytes=3; allowed 1, 2, 4"),
        (dict(lo=-8, hi=7, out_bytes=1, mask=0xE), r"mask=0xe; allowed 2\*\*k - 1"),
        (dict(lo=-8, hi=7, out_bytes=1, mask=0x1FF), r"mask=0x1ff; allowed 2\*\*k - 1 with 2 <= k <= 8"),
        (dict(lo=-9, hi=7, out_bytes=1, mask=0xF), r"lo=-9, hi=7 do not fit 4-bit codes"),
        (dict(lo=0, hi=16, out_bytes=1, mask=0xF), r"lo=0, hi=16 do not fit 4-bit codes"),
        (dict(lo=5, hi=4, out_bytes=1, mask=0xF), r"lo=5, hi=4 do not fit"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            module.RescaleConfig(**kwargs, **base)
