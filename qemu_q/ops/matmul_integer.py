"""MatMulInteger-10 and QLinearMatMul-10/21: numpy.matmul geometry, exact int32
accumulation (or the x86 pair profile), and QLinearMatMul's requantization rules."""

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


@dataclass(frozen=True)
class MatmulPlan:
    where: str
    a_type: ElementType
    b_type: ElementType
    batch: tuple           # broadcast batch shape
    rows: int              # M (1 for a 1-D a)
    depth: int             # K
    cols: int              # N (1 for a 1-D b)
    out_shape: tuple
    a_zp_shape: tuple | None   # the shape the zero point (and scale) broadcasts as, against a as [..., M, K]
    b_zp_shape: tuple | None
    pairs: bool            # the x86-u8s8-pairs profile applies
    narrow: tuple | None   # (width, saturate): a named accumulator summed in k order


def _zero_point_shape(where, name, shape, operand_shape, per_row: bool):
    """How a zero point/scale of `shape` broadcasts against the operand (as [..., M, K] for
    a, [..., K, N] for b): per tensor, per row of a / per column of b, or batched."""
    if dp.is_scalar_shape(shape):
        return ()
    operand = "a" if per_row else "b"
    if len(operand_shape) < 2:
        raise ValueError(f"{where}: {name} has shape {shape}; a 1-D {operand} takes a scalar zero point "
                         f"and scale only (() or (1,))")
    rows_or_cols = operand_shape[-2] if per_row else operand_shape[-1]
    kind = "per-row [M] or [..., M, 1]" if per_row else "per-column [N] or [..., 1, N]"
    if len(operand_shape) >= 2:
        if shape == (rows_or_cols,):
            return (rows_or_cols, 1) if per_row else (1, rows_or_cols)
        expected_last = (rows_or_cols, 1) if per_row else (1, rows_or_cols)
        if len(shape) >= 2 and shape[-2:] == expected_last and len(shape) <= len(operand_shape):
            batch = operand_shape[:-2]
            head = shape[:-2]
            if all(h in (1, d) for h, d in zip(head[::-1], batch[::-1])):
                return shape
    raise ValueError(
        f"{where}: {name} has shape {shape}; allowed: a scalar (() or (1,)) or {kind} of {operand} "
        f"(shape {operand_shape})"
    )


@functools.lru_cache(maxsize=256)
def _plan(op_type, opset, a_sig, b_sig, a_zp_sig, b_zp_sig, accumulator) -> MatmulPlan:
    spec = get_spec(op_type, opset)
    where = label(spec, opset)
    a, b = ArraySpec(*a_sig), ArraySpec(*b_sig)
    a_name, b_name = spec.inputs[0].name, spec.inputs[3 if op_type == "QLinearMatMul" else 1].name
    a_type = dp.element(spec, opset, a_name, a)
    b_type = dp.element(spec, opset, b_name, b)
    if a.ndim == 0 or b.ndim == 0:
        bad, arr = (a_name, a) if a.ndim == 0 else (b_name, b)
        raise ValueError(f"{where}: {bad} has shape {arr.shape}; matmul needs at least 1 dimension")
    a_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"{where}: {a_name} has shape {a.shape} and {b_name} {b.shape}; the last dimension of "
            f"{a_name} ({a_shape[-1]}) must equal the {'only' if b.ndim == 1 else 'second-to-last'} "
            f"of {b_name} ({b_shape[-2]})"
        )
    try:
        batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise ValueError(
            f"{where}: the batch dimensions of {a_name} {a.shape[:-2]} and {b_name} "
            f"{b.shape[:-2]} do not broadcast"
        ) from None
    out_shape = tuple(batch) + ((a_shape[-2],) if a.ndim > 1 else ()) + ((b_shape[-1],) if b.ndim > 1 else ())
    zp_shapes: list[tuple | None] = []
    for zp_sig, name, shape, per_row, operand in ((a_zp_sig, "a_zero_point", a_shape, True, a),
                                                  (b_zp_sig, "b_zero_point", b_shape, False, b)):
        if zp_sig is None:
            zp_shapes.append(None)
            continue
        zp = ArraySpec(*zp_sig)
        etype = dp.element(spec, opset, name, zp)
        if etype is not (a_type if per_row else b_type):
            raise TypeError(f"{where}: {name} has type {etype.name}; it must have the type of "
                            f"{a_name if per_row else b_name} ({(a_type if per_row else b_type).name})")
        zp_shapes.append(_zero_point_shape(where, name, zp.shape, operand.shape if operand.ndim > 1 else (), per_row)
                         if operand.ndim > 1 else _zero_point_shape(where, name, zp.shape, (), per_row))
    pairs = (accumulator == "x86-u8s8-pairs" and a_type.name == "uint8" and b_type.name == "int8")
    _, narrow = dp.parse_accumulator(accumulator)
    if narrow is not None and "small_float" in (a_type.kind, b_type.kind):
        raise ValueError(f"{where}: accumulator={accumulator!r} needs integer operands; with a float8 "
                         f"operand ({a_name} {a_type.name}, {b_name} {b_type.name}) the sums are exact "
                         f"(allowed: 'int32', 'x86-u8s8-pairs')")
    return MatmulPlan(where, a_type, b_type, tuple(batch), a_shape[-2], a_shape[-1], b_shape[-1],
                      out_shape, zp_shapes[0], zp_shapes[1], pairs, narrow)


