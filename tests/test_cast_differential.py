"""Cast and CastLike against onnx.reference and onnxruntime, bit for bit.

The peers run as in test_divergences.py (one-node models; onnxruntime on the CPU provider,
graph optimizations off, raw bytes through IOBinding/OrtValue, so every output type
compares). Two parts:

- the entries of docs/divergences.md whose op is Cast: each test computes qemu_q's bits
  from the rule in docs/semantics.md with the independent oracles of tests/test_cast.py
  and float_oracle, and pins each peer's bits as the document gives them;
- what agrees: per (from, to) type pair that matters, the inputs outside those entries
  (ties, neighbours, overflow, +-0, NaN, +-inf, subnormals, e8m0 boundaries, every
  saturate / round_mode) give the same bits in all three.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import float_oracle as fo

pytest.importorskip("onnx", reason="the peers need onnx (test extra)")
pytest.importorskip("onnxruntime", reason="the peers need onnxruntime (test extra)")

import test_divergences as peers  # noqa: E402
from test_cast import INTEGERS, cast_codes, e8m0_oracle, wrap  # noqa: E402
from test_divergences import codes, entry, eq, not_supported  # noqa: E402

f32, f16, f64, bf16 = np.float32, np.float16, np.float64, ml_dtypes.bfloat16
NAN32 = peers.NAN32
NEG_NAN32 = peers.NEG_NAN32

# ONNX data types by name
T = {"float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
     "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13, "bfloat16": 16,
     "float8e4m3fn": 17, "float8e4m3fnuz": 18, "float8e5m2": 19, "float8e5m2fnuz": 20,
     "uint4": 21, "int4": 22, "float4e2m1": 23, "float8e8m0": 24, "uint2": 25, "int2": 26,
     "float6e2m3": 27, "float6e3m2": 28}
SMALL = {"float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
         "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz",
         "float4e2m1": "float4_e2m1fn"}
SOURCES = {"float": f32, "float16": f16, "bfloat16": bf16, "double": f64}
ROUND_MODES = ("up", "down", "nearest")


def cast3(x, to: str, opset: int = 25, **attrs):
    """(qemu_q, onnx.reference, onnxruntime) codes of Cast(x, to); a peer's exception as is."""
    attrs = dict(attrs, to=T[to])
    mine = peers.ours("Cast", [x], attrs, opset)[0][1]
    ref = peers._first(peers.run_reference("Cast", [x], attrs, opset, [T[to]]), T[to])
    rt = peers._first(peers.run_ort("Cast", [x], attrs, opset, [T[to]]), T[to])
    return mine, ref, rt


def float64_of(x) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x).astype(np.float64)


def int_rule(v: float, target: str) -> int:
    """docs/semantics.md, float -> 8..64-bit integer: truncate, saturate, NaN -> 0."""
    width, signed = INTEGERS[target]
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    if math.isnan(v):
        return 0
    if math.isinf(v):
        return hi if v > 0 else lo
    return min(max(math.trunc(v), lo), hi)


def sub_byte_rule(v: float, target: str) -> int:
    """docs/semantics.md, float -> int4/uint4/int2/uint2: round half to even, keep the low bits."""
    return 0 if not math.isfinite(v) else wrap(fo.round_half_even(Fraction(v)), target)


def as_codes(values, bits):
    return [v & ((1 << bits) - 1) for v in values]


def binary_code(value: float, name: str) -> int:
    """The float32/float16/bfloat16 code of x rounded once (ties to even) from its exact value."""
    rounded = fo.round_to_binary(Fraction(value), name)
    if rounded == 0:  # underflow keeps the sign
        return peers.float_bits(math.copysign(0.0, value), name)
    return peers.float_bits(rounded, name)


# ================================================================ the divergences


@entry("Cast float8e8m0: onnx.reference's range rows, round-up and negative inputs")
@pytest.mark.parametrize("opset", [24, 25])
def test_cast_e8m0_reference(opset):
    x = np.array([2.0**-127, np.inf, 0.0, 2.0**-128, 1.5 * 2.0**127, -2.0, -0.0, -np.inf], f32)
    reference = {  # onnx.reference 1.23: |x|, its own range rows, and up from 2^-127 to 2^-126
        ("up", 0): [0x01, 0xFF, 0x00, 0x01, 0xFF, 0x80, 0x00, 0xFF],
        ("up", 1): [0x01, 0xFF, 0x00, 0x01, 0xFE, 0x80, 0x00, 0xFF],
        ("down", 0): [0x00, 0xFF, 0x00, 0x00, 0xFE, 0x80, 0x00, 0xFF],
        ("down", 1): [0x00, 0xFF, 0x00, 0x00, 0xFE, 0x80, 0x00, 0xFF],
        ("nearest", 0): [0x00, 0xFF, 0x00, 0x00, 0xFF, 0x80, 0x00, 0xFF],
        ("nearest", 1): [0x00, 0xFF, 0x00, 0x00, 0xFE, 0x80, 0x00, 0xFF],
    }
    ours_literal = {0: [0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF],
                    1: [0x00, 0xFE, 0x00, 0x00, 0xFE, 0x00, 0x00, 0x00]}
    for (mode, saturate), ref_want in reference.items():
        mine, ref, rt = cast3(x, "float8e8m0", opset, round_mode=mode, saturate=saturate)
        eq(mine, e8m0_oracle(x, mode, saturate)), eq(mine, ours_literal[saturate])
        eq(ref, ref_want)
        eq(rt, mine)  # onnxruntime follows the same rows
    # Negative integers: the magnitude again (saturate=1 by default).
    xi = np.array([-1, -128, 0, 3], np.int8)
    mine, ref, rt = cast3(xi, "float8e8m0", opset)
    eq(mine, e8m0_oracle(xi, "up", 1)), eq(mine, [0x00, 0x00, 0x00, 0x81])
    eq(ref, [0x7F, 0x86, 0x00, 0x81]), eq(rt, mine)


