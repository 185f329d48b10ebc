"""Golden-suite configurations: what each case is (op, version, types, attributes,
granularity, input family), without its data, generated from the op-spec table; and the
selection of cases that the command line's options make."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

from .._dtypes import ELEMENT_TYPES, element_type
from .._opspec import (GRANULARITIES, OP_VERSIONS, PRECISION_TYPES, first_version_allowing,
                       get_spec, resolve_op_name)
from .._rules import division_precision, has_granularity, saturate_applies, shares_input_type
from .block_scaled import (BLOCK_SCALED_FAMILIES, BLOCK_SCALED_OPS, block_scaled_configs,
                           block_scaled_versions)

Q_FAMILIES = ("grid", "near_ties", "zeros", "nan", "overflow", "random", "scales",
              "scales_zero", "scales_inf")
DQ_FAMILIES = ("codes", "nan_inf", "near_ties", "random", "scales")
DYNAMIC_FAMILIES = ("random", "positive", "negative", "zeros", "tiny", "nan", "inf", "neg_inf")
CAST_FAMILIES = ("codes", "values", "specials")
INTEGER_FAMILIES = ("random", "zero_points", "overflow", "ties", "saturation")
FAMILIES = tuple(dict.fromkeys(Q_FAMILIES + DQ_FAMILIES + DYNAMIC_FAMILIES + CAST_FAMILIES
                               + INTEGER_FAMILIES + BLOCK_SCALED_FAMILIES))

# Significant bits of the value types, for "is this product exact in float32".
_SIGNIFICANT_BITS = {"float": 24, "float16": 11, "bfloat16": 8, "float8e8m0": 1,
                     "int32": 31}
_SMALL_FLOAT_SIGNIFICANT_BITS = {"float8e4m3fn": 4, "float8e4m3fnuz": 4, "float8e5m2": 3,
                                 "float8e5m2fnuz": 3, "float6e2m3": 4, "float6e3m2": 3,
                                 "float4e2m1": 2}


def _type_names(onnx_types: Iterable[str]) -> list[str]:
    """ONNX type strings to our names, in ELEMENT_TYPES order (a stable order)."""
    names = {t[7:-1] for t in onnx_types}
    return [name for name in ELEMENT_TYPES if name in names]


@dataclass(frozen=True)
class Config:
    op_type: str
    version: int  # the since-version; the case's model imports this opset
    qtype: str  # QuantizeLinear's y, DequantizeLinear's x, uint8 for DynamicQuantizeLinear
    family: str
    variant: str = "base"
    x_type: str = "float"  # QuantizeLinear / DynamicQuantizeLinear x
    scale_type: str = "float"
    y_type: str = "float"  # DequantizeLinear's output
    granularity: str = "per_tensor"
    saturate: int | None = None  # None: attribute absent (default 1)
    precision: int | None = None
    output_dtype: str | None = None  # node attribute output_dtype
    zero_point: bool = True  # whether the zero-point input is given
    full_sweep: bool = False  # DequantizeLinear 16-bit codes: all 65536 rather than a sample
    block_size: int | None = None  # blocked: None for the default (families._block_size)
    round_mode: str | None = None  # Cast / CastLike into float8e8m0: None for absent ("up")
    w_type: str | None = None  # integer ops: the second operand's type (x_type is the first)
    geometry: str | None = None  # integer ops: the shape/attribute layout (integer_families)

    @property
    def name(self) -> str:
        parts = ["test", self.op_type.lower(), str(self.version), self.qtype]
        if self.variant != "base":
            parts.append(self.variant)
        parts.append(self.family)
        return "_".join(parts)

    @property
    def division_precision(self) -> str:
        """QuantizeLinear: the type the quotient is rounded to (docs/semantics.md)."""
        spec = get_spec(self.op_type, self.version)
        return division_precision(spec, ELEMENT_TYPES[self.scale_type], self.precision or 0).name


def _q_configs(version: int) -> Iterator[Config]:
    spec = get_spec("QuantizeLinear", version)
    x_types = _type_names(spec.allowed_types("x"))
    scale_types = _type_names(spec.allowed_types("y_scale"))
    shared = shares_input_type(spec)
    value_families = ("grid", "near_ties", "zeros", "nan", "overflow", "random")
    for qtype in _type_names(spec.allowed_types("y")):
        q = ELEMENT_TYPES[qtype]
        base = dict(op_type="QuantizeLinear", version=version, qtype=qtype)
        for family in value_families:
            yield Config(**base, family=family)
        if saturate_applies(spec, q):
            for family in ("grid", "overflow"):
                yield Config(**base, family=family, variant="sat0", saturate=0)
        for x_type in x_types:
            if x_type == "float":
                continue
            # Matched types also where they may differ: an fp16 model has fp16 scales.
            scale = x_type if x_type in scale_types else "float"
            for family in value_families:
                if x_type == "int32" and family in ("zeros", "nan"):
                    continue  # int32 has neither
                yield Config(**base, family=family, variant=f"x_{x_type}", x_type=x_type,
                             scale_type=scale)
        if not shared:  # the scale has a type of its own (float32 only before 19)
            for scale in scale_types:
                if scale == "float":
                    continue
                families = ("grid", "random") if scale == "float8e8m0" else (
                    "grid", "near_ties", "random")
                for family in families:
                    yield Config(**base, family=family, variant=f"scale_{scale}",
                                 scale_type=scale)
        if "precision" in spec.attributes:
            for precision, pname in PRECISION_TYPES.items():
                for family in ("near_ties", "random"):
                    yield Config(**base, family=family, variant=f"precision_{pname}",
                                 precision=precision)
        if "output_dtype" in spec.attributes:
            yield Config(**base, family="random", variant="output_dtype", output_dtype=qtype,
                         zero_point=False)
        elif qtype == "uint8":
            yield Config(**base, family="random", variant="no_zero_point", zero_point=False)
        if has_granularity(spec, "per_axis"):
            for family in ("random", "scales", "scales_zero", "scales_inf"):
                yield Config(**base, family=family, variant="per_axis", granularity="per_axis")
        if has_granularity(spec, "blocked"):
            yield Config(**base, family="random", variant="blocked", granularity="blocked")
        if "float8e8m0" in scale_types:
            for family in ("scales", "scales_zero"):
                yield Config(**base, family=family, variant="per_axis_scale_float8e8m0",
                             granularity="per_axis", scale_type="float8e8m0")


def _product_may_round(qtype: str, scale_type: str) -> bool:
    """Whether (code - zero_point) * scale can be inexact in float32."""
    q = ELEMENT_TYPES[qtype]
    if q.kind == "integer":
        code_bits = q.bits + (1 if q.name != "int32" else 0)  # the zero point adds a bit
    else:
        code_bits = _SMALL_FLOAT_SIGNIFICANT_BITS[q.name]
    return code_bits + _SIGNIFICANT_BITS[scale_type] > 24


def _dq_configs(version: int) -> Iterator[Config]:
    spec = get_spec("DequantizeLinear", version)
    scale_types = _type_names(spec.allowed_types("x_scale"))
    output_types = _type_names(spec.allowed_types("y"))
    has_output_dtype = "output_dtype" in spec.attributes
    for qtype in _type_names(spec.allowed_types("x")):
        q = ELEMENT_TYPES[qtype]
        first = version == first_version_allowing("DequantizeLinear", "x", f"tensor({qtype})")
        zp = qtype != "int32"  # int32 codes have no zero point
        base = dict(op_type="DequantizeLinear", version=version, qtype=qtype, zero_point=zp)

        def families(scale: str, out: str, code_families=("codes", "random")):
            found = list(code_families)
            if out in ("float16", "bfloat16") and _product_may_round(qtype, scale):
                found.insert(1, "near_ties")
            return found

        yield Config(**base, family="codes", full_sweep=first)
        if q.kind == "small_float" and q.bits == 8:
            yield Config(**base, family="nan_inf")
        yield Config(**base, family="random")
        for scale in scale_types:
            if scale in ("float", "float8e8m0"):
                continue  # e8m0 scales need output_dtype: see below
            out = scale  # 19+: the output has the scale's type (10, 13 have float32 only)
            for family in families(scale, out):
                yield Config(**base, family=family, variant=f"scale_{scale}", scale_type=scale,
                             y_type=out)
        if has_output_dtype:
            for out in output_types:
                for family in families("float", out):
                    yield Config(**base, family=family, variant=f"output_dtype_{out}",
                                 output_dtype=out, y_type=out)
            if "float8e8m0" in scale_types:
                # An e8m0 scale is no output type: a model needs output_dtype (without it,
                # ONNX shape inference rejects the model).
                for out in output_types:
                    for family in families("float8e8m0", out, ("codes",)):
                        yield Config(**base, family=family,
                                     variant=f"scale_float8e8m0_output_dtype_{out}",
                                     scale_type="float8e8m0", output_dtype=out, y_type=out)
        if zp:
            yield Config(**base | {"zero_point": False}, family="random",
                         variant="no_zero_point")
        if has_granularity(spec, "per_axis"):
            yield Config(**base, family="random", variant="per_axis", granularity="per_axis")
            yield Config(**base, family="scales", variant="per_axis", granularity="per_axis")
        if has_granularity(spec, "blocked"):
            yield Config(**base, family="random", variant="blocked", granularity="blocked")
        if "float8e8m0" in scale_types:
            yield Config(**base, family="scales",
                         variant="per_axis_scale_float8e8m0_output_dtype_float",
                         granularity="per_axis", scale_type="float8e8m0",
                         output_dtype="float", y_type="float")


def _cast_families(source: str) -> tuple[str, ...]:
    """Every code of a source of at most 8 bits; chosen values and the special values
    (±0, ±inf, NaNs, the source's extremes) of a wider source."""
    s = ELEMENT_TYPES[source]
    if s.bits <= 8:
        return ("codes",)
    return ("values", "specials") if s.kind in ("value", "float64") else ("values",)


def _cast_configs(op_type: str, version: int) -> Iterator[Config]:
    """Every (from, to) pair the version allows (strings excepted: qemu_q does not
    implement them), plus saturate=0 where it is read and each other round_mode."""
    spec = get_spec(op_type, version)
    sources = _type_names(spec.allowed_types(spec.inputs[0].name))
    targets = _type_names(spec.allowed_types(spec.outputs[0].name))
    has_round_mode = "round_mode" in spec.attributes
    for target in targets:
        t = ELEMENT_TYPES[target]
        saturates = saturate_applies(spec, t)
        round_modes = ("down", "nearest") if has_round_mode and target == "float8e8m0" else ()
        for source in sources:
            base = dict(op_type=op_type, version=version, qtype=target, x_type=source,
                        y_type=target, zero_point=False)
            for family in _cast_families(source):
                yield Config(**base, family=family, variant=f"from_{source}")
                if saturates:
                    yield Config(**base, family=family, variant=f"from_{source}_sat0",
                                 saturate=0)
                for mode in round_modes:
                    yield Config(**base, family=family, variant=f"from_{source}_{mode}",
                                 round_mode=mode)
                    yield Config(**base, family=family, variant=f"from_{source}_{mode}_sat0",
                                 round_mode=mode, saturate=0)


# The shapes and attributes of the integer-op cases (built in integer_families.py).
MATMUL_GEOMETRIES = ("matrix", "per_row_column", "batched", "vector", "no_zero_point")
CONV_GEOMETRIES = ("pads", "same_upper", "same_lower", "valid", "strides", "dilations",
                   "group", "depthwise", "conv1d", "conv3d", "per_channel", "no_zero_point",
                   "kernel_shape")


def _integer_op_configs(op_type: str, version: int) -> Iterator[Config]:
    """Every operand-type combination the version allows, each on the base geometry and
    families; geometry variants and scale types on the integer combinations."""
    spec = get_spec(op_type, version)
    names = [p.name for p in spec.inputs]
    first, second = names[0], names[3] if op_type.startswith("QLinear") else names[1]
    requantizes = op_type.startswith("QLinear")
    outputs = _type_names(spec.allowed_types(spec.outputs[0].name))
    scales = _type_names(spec.allowed_types(names[1])) if requantizes else [None]
    geometries = MATMUL_GEOMETRIES if "MatMul" in op_type else CONV_GEOMETRIES
    label = ("a", "b") if "MatMul" in op_type else ("x", "w")
    for a in _type_names(spec.allowed_types(first)):
        for b in _type_names(spec.allowed_types(second)):
            for y in outputs:
                integers = all(ELEMENT_TYPES[t].kind == "integer" for t in (a, b, y))
                base = dict(op_type=op_type, version=version, qtype=y, x_type=a, w_type=b)
                stem = f"{label[0]}_{a}_{label[1]}_{b}" + (f"_y_{y}" if requantizes else "")
                if not integers:  # float8 operands or output: QLinearMatMul-21
                    yield Config(**base, family="random", variant=stem, scale_type="float",
                                 geometry=geometries[0])
                    continue
                families = ("random", "zero_points", "ties", "saturation") if requantizes \
                    else ("random", "zero_points", "overflow")
                for family in families:
                    yield Config(**base, family=family, variant=stem, scale_type=scales[0] or "float",
                                 geometry=geometries[0])
                for geometry in geometries[1:]:
                    if requantizes and geometry == "no_zero_point":
                        continue  # QLinear zero points are required inputs
                    yield Config(**base, family="random", variant=f"{stem}_{geometry}",
                                 scale_type=scales[0] or "float", geometry=geometry)
                if op_type == "QLinearConv":
                    yield Config(**base, family="random", variant=f"{stem}_bias",
                                 scale_type="float", geometry="bias")
                for scale in scales[1:]:
                    for family in ("random", "ties"):
                        yield Config(**base, family=family, variant=f"{stem}_scale_{scale}",
                                     scale_type=scale, geometry=geometries[0])


def _dynamic_configs(version: int) -> Iterator[Config]:
    for family in DYNAMIC_FAMILIES:
        yield Config(op_type="DynamicQuantizeLinear", version=version, qtype="uint8",
                     family=family, zero_point=False)


# In the order of the suite (and of its manifest).
_CONFIGS = {
    "QuantizeLinear": _q_configs,
    "DequantizeLinear": _dq_configs,
    "DynamicQuantizeLinear": _dynamic_configs,
    "Cast": lambda version: _cast_configs("Cast", version),
    "CastLike": lambda version: _cast_configs("CastLike", version),
    "MatMulInteger": lambda version: _integer_op_configs("MatMulInteger", version),
    "ConvInteger": lambda version: _integer_op_configs("ConvInteger", version),
    "QLinearMatMul": lambda version: _integer_op_configs("QLinearMatMul", version),
    "QLinearConv": lambda version: _integer_op_configs("QLinearConv", version),
    # Not ONNX ops: the block-scaled formats' quantizers, each case their dequantize graph.
    "MX": lambda version: block_scaled_configs("MX", version),
    "NVFP4": lambda version: block_scaled_configs("NVFP4", version),
}
OPS = tuple(_CONFIGS)  # the ops the suite covers


@dataclass(frozen=True)
class Selection:
    """Which cases to generate; None selects all."""

    ops: tuple[str, ...] | None = None
    opsets: tuple[int, ...] | None = None  # each resolves per op to the since-version it runs
    types: tuple[str, ...] | None = None  # quantized type names
    granularities: tuple[str, ...] | None = None
    families: tuple[str, ...] | None = None
    variants: tuple[str, ...] | None = None  # fnmatch patterns on Config.variant
    # Blocked cases: one per block size (variant blocked_b<N>) instead of the default one.
    block_sizes: tuple[int, ...] | None = None

    def __post_init__(self):
        for name in ("ops", "opsets", "types", "granularities", "families", "variants", "block_sizes"):
            value = getattr(self, name)
            if value is None:
                continue
            # a string is one name, not a sequence of its characters; a set has no order
            # (block sizes are cases in the order given)
            if not isinstance(value, (tuple, list)):
                raise TypeError(f"Selection: {name}={value!r}; expected a sequence of values "
                                f"(e.g. {name}=({value!r},)) or None for all"[:300])
            if not value:
                raise ValueError(f"Selection: {name}=() selects nothing; None selects every value")
            object.__setattr__(self, name, tuple(value))
        for opset in self.opsets or ():
            if isinstance(opset, bool) or not isinstance(opset, int):
                raise TypeError(f"Selection: opsets holds {opset!r}; expected ints")
        if self.ops is not None:
            object.__setattr__(self, "ops", tuple(_resolve_suite_op(op) for op in self.ops))
        if self.types is not None:
            object.__setattr__(self, "types",
                               tuple(element_type(t, "type").name for t in self.types))
        for g in self.granularities or ():
            if g not in GRANULARITIES:
                raise ValueError(f"unknown granularity {g!r}; known: {', '.join(GRANULARITIES)}")
        for opset in self.opsets or ():
            get_spec("QuantizeLinear", opset)  # the range check, with the table's message
        for f in self.families or ():
            if f not in FAMILIES:
                raise ValueError(f"unknown family {f!r}; known: {', '.join(FAMILIES)}")
        for b in self.block_sizes or ():
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"block size {b!r}; allowed: integers >= 1")

    def versions(self, op_type: str) -> list[int]:
        if op_type in BLOCK_SCALED_OPS:  # the dequantize graphs' opsets
            versions = block_scaled_versions(op_type)
            if self.opsets is None:
                return list(versions)
            return [v for v in versions if any(opset >= v for opset in self.opsets)]
        if self.opsets is None:
            return list(OP_VERSIONS[op_type])
        found = {get_spec(op_type, opset).since_version for opset in self.opsets
                 if opset >= OP_VERSIONS[op_type][0]}
        return sorted(found)

    def accepts(self, config: Config) -> bool:
        return ((self.types is None or config.qtype in self.types)
                and (self.granularities is None or config.granularity in self.granularities)
                and (self.families is None or config.family in self.families)
                and (self.variants is None
                     or any(fnmatch.fnmatchcase(config.variant, v) for v in self.variants)))

    def with_block_sizes(self, config: Config) -> Iterator[Config]:
        """The configuration, or for a blocked one with `block_sizes`, one per size."""
        if config.granularity != "blocked" or self.block_sizes is None:
            yield config
            return
        for b in self.block_sizes:
            yield replace(config, variant=f"{config.variant}_b{b}", block_size=b)


def _resolve_suite_op(name) -> str:
    """An ONNX op of the table (or an alias), or a block-scaled format: MX, NVFP4."""
    if isinstance(name, str):
        for op in BLOCK_SCALED_OPS:
            if name.strip().lower() == op.lower():
                return op
    return resolve_op_name(name)


def iter_configs(selection: Selection | None = None) -> Iterator[Config]:
    """Every case configuration of the suite, in a stable order."""
    selection = selection or Selection()
    for op_type in OPS:
        if selection.ops is not None and op_type not in selection.ops:
            continue
        for version in selection.versions(op_type):
            for base in _CONFIGS[op_type](version):
                for config in selection.with_block_sizes(base):
                    if selection.accepts(config):
                        yield config