def _operands(plan: MatmulPlan, a, b):
    a3 = a.reshape((1,) + a.shape) if a.ndim == 1 else a
    b3 = b.reshape(b.shape + (1,)) if b.ndim == 1 else b
    return a3, b3


def _zp_array(zp, shape, etype):
    if zp is None:
        return np.zeros((), dtype=np.int64)
    # int64: the zero point enters sums and products with Python ints (uint8 would overflow)
    values = dp.int_values(np.asarray(zp), etype).astype(np.int64) if etype.kind == "integer" \
        else np.asarray(zp, np.float64)
    return values.reshape(shape)


def _accumulate(plan: MatmulPlan, a, b, a_zp, b_zp, n_threads) -> np.ndarray:
    """int32 accumulators [*batch, M, N] (a and b as [..., M, K] and [..., K, N])."""
    a_zp_b = _zp_array(a_zp, plan.a_zp_shape or (), plan.a_type)
    b_zp_b = _zp_array(b_zp, plan.b_zp_shape or (), plan.b_type)
    m, k, n = plan.rows, plan.depth, plan.cols
    if plan.pairs:
        a_full = dp.flatten_leading(np.broadcast_to(a.view(np.uint8), plan.batch + (m, k)), m, k)
        b_full = dp.flatten_leading(np.broadcast_to(b.view(np.int8), plan.batch + (k, n)), k, n)
        raw = dp.pair_sums(a_full, np.swapaxes(b_full, 1, 2), n_threads).astype(np.int64)
        a_zp_full = dp.flatten_leading(np.broadcast_to(a_zp_b, plan.batch + (m, 1)), m, 1)
        b_zp_full = dp.flatten_leading(np.broadcast_to(b_zp_b, plan.batch + (1, n)), 1, n)
        row_sums = a_full.astype(np.int64).sum(axis=2, keepdims=True)
        col_sums = b_full.astype(np.int64).sum(axis=1, keepdims=True)
        acc = raw - a_zp_full * col_sums - b_zp_full * row_sums + k * a_zp_full * b_zp_full
        return dp.wrap_int64(acc).reshape(plan.batch + (m, n))
    # 8-bit codes minus their zero points lie in [-255, 255]: exact in int16
    a_vals = dp.int_values(a, plan.a_type).astype(np.int16) - a_zp_b.astype(np.int16)
    b_vals = dp.int_values(b, plan.b_type).astype(np.int16) - b_zp_b.astype(np.int16)
    acc = dp.exact_matmul(dp.flatten_leading(a_vals, m, k), dp.flatten_leading(b_vals, k, n),
                        dp.item_index(a_vals.shape[:-2], plan.batch),
                        dp.item_index(b_vals.shape[:-2], plan.batch), n_threads, plan.narrow)
    return acc.reshape(plan.batch + (m, n))


def _finish(plan: MatmulPlan, result: np.ndarray, out, inputs) -> np.ndarray:
    from .._buffers import prepare_output

    result = result.reshape(plan.out_shape)
    if out is None:
        return result
    target = prepare_output(out, plan.out_shape, _result_type(result), inputs)
    target[...] = result
    return target


def _result_type(result: np.ndarray) -> ElementType:
    from .._dtypes import array_element_type

    return array_element_type(result, "y")


