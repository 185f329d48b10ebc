"""ConvInteger-10 and QLinearConv-10: the ONNX Conv geometry (1-D to 3-D, auto_pad, pads,
strides, dilations, group), exact int32 accumulation by im2col and the integer GEMM, the
bias in the accumulator, and QLinearConv's requantization rules."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..datapath import Datapath, as_datapath, check_random_bits, integer_op_accumulator, qlinear_options
from .. import _coerce
from .._dtypes import ElementType
from .._opspec import get_spec, normalize_opset
from .._registry import register
from .._rules import integer_datapath_output_type, label
from .._threads import in_default_fp_environment, resolve_threads
from .._typing import Array
from .._validate import ArraySpec, cached_plan, signature
from . import _datapath as dp

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class ConvPlan:
    where: str
    x_type: ElementType
    w_type: ElementType
    batch: int
    channels: int
    out_channels: int
    group: int
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    out_spatial: tuple
    w_zp_per_channel: bool
    # the x86-u8s8-pairs accumulator's K order where it applies (docs/semantics.md): "nhwc"
    # (QLinearConv, uint8 x and int8 w: kernel position outer, channel inner) or "nchw"
    # (ConvInteger, int8 x and uint8 w: the filter's own order); None: exact
    pairs: str | None
    narrow: tuple | None   # (width, saturate): a named accumulator summed in k order


def _ints(value, name: str, rank: int, where: str, minimum: int) -> tuple | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{where}: {name} must be a list of ints, got {type(value).__name__} {value!r}")
    items = tuple(_coerce.int_attribute(v, name) for v in value)
    if len(items) != rank:
        raise ValueError(f"{where}: {name}={list(items)} needs {rank} values for this input")
    if any(v < minimum for v in items):
        raise ValueError(f"{where}: {name}={list(items)}; every value must be >= {minimum}")
    return items


@functools.lru_cache(maxsize=256)
def _plan(op_type, opset, x_sig, w_sig, x_zp_sig, w_zp_sig, auto_pad, dilations, group,
          kernel_shape, pads, strides, accumulator) -> ConvPlan:
    spec = get_spec(op_type, opset)
    where = label(spec, opset)
    x, w = ArraySpec(*x_sig), ArraySpec(*w_sig)
    x_type = dp.element(spec, opset, "x", x)
    w_type = dp.element(spec, opset, "w", w)
    if not 3 <= x.ndim <= 5:
        raise ValueError(f"{where}: x has shape {x.shape}; allowed [N, C, D1, ..., Dn] with n = 1, 2 or 3")
    if w.ndim != x.ndim:
        raise ValueError(f"{where}: w has shape {w.shape}; it must have x's rank {x.ndim} "
                         f"([M, C/group, k1, ..., kn])")
    rank = x.ndim - 2
    if not isinstance(auto_pad, str) or auto_pad not in AUTO_PADS:
        raise ValueError(f"{where}: auto_pad={auto_pad!r}; allowed: {', '.join(AUTO_PADS)}")
    group = _coerce.int_attribute(group, "group")
    if group < 1:
        raise ValueError(f"{where}: group={group}; it must be >= 1")
    batch, channels = x.shape[:2]
    out_channels = w.shape[0]
    if channels != group * w.shape[1]:
        raise ValueError(f"{where}: x has {channels} channels and w {w.shape[1]} per group with "
                         f"group={group}; x's channels must be group * w.shape[1]")
    if out_channels % group:
        raise ValueError(f"{where}: w has {out_channels} output channels, not a multiple of group={group}")
    kernel = tuple(w.shape[2:])
    given_kernel = _ints(kernel_shape, "kernel_shape", rank, where, 1)
    if given_kernel is not None and given_kernel != kernel:
        raise ValueError(f"{where}: kernel_shape={list(given_kernel)} differs from w's spatial "
                         f"shape {list(kernel)}")
    if any(k < 1 for k in kernel):
        raise ValueError(f"{where}: w has shape {w.shape}; its kernel dimensions must be >= 1")
    strides_t = _ints(strides, "strides", rank, where, 1) or (1,) * rank
    dilations_t = _ints(dilations, "dilations", rank, where, 1) or (1,) * rank
    pads_t = _ints(pads, "pads", 2 * rank, where, 0)
    if pads_t is not None and auto_pad != "NOTSET":
        raise ValueError(f"{where}: pads={list(pads_t)} with auto_pad={auto_pad!r}; pads cannot be "
                         f"used with an auto_pad other than NOTSET")
    spatial = x.shape[2:]
    begin, end, out_spatial = [], [], []
    for i in range(rank):
        extent = (kernel[i] - 1) * dilations_t[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-spatial[i] // strides_t[i])
            total = max(0, (out - 1) * strides_t[i] + extent - spatial[i])
            small, large = total // 2, total - total // 2
            b, e = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            b = e = 0
        else:
            b, e = (pads_t[i], pads_t[i + rank]) if pads_t else (0, 0)
        out = (spatial[i] + b + e - extent) // strides_t[i] + 1
        if out < 1:
            raise ValueError(f"{where}: dimension {i} of x ({spatial[i]}, padded by {b} + {e}) is "
                             f"smaller than the dilated kernel ({extent}): no output")
        begin.append(b)
        end.append(e)
        out_spatial.append(out)
    # The padded x (int16 values) and the int32 accumulators are allocated: numpy indexes
    # at most intp-max bytes, and a geometry beyond it is an error in the attributes, not
    # numpy's "array is too big".
    limit = np.iinfo(np.intp).max // 8
    padded = batch * channels * math.prod(s + b + e for s, b, e in zip(spatial, begin, end))
    outputs = batch * out_channels * math.prod(out_spatial)
    for what, count in (("the padded x", padded), ("the output", outputs)):
        if count > limit:
            raise ValueError(f"{where}: auto_pad={auto_pad!r}, pads {begin} + {end}, strides "
                             f"{list(strides_t)} and dilations {list(dilations_t)} make {what} "
                             f"{count} elements; at most {limit} can be indexed")
    for name, sig, etype, per_channel_ok in (("x_zero_point", x_zp_sig, x_type, False),
                                             ("w_zero_point", w_zp_sig, w_type, True)):
        if sig is None:
            continue
        zp = ArraySpec(*sig)
        zp_type = dp.element(spec, opset, name, zp)
        if zp_type is not etype:
            raise TypeError(f"{where}: {name} has type {zp_type.name}; it must have the type of "
                            f"{name[0]} ({etype.name})")
        if not (dp.is_scalar_shape(zp.shape) or (per_channel_ok and zp.shape == (out_channels,))):
            allowed = f"a scalar or [{out_channels}] (per output channel)" if per_channel_ok else "a scalar (() or (1,))"
            raise ValueError(f"{where}: {name} has shape {zp.shape}; allowed: {allowed}")
    w_zp_per_channel = w_zp_sig is not None and ArraySpec(*w_zp_sig).shape == (out_channels,) \
        and out_channels != 1
    pairs = None
    if accumulator == "x86-u8s8-pairs":
        if (op_type == "QLinearConv" and x_type.name == "uint8" and w_type.name == "int8"
                and (channels // group) % 2 == 0):
            pairs = "nhwc"
        elif op_type == "ConvInteger" and x_type.name == "int8" and w_type.name == "uint8":
            pairs = "nchw"
    _, narrow = dp.parse_accumulator(accumulator)
    return ConvPlan(where, x_type, w_type, batch, channels, out_channels, group, kernel,
                    strides_t, dilations_t, tuple(begin), tuple(end), tuple(out_spatial),
                    w_zp_per_channel, pairs, narrow)


def _windows(padded: np.ndarray, plan: ConvPlan) -> np.ndarray:
    """[N, C, *out, *kernel] view of the padded input."""
    rank = len(plan.kernel)
    extents = tuple((k - 1) * d + 1 for k, d in zip(plan.kernel, plan.dilations))
    view = np.lib.stride_tricks.sliding_window_view(padded, extents, axis=tuple(range(2, 2 + rank)))
    index = (slice(None), slice(None)) + tuple(slice(None, o * s, s) for o, s in zip(plan.out_spatial, plan.strides)) \
        + tuple(slice(None, None, d) for d in plan.dilations)
    return view[index]


def _pad_values(values: np.ndarray, plan: ConvPlan) -> np.ndarray:
    """values (C-contiguous) inside a zero border of the plan's pads, contiguous."""
    if not any(plan.pads_begin) and not any(plan.pads_end):
        return np.ascontiguousarray(values)
    shape = values.shape[:2] + tuple(s + b + e for s, b, e in zip(values.shape[2:], plan.pads_begin, plan.pads_end))
    padded = np.zeros(shape, dtype=values.dtype)
    padded[(slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(plan.pads_begin, values.shape[2:]))] = values
    return padded


