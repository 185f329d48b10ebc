"""qemu_q.Datapath: how an accelerator's quantizer departs from the ONNX formula.

An immutable, hashable description validated once when it is built; the op families read
its fields into their cached plans (qemu_q/ops/quantize_linear.py), and the kernels run the
non-default ones on their general scalar path. The default, `Datapath()`, is the ONNX
semantics: every option at its default changes no bit. docs/semantics.md, "Datapath
options", defines each option exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields as _dataclass_fields, replace

import numpy as np

from ._coerce import plain_array
from ._opspec import OP_VERSIONS, get_spec

ROUNDINGS = ("half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up",
             "to_odd", "stochastic")
SCALES = ("divide", "reciprocal")
# "promoted": numpy's type promotion of the operands' types, resolved by each op's plan
# into one of the precisions above (docs/semantics.md, "Datapath options").
SCALE_PRECISIONS = (None, "float32", "float64", "promoted")
# "zero_opposite_sign": "spec", but a NaN into a format without NaN codes (float4e2m1,
# float6e2m3, float6e3m2, family nan="none") gives the zero of the opposite sign, as
# ml_dtypes' conversions do (docs/semantics.md, "Datapath options").
NANS = ("spec", "canonical", "zero_opposite_sign")
NANS_TO_INTEGER = ("min", "zero", "max")
SUBNORMALS = ("keep", "flush_inputs", "flush_outputs", "flush_both")
# How a float quotient or Cast input becomes a float8 code (the four ONNX float8 types):
# "exact", the ONNX rounding and the Cast table of the op's version; "onnxruntime", the
# constructors of onnxruntime's include/onnxruntime/core/common/float8.h (pyx/_codecs.pxd,
# encode_float8_onnxruntime; docs/semantics.md, "Datapath options").
FLOAT8_ENCODERS = ("exact", "onnxruntime")
FLOAT8_TYPES = ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")
# QLinearMatMul / QLinearConv: the requantization rule (their `requantization=` values);
# None leaves it to that argument.
REQUANTIZATIONS = (None, "exact", "float32", "float64")
# The accumulator of the integer ops: every value their `accumulator=` takes
# (qemu_q/ops/_datapath.py, parse_accumulator: "int32", "x86-u8s8-pairs", "int<N>",
# "int<N>-saturate"). QuantizeLinear and DequantizeLinear accumulate nothing and ignore it.

# Kernel codes (pyx/_codecs.pxd, DatapathRounding and friends): the index in the tuples above.
ROUND_CODES = {name: code for code, name in enumerate(ROUNDINGS)}


# The ops a by_version entry may name: those that take datapath= and have versions.
VERSIONED_OPS = ("QuantizeLinear", "DequantizeLinear", "Cast", "CastLike", "MatMulInteger",
                 "ConvInteger", "QLinearMatMul", "QLinearConv")


def _freeze_by_version(entries) -> tuple:
    allowed = ("a sequence of (op_type, first_version, last_version, {field: value}) entries, "
               f"op_type one of {', '.join(VERSIONED_OPS)}")
    if isinstance(entries, (str, bytes, dict)) or not isinstance(entries, (tuple, list)):
        raise ValueError(f"Datapath: by_version={entries!r}; allowed {allowed}")
    frozen = []
    for entry in entries:
        if isinstance(entry, (str, bytes, dict)) or not isinstance(entry, (tuple, list)) or len(entry) != 4:
            raise ValueError(f"Datapath: by_version entry {entry!r}; allowed {allowed}")
        op_type, first, last, overrides = entry
        if not isinstance(op_type, str) or op_type not in VERSIONED_OPS:
            raise ValueError(f"Datapath: by_version op_type={op_type!r}; allowed "
                             f"{', '.join(VERSIONED_OPS)}")
        for name, version in (("first_version", first), ("last_version", last)):
            if isinstance(version, bool) or not isinstance(version, int) or version < 1:
                raise ValueError(f"Datapath: by_version {name}={version!r}; allowed an int >= 1")
        if first > last:
            raise ValueError(f"Datapath: by_version versions {first}..{last}; first_version "
                             "must not exceed last_version")
        if isinstance(overrides, Mapping):
            pairs = tuple(overrides.items())
        elif isinstance(overrides, (tuple, list)) and all(
                isinstance(pair, (tuple, list)) and len(pair) == 2 for pair in overrides):
            pairs = tuple(tuple(pair) for pair in overrides)
        else:
            raise ValueError(f"Datapath: by_version overrides {overrides!r}; allowed a mapping of "
                             "Datapath fields to values, or a sequence of (field, value) pairs")
        names = [f.name for f in _dataclass_fields(Datapath) if f.name != "by_version"]
        seen = set()
        for name, _ in pairs:
            if not isinstance(name, str) or name not in names:
                raise ValueError(f"Datapath: by_version field {name!r}; allowed {', '.join(names)}")
            if name in seen:
                raise ValueError(f"Datapath: by_version entry {entry!r} gives the field {name!r} twice")
            seen.add(name)
        if not any(first <= version <= last for version in OP_VERSIONS[op_type]):
            raise ValueError(f"Datapath: by_version versions {first}..{last} hold no version of {op_type} "
                             f"(its versions: {', '.join(map(str, OP_VERSIONS[op_type]))}): the entry "
                             "would never apply")
        # (sorted: the same fields in another order are the same datapath; the values are
        # checked with the datapath's own fields, Datapath._check_by_version)
        frozen.append((op_type, first, last, tuple(sorted(pairs))))
    return tuple(frozen)


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
        "float64": the precision of the division, or of the reciprocal and the product;
        "promoted": the precision numpy's type promotion gives the operands' types (float16
        with float16: float16; float32 with float16: float32; int32 with a float: float64),
        resolved by each op (docs/semantics.md). "reciprocal" needs "float32" or "float64".
    nan: small-float NaN codes, "spec" (the Cast table), "canonical" (0x7F for e4m3fn
        and e5m2) or "zero_opposite_sign" ("spec", but NaN into a format without NaN
        codes, float4e2m1 and float6, gives the zero of the opposite sign: ml_dtypes').
    nan_to_integer: what a NaN quotient rounds to for integer outputs: "min" (-inf: the
        type's minimum, ONNX qemu_q's rule), "zero" (0, then the zero point is added),
        "max" (+inf: the type's maximum).
    subnormals: "keep", "flush_inputs" (x and the scale), "flush_outputs" (small-float
        results), "flush_both".
    requantization: QLinearMatMul's and QLinearConv's requantization rule, as their
        `requantization=` takes it ("exact", "float32", "float64"); None (default) leaves it
        to that argument. The other ops ignore it.
    by_version: fields that hold for some versions of one op only, as a tuple of entries
        (op_type, first_version, last_version, {field: value, ...}): where the op's resolved
        version (its since-version at the call's opset) lies in [first, last], those fields
        replace the datapath's own (a peer that divides float16 in float32 at
        QuantizeLinear-19/21 only, qemu_q.profiles). Entries apply in order; lists and
        mappings (as JSON gives them) are accepted and frozen. `for_op` resolves them.
        Refused when the Datapath is made: a field given twice in one entry, a range that
        holds no version of its op, and fields that do not hold together (with the
        datapath's own and the other entries') at one of the op's versions.
    accumulator: the integer ops' accumulator, as their `accumulator=` takes it: "int32"
        (ONNX: wrap modulo 2^32), "x86-u8s8-pairs", "int<N>" / "int<N>-saturate" (N 8..32).
        QuantizeLinear and DequantizeLinear accumulate nothing and ignore it.
    float8_encoder: how QuantizeLinear's quotient and Cast's input become a code of the
        four ONNX float8 types: "exact" (the ONNX rounding and the Cast table of the op's
        version) or "onnxruntime" (the float8 constructors of onnxruntime's float8.h:
        Cast-24's rows at every version, 448 for 480 <= |v| < 496 into e4m3fn and NaN for
        61440 <= |v| < 65536 into e5m2 with saturate=0, the e5m2 NaN 0x7F / 0xFF). With
        "onnxruntime" the op requires rounding="half_even", nan="spec" and no flush of
        the outputs for a float8 output; other outputs ignore it.
    """

    rounding: str = "half_even"
    scale: str = "divide"
    scale_precision: str | None = None
    nan: str = "spec"
    nan_to_integer: str = "min"
    subnormals: str = "keep"
    accumulator: str = "int32"
    requantization: str | None = None
    by_version: tuple = ()
    float8_encoder: str = "exact"

    def __post_init__(self):
        _check("rounding", self.rounding, ROUNDINGS)
        _check("scale", self.scale, SCALES)
        _check("scale_precision", self.scale_precision, SCALE_PRECISIONS)
        _check("nan", self.nan, NANS)
        _check("nan_to_integer", self.nan_to_integer, NANS_TO_INTEGER)
        _check("subnormals", self.subnormals, SUBNORMALS)
        _check("requantization", self.requantization, REQUANTIZATIONS)
        _check("float8_encoder", self.float8_encoder, FLOAT8_ENCODERS)
        if self.accumulator != "int32":  # (the default needs no parsing: ONNX is built at import)
            from .ops._datapath import parse_accumulator

            try:
                parse_accumulator(self.accumulator)
            except ValueError as error:
                raise ValueError(f"Datapath: {error}") from None
        if self.scale == "reciprocal" and self.scale_precision not in ("float32", "float64"):
            raise ValueError(
                f"Datapath: scale='reciprocal' with scale_precision={self.scale_precision!r}; "
                "it needs an explicit 'float32' or 'float64': the precision of the reciprocal "
                "and of the product")
        object.__setattr__(self, "by_version", _freeze_by_version(self.by_version))
        self._check_by_version()

    def _check_by_version(self) -> None:
        # Every datapath an op resolves at one of its versions is built here, so that a
        # field's value, and its combination with the datapath's other fields and with
        # overlapping entries, is refused when the Datapath is made, not at a call.
        for op_type in dict.fromkeys(entry[0] for entry in self.by_version):
            for version in OP_VERSIONS[op_type]:
                try:
                    self._at_version(op_type, version)
                except ValueError as error:
                    message = str(error).removeprefix("Datapath: ")
                    raise ValueError(f"Datapath: by_version, as {op_type}-{version} resolves it: "
                                     f"{message}") from None

    def _at_version(self, op_type: str, version: int) -> "Datapath":
        fields = {}
        for entry_op, first, last, overrides in self.by_version:
            if entry_op == op_type and first <= version <= last:
                fields.update(overrides)
        return replace(self, by_version=(), **fields)

    def for_op(self, op_type: str, opset: int | None) -> "Datapath":
        """The datapath `op_type` runs with at `opset`: the matching by_version entries
        applied (docs/semantics.md, "Datapath options"); itself when it has none."""
        if not self.by_version:
            return self
        return self._at_version(op_type, get_spec(op_type, opset).since_version)

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