OOR = np.array([300, -300, 128, -129, 1e10, -1e10, np.inf, -np.inf, np.nan, -1.0], f32)
# Both peers convert through C (x86-64 CVTTSS2SI and a narrowing): their shared bits for OOR
# (onnx.reference's bfloat16 excepted: ml_dtypes', OOR_ML_DTYPES).
OOR_PEERS = {
    "int8": [0x2C, 0xD4, 0x80, 0x7F, 0, 0, 0, 0, 0, 0xFF],
    "uint8": [0x2C, 0xD4, 0x80, 0x7F, 0, 0, 0, 0, 0, 0xFF],
    "int16": [0x12C, 0xFED4, 0x80, 0xFF7F, 0, 0, 0, 0, 0, 0xFFFF],
    "uint16": [0x12C, 0xFED4, 0x80, 0xFF7F, 0, 0, 0, 0, 0, 0xFFFF],
    "int32": [0x12C, 0xFFFFFED4, 0x80, 0xFFFFFF7F] + [0x80000000] * 5 + [0xFFFFFFFF],
    "uint32": [0x12C, 0xFFFFFED4, 0x80, 0xFFFFFF7F, 0, 0x80000000, 0, 0x80000000, 0, 0xFFFFFFFF],
    # +-1e10 are in range of the 64-bit types: None, the value itself
    "int64": [0x12C, 2**64 - 300, 0x80, 2**64 - 129, None, None] + [2**63] * 3 + [2**64 - 1],
    "uint64": [0x12C, 2**64 - 300, 0x80, 2**64 - 129, None, None, 0, 2**63, 2**63, 2**64 - 1],
}


def oor_ml_dtypes(v: float, target: str) -> int:
    """onnx.reference from bfloat16 (ml_dtypes 0.7's conversion): the truncated value where
    it fits the target, else 0 (NaN and +-inf included)."""
    width, signed = INTEGERS[target]
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    if not math.isfinite(v) or not lo <= math.trunc(v) <= hi:
        return 0
    return math.trunc(v) % 2**width


@entry("Cast float -> integer: out of range, +-inf and NaN")
@pytest.mark.parametrize("source", ["float", "float16", "bfloat16", "double"])
@np.errstate(over="ignore")
def test_cast_float_to_integer_out_of_range(source):
    # float16 has no 1e10 (it would be inf, already there)
    keep = np.isin(OOR, [1e10, -1e10], invert=True) if source == "float16" else np.ones(OOR.size, bool)
    x = OOR[keep].astype(SOURCES[source])
    for target, peer_want in OOR_PEERS.items():
        width = INTEGERS[target][0]
        mine, ref, rt = cast3(x, target)
        eq(mine, as_codes([int_rule(float(v), target) for v in float64_of(x)], width))
        want = [w if w is not None else int(v) % 2**64
                for w, k, v in zip(peer_want, keep, float64_of(OOR.astype(SOURCES[source]))) if k]
        if source == "float16" and target == "uint32":
            want[5] = 0  # -inf: onnxruntime's and numpy's float16 path gives 0 here
        if source == "bfloat16":
            eq(ref, [oor_ml_dtypes(float(v), target) for v in float64_of(x)])
        else:
            eq(ref, want)
        eq(rt, want)
    mine, _, _ = cast3(OOR, "int8")
    eq(mine, as_codes([127, -128, 127, -128, 127, -128, 127, -128, 0, -1], 8))


