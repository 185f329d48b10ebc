"""Which runtimes can run a golden case at all: the manifest's `runs_on`.

One table per runtime of the case features it has no kernel for, each with the reason
(onnxruntime 1.32, onnx 1.23 with ml_dtypes 0.7: under ml_dtypes 0.6 onnx.reference also
raised "Issues with types" for Cast between int4, uint4, int2 and uint2, from float8e8m0
into those, float4e2m1 and float6, into float8 with saturate=0, and between int4 / uint4
and float6e2m3). Whether a runtime that runs a case gives the same bits is
the other question, answered by `divergences.py`. tests/test_golden.py runs every case of
the default suite through both runtimes: a case this table lets a runtime run must run,
and each row's cases must fail there.
"""

from __future__ import annotations

from .configs import Config
from .divergences import ONNXRUNTIME, REFERENCE

_FLOAT4_FLOAT6 = ("float4e2m1", "float6e2m3", "float6e3m2")


def _is_cast(c: Config) -> bool:
    return c.op_type in ("Cast", "CastLike")


# The (a, b, y) type combinations onnxruntime 1.32 has QLinearMatMul / QLinearConv kernels for.
_ONNXRUNTIME_QLINEAR_TYPES = {("int8", "int8", "int8"), ("uint8", "int8", "uint8"),
                              ("uint8", "uint8", "uint8")}


def _is_qlinear(c: Config) -> bool:
    return c.op_type in ("QLinearMatMul", "QLinearConv")


REFERENCE_CANNOT = (
    ("onnx.reference has no DequantizeLinear below version 19",
     lambda c: c.op_type == "DequantizeLinear" and c.version < 19),
    ("onnx.reference's Cast reads `to` as an int; Cast-1's is a string",
     lambda c: c.op_type == "Cast" and c.version == 1),
    ("onnx.reference's CastLike has no round_mode attribute",
     lambda c: c.op_type == "CastLike" and c.round_mode is not None),
    ("onnx.reference's QLinearMatMul has no float8 output (it asks np.iinfo for its range)",
     lambda c: c.op_type == "QLinearMatMul" and c.qtype.startswith("float8")),
    ("onnx.reference cannot broadcast a per-row [M] zero point or scale of a matmul",
     lambda c: c.geometry == "per_row_column"),
    ("onnx.reference's ConvInteger fails on a 1-D convolution with zero points",
     lambda c: c.op_type == "ConvInteger" and c.geometry == "conv1d"),
)
ONNXRUNTIME_CANNOT = (
    ("onnxruntime 1.32 implements these ops up to opset 25, not 28",
     lambda c: c.version == 28 and not _is_cast(c)),
    ("onnxruntime has QLinearMatMul / QLinearConv kernels only for (a, b, y) in (int8, int8, "
     "int8), (uint8, int8, uint8), (uint8, uint8, uint8), with float32 or float16 scales",
     lambda c: _is_qlinear(c) and ((c.x_type, c.w_type, c.qtype) not in _ONNXRUNTIME_QLINEAR_TYPES
                                   or c.scale_type == "bfloat16")),
    ("onnxruntime rejects per-row / per-column zero points and scales of a matmul",
     lambda c: c.geometry == "per_row_column"),
    ("onnxruntime's ConvInteger rejects a per-channel w_zero_point",
     lambda c: c.op_type == "ConvInteger" and c.geometry == "per_channel"),
    ("onnxruntime has no DequantizeLinear of float4e2m1 / float6 codes or with a float8e8m0 "
     "scale (the MX and NVFP4 dequantize graphs; MXINT8's casts its scales first)",
     lambda c: c.op_type == "NVFP4" or (c.op_type == "MX" and c.qtype != "int8")),
    ("onnxruntime has no Cast-1 kernel (its Cast starts at 6)",
     lambda c: c.op_type == "Cast" and c.version == 1),
    ("onnxruntime has no Cast to or from float4e2m1 / float6",
     lambda c: _is_cast(c) and (c.x_type in _FLOAT4_FLOAT6 or c.qtype in _FLOAT4_FLOAT6)),
    ("onnxruntime has no float4e2m1 QuantizeLinear / DequantizeLinear",
     lambda c: c.qtype == "float4e2m1"),
    ("onnxruntime has no QuantizeLinear with a bfloat16 or int32 x",
     lambda c: c.op_type == "QuantizeLinear" and c.x_type in ("bfloat16", "int32")),
    ("onnxruntime has no QuantizeLinear with a bfloat16, int32 or float8e8m0 scale",
     lambda c: c.op_type == "QuantizeLinear"
     and c.scale_type in ("bfloat16", "int32", "float8e8m0")),
    ("onnxruntime's QuantizeLinear rejects precision=16 (bfloat16)",
     lambda c: c.op_type == "QuantizeLinear" and c.precision == 16),
    ("onnxruntime has no DequantizeLinear with a bfloat16 scale or output",
     lambda c: c.op_type == "DequantizeLinear" and "bfloat16" in (c.scale_type, c.y_type)),
    ("onnxruntime has no DequantizeLinear with a float8e8m0 scale",
     lambda c: c.op_type == "DequantizeLinear" and c.scale_type == "float8e8m0"),
)

CANNOT = {REFERENCE: REFERENCE_CANNOT, ONNXRUNTIME: ONNXRUNTIME_CANNOT}
RUNTIMES = tuple(CANNOT)


def cannot_run(runtime: str, config: Config) -> str | None:
    """Why `runtime` cannot run the case, or None when it can."""
    for reason, predicate in CANNOT[runtime]:
        if predicate(config):
            return reason
    return None


def runs_on(config: Config) -> list[str]:
    """The runtimes that can run the case (`RUNTIMES` order)."""
    return [runtime for runtime in RUNTIMES if cannot_run(runtime, config) is None]
