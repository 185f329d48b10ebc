"""What MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv share: the exact GEMM and
its int32 wrap, the pair-saturating accumulator profile, the named narrow and saturating
accumulators (`parse_accumulator`, `sequential_gemm`), parameter checks, and the
requantization under a named rule (docs/semantics.md, "Integer datapath")."""

from __future__ import annotations

import math

import numpy as np

from .. import _dispatch
from .._dispatch import Path
from .._dtypes import ELEMENT_TYPES, ElementType, array_element_type
from .._opspec import OpSpec
from .._validate import ArraySpec
from .._rules import label
from .._threads import resolve_threads

REQUANTIZATION_RULES = ("exact", "float32", "float64")
ACCUMULATORS = ("int32", "x86-u8s8-pairs")
# "int<N>" wraps modulo 2**N, "int<N>-saturate" saturates, after every addition in k order
# (docs/semantics.md, "Accumulator profiles"); N is bounded by the int32 output tensor.
ACCUMULATOR_WIDTHS = (8, 32)
ACCUMULATORS_ALLOWED = ("'int32' (ONNX: wrap modulo 2**32), 'x86-u8s8-pairs', "
                        "'int<N>' (wrap) or 'int<N>-saturate' for N in 8..32 "
                        "(e.g. 'int32-saturate', 'int24', 'int24-saturate', 'int16', 'int16-saturate')")


def _accumulator_error(value) -> ValueError:
    return ValueError(f"accumulator={value!r}; allowed: {ACCUMULATORS_ALLOWED}")


def parse_accumulator(value) -> tuple[str, tuple[int, bool] | None]:
    """An `accumulator=` value checked: (the canonical name, (width, saturate) for the
    sequential kernel or None for the exact GEMM ("int32": order-independent, so the fast
    GEMM is exact) and the pair profile."""
    if not isinstance(value, str):
        raise _accumulator_error(value)
    if value in ACCUMULATORS:
        return value, None
    name = value
    saturate = name.endswith("-saturate")
    if saturate:
        name = name[:-len("-saturate")]
    digits = name[3:]
    # plain ASCII decimal, no sign, no leading zero: one spelling per accumulator
    if not (name.startswith("int") and digits.isascii() and digits.isdigit()
            and not digits.startswith("0")):
        raise _accumulator_error(value)
    width = int(digits)
    if not ACCUMULATOR_WIDTHS[0] <= width <= ACCUMULATOR_WIDTHS[1]:
        raise _accumulator_error(value)
    return value, (width, saturate)