@entry("Cast float -> int4/uint4/int2/uint2: rounding")
def test_cast_float_to_sub_byte_integers():
    x = np.array([0.5, 1.5, 2.5, -2.5, 0.75, 3.5, 127.5, -6.5, -128.5, np.nan, np.inf], f32)
    # onnx.reference truncates toward zero, and gives 0 outside the target's range
    # (ml_dtypes 0.7); onnxruntime rounds half away from zero and keeps the low bits
    ort_want = {"int4": [0x1, 0x2, 0x3, 0xD, 0x1, 0x4, 0x0, 0x9, 0xF, 0x0, 0x0],
                "int2": [0x1, 0x2, 0x3, 0x1, 0x1, 0x0, 0x0, 0x1, 0x3, 0x0, 0x0]}
    ort_want["uint4"], ort_want["uint2"] = ort_want["int4"], ort_want["int2"]
    peer_want = {target: ([oor_ml_dtypes(float(v), target) for v in x], want)
                 for target, want in ort_want.items()}
    assert peer_want["int4"][0] == [0x0, 0x1, 0x2, 0xE, 0x0, 0x3, 0x0, 0xA, 0x0, 0x0, 0x0]
    assert peer_want["uint4"][0] == [0x0, 0x1, 0x2, 0x0, 0x0, 0x3, 0x0, 0x0, 0x0, 0x0, 0x0]
    for target, (ref_want, ort_want) in peer_want.items():
        bits = INTEGERS[target][0]
        for opset in (21, 23, 25) if bits == 4 else (25,):
            mine, ref, rt = cast3(x, target, opset)
            eq(mine, as_codes([sub_byte_rule(float(v), target) for v in x], bits))
            eq(ref, ref_want), eq(rt, ort_want)
    eq(cast3(x, "int4")[0], [0x0, 0x2, 0x2, 0xE, 0x1, 0x4, 0x0, 0xA, 0x0, 0x0, 0x0])
    # float64 beyond int32: the low bits of the exact integer; both peers give 0.
    xd = np.array([2.0**33 + 3, -(2.0**33) - 5, 1e10, 2.0**31 + 1], f64)
    mine, ref, rt = cast3(xd, "int4")
    eq(mine, as_codes([sub_byte_rule(float(v), "int4") for v in xd], 4)), eq(mine, [0x3, 0xB, 0x0, 0x1])
    eq(ref, [0] * 4), eq(rt, [0] * 4)


E = 2.0**-40


@entry("Cast float64 -> a narrower float: the peers round twice, through float32")
def test_cast_float64_rounded_twice():
    # just above a midpoint of the target; float32 rounds it onto the midpoint. onnxruntime
    # goes through float32; onnx.reference (ml_dtypes 0.7) rounds once but into e8m0.
    x = [1 + 2.0**-8 + E, -(1 + 2.0**-8 + E)]
    mine, ref, rt = cast3(np.array(x, f64), "bfloat16")
    eq(mine, [binary_code(v, "bfloat16") for v in x]), eq(mine, [0x3F81, 0xBF81])
    eq(ref, mine), eq(rt, [0x3F80, 0xBF80])
    x = [1 + 2.0**-11 + E, -(1 + 2.0**-11 + E)]
    mine, ref, rt = cast3(np.array(x, f64), "float16")
    eq(mine, [binary_code(v, "float16") for v in x]), eq(mine, [0x3C01, 0xBC01])
    eq(ref, mine), eq(rt, [0x3C00, 0xBC00])  # numpy's float64 -> float16 rounds once
    x = np.array([1 + 2.0**-4 + E, 1 + 2.0**-3 + E], f64)
    for target, ref_want in [("float8e4m3fn", [0x38, 0x39]), ("float8e4m3fnuz", [0x40, 0x41]),
                             ("float8e5m2", [0x3C, 0x3C]), ("float8e5m2fnuz", [0x40, 0x40])]:
        mine, ref, rt = cast3(x, target)
        eq(mine, cast_codes(fo.FORMATS[SMALL[target]], x, 1, 25))
        eq(ref, mine), eq(rt, ref_want)
        assert ref_want != cast_codes(fo.FORMATS[SMALL[target]], x, 1, 25).tolist()
    x = np.array([1.25 + E, 2.5 + 2 * E], f64)
    mine, ref, rt = cast3(x, "float4e2m1")
    eq(mine, cast_codes(fo.FORMATS["float4_e2m1fn"], x, 1, 25)), eq(mine, [0x3, 0x5])
    eq(ref, mine)
    assert not_supported(rt)
    x = np.array([1.5 * 2.0**-127 * (1 - E), 1.5 * 2.0**100 * (1 - E)], f64)
    mine, ref, rt = cast3(x, "float8e8m0", round_mode="nearest")
    eq(mine, e8m0_oracle(x, "nearest", 1)), eq(mine, [0x00, 0xE3])
    eq(ref, [0x01, 0xE4]), eq(rt, [0x01, 0xE4])


