"""OCP Microscaling (MX v1.0): mx_quantize chooses each block's shared float8e8m0 scale
from the block's amax by a named rule and converts the elements; mx_dequantize is
DequantizeLinear-24+ with that scale and block_size (one code path: dequantize_linear).

The rules are in docs/semantics.md ("MX"); the kernel in pyx/_mx.pyx.
"""

from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import ml_dtypes
import numpy as np

from .. import _coerce, _dispatch
from .._buffers import flat_storage
from .._dispatch import Path
from .._dtypes import ELEMENT_TYPES, ElementType, element_type
from .._pack import normalize_shape, packed_size
from .._threads import in_default_fp_environment, resolve_threads
from .._typing import Array, Shape, TypeSpec
from .._validate import cached_plan, signature as _signature
from ..datapath import Datapath, ROUND_CODES, as_datapath
from .cast import cast
from .dequantize_linear import dequantize_linear


@dataclass(frozen=True)
class MXElement:
    """An MX element format as the scale rules read it (OCP v1.0, section 5)."""
    name: str           # the ONNX type name of the codes
    emax: int           # emax_elem: the exponent of the largest normal
    max_value: Fraction # the largest magnitude
    fraction_bits: int  # mantissa bits (MXINT8: 6, the fraction bits of 1.6 fixed point)
    bits: int           # bits per code
    dequantize_opset: int  # the first DequantizeLinear version with an e8m0 scale and this type

    @property
    def etype(self) -> ElementType:
        return ELEMENT_TYPES[self.name]


MX_ELEMENTS: dict[str, MXElement] = {e.name: e for e in (
    MXElement("float8e4m3fn", 8, Fraction(448), 3, 8, 24),
    MXElement("float8e5m2", 15, Fraction(57344), 2, 8, 24),
    MXElement("float6e2m3", 2, Fraction(15, 2), 3, 6, 28),
    MXElement("float6e3m2", 4, Fraction(28), 2, 6, 28),
    MXElement("float4e2m1", 2, Fraction(6), 1, 4, 24),
    MXElement("int8", 0, Fraction(127, 64), 6, 8, 24),
)}
# MXINT8: an element's value is its two's-complement code times 2**-6 (OCP v1.0, 5.3).
MXINT8_IMPLIED_SCALE = Fraction(1, 64)
MX_SCALE_RULES = ("floor", "ceil", "even", "rceil", "rceil_f32")
_OUTPUT_DTYPES = ("float", "float16", "bfloat16")
_X_TYPES = {ELEMENT_TYPES[n].dtype: ELEMENT_TYPES[n] for n in _OUTPUT_DTYPES}


def mx_element(element: TypeSpec) -> MXElement:
    """The MX element format named by `element` (a type name, an ONNX data-type int or a
    dtype): float8e4m3fn, float8e5m2, float6e2m3, float6e3m2, float4e2m1, int8 (MXINT8)."""
    allowed = ", ".join(MX_ELEMENTS)
    try:
        etype = element_type(element, "element")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error}; MX elements: {allowed}") from None
    found = MX_ELEMENTS.get(etype.name)
    if found is None:
        raise ValueError(f"element={element!r} ({etype.name}) is not an MX element format; allowed: {allowed}")
    return found


