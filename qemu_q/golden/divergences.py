"""Peer divergences: the golden cases where onnx.reference (onnx 1.23 with numpy 2 and
ml_dtypes 0.7, which converts its float types for it) or onnxruntime (1.32) give other
bits by design.

One table. Each row: the heading of the docs/divergences.md entry, the implementations
whose bits differ, and a predicate on the configuration. A case lists every row that
matches; its `divergence` is the first. The rows were found by running every case of
the default suite through both (tests/test_golden.py does it on every test run and
fails on a mismatch no row names).
"""

from __future__ import annotations

from .._dtypes import ELEMENT_TYPES, ElementType
from .configs import Config

REFERENCE = "onnx.reference"
ONNXRUNTIME = "onnxruntime"
BOTH = (REFERENCE, ONNXRUNTIME)


def _q(c: Config) -> ElementType:
    return ELEMENT_TYPES[c.qtype]


def _integer(c: Config) -> bool:
    return _q(c).kind == "integer"


def _float8_with_sign(c: Config) -> bool:
    return c.qtype in ("float8e4m3fn", "float8e5m2")


def _signed_integer(c: Config) -> bool:
    return _integer(c) and _q(c).lo < 0  # these cases have a negative zero point


def _is_q(c: Config) -> bool:
    return c.op_type == "QuantizeLinear"


def _is_dq(c: Config) -> bool:
    return c.op_type == "DequantizeLinear"


def _is_dynamic(c: Config) -> bool:
    return c.op_type == "DynamicQuantizeLinear"


def _int_specials(c: Config) -> bool:
    """QuantizeLinear integer cases with NaN, inf or |q| >= 2^31 quotients."""
    return _is_q(c) and _integer(c) and (
        (c.family == "overflow" and c.x_type != "int32") or c.family in ("scales_zero", "nan"))


def _is_cast(c: Config) -> bool:
    return c.op_type in ("Cast", "CastLike")


_FLOAT_VALUED_KINDS = ("value", "float64", "small_float", "scale_only")
_SUB_BYTE_INTEGERS = ("int4", "uint4", "int2", "uint2")
_FNUZ = ("float8e4m3fnuz", "float8e5m2fnuz")
_FLOAT8 = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")


def _cast_from_float(c: Config) -> bool:
    """Cast / CastLike from a float-valued type (float8e8m0 included)."""
    return _is_cast(c) and ELEMENT_TYPES[c.x_type].kind in _FLOAT_VALUED_KINDS


def _cast_nans(c: Config) -> bool:
    """Cast cases whose input holds NaN: the specials, or every code of a float8 type."""
    return _is_cast(c) and (c.family == "specials" or (
        c.family == "codes" and c.x_type in _FLOAT8 + ("float8e8m0",)))


# Cast between float types where a signalling NaN keeps its payload in the peer
# (numpy's half conversions, onnxruntime's bfloat16 shifts): (from, to) pairs.
_REFERENCE_SNAN_PAIRS = {("float16", "float"), ("float16", "double"), ("float", "float16"),
                         ("double", "float16"), ("bfloat16", "float"), ("bfloat16", "float16")}
_ONNXRUNTIME_SNAN_PAIRS = {("bfloat16", "float"), ("bfloat16", "float16")}


def _nan_results(c: Config) -> bool:
    """Float8 cases with NaN quotients: NaN x, or 0/0 and x/NaN from degenerate scales."""
    return c.family == "nan" or c.family == "scales_zero"


