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
    # The op functions that do not take this datapath yet (op type -> the branch that
    # adds it): cases of these ops cannot be computed under the profile until that merge.
    pending: MappingProxyType


def _frozen(mapping: dict) -> MappingProxyType:
    return MappingProxyType(dict(mapping))


# Divergence headings of docs/divergences.md (the golden table's keys).
_REQUANTIZATION = "QLinearMatMul / QLinearConv requantization: float32 and float64 roundings"
_U8S8 = ("MatMulInteger / QLinearMatMul u8 x s8: onnxruntime's int16 pair saturation "
         "(AVX2 without VNNI)")

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
        "the peers apply Cast-24's rows at every opset: the Cast table of a version is no "
        "Datapath field",
    "QL e5m2: onnxruntime NaN codes 0x7F / 0xFF":
        "onnxruntime writes the all-ones mantissa with the sign of the NaN; nan='canonical' "
        "is 0x7F for both signs and also changes e4m3fn's -NaN, where onnxruntime agrees",
    "QL e4m3fn saturate=0: onnxruntime 448 for 480 <= |q| < 496":
        "a defect of onnxruntime's conversion, not a rounding or overflow rule: no Datapath "
        "field says it (it would need a kernel change in pyx/_quantize.pyx)",
    "QL e5m2 saturate=0: onnxruntime NaN for 61440 <= |q| < 65536":
        "a defect of onnxruntime's conversion (NaN where the rounding overflows below 65536): "
        "no Datapath field says it",
    "QL float8: -0 quotient plus a +0 zero point":
        "the peers ignore a float8 zero point: no Datapath field drops the zero point",
}
_NO_FIELD_DQ = {
    "DQ: int32 x beyond 2^24":
        "the peers convert int32 codes to float32 before the product; DequantizeLinear reads "
        "no Datapath field for its product yet",
    "DQ: float16 / bfloat16 output rounded twice":
        "the peers round the product to float32 and then to the output type; DequantizeLinear "
        "reads no Datapath field for its product yet",
}

onnxruntime_cpu = Datapath(requantization="float32")
"""onnxruntime 1.32, CPUExecutionProvider, on an x86 CPU with VNNI (VPDPBUSD: u8 x s8
products accumulate in int32, as qemu_q's default): QLinearMatMul / QLinearConv requantize
by `fl32(fl32(acc) * fl32(multiplier))` ("float32")."""

onnxruntime_cpu_avx2 = dataclasses.replace(onnxruntime_cpu, accumulator="x86-u8s8-pairs")
"""onnxruntime 1.32 on an x86 CPU with AVX2 and without VNNI: `onnxruntime_cpu` with the u8 x
s8 products summed in pairs with int16 saturation (VPMADDUBSW)."""

onnx_reference = Datapath(requantization="float64")
"""onnx.reference (`ReferenceEvaluator`, onnx 1.23): QLinearMatMul / QLinearConv requantize
in float64 and add the zero point before rounding ("float64")."""

_NO_DATAPATH_DYNAMIC = (
    "DynamicQuantizeLinear takes no datapath= (issue 15 gives it none): its cases are the "
    "ONNX default under every profile")

_ORT_REMAINDER = {
    **_NO_FIELD_ORT_QL,
    **_NO_FIELD_DQ,
    "DynamicQuantizeLinear: NaN in x": _NO_DATAPATH_DYNAMIC,
}

_REFERENCE_REMAINDER = {
    "QL integer: +inf and quotients beyond int32 (onnx.reference)":
        "numpy's float -> int32 cast makes +inf and quotients >= 2^31 INT_MIN before the "
        "clip: an artefact of the conversion, not a NaN or rounding rule (nan_to_integer "
        "concerns NaN only)",
    "QL integer: int32 wrap-around when adding the zero point (onnx.reference)":
        "the zero point is added to an int32 intermediate with wrap-around: no Datapath "
        "field says it",
    "QL: int32 x or int32 scale, onnx.reference divides in float64":
        "numpy's promotion divides in float64 only when x or the scale is int32; "
        "scale_precision='float64' would also change every float32 case, where "
        "onnx.reference divides in float32",
    "QL-23+: float32 x with a float16 or bfloat16 scale":
        "numpy's promotion divides float32 by float16 in float32 but float16 by float16 in "
        "float16: scale_precision is one precision for every operand type",
    "QL-23+: precision attribute": _NO_FIELD_ORT_QL["QL-23+: precision attribute"],
    "QL-19/21/23 FNUZ saturate=1: +-inf": _NO_FIELD_ORT_QL["QL-19/21/23 FNUZ saturate=1: +-inf"],
    "QL float8: -0 quotient plus a +0 zero point":
        _NO_FIELD_ORT_QL["QL float8: -0 quotient plus a +0 zero point"],
    "QL float4/float6: NaN":
        "ml_dtypes maps NaN to a zero of the opposite sign in formats without NaN; the nan "
        "field chooses NaN codes of formats that have them",
    **_NO_FIELD_DQ,
    "DynamicQuantizeLinear: all-zero or empty x": _NO_DATAPATH_DYNAMIC,
    "DynamicQuantizeLinear: NaN in x": _NO_DATAPATH_DYNAMIC,
    "QLinearMatMul-21 float8 operands: onnx.reference truncates them to integers":
        "onnx.reference converts float8 operands with astype(int32): no Datapath field "
        "truncates the operands",
}

_PENDING = {
    "Cast": "dqcast", "CastLike": "dqcast",  # cast / cast_like take no datapath= yet
    "MX": "mxint", "NVFP4": "mxint",  # mx_quantize / nvfp4_quantize take no datapath= yet
}

PROFILES = {
    "onnxruntime_cpu": Profile(
        name="onnxruntime_cpu", peer="onnxruntime", datapath=onnxruntime_cpu,
        reproduces=(_REQUANTIZATION,), remainder=_frozen(_ORT_REMAINDER),
        pending=_frozen(_PENDING)),
    "onnxruntime_cpu_avx2": Profile(
        name="onnxruntime_cpu_avx2", peer="onnxruntime", datapath=onnxruntime_cpu_avx2,
        reproduces=(_REQUANTIZATION, _U8S8), remainder=_frozen(_ORT_REMAINDER),
        pending=_frozen(_PENDING)),
    "onnx_reference": Profile(
        name="onnx_reference", peer="onnx.reference", datapath=onnx_reference,
        reproduces=(_REQUANTIZATION,), remainder=_frozen(_REFERENCE_REMAINDER),
        pending=_frozen(_PENDING)),
}


def onnxruntime_cpu_for(cpu_flags) -> Datapath:
    """The onnxruntime profile of a CPU with these /proc/cpuinfo flags: VNNI (avx_vnni,
    avx512_vnni) accumulates exactly, AVX2 without it in saturating pairs."""
    flags = set(cpu_flags)
    if flags & {"avx_vnni", "avx512_vnni", "avx512vnni"} or "avx2" not in flags:
        return onnxruntime_cpu
    return onnxruntime_cpu_avx2


def as_json(datapath: Datapath) -> str:
    """The datapath as the JSON object `qemu-q golden --datapath FILE.json` reads."""
    return json.dumps(dataclasses.asdict(datapath), indent=1) + "\n"


__all__ = ["PROFILES", "Profile", "as_json", "onnx_reference", "onnxruntime_cpu",
           "onnxruntime_cpu_avx2", "onnxruntime_cpu_for"]
