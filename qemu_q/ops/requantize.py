"""Integer-only requantization: `requantize` (int32 accumulators through a compiler's
fixed-point multiplier and shift, plus a zero point, saturated to an integer type) and
`quantize_multiplier` (the (multiplier, shift) a compiler derives from a real scale).

Schemes: "tosa32", "tosa16" (TOSA RESCALE's apply_scale_32 / apply_scale_16), "gemmlowp"
(TFLite's default MultiplyByQuantizedMultiplier), "tflite_single" (TFLITE_SINGLE_ROUNDING),
"tvm_upward", "tvm_tonearest" (TVM's FixedPointMultiply). Every rule, with the source it
transcribes, is in docs/semantics.md ("Integer-only requantization"); the kernel in
pyx/_requantize.pyx and pyx/_fixedpoint.pxd.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import _coerce, _dispatch
from .._buffers import finish_output, flat_storage, kernel_output, prepare_output
from .._dispatch import Path
from .._dtypes import ElementType, element_type
from .._threads import in_default_fp_environment, resolve_threads
from .._validate import cached_plan
from ..codecs import INTEGER_BITS, is_family

SCHEMES = ("tosa32", "tosa16", "gemmlowp", "tflite_single", "tvm_upward", "tvm_tonearest")

# (lowest, highest) accepted shift and multiplier per scheme: the kernel module's tables
# (docs/semantics.md), one home. TOSA's shift is a right shift; the others' shift is
# TFLite's exponent (> 0 shifts left).
from .._requantize import MULTIPLIER_RANGES, SHIFT_RANGES  # noqa: E402
# The ONNX integer types by name; beside them every codec-family integer type
# (qemu_q.integer_type: 2..16 bits, signed or not, narrow_range).
OUTPUT_TYPES = ("int8", "uint8", "int16", "uint16", "int4", "uint4", "int2", "uint2", "int32")
_ALLOWED = (f"{', '.join(OUTPUT_TYPES)}, or a codec-family integer type "
            f"(qemu_q.integer_type(bits, signed, narrow_range), bits {INTEGER_BITS[0]}..{INTEGER_BITS[1]})")

# pyx/_fixedpoint.pxd's FixedPointStatus: why the source leaves an element undefined.
_STATUS = {
    1: "the TOSA REQUIRE value >= -(1 << (shift - 1)) && value < (1 << (shift - 1)) fails",
    2: "the scaled result is outside int32 (a TOSA REQUIRE / TFLite DCHECK)",
    3: "x * (1 << left_shift) overflows int32 (undefined behaviour in TFLite's C++)",
    4: "the int64 product or rounding sum overflows (TVM's int64 arithmetic is undefined there)",
}


@dataclass(frozen=True)
class RequantizePlan(_dispatch.KernelPlan):
    # kernel_fields: pyx/_requantize.pyx's RescaleConfig
    scheme: str = ""
    channels: int = 1
    PATH = Path.FIXED_POINT_REQUANTIZE
    CONFIG_CLASS = "RescaleConfig"


def _scheme(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"scheme must be a str, got {type(value).__name__} {value!r}; allowed {', '.join(map(repr, SCHEMES))}")
    if value not in SCHEMES:
        raise ValueError(f"scheme={value!r}; allowed {', '.join(map(repr, SCHEMES))}")
    return value


def _double_round(value, scheme: str) -> bool:
    if value is None:
        return False
    if scheme != "tosa32":
        raise ValueError(f"double_round={value!r} applies to scheme 'tosa32' only (scheme={scheme!r}); leave it None")
    return _coerce.flag(value, "double_round")


def _output_type(value) -> ElementType:
    etype = element_type(value, "output_dtype")
    if etype.name not in OUTPUT_TYPES and not (is_family(etype) and etype.kind == "integer"):
        raise ValueError(f"output_dtype={value!r} ({etype.name}); allowed {_ALLOWED}")
    return etype


def _axis(value) -> int:
    return _coerce.int_attribute(value, "axis")


@lru_cache(maxsize=512)
def requantize_plan(scheme, double_round, out_type, acc_shape, axis, channels) -> RequantizePlan:
    """channels: 0 for per-tensor parameters, else the per-channel length they share."""
    rank = len(acc_shape)
    inner = max(1, math.prod(acc_shape))  # per-tensor: one run of parameters
    count = 1
    if channels:
        if not -rank <= axis < rank:
            raise ValueError(f"requantize: axis={axis} is out of range for acc of rank {rank}; allowed [{-rank}, {rank - 1}]")
        axis %= rank
        if acc_shape[axis] != channels:
            raise ValueError(
                f"requantize: per-channel parameters have {channels} entries; they must have "
                f"acc.shape[{axis}] = {acc_shape[axis]} (or be scalars)")
        count = channels
        inner = max(1, math.prod(acc_shape[axis + 1:]))
    storage_bits = 8 * out_type.storage.itemsize
    fields = dict(scheme=scheme, double_round=double_round,
                  lo=int(out_type.lo), hi=int(out_type.hi), out_bytes=out_type.storage.itemsize,
                  # an ONNX type's code is its low `bits` bits (int4 in the low nibble); a
                  # family integer is stored as its value, the storage's two's complement
                  # (qemu_q/codecs.py), as quantize_linear writes it
                  mask=(1 << (storage_bits if is_family(out_type) else out_type.bits)) - 1,
                  channels=count, inner=inner)
    return RequantizePlan(f"requantize[{scheme}]", element_type("int32"), out_type,
                          tuple(fields.items()), scheme=scheme, channels=count)


def _parameter(value, name: str) -> np.ndarray:
    """An integer parameter as an int64 array of ndim 0 or 1 (values not yet range-checked)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int or an integer array, got {type(value).__name__} {value!r}")
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        array = np.asarray(value)
        if array.dtype.kind not in "iu":
            raise TypeError(f"{name} must have an integer dtype, got {array.dtype}")
        if array.ndim > 1:
            raise ValueError(f"{name} must be a scalar or 1-D (one entry per channel), got shape {array.shape}")
        if array.size == 0:
            raise ValueError(f"{name} is empty; it needs one entry, or one per channel")
        if array.dtype.kind == "u" and array.dtype.itemsize == 8 and int(array.max()) > 2**63 - 1:
            # an int64 view would wrap such a value into a negative one
            raise ValueError(f"{name} holds {int(array.max())}, outside int64")
        return array.astype(np.int64)
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int or an integer array, got {type(value).__name__} {value!r}") from None
    if not -2**63 <= number < 2**63:
        raise ValueError(f"{name}={number} is outside int64")
    return np.asarray(number, dtype=np.int64)


