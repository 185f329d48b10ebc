"""Peer profiles: named `qemu_q.Datapath`s that reproduce a runtime's documented
divergences (docs/divergences.md, "Peer profiles").

Pass one as `datapath=` to any op, or to the whole golden suite (`qemu-q golden --datapath`
with a file of its fields: `profiles.as_json(profiles.onnxruntime_cpu)`):

    y = qemu_q.qlinear_matmul(*inputs, datapath=qemu_q.profiles.onnxruntime_cpu)

A profile says what the peer does where a Datapath field can say it for every case the
peer runs; the divergences it does not reproduce are its `remainder` (heading of
docs/divergences.md -> reason), kept as data below and checked by tests/test_profiles.py
against the peer on every golden case (a remainder entry that no longer differs fails).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from types import MappingProxyType

from .datapath import Datapath


@dataclass(frozen=True)
class Profile:
    """A peer profile: its datapath; `reproduces`, the docs/divergences.md headings whose
    peer bits the datapath gives (on every golden case of the heading's row where the peer
    runs, and on the entry's own inputs); `remainder`, the headings where the peer still
    differs under the profile, each with why no Datapath field reproduces it."""

    name: str
    peer: str  # as golden.REFERENCE / golden.ONNXRUNTIME name it
    datapath: Datapath
    reproduces: tuple[str, ...]
    remainder: MappingProxyType


def _frozen(mapping: dict) -> MappingProxyType:
    return MappingProxyType(dict(mapping))


# Divergence headings of docs/divergences.md (the golden table's keys).
_REQUANTIZATION = "QLinearMatMul / QLinearConv requantization: float32 and float64 roundings"
_QL_FLOAT16_ORT = "QL-19/21: float16 x, onnxruntime divides in float32"
_DQ_TWICE = "DQ: float16 / bfloat16 output rounded twice"
_U8S8 = ("MatMulInteger / QLinearMatMul u8 x s8: onnxruntime's int16 pair saturation "
         "(AVX2 without VNNI)")
_S8U8_CONV = "ConvInteger s8 x u8: onnxruntime's int16 pair saturation (AVX2 without VNNI)"
# What float8_encoder="onnxruntime" reproduces (onnxruntime's float8.h constructors, its
# Cast's bfloat16 read without saturation and its copy of a same-type Cast).
_ORT_FLOAT8 = (
    "QL-19/21/23 FNUZ saturate=1: +-inf",
    "QL e5m2: onnxruntime NaN codes 0x7F / 0xFF",
    "QL e4m3fn saturate=0: onnxruntime 448 for 480 <= |q| < 496",
    "QL e5m2 saturate=0: onnxruntime NaN for 61440 <= |q| < 65536",
    "Cast-19/21/23 FNUZ saturate=1: +-inf",
    "Cast e5m2: onnxruntime NaN codes 0x7F / 0xFF",
    "Cast e4m3fn saturate=0: onnxruntime 448 for 480 <= |x| < 496",
    "Cast e5m2 saturate=0: onnxruntime NaN for 61440 <= |x| < 65536",
    "Cast bfloat16 -NaN into float8 with saturate=0: onnxruntime drops the sign",
    "Cast float8e5m2 -> float8e5m2: the peers keep codes",
)

_NO_FIELD_ORT_QL = {
    "QL-19/21: float16 x, onnxruntime divides in float32":
        "version-dependent: onnxruntime divides float16 operands in float32 at 19/21 but in "
        "float16 at 23+, where qemu_q's default agrees; scale_precision is one precision for "
        "every version, so 'float32' would break the 23+ cases",
    "QL-23+: float32 x with a float16 or bfloat16 scale":
        "onnxruntime rounds x to float16 before dividing in float16: no Datapath field "
        "rounds the operands to the division precision first",
    "QL-23+: precision attribute":
        "the peers round x and the scale to the precision attribute's type before dividing: "
        "no Datapath field rounds the operands first",
    "QL-19/21/23 FNUZ saturate=1: +-inf":
        "onnx.reference applies Cast-24's rows at every opset: only float8_encoder="
        "'onnxruntime' does too, and it brings onnxruntime's other float8 departures (448 "
        "for e4m3fn's [480, 496), the e5m2 NaN band and codes), where onnx.reference agrees "
        "with the ONNX table",
    "QL float8: -0 quotient plus a +0 zero point":
        "the peers ignore a float8 zero point: no Datapath field drops the zero point",
}
_NO_FIELD_DQ = {
    "DQ: int32 x beyond 2^24":
        "the peers convert int32 codes to float32 before the product: no Datapath field "
        "rounds an operand to an intermediate type",
    "DQ: float16 / bfloat16 output rounded twice":
        "scale_precision='promoted' ('float32' for DequantizeLinear) gives the peer's float32 "
        "product rounded to the output type, but for int32 codes beyond 2^24 with a bfloat16 output, which it "
        "converts to float32 before the product (the int32 entry)",
}

_NO_FIELD_CAST = {
    "Cast float -> int4/uint4/int2/uint2: rounding":
        "the peers truncate toward zero into the sub-byte integers but round to nearest into "
        "the float types: the datapath's rounding is one mode for every Cast target",
    "Cast float -> integer: out of range, +-inf and NaN":
        "the peers' out-of-range, infinite and NaN results are their C/numpy conversion's "
        "(wrap-around, INT_MIN, 0x80...), not a rounding, saturation or NaN rule a Datapath "
        "field says",
    "Cast float64 -> a narrower float: the peers round twice, through float32":
        "onnxruntime converts float64 to float32 before the target type; Cast reads no "
        "precision field (scale_precision is a quotient's or product's precision)",
    "Cast integer beyond 2^24 -> bfloat16 / float8e8m0: the peers round through float32":
        "the peers convert the integer to float32 first: no Datapath field rounds a Cast's "
        "input to an intermediate type",
    "Cast-19/21/23 FNUZ saturate=1: +-inf":
        "onnx.reference applies Cast-24's rows at every version: only float8_encoder="
        "'onnxruntime' does too, and it brings onnxruntime's other float8 departures, where "
        "onnx.reference agrees with the ONNX table",
    "Cast between float types: signalling NaN payloads":
        "the peers keep or drop NaN payload bits as their conversion does; nan='canonical' "
        "writes one NaN, which is neither",
    "Cast float8e5m2 -> float8e5m2: the peers keep codes":
        "the peers skip a same-type cast; no Datapath field skips an op",
}

_NO_FIELD_CAST_ORT = {
    "Cast float8 -0 and float8e8m0 -> bool: onnxruntime":
        "onnxruntime reads -0 as True and 2^-127 as False: a conversion defect, not a "
        "datapath step",
    "CastLike round_mode: onnxruntime rounds up":
        "onnxruntime's CastLike does not pass round_mode on; the datapath's rounding does not "
        "govern float8e8m0 (round_mode does)",
}

_NO_FIELD_CAST_REFERENCE = {
    "Cast float8e8m0: onnx.reference's range rows, round-up and negative inputs":
        "onnx.reference's e8m0 conversion departs from the table row by row; the datapath's "
        "rounding does not govern float8e8m0 (round_mode does)",
}

# What onnx.reference's numpy promotion and ml_dtypes' NaN conversion reproduce
# (scale_precision="promoted", nan="zero_opposite_sign").
_QL_INT32_FLOAT64 = "QL: int32 x or int32 scale, onnx.reference divides in float64"
_QL_HALF_SCALE = "QL-23+: float32 x with a float16 or bfloat16 scale"
_QL_FLOAT4_NAN = "QL float4/float6: NaN"
_CAST_FLOAT4_NAN = "Cast float4e2m1 / float6: NaN with the sign bit (onnx.reference)"

# Where a peer forms a product or quotient in float32 at some versions only.
_FLOAT32_DQ_PRODUCT = ("DequantizeLinear", 1, 28, (("scale_precision", "float32"),))
_FLOAT32_QL_19_21 = ("QuantizeLinear", 19, 21, (("scale_precision", "float32"),))

onnxruntime_cpu = Datapath(requantization="float32", float8_encoder="onnxruntime",
                           by_version=(_FLOAT32_QL_19_21, _FLOAT32_DQ_PRODUCT))
"""onnxruntime 1.32, CPUExecutionProvider, on an x86 CPU with VNNI (VPDPBUSD: u8 x s8
products accumulate in int32, as qemu_q's default): QLinearMatMul / QLinearConv requantize
by `fl32(fl32(acc) * fl32(multiplier))` ("float32"); QuantizeLinear-19/21 divides float16
operands in float32; DequantizeLinear forms its product in float32 and rounds it to a
float16 / bfloat16 output after; QuantizeLinear and Cast encode float8 with the constructors of
its include/onnxruntime/core/common/float8.h ("onnxruntime": Cast-24's rows at every
version, its saturate=0 bands and its e5m2 NaN codes)."""

onnxruntime_cpu_avx2 = dataclasses.replace(onnxruntime_cpu, accumulator="x86-u8s8-pairs")
"""onnxruntime 1.32 on an x86 CPU with AVX2 and without VNNI: `onnxruntime_cpu` with the u8 x
s8 products (MatMulInteger, QLinearMatMul, QLinearConv with a uint8 x; ConvInteger with an
int8 x and a uint8 w) summed in pairs with int16 saturation (VPMADDUBSW)."""

# ml_dtypes' NaN into float4/float6, where onnx.reference converts with it: QuantizeLinear's
# and Cast's `astype` (nvfp4_quantize, whose recipes write their own NaN code, refuses it).
_ML_DTYPES_NAN = tuple((op, 1, 28, (("nan", "zero_opposite_sign"),))
                       for op in ("QuantizeLinear", "Cast", "CastLike"))

onnx_reference = Datapath(scale_precision="promoted", requantization="float64",
                          by_version=_ML_DTYPES_NAN)
"""onnx.reference (`ReferenceEvaluator`, onnx 1.23, numpy 2, ml_dtypes 0.7): QuantizeLinear
divides in numpy's promotion of x's and the scale's types ("promoted": float64 with an
int32 operand, float32 for float32 x with a float16 / bfloat16 scale) and rounds that
quotient once into an integer or a small float; DequantizeLinear
forms its product in float32 (the codes as float32: "promoted" is "float32" there) and
rounds it to a float16 / bfloat16 output after; QuantizeLinear's and Cast's NaN into
float4 / float6 is ml_dtypes' zero of the opposite sign (nan="zero_opposite_sign" for
those ops, by_version); QLinearMatMul / QLinearConv requantize
in float64 and add the zero point before rounding ("float64", whose multiplier is formed
in the scales' type, as "promoted" says)."""

_NO_DATAPATH_DYNAMIC = (
    "DynamicQuantizeLinear takes no datapath= (issue 15 gives it none): its cases are the "
    "ONNX default under every profile")

_ORT_REMAINDER = {
    **{h: r for h, r in _NO_FIELD_ORT_QL.items() if h != _QL_FLOAT16_ORT and h not in _ORT_FLOAT8},
    "DQ: int32 x beyond 2^24": _NO_FIELD_DQ["DQ: int32 x beyond 2^24"],
    **{h: r for h, r in _NO_FIELD_CAST.items() if h not in _ORT_FLOAT8},
    **_NO_FIELD_CAST_ORT,
    "DynamicQuantizeLinear: NaN in x": _NO_DATAPATH_DYNAMIC,
}

_REFERENCE_REMAINDER = {
    "QL integer: bfloat16 x NaN, +-inf and quotients beyond int32 (onnx.reference)":
        "ml_dtypes converts a bfloat16 NaN, +-inf or quotient beyond int32 to the int32 0, "
        "to which the zero point is then added, where numpy's float32 conversion gives "
        "INT_MIN: one nan_to_integer rule cannot be both, and inf is no NaN",
    "QL integer: +inf and quotients beyond int32 (onnx.reference)":
        "numpy's float -> int32 cast makes +inf and quotients >= 2^31 INT_MIN before the "
        "clip: an artefact of the conversion, not a NaN or rounding rule (nan_to_integer "
        "concerns NaN only)",
    "QL integer: int32 wrap-around when adding the zero point (onnx.reference)":
        "the zero point is added to an int32 intermediate with wrap-around: no Datapath "
        "field says it",
    "QL-23+: precision attribute": _NO_FIELD_ORT_QL["QL-23+: precision attribute"],
    "QL-19/21/23 FNUZ saturate=1: +-inf": _NO_FIELD_ORT_QL["QL-19/21/23 FNUZ saturate=1: +-inf"],
    "QL float8: -0 quotient plus a +0 zero point":
        _NO_FIELD_ORT_QL["QL float8: -0 quotient plus a +0 zero point"],
    **_NO_FIELD_DQ,
    # (ml_dtypes 0.7 rounds float64 into bfloat16 and the small floats once: that entry is
    # onnxruntime's alone now)
    **{h: r for h, r in _NO_FIELD_CAST.items()
       if h not in ("Cast bfloat16 -NaN into float8 with saturate=0: onnxruntime drops the sign",
                    "Cast float64 -> a narrower float: the peers round twice, through float32")},
    **{h: r for h, r in _NO_FIELD_CAST_REFERENCE.items() if h != _CAST_FLOAT4_NAN},
    "DynamicQuantizeLinear: all-zero or empty x": _NO_DATAPATH_DYNAMIC,
    "DynamicQuantizeLinear: NaN in x": _NO_DATAPATH_DYNAMIC,
    "QLinearMatMul-21 float8 operands: onnx.reference truncates them to integers":
        "onnx.reference converts float8 operands with astype(int32): no Datapath field "
        "truncates the operands",
}

PROFILES = {
    "onnxruntime_cpu": Profile(
        name="onnxruntime_cpu", peer="onnxruntime", datapath=onnxruntime_cpu,
        reproduces=(_REQUANTIZATION, _QL_FLOAT16_ORT, _DQ_TWICE, *_ORT_FLOAT8),
        remainder=_frozen(_ORT_REMAINDER)),
    "onnxruntime_cpu_avx2": Profile(
        name="onnxruntime_cpu_avx2", peer="onnxruntime", datapath=onnxruntime_cpu_avx2,
        reproduces=(_REQUANTIZATION, _QL_FLOAT16_ORT, _DQ_TWICE, *_ORT_FLOAT8, _U8S8, _S8U8_CONV),
        remainder=_frozen(_ORT_REMAINDER)),
    "onnx_reference": Profile(
        name="onnx_reference", peer="onnx.reference", datapath=onnx_reference,
        reproduces=(_REQUANTIZATION, _QL_INT32_FLOAT64, _QL_HALF_SCALE, _QL_FLOAT4_NAN,
                    _CAST_FLOAT4_NAN),
        remainder=_frozen(_REFERENCE_REMAINDER)),
}


def onnxruntime_cpu_for(cpu_flags) -> Datapath:
    """The onnxruntime profile of a CPU with these /proc/cpuinfo flags (an iterable of flag
    names, or the flags line itself, names separated by whitespace): VNNI (avx_vnni,
    avx512_vnni) accumulates exactly, AVX2 without it in saturating pairs."""
    if isinstance(cpu_flags, str):
        cpu_flags = cpu_flags.split()
    try:
        flags = set(cpu_flags)
    except TypeError:
        raise TypeError(f"cpu_flags must be an iterable of flag names or a flags line, got "
                        f"{type(cpu_flags).__name__} {cpu_flags!r}") from None
    if not all(isinstance(flag, str) for flag in flags):
        raise TypeError(f"cpu_flags must hold flag names (str), got {sorted(map(repr, flags))}")
    if flags & {"avx_vnni", "avx512_vnni", "avx512vnni"} or "avx2" not in flags:
        return onnxruntime_cpu
    return onnxruntime_cpu_avx2


def as_json(datapath: Datapath) -> str:
    """The datapath (a Datapath, or a Profile's) as the JSON object `qemu-q golden
    --datapath FILE.json` reads."""
    if isinstance(datapath, Profile):
        datapath = datapath.datapath
    if not isinstance(datapath, Datapath):
        raise TypeError(f"datapath must be a qemu_q.Datapath or a qemu_q.profiles.Profile, got "
                        f"{type(datapath).__name__} {datapath!r}")
    return json.dumps(dataclasses.asdict(datapath), indent=1) + "\n"


__all__ = ["PROFILES", "Profile", "as_json", "onnx_reference", "onnxruntime_cpu",
           "onnxruntime_cpu_avx2", "onnxruntime_cpu_for"]