@entry("Cast integer beyond 2^24 -> bfloat16 / float8e8m0: the peers round through float32")
def test_cast_wide_integers_rounded_twice():
    x = np.array([16777217, 2**24 + 2**16 + 1, -(2**24 + 2**16 + 1)], np.int32)
    mine, ref, rt = cast3(x, "bfloat16")
    eq(mine, [binary_code(float(v), "bfloat16") for v in x]), eq(mine, [0x4B80, 0x4B81, 0xCB81])
    eq(ref, mine), eq(rt, [0x4B80, 0x4B80, 0xCB80])  # ml_dtypes 0.7 rounds once
    mine, ref, rt = cast3(x[:2], "float8e8m0")
    eq(mine, e8m0_oracle(x[:2].astype(f64), "up", 1)), eq(mine, [0x98, 0x98])  # 2^25
    eq(ref, [0x97, 0x98]), eq(rt, [0x97, 0x98])  # 16777217 became 2^24 first
    x = np.array([2**53 + 1, 2**24 + 2**16 + 1], np.int64)
    mine, ref, rt = cast3(x, "float8e8m0")
    assert int(x[0]) > 2**53
    eq(mine, [0xB5, 0x98])  # up: the smallest power of two >= x, 2^54 and 2^25
    eq(ref, [0xB4, 0x98]), eq(rt, [0xB4, 0x98])
    mine, ref, rt = cast3(x, "bfloat16")
    eq(mine, [binary_code(float(v), "bfloat16") if abs(int(v)) < 2**53 else 0x5A00 for v in x])
    eq(ref, mine), eq(rt, [0x5A00, 0x4B80])


@entry("Cast-19/21/23 FNUZ saturate=1: +-inf")
@pytest.mark.parametrize("opset", [19, 21, 23, 24, 25])
def test_cast_fnuz_inf_before_24(opset):
    x = np.array([np.inf, -np.inf], f32)
    for name in ("float8e4m3fnuz", "float8e5m2fnuz"):
        for source in (f32, f16, bf16):
            mine, ref, rt = cast3(x.astype(source), name, opset)
            eq(mine, cast_codes(fo.FORMATS[SMALL[name]], x, 1, opset))
            eq(mine, [0x80, 0x80] if opset < 24 else [0x7F, 0xFF])
            eq(ref, [0x7F, 0xFF]), eq(rt, [0x7F, 0xFF])  # +-max at every version


@entry("Cast e5m2: onnxruntime NaN codes 0x7F / 0xFF")
@pytest.mark.parametrize("opset", [19, 25])
def test_cast_e5m2_onnxruntime_nan(opset):
    for source in (f32, f16, bf16):
        x = np.array([NAN32, NEG_NAN32], f32).astype(source)
        mine, ref, rt = cast3(x, "float8e5m2", opset, saturate=1)
        eq(mine, [0x7E, 0xFE]), eq(ref, [0x7E, 0xFE]), eq(rt, [0x7F, 0xFF])


@entry("Cast e4m3fn saturate=0: onnxruntime 448 for 480 <= |x| < 496")
def test_cast_e4m3fn_ort_448():
    x = np.array([480.0, 490.0, 495.75, -480.0, -495.75], f32)
    for opset in (19, 25):
        mine, ref, rt = cast3(x, "float8e4m3fn", opset, saturate=0)
        eq(mine, cast_codes(fo.FORMATS["float8_e4m3fn"], x, 0, opset)), eq(mine, [0x7F] * 3 + [0xFF] * 2)
        eq(ref, mine), eq(rt, [0x7E, 0x7E, 0x7E, 0xFE, 0xFE])


@entry("Cast e5m2 saturate=0: onnxruntime NaN for 61440 <= |x| < 65536")
def test_cast_e5m2_ort_nan():
    for source in (f32, f16):
        x = np.array([61440.0, 65504.0, -61440.0], source)
        mine, ref, rt = cast3(x, "float8e5m2", 25, saturate=0)
        eq(mine, cast_codes(fo.FORMATS["float8_e5m2"], float64_of(x), 0, 25)), eq(mine, [0x7C, 0x7C, 0xFC])
        eq(ref, mine), eq(rt, [0x7F, 0x7F, 0xFF])


@entry("Cast bfloat16 -NaN into float8 with saturate=0: onnxruntime drops the sign")
@pytest.mark.parametrize("opset", [19, 25])
def test_cast_bfloat16_negative_nan_ort(opset):
    x = np.array([0x7FC0, 0xFFC0], np.uint16).view(bf16)
    for name, want, ort_want in [("float8e4m3fn", [0x7F, 0xFF], [0x7F, 0x7F]),
                                 ("float8e5m2", [0x7E, 0xFE], [0x7F, 0x7F])]:
        mine, ref, rt = cast3(x, name, opset, saturate=0)
        eq(mine, cast_codes(fo.FORMATS[SMALL[name]], float64_of(x), 0, opset)), eq(mine, want)
        eq(ref, want), eq(rt, ort_want)
        # with saturate=1 onnxruntime keeps it (e5m2: its own NaN codes, the entry above)
        _, _, rt1 = cast3(x, name, opset, saturate=1)
        eq(rt1, [0x7F, 0xFF])