def as_datapath(datapath, where: str = "datapath", op_type: str | None = None,
                opset: int | None = None) -> Datapath:
    """None or a Datapath; anything else is a TypeError naming it. With `op_type`, the
    datapath that op runs with at `opset` (its by_version entries resolved: for_op)."""
    if datapath is None:
        return ONNX
    if not isinstance(datapath, Datapath):
        raise TypeError(f"{where}={datapath!r}; expected a qemu_q.Datapath or None")
    if op_type is not None:
        return datapath.for_op(op_type, opset)
    return datapath


def promoted_quotient_precision(x_type_name: str, scale_type_name: str) -> str:
    """scale_precision="promoted" for a quotient x / scale: the type numpy's promotion
    gives x's and the scale's types (ml_dtypes 0.7's for bfloat16 and float8e8m0), as the
    precision it divides in: "float64" when either is int32 (int32 with any float, and
    int32 with int32 under true division), the half type when both are float16 or both
    bfloat16, and bfloat16 for bfloat16 x with a float8e8m0 scale (numpy divides in it:
    the float32 quotient rounded once more, which is the correctly rounded one), else
    "float32" (float32 with anything; float16 with bfloat16, and float16 with
    float8e8m0, which numpy divides in float32). ElementType names in."""
    if "int32" in (x_type_name, scale_type_name):
        return "float64"
    if x_type_name == scale_type_name and x_type_name in ("float16", "bfloat16"):
        return x_type_name
    if (x_type_name, scale_type_name) == ("bfloat16", "float8e8m0"):
        return "bfloat16"
    return "float32"


