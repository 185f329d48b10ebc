"""Peer divergences: the golden cases where onnx.reference or onnxruntime give other bits
by design.

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


def _nan_results(c: Config) -> bool:
    """Float8 cases with NaN quotients: NaN x, or 0/0 and x/NaN from degenerate scales."""
    return c.family == "nan" or c.family == "scales_zero"


# Each row: (heading in docs/divergences.md, implementations whose bits differ, predicate).
DIVERGENCES: tuple[tuple[str, tuple[str, ...], object], ...] = (
    ("QL integer: +inf and quotients beyond int32 (onnx.reference)", (REFERENCE,),
     lambda c: _int_specials(c) and not _signed_integer(c) and c.family != "nan"),
    ("QL integer: int32 wrap-around when adding the zero point (onnx.reference)", (REFERENCE,),
     lambda c: _int_specials(c) and _signed_integer(c)),
    ("QL: int32 x or int32 scale, onnx.reference divides in float64", (REFERENCE,),
     lambda c: _is_q(c) and "int32" in (c.x_type, c.scale_type) and _integer(c)
     and c.family == "near_ties"),
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
)


def divergences_of(config: Config) -> list[tuple[str, tuple[str, ...]]]:
    """(heading, implementations) of every divergence row the configuration matches."""
    return [(heading, who) for heading, who, predicate in DIVERGENCES if predicate(config)]
