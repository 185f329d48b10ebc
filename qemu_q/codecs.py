"""The codec family: integer types of any width 2..16 and minifloats of any exponent and
mantissa width (issue 15; docs/semantics.md, "Codec family").

`integer_type(bits, signed=True, narrow_range=False)` and `minifloat_type(exponent_bits,
mantissa_bits, bias=None, inf=False, nan="ieee", negative_zero=True)` return an
`ElementType`, immutable and hashable, accepted wherever `output_dtype` is. Parameters that
describe an ONNX type return that ONNX type itself (`integer_type(8) is ELEMENT_TYPES["int8"]`,
`minifloat_type(4, 3, nan="fn") is ELEMENT_TYPES["float8e4m3fn"]`), so that the ONNX
kernels and rules run for it unchanged. The others are family types (`onnx_id == 0`):

- integers are stored in the smallest numpy integer type of their signedness that holds
  them (int8/uint8 up to 8 bits, int16/uint16 up to 16), as their values (sign-extended);
- minifloat codes are stored in uint8 (width <= 8) or uint16, the code in the low `width`
  bits, the sign bit at bit width - 1.

The kernels receive a family minifloat as a small_float_id holding its parameters
(pyx/_codecs.pxd, SF_FAMILY): the one small-float encoder and decoder serve it.
"""

from __future__ import annotations

import operator
import re
from fractions import Fraction

import numpy as np

from ._dtypes import ELEMENT_TYPES, ElementType
from ._parallel import ENUMS

NAN_CONVENTIONS = ("ieee", "fn", "fnuz", "none")
INTEGER_BITS = (2, 16)
EXPONENT_BITS = (1, 8)
MAX_WIDTH = 16  # sign + exponent + mantissa bits: a code fits uint16 storage
BIAS_RANGE = (0, 127)
# The layouts sub-byte codes are packed in (ONNX raw_data): 2, 4, 6 bits; 8 and 16 are whole bytes.
PACKABLE_BITS = (2, 4, 6, 8, 16)

SF_FAMILY = ENUMS["SF_FAMILY"]

# The ONNX types, by their family parameters: (exponent, mantissa, bias, inf, nan, negative_zero).
_ONNX_MINIFLOATS = {
    (4, 3, 7, False, "fn", True): "float8e4m3fn",
    (4, 3, 8, False, "fnuz", False): "float8e4m3fnuz",
    (5, 2, 15, True, "ieee", True): "float8e5m2",
    (5, 2, 16, False, "fnuz", False): "float8e5m2fnuz",
    (2, 1, 1, False, "none", True): "float4e2m1",
    (2, 3, 1, False, "none", True): "float6e2m3",
    (3, 2, 3, False, "none", True): "float6e3m2",
}
_ONNX_INTEGERS = {
    (8, True): "int8", (8, False): "uint8", (16, True): "int16", (16, False): "uint16",
    (4, True): "int4", (4, False): "uint4", (2, True): "int2", (2, False): "uint2",
}
_PARAMETERS = {name: key for key, name in _ONNX_MINIFLOATS.items()}


def _int_argument(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r}: expected an int in [{lo}, {hi}]")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}: expected an int in [{lo}, {hi}]") from None
    if not lo <= number <= hi:
        raise ValueError(f"{name}={number}; allowed {lo}..{hi}")
    return number


def _flag_argument(value, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name}={value!r}: expected True or False")