@entry("Cast float4e2m1 / float6: NaN with the sign bit (onnx.reference)")
@pytest.mark.parametrize("opset", [23, 25, 28])
def test_cast_float4_negative_nan(opset):
    targets = ["float4e2m1"] + (["float6e2m3", "float6e3m2"] if opset >= 28 else [])
    negative_zero = {"float4e2m1": 0x8, "float6e2m3": 0x20, "float6e3m2": 0x20}
    for target in targets:
        for source in (f32, f16, bf16, f64):
            x = np.array([NAN32, NEG_NAN32], f32).astype(source)
            mine, ref, rt = cast3(x, target, opset)
            nz = negative_zero[target]
            eq(mine, [nz, nz])
            if target == "float4e2m1":
                eq(mine, cast_codes(fo.FORMATS["float4_e2m1fn"], float64_of(x), 1, opset))
            eq(ref, [nz, 0x0])  # ml_dtypes: +NaN -> -0, -NaN -> +0
            assert not_supported(rt)  # onnxruntime 1.32 has no float4 / float6 Cast kernel
    # a float8 NaN code with the sign bit set is a -NaN too (FNUZ's only NaN is 0x80)
    for dtype, nan_codes in ((ml_dtypes.float8_e4m3fn, [0x7F, 0xFF]),
                             (ml_dtypes.float8_e4m3fnuz, [0x80])):
        x = np.array(nan_codes, np.uint8).view(dtype)
        mine, ref, _ = cast3(x, "float4e2m1", opset)
        eq(mine, [0x8] * len(nan_codes))
        eq(ref, [0x8, 0x0] if len(nan_codes) == 2 else [0x0])


def _nan_oracle(code: int, source_bits: int, source_mantissa: int, target_bits: int,
                target_mantissa: int) -> int:
    """IEEE 754 conversion of a NaN: the sign kept, the quiet bit set, the payload's leading
    bits kept (cut or padded with zeros on the right)."""
    sign = code >> (source_bits - 1)
    payload = (code & ((1 << source_mantissa) - 1)) | (1 << (source_mantissa - 1))
    shift = target_mantissa - source_mantissa
    payload = payload << shift if shift >= 0 else payload >> -shift
    exponent = (1 << (target_bits - 1 - target_mantissa)) - 1
    return (sign << (target_bits - 1)) | (exponent << target_mantissa) | payload


@entry("Cast between float types: signalling NaN payloads")
def test_cast_signalling_nan_payloads():
    f16_snan = np.array([0x7C01, 0xFC01], np.uint16).view(f16)
    mine, ref, _ = cast3(f16_snan, "float")
    eq(mine, [_nan_oracle(c, 16, 10, 32, 23) for c in (0x7C01, 0xFC01)])
    eq(mine, [0x7FC02000, 0xFFC02000]), eq(ref, [0x7F802000, 0xFF802000])
    mine, ref, _ = cast3(f16_snan, "double")
    eq(mine, [_nan_oracle(c, 16, 10, 64, 52) for c in (0x7C01, 0xFC01)])
    eq(ref, [0x7FF0040000000000, 0xFFF0040000000000])
    f32_snan = np.array([0x7F800001, 0xFF800001], np.uint32).view(f32)
    mine, ref, rt = cast3(f32_snan, "float16")
    eq(mine, [_nan_oracle(c, 32, 23, 16, 10) for c in (0x7F800001, 0xFF800001)])
    eq(ref, [0x7C01, 0xFC01]), eq(rt, [0x7E00, 0xFE00])
    f64_snan = np.array([0x7FF0000000000001], np.uint64).view(f64)
    mine, ref, rt = cast3(f64_snan, "float16")
    eq(mine, [_nan_oracle(0x7FF0000000000001, 64, 52, 16, 10)]), eq(ref, [0x7C01]), eq(rt, [0x7E00])
    bf16_nans = np.array([0x7F81, 0xFF81, 0x7FC1], np.uint16).view(bf16)
    mine, ref, rt = cast3(bf16_nans, "float")
    eq(mine, [_nan_oracle(c, 16, 7, 32, 23) for c in (0x7F81, 0xFF81, 0x7FC1)])
    eq(ref, [0x7F810000, 0xFF810000, 0x7FC10000]), eq(rt, [0x7F810000, 0xFF810000, 0x7FC10000])
    mine, ref, rt = cast3(bf16_nans, "float16")
    eq(mine, [_nan_oracle(c, 16, 7, 16, 10) for c in (0x7F81, 0xFF81, 0x7FC1)])
    eq(mine, [0x7E08, 0xFE08, 0x7E08])
    eq(ref, [0x7E00, 0xFE00, 0x7E00]), eq(rt, [0x7E00, 0xFE00, 0x7E00])


@entry("Cast float8 -0 and float8e8m0 -> bool: onnxruntime")
def test_cast_float8_to_bool_ort():
    # "floating point to bool: +/- 0.0 to False; all else to True"
    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        x = np.array([0x80, 0x00, 0x01], np.uint8).view(dtype)
        mine, ref, rt = cast3(x, "bool")
        eq(mine, [0, 0, 1]), eq(ref, [0, 0, 1]), eq(rt, [1, 0, 1])
    x = np.array([0x00, 0x7F, 0xFF], np.uint8).view(ml_dtypes.float8_e8m0fnu)  # 2^-127, 1, NaN
    mine, ref, rt = cast3(x, "bool")
    eq(mine, [1, 1, 1]), eq(ref, [1, 1, 1]), eq(rt, [0, 1, 1])