def check_float8_encoder(datapath: Datapath, out_type_name: str, where: str) -> bool:
    """True when `datapath.float8_encoder` governs an output of this type (the four ONNX
    float8 types under "onnxruntime"); then the fields that encoder fixes must be at the
    values it implements, else a ValueError naming the op, the field and its value."""
    if datapath.float8_encoder == "exact" or out_type_name not in FLOAT8_TYPES:
        return False
    for name, allowed, message in (
            ("rounding", ("half_even",), "the constructors round half to even"),
            ("nan", ("spec",), "the constructors write their own NaN codes"),
            ("subnormals", ("keep", "flush_inputs"), "the constructors flush no result")):
        value = getattr(datapath, name)
        if value not in allowed:
            raise ValueError(
                f"{where}: datapath {name}={value!r} with float8_encoder='onnxruntime' into "
                f"{out_type_name} is not implemented ({message}); allowed: "
                + ", ".join(map(repr, allowed)))
    return True


def integer_op_accumulator(datapath, accumulator: str | None, where: str) -> str:
    """The accumulator an integer op runs with: `accumulator=` (None: not given), or the
    datapath's ("int32", ONNX's, where it names none). Both given and different is a
    ValueError: the op's default is None, not "int32", so that an explicit "int32" beside a
    datapath's "int16-saturate" is refused rather than overridden. MatMulInteger and
    ConvInteger have no other step a Datapath describes: they ignore its other fields
    (docs/semantics.md, "which op reads which option")."""
    datapath = as_datapath(datapath)
    if accumulator is None:
        return datapath.accumulator
    if datapath.accumulator != ONNX.accumulator and accumulator != datapath.accumulator:
        raise ValueError(f"{where}: accumulator={accumulator!r} and datapath accumulator="
                         f"{datapath.accumulator!r} disagree; give one")
    return accumulator