def integer_type(bits: int, signed: bool = True, narrow_range: bool = False) -> ElementType:
    """An integer code type of `bits` bits (2..16): [-2**(bits-1), 2**(bits-1) - 1] signed,
    [0, 2**bits - 1] unsigned; `narrow_range` drops the most negative code of a signed type
    (symmetric: [-(2**(bits-1) - 1), 2**(bits-1) - 1]) and the largest of an unsigned one
    ([0, 2**bits - 2]), as QONNX's IntQuant does. The ONNX types (int2/4/8/16 and their
    unsigned forms, not narrow) are returned as themselves."""
    bits = _int_argument(bits, "bits", *INTEGER_BITS)
    signed = _flag_argument(signed, "signed")
    narrow_range = _flag_argument(narrow_range, "narrow_range")
    if not narrow_range and (bits, signed) in _ONNX_INTEGERS:
        return ELEMENT_TYPES[_ONNX_INTEGERS[bits, signed]]
    if signed:
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if narrow_range:
            lo += 1
    else:
        lo, hi = 0, (1 << bits) - 1
        if narrow_range:
            hi -= 1
    name = f"{'int' if signed else 'uint'}{bits}{'_narrow' if narrow_range else ''}"
    wide = bits > 8
    dtype = np.dtype((np.int16 if wide else np.int8) if signed else (np.uint16 if wide else np.uint8))
    storage = np.dtype(np.uint16 if wide else np.uint8)
    return ElementType(name, 0, dtype, storage, "integer", bits, lo, hi)


def _default_bias(exponent_bits: int, nan: str) -> int:
    # IEEE: 2**(e-1) - 1; FNUZ (ONNX's e4m3fnuz, e5m2fnuz; IEEE P3109): one more.
    return (1 << (exponent_bits - 1)) - (0 if nan == "fnuz" else 1)


def minifloat_type(exponent_bits: int, mantissa_bits: int, bias: int | None = None,
                   inf: bool = False, nan: str = "ieee", negative_zero: bool = True) -> ElementType:
    """A binary floating-point code type: a sign bit, `exponent_bits` (1..8), `mantissa_bits`
    (1..15 - exponent_bits), the value of a code with exponent field E and mantissa M being
    (-1)**s * 2**(1 - bias) * M / 2**m if E == 0, else (-1)**s * 2**(E - bias) * (1 + M / 2**m),
    but for the special codes of the NaN convention:

    - "ieee": the all-ones exponent holds +-inf (M == 0, when `inf`) and NaNs (every other
      M; every M without `inf`);
    - "fn": only the all-ones magnitude of each sign is NaN (e4m3fn); no inf;
    - "fnuz": the negative-zero code is the one NaN and there is no -0 (negative_zero must
      be False); with `inf`, the all-ones magnitudes are +-inf (IEEE P3109's binaryKpP);
    - "none": no NaN and no inf (float4e2m1, float6).

    `bias` defaults to 2**(e-1) - 1, and to 2**(e-1) for "fnuz". Every value must be a
    float32 value: bias 0..127 and the largest finite value below 2**128."""
    e = _int_argument(exponent_bits, "exponent_bits", *EXPONENT_BITS)
    # No mantissa bit: every significand is 1, so ties-to-even and to-odd (IEEE 754's "even
    # least significant digit") name no neighbour; not expressible (docs/semantics.md).
    m = _int_argument(mantissa_bits, "mantissa_bits", 1, MAX_WIDTH - 1 - e)
    if not isinstance(nan, str) or nan not in NAN_CONVENTIONS:
        raise ValueError(f"nan={nan!r}; allowed {', '.join(map(repr, NAN_CONVENTIONS))}")
    inf = _flag_argument(inf, "inf")
    negative_zero = _flag_argument(negative_zero, "negative_zero")
    if bias is None:
        bias = _default_bias(e, nan)
        if not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
            # (e = 8 with "fnuz": its top exponent holds finite values, beyond float32 at
            # every bias the range allows)
            raise ValueError(f"exponent_bits={e} with nan={nan!r}: the largest value is beyond float32 at "
                             f"every bias in {BIAS_RANGE[0]}..{BIAS_RANGE[1]} (the convention's default "
                             f"bias is {bias}); fewer exponent bits, or another NaN convention, fit")
    else:
        bias = _int_argument(bias, "bias", *BIAS_RANGE)
    if inf and nan not in ("ieee", "fnuz"):
        raise ValueError(f"inf=True with nan={nan!r}: only 'ieee' (the all-ones exponent) and "
                         "'fnuz' (the all-ones magnitudes, P3109) have codes for inf")
    if (nan == "fnuz") == negative_zero:
        raise ValueError(
            f"negative_zero={negative_zero} with nan={nan!r}: 'fnuz' puts NaN at the negative-zero "
            "code, so it needs negative_zero=False, and only 'fnuz' has no -0")
    key = (e, m, bias, inf, nan, negative_zero)
    if key in _ONNX_MINIFLOATS:
        return ELEMENT_TYPES[_ONNX_MINIFLOATS[key]]
    fmt = MinifloatFormat(*key)
    if fmt.max_code >> m == 0:
        raise ValueError(f"exponent_bits={e}, nan={nan!r}, inf={inf} leave no normal finite value")
    top = fmt.max_finite
    if top >= 2 ** 128:
        least = bias + top.numerator.bit_length() - top.denominator.bit_length() - 127
        if least > BIAS_RANGE[1]:
            raise ValueError(f"exponent_bits={e} with nan={nan!r}, inf={inf}: the largest value is beyond "
                             f"float32 at every bias in {BIAS_RANGE[0]}..{BIAS_RANGE[1]} (it needs bias >= "
                             f"{least}); fewer exponent bits, or another NaN convention, fit")
        raise ValueError(f"bias={bias}: the largest value {float(top)!r} is beyond float32; "
                         f"allowed bias {least}..{BIAS_RANGE[1]}")
    width = 1 + e + m
    name = f"float{width}e{e}m{m}b{bias}_{nan}{'_inf' if inf else ''}"
    storage = np.dtype(np.uint8 if width <= 8 else np.uint16)
    family_id = SF_FAMILY | e | (m << 4) | (bias << 8) | (NAN_CONVENTIONS.index(nan) << 16) | (int(inf) << 18)
    return ElementType(name, 0, storage, storage, "small_float", width, small_float_id=family_id)