@in_default_fp_environment
def matmul_integer(a: Array, b: Array, a_zero_point: Array | None = None,
                   b_zero_point: Array | None = None, *, opset: int | None = None,
                   accumulator: str | None = None, out: np.ndarray | None = None,
                   n_threads: int | None = None,
                   datapath: Datapath | None = None) -> np.ndarray:
    """ONNX MatMulInteger-10: int32 (a - a_zero_point) @ (b - b_zero_point), numpy.matmul
    broadcasting, exact products, the sum wrapped modulo 2**32 (docs/semantics.md).
    `accumulator="x86-u8s8-pairs"` models onnxruntime's VPMADDUBSW (uint8 a, int8 b);
    "int<N>" / "int<N>-saturate" (N in 8..32, e.g. "int32-saturate", "int16") a MAC
    array's N-bit register wrapping or saturating after every addition, k in order."""
    accumulator = integer_op_accumulator(
        as_datapath(datapath, op_type="MatMulInteger", opset=normalize_opset(opset)), accumulator,
        "MatMulInteger")
    resolve_threads(n_threads, 0)  # validated even when the output is empty
    opset = normalize_opset(opset)
    accumulator, _ = dp.parse_accumulator(accumulator)
    a = _coerce.as_array(a, "A")
    b = _coerce.as_array(b, "B")
    a_zero_point = _coerce.optional_array(a_zero_point, "a_zero_point")
    b_zero_point = _coerce.optional_array(b_zero_point, "b_zero_point")
    plan = cached_plan(_plan, ("MatMulInteger", opset, signature(a), signature(b),
                               signature(a_zero_point), signature(b_zero_point), accumulator))
    a3, b3 = _operands(plan, a, b)
    acc = _accumulate(plan, a3, b3, a_zero_point, b_zero_point, n_threads)
    return _finish(plan, acc, out, [("A", a), ("B", b)])


