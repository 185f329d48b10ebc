"""NVFP4: float4e2m1 elements, one float8e4m3fn scale per block of 16 (or per 16x16 tile)
and one float32 tensor scale, quantized by a named recipe's float32 operation order
(TransformerEngine, torchao, ModelOpt) and dequantized as the two-DequantizeLinear ONNX
graph. The recipes, line by line with their sources, are in docs/semantics.md ("NVFP4");
the kernel in pyx/_nvfp4.pyx.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from .. import _coerce, _dispatch
from .._buffers import finish_output, flat_storage, kernel_output
from .._dispatch import Path
from .._dtypes import ELEMENT_TYPES, element_type
from .._pack import pack
from .._threads import in_default_fp_environment, resolve_threads
from .._typing import Array, TypeSpec
from ..datapath import ONNX, ROUND_CODES, Datapath, as_datapath
from .dequantize_linear import dequantize_linear

RECIPES = ("transformer_engine", "torchao", "modelopt")
BLOCK_SHAPES = ((1, 16), (16, 16))
BLOCK = 16

_FLOAT4 = ELEMENT_TYPES["float4e2m1"]
_E4M3 = ELEMENT_TYPES["float8e4m3fn"]
# Inputs whose every value is a float32 value: converted exactly.
_INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@dataclass(frozen=True)
class NVFP4Plan(_dispatch.KernelPlan):
    # kernel_fields: pyx/_nvfp4.pyx's NVFP4Config, less the global amax (per call).
    PATH = Path.NVFP4_QUANTIZE
    CONFIG_CLASS = "NVFP4Config"


def _recipe(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"recipe must be a str, got {type(value).__name__} {value!r}")
    if value not in RECIPES:
        raise ValueError(f"recipe={value!r}; allowed {', '.join(map(repr, RECIPES))}")
    return value


def _block_shape(value, ndim: int) -> tuple[int, int]:
    try:
        shape = tuple(_coerce.int_attribute(v, "block_shape") for v in value)
    except TypeError:
        raise TypeError(f"block_shape must be a pair of ints, got {type(value).__name__} {value!r}") from None
    if shape not in BLOCK_SHAPES:
        raise ValueError(f"block_shape={value!r}; allowed (1, 16) (1-D blocks) or (16, 16) (2-D tiles)")
    if shape == (16, 16) and ndim != 2:
        raise ValueError(f"block_shape=(16, 16) tiles a 2-D tensor; x has {ndim} dimensions")
    return shape


def _axis(value, ndim: int) -> int:
    return _coerce.block_axis(value, ndim, "NVFP4 blocks")


def _layout(shape, axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def scales_shape(shape, axis: int) -> tuple[int, ...]:
    """The shape of the block scales of a tensor of `shape` blocked along `axis`: the shape
    DequantizeLinear-24 expects with block_size=16 (a last partial block included)."""
    return tuple(-(-n // BLOCK) if d == axis else n for d, n in enumerate(shape))


# How each recipe forms its element: x times a float32 reciprocal factor, or x divided
# by the float32 scale product (docs/semantics.md, "NVFP4").
RECIPE_SCALE = {"transformer_engine": "reciprocal", "torchao": "reciprocal", "modelopt": "divide"}


# The smallest normal of x's dtype (datapath subnormals="flush_inputs"): float16's, else
# float32's (bfloat16 shares float32's exponent range).
_X_MIN_NORMAL = {np.dtype(np.float16): 2.0 ** -14}


def datapath_rounding(datapath, recipe: str) -> int:
    """The kernel's rounding code of the element under `datapath`, after checking the
    options a recipe fixes (docs/semantics.md, "Datapath options", NVFP4): `scale` other
    than the default must be the recipe's own (TE and torchao multiply by a reciprocal,
    ModelOpt divides), `scale_precision` None or "float32" (every recipe is a sequence of
    float32 operations, several of them divisions: "float64" names no one of them, and
    making them all float64 is another recipe); a conflict is a ValueError naming both.
    `subnormals` is read by the kernel (x flushed, the e2m1 result flushed). `nan` changes nothing (e2m1 has no NaN; the e4m3 NaN scale
    every recipe writes is 0x7F, the canonical code); nan_to_integer, accumulator and
    requantization describe steps NVFP4 lacks."""
    datapath = as_datapath(datapath)
    if datapath.scale != ONNX.scale and datapath.scale != RECIPE_SCALE[recipe]:
        raise ValueError(f"nvfp4_quantize: datapath scale={datapath.scale!r} conflicts with recipe="
                         f"{recipe!r}, which forms its element by {RECIPE_SCALE[recipe]!r}")
    # "promoted": numpy's promotion of the recipes' float32 operands is float32
    if datapath.scale_precision not in (None, "float32", "promoted"):
        raise ValueError(f"nvfp4_quantize: datapath scale_precision={datapath.scale_precision!r} "
                         f"conflicts with recipe={recipe!r}, which computes in float32 "
                         "(allowed: None, 'float32' or 'promoted')")
    if datapath.nan == "zero_opposite_sign":
        raise ValueError(f"nvfp4_quantize: datapath nan='zero_opposite_sign' conflicts with "
                         f"recipe={recipe!r}, which writes its own e2m1 code for a NaN element "
                         "(allowed: 'spec' or 'canonical')")
    return ROUND_CODES[datapath.rounding]


@lru_cache(maxsize=256)
def nvfp4_plan(recipe: str, shape: tuple, axis: int, block_shape: tuple) -> NVFP4Plan:
    outer, length, inner = _layout(shape, axis)
    tile_outer = tile_inner = 1
    if block_shape == (16, 16):
        # a 2-D tensor: the tile's other side is the other dimension
        if axis == 1:
            tile_outer = BLOCK
        else:
            tile_inner = BLOCK
    fields = dict(recipe=recipe, outer=outer, length=length, inner=inner,
                  tile_outer=tile_outer, tile_inner=tile_inner)
    return NVFP4Plan(f"nvfp4_quantize({recipe})", ELEMENT_TYPES["float"], _FLOAT4, tuple(fields.items()))


def tensor_amax(x: np.ndarray, recipe: str) -> np.float32:
    """The tensor amax a recipe reduces when the caller gives none: TransformerEngine's
    fmaxf reduction from 0 (NaN never wins; an empty or all-NaN tensor gives 0); torch's
    max(abs(x)) for torchao and ModelOpt (NaN propagates; an empty tensor gives 0)."""
    flat = np.abs(x.reshape(-1))
    if recipe == "transformer_engine":
        return np.float32(np.fmax.reduce(flat, initial=np.float32(0.0)))
    if flat.size == 0:
        return np.float32(0.0)
    if np.isnan(flat).any():
        return np.float32(np.nan)
    return np.float32(flat.max())


def _global_amax(value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating, np.ndarray)):
        raise TypeError(f"global_amax must be a real number or a 0-d float array, got {type(value).__name__} {value!r}")
    if isinstance(value, np.ndarray):
        if value.shape not in ((), (1,)) or value.dtype.kind != "f":
            raise ValueError(f"global_amax must be a scalar float32 value, got an array of dtype {value.dtype} and shape {value.shape}")
        value = value.reshape(-1)[0]
    number = float(value)
    as_f32 = np.float32(number)
    if not (math.isnan(number) or float(as_f32) == number):
        raise ValueError(f"global_amax={number!r} is not a float32 value; pass np.float32(...) to round it yourself")
    if number < 0 or (number == 0 and math.copysign(1.0, number) < 0):
        # -0.0 too: no amax is -0, and the recipes' arithmetic would carry its sign
        # (torchao: 1 / -0 = -inf, every code's sign flipped)
        raise ValueError(f"global_amax={number!r} is negative; an amax is >= 0, +0.0 not -0.0 "
                         "(NaN and inf allowed: each recipe defines them)")
    return float(as_f32)


def _input(x) -> np.ndarray:
    x = _coerce.as_array(x, "x")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; nvfp4_quantize takes float32, float16 or bfloat16")
    return x


def _outputs(out, shape, s_shape, packed: bool, inputs):
    # inputs: (name, array) pairs the outputs must not overlap
    if out is None:
        return None, None
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(f"out must be None or a tuple (codes, block_scales), got {type(out).__name__}")
    codes, scales = out
    if packed:
        want_codes = ((math.prod(shape) + 1) // 2,), np.dtype(np.uint8), "uint8 (packed=True)"
    else:
        want_codes = tuple(shape), _FLOAT4.dtype, "float4_e2m1fn"
    checked = []
    for name, array, (want_shape, want_dtype, what) in (
            ("out[0] (codes)", codes, want_codes),
            ("out[1] (block_scales)", scales, (tuple(s_shape), _E4M3.dtype, "float8_e4m3fn"))):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(array).__name__}")
        array = _coerce.plain_array(array, name)
        if array.dtype != want_dtype:
            raise TypeError(f"{name} has dtype {array.dtype}; this call writes {what}")
        if array.shape != want_shape:
            raise ValueError(f"{name} has shape {array.shape}; this call writes shape {want_shape}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if not array.flags.writeable:
            raise ValueError(f"{name} is read-only")
        for input_name, input_array in inputs:
            if input_array is not None and np.may_share_memory(array, input_array):
                raise ValueError(f"{name} overlaps {input_name}; the kernel does not work in place")
        checked.append(array)
    codes, scales = checked
    if np.may_share_memory(codes, scales):
        raise ValueError("out[0] and out[1] overlap")
    return codes, scales


@in_default_fp_environment
def nvfp4_quantize(x: Array, *, recipe: str = "transformer_engine", axis: int = -1,
                   block_shape: tuple[int, int] = (1, 16), global_amax=None,
                   out: tuple[np.ndarray, np.ndarray] | None = None, packed: bool = False,
                   n_threads: int | None = None, datapath: Datapath | None = None,
                   random_bits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NVFP4 quantization of x by `recipe` ("transformer_engine", "torchao", "modelopt").

    Returns (codes, block_scales, global_scale): codes float4_e2m1fn of x's shape (or, with
    packed=True, their ONNX raw_data bytes as quantize_linear(packed=True) writes them),
    block_scales float8_e4m3fn of x's shape with the `axis` dimension cut to ceil(n / 16)
    (the blocked shape DequantizeLinear-24 takes; a last partial block allowed), and
    global_scale the float32 decode scale (a 0-d array): nvfp4_dequantize, the ONNX graph
    DequantizeLinear(codes, DequantizeLinear(block_scales, global_scale), block_size=16),
    gives the dequantized tensor.

    block_shape=(16, 16) tiles a 2-D x as TransformerEngine does for weights: one scale per
    16x16 tile, repeated over the tile's 16 rows of block_scales. global_amax=None reduces
    the tensor amax by the recipe's rule; a given value must be a float32 value >= 0 (or NaN
    or inf). x may be float32, float16 or bfloat16 (exactly float32 values). Every step is
    in docs/semantics.md ("NVFP4"). `datapath` (a qemu_q.Datapath) changes the rounding of
    the element into e2m1 (with "stochastic", `random_bits`: a uint32 array of x's shape);
    options the recipe fixes must agree with it (docs/semantics.md, "Datapath options").
    """
    from ..datapath import check_random_bits

    x = _input(x)
    recipe = _recipe(recipe)
    datapath = as_datapath(datapath)
    rounding = datapath_rounding(datapath, recipe)
    words = check_random_bits(random_bits, datapath, x.shape, "x")
    extra = () if words is None else (words,)
    axis_ = _axis(axis, x.ndim)
    shape_ = _block_shape(block_shape, x.ndim)
    packed = _coerce.flag(packed, "packed")
    s_shape = scales_shape(x.shape, axis_)
    codes_out, scales_out = _outputs(out, x.shape, s_shape, packed, [("x", x), ("random_bits", random_bits)])
    x32 = x if x.dtype == np.float32 else x.astype(np.float32)
    # datapath subnormals="flush_inputs"/"flush_both": x below its type's smallest normal is
    # read as a zero of its sign, by the tensor amax, the block amax and the element alike
    x_min_normal = (_X_MIN_NORMAL.get(x.dtype, 2.0 ** -126) if datapath.flush_inputs else 0.0)
    amax: float
    if global_amax is None:
        amax = float(tensor_amax(x32, recipe))
        # the flushed tensor's amax: the same, but where every non-NaN magnitude is subnormal
        if amax < x_min_normal:
            amax = 0.0
    else:
        amax = _global_amax(global_amax)
    plan = nvfp4_plan(recipe, x.shape, axis_, shape_)
    n_threads = resolve_threads(n_threads, x.size)
    module = _dispatch.entry_module(Path.NVFP4_QUANTIZE)
    config = module.NVFP4Config(global_amax=float(amax), rounding=rounding, x_min_normal=x_min_normal,
                                flush_outputs=datapath.flush_outputs, **dict(plan.kernel_fields))
    codes = np.empty(x.shape, dtype=_FLOAT4.dtype) if (codes_out is None or packed) else codes_out
    scales = np.empty(s_shape, dtype=_E4M3.dtype) if scales_out is None else scales_out
    if x.size:
        code_storage = codes.reshape(-1).view(np.uint8)
        scale_storage = scales.reshape(-1).view(np.uint8)
        _dispatch.run(Path.NVFP4_QUANTIZE, flat_storage(x32, ELEMENT_TYPES["float"]),
                      code_storage, scale_storage, config, n_threads, *extra)
    global_scale = np.array(config.global_scale, dtype=np.float32)
    if packed:
        codes = pack(codes, out=codes_out)
    return codes, scales, global_scale