# The QLinear ops' own requantization rule where neither `requantization=` nor the datapath
# names one.
QLINEAR_DEFAULT_RULE = "exact"


# The QLinear kernels' multiplier codes (pyx/_integer.pyx, MULT_*): the rule's own
# arithmetic, or the datapath's (scale, scale_precision).
QLINEAR_MULTIPLIERS = {None: 0, ("divide", "float32"): 1, ("reciprocal", "float32"): 2,
                       ("divide", "float64"): 3, ("reciprocal", "float64"): 4}


def qlinear_options(datapath, requantization: str | None, accumulator: str | None, where: str):
    """QLinearMatMul's and QLinearConv's options under a datapath: (requantization rule,
    accumulator, rounding, nan_to_integer, nan, subnormals, multiplier code). The
    datapath's `requantization` and `accumulator` stand in for the arguments (both given
    and different: a ValueError); `rounding` rounds the rule's value to the integer output
    or to the float8 output ("stochastic" with the call's `random_bits=`),
    `nan_to_integer` is the code a NaN value gives, `nan` the float8 output's NaN code,
    `subnormals` flushes subnormal scales (inputs) and float8 results (outputs);
    `scale` and `scale_precision` form the multiplier (docs/semantics.md, "The integer ops
    under a datapath"): the rule's own (code 0) when the precision is None, or equal to
    the "float32" rule's own division; the "float32" rule with a float64 multiplier is a
    ValueError (it multiplies in float32)."""
    datapath = as_datapath(datapath)
    accumulator = integer_op_accumulator(datapath, accumulator, where)
    if requantization is None:
        requantization = QLINEAR_DEFAULT_RULE if datapath.requantization is None else datapath.requantization
    elif datapath.requantization is not None and requantization != datapath.requantization:
        raise ValueError(f"{where}: requantization={requantization!r} and datapath requantization="
                         f"{datapath.requantization!r} disagree; give one")
    precision = datapath.scale_precision
    if precision == "promoted":
        # The three scales share one type TS (the schema), so numpy's promotion of them is
        # TS: the multiplier a_scale * b_scale / y_scale formed in TS is the "float64"
        # rule's own (onnx.reference's); no other rule forms it there.
        if requantization != "float64":
            raise ValueError(
                f"{where}: datapath scale_precision='promoted' with the {requantization!r} "
                "requantization rule is not implemented: numpy's promotion of the scales' one "
                "type forms the multiplier in that type, which only the 'float64' rule does; "
                "allowed with it: requantization='float64'")
        precision = None
    if precision is None or (requantization == "float32" and (datapath.scale, precision) == ("divide", "float32")):
        # ("reciprocal" always has a precision: Datapath checks it)
        multiplier = QLINEAR_MULTIPLIERS[None]  # the rule's own arithmetic, as the rule defines it
    else:
        if requantization == "float32" and precision == "float64":
            raise ValueError(
                f"{where}: datapath scale_precision='float64' with the 'float32' requantization rule: "
                "that rule multiplies a float32 accumulator by a float32 multiplier; allowed with it: "
                "scale_precision None or 'float32'")
        multiplier = QLINEAR_MULTIPLIERS[(datapath.scale, precision)]
    return (requantization, accumulator, datapath.rounding, datapath.nan_to_integer, datapath.nan,
            datapath.subnormals, multiplier)