# Each row: (heading in docs/divergences.md, implementations whose bits differ, predicate).
DIVERGENCES: tuple[tuple[str, tuple[str, ...], object], ...] = (
    # bfloat16 x goes to int32 through ml_dtypes (0 for NaN, +-inf and beyond int32), the
    # other float types through numpy (INT_MIN): the first row, then the next two.
    ("QL integer: bfloat16 x NaN, +-inf and quotients beyond int32 (onnx.reference)", (REFERENCE,),
     lambda c: _int_specials(c) and c.x_type == "bfloat16"),
    ("QL integer: +inf and quotients beyond int32 (onnx.reference)", (REFERENCE,),
     lambda c: _int_specials(c) and c.x_type != "bfloat16" and not _signed_integer(c)
     and c.family != "nan"),
    ("QL integer: int32 wrap-around when adding the zero point (onnx.reference)", (REFERENCE,),
     lambda c: _int_specials(c) and c.x_type != "bfloat16" and _signed_integer(c)),
    ("QL: int32 x or int32 scale, onnx.reference divides in float64", (REFERENCE,),
     lambda c: _is_q(c) and "int32" in (c.x_type, c.scale_type) and c.family == "near_ties"),
    ("QL-23+: float32 x with a float16 or bfloat16 scale", (REFERENCE,),
     lambda c: _is_q(c) and c.version >= 23 and c.x_type == "float" and not c.precision
     and c.scale_type in ("float16", "bfloat16") and c.family in ("grid", "near_ties", "random")),
    ("QL-23+: float32 x with a float16 or bfloat16 scale", (ONNXRUNTIME,),
     lambda c: _is_q(c) and c.version >= 23 and c.x_type == "float" and not c.precision
     and c.scale_type == "float16" and c.family in ("near_ties", "random")),
    ("QL-23+: precision attribute", BOTH,
     lambda c: _is_q(c) and c.precision in (10, 16) and c.family in ("near_ties", "random")),
    ("QL-19/21: float16 x, onnxruntime divides in float32", (ONNXRUNTIME,),
     lambda c: _is_q(c) and c.version in (19, 21) and c.x_type == "float16"
     and c.family in ("near_ties", "random")),
    ("QL-19/21/23 FNUZ saturate=1: +-inf", BOTH,
     lambda c: _is_q(c) and c.qtype in ("float8e4m3fnuz", "float8e5m2fnuz") and c.version < 24
     and c.saturate != 0 and c.family in ("overflow", "scales_zero")),
    ("QL e5m2: onnxruntime NaN codes 0x7F / 0xFF", (ONNXRUNTIME,),
     lambda c: _is_q(c) and c.qtype == "float8e5m2" and _nan_results(c)),
    ("QL e4m3fn saturate=0: onnxruntime 448 for 480 <= |q| < 496", (ONNXRUNTIME,),
     lambda c: _is_q(c) and c.qtype == "float8e4m3fn" and c.saturate == 0
     and c.family == "grid"),
    ("QL e5m2 saturate=0: onnxruntime NaN for 61440 <= |q| < 65536", (ONNXRUNTIME,),
     lambda c: _is_q(c) and c.qtype == "float8e5m2" and c.saturate == 0
     and c.family == "grid"),
    ("QL float8: -0 quotient plus a +0 zero point", BOTH,
     lambda c: _is_q(c) and _float8_with_sign(c) and c.zero_point
     and c.family in ("zeros", "scales_inf")),
    ("QL float4/float6: NaN", (REFERENCE,),
     lambda c: _is_q(c) and c.qtype in ("float4e2m1", "float6e2m3", "float6e3m2")
     and _nan_results(c)),
    ("DQ: int32 x beyond 2^24", BOTH,
     lambda c: _is_dq(c) and c.qtype == "int32"
     and c.family in ("codes", "near_ties", "random", "scales")),
    ("DQ: float16 / bfloat16 output rounded twice", BOTH,
     lambda c: _is_dq(c) and c.family == "near_ties" and _integer(c)),
    ("DynamicQuantizeLinear: all-zero or empty x", (REFERENCE,),
     lambda c: _is_dynamic(c) and c.family == "zeros"),
    # onnxruntime: only a NaN in some positions, e.g. the last of a full 8-element block.
    ("DynamicQuantizeLinear: NaN in x", BOTH,
     lambda c: _is_dynamic(c) and c.family == "nan"),
    ("Cast float8e8m0: onnx.reference's range rows, round-up and negative inputs",
     (REFERENCE,), lambda c: _is_cast(c) and c.qtype == "float8e8m0"),
    ("Cast float -> integer: out of range, +-inf and NaN", BOTH,
     lambda c: _cast_from_float(c) and _integer(c) and c.qtype not in _SUB_BYTE_INTEGERS),
    ("Cast float -> int4/uint4/int2/uint2: rounding", BOTH,
     lambda c: _cast_from_float(c) and c.qtype in _SUB_BYTE_INTEGERS),
    ("Cast float64 -> a narrower float: the peers round twice, through float32",
     (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.x_type == "double" and (
         c.qtype in ("float16", "bfloat16") + _FLOAT8
         or (c.qtype == "float8e8m0" and c.round_mode == "nearest"))),
    ("Cast integer beyond 2^24 -> bfloat16 / float8e8m0: the peers round through float32",
     (ONNXRUNTIME,), lambda c: _is_cast(c) and c.x_type in ("int32", "int64", "uint32", "uint64")
     and c.qtype in ("bfloat16", "float8e8m0")),
    ("Cast integer beyond 2^24 -> bfloat16 / float8e8m0: the peers round through float32",
     (REFERENCE,), lambda c: _is_cast(c) and c.x_type in ("int32", "int64", "uint32", "uint64")
     and c.qtype == "float8e8m0"),
    ("Cast-19/21/23 FNUZ saturate=1: +-inf", BOTH,
     lambda c: _is_cast(c) and c.qtype in _FNUZ and c.version < 24 and c.saturate != 0
     and (c.family == "specials" or (c.family == "codes" and c.x_type == "float8e5m2"))),
    ("Cast e5m2: onnxruntime NaN codes 0x7F / 0xFF", (ONNXRUNTIME,),
     lambda c: c.qtype == "float8e5m2" and _cast_nans(c)),
    ("Cast e4m3fn saturate=0: onnxruntime 448 for 480 <= |x| < 496", (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.qtype == "float8e4m3fn" and c.saturate == 0
     and c.family == "values"),
    ("Cast e5m2 saturate=0: onnxruntime NaN for 61440 <= |x| < 65536", (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.qtype == "float8e5m2" and c.saturate == 0
     and c.family == "values"),
    ("Cast bfloat16 -NaN into float8 with saturate=0: onnxruntime drops the sign",
     (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.x_type == "bfloat16" and c.qtype in _FLOAT8
     and c.saturate == 0 and c.family == "specials"),
    ("Cast float4e2m1 / float6: NaN with the sign bit (onnx.reference)", (REFERENCE,),
     lambda c: c.qtype in ("float4e2m1", "float6e2m3", "float6e3m2") and _cast_nans(c)),
    ("Cast between float types: signalling NaN payloads", (REFERENCE,),
     lambda c: _is_cast(c) and c.family == "specials"
     and (c.x_type, c.qtype) in _REFERENCE_SNAN_PAIRS),
    ("Cast between float types: signalling NaN payloads", (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.family == "specials"
     and (c.x_type, c.qtype) in _ONNXRUNTIME_SNAN_PAIRS),
    ("Cast float8 -0 and float8e8m0 -> bool: onnxruntime", (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.qtype == "bool" and c.family == "codes"
     and c.x_type in ("float8e4m3fn", "float8e5m2", "float8e8m0")),
    ("Cast float8e5m2 -> float8e5m2: the peers keep codes", (ONNXRUNTIME,),
     lambda c: _is_cast(c) and c.x_type == c.qtype == "float8e5m2"),
    ("Cast float8e5m2 -> float8e5m2: the peers keep codes", (REFERENCE,),
     lambda c: _is_cast(c) and c.x_type == c.qtype == "float8e5m2" and c.saturate == 0),
    ("QLinearMatMul / QLinearConv requantization: float32 and float64 roundings", (REFERENCE,),
     lambda c: c.op_type in ("QLinearMatMul", "QLinearConv") and c.family == "ties"),
    ("QLinearMatMul-21 float8 operands: onnx.reference truncates them to integers",
     (REFERENCE,),
     lambda c: c.op_type == "QLinearMatMul" and _integer(c)
     and (c.x_type.startswith("float8") or (c.w_type or "").startswith("float8"))),
    ("CastLike round_mode: onnxruntime rounds up", (ONNXRUNTIME,),
     lambda c: c.op_type == "CastLike" and c.round_mode in ("down", "nearest")),
)


def divergences_of(config: Config) -> list[tuple[str, tuple[str, ...]]]:
    """(heading, implementations) of every divergence row the configuration matches."""
    return [(heading, who) for heading, who, predicate in DIVERGENCES if predicate(config)]