def _global_scale_array(value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, np.floating):
        array = np.asarray(value)
    else:
        raise TypeError(f"global_scale must be a float32 numpy scalar or 0-d array, got {type(value).__name__} {value!r}")
    if array.dtype != np.float32:
        raise TypeError(f"global_scale has dtype {array.dtype}; NVFP4's tensor scale is float32")
    if array.shape not in ((), (1,)):
        raise ValueError(f"global_scale has shape {array.shape}; it is one value (shape () or (1,))")
    return array.reshape(())


@in_default_fp_environment
def nvfp4_dequantize(codes: Array, block_scales: Array, global_scale: Array, *, axis: int = -1,
                     block_shape: tuple[int, int] = (1, 16),
                     output_dtype: TypeSpec = np.float32) -> np.ndarray:
    """The NVFP4 dequantization graph of ONNX: the float32 block scales
    DequantizeLinear(block_scales, global_scale) feeding DequantizeLinear-24 of the float4
    codes with block_size=16 along `axis`; computed by qemu_q.dequantize_linear twice, so the
    bits are the graph's. `output_dtype` is the second node's (float32, float16, bfloat16).
    block_shape=(16, 16) block scales are TransformerEngine's 2-D layout, one row per row of
    codes, so the same graph dequantizes them."""
    codes = _coerce.as_array(codes, "codes")
    block_scales = _coerce.as_array(block_scales, "block_scales")
    if codes.dtype != _FLOAT4.dtype:
        raise TypeError(f"codes has dtype {codes.dtype}; NVFP4 codes are float4_e2m1fn")
    if block_scales.dtype != _E4M3.dtype:
        raise TypeError(f"block_scales has dtype {block_scales.dtype}; NVFP4 block scales are float8_e4m3fn")
    scale = _global_scale_array(global_scale)
    axis_ = _axis(axis, codes.ndim)
    _block_shape(block_shape, codes.ndim)
    want = scales_shape(codes.shape, axis_)
    if block_scales.shape != want:
        raise ValueError(
            f"block_scales has shape {block_scales.shape}; codes of shape {codes.shape} blocked "
            f"by 16 along axis {axis_} take shape {want}"
        )
    block_float = dequantize_linear(block_scales, scale, axis=0)
    return dequantize_linear(codes, block_float, axis=axis_, block_size=BLOCK, output_dtype=output_dtype)


