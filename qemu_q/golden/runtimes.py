"""Which runtimes can run a golden case at all: the manifest's `runs_on`.

One table per runtime of the case features it has no kernel for, each with the reason
(onnxruntime 1.32, onnx 1.23). Whether a runtime that runs a case gives the same bits is
the other question, answered by `divergences.py`. tests/test_golden.py runs every case of
the default suite through both runtimes: a case this table lets a runtime run must run,
and each row's cases must fail there.
"""

from __future__ import annotations

from .configs import Config
from .divergences import ONNXRUNTIME, REFERENCE

REFERENCE_CANNOT = (
    ("onnx.reference has no DequantizeLinear below version 19",
     lambda c: c.op_type == "DequantizeLinear" and c.version < 19),
)
ONNXRUNTIME_CANNOT = (
    ("onnxruntime 1.32 implements these ops up to opset 25, not 28",
     lambda c: c.version == 28),
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