class MinifloatFormat:
    """The codes of a minifloat as numbers (what docs/semantics.md states): used for
    validation and by `parameters`; the kernels derive the same codes from the id."""

    def __init__(self, e, m, bias, inf, nan, negative_zero):
        self.e, self.m, self.bias, self.inf, self.nan, self.negative_zero = e, m, bias, inf, nan, negative_zero
        all_ones = (1 << (e + m)) - 1
        top_exponent = ((1 << e) - 1) << m
        if nan == "ieee":
            self.max_code = top_exponent - 1
        elif nan == "fn" or (nan == "fnuz" and inf):
            self.max_code = all_ones - 1
        else:
            self.max_code = all_ones

    def value(self, magnitude: int) -> Fraction:
        field, fraction = magnitude >> self.m, magnitude & ((1 << self.m) - 1)
        if field == 0:
            return Fraction(fraction) * Fraction(2) ** (1 - self.bias - self.m)
        return Fraction((1 << self.m) | fraction) * Fraction(2) ** (field - self.bias - self.m)

    @property
    def max_finite(self) -> Fraction:
        return self.value(self.max_code)


def parameters(etype: ElementType) -> dict:
    """The family parameters of an integer or minifloat code type (ONNX or family):
    integer_type's or minifloat_type's keyword arguments."""
    if etype.kind == "integer" and etype.bits <= 16:
        assert etype.lo is not None and etype.hi is not None
        signed = etype.lo < 0
        narrow = etype.lo == -(1 << (etype.bits - 1)) + 1 if signed else etype.hi == (1 << etype.bits) - 2
        return {"bits": etype.bits, "signed": signed, "narrow_range": narrow}
    if etype.kind == "small_float":
        if etype.onnx_id:
            e, m, bias, inf, nan, negative_zero = _PARAMETERS[etype.name]
        else:
            fid = etype.small_float_id
            assert fid is not None
            e, m, bias = fid & 0xF, (fid >> 4) & 0xF, (fid >> 8) & 0xFF
            nan, inf = NAN_CONVENTIONS[(fid >> 16) & 3], bool((fid >> 18) & 1)
            negative_zero = nan != "fnuz"
        return {"exponent_bits": e, "mantissa_bits": m, "bias": bias, "inf": inf, "nan": nan,
                "negative_zero": negative_zero}
    raise TypeError(f"{etype.name} is not an integer (2..16 bits) or minifloat code type")