@entry("Cast float8e5m2 -> float8e5m2: the peers keep codes")
@pytest.mark.parametrize("opset", [19, 25])
def test_cast_e5m2_to_itself(opset):
    x_codes = [0x7C, 0xFC, 0x7D, 0x7F, 0xFD, 0xFF, 0x7E, 0x7B]
    x = np.array(x_codes, np.uint8).view(ml_dtypes.float8_e5m2)
    values = float64_of(x)
    for saturate in (1, 0):
        mine, ref, rt = cast3(x, "float8e5m2", opset, saturate=saturate)
        eq(mine, cast_codes(fo.FORMATS["float8_e5m2"], values, saturate, opset))
        eq(rt, x_codes)
        eq(ref, mine if saturate else x_codes)


@entry("CastLike round_mode: onnxruntime rounds up")
@pytest.mark.parametrize("mode", ["down", "nearest"])
def test_castlike_round_mode_ort(mode):
    x = np.array([0x3FBFFFFF, 0x3F3FFFFF, 0x00600000], np.uint32).view(f32)
    target = np.zeros(1, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    attrs = {"round_mode": mode}
    mine = peers.ours("CastLike", [x, target], attrs, 25)[0][1]
    ref = peers.run_reference("CastLike", [x, target], attrs, 25, [T["float8e8m0"]])
    rt = peers._first(peers.run_ort("CastLike", [x, target], attrs, 25, [T["float8e8m0"]]),
                      T["float8e8m0"])
    eq(mine, e8m0_oracle(float64_of(x), mode, 1))
    eq(rt, e8m0_oracle(float64_of(x), "up", 1))
    assert not_supported(ref)  # onnx.reference's CastLike has no round_mode


# ================================================================ what agrees


def assert_agree(x, to: str, opset: int = 25, ref: bool = True, rt: bool = True, **attrs):
    mine, got_ref, got_rt = cast3(x, to, opset, **attrs)
    for name, got, use in (("onnx.reference", got_ref, ref), ("onnxruntime", got_rt, rt)):
        if use:
            assert not isinstance(got, Exception), f"{name} raised {got!r}"
            np.testing.assert_array_equal(np.asarray(got, np.uint64), np.asarray(mine, np.uint64),
                                          err_msg=f"{name}: {x.dtype} -> {to} at {opset} {attrs}")
    return mine


def _neighbours(points: np.ndarray) -> np.ndarray:
    up = np.nextafter(points, np.array(np.inf, points.dtype))
    down = np.nextafter(points, np.array(0, points.dtype))
    return np.concatenate([points, up, down])


@np.errstate(over="ignore")
def small_float_inputs(name: str, source, saturate: int, opset: int) -> np.ndarray:
    """Every value and midpoint of the format and their neighbours in the source type,
    +-0, subnormals, overflow, NaN and +-inf: minus the classes of the Cast entries."""
    fmt = fo.FORMATS[SMALL[name]]
    values, _ = fo.positive_values(fmt)
    points = [float(v) for v in values] + [float(m) for m in fo.midpoints(fmt)]
    # float64 inputs that float32 holds exactly: the peers' float32 step changes nothing
    carrier = f32 if source is f64 else source
    p = np.array(points, f32).astype(carrier)
    near = _neighbours(p)
    x = np.concatenate([near, -near, np.array([0.0, -0.0, 1e-30, -1e-30, 1e6, -1e6], f32).astype(carrier)])
    x = x[np.isfinite(float64_of(x))]
    a = np.abs(float64_of(x))
    if name == "float8e4m3fn" and not saturate:
        x = x[(a < 480) | (a >= 496)]
    if name == "float8e5m2" and not saturate:
        x = x[(a < 61440) | (a >= 65536)]
    specials = []
    if not (name == "float8e5m2" or (source is bf16 and not saturate and name == "float8e4m3fn")):
        specials += [NAN32, NEG_NAN32]
    if name == "float8e4m3fn" and source is not bf16:
        specials += [NAN32, NEG_NAN32]
    if name.endswith("fnuz"):
        specials += [NAN32, NEG_NAN32]
    if name == "float4e2m1":
        specials = [NAN32]
    if not (name.endswith("fnuz") and saturate and opset < 24):
        specials += [np.inf, -np.inf]
    return np.concatenate([x, np.array(specials, f32).astype(carrier)]).astype(source)


F8_NAMES = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"]


@pytest.mark.parametrize("opset", [19, 21, 23, 24, 25])
@pytest.mark.parametrize("source", list(SOURCES))
def test_agree_float8(opset, source):
    for name in F8_NAMES:
        for saturate in (0, 1):
            x = small_float_inputs(name, SOURCES[source], saturate, opset)
            mine = assert_agree(x, name, opset, saturate=saturate)
            eq(mine, cast_codes(fo.FORMATS[SMALL[name]], float64_of(x), saturate, opset))


@pytest.mark.parametrize("opset", [23, 25])
def test_agree_float4(opset):
    # onnxruntime 1.32 has no float4 Cast
    for source in SOURCES.values():
        x = small_float_inputs("float4e2m1", source, 1, opset)
        mine = assert_agree(x, "float4e2m1", opset, rt=False)
        eq(mine, cast_codes(fo.FORMATS["float4_e2m1fn"], float64_of(x), 1, opset))


def e8m0_inputs(source) -> np.ndarray:
    """Powers of two, their midpoints (1.5 * 2^k) and neighbours from 2^-126 to 2^127, NaN,
    +inf: what onnx.reference's rows agree on (its entry has the rest)."""
    k = np.arange(-126, 128, dtype=np.float64)
    carrier = f32 if source is f64 else source
    p = np.concatenate([np.exp2(k), 1.5 * np.exp2(k[:-1]), 1.25 * np.exp2(k[:-1]), 1.75 * np.exp2(k[:-1])])
    with np.errstate(over="ignore", under="ignore"):
        p = p.astype(carrier)
    x = _neighbours(p[np.isfinite(float64_of(p)) & (float64_of(p) > 0)])
    a = float64_of(x)
    x = x[(a >= 2.0**-126) & (a <= 2.0**127) & np.isfinite(a)]
    return np.concatenate([x, np.array([np.nan], carrier)]).astype(source)


@pytest.mark.parametrize("opset", [24, 25])
@pytest.mark.parametrize("source", list(SOURCES))
def test_agree_e8m0(opset, source):
    x = e8m0_inputs(SOURCES[source])
    for mode in ROUND_MODES:
        for saturate in (0, 1):
            mine = assert_agree(x, "float8e8m0", opset, round_mode=mode, saturate=saturate)
            eq(mine, e8m0_oracle(float64_of(x), mode, saturate))
    # +inf: NaN without saturate in all three
    eq(assert_agree(np.array([np.inf], SOURCES[source]), "float8e8m0", opset, saturate=0), [0xFF])
    # below the range and negative: onnxruntime agrees (onnx.reference: its entry)
    low = np.array([2.0**-128, 0.0, -0.0, -2.0, -np.inf, 2.0**-127], f32).astype(SOURCES[source])
    for mode in ROUND_MODES:
        for saturate in (0, 1):
            mine = assert_agree(low, "float8e8m0", opset, ref=False, round_mode=mode, saturate=saturate)
            eq(mine, e8m0_oracle(float64_of(low), mode, saturate))


@pytest.mark.parametrize("source", list(SOURCES))
@np.errstate(over="ignore")
def test_agree_float_to_integers(source):
    rng = np.random.default_rng(7)
    raw = np.concatenate([rng.standard_normal(300) * 50, np.arange(-130, 131) + 0.5, [0.0, -0.0, 0.25, -0.75,
                          126.9, -127.9, 255.9, 1e-30, -1e-30]])
    dt = SOURCES[source]
    for target in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
        width, signed = INTEGERS[target]
        lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
        x = raw.astype(dt)
        t = np.trunc(float64_of(x))
        x = x[(t >= lo) & (t <= hi)]  # in range (truncated): out of range is an entry
        mine = assert_agree(x, target)
        eq(mine, as_codes([int_rule(float(v), target) for v in float64_of(x)], width))
    for target in ("int4", "uint4", "int2", "uint2"):
        # integer values (no rounding question), inside and past the range: qemu_q and
        # onnxruntime wrap; onnx.reference gives 0 past the range (its entry)
        x = np.concatenate([np.arange(-40, 41), [1000, -1000, 65536 + 7]]).astype(dt)
        mine = assert_agree(x, target, ref=False)
        eq(mine, as_codes([sub_byte_rule(float(v), target) for v in float64_of(x)], INTEGERS[target][0]))
        width, signed = INTEGERS[target]
        lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
        inside = x[(float64_of(x) >= lo) & (float64_of(x) <= hi)]
        assert inside.size == hi - lo + 1
        assert_agree(inside, target)


@pytest.mark.parametrize("source", list(SOURCES))
@np.errstate(over="ignore")
def test_agree_float_to_float(source):
    dt = SOURCES[source]
    if dt in (f16, bf16):
        every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dt)
        x = every[~np.isnan(float64_of(every))]
        x = np.concatenate([x, np.array([NAN32, NEG_NAN32], f32).astype(dt)])
    else:
        rng = np.random.default_rng(3)
        x = np.concatenate([rng.standard_normal(500) * np.exp2(rng.integers(-140, 140, 500)),
                            [0.0, -0.0, np.inf, -np.inf, NAN32, NEG_NAN32, 65504.0, 65520.0, 1e-45,
                             3.0e38, -3.0e38, 1e-8]]).astype(f32)
        if dt is f64:
            x = x.astype(f64)  # float32 values: the peers' float32 step is exact (entry)
    for target in ("float", "float16", "bfloat16", "double"):
        mine = assert_agree(x, target)
        if target != "double":
            top = float(ml_dtypes.finfo(peers.NUMPY_TYPE[T[target]]).max)
            assert all(int(m) == binary_code(float(v), target) for m, v in zip(mine, float64_of(x))
                       if 0 < abs(v) <= top)


