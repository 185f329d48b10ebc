"""Golden cases of the block-scaled formats: OCP MX (`mx_quantize`, every element type x
scale rule) and NVFP4 (`nvfp4_quantize`, every recipe, 1x16 blocks and 16x16 tiles).

No ONNX op quantizes to these formats; each case is the ONNX graph that dequantizes them
(DequantizeLinear-24 / 28 with a float8e8m0 scale, or NVFP4's two DequantizeLinear nodes),
fed the codes and scales qemu_q computed, with the dequantized tensor as the expected
output and the original float input as an extra (.npz `extra_x`, hex `extra_0.hex`).

Each case's blocks stress one thing (its family): block maxima one and two float32 ulps
around powers of two and around the element's largest value times a power of two (where
the scale rules part), ties of the element grid, one outlier, zero and subnormal blocks,
NaN and inf, random data with a partial last block.
"""

from __future__ import annotations

import math

import numpy as np


BLOCK_SCALED_OPS = ("MX", "NVFP4")
BLOCK_SCALED_FAMILIES = ("boundaries", "ties", "outlier", "zeros", "subnormals", "nan_inf",
                         "random")
MX_BLOCK = 32
NVFP4_BLOCK = 16


def block_scaled_versions(op_type: str) -> tuple[int, ...]:
    """The opsets of the dequantize graphs (float6 elements need DequantizeLinear-28)."""
    return (24, 28) if op_type == "MX" else (24,)


def block_scaled_configs(op_type: str, version: int):
    from .. import MX_ELEMENTS, MX_SCALE_RULES
    from ..ops.nvfp4 import RECIPES
    from .configs import Config

    if op_type == "MX":
        for element, info in MX_ELEMENTS.items():
            if info.dequantize_opset != version:
                continue
            for rule in MX_SCALE_RULES:
                for family in BLOCK_SCALED_FAMILIES:
                    yield Config(op_type="MX", version=version, qtype=element, family=family,
                                 variant=rule, granularity="blocked", zero_point=False,
                                 scale_type="float8e8m0")
        return
    for recipe in RECIPES:
        for tiles in (False, True):
            for family in BLOCK_SCALED_FAMILIES:
                yield Config(op_type="NVFP4", version=version, qtype="float4e2m1",
                             family=family, variant=recipe + ("_tiles16x16" if tiles else ""),
                             granularity="blocked", zero_point=False,
                             scale_type="float8e4m3fn")


# --------------------------------------------------------------------------------------
# Inputs

def _f32_neighbours(value: float, steps: int) -> np.ndarray:
    """value and its `steps` float32 neighbours each side."""
    x = np.float32(value)
    out = [x]
    up = down = x
    for _ in range(steps):
        up = np.nextafter(up, np.float32(np.inf))
        down = np.nextafter(down, np.float32(0))
        out += [up, down]
    return np.array(out, dtype=np.float32)


def _block_with_max(amax: float, size: int, rng) -> np.ndarray:
    """`size` values in [-amax, amax] whose largest magnitude is exactly amax (float32)."""
    block = (rng.uniform(-1.0, 1.0, size) * amax).astype(np.float32)
    block[rng.integers(0, size)] = np.float32(amax) * (1 if rng.random() < 0.5 else -1)
    return block


def _element_grid(c) -> tuple[float, np.ndarray]:
    """(largest value, positive midpoints of the element grid)."""
    import ml_dtypes

    if c.qtype == "int8":  # MXINT8: k * 2^-6, |k| <= 127
        values = np.arange(0, 128) / 64.0
    else:
        dtype = {"float8e4m3fn": ml_dtypes.float8_e4m3fn, "float8e5m2": ml_dtypes.float8_e5m2,
                 "float6e2m3": ml_dtypes.float6_e2m3fn, "float6e3m2": ml_dtypes.float6_e3m2fn,
                 "float4e2m1": ml_dtypes.float4_e2m1fn}[c.qtype]
        bits = {"float6e2m3": 6, "float6e3m2": 6, "float4e2m1": 4}.get(c.qtype, 8)
        codes = np.arange(1 << bits, dtype=np.uint8)
        values = codes.view(dtype).astype(np.float64)
        values = np.unique(values[np.isfinite(values) & (values >= 0)])
    return float(values[-1]), (values[:-1] + values[1:]) / 2


def _blocks(c, block: int, count: int, rng) -> list[np.ndarray]:
    top, midpoints = _element_grid(c)
    if c.family == "boundaries":
        centres = [2.0 ** k for k in (-3, 0, 5)] + [top * 2.0 ** k for k in (-4, 0, 3)]
        amaxes = np.concatenate([_f32_neighbours(v, 2) for v in centres])
        return [_block_with_max(float(a), block, rng) for a in amaxes[:count * 4]]
    if c.family == "ties":
        out = []
        for k in (-2, 0, 3):
            scale = 2.0 ** k  # a block maximum of top * scale: elements x / scale on the grid
            picks = midpoints[rng.integers(0, midpoints.size, block)] * scale
            picks *= np.where(rng.random(block) < 0.5, -1.0, 1.0)
            picks[0] = top * scale
            out.append(picks.astype(np.float32))
        return out
    if c.family == "outlier":
        data = [rng.standard_normal(block).astype(np.float32) for _ in range(count)]
        data[1][3] = np.float32(1e6)
        return data
    if c.family == "zeros":
        return [np.zeros(block, np.float32), np.full(block, -0.0, np.float32),
                np.where(rng.random(block) < 0.5, 0.0, -0.0).astype(np.float32),
                _block_with_max(1.0, block, rng)]
    if c.family == "subnormals":
        tiny = np.float32(1e-45)
        return [(rng.integers(-200, 200, block) * tiny).astype(np.float32),
                _block_with_max(float(np.finfo(np.float32).smallest_normal), block, rng),
                np.concatenate([[np.float32(2.0 ** -100)],
                                (rng.integers(-9, 9, block - 1) * tiny)]).astype(np.float32)]
    if c.family == "nan_inf":
        blocks = [_block_with_max(2.0, block, rng) for _ in range(4)]
        blocks[0][5] = np.nan
        blocks[1][0] = np.inf
        blocks[2][block - 1] = -np.inf
        return blocks
    if c.family == "random":
        return [(rng.standard_normal(block) * 2.0 ** rng.integers(-8, 8)).astype(np.float32)
                for _ in range(count)]
    raise ValueError(f"{c.op_type} has no input family {c.family!r}")