def max_finite(etype: ElementType) -> Fraction:
    """The largest finite value of a small-float code type (ONNX or family), exactly."""
    if etype.kind != "small_float":
        raise TypeError(f"{etype.name} is not a minifloat code type")
    p = parameters(etype)
    return MinifloatFormat(p["exponent_bits"], p["mantissa_bits"], p["bias"], p["inf"], p["nan"],
                           p["negative_zero"]).max_finite


def is_family(etype: ElementType) -> bool:
    """A codec-family type that is not an ONNX type."""
    return etype.onnx_id == 0 and etype.kind in ("integer", "small_float")


_NAME = re.compile(r"(u?)int(\d+)(_narrow)?|float(\d+)e(\d)m(\d+)b(\d+)_(ieee|fn|fnuz|none)(_inf)?")


def family_type(name: str) -> ElementType | None:
    """A family type by its name ("int5", "uint12", "int8_narrow", "float8e4m3b11_fnuz",
    "float8e4m3b7_ieee_inf"), or None when `name` is not spelled as one."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    u, ibits, narrow, width, e, m, bias, nan, inf = match.groups()
    if ibits is not None:
        return integer_type(int(ibits), signed=not u, narrow_range=bool(narrow))
    etype = minifloat_type(int(e), int(m), int(bias), inf=bool(inf), nan=nan, negative_zero=nan != "fnuz")
    if etype.bits != int(width):
        raise ValueError(f"{name!r}: e{e}m{m} codes are {etype.bits} bits wide, not {width}")
    return etype


def zero_codes_as_values(zero_point: np.ndarray, etype: ElementType, where: str, name: str) -> np.ndarray:
    """A family minifloat's zero-point codes as float32 +-0 (the only zero points a float
    type takes); any other code is a ValueError naming it."""
    codes = np.asarray(zero_point).astype(np.int64)
    sign = 1 << (etype.bits - 1)
    negative_zero = parameters(etype)["negative_zero"]
    good = (codes == 0) | ((codes == sign) if negative_zero else False)
    if not np.all(good):
        bad = int(codes[~good].reshape(-1)[0])
        allowed = f"0 (+0){' or ' + hex(sign) + ' (-0)' if negative_zero else ''}"
        raise ValueError(f"{where}: {name} of type {etype.name} must be a zero code, {allowed}; got {bad:#x}")
    return np.where(codes == sign, np.float32(-0.0), np.float32(0.0)).astype(np.float32)


def check_codes(codes: np.ndarray, etype: ElementType, where: str, name: str) -> None:
    """Stored codes of a family type (or an ONNX small float's, as the golden files store
    them), as its storage dtype holds them: integer values in [lo, hi], minifloat codes
    below 2**width. Anything else is a ValueError naming it."""
    if codes.size == 0:
        return
    if etype.kind == "integer":
        assert etype.lo is not None and etype.hi is not None
        lo, hi = int(codes.min()), int(codes.max())
        if lo < etype.lo or hi > etype.hi:
            bad = lo if lo < etype.lo else hi
            raise ValueError(f"{where}: {name} holds {bad}, outside {etype.name}'s range "
                             f"[{etype.lo}, {etype.hi}]")
    else:
        top = int(codes.max())
        if top >> etype.bits:
            raise ValueError(f"{where}: {name} holds the code {top:#x}, wider than {etype.name}'s "
                             f"{etype.bits} bits")