def mx_scale_shape(shape: Shape, axis: int, block_size: int) -> tuple[int, ...]:
    """The shape of the scales of an x of `shape`: the axis dimension becomes
    ceil(D / block_size), as DequantizeLinear-24's blocked x_scale."""
    shape = normalize_shape(shape, "shape")
    axis = _axis(axis, len(shape))
    block_size = _block_size(block_size)
    return shape[:axis] + (-(-shape[axis] // block_size),) + shape[axis + 1:]


def mx_dequantize_graph(element: TypeSpec, *, axis: int = -1, block_size: int = 32,
                        output_dtype: TypeSpec = "float") -> dict:
    """The ONNX graph mx_dequantize computes, as data a model builder turns into nodes:
    {"opset", "inputs" (name, type), "output", "nodes": [(op_type, inputs, outputs,
    attributes)], "initializers": {name: np.ndarray}}. Float elements: one
    DequantizeLinear(codes, scales, axis, block_size, output_dtype). MXINT8: the scales are
    first Cast to float32 and multiplied by the implied 2**-6 (both exact), then
    DequantizeLinear with that float32 scale."""
    e = mx_element(element)
    out_type = _output_type(output_dtype)
    attributes = {"axis": _coerce.int_attribute(axis, "axis"),
                  "block_size": _block_size(block_size), "output_dtype": out_type.onnx_id}
    if e.name != "int8":
        nodes = [("DequantizeLinear", ["codes", "scales"], ["y"], attributes)]
        initializers = {}
    else:
        nodes = [
            ("Cast", ["scales"], ["scales_f32"], {"to": ELEMENT_TYPES["float"].onnx_id}),
            ("Mul", ["scales_f32", "implied_scale"], ["element_scales"], {}),
            ("DequantizeLinear", ["codes", "element_scales"], ["y"], attributes),
        ]
        initializers = {"implied_scale": np.array(float(MXINT8_IMPLIED_SCALE), dtype=np.float32)}
    return {"opset": e.dequantize_opset, "inputs": [("codes", e.name), ("scales", "float8e8m0")],
            "output": ("y", out_type.name), "nodes": nodes, "initializers": initializers}


def _axis(axis, rank: int) -> int:
    return _coerce.block_axis(axis, rank, "MX blocks")


def _block_size(block_size) -> int:
    block_size = _coerce.int_attribute(block_size, "block_size")
    if block_size < 1:
        raise ValueError(f"block_size={block_size}; it must be >= 1 (OCP MX uses 32)")
    return block_size


def _scale_rule(rule) -> str:
    if not isinstance(rule, str):
        raise TypeError(f"scale_rule must be a str, got {type(rule).__name__} {rule!r}")
    if rule not in MX_SCALE_RULES:
        raise ValueError(f"scale_rule={rule!r}; allowed {', '.join(map(repr, MX_SCALE_RULES))}")
    return rule


def _output_type(output_dtype) -> ElementType:
    etype = element_type(output_dtype, "output_dtype")
    if etype.name not in _OUTPUT_DTYPES:
        raise ValueError(f"output_dtype={output_dtype!r} ({etype.name}); allowed float32, float16, bfloat16")
    return etype


@dataclass(frozen=True)
class MXQuantizePlan(_dispatch.KernelPlan):
    # kernel_fields: pyx/_mx.pyx's MXQuantizeConfig.
    PATH = Path.MX_QUANTIZE
    CONFIG_CLASS = "MXQuantizeConfig"
    scale_shape: tuple = ()
    fused_pack: bool = False


def _datapath_fields(datapath: Datapath, x_type: ElementType) -> dict:
    """The kernel fields of the Datapath options mx_quantize reads (docs/semantics.md,
    "Datapath options", MX): rounding, subnormals, scale_precision, nan. `scale` is read
    and changes nothing (X is a power of two: x / X and x * (1 / X) are the same exact
    value); nan_to_integer, accumulator and requantization describe steps MX lacks."""
    if datapath.nan == "zero_opposite_sign":
        # a NaN block's codes are the block rule's, not a conversion of NaN: "spec"'s
        datapath = dataclasses.replace(datapath, nan="spec")
    if datapath.is_onnx or dataclasses.replace(datapath, float8_encoder="exact").is_onnx:
        return {}  # (float8_encoder is Cast's and QuantizeLinear's: MX ignores it)
    return dict(rounding=ROUND_CODES[datapath.rounding], flush_inputs=datapath.flush_inputs,
                flush_below=0x38800000 if x_type.name == "float16" else 0x00800000,
                flush_outputs=datapath.flush_outputs,
                # "promoted": numpy divides float32, float16 and bfloat16 by e8m0 in float32
                quotient_f32=datapath.scale_precision in ("float32", "promoted"),
                canonical_nan=datapath.nan == "canonical")


@lru_cache(maxsize=256)
def mx_quantize_plan(x_signature, element_name, axis, block_size, scale_rule, packed,
                     datapath: Datapath = Datapath()) -> MXQuantizePlan:
    dtype, shape = x_signature
    x_type = _X_TYPES.get(np.dtype(dtype))
    if x_type is None:
        why = (" (float64 would be rounded before the scale is chosen)" if np.dtype(dtype) == np.float64
               else "")
        raise TypeError(f"x has dtype {np.dtype(dtype)}; mx_quantize takes float32, float16 or "
                        f"bfloat16{why}")
    e = MX_ELEMENTS[element_name]
    axis = _axis(axis, len(shape))
    block_size = _block_size(block_size)
    scale_rule = _scale_rule(scale_rule)
    outer = math.prod(shape[:axis])
    axis_len = shape[axis]
    inner = math.prod(shape[axis + 1:])
    scale_shape = shape[:axis] + (-(-axis_len // block_size),) + shape[axis + 1:]
    # A block longer than the axis is the whole axis (one block).
    kernel_block = min(block_size, axis_len) if axis_len else 1
    code_bits = e.bits if packed and e.bits < 8 else 0
    fused = bool(code_bits) and (kernel_block * inner) % 4 == 0 and (axis_len * inner) % 4 == 0
    fields = dict(outer=outer, axis_len=max(axis_len, 1), inner=max(inner, 1), block_size=kernel_block,
                  element=-1 if e.name == "int8" else e.etype.small_float_id,
                  rule=SCALE_RULE_IDS[scale_rule], code_bits=code_bits if fused else 0,
                  **_datapath_fields(datapath, x_type))
    return MXQuantizePlan(f"mx_quantize({e.name})", x_type, e.etype, tuple(fields.items()),
                          scale_shape=scale_shape, fused_pack=fused)


def _scale_rule_ids() -> dict:
    from .. import _kernels
    return dict(_kernels.active.mx.SCALE_RULES)


SCALE_RULE_IDS = _scale_rule_ids()


def _prepare(out_array, shape, dtype, what: str, inputs) -> np.ndarray:
    if out_array is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out_array, np.ndarray):
        raise TypeError(f"out: the {what} must be a numpy array, got {type(out_array).__name__}")
    out_array = _coerce.plain_array(out_array, f"out ({what})")
    if out_array.dtype != dtype or out_array.shape != tuple(shape):
        raise ValueError(f"out: the {what} must have dtype {np.dtype(dtype)} and shape {tuple(shape)}; "
                         f"got {out_array.dtype} and {out_array.shape}")
    if not out_array.flags.c_contiguous or not out_array.flags.writeable:
        raise ValueError(f"out: the {what} must be C-contiguous and writeable")
    for name, array in inputs:
        if array is not None and np.may_share_memory(out_array, array):
            raise ValueError(f"out: the {what} overlap {name}; mx_quantize does not work in place")
    return out_array


@in_default_fp_environment
def mx_quantize(x: Array, element: TypeSpec, *, axis: int = -1, block_size: int = 32,
                scale_rule: str = "floor", packed: bool = False,
                out: tuple[np.ndarray, np.ndarray] | None = None,
                n_threads: int | None = None, datapath: Datapath | None = None,
                random_bits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX quantization: (codes, scales) with x ~ codes * scales per block.

    Blocks are `block_size` consecutive elements along `axis` (the last may be partial).
    Each block's scale X = 2**E (float8e8m0) comes from the block's amax by `scale_rule`
    ("floor": OCP v1.0 section 6.3, default; "ceil", "even", "rceil", "rceil_f32"); each
    element is x / X rounded to nearest even into `element` and clamped to its +-max.
    `element`: float8e4m3fn, float8e5m2, float6e2m3, float6e3m2, float4e2m1, or int8
    (MXINT8: the code is x / X in units of 2**-6, in [-127, 127]). `datapath` (a
    qemu_q.Datapath) changes the elements' rounding (with "stochastic", `random_bits`: a
    uint32 array of x's shape), the subnormal policy, the quotient's precision and the NaN
    code (docs/semantics.md, "Datapath options"). The scales have x's
    shape with the axis dimension ceil(D / block_size), as DequantizeLinear-24 expects.
    With packed=True the codes are their ONNX raw_data (1-D uint8). `out` = (codes,
    scales) receives the result. The rules are in docs/semantics.md ("MX").
    """
    from ..datapath import check_random_bits

    x = _coerce.as_array(x, "x")
    e = mx_element(element)
    packed = _coerce.flag(packed, "packed")
    datapath = as_datapath(datapath)
    plan = cached_plan(mx_quantize_plan, (_signature(x), e.name, _coerce.int_attribute(axis, "axis"),
                           _coerce.int_attribute(block_size, "block_size"), scale_rule, packed, datapath))
    words = check_random_bits(random_bits, datapath, x.shape, "x")
    extra = () if words is None else (words,)
    if out is not None and (not isinstance(out, tuple) or len(out) != 2):
        raise TypeError(f"out must be a tuple (codes, scales) of numpy arrays, got {type(out).__name__}")
    codes_out, scales_out = out if out is not None else (None, None)
    inputs = [("x", x), ("random_bits", random_bits)]
    if packed:
        codes = _prepare(codes_out, (packed_size(e.etype, x.size),), np.uint8, "codes", inputs)
    else:
        codes = _prepare(codes_out, x.shape, e.etype.dtype, "codes", inputs)
    scales = _prepare(scales_out, plan.scale_shape, ml_dtypes.float8_e8m0fnu, "scales",
                      inputs + [("codes", codes)])
    if x.size == 0:
        return codes, scales
    n_threads = resolve_threads(n_threads, x.size)
    if plan.x_type.name == "float":
        flat = flat_storage(x, plan.x_type)
    else:
        # float16 and bfloat16 values are float32 values: widening is exact.
        flat = np.ascontiguousarray(x).astype(np.float32).reshape(-1)
    config = plan.kernel_config()
    scale_bytes = scales.reshape(-1).view(np.uint8)
    if packed and plan.fused_pack:
        _dispatch.run(Path.MX_QUANTIZE, flat, codes, scale_bytes, config, n_threads, *extra)
    elif packed and e.bits < 8:
        one_per_byte = np.empty(x.size, dtype=np.uint8)
        _dispatch.run(Path.MX_QUANTIZE, flat, one_per_byte, scale_bytes, config, n_threads, *extra)
        _dispatch.run(Path.PACK, one_per_byte, codes, e.bits, n_threads)
    else:
        _dispatch.run(Path.MX_QUANTIZE, flat, codes.reshape(-1).view(np.uint8), scale_bytes, config,
                      n_threads, *extra)
    return codes, scales


@in_default_fp_environment
def mx_dequantize(codes: Array | bytes, scales: Array, *, axis: int = -1, block_size: int = 32,
                  output_dtype: TypeSpec = "float", packed: bool = False,
                  element: TypeSpec | None = None, shape: Shape | None = None,
                  out: np.ndarray | None = None, n_threads: int | None = None) -> np.ndarray:
    """OCP MX dequantization: DequantizeLinear-24+ (28 for float6) of the codes with the
    float8e8m0 scales and block_size, through qemu_q.dequantize_linear.

    MXINT8 (int8 codes): an element is code * 2**-6, so the scales are first Cast to
    float32 and multiplied by 2**-6 (both exact), then DequantizeLinear runs with that
    float32 scale: the graph of `mx_dequantize_graph`. With packed=True, `codes` is the
    raw_data and `element` and `shape` describe it.
    """
    scales = _coerce.as_array(scales, "scales")
    if scales.dtype != ml_dtypes.float8_e8m0fnu:
        raise TypeError(f"scales has dtype {scales.dtype}; MX scales are float8_e8m0fnu")
    packed = _coerce.flag(packed, "packed")
    if packed:
        if element is None or shape is None:
            raise TypeError("mx_dequantize: packed=True needs element= and shape= (the bytes carry neither)")
        e = mx_element(element)
    else:
        if element is not None or shape is not None:
            raise TypeError("mx_dequantize: element= and shape= describe packed codes; pass packed=True")
        codes = _coerce.as_array(codes, "codes")
        try:
            e = mx_element(codes.dtype)
        except (TypeError, ValueError):
            raise TypeError(f"codes has dtype {codes.dtype}; MX codes are "
                            f"{', '.join(str(MX_ELEMENTS[n].etype.dtype) for n in MX_ELEMENTS)}") from None
    out_type = _output_type(output_dtype)
    block_size = _block_size(block_size)
    scale = scales
    if e.name == "int8":
        # Cast(float8e8m0 -> float32) then Mul(2**-6), the graph's two nodes: 2**(code - 127)
        # and 2**(code - 133) are float32 values for every code (the smallest is 2**-133).
        scale = cast(scales, "float", n_threads=n_threads) * np.float32(MXINT8_IMPLIED_SCALE)
    if packed:
        return dequantize_linear(codes, scale, axis=axis, block_size=block_size,
                                 output_dtype=out_type.onnx_id, opset=e.dequantize_opset, out=out,
                                 packed=True, dtype=e.name, shape=shape, n_threads=n_threads)
    return dequantize_linear(codes, scale, axis=axis, block_size=block_size, output_dtype=out_type.onnx_id,
                             opset=e.dequantize_opset, out=out, n_threads=n_threads)