def block_scaled_x(c, rng) -> np.ndarray:
    """The float32 input: rows of whole blocks plus a partial last block (1x16 and MX),
    or whole 16x16 tiles plus partial ones (NVFP4 tiles)."""
    block = MX_BLOCK if c.op_type == "MX" else NVFP4_BLOCK
    blocks = _blocks(c, block, 4, rng)
    if c.variant.endswith("_tiles16x16"):
        rows = 24  # one whole and one partial tile row
        flat = np.concatenate(blocks + [rng.standard_normal(block).astype(np.float32)])
        cols = 40
        need = rows * cols
        flat = np.resize(flat, need)
        return np.ascontiguousarray(flat.reshape(rows, cols))
    per_row = 3
    rows = math.ceil(len(blocks) / per_row)
    padded = blocks + [rng.standard_normal(block).astype(np.float32)
                       for _ in range(rows * per_row - len(blocks))]
    matrix = np.stack(padded).reshape(rows, per_row * block)
    partial = (rng.standard_normal((rows, block // 2)) * 3).astype(np.float32)
    return np.ascontiguousarray(np.concatenate([matrix, partial], axis=1))


def block_scaled_case(c, rng, datapath=None, seed: int = 0):
    """(inputs, outputs, extras, model builder) of an MX or NVFP4 case: the quantizer
    runs under the suite's datapath (`datapaths.call_op`), y is the ONNX dequantize graph
    of its codes. With stochastic rounding the quantizer's words (one per element of x,
    datapaths.RANDOM_BITS_RULE) are the extra `random_bits`, beside the extra `x`."""
    from .. import mx_dequantize, mx_dequantize_graph, mx_quantize, nvfp4_dequantize, nvfp4_quantize
    from ..datapath import as_datapath
    from ..ops.nvfp4 import dequantize_model
    from .datapaths import RANDOM_BITS_INPUT, call_op, random_bits_for

    x = block_scaled_x(c, rng)
    extras = [("x", x)]
    bits = None
    if as_datapath(datapath).rounding == "stochastic":
        bits = random_bits_for(seed, c.name, x.shape)
        extras.append((RANDOM_BITS_INPUT, bits))
    if c.op_type == "MX":
        codes, scales = call_op(mx_quantize, x, c.qtype, axis=-1, block_size=MX_BLOCK,
                                scale_rule=c.variant, datapath=datapath, random_bits=bits)
        # The expected y is the ONNX dequantize graph of the codes (mx_dequantize and
        # nvfp4_dequantize take no datapath=: the datapath describes the quantizer).
        y = mx_dequantize(codes, scales, axis=-1, block_size=MX_BLOCK)
        graph = mx_dequantize_graph(c.qtype, axis=-1, block_size=MX_BLOCK)
        inputs = [("codes", codes), ("scales", scales)]
        return inputs, [("y", y)], extras, lambda: _graph_model(graph, inputs, y)
    recipe = c.variant.replace("_tiles16x16", "")
    block_shape = (16, 16) if c.variant.endswith("_tiles16x16") else (1, 16)
    codes, block_scales, global_scale = call_op(nvfp4_quantize, x, recipe=recipe, axis=-1,
                                                block_shape=block_shape, datapath=datapath,
                                                random_bits=bits)
    y = nvfp4_dequantize(codes, block_scales, global_scale, axis=-1)
    inputs = [("codes", codes), ("block_scales", block_scales), ("global_scale", global_scale)]
    return inputs, [("y", y)], extras, lambda: dequantize_model(codes.shape, axis=-1,
                                                                     opset=c.version)


def _graph_model(graph: dict, inputs, y):
    """The ModelProto of an `mx_dequantize_graph` description."""
    from .writers import import_onnx, tensor_type

    onnx = import_onnx()
    helper = onnx.helper
    nodes = [helper.make_node(op, node_inputs, node_outputs, **attributes)
             for op, node_inputs, node_outputs, attributes in graph["nodes"]]
    initializers = [onnx.numpy_helper.from_array(array, name)
                    for name, array in graph["initializers"].items()]
    graph_inputs = [helper.make_tensor_value_info(name, tensor_type(array).onnx_id,
                                                  list(array.shape)) for name, array in inputs]
    output = helper.make_tensor_value_info(graph["output"][0], tensor_type(y).onnx_id,
                                           list(y.shape))
    proto = helper.make_graph(nodes, "mx_dequantize", graph_inputs, [output],
                              initializer=initializers)
    return helper.make_model(proto, opset_imports=[helper.make_opsetid("", graph["opset"])])
