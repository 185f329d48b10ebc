"""Cast (1, 6, 9, 13, 19, 21, 23, 24, 25, 28) and CastLike (15, 19, 21, 23, 24, 25): every
numeric type into every other, with the conversion tables of the resolved version.

The rules, row by row, are in docs/semantics.md ("Cast"); the kernels in pyx/_cast.pyx.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _coerce, _dispatch
from .._buffers import finish_output, flat_storage, kernel_output, prepare_output
from .._dispatch import Path
from .._dtypes import (
    CAST_BFLOAT16, CAST_BOOL, CAST_E8M0, CAST_FLOAT16, CAST_FLOAT32, CAST_FLOAT64,
    CAST_PATH_BF16_F32, CAST_PATH_F16_F32, CAST_PATH_F32_BF16, CAST_PATH_F32_E8M0,
    CAST_PATH_F32_F16, CAST_PATH_F32_INTEGER, CAST_PATH_F32_SMALL_FLOAT, CAST_PATH_GENERAL,
    CAST_PATH_HALF_DATAPATH, CAST_PATH_SMALL_FLOAT_DATAPATH, CAST_SIGNED,
    CAST_SMALL_FLOAT, CAST_UNSIGNED, E8M0_ROUND_MODES, SF_RULE_FNUZ_INF_NAN,
    SF_RULE_NAN_NEGATIVE_ZERO, SF_RULE_NAN_OPPOSITE_ZERO, SF_RULE_NAN_SIGN, ElementType, array_element_type,
    element_type,
)
from .._opspec import cast_float8_table, get_spec, normalize_opset
from .._registry import register
from .._rules import cast_output_type, label, saturate_applies
from .._threads import in_default_fp_environment, resolve_threads
from .._typing import Array, TypeSpec
from .._validate import ArraySpec, cached_plan, check_attribute, check_type, signature as _signature
from ..datapath import ONNX, ROUND_CODES, Datapath, as_datapath, check_float8_encoder, check_random_bits

# ONNX's STRING data type: Cast defines it, qemu_q does not implement it.
_STRING_ID = 8
_STRING_MESSAGE = (
    "tensor(string) is not supported: qemu_q emulates numeric datapaths (Cast's string "
    "parsing and printing rules are not implemented)"
)


@dataclass(frozen=True)
class CastPlan(_dispatch.KernelPlan):
    # kernel_fields: pyx/_cast.pyx's CastConfig; the loop is decided here, once.
    PATH = Path.CAST
    CONFIG_CLASS = "CastConfig"


def _kind(etype: ElementType) -> tuple[int, int, int]:
    """(cast kind, bits, small-float format) of an element type, as CastConfig reads them."""
    if etype.kind == "integer":
        return (CAST_SIGNED if (etype.lo or 0) < 0 else CAST_UNSIGNED), etype.bits, 0
    if etype.kind == "small_float" and etype.small_float_id is not None:
        return CAST_SMALL_FLOAT, etype.bits, etype.small_float_id
    kinds = {"float": CAST_FLOAT32, "float16": CAST_FLOAT16, "bfloat16": CAST_BFLOAT16,
             "double": CAST_FLOAT64, "float8e8m0": CAST_E8M0, "bool": CAST_BOOL}
    return kinds[etype.name], etype.bits, 0


def _round_mode(value) -> str:
    # ONNX nodes carry string attributes as bytes.
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"round_mode={value!r}; allowed {', '.join(map(repr, E8M0_ROUND_MODES))}") from None
    if not isinstance(value, str):
        raise TypeError(f"round_mode must be a str, got {type(value).__name__} {value!r}")
    if value not in E8M0_ROUND_MODES:
        raise ValueError(f"round_mode={value!r}; allowed {', '.join(map(repr, E8M0_ROUND_MODES))}")
    return value


def _target(value, argument: str) -> ElementType:
    # Cast-1 carries `to` as a string attribute, which an ONNX node holds as bytes.
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"{argument}={value!r} is not a type name") from None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value == _STRING_ID:
        raise TypeError(f"{argument}={int(value)}: {_STRING_MESSAGE}")
    if isinstance(value, str) and value.strip().lower() in ("string", "tensor(string)"):
        raise TypeError(f"{argument}={value!r}: {_STRING_MESSAGE}")
    return element_type(value, argument)


def _check_numeric(array: np.ndarray, argument: str) -> None:
    if array.dtype.kind in "USO":
        raise TypeError(f"{argument} has dtype {array.dtype}: {_STRING_MESSAGE}")


@lru_cache(maxsize=128)  # a Datapath is immutable and hashable: one per datapath given
def datapath_reads(datapath: Datapath) -> Datapath:
    """The part of a Datapath Cast and CastLike read (docs/semantics.md, "Datapath
    options"): rounding, nan, subnormals, float8_encoder; scale, scale_precision,
    nan_to_integer, accumulator and requantization describe steps Cast has not, and are
    ignored."""
    return Datapath(rounding=datapath.rounding, nan=datapath.nan, subnormals=datapath.subnormals,
                    float8_encoder=datapath.float8_encoder)


def _min_normal(etype: ElementType) -> float:
    """The smallest normal of a float type (below it, nonzero values are subnormal); 0.0
    for types without subnormals (integers, bool, float8e8m0)."""
    import ml_dtypes

    if etype.kind == "small_float" or etype.name in ("float", "float16", "bfloat16", "double"):
        # ml_dtypes' types report numpy kind "f" but only ml_dtypes.finfo knows them
        finfo = (np.finfo(etype.dtype) if etype.name in ("float", "float16", "double")
                 else ml_dtypes.finfo(etype.dtype))
        return float(finfo.smallest_normal)
    return 0.0


@lru_cache(maxsize=512)
def cast_plan(op_type, opset, x_signature, to, saturate, round_mode, fast_kernels,
              datapath: Datapath = ONNX) -> CastPlan:
    x = ArraySpec(*x_signature)
    spec = get_spec(op_type, opset)
    opset = spec.since_version if opset is None else opset
    where = label(spec, opset)
    check_attribute(spec, opset, "saturate", saturate, 1)
    check_attribute(spec, opset, "round_mode", round_mode, "up")
    if saturate not in (0, 1):
        raise ValueError(f"{where}: saturate={saturate}; allowed 0 or 1")
    x_type = array_element_type(x, "input")
    check_type(spec, opset, "input", x_type)
    out_type = cast_output_type(spec, to, to)
    check_type(spec, opset, "output", out_type)
    source_kind, source_bits, source_format = _kind(x_type)
    target_kind, target_bits, target_format = _kind(out_type)
    rules = 0
    # float8_encoder="onnxruntime" governs the four float8 targets only (others ignore it)
    onnxruntime_float8 = check_float8_encoder(datapath, out_type.name, where)
    if onnxruntime_float8:
        # onnxruntime's constructors: Cast-24's rows at every version (pyx/_cast.pyx,
        # onnxruntime_float8_convert, adds their departures)
        rules = SF_RULE_NAN_SIGN
    elif out_type.kind == "small_float":
        table = cast_float8_table(opset) if opset >= 19 else None
        # nan="canonical": no signed-NaN rows, so every e4m3fn / e5m2 NaN result is 0x7F
        if table is not None and table.negative_nan_row and datapath.nan != "canonical":
            rules |= SF_RULE_NAN_SIGN
        if table is not None and table.fnuz_inf_to_nan:
            rules |= SF_RULE_FNUZ_INF_NAN
        rules |= SF_RULE_NAN_NEGATIVE_ZERO
        if datapath.nan == "zero_opposite_sign":
            # ml_dtypes' NaN into float4/float6 (the other small floats have NaN codes)
            rules |= SF_RULE_NAN_OPPOSITE_ZERO
    path = CAST_PATH_GENERAL
    # `datapath` holds only the fields Cast reads. `nan` into a small float is the
    # encoder's rows above (its fast loop stays); anything else runs the datapath loop.
    use_datapath = datapath != Datapath(nan=datapath.nan, float8_encoder=datapath.float8_encoder) or (
        datapath.nan == "canonical" and out_type.kind != "small_float") or onnxruntime_float8
    # The loop, decided once: the typed loops give the general path's bits (the tests run
    # both, the general one with fast_kernels off).
    if not fast_kernels:
        pass
    elif use_datapath:
        # Into an ONNX small float, float16 or bfloat16 from float32 / float16 / bfloat16
        # (not a 16-bit float into itself): one loop per rounding mode; every other
        # datapath (and float8_encoder="onnxruntime") the general loop;
        # float64 too (rounded to odd into float32 first, pyx/_cast.pyx narrow_odd) but
        # under stochastic rounding, whose word reads more dropped bits than a float32 keeps.
        sources = (CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16) + (
            (CAST_FLOAT64,) if datapath.rounding != "stochastic" else ())
        if target_kind == CAST_SMALL_FLOAT and not onnxruntime_float8 and source_kind in sources:
            path = CAST_PATH_SMALL_FLOAT_DATAPATH
        elif (target_kind in (CAST_FLOAT16, CAST_BFLOAT16) and source_kind != target_kind
              and source_kind in sources):
            path = CAST_PATH_HALF_DATAPATH
    elif source_kind == CAST_FLOAT32:
        if target_kind == CAST_SMALL_FLOAT:
            path = CAST_PATH_F32_SMALL_FLOAT
        elif target_kind == CAST_E8M0:
            path = CAST_PATH_F32_E8M0
        elif target_kind == CAST_FLOAT16:
            path = CAST_PATH_F32_F16
        elif target_kind == CAST_BFLOAT16:
            path = CAST_PATH_F32_BF16
        elif target_kind in (CAST_SIGNED, CAST_UNSIGNED) and target_bits in (8, 16):
            path = CAST_PATH_F32_INTEGER
    elif target_kind == CAST_SMALL_FLOAT and source_kind in (CAST_FLOAT16, CAST_BFLOAT16):
        path = CAST_PATH_F32_SMALL_FLOAT  # widened to float32 a piece at a time
    elif target_kind == CAST_FLOAT32:
        if source_kind == CAST_FLOAT16:
            path = CAST_PATH_F16_F32
        elif source_kind == CAST_BFLOAT16:
            path = CAST_PATH_BF16_F32
    fields = dict(
        path=path, source_kind=source_kind, source_bits=source_bits, source_format=source_format,
        target_kind=target_kind, target_bits=target_bits, target_format=target_format,
        round_mode=E8M0_ROUND_MODES.index(round_mode),
        saturate=bool(saturate) if saturate_applies(spec, out_type) else True,
        small_float_rules=rules, datapath=use_datapath, rounding=ROUND_CODES[datapath.rounding],
        flush_inputs=datapath.flush_inputs, flush_outputs=datapath.flush_outputs,
        canonical_nan=datapath.nan == "canonical",
        source_min_normal=_min_normal(x_type) if use_datapath else 0.0,
        onnxruntime_float8=onnxruntime_float8,
    )
    return CastPlan(where, x_type, out_type, tuple(fields.items()))


def _run(op_type: str, x, to: ElementType, saturate, round_mode, opset, out, n_threads,
         datapath, random_bits):
    datapath = datapath_reads(as_datapath(datapath, op_type=op_type, opset=normalize_opset(opset)))
    bits = check_random_bits(random_bits, datapath, x.shape, "x")
    plan = cached_plan(cast_plan, (
        op_type, opset, _signature(x), to,
        _coerce.int_attribute(saturate, "saturate", allow_bool=True), _round_mode(round_mode),
        _dispatch.FAST_KERNELS, datapath,
    ))
    n_threads = resolve_threads(n_threads, x.size)
    result = prepare_output(out, x.shape, plan.out_type, [("input", x), ("random_bits", random_bits)])
    if x.size == 0:
        return result
    # The identity shortcut is ONNX's; a datapath may flush or canonicalize the same type.
    if (plan.x_type is plan.out_type and plan.x_type.kind != "small_float"
            and not dict(plan.kernel_fields)["datapath"]):
        # A cast to the input's own type is the identity: every bit, NaN payloads included.
        # Not for the small floats: the float8 tables apply to every input (e5m2 with
        # saturate=1 maps +-inf to +-max, and its NaNs are written 0x7E / 0xFE).
        np.copyto(result, x)
        return result
    config = plan.kernel_config()
    source = flat_storage(x, plan.x_type).view(np.uint8)
    storage = result.reshape(-1).view(plan.out_type.storage)
    written = kernel_output(storage)
    extra = {} if bits is None else {"random_bits": bits}
    _dispatch.run(Path.CAST, source, written.view(np.uint8), config, n_threads, **extra)
    finish_output(storage, written)
    return result


@in_default_fp_environment
def cast(x: Array, to: TypeSpec, *, saturate: int | bool = 1, round_mode: str = "up",
         opset: int | None = None, out: np.ndarray | None = None,
         n_threads: int | None = None, datapath: Datapath | None = None,
         random_bits: np.ndarray | None = None) -> np.ndarray:
    """ONNX Cast: x converted to the type `to`, bit-exact, by the tables of the version in
    force at `opset` (newest since-version <= opset; None: 28).

    `to` takes an ONNX data-type int, a type name ("float8e4m3fn", "int4") or a dtype.
    `saturate` (19+) applies to the float8 and float8e8m0 outputs, `round_mode` ("up",
    "down", "nearest"; 24+) to float8e8m0. Sub-byte outputs are one element per byte, as
    ml_dtypes holds them (pack() gives the ONNX raw_data). Rules the spec leaves open
    (float to integer out of range, float8e8m0 below its range, NaN into float4/float6)
    are in docs/semantics.md. tensor(string) is not supported (TypeError).

    `datapath` (a `qemu_q.Datapath`, None: ONNX) reads `rounding` (every rounding to
    nearest of a float or integer into a float type, and into int4/uint4/int2/uint2; not
    the truncation into 8-bit-and-wider integers, nor float8e8m0, whose `round_mode`
    governs), `nan` ("canonical": one NaN code per float type) and `subnormals`; the other
    fields describe steps Cast has not and are ignored. rounding="stochastic" takes
    `random_bits=`, a uint32 array of x's shape. docs/semantics.md, "Datapath options".
    """
    x = _coerce.as_array(x, "x")
    _check_numeric(x, "x")
    target = _target(to, "to")
    return _run("Cast", x, target, saturate, round_mode, normalize_opset(opset), out, n_threads,
                datapath, random_bits)


@in_default_fp_environment
def cast_like(x: Array, target_type: Array, *, saturate: int | bool = 1, round_mode: str = "up",
              opset: int | None = None, out: np.ndarray | None = None,
              n_threads: int | None = None, datapath: Datapath | None = None,
              random_bits: np.ndarray | None = None) -> np.ndarray:
    """ONNX CastLike: x converted to the element type of the array `target_type` (only its
    dtype is read), with Cast's rules at `opset` (CastLike has versions 15 to 25);
    `datapath` and `random_bits` as `cast`'s."""
    x = _coerce.as_array(x, "x")
    target_type = _coerce.as_array(target_type, "target_type")
    _check_numeric(x, "x")
    _check_numeric(target_type, "target_type")
    opset = normalize_opset(opset)
    target = array_element_type(target_type, "target_type")
    spec = get_spec("CastLike", opset)
    check_type(spec, opset, "target_type", target)
    return _run("CastLike", x, target, saturate, round_mode, opset, out, n_threads, datapath,
                random_bits)


@register("Cast")
def _run_cast(inputs, attributes, opset):
    attributes = dict(attributes)
    if "to" not in attributes:
        raise ValueError(f"{label(get_spec('Cast', opset), opset)}: the attribute 'to' is required")
    return [cast(inputs[0], attributes.pop("to"), opset=opset, **attributes)]


@register("CastLike")
def _run_cast_like(inputs, attributes, opset):
    return [cast_like(inputs[0], inputs[1], opset=opset, **attributes)]