@in_default_fp_environment
def qlinear_matmul(a: Array, a_scale: Array, a_zero_point: Array, b: Array, b_scale: Array,
                   b_zero_point: Array, y_scale: Array, y_zero_point: Array, *,
                   requantization: str | None = None, accumulator: str | None = None,
                   opset: int | None = None, out: np.ndarray | None = None,
                   n_threads: int | None = None,
                   datapath: Datapath | None = None,
                   random_bits: np.ndarray | None = None) -> np.ndarray:
    """ONNX QLinearMatMul-10/21: y = saturate(round(acc * a_scale * b_scale / y_scale) +
    y_zero_point) with the int32 accumulator acc of MatMulInteger. `requantization`:
    "exact" (the real value rounded once, ties to even; the default where neither it nor the
    datapath names a rule: None is not given), "float32"
    (onnxruntime's float32 multiplier and product), "float64" (onnx.reference's order).
    float8 operands (opset >= 21) are summed exactly (docs/semantics.md). `datapath` (a
    qemu_q.Datapath) changes the requantization (docs/semantics.md, "The integer ops under
    a datapath"); with rounding="stochastic", `random_bits` is a uint32 array of y's shape,
    one word per output element."""
    datapath_resolved = as_datapath(datapath, op_type="QLinearMatMul", opset=normalize_opset(opset))
    requantization, accumulator, *output = qlinear_options(datapath_resolved, requantization, accumulator,
                                                           "QLinearMatMul")
    output = tuple(output)
    resolve_threads(n_threads, 0)  # validated even when the output is empty
    opset = normalize_opset(opset)
    rule, accumulator, named = dp.coerce_qlinear(requantization, accumulator, dict(
        a=a, a_scale=a_scale, a_zero_point=a_zero_point, b=b, b_scale=b_scale,
        b_zero_point=b_zero_point, y_scale=y_scale, y_zero_point=y_zero_point))
    a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point = [array for _, array in named]
    plan = cached_plan(_plan, ("QLinearMatMul", opset, signature(a), signature(b),
                               signature(a_zero_point), signature(b_zero_point), accumulator))
    spec = get_spec("QLinearMatMul", opset)
    where = plan.where
    scale_types = {n: dp.element(spec, opset, n, s) for n, s in
                   (("a_scale", a_scale), ("b_scale", b_scale), ("y_scale", y_scale))}
    if len(set(scale_types.values())) > 1:
        raise TypeError(f"{where}: a_scale, b_scale and y_scale must share one type (TS); got "
                        + ", ".join(f"{n} {t.name}" for n, t in scale_types.items()))
    scale_type = scale_types["a_scale"]
    y_type = integer_datapath_output_type(spec, dp.element(spec, opset, "y_zero_point", y_zero_point))
    dp.check_same_shape(where, "a_scale", a_scale, "a_zero_point", a_zero_point)
    dp.check_same_shape(where, "b_scale", b_scale, "b_zero_point", b_zero_point)
    if not dp.is_scalar_shape(y_scale.shape) or not dp.is_scalar_shape(y_zero_point.shape):
        raise ValueError(f"{where}: y_scale {y_scale.shape} and y_zero_point {y_zero_point.shape} "
                         f"must be scalars (() or (1,))")
    for name, zp, etype in (("a_zero_point", a_zero_point, plan.a_type),
                            ("b_zero_point", b_zero_point, plan.b_type),
                            ("y_zero_point", y_zero_point, y_type)):
        if etype.kind == "small_float":
            dp.check_float_zero_point(zp, where, name)
    a3, b3 = _operands(plan, a, b)
    m, n = plan.rows, plan.cols
    row_scale = np.broadcast_to(dp.scale_values(a_scale, where, "a_scale").reshape(plan.a_zp_shape or ()),
                                plan.batch + (m, 1)).reshape(-1)
    col_scale_full = dp.flatten_leading(np.broadcast_to(
        dp.scale_values(b_scale, where, "b_scale").reshape(plan.b_zp_shape or ()), plan.batch + (1, n)), n)
    y_scale_value = np.float32(dp.scale_values(y_scale, where, "y_scale").reshape(-1)[0])
    row_scale, col_scale_full, y_scale_value = dp.flush_scales(output, scale_type, row_scale, col_scale_full,
                                                               y_scale_value)
    words = check_random_bits(random_bits, datapath_resolved, plan.out_shape, "y")
    items = math.prod(plan.batch)
    if items == 0 or m == 0 or n == 0:
        return _finish(plan, np.zeros(plan.batch + (m, n), dtype=y_type.dtype), out,
                       named + [("random_bits", random_bits)])
    if plan.a_type.kind == "small_float" or plan.b_type.kind == "small_float":
        a_vals = _float_values(a3, plan.a_type, a_zero_point, plan.a_zp_shape)
        b_vals = _float_values(b3, plan.b_type, b_zero_point, plan.b_zp_shape)
        y = dp.float_matmul_requantize(
            dp.flatten_leading(a_vals, m, plan.depth), dp.fraction_bits(plan.a_type),
            np.swapaxes(dp.flatten_leading(b_vals, plan.depth, n), 1, 2), dp.fraction_bits(plan.b_type),
            dp.item_index(a_vals.shape[:-2], plan.batch), dp.item_index(b_vals.shape[:-2], plan.batch),
            row_scale, col_scale_full, y_scale_value, y_zero_point, y_type, scale_type, rule, opset,
            n_threads, output, words).reshape(plan.batch + (m, n))
    else:
        acc = dp.flatten_leading(_accumulate(plan, a3, b3, a_zero_point, b_zero_point, n_threads), n)
        if np.all(col_scale_full == col_scale_full[:1]) or items == 1:
            y = dp.requantize(acc, row_scale, col_scale_full[0],
                              y_scale_value, y_zero_point, y_type, scale_type, rule, opset, n_threads,
                              output, words)
        else:
            # a batched per-column b_scale: one call per batch item
            y = np.concatenate([
                dp.requantize(acc[i * m:(i + 1) * m], row_scale[i * m:(i + 1) * m], col_scale_full[i],
                              y_scale_value, y_zero_point, y_type, scale_type, rule, opset, n_threads,
                              output, None if words is None else words[i * m * n:(i + 1) * m * n])
                for i in range(items)])
    return _finish(plan, y, out, named + [("random_bits", random_bits)])


def _float_values(operand, etype: ElementType, zero_point, zp_shape) -> np.ndarray:
    """Operand values as float64: float8 codes decoded exactly (a zero point is +-0),
    integer codes minus their zero point."""
    if etype.kind == "small_float":
        return operand.astype(np.float64)
    return dp.int_values(operand, etype).astype(np.float64) - _zp_array(zero_point, zp_shape or (), etype)


@register("MatMulInteger")
def _run_matmul_integer(inputs, attributes, opset):
    return [matmul_integer(inputs[0], inputs[1], inputs[2], inputs[3], opset=opset)]


@register("QLinearMatMul")
def _run_qlinear_matmul(inputs, attributes, opset):
    return [qlinear_matmul(*inputs[:8], opset=opset)]
