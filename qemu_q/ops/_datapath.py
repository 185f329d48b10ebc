"""What MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv share: the exact GEMM and
its int32 wrap, the pair-saturating accumulator profile, parameter checks, and the
requantization under a named rule (docs/semantics.md, "Integer datapath")."""

from __future__ import annotations

from fractions import Fraction

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
    accumulator = check_choice(accumulator, "accumulator", ACCUMULATORS)
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


def exact_gemm(a: np.ndarray, b: np.ndarray, a_index: np.ndarray, b_index: np.ndarray,
               n_threads) -> np.ndarray:
    """The exact int32 GEMM of the integer datapath: a int16 [A, M, K] and b int16
    [B, K, N] values (8-bit codes minus their zero points, |v| <= 255), out[t] =
    a[a_index[t]] @ b[b_index[t]] with exact products and int32 sums wrapping modulo 2**32
    (pyx/_integer.pyx, gemm_s16), int32 [len(a_index), M, N]."""
    a = np.ascontiguousarray(a, dtype=np.int16)
    b = np.ascontiguousarray(b, dtype=np.int16)
    items, (rows, depth), cols = len(a_index), a.shape[1:], b.shape[2]
    out = np.empty((items, rows, cols), dtype=np.int32)
    module = _dispatch.entry_module(Path.INTEGER_GEMM)
    config = module.GemmConfig(items=items, rows=rows, depth=depth, cols=cols)
    _dispatch.run(Path.INTEGER_GEMM, a, b, np.ascontiguousarray(a_index, dtype=np.intp),
                  np.ascontiguousarray(b_index, dtype=np.intp), out, config,
                  resolve_threads(n_threads, out.size * max(1, depth)))
    return out


def item_index(operand_batch: tuple, batch: tuple) -> np.ndarray:
    """For each item of the broadcast batch shape, the index of the operand's own item
    (numpy matmul broadcasting: operand_batch broadcasts to batch)."""
    count = int(np.prod(operand_batch, dtype=np.int64))
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

def requantize(acc: np.ndarray, row_scale: np.ndarray, col_scale: np.ndarray, y_scale: float,
               y_zero_point: np.ndarray, y_type: ElementType, scale_type: ElementType,
               rule: str, opset, n_threads) -> np.ndarray:
    """acc int32 [rows, cols] -> codes of y_type [rows, cols] under `rule`; row_scale and
    col_scale (float32, [rows] and [cols]) multiply, y_scale divides."""
    acc = np.ascontiguousarray(acc, dtype=np.int32)
    threads = resolve_threads(n_threads, acc.size)
    row_scale = np.ascontiguousarray(row_scale, dtype=np.float32)
    col_scale = np.ascontiguousarray(col_scale, dtype=np.float32)
    module = _dispatch.entry_module(Path.REQUANTIZE)
    if y_type.kind == "small_float":
        config = module.RequantizeConfig(rule=rule, scale_format=scale_type.name, float_output=True)
        values = np.empty(acc.shape, dtype=np.float32)
        _dispatch.run(Path.REQUANTIZE, acc, row_scale, col_scale, np.float32(y_scale), values, config, threads)
        return encode_float8(values, y_zero_point, opset)
    zero_point = int(int_values(np.asarray(y_zero_point).reshape(-1), y_type)[0])
    config = module.RequantizeConfig(rule=rule, scale_format=scale_type.name, float_output=False,
                                     zero_point=zero_point, lo=y_type.lo, hi=y_type.hi)
    codes = np.empty(acc.shape, dtype=np.uint8)
    _dispatch.run(Path.REQUANTIZE, acc, row_scale, col_scale, np.float32(y_scale), codes, config, threads)
    return codes.view(y_type.dtype)


def encode_float8(values: np.ndarray, y_zero_point: np.ndarray, opset) -> np.ndarray:
    """float32 values (rounded to odd, or the rule's float32 result) into the float8 type of
    y_zero_point by QuantizeLinear's rules with saturate=1 and the Cast table of `opset`;
    the division by a unit scale is exact."""
    from .quantize_linear import quantize_linear

    zero_point = np.asarray(y_zero_point).reshape(())
    return quantize_linear(values, np.float32(1.0), zero_point, saturate=1, opset=opset)


# --- exact sums of float8 values (QLinearMatMul-21) --------------------------------------