@pytest.mark.parametrize("name", list(SMALL) + ["float8e8m0"])
def test_agree_codes_out(name):
    dtype = peers.NUMPY_TYPE[T[name]]
    bits = 4 if name == "float4e2m1" else 8
    x = np.arange(1 << bits, dtype=np.uint8).view(dtype)
    for target in ("float", "float16", "bfloat16", "double"):
        mine = assert_agree(x, target, rt=name != "float4e2m1")
        if name == "float8e8m0" and target == "float":
            eq(mine[[0, 127, 254, 255]], [0x00400000, 0x3F800000, 0x7F000000, 0x7FC00000])
    # CastLike: the same kernel, the peers agree too
    like = np.zeros(1, f16)
    mine = peers.ours("CastLike", [x, like], {}, 25)[0][1]
    for got in (peers.run_reference("CastLike", [x, like], {}, 25, [10]),
                None if name == "float4e2m1" else peers.run_ort("CastLike", [x, like], {}, 25, [10])):
        if got is not None:
            eq(got[0][1], mine)


INTEGER_NAMES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "int4", "uint4", "int2", "uint2"]


@pytest.mark.parametrize("source", INTEGER_NAMES)
def test_agree_integers(source):
    width, signed = INTEGERS[source]
    lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    values = sorted({v for v in [lo, hi, 0, 1, 2, 7, 8, 9, 127, 128, 200, 255, 256, 32767, 32768, 65535,
                                 2**31 - 1, 2**31, 2**32 - 1, 2**40 + 3, 2**63 - 1,
                                 -1, -2, -8, -9, -56, -128, -129, -32768, -(2**31), -(2**40) - 3]
                     if lo <= v <= hi})
    dtype = peers.NUMPY_TYPE[T[source]]
    x = np.array(values, dtype=object).astype(np.int64 if signed or width < 64 else np.uint64).astype(dtype)
    for target in INTEGER_NAMES:
        # onnx.reference has no Cast between two of the sub-byte integer types
        mine = assert_agree(x, target, ref=width > 4 or INTEGERS[target][0] > 4)
        eq(mine, as_codes([wrap(v, target) for v in values], INTEGERS[target][0]))
    small = x[np.abs(np.array(values, dtype=object).astype(float)) < 2**24]
    for target in ("float", "float16", "double", "bool"):
        assert_agree(small, target)
    assert_agree(small, "bfloat16")
    positive = small[np.array([int(v) for v in small.tolist()]) > 0] if small.size else small
    # exact below 2^24: one rounding everywhere (onnx.reference has no int4/int2 -> e8m0)
    mine = assert_agree(positive, "float8e8m0", ref=width > 4)
    eq(mine, e8m0_oracle(float64_of(positive), "up", 1))
    for name in F8_NAMES:
        mine = assert_agree(small, name, saturate=1)
        eq(mine, cast_codes(fo.FORMATS[SMALL[name]], float64_of(small), 1, 25))


