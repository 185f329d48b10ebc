"""The codec family (qemu_q.integer_type, qemu_q.minifloat_type; docs/semantics.md, "Codec
family") against an oracle written here from the format definitions: every code's exact
value from its sign, exponent field and mantissa field; rounding by the Datapath table of
docs/semantics.md on exact Python integers. Exhaustive over float16 and bfloat16 inputs;
ml_dtypes (and numpy's float16) as independent peers where they have the same format.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from functools import lru_cache

import ml_dtypes
import numpy as np
import pytest

import qemu_q
import support
from qemu_q import Datapath, ELEMENT_TYPES, dequantize_linear, integer_type, minifloat_type, quantize_linear


# --- the oracle: formats from their definition -------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    """A minifloat as docs/semantics.md defines it (written independently of qemu_q/codecs.py)."""
    e: int
    m: int
    bias: int
    inf: bool
    nan: str  # ieee, fn, fnuz, none

    @property
    def width(self):
        return 1 + self.e + self.m

    @property
    def sign_bit(self):
        return 1 << (self.e + self.m)

    def decode(self, code):
        """('nan', sign) | ('inf', sign) | ('num', sign, Fraction magnitude)."""
        sign = (code >> (self.e + self.m)) & 1
        mag = code & (self.sign_bit - 1)
        field, mant = mag >> self.m, mag & ((1 << self.m) - 1)
        all_ones_exponent = field == (1 << self.e) - 1
        all_ones = mag == self.sign_bit - 1
        if self.nan == "fnuz" and code == self.sign_bit:
            return ("nan", 1)
        if self.nan == "ieee" and all_ones_exponent:
            return ("inf", sign) if self.inf and mant == 0 else ("nan", sign)
        if self.nan == "fn" and all_ones:
            return ("nan", sign)
        if self.nan == "fnuz" and self.inf and all_ones:
            return ("inf", sign)
        if field == 0:
            value = Fraction(mant, 1) * Fraction(2) ** (1 - self.bias - self.m)
        else:
            value = Fraction((1 << self.m) + mant) * Fraction(2) ** (field - self.bias - self.m)
        return ("num", sign, value)

    @property
    def finite(self):
        """{magnitude value: magnitude code} of the non-negative finite codes."""
        return _finite_table(self)

    @property
    def max_value(self):
        return _max_value(self)

    @property
    def max_code(self):
        return self.finite[_max_value(self)]

    def nan_code(self, sign, canonical):
        if self.nan == "fnuz":
            return self.sign_bit
        if self.nan == "none":
            return self.max_code
        if canonical:
            return self.sign_bit - 1
        if self.nan == "fn":
            code = self.sign_bit - 1
        else:  # ieee: the quiet NaN, the top mantissa bit set
            code = (((1 << self.e) - 1) << self.m) | ((1 << (self.m - 1)) if self.m else 0)
        return code | (self.sign_bit if sign else 0)

    def inf_code(self, sign):
        mag = ((1 << self.e) - 1) << self.m if self.nan == "ieee" else self.sign_bit - 1
        return mag | (self.sign_bit if sign else 0)


@lru_cache(maxsize=None)
def _finite_table(spec):
    table = {}
    for code in range(spec.sign_bit):
        d = spec.decode(code)
        if d[0] == "num":
            table[d[2]] = code
    return table


@lru_cache(maxsize=None)
def _max_value(spec):
    return max(spec.finite)


def value_parts(bits: int, kind: str):
    """An input's exact value: ('nan', sign) | ('inf', sign) | ('num', sign, M, X) with the
    magnitude M * 2**X (M >= 0)."""
    e_bits, m_bits, bias = {"float16": (5, 10, 15), "bfloat16": (8, 7, 127), "float32": (8, 23, 127)}[kind]
    sign = bits >> (e_bits + m_bits)
    field = (bits >> m_bits) & ((1 << e_bits) - 1)
    mant = bits & ((1 << m_bits) - 1)
    if field == (1 << e_bits) - 1:
        return ("inf", sign) if mant == 0 else ("nan", sign)
    if field == 0:
        return ("num", sign, mant, 1 - bias - m_bits)
    return ("num", sign, mant + (1 << m_bits), field - bias - m_bits)


def round_magnitude(M: int, X: int, ulp_exp: int, negative: bool, mode: str, word: int = 0) -> int:
    """n such that n * 2**ulp_exp is M * 2**X rounded by `mode` (docs/semantics.md table)."""
    shift = ulp_exp - X
    if shift <= 0:
        return M << -shift
    whole, rem = M >> shift, M & ((1 << shift) - 1)
    if rem == 0:
        return whole
    half = 1 << (shift - 1)
    up = {
        "half_even": rem > half or (rem == half and whole % 2 == 1),
        "half_away": rem >= half,
        "half_up": rem > half or (rem == half and not negative),
        "half_down": rem > half or (rem == half and negative),
        "toward_zero": False,
        "down": negative,
        "up": not negative,
        "to_odd": whole % 2 == 0,
        "stochastic": ((rem << 32) >> shift) + word >= 1 << 32,
    }[mode]
    return whole + 1 if up else whole


@lru_cache(maxsize=None)
def _finite_keys(spec):
    """{(odd, exponent): magnitude code}: each finite value as odd * 2**exponent (0: (0, 0))."""
    return {_key(v.numerator, -(v.denominator.bit_length() - 1)): code for v, code in spec.finite.items()}


def _key(n, u):
    if n == 0:
        return (0, 0)
    zeros = (n & -n).bit_length() - 1
    return (n >> zeros, u + zeros)


def classify(spec: Spec, parts, mode="half_even", word=0):
    """The quotient rounded by `mode`: ('code', sign, magnitude code) | ('over', sign) (beyond the
    largest finite value, or +-inf) | ('nan', sign)."""
    if parts[0] == "nan":
        return ("nan", parts[1])
    sign = parts[1]
    if parts[0] == "inf":
        return ("over", sign)
    M, X = parts[2], parts[3]
    if M == 0:
        return ("code", sign, 0)
    exponent = max(X + M.bit_length() - 1, 1 - spec.bias)
    u = exponent - spec.m
    n = round_magnitude(M, X, u, bool(sign), mode, word)
    code = _finite_keys(spec).get(_key(n, u))
    # every rounded value at or below the largest finite one is on the format's grid
    return ("over", sign) if code is None else ("code", sign, code)


def finish(spec: Spec, c, saturate: bool, canonical=False) -> int:
    """The code QuantizeLinear writes (docs/semantics.md, "Codec family")."""
    if c[0] == "nan":
        return spec.nan_code(c[1], canonical)
    sign = c[1]
    if c[0] == "code":
        if c[2] == 0:
            return spec.sign_bit if sign and spec.nan != "fnuz" else 0
        return c[2] | (spec.sign_bit if sign else 0)
    if saturate or spec.nan == "none":
        return spec.max_code | (spec.sign_bit if sign else 0)
    if spec.inf:
        return spec.inf_code(sign)
    return spec.nan_code(sign, canonical)


def encode(spec: Spec, parts, saturate: bool, mode="half_even", word=0, canonical=False) -> int:
    return finish(spec, classify(spec, parts, mode, word), saturate, canonical)


# The formats under test: (qemu_q type, oracle spec, the peer dtype or None).
MINIFLOATS = {
    "e3m2": (lambda: minifloat_type(3, 2), Spec(3, 2, 3, False, "ieee"), None),
    "e4m3_inf": (lambda: minifloat_type(4, 3, inf=True), Spec(4, 3, 7, True, "ieee"), ml_dtypes.float8_e4m3),
    "e5m3_inf": (lambda: minifloat_type(5, 3, inf=True), Spec(5, 3, 15, True, "ieee"), None),
    "e2m3fn": (lambda: minifloat_type(2, 3, nan="fn"), Spec(2, 3, 1, False, "fn"), None),
    "e3m4_inf": (lambda: minifloat_type(3, 4, inf=True), Spec(3, 4, 3, True, "ieee"), ml_dtypes.float8_e3m4),
    "e4m3b11fnuz": (lambda: minifloat_type(4, 3, bias=11, nan="fnuz", negative_zero=False),
                    Spec(4, 3, 11, False, "fnuz"), ml_dtypes.float8_e4m3b11fnuz),
    "p3109_binary8p3": (lambda: minifloat_type(5, 2, inf=True, nan="fnuz", negative_zero=False),
                        Spec(5, 2, 16, True, "fnuz"), None),
    "e3m1_none": (lambda: minifloat_type(3, 1, nan="none"), Spec(3, 1, 3, False, "none"), None),
    "e5m10_inf": (lambda: minifloat_type(5, 10, inf=True), Spec(5, 10, 15, True, "ieee"), np.float16),
    "e8m7_inf": (lambda: minifloat_type(8, 7, inf=True), Spec(8, 7, 127, True, "ieee"), ml_dtypes.bfloat16),
}

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
INPUT_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@lru_cache(maxsize=None)
def input_parts(kind):
    return [value_parts(int(b), kind) for b in ALL16]


def words_for(n, seed=15):
    return np.random.default_rng(seed).integers(0, 1 << 32, size=n, dtype=np.uint32)


def as_codes(y):
    return np.asarray(y).view(np.uint16 if y.dtype.itemsize == 2 else np.uint8).astype(np.int64)


# --- construction ------------------------------------------------------------------------

def test_onnx_types_are_named_instances():
    T = ELEMENT_TYPES
    assert minifloat_type(4, 3, nan="fn") is T["float8e4m3fn"]
    assert minifloat_type(4, 3, nan="fnuz", negative_zero=False) is T["float8e4m3fnuz"]
    assert minifloat_type(5, 2, inf=True, nan="ieee") is T["float8e5m2"]
    assert minifloat_type(5, 2, nan="fnuz", negative_zero=False) is T["float8e5m2fnuz"]
    assert minifloat_type(2, 1, nan="none") is T["float4e2m1"]
    assert minifloat_type(2, 3, nan="none") is T["float6e2m3"]
    assert minifloat_type(3, 2, nan="none") is T["float6e3m2"]
    for bits, name in ((8, "int8"), (16, "int16"), (4, "int4"), (2, "int2")):
        assert integer_type(bits) is T[name]
        assert integer_type(bits, signed=False) is T["u" + name]
    assert integer_type(8, narrow_range=True) is not T["int8"]


def test_family_types_are_immutable_hashable_and_named():
    a, b = integer_type(5), integer_type(5)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.lo = 0
    assert (a.lo, a.hi, a.dtype, a.storage) == (-16, 15, np.dtype(np.int8), np.dtype(np.uint8))
    narrow = integer_type(8, narrow_range=True)
    assert (narrow.lo, narrow.hi) == (-127, 127)
    assert (integer_type(4, signed=False, narrow_range=True).hi) == 14
    u12 = integer_type(12, signed=False)
    assert (u12.lo, u12.hi, u12.dtype) == (0, 4095, np.dtype(np.uint16))
    f = minifloat_type(4, 3, bias=11, nan="fnuz", negative_zero=False)
    assert f == minifloat_type(4, 3, 11, False, "fnuz", False) and f != minifloat_type(4, 3, inf=True)
    assert f.dtype == np.dtype(np.uint8) and minifloat_type(5, 3).dtype == np.dtype(np.uint16)
    # the names resolve back through qemu_q.codecs.family_type
    for t in (a, narrow, u12, f, minifloat_type(3, 4, inf=True), minifloat_type(5, 2, inf=True, nan="fnuz",
                                                                             negative_zero=False)):
        assert qemu_q.codecs.family_type(t.name) == t
    assert qemu_q.codecs.parameters(ELEMENT_TYPES["float8e4m3fnuz"]) == dict(
        exponent_bits=4, mantissa_bits=3, bias=8, inf=False, nan="fnuz", negative_zero=False)
    assert qemu_q.codecs.parameters(narrow) == dict(bits=8, signed=True, narrow_range=True)


@pytest.mark.parametrize("call, message", [
    (lambda: integer_type(1), "bits=1; allowed 2..16"),
    (lambda: integer_type(17), "bits=17; allowed 2..16"),
    (lambda: integer_type(4, signed="yes"), "signed='yes'"),
    (lambda: minifloat_type(0, 3), "exponent_bits=0; allowed 1..8"),
    (lambda: minifloat_type(9, 3), "exponent_bits=9; allowed 1..8"),
    (lambda: minifloat_type(5, 11), "mantissa_bits=11; allowed 1..10"),
    (lambda: minifloat_type(4, 3, nan="quiet"), "nan='quiet'; allowed 'ieee', 'fn', 'fnuz', 'none'"),
    (lambda: minifloat_type(4, 3, bias=200), "bias=200; allowed 0..127"),
    (lambda: minifloat_type(8, 3, bias=100), "bias=100: the largest value"),
    (lambda: minifloat_type(8, 3, bias=100), "allowed bias 127..127"),
    # e = 8 without the IEEE all-ones exponent for inf/NaN: finite values up there, beyond
    # float32 at every bias (fnuz's default bias, 128, is outside the range itself)
    (lambda: minifloat_type(8, 3, nan="fn"), "exponent_bits=8 with nan='fn', inf=False: the largest "
                                             "value is beyond float32 at every bias in 0..127"),
    (lambda: minifloat_type(8, 2, nan="none"), "beyond float32 at every bias in 0..127"),
    (lambda: minifloat_type(8, 3, nan="fnuz", negative_zero=False),
     "exponent_bits=8 with nan='fnuz': the largest value is beyond float32 at every bias"),
    (lambda: minifloat_type(4, 3, inf=True, nan="fn"), "inf=True with nan='fn'"),
    (lambda: minifloat_type(4, 3, nan="fnuz"), "negative_zero=True with nan='fnuz'"),
    (lambda: minifloat_type(4, 3, negative_zero=False), "negative_zero=False with nan='ieee'"),
    (lambda: minifloat_type(4, 0), "mantissa_bits=0; allowed 1..11"),
    (lambda: minifloat_type(1, 2), "leave no normal finite value"),
])
def test_invalid_parameters_are_named(call, message):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert message in str(info.value)


# --- minifloats: decode every code, quantize every float16 / bfloat16 ---------------------

def expected_decode(spec, codes):
    out = np.empty(len(codes), dtype=np.uint32)
    for i, code in enumerate(codes):
        d = spec.decode(int(code))
        if d[0] == "nan":
            out[i] = 0xFFC00000 if (spec.nan == "fnuz" or d[1]) else 0x7FC00000
        elif d[0] == "inf":
            out[i] = 0xFF800000 if d[1] else 0x7F800000
        else:
            v = np.float32(float(d[2]))
            assert Fraction(float(v)) == d[2]  # every value is a float32
            out[i] = (v.view(np.uint32) | (np.uint32(0x80000000) if d[1] else 0))
    return out


@pytest.mark.parametrize("name", MINIFLOATS)
def test_decode_every_code(name):
    make, spec, _ = MINIFLOATS[name]
    etype = make()
    codes = np.arange(1 << spec.width, dtype=etype.dtype)
    y = dequantize_linear(codes, np.float32(1.0), x_dtype=etype)
    np.testing.assert_array_equal(y.view(np.uint32), expected_decode(spec, codes))
    # a scale and a float16 output: (x - 0) * scale rounded once to float16
    y16 = dequantize_linear(codes, np.float32(0.5), x_dtype=etype, output_dtype="float16")
    finite = np.isfinite(y)
    assert np.array_equal(np.isnan(y16), np.isnan(y))
    with np.errstate(over="ignore"):  # one rounding of an exact product (numpy's is correct)
        ref = (y[finite].astype(np.float64) * 0.5).astype(np.float16)
    np.testing.assert_array_equal(y16[finite].view(np.uint16), ref.view(np.uint16))


@pytest.mark.parametrize("kind", INPUT_DTYPES)
@pytest.mark.parametrize("name", MINIFLOATS)
def test_quantize_every_input_half_even(name, kind):
    make, spec, _ = MINIFLOATS[name]
    etype = make()
    x = ALL16.view(INPUT_DTYPES[kind])
    scale = np.array(1.0, dtype=INPUT_DTYPES[kind])
    classes = [classify(spec, p) for p in input_parts(kind)]
    for saturate in (1, 0):
        got = as_codes(quantize_linear(x, scale, output_dtype=etype, saturate=saturate))
        want = np.array([finish(spec, c, bool(saturate)) for c in classes])
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (saturate, [(hex(int(ALL16[i])), hex(got[i]), hex(want[i])) for i in bad[:5]])
        if kind == "float16":
            # float32 x (the float32 kernels: the vectorized path where the codes are bytes)
            got32 = as_codes(quantize_linear(x.astype(np.float32), np.float32(1.0), output_dtype=etype,
                                             saturate=saturate))
            np.testing.assert_array_equal(got32, want)


@pytest.mark.parametrize("mode", ["half_away", "toward_zero", "up", "to_odd", "stochastic"])
@pytest.mark.parametrize("name", ["e3m2", "e4m3_inf", "e5m3_inf", "e4m3b11fnuz", "p3109_binary8p3",
                                  "e3m1_none", "e8m7_inf"])
def test_quantize_every_float16_rounding_modes(name, mode):
    make, spec, _ = MINIFLOATS[name]
    etype = make()
    kind = "float16" if name != "e8m7_inf" else "bfloat16"
    x = ALL16.view(INPUT_DTYPES[kind])
    words = words_for(x.size) if mode == "stochastic" else None
    classes = [classify(spec, p, mode, 0 if words is None else int(words[i]))
               for i, p in enumerate(input_parts(kind))]
    for saturate in (1, 0):
        got = as_codes(quantize_linear(x, np.array(1.0, dtype=x.dtype), output_dtype=etype, saturate=saturate,
                                       datapath=Datapath(rounding=mode), random_bits=words))
        want = np.array([finish(spec, c, bool(saturate)) for c in classes])
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (saturate, [(hex(int(ALL16[i])), hex(got[i]), hex(want[i])) for i in bad[:5]])


@pytest.mark.parametrize("name", ["e4m3_inf", "e2m3fn", "e5m3_inf"])
def test_datapath_nan_canonical_and_flush(name):
    make, spec, _ = MINIFLOATS[name]
    etype = make()
    x = ALL16.view(np.float16)
    parts = input_parts("float16")
    got = as_codes(quantize_linear(x, np.float16(1.0), output_dtype=etype, saturate=0,
                                   datapath=Datapath(nan="canonical")))
    want = np.array([encode(spec, p, False, canonical=True) for p in parts])
    np.testing.assert_array_equal(got, want)
    # flush_outputs: a result below the smallest normal becomes a zero of its sign
    got = as_codes(quantize_linear(x, np.float16(1.0), output_dtype=etype,
                                   datapath=Datapath(subnormals="flush_outputs")))
    want = np.array([encode(spec, p, True) for p in parts])
    magnitude = want & (spec.sign_bit - 1)
    subnormal = (magnitude > 0) & (magnitude < (1 << spec.m))
    want = np.where(subnormal, want & spec.sign_bit, want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", MINIFLOATS)
def test_round_trip_every_code(name):
    make, spec, _ = MINIFLOATS[name]
    etype = make()
    codes = np.arange(1 << spec.width, dtype=etype.dtype)
    values = dequantize_linear(codes, np.float32(1.0), x_dtype=etype)
    back = as_codes(quantize_linear(values, np.float32(1.0), output_dtype=etype, saturate=0))
    kinds = [spec.decode(int(c)) for c in codes]
    for code, d, b in zip(codes.astype(np.int64), kinds, back):
        if d[0] == "nan":
            assert b == spec.nan_code(d[1], False)
        else:
            assert b == code, (hex(code), hex(b))


@support.divergence_entry("Codec family float16-layout codes: numpy keeps NaN payloads")
@pytest.mark.parametrize("name", [n for n, (_, _, peer) in MINIFLOATS.items() if peer is not None])
def test_ml_dtypes_peer(name):
    make, spec, peer = MINIFLOATS[name]
    etype = make()
    codes = np.arange(1 << spec.width, dtype=etype.dtype)
    ours = dequantize_linear(codes, np.float32(1.0), x_dtype=etype)
    with np.errstate(invalid="ignore"):
        theirs = codes.view(peer).astype(np.float32)
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))
    # float32 inputs: every combination of the top 10 + m bits with the low bits at and
    # around the rounding position (ties and their neighbours), and every float16 value
    drop = 23 - spec.m
    top = np.arange(1 << (10 + spec.m), dtype=np.uint32) << np.uint32(drop - 1)
    low = np.array([0, 1, 1 << (drop - 2), (1 << (drop - 1)) - 1], dtype=np.uint32)
    bits = (top[:, None] | low[None, :]).reshape(-1)
    x = np.concatenate([bits.view(np.float32), ALL16.view(np.float16).astype(np.float32)])
    # ml_dtypes' conversion does not saturate: saturate=0
    ours = as_codes(quantize_linear(x, np.float32(1.0), output_dtype=etype, saturate=0))
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = x.astype(peer).view(etype.dtype).astype(np.int64)
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], theirs[~nan])
    sign = np.signbit(x[nan]).astype(np.int64) * spec.sign_bit
    np.testing.assert_array_equal(ours[nan], sign | spec.nan_code(0, False))
    if peer is np.float16:
        # docs/divergences.md, "Codec family": numpy's float16 cast keeps a NaN's top payload
        # bits; qemu_q writes the format's one quiet NaN (as ml_dtypes does for its formats)
        t = theirs[nan]
        assert np.all((t & 0x7C00 == 0x7C00) & (t & 0x3FF != 0) & ((t & 0x8000) == sign))
        assert np.any(t != ours[nan])
    else:
        np.testing.assert_array_equal(ours[nan], theirs[nan])


def test_p3109_binary8p3_codes():
    # IEEE P3109 binary8p3: bias 2**(K-P-1) = 16, 0x80 NaN, 0x7F/0xFF +-inf, no -0.
    t = minifloat_type(5, 2, inf=True, nan="fnuz", negative_zero=False)
    v = dequantize_linear(np.array([0x00, 0x01, 0x04, 0x7E, 0x7F, 0xFF, 0x80, 0xFE], np.uint8),
                          np.float32(1.0), x_dtype=t)
    assert v[:4].tolist() == [0.0, 2.0 ** -17, 2.0 ** -15, 1.5 * 2.0 ** 15]
    assert v[4] == np.inf and v[5] == -np.inf and np.isnan(v[6]) and v[7] == -1.5 * 2.0 ** 15


# --- integers ----------------------------------------------------------------------------

INTEGERS = {
    "int3": (lambda: integer_type(3), -4, 3),
    "int5_narrow": (lambda: integer_type(5, narrow_range=True), -15, 15),
    "uint12": (lambda: integer_type(12, signed=False), 0, 4095),
    "int8_narrow": (lambda: integer_type(8, narrow_range=True), -127, 127),
    "uint7_narrow": (lambda: integer_type(7, signed=False, narrow_range=True), 0, 126),
    "int16_narrow": (lambda: integer_type(16, narrow_range=True), -32767, 32767),
}


def integer_oracle(parts, lo, hi, zp, mode, words=None):
    out = []
    for i, p in enumerate(parts):
        if p[0] == "nan":
            out.append(lo)
        elif p[0] == "inf":
            out.append(lo if p[1] else hi)
        else:
            n = round_magnitude(p[2], p[3], 0, bool(p[1]), mode, 0 if words is None else int(words[i]))
            out.append(min(max((-n if p[1] else n) + zp, lo), hi))
    return np.array(out)


@pytest.mark.parametrize("mode", ["half_even", "half_away", "down", "stochastic"])
@pytest.mark.parametrize("kind", INPUT_DTYPES)
@pytest.mark.parametrize("name", INTEGERS)
def test_integers_every_input(name, kind, mode):
    make, lo, hi = INTEGERS[name]
    etype = make()
    assert (etype.lo, etype.hi) == (lo, hi)
    zp_value = 1 if lo < 0 else 3
    zp = np.array(zp_value, dtype=etype.dtype)
    x = ALL16.view(INPUT_DTYPES[kind])
    words = words_for(x.size, 7) if mode == "stochastic" else None
    datapath = None if mode == "half_even" else Datapath(rounding=mode)
    got = quantize_linear(x, np.array(1.0, dtype=x.dtype), zp, output_dtype=etype, datapath=datapath,
                          random_bits=words)
    assert got.dtype == etype.dtype
    want = integer_oracle(input_parts(kind), lo, hi, zp_value, mode, words)
    np.testing.assert_array_equal(got.astype(np.int64), want)
    if mode == "half_even" and kind == "float16":
        # float32 x: the vectorized integer kernel
        got = quantize_linear(x.astype(np.float32), np.float32(1.0), zp, output_dtype=etype)
        np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("name", INTEGERS)
def test_integers_dequantize_and_round_trip(name):
    make, lo, hi = INTEGERS[name]
    etype = make()
    codes = np.arange(lo, hi + 1).astype(etype.dtype)
    zp = np.array(-2 if lo < 0 else 2, dtype=etype.dtype)
    y = dequantize_linear(codes, np.float32(0.25), zp, x_dtype=etype)
    want = np.array([float(Fraction(int(c) - int(zp)) / 4) for c in codes], dtype=np.float32)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    back = quantize_linear(y, np.float32(0.25), zp, output_dtype=etype)
    np.testing.assert_array_equal(back, codes)
    # stored values outside the type's range are refused, naming them
    if lo - 1 >= np.iinfo(etype.dtype).min:
        with pytest.raises(ValueError, match=f"x holds {lo - 1}, outside {etype.name}'s range"):
            dequantize_linear(np.array([0, lo - 1], etype.dtype), np.float32(1.0), x_dtype=etype)
    if hi + 1 <= np.iinfo(etype.dtype).max:
        with pytest.raises(ValueError, match="y_zero_point holds"):
            quantize_linear(np.zeros(2, np.float32), np.float32(1.0), np.array(hi + 1, etype.dtype),
                            output_dtype=etype)


# --- packing, threads, errors --------------------------------------------------------------

@pytest.mark.parametrize("etype", [integer_type(4, narrow_range=True), integer_type(2, signed=False,
                                                                                    narrow_range=True),
                                   minifloat_type(3, 2), minifloat_type(2, 1, nan="fn"),
                                   minifloat_type(4, 3, inf=True), minifloat_type(5, 10, inf=True)])
def test_packed_round_trip(etype):
    x = np.linspace(-9, 9, 37).astype(np.float32)
    codes = quantize_linear(x, np.float32(1.0), output_dtype=etype)
    raw = quantize_linear(x, np.float32(1.0), output_dtype=etype, packed=True)
    np.testing.assert_array_equal(raw, qemu_q.pack(codes, dtype=etype))
    np.testing.assert_array_equal(qemu_q.unpack(raw, etype, x.shape), codes)
    y = dequantize_linear(raw, np.float32(1.0), packed=True, dtype=etype, shape=x.shape)
    np.testing.assert_array_equal(y.view(np.uint32),
                                  dequantize_linear(codes, np.float32(1.0), x_dtype=etype).view(np.uint32))
    if etype.bits == 4:
        # the ONNX layout: element 0 in the low nibble
        assert raw[0] == (int(codes[0]) & 0xF) | ((int(codes[1]) & 0xF) << 4)


def test_unpackable_widths_are_refused():
    for etype in (integer_type(5), minifloat_type(3, 1)):
        with pytest.raises(ValueError, match="no ONNX raw_data layout"):
            quantize_linear(np.zeros(4, np.float32), np.float32(1.0), output_dtype=etype, packed=True)
        with pytest.raises(ValueError, match="no ONNX raw_data layout"):
            qemu_q.pack(np.zeros(4, etype.dtype), dtype=etype)


@pytest.mark.parametrize("etype, values, message", [
    (integer_type(6), [1, 40], "array holds 40, outside int6's range \\[-32, 31\\]"),
    (integer_type(6), [-40, 1], "array holds -40, outside int6's range"),
    (integer_type(8, narrow_range=True), [0, -128], "array holds -128, outside int8_narrow's range \\[-127, 127\\]"),
    (integer_type(6, signed=False), [64], "array holds 64, outside uint6's range \\[0, 63\\]"),
    (minifloat_type(3, 2, bias=5, inf=True), [0x01, 0x40], "array holds the code 0x40, wider than .* 6 bits"),
])
def test_pack_refuses_values_that_are_not_codes(etype, values, message):
    # packing keeps a field's low bits: 40 in int6 would come back as -24, 0x40 in a 6-bit
    # minifloat as 0x00
    array = np.array(values, dtype=etype.dtype)
    before = array.copy()
    with pytest.raises(ValueError, match=message):
        qemu_q.pack(array, dtype=etype)
    np.testing.assert_array_equal(array, before)


@pytest.mark.parametrize("etype, raw, count, message", [
    (integer_type(2, narrow_range=True), [0b0110], 2, "buffer holds -2, outside int2_narrow's range \\[-1, 1\\]"),
    (integer_type(4, narrow_range=True), [0x81], 2, "buffer holds -8, outside int4_narrow's range"),
    (integer_type(8, narrow_range=True), [0x05, 0x80], 2, "buffer holds -128, outside int8_narrow's range"),
    (integer_type(16, narrow_range=True), [0x00, 0x80], 1, "buffer holds -32768, outside int16_narrow's range"),
])
def test_unpack_refuses_fields_that_are_not_codes(etype, raw, count, message):
    with pytest.raises(ValueError, match=message):
        qemu_q.unpack(np.array(raw, np.uint8), etype, count)
    # DequantizeLinear names its own input
    with pytest.raises(ValueError, match="DequantizeLinear-28 \\(opset 28\\): x holds"):
        dequantize_linear(np.array(raw, np.uint8), np.float32(1.0), packed=True, dtype=etype, shape=(count,))
    # every field of the type's range comes back as written: -1, 0, 1 of int2_narrow
    if etype.bits == 2:
        assert qemu_q.unpack(np.array([0b00_01_11], np.uint8), etype, 3).tolist() == [-1, 1, 0]

@pytest.mark.parametrize("etype", [integer_type(5), integer_type(12, signed=False), minifloat_type(4, 3, inf=True),
                                   minifloat_type(5, 3, inf=True)])
def test_thread_count_independence(etype):
    x = ALL16.view(np.float16).astype(np.float32)
    x = np.concatenate([x, x[::-1]])
    scale = np.linspace(0.5, 2, 8).astype(np.float32)
    for dp in (None, Datapath(rounding="half_away")):
        runs = [quantize_linear(x.reshape(8, -1), scale, output_dtype=etype, axis=0, n_threads=t,
                                datapath=dp) for t in (1, 3, 8)]
        for r in runs[1:]:
            np.testing.assert_array_equal(r, runs[0])
    codes = runs[0]
    outs = [dequantize_linear(codes, scale, axis=0, x_dtype=etype, n_threads=t) for t in (1, 3, 8)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o.view(np.uint32), outs[0].view(np.uint32))


def test_zero_points_and_type_errors():
    t = minifloat_type(4, 3, inf=True)
    x = np.array([-0.0, 0.0, -1e-30], np.float32)
    # a -0 zero-point code adds -0: a +0 quotient stays +0 (IEEE: +0 + -0 = +0)
    got = quantize_linear(x, np.float32(1.0), np.array(0x80, np.uint8), output_dtype=t)
    assert got.tolist() == [0x80, 0x00, 0x80]
    got = quantize_linear(x, np.float32(1.0), np.array(0x00, np.uint8), output_dtype=t)
    assert got.tolist() == [0x00, 0x00, 0x80]
    with pytest.raises(ValueError, match="must be a zero code"):
        quantize_linear(x, np.float32(1.0), np.array(0x38, np.uint8), output_dtype=t)
    with pytest.raises(TypeError, match="conflicts with y_zero_point"):
        quantize_linear(x, np.float32(1.0), np.array(0, np.int8), output_dtype=t)
    with pytest.raises(TypeError, match="x_dtype=int5 codes are stored as int8"):
        dequantize_linear(np.zeros(3, np.uint8), np.float32(1.0), x_dtype=integer_type(5))
    with pytest.raises(ValueError, match="holds the code 0x40, wider than"):
        dequantize_linear(np.array([0x40], np.uint8), np.float32(1.0), x_dtype=minifloat_type(3, 2))
    with pytest.raises(ValueError, match="has no attribute 'output_dtype'"):
        quantize_linear(x, np.float32(1.0), output_dtype=integer_type(5), opset=19)


# --- every instruction-set level, kernel path and thread count -----------------------------

LEVEL_LAYOUTS = [  # (shape, axis, block_size): straddling the task, prefetch and buffer sizes
    ((3 * 32768 + 517,), None, 0),
    ((13, 5 * 4096 + 7), 1, 0),
    ((9, 8192 + 45), 1, 32),
    ((67, 3, 600), 0, 16),
]


@pytest.mark.parametrize("layout", range(len(LEVEL_LAYOUTS)))
@pytest.mark.parametrize("etype", [integer_type(5), integer_type(12, signed=False), integer_type(8, narrow_range=True),
                                   minifloat_type(4, 3, inf=True), minifloat_type(3, 2),
                                   minifloat_type(5, 3, inf=True),
                                   minifloat_type(5, 2, inf=True, nan="fnuz", negative_zero=False)],
                         ids=lambda t: t.name)
def test_levels_paths_threads(etype, layout):
    from qemu_q import _dispatch, _kernels

    shape, axis, block = LEVEL_LAYOUTS[layout]
    rng = np.random.default_rng(layout)
    x = (rng.standard_normal(shape) * 40).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    x.reshape(-1)[5::101] = np.inf
    if axis is None:
        scale = np.float32(0.37)
    elif block:
        scale_shape = list(shape)
        scale_shape[axis] = -(-shape[axis] // block)
        scale = rng.uniform(0.1, 2, scale_shape).astype(np.float32)
    else:
        scale = rng.uniform(0.1, 2, shape[axis]).astype(np.float32)
    kwargs = dict(output_dtype=etype, axis=axis if axis is not None else 1, block_size=block)
    level, fast = _kernels.active.level, _dispatch.FAST_KERNELS
    try:
        _kernels.use("baseline")
        _dispatch.FAST_KERNELS = False
        want_q = quantize_linear(x, scale, n_threads=1, **kwargs)
        want_d = dequantize_linear(want_q, scale, axis=kwargs["axis"], block_size=block, x_dtype=etype, n_threads=1)
        for lv in _kernels.available_levels():
            for fk in (True, False):
                for n in (1, 3, 8):
                    _kernels.use(lv)
                    _dispatch.FAST_KERNELS = fk
                    got = quantize_linear(x, scale, n_threads=n, **kwargs)
                    np.testing.assert_array_equal(got, want_q, err_msg=f"{lv} fast={fk} n={n}")
                    got_d = dequantize_linear(want_q, scale, axis=kwargs["axis"], block_size=block,
                                              x_dtype=etype, n_threads=n)
                    np.testing.assert_array_equal(got_d.view(np.uint32), want_d.view(np.uint32))
    finally:
        _kernels.use(level)
        _dispatch.FAST_KERNELS = fast


def test_x_dtype_of_an_onnx_type_is_the_usual_path():
    codes = np.array([-128, -1, 0, 127], dtype=np.int8)
    y = dequantize_linear(codes, np.float32(0.5), x_dtype=integer_type(8))
    assert y.tolist() == [-64.0, -0.5, 0.0, 63.5]
    with pytest.raises(TypeError, match="stored as uint8"):
        dequantize_linear(codes, np.float32(0.5), x_dtype=integer_type(8, signed=False))
