"""qemu_q.Datapath: how an accelerator's quantizer departs from the ONNX formula.

An immutable, hashable description validated once when it is built; the op families read
its fields into their cached plans (qemu_q/ops/quantize_linear.py), and the kernels run the
non-default ones on their general scalar path. The default, `Datapath()`, is the ONNX
semantics: every option at its default changes no bit. docs/semantics.md, "Datapath
options", defines each option exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

ROUNDINGS = ("half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up",
             "to_odd", "stochastic")
SCALES = ("divide", "reciprocal")
SCALE_PRECISIONS = (None, "float32", "float64")
NANS = ("spec", "canonical")
NANS_TO_INTEGER = ("min", "zero", "max")
SUBNORMALS = ("keep", "flush_inputs", "flush_outputs", "flush_both")
# The accumulator of the integer ops; QuantizeLinear and DequantizeLinear accumulate
# nothing, so they accept the ONNX int32 only.
ACCUMULATORS = ("int32",)

# Kernel codes (pyx/_codecs.pxd, DatapathRounding and friends): the index in the tuples above.
ROUND_CODES = {name: code for code, name in enumerate(ROUNDINGS)}


def _check(name: str, value, allowed: tuple) -> None:
    if isinstance(value, bool) or not (value is None or isinstance(value, str)) or value not in allowed:
        raise ValueError(f"Datapath: {name}={value!r}; allowed {', '.join(map(repr, allowed))}")


@dataclass(frozen=True)
class Datapath:
    """An accelerator's quantization datapath (docs/semantics.md, "Datapath options").

    rounding: of the quotient to an integer or to a small float's mantissa: "half_even"
        (ONNX), "half_away", "half_up", "half_down", "toward_zero", "down", "up", "to_odd",
        or "stochastic" (the call then takes `random_bits=`).
    scale: "divide" (x / scale, ONNX) or "reciprocal" (x * (1 / scale)).
    scale_precision: None (the ONNX division precision of the op version), "float32" or
        "float64": the precision of the division, or of the reciprocal and the product.
        "reciprocal" needs one.
    nan: small-float NaN codes, "spec" (the Cast table) or "canonical" (0x7F for e4m3fn
        and e5m2).
    nan_to_integer: what a NaN quotient rounds to for integer outputs: "min" (-inf: the
        type's minimum, ONNX qemu_q's rule), "zero" (0, then the zero point is added),
        "max" (+inf: the type's maximum).
    subnormals: "keep", "flush_inputs" (x and the scale), "flush_outputs" (small-float
        results), "flush_both".
    accumulator: "int32" (the only accumulator of QuantizeLinear/DequantizeLinear).
    """

    rounding: str = "half_even"
    scale: str = "divide"
    scale_precision: str | None = None
    nan: str = "spec"
    nan_to_integer: str = "min"
    subnormals: str = "keep"
    accumulator: str = "int32"

    def __post_init__(self):
        _check("rounding", self.rounding, ROUNDINGS)
        _check("scale", self.scale, SCALES)
        _check("scale_precision", self.scale_precision, SCALE_PRECISIONS)
        _check("nan", self.nan, NANS)
        _check("nan_to_integer", self.nan_to_integer, NANS_TO_INTEGER)
        _check("subnormals", self.subnormals, SUBNORMALS)
        _check("accumulator", self.accumulator, ACCUMULATORS)
        if self.scale == "reciprocal" and self.scale_precision is None:
            raise ValueError(
                "Datapath: scale='reciprocal' needs an explicit scale_precision ('float32' or "
                "'float64'): the precision of the reciprocal and of the product")

    @property
    def is_onnx(self) -> bool:
        """True when every option is the ONNX default (the kernels' usual paths run)."""
        return self == ONNX

    @property
    def flush_inputs(self) -> bool:
        return self.subnormals in ("flush_inputs", "flush_both")

    @property
    def flush_outputs(self) -> bool:
        return self.subnormals in ("flush_outputs", "flush_both")


ONNX = Datapath()


def as_datapath(datapath, where: str = "datapath") -> Datapath:
    """None or a Datapath; anything else is a TypeError naming it."""
    if datapath is None:
        return ONNX
    if not isinstance(datapath, Datapath):
        raise TypeError(f"{where}={datapath!r}; expected a qemu_q.Datapath or None")
    return datapath
