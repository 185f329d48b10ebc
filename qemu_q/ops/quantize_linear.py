"""QuantizeLinear (10, 13, 19, 21, 23, 24, 25, 28): y = saturate(round(x / y_scale) + y_zero_point)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import numpy as np

from .. import _coerce, _dispatch
from .._buffers import (
    LITTLE_ENDIAN, finish_output, flat_storage, kernel_output, prepare_output, prepare_packed_output,
)
from .._dispatch import Path
from .._dtypes import (
    CODE_INTEGER, CODE_SMALL_FLOAT, ELEMENT_TYPES, FMT_FLOAT32, PATH_F32_INTEGER, PATH_F32_SMALL_FLOAT, PATH_GENERAL,
    SF_RULE_FNUZ_INF_NAN, SF_RULE_NAN_OPPOSITE_ZERO, SF_RULE_NAN_SIGN, array_element_type,
)
from .._opspec import cast_float8_table, get_spec, normalize_opset
from .._pack import packed_size
from .._params import check_zero_point_values, kernel_parameters
from .._registry import register
from .._rules import (
    division_precision, label, quantize_output_type, saturate_applies, shares_input_type,
)
from .._threads import in_default_fp_environment, resolve_threads
from .._typing import Array, TypeSpec
from ..codecs import PACKABLE_BITS, check_codes, is_family, zero_codes_as_values
from ..datapath import (
    NANS_TO_INTEGER, ONNX, ROUND_CODES, Datapath, as_datapath, check_float8_encoder, check_random_bits,
    promoted_quotient_precision,
)
from .._validate import (
    ArraySpec, cached_plan, check_attribute, check_type, resolve_granularity, signature as _signature,
)

# Values of quantize_linear's `nan`: the Cast table's signed NaN, or the one NaN code some
# hardware writes whatever the sign (0x7F; NVIDIA's conversion instructions).
NAN_OPTIONS = ("spec", "canonical")
_FLOAT32_DIVISION_X = ("float", "float16", "bfloat16")
# The smallest normal of each float type x or a scale can have, for Datapath's
# subnormals="flush_inputs": below it a value is subnormal. float8e8m0 and the integer
# types have no subnormals.
_MIN_NORMAL = {"float": 2.0 ** -126, "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}
_FLOAT32_DIVISION_SCALES = ("float", "float16", "bfloat16", "float8e8m0")
# QuantizeConfig's datapath_wide (pyx/_datapath_loops_f64.pxi.tp): which staging loop
# feeds the datapath's float32 loops.
_WIDE_NONE, _WIDE_X, _WIDE_HALF, _WIDE_F64 = 0, 1, 2, 3
# QuantizeConfig's quotient64 (WIDE_F64): the double loop, or float32 x and scale's
# float32 quotient and remainder (docs/semantics.md, "Staged quotients").
_QUOTIENT64_DOUBLE, _QUOTIENT64_REMAINDER = 0, 1


def _promoted(x_type, scale_type, precision_type, precision: int):
    """Datapath scale_precision="promoted" resolved once per plan into a precision the
    kernels have, as (scale_precision, division precision type): (None, P) where it is
    the ONNX division precision P of the version (the default paths then run), ("float32"
    or "float64", P), or (None, bfloat16) for bfloat16 x over a float8e8m0 scale, which
    numpy divides in bfloat16 where P is float32 (both operands are bfloat16 values, so
    that is the exact quotient rounded to bfloat16, as a bfloat16 P divides). A nonzero
    `precision` attribute names P itself (onnx.reference converts both operands to it
    first: the operands' rounding is not reproduced, docs/divergences.md)."""
    if precision:
        return None, precision_type
    promoted = promoted_quotient_precision(x_type.name, scale_type.name)
    onnx_precision = "float32" if precision_type.name == "float" else precision_type.name
    if promoted == onnx_precision:
        return None, precision_type
    if promoted == "bfloat16":
        return None, ELEMENT_TYPES["bfloat16"]
    # float16 is promoted only from two float16 operands, where P is float16 too
    assert promoted in ("float32", "float64"), (promoted, onnx_precision)
    return promoted, precision_type


@dataclass(frozen=True)
class QuantizePlan(_dispatch.KernelPlan):
    # kernel_fields: pyx/_quantize.pyx's QuantizeConfig; the path is decided here, once.
    PATH = Path.QUANTIZE
    CONFIG_CLASS = "QuantizeConfig"

    @property
    def path(self) -> int:
        return dict(self.kernel_fields)["path"]


@lru_cache(maxsize=512)
def quantize_plan(opset, x_signature, scale_signature, zp_signature, axis,
                  block_size, saturate, precision, output_dtype, nan, fast_kernels,
                  datapath: Datapath = ONNX) -> QuantizePlan:
    # Everything that depends on types, shapes and attributes only, validated once per
    # signature: repeated calls (a model's layers, a sweep) skip straight to the kernel.
    x, scale = ArraySpec(*x_signature), ArraySpec(*scale_signature)
    zero_point = ArraySpec.of_signature(zp_signature)
    spec = get_spec("QuantizeLinear", opset)
    opset = spec.since_version if opset is None else opset
    where = label(spec, opset)
    check_attribute(spec, opset, "block_size", block_size, 0)
    check_attribute(spec, opset, "saturate", saturate, 1)
    check_attribute(spec, opset, "precision", precision, 0)
    check_attribute(spec, opset, "output_dtype", output_dtype, None)
    if saturate not in (0, 1):
        raise ValueError(f"{where}: saturate={saturate}; allowed 0 or 1")
    if not isinstance(nan, str) or nan not in NAN_OPTIONS:
        raise ValueError(f"{where}: nan={nan!r}; allowed {' or '.join(map(repr, NAN_OPTIONS))}")

    x_type = array_element_type(x, "x")
    scale_type = array_element_type(scale, "y_scale")
    check_type(spec, opset, "x", x_type)
    check_type(spec, opset, "y_scale", scale_type)
    if shares_input_type(spec) and scale_type is not x_type:
        raise TypeError(f"{where}: x and y_scale share type T1; got x {x_type.name} and y_scale {scale_type.name}")

    zp_type = None if zero_point is None else array_element_type(zero_point, "y_zero_point")
    family = output_dtype is not None and is_family(output_dtype)
    if family and zero_point is not None and zero_point.dtype == output_dtype.dtype:
        # a codec-family zero point is stored as the family type's codes are (qemu_q/codecs.py)
        zp_type = output_dtype
    if zp_type is not None and not family:
        check_type(spec, opset, "y_zero_point", zp_type)
    out_type = quantize_output_type(spec, output_dtype, zp_type, where)
    if not family:
        check_type(spec, opset, "y", out_type)

    precision_type = division_precision(spec, scale_type, precision, where)
    if datapath.scale_precision == "promoted":
        promoted, precision_type = _promoted(x_type, scale_type, precision_type, precision)
        datapath = replace(datapath, scale_precision=promoted)
    gran = resolve_granularity(spec, opset, x.shape, scale, zero_point, axis, block_size,
                               "y_scale", "y_zero_point")
    # x and the scale are float32 values divided in float32: one IEEE division is the
    # correctly rounded quotient.
    fast_divide = (
        precision_type.value_format == FMT_FLOAT32
        and x_type.name in _FLOAT32_DIVISION_X
        and scale_type.name in _FLOAT32_DIVISION_SCALES
    )
    integer = out_type.kind == "integer"
    # A datapath other than ONNX's (its `nan` aside, which the codes below carry, and the
    # integer ops' accumulator and requantization, which QuantizeLinear has not) runs on
    # the general scalar path, with its options in the config: the ONNX paths stay as they are.
    # float8_encoder="onnxruntime" governs the four float8 outputs only (others ignore
    # it); there it runs on the scalar datapath path (datapath_one), never the float32 loops.
    onnxruntime_float8 = not family and check_float8_encoder(datapath, out_type.name, where)
    use_datapath = datapath != Datapath(nan=datapath.nan, accumulator=datapath.accumulator,
                                        requantization=datapath.requantization,
                                        float8_encoder=datapath.float8_encoder) or onnxruntime_float8
    if datapath.nan == "canonical":
        nan = "canonical"
    float64_quotient = False
    precision_format = precision_type.value_format
    # x and the scale hold float32 values: the datapath loop may use float32 operations.
    f32_operands = x_type.name in _FLOAT32_DIVISION_X and scale_type.name in _FLOAT32_DIVISION_SCALES
    if use_datapath:
        fast_divide = False
        if datapath.scale_precision is not None:
            # "float64" is the config's own flag; "float32" a value format.
            float64_quotient = datapath.scale_precision == "float64"
            precision_format = FMT_FLOAT32
    # float32 x divided in float32: the kernels' vectorized paths, on float32 parameters.
    if use_datapath:
        path = PATH_GENERAL
    elif fast_kernels and fast_divide and x_type.name == "float" and (
            integer or out_type.storage.itemsize == 1):
        path = PATH_F32_INTEGER if integer else PATH_F32_SMALL_FLOAT
    else:
        path = PATH_GENERAL
    # float32 x and scale with the quotient in float32: the datapath's vectorized float32
    # loops (pyx/_quantize.pyx, run_datapath_f32), the same bits as its scalar path, which
    # fast_kernels=False (tests) keeps.
    datapath_f32 = (use_datapath and fast_kernels and x_type.name == "float" and f32_operands
                    and not float64_quotient
                    and (datapath.scale == "reciprocal" or precision_format == FMT_FLOAT32)
                    # the float32 loops encode the ONNX small floats only (their
                    # small_float_format constants); family integers are lo/hi/mask there
                    and not (family and not integer)
                    and not onnxruntime_float8)
    # The other datapaths the float32 loops serve after a staging loop (pyx/_quantize.pyx,
    # run_datapath_wide): float16/bfloat16 x widened for a float32 quotient (WIDE_X); x and
    # scale of one half type divided in it, as the float32 quotient rounded once more
    # (WIDE_HALF); any x with the quotient in float64, rounded to odd at float32's width
    # (WIDE_F64; stochastic rounding needs 32 bits of the dropped fraction that float32
    # does not hold: datapath_one). Integer codes and the ONNX small floats only, as above.
    datapath_wide = _WIDE_NONE
    if (use_datapath and fast_kernels and not datapath_f32 and not (family and not integer)
            and not onnxruntime_float8):
        half_x = x_type.name in ("float16", "bfloat16")
        if float64_quotient:
            if datapath.rounding != "stochastic":
                datapath_wide = _WIDE_F64
        elif half_x and f32_operands and (datapath.scale == "reciprocal" or precision_format == FMT_FLOAT32):
            datapath_wide = _WIDE_X
        elif (half_x and datapath.scale == "divide" and scale_type is x_type
              and precision_format == x_type.value_format):
            datapath_wide = _WIDE_HALF
    small_float_rules = 0
    if family:
        # The family follows the newest Cast table: a NaN keeps its sign (docs/semantics.md,
        # "Codec family").
        small_float_rules = SF_RULE_NAN_SIGN if nan == "spec" else 0
    elif onnxruntime_float8:
        # onnxruntime's constructors: Cast-24's rows (a NaN keeps its sign, FNUZ +-inf
        # saturates) at every version; encode_float8_onnxruntime adds its departures.
        small_float_rules = SF_RULE_NAN_SIGN
    elif out_type.kind == "small_float" and opset >= 19:
        # float8 arrives at 19 with the Cast tables; float4/float6 later, with none.
        table = cast_float8_table(opset)
        if table.negative_nan_row and nan == "spec":
            small_float_rules |= SF_RULE_NAN_SIGN
        if table.fnuz_inf_to_nan:
            small_float_rules |= SF_RULE_FNUZ_INF_NAN
    if datapath.nan == "zero_opposite_sign" and out_type.kind == "small_float" and not onnxruntime_float8:
        # only formats without NaN codes change (pyx/_codecs.pxd, small_float_specials)
        small_float_rules |= SF_RULE_NAN_OPPOSITE_ZERO
    fields = dict(
        outer=gran.outer, axis_len=gran.axis_len, inner=gran.inner, granularity=gran.kind,
        block_size=gran.block_size, x_format=x_type.value_format,
        precision=precision_format, fast_divide=fast_divide,
        code_kind=CODE_INTEGER if integer else CODE_SMALL_FLOAT,
        lo=out_type.lo if integer else 0, hi=out_type.hi if integer else 0,
        # family integers are stored as their values: the storage's two's complement
        mask=((1 << (8 * out_type.storage.itemsize)) - 1 if family else (1 << out_type.bits) - 1)
        if integer else 0,
        small_float_id=0 if integer else out_type.small_float_id,
        saturate=bool(saturate) if (saturate_applies(spec, out_type) or (
            family and not integer)) else True,
        small_float_rules=small_float_rules, path=path,
        code_bits=out_type.bits if out_type.bits in PACKABLE_BITS else 8 * out_type.storage.itemsize,
        datapath=use_datapath, rounding=ROUND_CODES[datapath.rounding],
        reciprocal=datapath.scale == "reciprocal", float64_quotient=float64_quotient,
        nan_to_integer=NANS_TO_INTEGER.index(datapath.nan_to_integer),
        flush_inputs=datapath.flush_inputs, flush_outputs=datapath.flush_outputs,
        x_min_normal=_MIN_NORMAL.get(x_type.name, 0.0) if use_datapath else 0.0,
        scale_min_normal=_MIN_NORMAL.get(scale_type.name, 0.0) if use_datapath else 0.0,
        f32_operands=f32_operands and use_datapath, datapath_f32=datapath_f32,
        onnxruntime_float8=onnxruntime_float8,
        datapath_wide=datapath_wide,
        # float32-valued x (float16/bfloat16 widened) and scale: the float64 quotient's
        # staged value from the float32 quotient and its remainder; int32 x: the double loop
        quotient64=_QUOTIENT64_REMAINDER if datapath_wide == _WIDE_F64 and f32_operands else _QUOTIENT64_DOUBLE,
    )
    return QuantizePlan(where, x_type, out_type, tuple(fields.items()))


@in_default_fp_environment
def quantize_linear(x: Array, y_scale: Array, y_zero_point: Array | None = None, *, axis: int = 1,
                    block_size: int = 0, output_dtype: TypeSpec | None = None,
                    saturate: int | bool = 1, precision: int = 0, opset: int | None = None,
                    out: np.ndarray | None = None, packed: bool = False,
                    n_threads: int | None = None,
                    nan: Literal["spec", "canonical"] = "spec", datapath: Datapath | None = None,
                    random_bits: np.ndarray | None = None) -> np.ndarray:
    """ONNX QuantizeLinear: y = saturate(round(x / y_scale) + y_zero_point), bit-exact.

    `opset` selects the version (newest since-version <= opset; None: 28). Types follow
    that version's schema; `output_dtype` takes an ONNX data-type int, a name ("int4",
    "float8e4m3fn") or a dtype. Rules the spec leaves open are in docs/semantics.md.
    `output_dtype` may also be a codec-family type (from `qemu_q.integer_type`,
    `qemu_q.minifloat_type`: docs/semantics.md, "Codec family"); y is then an
    array of that type's storage (int5 values in int8, minifloat codes in uint8/uint16), and
    y_zero_point, when given, an array of the same storage.

    `out` receives the result (no allocation). With `packed=True` the result is the ONNX
    raw_data of y instead: a 1-D uint8 array of `pack(y)`'s bytes (ceil(n * bits / 8);
    int4/uint4/float4 two per byte, int2/uint2 four, float6 four in three), quantized and
    packed in one pass; `out` must then be such a uint8 array. `n_threads` overrides the
    default thread count (`set_num_threads`); the bits never depend on it.

    `nan` (not an ONNX attribute) picks the NaN codes of e4m3fn and e5m2: "spec" (default)
    follows the Cast table in force at `opset` (a NaN keeps its sign: 0x7F / 0xFF, and
    -Inf with saturate=0 gives 0xFF in e4m3fn); "canonical" writes 0x7F for every NaN
    result, as NVIDIA's conversion instructions do. See docs/semantics.md.
    """
    x = _coerce.as_array(x, "x")
    scale = _coerce.as_array(y_scale, "y_scale")
    zero_point = _coerce.optional_array(y_zero_point, "y_zero_point")
    packed = _coerce.flag(packed, "packed")
    datapath = as_datapath(datapath, op_type="QuantizeLinear", opset=normalize_opset(opset))
    bits = check_random_bits(random_bits, datapath, x.shape, "x")
    plan = cached_plan(quantize_plan, (
        normalize_opset(opset), _signature(x), _signature(scale), _signature(zero_point),
        _coerce.int_attribute(axis, "axis"), _coerce.int_attribute(block_size, "block_size"),
        _coerce.int_attribute(saturate, "saturate", allow_bool=True),
        _coerce.int_attribute(precision, "precision"), _coerce.output_dtype(output_dtype), nan,
        _dispatch.FAST_KERNELS, datapath,
    ))
    out_type = plan.out_type
    extra = {} if bits is None else {"random_bits": bits}
    n_threads = resolve_threads(n_threads, x.size)
    # The output is checked before anything is converted or allocated.
    inputs = [("x", x), ("y_scale", scale), ("y_zero_point", zero_point), ("random_bits", random_bits)]
    if packed and is_family(out_type) and out_type.bits not in PACKABLE_BITS:
        raise ValueError(f"{plan.label}: packed=True with output type {out_type.name}: codes of "
                         f"{out_type.bits} bits have no ONNX raw_data layout; allowed widths "
                         f"{', '.join(map(str, PACKABLE_BITS))}")
    if packed:
        result = prepare_packed_output(out, packed_size(out_type, x.size), out_type, inputs)
    else:
        result = prepare_output(out, x.shape, out_type, inputs)
    if x.size == 0:
        return result
    if zero_point is not None and is_family(out_type):
        if out_type.kind == "integer":
            check_codes(zero_point, out_type, plan.label, "y_zero_point")
        else:
            zero_point = zero_codes_as_values(zero_point, out_type, plan.label, "y_zero_point")
    check_zero_point_values(zero_point, out_type, plan.label, "y_zero_point")
    config = plan.kernel_config()
    # float32 arrays for the float32 paths, and for the float64 quotients' staged feeding
    # of float32-valued scales (QuantizeConfig.float32_parameters)
    params = kernel_parameters(scale, zero_point, scale.size, -0.0,
                               config.path != PATH_GENERAL or config.float32_parameters,
                               zero_point_int=out_type.kind == "integer")
    flat_x = flat_storage(x, plan.x_type)
    if packed and out_type.packed:
        # Quantized and packed piece by piece: the one-per-byte codes never exist.
        _dispatch.run(Path.QUANTIZE_PACKED, flat_x, *params, result, config, n_threads, **extra)
    elif packed and not LITTLE_ENDIAN:
        codes = np.empty(x.size, dtype=out_type.dtype)
        _dispatch.run(Path.QUANTIZE, flat_x, *params, codes.view(out_type.storage), config, n_threads,
                      **extra)
        result[...] = codes.astype(codes.dtype.newbyteorder("<")).view(np.uint8)
    else:
        # Whole-byte packed types: the storage is the raw_data, written in place.
        storage = result.view(out_type.storage) if packed else result.reshape(-1).view(out_type.storage)
        written = kernel_output(storage)
        _dispatch.run(Path.QUANTIZE, flat_x, *params, written, config, n_threads, **extra)
        finish_output(storage, written)
    return result


@register("QuantizeLinear")
def _run_node(inputs, attributes, opset):
    return [quantize_linear(*inputs, opset=opset, **attributes)]
