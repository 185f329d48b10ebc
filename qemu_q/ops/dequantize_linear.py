"""DequantizeLinear (10, 13, 19, 21, 23, 24, 25, 28): y = (x - x_zero_point) * x_scale,
rounded once to the output type."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _coerce, _dequantize, _dispatch
from .._buffers import (
    LITTLE_ENDIAN, finish_output, flat_storage, kernel_output, packed_input, prepare_output,
)
from .._dispatch import Path
from .._dtypes import ELEMENT_TYPES, FMT_FLOAT32, ElementType, array_element_type, element_type
from ..codecs import PACKABLE_BITS, check_codes, is_family, parameters, zero_codes_as_values
from .._opspec import get_spec, normalize_opset
from .._params import check_zero_point_values, kernel_parameters
from .._registry import register
from .._rules import dequantize_output_type, label, multiplication_precision
from .._threads import in_default_fp_environment, resolve_threads
from ..datapath import ONNX, ROUND_CODES, Datapath, as_datapath, check_random_bits
from .._typing import Array, Shape, TypeSpec
from .._validate import (
    ArraySpec, cached_plan, check_attribute, check_type, resolve_granularity, signature as _signature,
)


@lru_cache(maxsize=None)
def decode_table(type_name: str) -> np.ndarray:
    """float32 value of each of the 256 one-per-byte codes of an 8-bit-stored type."""
    return family_decode_table(ELEMENT_TYPES[type_name])


@lru_cache(maxsize=None)
def family_decode_table(etype: ElementType) -> np.ndarray:
    """decode_table of an 8-bit-stored type, ONNX or codec family (qemu_q/codecs.py): the
    value of each byte the storage holds (integer storage sign-extended)."""
    if etype.kind == "small_float":
        table = _dequantize.decode_table(etype.small_float_id)
    else:
        table = etype.code_values(np.arange(256)).astype(np.float32)
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class DequantizePlan(_dispatch.KernelPlan):
    # kernel_fields: pyx/_dequantize.pyx's DequantizeConfig.
    PATH = Path.DEQUANTIZE
    CONFIG_CLASS = "DequantizeConfig"


# The smallest normal of a scale type (Datapath subnormals="flush_inputs"); float8e8m0
# has no subnormals.
_SCALE_MIN_NORMAL = {"float": 2.0 ** -126, "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}
_SCALE_PRECISIONS = {None: 0, "float32": 1, "float64": 2}
# Scale types whose every value is a float32 (at most 24 significant bits).
_FLOAT32_EXACT_SCALES = frozenset({"float", "float16", "bfloat16", "float8e8m0"})


@lru_cache(maxsize=128)  # a Datapath is immutable and hashable: one per datapath given
def datapath_reads(datapath: Datapath) -> Datapath:
    """The part of a Datapath DequantizeLinear reads (docs/semantics.md, "Datapath
    options"): rounding, scale_precision, nan, subnormals; the others (scale,
    nan_to_integer, accumulator, requantization) describe steps it has not, and are
    ignored. "promoted" is "float32" here (the codes read as float32 times the scale: numpy
    promotes float32 with every scale type to float32), and nan="zero_opposite_sign" is
    "spec" (every output type has NaN codes: docs/semantics.md)."""
    precision = "float32" if datapath.scale_precision == "promoted" else datapath.scale_precision
    nan = "spec" if datapath.nan == "zero_opposite_sign" else datapath.nan
    return Datapath(rounding=datapath.rounding, scale_precision=precision, nan=nan,
                    subnormals=datapath.subnormals)


# Scale types of at most 11 significant bits: (significant bits, the smallest last bit of a
# value: the smallest subnormal)
_HALF_SCALES = {"float16": (11, 2.0 ** -24), "bfloat16": (8, 2.0 ** -133)}


@lru_cache(maxsize=128)
def _float32_products(x_type: ElementType, scale_type: ElementType) -> bool:
    """Whether (x - zero_point) * scale is a float32 for every 8-bit code of x_type and
    every scale value of scale_type, so that rounding it from float32 is the one rounding
    of the exact product (docs/semantics.md, "DequantizeLinear"): the significant
    bits of d and of the scale fit in float32's 24, and the product of their last bits is
    at least float32's smallest subnormal 2**-149 (a product beyond float32's range is
    beyond every output's). d is an integer of at most 8 bits (x - zero_point of an 8-bit
    integer code: |d| <= 255), or a small-float code's value (its zero point is +-0), read
    off the decode table."""
    if scale_type.name not in _HALF_SCALES or x_type.storage.itemsize != 1:
        return False
    scale_bits, scale_last_bit = _HALF_SCALES[scale_type.name]
    if x_type.kind == "integer":
        code_bits, code_last_bit = 8, 1.0
    elif x_type.kind == "small_float":
        table = family_decode_table(x_type) if is_family(x_type) else decode_table(x_type.name)
        code_bits, code_last_bit = 0, math.inf
        for value in map(float, table):
            if value == 0 or not math.isfinite(value):
                continue
            numerator, denominator = abs(value).as_integer_ratio()
            trailing = (numerator & -numerator).bit_length() - 1
            code_bits = max(code_bits, (numerator >> trailing).bit_length())
            code_last_bit = min(code_last_bit, 2.0 ** trailing / denominator)
    else:
        return False
    return code_bits + scale_bits <= 24 and code_last_bit * scale_last_bit >= 2.0 ** -149


def _small_float_min_normal(x_type) -> float:
    if is_family(x_type):
        # a family minifloat's smallest normal: exponent field 1, 2^(1 - bias)
        return 2.0 ** (1 - parameters(x_type)["bias"])
    import ml_dtypes

    return float(ml_dtypes.finfo(x_type.dtype).smallest_normal)


@lru_cache(maxsize=512)
def dequantize_plan(opset, x_signature, scale_signature, zp_signature, axis,
                    block_size, output_dtype, fast_kernels,
                    datapath: Datapath = ONNX,
                    x_family: ElementType | None = None) -> DequantizePlan:
    # As quantize_plan: validated once per signature.
    x, scale = ArraySpec(*x_signature), ArraySpec(*scale_signature)
    zero_point = ArraySpec.of_signature(zp_signature)
    spec = get_spec("DequantizeLinear", opset)
    opset = spec.since_version if opset is None else opset
    where = label(spec, opset)
    check_attribute(spec, opset, "block_size", block_size, 0)
    check_attribute(spec, opset, "output_dtype", output_dtype, None)

    # x_family: codes of a codec-family type (x_dtype=), stored as its dtype says
    x_type = array_element_type(x, "x") if x_family is None else x_family
    scale_type = array_element_type(scale, "x_scale")
    if x_family is None:
        check_type(spec, opset, "x", x_type)
    check_type(spec, opset, "x_scale", scale_type)
    if zero_point is not None and x_family is not None:
        if zero_point.dtype != x_type.dtype:
            raise TypeError(f"{where}: x_zero_point of {x_type.name} codes must be stored as x is "
                            f"({x_type.dtype}), got {zero_point.dtype}")
    elif zero_point is not None:
        zp_type = array_element_type(zero_point, "x_zero_point")
        if zp_type is not x_type:
            raise TypeError(f"{where}: x_zero_point must have the type of x ({x_type.name}), got {zp_type.name}")

    out_type = dequantize_output_type(spec, output_dtype, scale_type)
    if output_dtype is not None:
        check_type(spec, opset, "y", out_type)
    # The kernels round the exact product once, to the output type: the multiplication's
    # precision must be that type.
    if multiplication_precision(spec, output_dtype, scale_type) is not out_type:
        raise AssertionError(f"{where}: multiplication precision differs from the output type")

    gran = resolve_granularity(spec, opset, x.shape, scale, zero_point, axis, block_size,
                               "x_scale", "x_zero_point")
    integer = x_type.kind == "integer"
    # A scale_precision that cannot change a bit is no step (docs/semantics.md,
    # "DequantizeLinear under a datapath", step 2): "float32" into float32 is the output's
    # own rounding, and "float64" rounds a product of codes of at most 16 bits and a
    # float32-valued scale, exact in double (at most 17 + 24 bits), to itself. Without it
    # a datapath may be the default, which then runs the ONNX kernels.
    if out_type.value_format == FMT_FLOAT32 and (
            datapath.scale_precision == "float32"
            or (datapath.scale_precision == "float64" and x_type.storage.itemsize <= 2
                and scale_type.name in _FLOAT32_EXACT_SCALES)):
        datapath = dataclasses.replace(datapath, scale_precision=None)
    # `datapath` holds only the fields DequantizeLinear reads: anything but the default
    # runs the general datapath loop, on float64 parameters, or the vectorized ones below.
    use_datapath = datapath != ONNX
    # 8- and 16-bit integer codes and 8-bit small floats times a float32-exact scale: the
    # product is exact in double and the vectorized datapath loops round it
    # (pyx/_dequantize_datapath_loops.pxi.tp); FAST_KERNELS=False keeps the general loop.
    exact_products = (fast_kernels and scale_type.name in _FLOAT32_EXACT_SCALES
                      and ((integer and x_type.bits <= 16 and x_type.storage.itemsize <= 2)
                           or (x_type.kind == "small_float" and x_type.storage.itemsize == 1)))
    # Into float16 / bfloat16 the default takes those loops too: the ONNX kernels' loop
    # there rounds per element with the format a run-time value (scalar), and the datapath
    # loops under the default datapath round the same exact product once, to nearest even,
    # NaN for NaN: the same bits (tests/test_datapath_dequantize_fast.py checks every code of
    # each kind against every float16 and bfloat16 scale pattern, NaN payloads included).
    fast_datapath = exact_products and (use_datapath or out_type.value_format != FMT_FLOAT32)
    use_datapath = use_datapath or fast_datapath
    if use_datapath:
        fast_kernels = False
    fields = dict(
        outer=gran.outer, axis_len=gran.axis_len, inner=gran.inner, granularity=gran.kind,
        block_size=gran.block_size,
        # 16- and 32-bit codes are decoded arithmetically; the table is unused there.
        table=(family_decode_table(x_type) if x_family is not None and x_type.storage.itemsize == 1
               else decode_table(x_type.name if x_type.storage.itemsize == 1 else "uint8")),
        code_size=x_type.storage.itemsize,
        code_bits=x_type.bits if x_type.bits in PACKABLE_BITS + (32,) else 8 * x_type.storage.itemsize,
        # Integer codes of 8 bits or fewer, and small floats, are decoded on their bits.
        integer_bits=x_type.bits if integer and x_type.bits <= 8 else 0,
        integer_signed=integer and x_type.signed,
        small_float_id=x_type.small_float_id if x_type.kind == "small_float" else -1,
        signed16=integer and x_type.signed and x_type.storage.itemsize == 2,
        out_format=out_type.value_format, fast=fast_kernels,
        # float32 outputs from 8- and 16-bit codes read float32 parameters (exact there),
        # but for 16-bit minifloat codes (float64 products, pyx/_dequantize.pyx) and on the
        # general datapath loop (the one-pass float32 datapath loops read float32 ones).
        float32_parameters=(out_type.value_format == FMT_FLOAT32 and x_type.storage.itemsize <= 2
                            and not (x_type.kind == "small_float" and x_type.storage.itemsize == 2)
                            and (not use_datapath or fast_datapath)),
        datapath=use_datapath, rounding=ROUND_CODES[datapath.rounding],
        scale_precision=_SCALE_PRECISIONS[datapath.scale_precision],
        flush_inputs=datapath.flush_inputs, flush_outputs=datapath.flush_outputs,
        canonical_nan=datapath.nan == "canonical",
        x_min_normal=(_small_float_min_normal(x_type) if use_datapath and x_type.kind == "small_float"
                      else 0.0),
        scale_min_normal=_SCALE_MIN_NORMAL.get(scale_type.name, 0.0) if use_datapath else 0.0,
        fast_datapath=fast_datapath,
        # into float16 / bfloat16, where every product is a float32, or where the datapath
        # rounds it to float32 first (scale_precision "float32": the float32 multiply of an
        # 8-bit code's value and the scale is that rounding): rounded from float32 by Cast's
        # loop of the mode (pyx/_dequantize.pyx, half_products_run)
        half_from_float32=(fast_datapath and out_type.value_format != FMT_FLOAT32
                           and (_float32_products(x_type, scale_type)
                                or (datapath.scale_precision == "float32"
                                    and x_type.storage.itemsize == 1))),
        # 8-bit integer codes times float32 scales: the products rounded to odd at 24 bits
        # stand for the exact ones there (docs/semantics.md, "float32 scales into float16 /
        # bfloat16"), but for stochastic rounding (32 dropped bits) and a float32
        # scale_precision (whose first rounding is to nearest even): the double route
        half_odd_products=(fast_datapath and out_type.value_format != FMT_FLOAT32 and integer
                           and x_type.storage.itemsize == 1 and scale_type.name == "float"
                           and datapath.rounding != "stochastic"
                           and datapath.scale_precision != "float32"),
    )
    return DequantizePlan(where, x_type, out_type, tuple(fields.items()))


@in_default_fp_environment
def dequantize_linear(x: Array | bytes, x_scale: Array, x_zero_point: Array | None = None, *,
                      axis: int = 1, block_size: int = 0, output_dtype: TypeSpec | None = None,
                      opset: int | None = None, out: np.ndarray | None = None,
                      packed: bool = False, dtype: TypeSpec | None = None,
                      shape: Shape | None = None, n_threads: int | None = None,
                      datapath: Datapath | None = None,
                      random_bits: np.ndarray | None = None,
                      x_dtype: TypeSpec | None = None) -> np.ndarray:
    """ONNX DequantizeLinear: y = (x - x_zero_point) * x_scale, rounded once to the output type.

    `opset` selects the version (None: 28). The output type is float32 (10, 13), the
    scale's type (19, 21), or `output_dtype` / the scale's type (23+).

    `out` receives the result (no allocation). With `packed=True`, x is the ONNX raw_data
    of the codes (bytes or a uint8 array, as `pack` gives and `quantize_linear(...,
    packed=True)` returns): `shape` is the shape of x and `dtype` its element type (or
    x_zero_point's type); sub-byte codes are unpacked piece by piece, never as a whole
    array. `n_threads` overrides the default thread count; the bits never depend on it.

    `datapath` (a `qemu_q.Datapath`, None: ONNX) reads `rounding` (of the product to the
    output type), `scale_precision` (a wider precision the product is first rounded to),
    `nan` ("canonical": one NaN code per output type) and `subnormals` (flush the small-float
    codes and the scale, and/or the result); `scale`, `nan_to_integer`, `accumulator` and
    `requantization` describe steps DequantizeLinear has not and are ignored.
    rounding="stochastic" takes `random_bits=`, a uint32 array of x's shape (one word per
    element, C order). docs/semantics.md, "Datapath options", defines each exactly.

    `x_dtype` (not an ONNX attribute): the element type of the codes x holds, for the codec
    family (from `qemu_q.integer_type`, `qemu_q.minifloat_type`): x (and
    x_zero_point) are then arrays of that type's storage dtype (docs/semantics.md, "Codec
    family"); a stored value that is not a code of the type is a ValueError. With
    packed=True, `dtype` names the type instead.
    """
    datapath = datapath_reads(as_datapath(datapath, op_type="DequantizeLinear",
                                          opset=normalize_opset(opset)))
    scale = _coerce.as_array(x_scale, "x_scale")
    zero_point = _coerce.optional_array(x_zero_point, "x_zero_point")
    packed = _coerce.flag(packed, "packed")
    opset = normalize_opset(opset)
    raw = None
    codes: np.ndarray | None
    family = _family_input(x, x_dtype, packed, dtype, shape, opset)
    if family is not None:
        codes = family[1]
        x_spec = (codes.dtype, codes.shape)
    elif packed:
        x_type, x_shape, raw = packed_input(x, dtype, shape, zero_point,
                                            label(get_spec("DequantizeLinear", opset), opset))
        if x_type.packed:
            codes = None  # read from raw by the packed kernel
        elif LITTLE_ENDIAN:
            codes = raw.view(x_type.dtype).reshape(x_shape)  # whole-byte types: a view
        else:
            codes = raw.view(x_type.dtype.newbyteorder("<")).astype(x_type.dtype).reshape(x_shape)
        x_spec = (x_type.dtype, x_shape)
    else:
        if dtype is not None or shape is not None:
            where = label(get_spec("DequantizeLinear", opset), opset)
            raise TypeError(f"{where}: dtype= and shape= describe packed input; pass packed=True")
        codes = _coerce.as_array(x, "x")
        x_spec = (codes.dtype, codes.shape)
    bits = check_random_bits(random_bits, datapath, x_spec[1], "x")
    plan = cached_plan(dequantize_plan, (
        opset, x_spec, _signature(scale), _signature(zero_point),
        _coerce.int_attribute(axis, "axis"), _coerce.int_attribute(block_size, "block_size"),
        _coerce.output_dtype(output_dtype), _dispatch.FAST_KERNELS, datapath,
    ) + ((family[0],) if family is not None else ()))
    extra = {} if bits is None else {"random_bits": bits}
    x_type, out_type = plan.x_type, plan.out_type
    size = math.prod(x_spec[1])
    n_threads = resolve_threads(n_threads, size)
    # The output is checked before anything is converted or allocated.
    y = prepare_output(out, x_spec[1], out_type,
                       [("x", codes if raw is None else raw), ("x_scale", scale), ("x_zero_point", zero_point),
                        ("random_bits", random_bits)])
    if size == 0:
        return y
    if family is not None:
        check_codes(family[1], x_type, plan.label, "x")
        if zero_point is not None and x_type.kind == "integer":
            check_codes(zero_point, x_type, plan.label, "x_zero_point")
        elif zero_point is not None:
            zero_point = zero_codes_as_values(zero_point, x_type, plan.label, "x_zero_point")
    check_zero_point_values(zero_point, x_type, plan.label, "x_zero_point")
    config = plan.kernel_config()
    params = kernel_parameters(scale, zero_point, scale.size, 0.0, config.float32_parameters,
                               zero_point_int=False)
    storage = y.reshape(-1).view(out_type.storage)
    written = kernel_output(storage)
    if codes is None:
        _dispatch.run(Path.DEQUANTIZE_PACKED, raw, *params, written, config, n_threads, **extra)
    else:
        _dispatch.run(Path.DEQUANTIZE, flat_storage(codes, x_type), *params, written, config, n_threads,
                      **extra)
    finish_output(storage, written)
    return y


def _family_input(x, x_dtype, packed: bool, dtype, shape, opset):
    """(the family type, its stored codes) when x holds codec-family codes, else None (the
    ONNX types take the usual path, x_dtype only checked against x)."""
    if x_dtype is None and (not packed or dtype is None):
        return None
    where = label(get_spec("DequantizeLinear", opset), opset)
    if packed:
        if x_dtype is not None:
            raise TypeError(f"{where}: with packed=True the element type is dtype=, not x_dtype=")
        etype = element_type(dtype, "dtype")
        if not is_family(etype):
            return None
        if etype.bits not in PACKABLE_BITS:
            raise ValueError(f"{where}: packed=True with dtype {etype.name}: codes of {etype.bits} "
                             f"bits have no ONNX raw_data layout; allowed widths "
                             f"{', '.join(map(str, PACKABLE_BITS))}")
        from .._pack import unpack_fields

        # the codes are checked with the other inputs (check_codes, naming x)
        return etype, unpack_fields(x, etype, shape, None)
    etype = element_type(x_dtype, "x_dtype")
    codes = _coerce.as_array(x, "x")
    if codes.dtype != etype.dtype:
        raise TypeError(f"{where}: x_dtype={etype.name} codes are stored as {etype.dtype}; x has dtype "
                        f"{codes.dtype}")
    if dtype is not None or shape is not None:
        raise TypeError(f"{where}: dtype= and shape= describe packed input; pass packed=True")
    return (etype, codes) if is_family(etype) else None


@register("DequantizeLinear")
def _run_node(inputs, attributes, opset):
    return [dequantize_linear(*inputs, opset=opset, **attributes)]
