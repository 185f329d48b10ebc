"""Signatures of every version of the ops qemu_q implements (QuantizeLinear,
DequantizeLinear, DynamicQuantizeLinear, Cast, CastLike).

The table is copied by hand from the ONNX operator schemas (onnx 1.23, opset 28) so that the
core imports without onnx; tests/test_opspec.py checks every field against onnx.defs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import numpy as np

NEWEST_OPSET = 28

GRANULARITIES = ("per_tensor", "per_axis", "blocked")


@dataclass(frozen=True)
class FormalParameter:
    name: str
    type_param: str  # the schema's type string: "T1", or a fixed "tensor(float)"
    optional: bool = False  # inputs only


@dataclass(frozen=True)
class OpSpec:
    op_type: str
    since_version: int
    inputs: tuple[FormalParameter, ...]
    outputs: tuple[FormalParameter, ...]
    attributes: Mapping[str, int | str | None]
    type_constraints: Mapping[str, frozenset[str]]
    granularities: frozenset[str]
    division_precision: str | None
    multiplication_precision: str | None
    output_type_rule: str
    saturate_types: frozenset[str]

    # The mappings are read-only proxies, which cannot be hashed; an (op, version) pair
    # names a spec uniquely.
    def __hash__(self) -> int:
        return hash((self.op_type, self.since_version))

    def _parameter(self, name: str) -> FormalParameter:
        for param in self.inputs + self.outputs:
            if param.name == name:
                return param
        known = ", ".join(p.name for p in self.inputs + self.outputs)
        raise ValueError(
            f"{self.op_type}-{self.since_version} has no input or output named {name!r}; "
            f"it has {known}"
        )

    def input_index(self, name: str) -> int:
        for index, param in enumerate(self.inputs):
            if param.name == name:
                return index
        known = ", ".join(p.name for p in self.inputs)
        raise ValueError(
            f"{self.op_type}-{self.since_version} has no input named {name!r}; "
            f"its inputs are {known}"
        )

    def allowed_types(self, name: str) -> frozenset[str]:
        type_param = self._parameter(name).type_param
        if type_param.startswith("tensor("):
            return frozenset((type_param,))
        return self.type_constraints[type_param]

    def describe(self) -> str:
        def param_line(param: FormalParameter) -> str:
            suffix = " (optional)" if param.optional else ""
            return f"  {param.name}: {param.type_param}{suffix}"

        lines = [f"{self.op_type}, since opset {self.since_version}", "inputs:"]
        lines += [param_line(p) for p in self.inputs]
        lines.append("outputs:")
        lines += [param_line(p) for p in self.outputs]
        lines.append("attributes:" if self.attributes else "attributes: none")
        for name, default in self.attributes.items():
            shown = "no default" if default is None else f"default {default}"
            lines.append(f"  {name} ({shown})")
        lines.append("type constraints:")
        for type_param, allowed in self.type_constraints.items():
            lines.append(f"  {type_param}: {', '.join(sorted(allowed))}")
        ordered = [g for g in GRANULARITIES if g in self.granularities]
        lines.append(f"granularities: {', '.join(ordered)}")
        if self.division_precision is not None:
            lines.append(f"division precision: {self.division_precision}")
        if self.multiplication_precision is not None:
            lines.append(f"multiplication precision: {self.multiplication_precision}")
        lines.append(f"output type: {self.output_type_rule}")
        if self.saturate_types:
            lines.append(f"saturate applies to: {', '.join(sorted(self.saturate_types))}")
        return "\n".join(lines)


FLOAT8_TYPES = frozenset(
    (
        "tensor(float8e4m3fn)",
        "tensor(float8e4m3fnuz)",
        "tensor(float8e5m2)",
        "tensor(float8e5m2fnuz)",
    )
)

FLOAT = "tensor(float)"
_FLOATS = frozenset((FLOAT, "tensor(float16)", "tensor(bfloat16)"))
_E8M0 = frozenset(("tensor(float8e8m0)",))
_INT32 = frozenset(("tensor(int32)",))

# Quantized (narrow) types by the version that added them; QuantizeLinear's output and
# DequantizeLinear's input grow together.
_QUANTIZED_ADDED = {
    10: frozenset(("tensor(int8)", "tensor(uint8)")),
    19: FLOAT8_TYPES,
    21: frozenset(("tensor(int16)", "tensor(uint16)", "tensor(int4)", "tensor(uint4)")),
    23: frozenset(("tensor(float4e2m1)",)),
    25: frozenset(("tensor(int2)", "tensor(uint2)")),
    28: frozenset(("tensor(float6e2m3)", "tensor(float6e3m2)")),
}


def _quantized_types(version: int) -> frozenset[str]:
    added = [types for since, types in _QUANTIZED_ADDED.items() if since <= version]
    return frozenset().union(*added)


def _granularities(version: int) -> frozenset[str]:
    if version < 13:  # no axis attribute yet
        return frozenset(("per_tensor",))
    if version < 21:  # no block_size yet
        return frozenset(("per_tensor", "per_axis"))
    return frozenset(GRANULARITIES)


def _params(*specs: tuple[str, str] | tuple[str, str, bool]) -> tuple[FormalParameter, ...]:
    return tuple(FormalParameter(*spec) for spec in specs)


def _quantize_linear(
    version: int,
    scale_type: str,
    zero_point_type: str,
    attributes: Mapping[str, int | None],
    constraints: dict[str, frozenset[str]],
) -> OpSpec:
    if version < 19:
        division = "float32"
    elif version < 23:
        division = "scale"  # x and y_scale share T1
    else:
        division = "precision_or_scale"
    return OpSpec(
        op_type="QuantizeLinear",
        since_version=version,
        inputs=_params(
            ("x", "T1"), ("y_scale", scale_type), ("y_zero_point", zero_point_type, True)
        ),
        outputs=_params(("y", zero_point_type)),
        attributes=MappingProxyType(attributes),
        type_constraints=MappingProxyType(constraints),
        granularities=_granularities(version),
        division_precision=division,
        multiplication_precision=None,
        output_type_rule=(
            "zero_point_or_uint8" if version < 21 else "output_dtype_or_zero_point_or_uint8"
        ),
        saturate_types=FLOAT8_TYPES if version >= 19 else frozenset(),
    )


def _dequantize_linear(
    version: int,
    x_type: str,
    scale_type: str,
    y_type: str,
    attributes: Mapping[str, int | None],
    constraints: dict[str, frozenset[str]],
) -> OpSpec:
    if version < 19:
        multiplication, output_rule = "float32", "float32"
    elif version < 23:
        multiplication, output_rule = "scale", "scale"
    else:
        multiplication, output_rule = "output_dtype_or_scale", "output_dtype_or_scale"
    return OpSpec(
        op_type="DequantizeLinear",
        since_version=version,
        inputs=_params(("x", x_type), ("x_scale", scale_type), ("x_zero_point", x_type, True)),
        outputs=_params(("y", y_type)),
        attributes=MappingProxyType(attributes),
        type_constraints=MappingProxyType(constraints),
        granularities=_granularities(version),
        division_precision=None,
        multiplication_precision=multiplication,
        output_type_rule=output_rule,
        saturate_types=frozenset(),  # DequantizeLinear has no saturate attribute
    )


_QL_X_10 = frozenset((FLOAT,)) | _INT32
_QL_X_19 = _FLOATS | _INT32  # also the scale's types from 19 on, int32 included
_QL_ATTRS_19 = {"axis": 1, "saturate": 1}
_QL_ATTRS_21 = {**_QL_ATTRS_19, "block_size": 0, "output_dtype": 0}
_QL_ATTRS_23 = {**_QL_ATTRS_21, "precision": 0}

_QUANTIZE_LINEAR = (
    _quantize_linear(10, FLOAT, "T2", {}, {"T1": _QL_X_10, "T2": _quantized_types(10)}),
    _quantize_linear(13, FLOAT, "T2", {"axis": 1}, {"T1": _QL_X_10, "T2": _quantized_types(13)}),
    _quantize_linear(19, "T1", "T2", _QL_ATTRS_19, {"T1": _QL_X_19, "T2": _quantized_types(19)}),
    _quantize_linear(21, "T1", "T2", _QL_ATTRS_21, {"T1": _QL_X_19, "T2": _quantized_types(21)}),
    _quantize_linear(
        23, "T2", "T3", _QL_ATTRS_23,
        {"T1": _QL_X_19, "T2": _QL_X_19, "T3": _quantized_types(23)},
    ),
    _quantize_linear(
        24, "T2", "T3", _QL_ATTRS_23,
        {"T1": _QL_X_19, "T2": _QL_X_19 | _E8M0, "T3": _quantized_types(24)},
    ),
    _quantize_linear(
        25, "T2", "T3", _QL_ATTRS_23,
        {"T1": _QL_X_19, "T2": _QL_X_19 | _E8M0, "T3": _quantized_types(25)},
    ),
    _quantize_linear(
        28, "T2", "T3", _QL_ATTRS_23,
        {"T1": _QL_X_19, "T2": _QL_X_19 | _E8M0, "T3": _quantized_types(28)},
    ),
)


def _dq_codes(version: int) -> frozenset[str]:
    # DequantizeLinear also accepts int32 codes (bias tensors), QuantizeLinear never outputs them.
    return _quantized_types(version) | _INT32


_DQ_ATTRS_21 = {"axis": 1, "block_size": 0}
_DQ_ATTRS_23 = {**_DQ_ATTRS_21, "output_dtype": 0}

_DEQUANTIZE_LINEAR = (
    _dequantize_linear(10, "T", FLOAT, FLOAT, {}, {"T": _dq_codes(10)}),
    _dequantize_linear(13, "T", FLOAT, FLOAT, {"axis": 1}, {"T": _dq_codes(13)}),
    _dequantize_linear(19, "T1", "T2", "T2", {"axis": 1}, {"T1": _dq_codes(19), "T2": _FLOATS}),
    _dequantize_linear(21, "T1", "T2", "T2", _DQ_ATTRS_21, {"T1": _dq_codes(21), "T2": _FLOATS}),
    _dequantize_linear(
        23, "T1", "T2", "T3", _DQ_ATTRS_23,
        {"T1": _dq_codes(23), "T2": _FLOATS, "T3": _FLOATS},
    ),
    _dequantize_linear(
        24, "T1", "T2", "T3", _DQ_ATTRS_23,
        {"T1": _dq_codes(24), "T2": _FLOATS | _E8M0, "T3": _FLOATS},
    ),
    _dequantize_linear(
        25, "T1", "T2", "T3", _DQ_ATTRS_23,
        {"T1": _dq_codes(25), "T2": _FLOATS | _E8M0, "T3": _FLOATS},
    ),
    _dequantize_linear(
        28, "T1", "T2", "T3", _DQ_ATTRS_23,
        {"T1": _dq_codes(28), "T2": _FLOATS | _E8M0, "T3": _FLOATS},
    ),
)

_DYNAMIC_QUANTIZE_LINEAR = (
    OpSpec(
        op_type="DynamicQuantizeLinear",
        since_version=11,
        inputs=_params(("x", "T1")),
        outputs=_params(("y", "T2"), ("y_scale", FLOAT), ("y_zero_point", "T2")),
        attributes=MappingProxyType({}),
        type_constraints=MappingProxyType(
            {"T1": frozenset((FLOAT,)), "T2": frozenset(("tensor(uint8)",))}
        ),
        granularities=frozenset(("per_tensor",)),
        division_precision=None,
        multiplication_precision=None,
        output_type_rule="uint8",
        saturate_types=frozenset(),
    ),
)

# Cast's types by the version that added them (from 13 on every T1 and T2 are the same set).
_CAST_ADDED = {
    1: frozenset(f"tensor({t})" for t in (
        "bool", "double", "float", "float16", "int16", "int32", "int64", "int8", "uint16",
        "uint32", "uint64", "uint8")),
    9: frozenset(("tensor(string)",)),
    13: frozenset(("tensor(bfloat16)",)),
    19: FLOAT8_TYPES,
    21: frozenset(("tensor(int4)", "tensor(uint4)")),
    23: frozenset(("tensor(float4e2m1)",)),
    24: _E8M0,
    25: frozenset(("tensor(int2)", "tensor(uint2)")),
    28: frozenset(("tensor(float6e2m3)", "tensor(float6e3m2)")),
}


def _cast_types(version: int) -> frozenset[str]:
    return frozenset().union(*(types for since, types in _CAST_ADDED.items() if since <= version))


def _cast_attributes(version: int) -> dict[str, int | str | None]:
    attributes: dict[str, int | str | None] = {}
    if version >= 19:
        attributes["saturate"] = 1
    if version >= 24:
        attributes["round_mode"] = "up"
    return attributes


def _cast(version: int) -> OpSpec:
    types = _cast_types(version)
    return OpSpec(
        op_type="Cast",
        since_version=version,
        inputs=_params(("input", "T1")),
        outputs=_params(("output", "T2")),
        attributes=MappingProxyType({**_cast_attributes(version), "to": None}),
        type_constraints=MappingProxyType({"T1": types, "T2": types}),
        granularities=frozenset(("per_tensor",)),  # element by element
        division_precision=None,
        multiplication_precision=None,
        output_type_rule="to",
        saturate_types=(FLOAT8_TYPES | _E8M0) if version >= 19 else frozenset(),
    )


def _cast_like(version: int) -> OpSpec:
    # CastLike-N has Cast-N's types (15 has Cast-13's); there is no CastLike-28.
    types = _cast_types(version)
    return OpSpec(
        op_type="CastLike",
        since_version=version,
        inputs=_params(("input", "T1"), ("target_type", "T2")),
        outputs=_params(("output", "T2")),
        attributes=MappingProxyType(_cast_attributes(version)),
        type_constraints=MappingProxyType({"T1": types, "T2": types}),
        granularities=frozenset(("per_tensor",)),
        division_precision=None,
        multiplication_precision=None,
        output_type_rule="target_type",
        saturate_types=(FLOAT8_TYPES | _E8M0) if version >= 19 else frozenset(),
    )


_CAST = tuple(_cast(v) for v in (1, 6, 9, 13, 19, 21, 23, 24, 25, 28))
_CAST_LIKE = tuple(_cast_like(v) for v in (15, 19, 21, 23, 24, 25))
# The integer datapath (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv). Their zero
# point and scale shapes (per row, per column, per output channel) are op-specific, not the
# axis granularities of Q/DQ: qemu_q/ops/matmul_integer.py and conv_integer.py check them.
_INT8_TYPES = frozenset(("tensor(int8)", "tensor(uint8)"))
_INT8_OR_FLOAT8 = _INT8_TYPES | FLOAT8_TYPES
_CONV_ATTRS = {
    "group": 1, "pads": None, "strides": None, "dilations": None, "kernel_shape": None,
    "auto_pad": "NOTSET",
}


def _integer_op(op_type: str, version: int, inputs, outputs, attributes, constraints,
                output_rule: str) -> OpSpec:
    return OpSpec(
        op_type=op_type,
        since_version=version,
        inputs=_params(*inputs),
        outputs=_params(*outputs),
        attributes=MappingProxyType(attributes),
        type_constraints=MappingProxyType(constraints),
        granularities=frozenset(("per_tensor",)),
        division_precision=None,
        multiplication_precision=None,
        output_type_rule=output_rule,
        saturate_types=frozenset(),
    )


_QLINEAR_MATMUL_INPUTS = (
    ("a", "T1"), ("a_scale", "TS"), ("a_zero_point", "T1"), ("b", "T2"), ("b_scale", "TS"),
    ("b_zero_point", "T2"), ("y_scale", "TS"), ("y_zero_point", "T3"),
)
_INTEGER_DATAPATH = {
    "MatMulInteger": (
        _integer_op(
            "MatMulInteger", 10,
            (("A", "T1"), ("B", "T2"), ("a_zero_point", "T1", True), ("b_zero_point", "T2", True)),
            (("Y", "T3"),), {},
            {"T1": _INT8_TYPES, "T2": _INT8_TYPES, "T3": _INT32}, "int32",
        ),
    ),
    "ConvInteger": (
        _integer_op(
            "ConvInteger", 10,
            (("x", "T1"), ("w", "T2"), ("x_zero_point", "T1", True), ("w_zero_point", "T2", True)),
            (("y", "T3"),), _CONV_ATTRS,
            {"T1": _INT8_TYPES, "T2": _INT8_TYPES, "T3": _INT32}, "int32",
        ),
    ),
    "QLinearMatMul": (
        _integer_op(
            "QLinearMatMul", 10,
            tuple((n, FLOAT if t == "TS" else t) for n, t in _QLINEAR_MATMUL_INPUTS),
            (("y", "T3"),), {},
            {"T1": _INT8_TYPES, "T2": _INT8_TYPES, "T3": _INT8_TYPES}, "zero_point",
        ),
        _integer_op(
            "QLinearMatMul", 21, _QLINEAR_MATMUL_INPUTS, (("y", "T3"),), {},
            {"TS": _FLOATS, "T1": _INT8_OR_FLOAT8, "T2": _INT8_OR_FLOAT8, "T3": _INT8_OR_FLOAT8},
            "zero_point",
        ),
    ),
    "QLinearConv": (
        _integer_op(
            "QLinearConv", 10,
            (("x", "T1"), ("x_scale", FLOAT), ("x_zero_point", "T1"), ("w", "T2"),
             ("w_scale", FLOAT), ("w_zero_point", "T2"), ("y_scale", FLOAT),
             ("y_zero_point", "T3"), ("B", "T4", True)),
            (("y", "T3"),), _CONV_ATTRS,
            {"T1": _INT8_TYPES, "T2": _INT8_TYPES, "T3": _INT8_TYPES, "T4": _INT32}, "zero_point",
        ),
    ),
}

# op_type -> specs in increasing since-version
_SPECS: dict[str, tuple[OpSpec, ...]] = {
    "QuantizeLinear": _QUANTIZE_LINEAR,
    "DequantizeLinear": _DEQUANTIZE_LINEAR,
    "DynamicQuantizeLinear": _DYNAMIC_QUANTIZE_LINEAR,
    "Cast": _CAST,
    "CastLike": _CAST_LIKE,
    **_INTEGER_DATAPATH,
}

# Short names the command line and golden selections accept for each op (any case).
OP_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "QuantizeLinear": ("q", "quantize"),
    "DequantizeLinear": ("dq", "dequantize"),
    "DynamicQuantizeLinear": ("dynamic",),
    "Cast": ("cast",),
    "CastLike": ("castlike", "cast_like"),
    "MatMulInteger": ("matmulinteger",),
    "ConvInteger": ("convinteger",),
    "QLinearMatMul": ("qlinearmatmul",),
    "QLinearConv": ("qlinearconv",),
})

# QuantizeLinear-23+ `precision` attribute: ONNX data-type ints of the division's precision
# (0, the default, means the scale's type).
PRECISION_TYPES: Mapping[int, str] = MappingProxyType({1: "float", 10: "float16", 16: "bfloat16"})

OP_VERSIONS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {op: tuple(spec.since_version for spec in specs) for op, specs in _SPECS.items()}
)


def _specs_for(op_type: object) -> tuple[OpSpec, ...]:
    if not isinstance(op_type, str):
        raise TypeError(f"op_type must be a str, got {type(op_type).__name__}")
    try:
        return _SPECS[op_type]
    except KeyError:
        known = ", ".join(sorted(_SPECS))
        raise ValueError(f"unknown op {op_type!r}; known ops are {known}") from None


def normalize_opset(opset) -> int | None:
    """`opset` as a Python int (None stays None). Every op normalizes it before anything
    is cached, so that 21.0 is refused whatever was called before (21.0 == 21 would hit a
    plan cached for 21)."""
    if opset is None:
        return None
    # bool is an int subclass, but opset=True is surely a mistake
    if isinstance(opset, (bool, np.bool_)) or not isinstance(opset, (int, np.integer)):
        raise TypeError(f"opset must be an int or None, got {type(opset).__name__} {opset!r}")
    return int(opset)


def get_spec(op_type: str, opset: int | None = None) -> OpSpec:
    """The spec that a model importing the default domain at `opset` runs: the newest
    since-version <= opset (None means NEWEST_OPSET)."""
    specs = _specs_for(op_type)
    opset = normalize_opset(opset)
    if opset is None:
        opset = NEWEST_OPSET
    if specs[0].since_version <= opset <= NEWEST_OPSET:
        return _resolved_spec(op_type, opset)
    if opset < 1:
        problem = "is not an opset (they start at 1)"
    elif opset > NEWEST_OPSET:
        problem = f"is newer than the newest opset this table knows ({NEWEST_OPSET})"
    else:
        problem = "is older than all of them"
    versions = ", ".join(str(spec.since_version) for spec in specs)
    raise ValueError(f"{op_type} has versions {versions}; opset {opset} {problem}")


@functools.lru_cache(maxsize=None)
def _resolved_spec(op_type: str, opset: int) -> OpSpec:
    # every op resolves its spec at least once a call: the table is fixed, so once per
    # (op, opset) is enough
    return [spec for spec in _SPECS[op_type] if spec.since_version <= opset][-1]


def first_version_allowing(op_type: str, param_name: str, type_str: str) -> int | None:
    """Smallest since-version whose constraint for input/output `param_name` allows
    `type_str` (an ONNX type string such as "tensor(int4)"); None if no version does."""
    specs = _specs_for(op_type)
    names = {p.name for spec in specs for p in spec.inputs + spec.outputs}
    if param_name not in names:
        raise ValueError(
            f"{op_type} has no input or output named {param_name!r}; "
            f"it has {', '.join(sorted(names))}"
        )
    for spec in specs:
        if type_str in spec.allowed_types(param_name):
            return spec.since_version
    return None


def first_version_with_attribute(op_type: str, attr: str) -> int | None:
    """Smallest since-version that has attribute `attr`; None if no version does."""
    for spec in _specs_for(op_type):
        if attr in spec.attributes:
            return spec.since_version
    return None


def resolve_op_name(name: str) -> str:
    """An op type, or one of its OP_ALIASES, in any case, to the op type."""
    if not isinstance(name, str):
        raise TypeError(f"op name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    for op_type in _SPECS:
        if key == op_type.lower() or key in OP_ALIASES.get(op_type, ()):
            return op_type
    known = ", ".join(f"{op} ({', '.join(OP_ALIASES.get(op, ()))})" for op in _SPECS)
    raise ValueError(f"unknown op {name!r}; known: {known}")


@dataclass(frozen=True)
class CastFloat8Table:
    """The float8 conversion tables of one Cast version, where they differ by version.

    QuantizeLinear's `saturate` refers to these tables; a model at opset N converts by the
    Cast version in force at N (the newest since-version <= N), whatever QuantizeLinear
    version it runs. Every version from 19 to 28 has the saturate=0 rows "-NaN -> -NaN"
    (e4m3fn, e5m2) and "-Inf -> -NaN" (e4m3fn); tests/test_opspec.py reads each field back
    from onnx.defs' table text.
    """
    since_version: int
    # saturate=1, e4m3fnuz and e5m2fnuz: "Inf -> NaN" (True) or "Inf -> FLT_MAX" (False)
    fnuz_inf_to_nan: bool
    # saturate=0, e4m3fn and e5m2: a row "-NaN -> -NaN" (a NaN result keeps its sign)
    negative_nan_row: bool


# Cast versions from 19, the first with float8 (every QuantizeLinear float8 output is there).
CAST_FLOAT8_TABLES: tuple[CastFloat8Table, ...] = (
    CastFloat8Table(19, fnuz_inf_to_nan=True, negative_nan_row=True),
    CastFloat8Table(21, fnuz_inf_to_nan=True, negative_nan_row=True),
    CastFloat8Table(23, fnuz_inf_to_nan=True, negative_nan_row=True),
    CastFloat8Table(24, fnuz_inf_to_nan=False, negative_nan_row=True),
    CastFloat8Table(25, fnuz_inf_to_nan=False, negative_nan_row=True),
    CastFloat8Table(28, fnuz_inf_to_nan=False, negative_nan_row=True),
)


def cast_float8_table(opset: int | None) -> CastFloat8Table:
    """The float8 Cast table in force in a model at `opset` (None: NEWEST_OPSET)."""
    if opset is None:
        opset = NEWEST_OPSET
    tables = [t for t in CAST_FLOAT8_TABLES if t.since_version <= opset]
    if not tables:
        raise ValueError(f"opset {opset} has no float8 Cast table (float8 types start at opset 19)")
    return tables[-1]