def test_agree_bool():
    x = np.array([0.0, -0.0, NAN32, 1e-45, -3.0, np.inf], f32)
    for source in SOURCES.values():
        xs = x.astype(source)  # 1e-45 is 0 in float16 and bfloat16
        eq(assert_agree(xs, "bool"), [int(not v == 0) for v in float64_of(xs)])
    b = np.array([True, False])
    for target in ("float", "float16", "bfloat16", "double", "int8", "uint64", "int4", "float8e4m3fn",
                   "float8e5m2"):
        assert_agree(b, target)
    assert_agree(b, "float4e2m1", rt=False)


@pytest.mark.parametrize("opset", [6, 9, 13, 19, 21])
def test_agree_older_versions(opset):
    x = np.array([1.5, -2.5, 0.0, -0.0, 65504.0, 1e6, NAN32, np.inf, 3.3e-8], f32)
    for target in ("float16", "double") + (("bfloat16",) if opset >= 13 else ()):
        assert_agree(x, target, opset)
    assert_agree(x[:4], "int8", opset)
    if opset >= 19:
        for name in F8_NAMES:  # without the classes of the entries (e5m2 NaN, FNUZ inf)
            keep = ~np.isnan(x) if name == "float8e5m2" else np.ones(x.size, bool)
            if name.endswith("fnuz"):
                keep &= ~np.isinf(x)
            assert_agree(x[keep], name, opset, saturate=1)