def check_random_bits(random_bits, datapath: Datapath, shape: tuple, input_name: str = "x"):
    """`random_bits=` checked against the datapath and the input's shape (as
    quantize_linear checks it): a flat, contiguous, aligned uint32 view, or None. The
    caller's array is read, never written."""
    if datapath.rounding != "stochastic":
        if random_bits is not None:
            raise ValueError(
                f"random_bits is given but datapath.rounding={datapath.rounding!r}; only "
                "rounding='stochastic' takes random bits")
        return None
    if random_bits is None:
        raise ValueError(f"datapath.rounding='stochastic' needs random_bits=, a uint32 array of "
                         f"{input_name}'s shape")
    if isinstance(random_bits, np.generic):
        # a numpy scalar, as x may be one: the 0-d array it is
        random_bits = np.asarray(random_bits)
    if not isinstance(random_bits, np.ndarray):
        raise TypeError(f"random_bits must be a numpy uint32 array of {input_name}'s shape, got "
                        f"{type(random_bits).__name__} {random_bits!r}"[:300])
    random_bits = plain_array(random_bits, "random_bits")
    if random_bits.dtype != np.uint32:
        raise TypeError(f"random_bits must be a numpy uint32 array, got {random_bits.dtype}")
    if random_bits.shape != tuple(shape):
        raise ValueError(f"random_bits has shape {random_bits.shape}; {input_name} has shape "
                         f"{tuple(shape)} (one word per element)")
    return np.require(random_bits, requirements=["C", "A"]).reshape(-1)