def check_choice(value, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {', '.join(repr(a) for a in allowed)}")
    return value


def element(spec: OpSpec, opset, name: str, array: "np.ndarray | ArraySpec") -> ElementType:
    from .._validate import check_type

    etype = array_element_type(array, name)
    check_type(spec, opset, name, etype)
    return etype


def coerce_qlinear(requantization, accumulator,
                   inputs: dict) -> tuple[str, str, list[tuple[str, np.ndarray]]]:
    """The QLinear ops' options checked and their eight inputs as (name, array) pairs, in
    order."""
    from .. import _coerce

    rule = check_choice(requantization, "requantization", REQUANTIZATION_RULES)
    accumulator, _ = parse_accumulator(accumulator)
    return rule, accumulator, [(name, _coerce.as_array(value, name)) for name, value in inputs.items()]


def is_scalar_shape(shape: tuple) -> bool:
    return shape == () or shape == (1,)


def int_values(array: np.ndarray, etype: ElementType) -> np.ndarray:
    """Integer codes as their values (int8/uint8 arrays already are; other storage goes
    through the one home of sign extension)."""
    array = np.asarray(array)
    if array.dtype == etype.dtype and array.dtype in (np.dtype(np.int8), np.dtype(np.uint8)):
        return array
    return etype.code_values(array.view(etype.storage) if etype.dtype != etype.storage else array)


def exact_gemm(a: np.ndarray, b: np.ndarray, b_base: np.ndarray, k_offsets: np.ndarray,
               n_offsets: np.ndarray, a_index: np.ndarray, b_index: np.ndarray,
               n_threads) -> np.ndarray:
    """The exact int32 GEMM of the integer datapath (pyx/_integer.pyx, gemm_s16): a int16
    [A, M, K] and b a flat int16 array (8-bit codes minus their zero points, |v| <= 255)
    holding B operands B(i)[k, n] = b[b_base[i] + k_offsets[k] + n_offsets[n]];
    out[t] = a[a_index[t]] @ B(b_index[t]) with exact products and int32 sums wrapping
    modulo 2**32, int32 [len(a_index), M, N]."""
    a = np.ascontiguousarray(a, dtype=np.int16)
    items, (rows, depth), cols = len(a_index), a.shape[1:], len(n_offsets)
    out = np.empty((items, rows, cols), dtype=np.int32)
    module = _dispatch.entry_module(Path.INTEGER_GEMM)
    config = module.GemmConfig(items=items, rows=rows, depth=depth, cols=cols)
    intp = np.intp
    _dispatch.run(Path.INTEGER_GEMM, a, np.ascontiguousarray(b, dtype=np.int16).reshape(-1),
                  np.ascontiguousarray(b_base, dtype=intp), np.ascontiguousarray(k_offsets, dtype=intp),
                  np.ascontiguousarray(n_offsets, dtype=intp), np.ascontiguousarray(a_index, dtype=intp),
                  np.ascontiguousarray(b_index, dtype=intp), out, config,
                  resolve_threads(n_threads, out.size * max(1, depth)))
    return out


def sequential_gemm(a: np.ndarray, b: np.ndarray, b_base: np.ndarray, k_offsets: np.ndarray,
                    n_offsets: np.ndarray, a_index: np.ndarray, b_index: np.ndarray,
                    init: np.ndarray | None, accumulator: tuple[int, bool], n_threads) -> np.ndarray:
    """exact_gemm's operands through a `width`-bit accumulator register that wraps or
    saturates after every addition, k = 0..K-1 in order (pyx/_integer.pyx, accumulate);
    init int32 [len(a_index), M] (the register's initial value, reduced to the width first)
    or None for 0. int32 [len(a_index), M, N]."""
    width, saturate = accumulator
    a = np.ascontiguousarray(a, dtype=np.int16)
    items, (rows, depth), cols = len(a_index), a.shape[1:], len(n_offsets)
    out = np.empty((items, rows, cols), dtype=np.int32)
    init = np.zeros((items, rows), np.int32) if init is None else np.ascontiguousarray(init, dtype=np.int32)
    module = _dispatch.entry_module(Path.INTEGER_ACCUMULATE)
    config = module.AccumulatorConfig(items=items, rows=rows, depth=depth, cols=cols, width=width,
                                      saturate=saturate)
    intp = np.intp
    _dispatch.run(Path.INTEGER_ACCUMULATE, a, np.ascontiguousarray(b, dtype=np.int16).reshape(-1),
                  np.ascontiguousarray(b_base, dtype=intp), np.ascontiguousarray(k_offsets, dtype=intp),
                  np.ascontiguousarray(n_offsets, dtype=intp), np.ascontiguousarray(a_index, dtype=intp),
                  np.ascontiguousarray(b_index, dtype=intp), init, out, config,
                  resolve_threads(n_threads, out.size * max(1, depth)))
    return out


def exact_matmul(a: np.ndarray, b: np.ndarray, a_index: np.ndarray, b_index: np.ndarray,
                 n_threads, accumulator: tuple[int, bool] | None = None) -> np.ndarray:
    """exact_gemm of a int16 [A, M, K] by b int16 [B, K, N] (contiguous matrices); through
    sequential_gemm when `accumulator` is (width, saturate)."""
    b = np.ascontiguousarray(b, dtype=np.int16)
    count, depth, cols = b.shape
    operands = (a, b, np.arange(count, dtype=np.intp) * depth * cols,
                np.arange(depth, dtype=np.intp) * cols, np.arange(cols, dtype=np.intp),
                a_index, b_index)
    if accumulator is not None:
        return sequential_gemm(*operands, None, accumulator, n_threads)
    return exact_gemm(*operands, n_threads)


def flatten_leading(array: np.ndarray, *tail: int) -> np.ndarray:
    """array [..., *tail] as [count, *tail] (reshape(-1, ...) cannot infer count when a
    tail dimension is 0)."""
    count = math.prod(array.shape[:array.ndim - len(tail)])
    return array.reshape((count,) + tuple(tail))


def item_index(operand_batch: tuple, batch: tuple) -> np.ndarray:
    """For each item of the broadcast batch shape, the index of the operand's own item
    (numpy matmul broadcasting: operand_batch broadcasts to batch)."""
    count = math.prod(operand_batch)
    return np.broadcast_to(np.arange(count, dtype=np.intp).reshape(operand_batch), batch).reshape(-1)


def wrap_int64(values: np.ndarray) -> np.ndarray:
    return values.astype(np.int64).astype(np.uint32).view(np.int32) if values.size else values.astype(np.int32)


def pair_sums(a_raw: np.ndarray, b_raw_t: np.ndarray, n_threads) -> np.ndarray:
    """The VPMADDUBSW model on raw codes: a_raw uint8 [batch, rows, K], b_raw_t int8
    [batch, cols, K]; int32 [batch, rows, cols]."""
    out = np.empty((a_raw.shape[0], a_raw.shape[1], b_raw_t.shape[1]), dtype=np.int32)
    _dispatch.run(Path.PAIR_SUMS, np.ascontiguousarray(a_raw), np.ascontiguousarray(b_raw_t), out,
                  resolve_threads(n_threads, out.size * max(1, a_raw.shape[2])))
    return out


# --- scales, zero points ------------------------------------------------------------------

def scale_values(scale: np.ndarray, where: str, name: str) -> np.ndarray:
    """A float32/float16/bfloat16 scale as float32 (exact: both narrow types are float32
    values)."""
    return np.asarray(scale, dtype=np.float32)


def check_float_zero_point(zero_point: np.ndarray, where: str, name: str) -> None:
    values = np.asarray(zero_point, dtype=np.float64)
    if np.any(values != 0.0):  # NaN compares unequal too
        bad = values[values != 0.0].reshape(-1)[0]
        raise ValueError(
            f"{where}: {name} of a float8 type must be +0 or -0 (a nonzero float zero point "
            f"has no agreed meaning); got {bad!r}"
        )


def check_same_shape(where: str, scale_name: str, scale: np.ndarray, zp_name: str,
                     zero_point: np.ndarray) -> None:
    if scale.shape != zero_point.shape and not (
            is_scalar_shape(scale.shape) and is_scalar_shape(zero_point.shape)):
        raise ValueError(
            f"{where}: {scale_name} has shape {scale.shape} and {zp_name} {zero_point.shape}; "
            f"a scale and its zero point must have the same shape"
        )


# --- requantization -----------------------------------------------------------------------

# The datapath's options of the QLinear requantization (qemu_q.datapath.qlinear_options):
# (rounding, nan_to_integer, nan, subnormals, multiplier code); the ONNX ones change nothing.
ONNX_OUTPUT = ("half_even", "min", "spec", "keep", 0)

# The smallest normal of each scale type (datapath subnormals "flush_inputs").
_SCALE_MIN_NORMAL = {"float": 2.0 ** -126, "float16": 2.0 ** -14, "bfloat16": 2.0 ** -126}


def _output_codes(output) -> dict:
    from ..datapath import NANS_TO_INTEGER, ROUND_CODES

    rounding, nan_to_integer = output[:2]
    return dict(rounding=ROUND_CODES[rounding], nan_to_integer=NANS_TO_INTEGER.index(nan_to_integer),
                multiplier=output[4])


def flush_scales(output, scale_type: ElementType, *scales):
    """The scales (float32 arrays or scalars, values of `scale_type`) with the datapath's
    subnormals "flush_inputs"/"flush_both": a scale subnormal in its own type becomes a
    zero of its sign (the multiplier is then formed from it: docs/semantics.md). A few
    values per call (one per row, column or tensor), never per output element; the
    caller's arrays are not written."""
    if output[3] not in ("flush_inputs", "flush_both"):
        return scales
    tiny = np.float32(_SCALE_MIN_NORMAL[scale_type.name])
    flushed = []
    for scale in scales:
        array = np.asarray(scale, dtype=np.float32)
        result = np.where(np.abs(array) < tiny, np.copysign(np.float32(0.0), array), array).astype(np.float32)
        flushed.append(result if array.ndim else np.float32(result))
    return tuple(flushed)


def requantize(acc: np.ndarray, row_scale: np.ndarray, col_scale: np.ndarray, y_scale: float,
               y_zero_point: np.ndarray, y_type: ElementType, scale_type: ElementType,
               rule: str, opset, n_threads, output=ONNX_OUTPUT, words=None) -> np.ndarray:
    """acc int32 [rows, cols] -> codes of y_type [rows, cols] under `rule`; row_scale and
    col_scale (float32, [rows] and [cols]) multiply, y_scale divides; `output` the
    datapath's options (ONNX_OUTPUT); `words` uint32 [rows * cols] with "stochastic"."""
    acc = np.ascontiguousarray(acc, dtype=np.int32)
    threads = resolve_threads(n_threads, acc.size)
    row_scale = np.ascontiguousarray(row_scale, dtype=np.float32)
    col_scale = np.ascontiguousarray(col_scale, dtype=np.float32)
    module = _dispatch.entry_module(Path.REQUANTIZE)
    if y_type.kind == "small_float":
        config = module.RequantizeConfig(rule=rule, scale_format=scale_type.name, float_output=True,
                                         small_float_id=y_type.small_float_id, **_output_codes(output))
        values = np.empty(acc.shape, dtype=np.float32)
        _dispatch.run(Path.REQUANTIZE, acc, row_scale, col_scale, np.float32(y_scale), values, config, threads,
                      *(() if words is None else (words,)))
        return encode_float8(values, y_zero_point, opset, output)
    zero_point = int(int_values(np.asarray(y_zero_point).reshape(-1), y_type)[0])
    config = module.RequantizeConfig(rule=rule, scale_format=scale_type.name, float_output=False,
                                     zero_point=zero_point, lo=y_type.lo, hi=y_type.hi,
                                     **_output_codes(output))
    codes = np.empty(acc.shape, dtype=np.uint8)
    _dispatch.run(Path.REQUANTIZE, acc, row_scale, col_scale, np.float32(y_scale), codes, config, threads,
                  *(() if words is None else (words,)))
    return codes.view(y_type.dtype)


def encode_float8(values: np.ndarray, y_zero_point: np.ndarray, opset, output=ONNX_OUTPUT) -> np.ndarray:
    """float32 values (rounded to odd, or the rule's float32 result) into the float8 type of
    y_zero_point by QuantizeLinear's rules with saturate=1 and the Cast table of `opset`;
    the division by a unit scale is exact. A datapath's rounding and nan (`output`) are
    QuantizeLinear's: a value rounded to odd at 24 bits rounds by any mode to float8's 3 or
    2 mantissa bits as the exact value would. Under "stochastic" the kernel has rounded the
    values onto the float8 grid with their words already (pyx/_integer.pyx, float8_value),
    so they are truncated here ("toward_zero": a grid value stays, the kernel's signed
    stand-in for a zero result becomes that zero). The datapath's output flush is
    QuantizeLinear's too (after rounding); its input flush was applied to the scales
    already and must not touch these values."""
    from ..datapath import Datapath
    from .quantize_linear import quantize_linear

    zero_point = np.asarray(y_zero_point).reshape(())
    rounding, _, nan, subnormals = output[:4]
    rounding = "toward_zero" if rounding == "stochastic" else rounding
    subnormals = "flush_outputs" if subnormals in ("flush_outputs", "flush_both") else "keep"
    datapath = (None if (rounding, nan, subnormals) == (ONNX_OUTPUT[0], ONNX_OUTPUT[2], ONNX_OUTPUT[3])
                else Datapath(rounding=rounding, nan=nan, subnormals=subnormals))
    return quantize_linear(values, np.float32(1.0), zero_point, saturate=1, opset=opset, datapath=datapath)


# --- QLinearMatMul-21 with a float8 operand ------------------------------------------------

def fraction_bits(etype: ElementType) -> int:
    """F such that every finite value of the operand type is an integer multiple of 2**-F:
    minus the exponent of a float8 type's smallest subnormal; 0 for integer codes."""
    if etype.kind != "small_float":
        return 0
    import ml_dtypes

    return -int(np.frexp(float(ml_dtypes.finfo(etype.dtype).smallest_subnormal))[1]) + 1


def float_matmul_requantize(a_values: np.ndarray, a_bits: int, bt_values: np.ndarray, b_bits: int,
                            a_index: np.ndarray, b_index: np.ndarray, row_scale: np.ndarray,
                            col_scale: np.ndarray, y_scale, y_zero_point: np.ndarray,
                            y_type: ElementType, scale_type: ElementType, rule: str, opset,
                            n_threads, output=ONNX_OUTPUT, words=None) -> np.ndarray:
    """QLinearMatMul-21 with a float8 operand (docs/semantics.md): a_values float64
    [A, M, K] and bt_values float64 [B, N, K] (b transposed), the operands' exact values,
    multiples of 2**-a_bits and 2**-b_bits (fraction_bits); each output's exact sum S (or
    the IEEE sum where a NaN or an infinity takes part) through the rule, in the kernel.
    Returns y [len(a_index) * M, N]."""
    a_values = np.ascontiguousarray(a_values, dtype=np.float64)
    bt_values = np.ascontiguousarray(bt_values, dtype=np.float64)
    a_finite, b_finite = np.isfinite(a_values), np.isfinite(bt_values)
    # exact: each finite value times 2**bits is an integer below 2**34
    a_fixed = np.ldexp(np.where(a_finite, a_values, 0.0), a_bits).astype(np.int64)
    bt_fixed = np.ldexp(np.where(b_finite, bt_values, 0.0), b_bits).astype(np.int64)
    row_special = np.ascontiguousarray(~a_finite.all(axis=2), dtype=np.uint8)
    col_special = np.ascontiguousarray(~b_finite.all(axis=2), dtype=np.uint8)
    items, rows, cols = len(a_index), a_values.shape[1], bt_values.shape[1]
    row_scale = np.ascontiguousarray(row_scale, dtype=np.float32)
    col_scale = np.ascontiguousarray(col_scale, dtype=np.float32).reshape(items, cols)
    threads = resolve_threads(n_threads, items * rows * cols * max(1, a_values.shape[2]))
    module = _dispatch.entry_module(Path.FLOAT_MATMUL)
    float_out = y_type.kind == "small_float"
    if float_out:
        config = module.FloatMatmulConfig(rule=rule, scale_format=scale_type.name, float_output=True,
                                          shift=a_bits + b_bits, small_float_id=y_type.small_float_id,
                                          **_output_codes(output))
        out = np.empty((items * rows, cols), dtype=np.float32)
    else:
        zero_point = int(int_values(np.asarray(y_zero_point).reshape(-1), y_type)[0])
        config = module.FloatMatmulConfig(rule=rule, scale_format=scale_type.name, float_output=False,
                                          shift=a_bits + b_bits, zero_point=zero_point,
                                          lo=y_type.lo, hi=y_type.hi, **_output_codes(output))
        out = np.empty((items * rows, cols), dtype=np.uint8)
    _dispatch.run(Path.FLOAT_MATMUL, a_fixed, bt_fixed, a_values, bt_values, row_special, col_special,
                  np.ascontiguousarray(a_index, dtype=np.intp), np.ascontiguousarray(b_index, dtype=np.intp),
                  row_scale, col_scale, np.float32(y_scale), out, config, threads,
                  *(() if words is None else (words,)))
    if float_out:
        return encode_float8(out, y_zero_point, opset, output)
    return out.view(y_type.dtype)


def where_label(spec: OpSpec, opset) -> str:
    return label(spec, opset)


INT32 = ELEMENT_TYPES["int32"]