def _pad(values: np.ndarray, plan: ConvPlan, fill) -> np.ndarray:
    width = [(0, 0), (0, 0)] + list(zip(plan.pads_begin, plan.pads_end))
    if not any(b or e for b, e in width):
        return values
    return np.pad(values, width, constant_values=fill)


def _accumulate(plan: ConvPlan, x, w, x_zp, w_zp, bias, n_threads) -> np.ndarray:
    """int32 accumulators [N, M, L] (L the output positions), bias included."""
    try:
        return _accumulate_values(plan, x, w, x_zp, w_zp, bias, n_threads)
    except MemoryError as error:
        # numpy's message names a shape; the caller needs the attributes that made it
        raise MemoryError(
            f"{plan.where}: the padded x (pads {list(plan.pads_begin)} + {list(plan.pads_end)}) and "
            f"the output (spatial {list(plan.out_spatial)}, dilations {list(plan.dilations)}) do not "
            f"fit in memory: {error}") from None


def _accumulate_values(plan: ConvPlan, x, w, x_zp, w_zp, bias, n_threads) -> np.ndarray:
    rank = len(plan.kernel)
    groups, m_g = plan.group, plan.out_channels // plan.group
    c_g = plan.channels // groups
    taps = math.prod(plan.kernel)
    positions = math.prod(plan.out_spatial)
    x_zp_value = 0 if x_zp is None else int(dp.int_values(np.asarray(x_zp).reshape(-1), plan.x_type)[0])
    w_zp_values = (np.zeros(plan.out_channels, np.int64) if w_zp is None else
                   np.broadcast_to(dp.int_values(np.asarray(w_zp).reshape(-1), plan.w_type).astype(np.int64),
                                   (plan.out_channels,)))
    if plan.pairs is not None:
        return _pair_accumulate(plan, x, w, x_zp_value, w_zp_values, bias, n_threads)
    # 8-bit codes minus their zero points lie in [-255, 255]: exact in int16
    x_vals = dp.int_values(x, plan.x_type).astype(np.int16) - np.int16(x_zp_value)
    padded = _pad_values(x_vals, plan)  # a padded element is the zero point: 0 after subtraction
    # im2col in place: the GEMM reads column (c, taps) x position (outputs) of image n,
    # group g at b_base[n, g] + k_offsets[c, taps] + n_offsets[outputs] of the padded
    # image, so the columns matrix is never written out.
    element_strides = [stride // padded.itemsize for stride in padded.strides]
    spatial_strides = element_strides[2:]
    k_offsets = np.arange(c_g, dtype=np.intp).reshape((c_g,) + (1,) * rank) * element_strides[1]
    n_offsets = np.zeros((1,) * rank, dtype=np.intp)
    for i in range(rank):
        shape = [1] * rank
        shape[i] = -1
        k_offsets = k_offsets + (np.arange(plan.kernel[i], dtype=np.intp) * plan.dilations[i]
                                 * spatial_strides[i]).reshape([1] + shape)
        n_offsets = n_offsets + (np.arange(plan.out_spatial[i], dtype=np.intp) * plan.strides[i]
                                 * spatial_strides[i]).reshape(shape)
    b_base = (np.arange(plan.batch, dtype=np.intp)[:, None] * element_strides[0]
              + np.arange(groups, dtype=np.intp)[None, :] * c_g * element_strides[1]).reshape(-1)
    w_vals = dp.int_values(w, plan.w_type).astype(np.int16) - \
        w_zp_values.astype(np.int16).reshape((-1,) + (1,) * (rank + 1))
    w_mat = w_vals.reshape(groups, m_g, c_g * taps)
    # one GEMM item per (image, group): that group's filters times its columns
    operands = (w_mat, padded, b_base, k_offsets.reshape(-1), n_offsets.reshape(-1),
                np.tile(np.arange(groups, dtype=np.intp), plan.batch),
                np.arange(plan.batch * groups, dtype=np.intp))
    if plan.narrow is not None:
        # k runs over w's [C/group, k1, ..., kn] in row-major order; the bias is the
        # register's initial value
        init = None if bias is None else np.tile(bias.astype(np.int32).reshape(groups, m_g), (plan.batch, 1))
        acc = dp.sequential_gemm(*operands, init, plan.narrow, n_threads)
        return acc.reshape(plan.batch, plan.out_channels, positions)
    acc = dp.exact_gemm(*operands, n_threads).reshape(plan.batch, plan.out_channels, positions)
    if bias is not None:
        acc += bias.astype(np.int32)[None, :, None]  # int32 arrays add modulo 2**32
    return acc


def _pair_accumulate(plan: ConvPlan, x, w, x_zp_value: int, w_zp_values, bias, n_threads) -> np.ndarray:
    """The x86-u8s8-pairs accumulators [N, M, L] (bias included): VPMADDUBSW's int16 sums
    of pairs of raw uint8 x int8 codes along K, then the zero points' exact corrections.
    onnxruntime's QLinearConv reads K in NHWC order (kernel position outer, channel inner)
    with x the uint8 operand; its ConvInteger GEMM takes w as the uint8 operand and the
    columns of x in the filter's order (channel outer, kernel positions inner). A padded
    element is the zero point's raw code."""
    rank = len(plan.kernel)
    groups, m_g = plan.group, plan.out_channels // plan.group
    c_g = plan.channels // groups
    depth = math.prod(plan.kernel) * c_g
    positions = math.prod(plan.out_spatial)
    x_raw, w_raw = (x.view(np.uint8), w.view(np.int8)) if plan.pairs == "nhwc" else (x.view(np.int8), w.view(np.uint8))
    win = _windows(_pad(x_raw, plan, x_zp_value), plan)  # [N, C, *out, *kernel]
    win = win.reshape((plan.batch, groups, c_g) + plan.out_spatial + plan.kernel)
    w_raw = w_raw.reshape((groups, m_g, c_g) + plan.kernel)
    if plan.pairs == "nhwc":  # the channel axis innermost
        win = np.moveaxis(win, 2, -1)
        w_raw = np.moveaxis(w_raw, 2, -1)
    else:  # channel and kernel positions after the output positions
        win = np.moveaxis(win, 2, 2 + rank)
    cols = np.ascontiguousarray(win).reshape(plan.batch * groups, positions, depth)
    w_cols = dp.flatten_leading(np.broadcast_to(np.ascontiguousarray(w_raw).reshape(groups, m_g, depth),
                                                (plan.batch, groups, m_g, depth)), m_g, depth)
    window_sums = cols.astype(np.int64).sum(axis=2)[:, None, :]    # [N*G, 1, L]
    weight_sums = w_cols.astype(np.int64).sum(axis=2)[:, :, None]  # [N*G, Mg, 1]
    w_zp_g = dp.flatten_leading(np.broadcast_to(w_zp_values.reshape(groups, m_g), (plan.batch, groups, m_g)),
                                m_g)[:, :, None]
    if plan.pairs == "nhwc":
        raw = np.swapaxes(dp.pair_sums(cols, w_cols, n_threads), 1, 2)  # [N*G, Mg, L]
    else:
        raw = dp.pair_sums(w_cols, cols, n_threads)
    acc = raw.astype(np.int64) - x_zp_value * weight_sums - w_zp_g * window_sums + depth * x_zp_value * w_zp_g
    acc = acc.reshape(plan.batch, plan.out_channels, positions)
    if bias is not None:
        acc = acc + bias.astype(np.int64)[None, :, None]
    return dp.wrap_int64(acc)


def _conv_plan(op_type, opset, x, w, x_zp, w_zp, auto_pad, dilations, group, kernel_shape, pads,
               strides, accumulator):
    def frozen(v):
        return tuple(v) if isinstance(v, (list, np.ndarray)) else v
    return cached_plan(_plan, (op_type, opset, signature(x), signature(w), signature(x_zp), signature(w_zp),
                               auto_pad if not isinstance(auto_pad, bytes) else auto_pad.decode(),
                               frozen(dilations), group, frozen(kernel_shape), frozen(pads),
                               frozen(strides), accumulator))


def _finish(plan: ConvPlan, result: np.ndarray, etype: ElementType, out, inputs) -> np.ndarray:
    from .._buffers import prepare_output

    shape = (plan.batch, plan.out_channels) + plan.out_spatial
    result = result.reshape(shape)
    if out is None:
        return result
    target = prepare_output(out, shape, etype, inputs)
    target[...] = result
    return target


@in_default_fp_environment
def conv_integer(x: Array, w: Array, x_zero_point: Array | None = None,
                 w_zero_point: Array | None = None, *, auto_pad: str = "NOTSET",
                 dilations=None, group: int = 1, kernel_shape=None, pads=None, strides=None,
                 opset: int | None = None, accumulator: str | None = None,
                 out: np.ndarray | None = None, n_threads: int | None = None,
                 datapath: Datapath | None = None) -> np.ndarray:
    """ONNX ConvInteger-10: int32 convolution of (x - x_zero_point) and (w - w_zero_point),
    exact products, sums wrapped modulo 2**32; padding carries the zero point. The
    "x86-u8s8-pairs" accumulator applies to an int8 x with a uint8 w; "int<N>" / "int<N>-saturate"
    (N in 8..32) sum in k order through an N-bit register (docs/semantics.md)."""
    accumulator = integer_op_accumulator(
        as_datapath(datapath, op_type="ConvInteger", opset=normalize_opset(opset)), accumulator,
        "ConvInteger")
    resolve_threads(n_threads, 0)  # validated even when the output is empty
    opset = normalize_opset(opset)
    accumulator, _ = dp.parse_accumulator(accumulator)
    x = _coerce.as_array(x, "x")
    w = _coerce.as_array(w, "w")
    x_zero_point = _coerce.optional_array(x_zero_point, "x_zero_point")
    w_zero_point = _coerce.optional_array(w_zero_point, "w_zero_point")
    plan = _conv_plan("ConvInteger", opset, x, w, x_zero_point, w_zero_point, auto_pad, dilations,
                      group, kernel_shape, pads, strides, accumulator)
    acc = _accumulate(plan, x, w, x_zero_point, w_zero_point, None, n_threads)
    return _finish(plan, acc, dp.INT32, out, [("x", x), ("w", w)])


@in_default_fp_environment
def qlinear_conv(x: Array, x_scale: Array, x_zero_point: Array, w: Array, w_scale: Array,
                 w_zero_point: Array, y_scale: Array, y_zero_point: Array, B: Array | None = None, *,
                 auto_pad: str = "NOTSET", dilations=None, group: int = 1, kernel_shape=None,
                 pads=None, strides=None, requantization: str | None = None,
                 accumulator: str | None = None, opset: int | None = None,
                 out: np.ndarray | None = None, n_threads: int | None = None,
                 datapath: Datapath | None = None,
                 random_bits: np.ndarray | None = None) -> np.ndarray:
    """ONNX QLinearConv-10: the ConvInteger accumulator plus the int32 bias B, requantized by
    `requantization` ("exact", the default; "float32": onnxruntime; "float64":
    onnx.reference) with x_scale * w_scale / y_scale (docs/semantics.md). `datapath` (a
    qemu_q.Datapath) changes the requantization (docs/semantics.md, "The integer ops under
    a datapath"); with rounding="stochastic", `random_bits` is a uint32 array of y's shape,
    one word per output element."""
    datapath_resolved = as_datapath(datapath, op_type="QLinearConv", opset=normalize_opset(opset))
    requantization, accumulator, *output = qlinear_options(datapath_resolved, requantization, accumulator,
                                                           "QLinearConv")
    output = tuple(output)
    resolve_threads(n_threads, 0)  # validated even when the output is empty
    opset = normalize_opset(opset)
    rule, accumulator, named = dp.coerce_qlinear(requantization, accumulator, dict(
        x=x, x_scale=x_scale, x_zero_point=x_zero_point, w=w, w_scale=w_scale,
        w_zero_point=w_zero_point, y_scale=y_scale, y_zero_point=y_zero_point))
    x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point = [array for _, array in named]
    B = _coerce.optional_array(B, "B")
    plan = _conv_plan("QLinearConv", opset, x, w, x_zero_point, w_zero_point, auto_pad, dilations,
                      group, kernel_shape, pads, strides, accumulator)
    spec = get_spec("QLinearConv", opset)
    where = plan.where
    for name, scale in (("x_scale", x_scale), ("w_scale", w_scale), ("y_scale", y_scale)):
        dp.element(spec, opset, name, scale)
    y_type = integer_datapath_output_type(spec, dp.element(spec, opset, "y_zero_point", y_zero_point))
    for name, array in (("x_scale", x_scale), ("y_scale", y_scale), ("y_zero_point", y_zero_point)):
        if not dp.is_scalar_shape(array.shape):
            raise ValueError(f"{where}: {name} has shape {array.shape}; allowed: a scalar (() or (1,))")
    if not (dp.is_scalar_shape(w_scale.shape) or w_scale.shape == (plan.out_channels,)):
        raise ValueError(f"{where}: w_scale has shape {w_scale.shape}; allowed: a scalar or "
                         f"[{plan.out_channels}] (per output channel)")
    if B is not None:
        dp.element(spec, opset, "B", B)
        if B.shape != (plan.out_channels,):
            raise ValueError(f"{where}: B has shape {B.shape}; allowed: [{plan.out_channels}] (one per output channel)")
    # the accumulators [N, M, positions] are y [N, M, *spatial] in C order: the words need
    # no reordering
    words = check_random_bits(random_bits, datapath_resolved, (plan.batch, plan.out_channels)
                              + tuple(plan.out_spatial), "y")
    acc = _accumulate(plan, x, w, x_zero_point, w_zero_point, B, n_threads)
    positions = acc.shape[2]
    w_scales = np.broadcast_to(dp.scale_values(w_scale, where, "w_scale").reshape(-1), (plan.out_channels,))
    row_scale = np.tile(w_scales, plan.batch)
    col_scale = np.full(positions, np.float32(dp.scale_values(x_scale, where, "x_scale").reshape(-1)[0]), np.float32)
    scale_type = dp.ELEMENT_TYPES["float"]
    row_scale, col_scale, y_scale_value = dp.flush_scales(output, scale_type, row_scale, col_scale,
                                                          np.float32(y_scale.reshape(-1)[0]))
    y = dp.requantize(dp.flatten_leading(acc, positions), row_scale, col_scale,
                      y_scale_value, y_zero_point, y_type, scale_type,
                      rule, opset, n_threads, output, words)
    return _finish(plan, y, y_type, out, named + [("B", B), ("random_bits", random_bits)])


def _conv_attributes(attributes) -> dict:
    keys = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    return {k: attributes[k] for k in keys if k in attributes}


@register("ConvInteger")
def _run_conv_integer(inputs, attributes, opset):
    return [conv_integer(*inputs[:4], opset=opset, **_conv_attributes(attributes))]


@register("QLinearConv")
def _run_qlinear_conv(inputs, attributes, opset):
    return [qlinear_conv(*inputs[:9], opset=opset, **_conv_attributes(attributes))]