def _check_range(array: np.ndarray, name: str, lo: int, hi: int, what: str) -> None:
    bad = np.flatnonzero((array < lo) | (array > hi)) if array.ndim else ([0] if not lo <= int(array) <= hi else [])
    if len(bad):
        where = f"{name}[{int(bad[0])}]={int(array.reshape(-1)[bad[0]])}" if array.ndim else f"{name}={int(array)}"
        raise ValueError(f"{where} is outside {what} [{lo}, {hi}]")


def _per_channel(array: np.ndarray) -> int:
    return array.shape[0] if array.ndim == 1 and array.size > 1 else 0


def _channel_array(array: np.ndarray, count: int) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(array.reshape(-1), (count,)) if array.size == 1
                                else array, dtype=np.int32)


@in_default_fp_environment
def requantize(acc: np.ndarray, multiplier, shift, *, scheme: str, zero_point=0,
               output_dtype="int8", axis: int = 1, double_round: bool | None = None,
               out: np.ndarray | None = None, n_threads: int | None = None) -> np.ndarray:
    """Integer-only requantization of int32 accumulators:
    saturate(scheme(acc, multiplier, shift) + zero_point) in `output_dtype`.

    `scheme`: "tosa32", "tosa16", "gemmlowp", "tflite_single", "tvm_upward",
    "tvm_tonearest" (docs/semantics.md, "Integer-only requantization", gives each one's
    integer steps and source). `multiplier`, `shift` and `zero_point` are ints or integer
    arrays: scalars for per-tensor, 1-D of length acc.shape[axis] for per-channel (scalars
    broadcast). `shift` follows each scheme's own convention (TOSA: a right shift in
    [2, 62]; the others: TFLite's exponent, > 0 shifts left). `double_round` (tosa32 only;
    None means False). `output_dtype`: int8, uint8, int16, uint16, int4, uint4, int2, uint2,
    int32, or a codec-family integer type (`qemu_q.integer_type(bits, signed,
    narrow_range)`, 2..16 bits: the result saturates to its [lo, hi], e.g. [-127, 127]
    for `integer_type(8, narrow_range=True)`, and is an array of its storage, the values
    themselves: int8 for an int5, uint16 for a uint12); minifloat types are refused.
    `zero_point` must lie in the output type's [lo, hi]. An element the scheme's source
    leaves undefined (a TOSA REQUIRE, a TFLite DCHECK, a signed overflow) raises ValueError
    naming it.
    """
    acc = _coerce.as_array(acc, "acc")
    if acc.dtype != np.int32:
        raise TypeError(f"acc must be an int32 array (the accumulators), got dtype {acc.dtype}")
    scheme = _scheme(scheme)
    double_round = _double_round(double_round, scheme)
    out_type = _output_type(output_dtype)
    axis = _axis(axis)
    params = {name: _parameter(value, name) for name, value in
              (("multiplier", multiplier), ("shift", shift), ("zero_point", zero_point))}
    _check_range(params["multiplier"], "multiplier", *MULTIPLIER_RANGES[scheme], f"the {scheme} multiplier range")
    _check_range(params["shift"], "shift", *SHIFT_RANGES[scheme], f"the {scheme} shift range")
    _check_range(params["zero_point"], "zero_point", int(out_type.lo or 0), int(out_type.hi or 0), f"the {out_type.name} range")
    lengths = {name: _per_channel(array) for name, array in params.items() if _per_channel(array)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"per-channel parameters differ in length: "
                         + ", ".join(f"{name} has {n}" for name, n in lengths.items()))
    channels = next(iter(lengths.values()), 0)
    plan = cached_plan(requantize_plan, (scheme, double_round, out_type, acc.shape, axis, channels))
    result = prepare_output(out, acc.shape, out_type, [("acc", acc)])
    n_threads = resolve_threads(n_threads, acc.size)
    if acc.size == 0:
        return result
    arrays = [_channel_array(params[name], plan.channels) for name in ("multiplier", "shift", "zero_point")]
    storage = result.reshape(-1).view(out_type.storage)
    written = kernel_output(storage)
    bad, status = _dispatch.run(Path.FIXED_POINT_REQUANTIZE, flat_storage(acc, plan.x_type), *arrays,
                                written.view(np.uint8), plan.kernel_config(), n_threads)
    if bad >= 0:
        index = np.unravel_index(bad, acc.shape)
        channel = (bad // dict(plan.kernel_fields)["inner"]) % plan.channels
        raise ValueError(
            f"requantize[{scheme}]: acc{list(map(int, index))}={int(acc.reshape(-1)[bad])} with "
            f"multiplier={int(arrays[0][channel])}, shift={int(arrays[1][channel])}: "
            f"{_STATUS.get(status, status)}")
    finish_output(storage, written)
    return result


# ---------------------------------------------------------------------------------------
# quantize_multiplier

def _round_half_away(value: float) -> int:
    # std::round; value * 2^k of a frexp mantissa is exact, and so are floor and the rest
    magnitude = abs(value)
    whole = math.floor(magnitude)
    rounded = whole + (1 if magnitude - whole >= 0.5 else 0)
    return -rounded if value < 0 else rounded


def _frexp_fixed(scale: float, bits: int) -> tuple[int, int]:
    """(round(mantissa * 2^bits), exponent) with mantissa in [0.5, 1) as std::frexp gives
    it, the 2^bits case folded into the next exponent (TFLite, TVM and MLIR alike)."""
    mantissa, exponent = math.frexp(scale)
    fixed = _round_half_away(mantissa * (1 << bits))
    if fixed == 1 << bits:  # only the positive bound folds, as in every source
        fixed //= 2
        exponent += 1
    return fixed, exponent


def _one_multiplier(scale: float, scheme: str) -> tuple[int, int]:
    if math.isnan(scale) or math.isinf(scale):
        raise ValueError(f"real_scale={scale!r} is not finite")
    if scale < 0 and scheme in ("tosa32", "tosa16", "tflite_single"):
        raise ValueError(f"real_scale={scale!r} is negative; scheme {scheme!r} takes multipliers >= 0 only")
    lo, hi = SHIFT_RANGES[scheme]
    if scheme in ("tosa32", "tosa16"):
        bits = 31 if scheme == "tosa32" else 15
        fixed, exponent = _frexp_fixed(scale, bits)
        shift = bits - exponent
        if shift > 62:
            fixed >>= min(31, shift - 62)
            shift = 62
        if shift < 2:
            raise ValueError(
                f"real_scale={scale!r} is too large for {scheme}: its shift {shift} is below "
                f"the minimum 2 (scales below 2**{bits - 2} fit)")
        return fixed, shift
    if scale == 0:
        return 0, 0
    fixed, exponent = _frexp_fixed(scale, 31)
    if scheme in ("gemmlowp", "tflite_single"):
        if exponent < -31:
            return 0, 0
        if exponent > 30:
            if scheme == "tflite_single":
                return 2**31 - 1, 30
            raise ValueError(
                f"real_scale={scale!r} is too large for gemmlowp: its shift {exponent} is above "
                f"the maximum 30 (1 << 31 overflows int in TFLite's left shift)")
        return fixed, exponent
    if not lo <= exponent <= hi:
        raise ValueError(
            f"real_scale={scale!r} gives {scheme} the shift {exponent}, outside [{lo}, {hi}] "
            f"(TVM's rounding term 1 << (30 - shift) or its int64 shift would overflow)")
    return fixed, exponent


def _check_float64_values(given: np.ndarray, as_float64: np.ndarray) -> None:
    # A wider float (longdouble) is not rounded to float64 behind the caller's back: the
    # multiplier is derived from the value given, or from none.
    if given.dtype.kind == "f" and given.dtype.itemsize > 8:
        differs = (as_float64.astype(given.dtype) != given) & ~np.isnan(given)
        if differs.any():
            value = given.reshape(-1)[int(np.argmax(differs.reshape(-1)))]
            raise ValueError(f"real_scale holds {value!r} ({given.dtype}), which is not a float64 value; "
                             "pass the float64 scale the compiler uses (np.float64(...))")


@in_default_fp_environment
def quantize_multiplier(real_scale, scheme: str):
    """The (multiplier, shift) a compiler derives from a real scale for `scheme` (see
    docs/semantics.md): Python ints for a scalar, int32 arrays for an array of scales.
    A float64 scale is used as is; float16/float32 scales are widened exactly; a longdouble
    one must hold a float64 value (ValueError otherwise: no silent rounding)."""
    scheme = _scheme(scheme)
    if isinstance(real_scale, (bool, np.bool_)):
        raise TypeError(f"real_scale must be a float or a float array, got {type(real_scale).__name__}")
    if isinstance(real_scale, np.ndarray):
        if real_scale.dtype.kind not in "fiu":
            raise TypeError(f"real_scale must have a float dtype, got {real_scale.dtype}")
        scales = real_scale.astype(np.float64)
        _check_float64_values(real_scale, scales)
        pairs = []
        for i, s in enumerate(scales.reshape(-1).tolist()):
            try:
                pairs.append(_one_multiplier(s, scheme))
            except ValueError as error:
                raise ValueError(f"real_scale[{i}] (flat index): {error}") from None
        multipliers = np.array([m for m, _ in pairs], dtype=np.int32).reshape(scales.shape)
        shifts = np.array([s for _, s in pairs], dtype=np.int32).reshape(scales.shape)
        return multipliers, shifts
    if isinstance(real_scale, (float, int, np.floating, np.integer)):
        try:
            scale = float(real_scale)
        except OverflowError:
            raise ValueError(f"real_scale={real_scale!r} is not a finite float64") from None
        _check_float64_values(np.asarray(real_scale), np.asarray(scale))
        return _one_multiplier(scale, scheme)
    raise TypeError(f"real_scale must be a float or a float array, got {type(real_scale).__name__} {real_scale!r}")
