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
# QLinearMatMul / QLinearConv: the requantization rule (their `requantization=` values);
# None leaves it to that argument.
REQUANTIZATIONS = (None, "exact", "float32", "float64")
# The accumulator of the integer ops: every value their `accumulator=` takes
# (qemu_q/ops/_datapath.py, parse_accumulator: "int32", "x86-u8s8-pairs", "int<N>",
# "int<N>-saturate"). QuantizeLinear and DequantizeLinear accumulate nothing and ignore it.

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
    requantization: QLinearMatMul's and QLinearConv's requantization rule, as their
        `requantization=` takes it ("exact", "float32", "float64"); None (default) leaves it
        to that argument. The other ops ignore it.
    accumulator: the integer ops' accumulator, as their `accumulator=` takes it: "int32"
        (ONNX: wrap modulo 2^32), "x86-u8s8-pairs", "int<N>" / "int<N>-saturate" (N 8..32).
        QuantizeLinear and DequantizeLinear accumulate nothing and ignore it.
    """

    rounding: str = "half_even"
    scale: str = "divide"
    scale_precision: str | None = None
    nan: str = "spec"
    nan_to_integer: str = "min"
    subnormals: str = "keep"
    accumulator: str = "int32"
    requantization: str | None = None

    def __post_init__(self):
        _check("rounding", self.rounding, ROUNDINGS)
        _check("scale", self.scale, SCALES)
        _check("scale_precision", self.scale_precision, SCALE_PRECISIONS)
        _check("nan", self.nan, NANS)
        _check("nan_to_integer", self.nan_to_integer, NANS_TO_INTEGER)
        _check("subnormals", self.subnormals, SUBNORMALS)
        _check("requantization", self.requantization, REQUANTIZATIONS)
        if self.accumulator != "int32":  # (the default needs no parsing: ONNX is built at import)
            from .ops._datapath import parse_accumulator

            try:
                parse_accumulator(self.accumulator)
            except ValueError as error:
                raise ValueError(f"Datapath: {error}") from None
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


def integer_op_accumulator(datapath, accumulator: str, where: str) -> str:
    """The accumulator an integer op runs with: `accumulator=`, or the datapath's. The
    integer ops take the datapath's accumulator only (their requantization has its own
    named rules, `requantization=`); another non-default option is a ValueError."""
    datapath = as_datapath(datapath)
    others = {name: getattr(datapath, name) for name in (
        "rounding", "scale", "scale_precision", "nan", "nan_to_integer", "subnormals")
        if getattr(datapath, name) != getattr(ONNX, name)}
    if others:
        name, value = next(iter(others.items()))
        raise ValueError(f"{where}: datapath {name}={value!r} is not implemented for the "
                         "integer ops; they take the datapath's accumulator only (and "
                         "requantization= for the QLinear ops)")
    if datapath.accumulator != ONNX.accumulator:
        if accumulator != ONNX.accumulator and accumulator != datapath.accumulator:
            raise ValueError(f"{where}: accumulator={accumulator!r} and datapath accumulator="
                             f"{datapath.accumulator!r} disagree; give one")
        return datapath.accumulator
    return accumulator