def fixed_point_values(values: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Finite float64 values as int64 integers times 2**-shift, and the mask of the
    non-finite positions (their integer is 0). Every operand value here (a float8 value,
    or an integer code minus its zero point) has at most 9 significant bits and |v| < 2**16,
    so with the smallest exponent e (v = m * 2**e, 0.5 <= m < 1) each value is a multiple
    of 2**(e - 9) and the scaled integers stay below 2**(16 + 9 - e) <= 2**43."""
    finite = np.isfinite(values)
    clean = np.where(finite, values, 0.0)
    nonzero = clean[clean != 0.0]
    if nonzero.size == 0:
        return np.zeros(values.shape, dtype=np.int64), 0, ~finite
    _, exponents = np.frexp(nonzero)
    shift = max(0, 9 - int(exponents.min()))
    return np.ldexp(clean, shift).astype(np.int64), shift, ~finite


def exact_float_sums(a_values: np.ndarray, b_values: np.ndarray):
    """The exact sums of products of two float64 operand stacks whose finite values are
    dyadic (float8 values, or integers): (numerators as a Python-int object array, the
    power of two they are scaled by, and the IEEE float64 matmul for outputs that meet a
    non-finite value, NaN elsewhere)."""
    a_int, a_shift, a_special = fixed_point_values(a_values)
    b_int, b_shift, b_special = fixed_point_values(b_values)
    sums = np.matmul(a_int.astype(object), b_int.astype(object))
    special = np.matmul(a_special.astype(np.int64), np.ones(b_values.shape[-2:], np.int64)) + \
        np.matmul(np.ones(a_values.shape[-2:], np.int64), b_special.astype(np.int64))
    with np.errstate(all="ignore"):
        ieee = np.matmul(a_values, b_values)
    return sums, a_shift + b_shift, special > 0, ieee


def fraction_to_odd_double(value: Fraction) -> float:
    """value rounded to odd with 53 bits, as a float (any later rounding to at most 51 bits
    is then the correct rounding of value)."""
    if value == 0:
        return 0.0
    sign = -1.0 if value < 0 else 1.0
    num, den = abs(value.numerator), value.denominator
    shift = 53 + den.bit_length() - num.bit_length()
    if shift >= 0:
        q, r = divmod(num << shift, den)
    else:
        q, r = divmod(num, den << -shift)
    sticky = r != 0
    if q >> 53:
        sticky = sticky or bool(q & 1)
        q >>= 1
        shift -= 1
    q |= int(sticky)
    try:
        return sign * float(Fraction(q) / Fraction(2) ** shift)
    except OverflowError:
        return sign * float("inf")


def float_to_odd_float32(v: float) -> np.float32:
    """A double as a float32 rounded to odd (ties then never fall on a float8 midpoint)."""
    f32 = np.finfo(np.float32)
    if not np.isfinite(v):
        return np.float32(v)
    if abs(v) > float(f32.max):
        return np.float32(np.copysign(f32.max, v))
    if v != 0.0 and abs(v) < 2.0**-126:
        return np.float32(np.copysign(2.0**-126, v))
    f = np.float32(v)
    if float(f) == v:
        return f
    if abs(float(f)) > abs(v):
        f = np.nextafter(f, np.float32(0.0))
    return (np.asarray(f).view(np.uint32) | np.uint32(1)).view(np.float32)[()]


def requantize_exact_sums(sums, shift: int, special, ieee, row_scale, col_scale, y_scale,
                          y_zero_point, y_type: ElementType, scale_type: ElementType,
                          rule: str, opset) -> np.ndarray:
    """QLinearMatMul-21 with float8 operands: each exact sum S (sums * 2**-shift) through
    the output rule (docs/semantics.md). Python arithmetic: exact, not fast."""
    rows, cols = sums.shape
    float_out = y_type.kind == "small_float"
    values = np.empty((rows, cols), dtype=np.float32 if float_out else np.float64)
    zero_point = 0 if float_out else int(int_values(np.asarray(y_zero_point).reshape(-1), y_type)[0])
    unit = Fraction(1, 2**shift)
    for r in range(rows):
        for c in range(cols):
            sa, sb, sy = float(row_scale[r]), float(col_scale[c]), float(y_scale)
            exact: Fraction | None = None
            s_value = 0.0  # read only where exact is None
            if special[r, c]:
                s_value = float(ieee[r, c])
            else:
                exact = sums[r, c] * unit
            if rule == "exact":
                if exact is not None and all(np.isfinite([sa, sb, sy])) and sy != 0.0:
                    real = exact * Fraction(sa) * Fraction(sb) / Fraction(sy)
                    if float_out:
                        values[r, c] = float_to_odd_float32(fraction_to_odd_double(real))
                    else:
                        values[r, c] = float(min(max(round(real), -2**40), 2**40))
                    continue
                with np.errstate(all="ignore"):
                    v = (float(exact) if exact is not None else s_value) * sa * sb / sy
                values[r, c] = v if float_out else v
                continue
            acc = s_value if exact is None else fraction_to_odd_double(exact)
            with np.errstate(all="ignore"):
                if rule == "float32":
                    m = np.float32(np.float32(np.float32(sa) * np.float32(sb)) / np.float32(sy))
                    v = np.float32(np.float32(acc) * m)
                    values[r, c] = v if float_out else np.rint(v)
                else:
                    t = scale_type.dtype.type
                    m = float(t(t(sa) * t(sb)) / t(sy))
                    d = float(acc) * m
                    values[r, c] = float_to_odd_float32(d) if float_out else d + zero_point
    if float_out:
        return encode_float8(values, y_zero_point, opset)
    if rule == "float64":
        rounded = np.rint(values)
    else:
        rounded = values + zero_point
    lo, hi = float(y_type.lo or 0), float(y_type.hi or 0)
    codes = np.where(np.isnan(rounded), lo, np.clip(np.nan_to_num(rounded, nan=lo), lo, hi))
    return codes.astype(np.int64).astype(y_type.dtype)


def where_label(spec: OpSpec, opset) -> str:
    return label(spec, opset)


INT32 = ELEMENT_TYPES["int32"]