@in_default_fp_environment
def nvfp4_global_scale(global_amax, *, recipe: str = "transformer_engine") -> np.ndarray:
    """The float32 decode scale `recipe` derives from a tensor amax (0-d array)."""
    recipe = _recipe(recipe)
    amax = _global_amax(global_amax)
    return np.array(_dispatch.entry_module(Path.NVFP4_QUANTIZE).global_scale(recipe, amax), dtype=np.float32)


def dequantize_model(codes_shape, *, axis: int = -1, output_dtype: TypeSpec = np.float32,
                     opset: int = 24):
    """The ONNX model of the NVFP4 dequantization graph (inputs "codes" float4e2m1 of
    `codes_shape`, "block_scales" float8e4m3fn of the blocked shape, "global_scale" float32
    scalar; output "y"): what a golden case writes and onnx.reference runs. Needs onnx."""
    from ..golden.writers import import_onnx

    onnx = import_onnx()
    helper, TensorProto = onnx.helper, onnx.TensorProto
    shape = tuple(int(n) for n in codes_shape)
    axis_ = _axis(axis, len(shape))
    out_type = element_type(output_dtype, "output_dtype")
    if out_type.name not in ("float", "float16", "bfloat16"):
        raise ValueError(f"output_dtype={out_type.name}; allowed float32, float16, bfloat16")
    if opset < 24:
        raise ValueError(f"opset={opset}: float4e2m1 blocked DequantizeLinear needs opset 24 or newer")
    nodes = [
        helper.make_node("DequantizeLinear", ["block_scales", "global_scale"], ["block_scale_f32"]),
        helper.make_node("DequantizeLinear", ["codes", "block_scale_f32"], ["y"], axis=axis_,
                         block_size=BLOCK, output_dtype=out_type.onnx_id),
    ]
    graph = helper.make_graph(
        nodes, "nvfp4_dequantize",
        [helper.make_tensor_value_info("codes", TensorProto.FLOAT4E2M1, shape),
         helper.make_tensor_value_info("block_scales", TensorProto.FLOAT8E4M3FN, scales_shape(shape, axis_)),
         helper.make_tensor_value_info("global_scale", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", out_type.onnx_id, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
