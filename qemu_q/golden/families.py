"""Golden-suite input families: the data of each case (inputs and attributes built from
its configuration, one builder per op and family) and its expected outputs, computed by
`qemu_q.run_op`. The families are listed in the package docstring (qemu_q/golden).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterator

import ml_dtypes
import numpy as np

from .._dtypes import ELEMENT_TYPES, ElementType
from .._opspec import get_spec
from .._threads import in_default_fp_environment
from ..datapath import Datapath, as_datapath
from .configs import Config, Selection, iter_configs
from .datapaths import RANDOM_BITS_INPUT, run_node
from .divergences import divergences_of
from .integer_families import accumulator, integer_inputs
from .block_scaled import BLOCK_SCALED_OPS, block_scaled_case

DEFAULT_SEED = 0
DEFAULT_SIZE = 64

# Code count of a DequantizeLinear sweep of 16-bit codes outside their first version (the
# first version that has them gets all 65536).
_CODE_SAMPLE = 1024


def _etype(name: str) -> ElementType:
    return ELEMENT_TYPES[name]


@dataclass
class Case:
    config: Config
    opset: int
    attributes: dict[str, int]  # the node's attributes, only those given explicitly
    inputs: list[tuple[str, np.ndarray]]  # ONNX input names in node order (absent omitted)
    outputs: list[tuple[str, np.ndarray]] = field(default_factory=list)
    divergences: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    # Values that are not node outputs, written beside them for RTL teams (.npz and hex):
    # the int32 accumulator of the QLinear ops.
    extras: list[tuple[str, np.ndarray]] = field(default_factory=list)
    # A multi-node model (MX, NVFP4: the dequantize graph); None for a single-node case.
    model_builder: object = None
    # The datapath the outputs were computed with (the ONNX default unless a suite for a
    # described datapath: `qemu-q golden --datapath`).
    datapath: Datapath = field(default_factory=Datapath)

    @property
    def onnx_expressible(self) -> bool:
        """Whether an ONNX model computes the case's outputs: only the default datapath."""
        return self.datapath.is_onnx

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def op_type(self) -> str:
        return self.config.op_type

    @property
    def divergence(self) -> str | None:
        return self.divergences[0][0] if self.divergences else None


# Seeded by the case name, not drawn from one stream: a case's bits do not depend on
# which other cases are selected.
def _rng(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _finfo(etype: ElementType):
    return np.finfo(etype.dtype) if etype.name in ("float", "float16") else \
        ml_dtypes.finfo(etype.dtype)


def _max_finite(etype: ElementType) -> float:
    return float(_finfo(etype).max)


def _smallest_subnormal(etype: ElementType) -> float:
    return float(_finfo(etype).smallest_subnormal)


def _smallest_normal(etype: ElementType) -> float:
    return float(_finfo(etype).smallest_normal)


def _all_codes(etype: ElementType) -> np.ndarray:
    """Every code of a type of at most 8 bits, as an array of that type, in code order."""
    if etype.kind == "integer":
        return etype.code_values(np.arange(1 << etype.bits)).astype(etype.dtype)
    return np.arange(1 << etype.bits, dtype=np.uint8).view(etype.dtype)


def _finite_codes(etype: ElementType) -> np.ndarray:
    codes = _all_codes(etype)
    if etype.kind == "integer":
        return codes
    return codes[np.isfinite(codes.astype(np.float32))]


def _finite_values(etype: ElementType) -> np.ndarray:
    """Sorted distinct finite values of a small float type, -0 folded into +0."""
    return np.unique(_finite_codes(etype).astype(np.float64)) + 0.0


def _cast(values, etype: ElementType) -> np.ndarray:
    """float64 values to `etype`: floats rounded to nearest, integers rounded and clipped.

    (bfloat16 and the small floats are reached through float32; these are inputs, whose
    exact bits are what they are.)"""
    values = np.asarray(values, dtype=np.float64)
    if etype.kind == "integer":
        with np.errstate(invalid="ignore"):
            return np.asarray(np.clip(np.rint(values), etype.lo, etype.hi)).astype(etype.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is intended
        if etype.name in ("float", "float16"):
            return values.astype(etype.dtype)
        return values.astype(np.float32).astype(etype.dtype)


def _scalar(value: float, etype: ElementType) -> np.ndarray:
    return np.array(_cast(np.array(value), etype)).reshape(())


def _bits_view(array: np.ndarray) -> np.ndarray:
    return array.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[array.dtype.itemsize])


def _with_neighbours(x: np.ndarray, etype: ElementType, steps: int = 1) -> np.ndarray:
    """x and its `steps` nearest neighbours each side in x's type: finite, distinct, sorted."""
    if etype.kind == "integer":
        wide = x.astype(np.int64)
        out = np.clip(np.concatenate([wide + d for d in range(-steps, steps + 1)]),
                      etype.lo, etype.hi)
        return np.unique(out).astype(etype.dtype)
    parts, up, down = [x], x, x
    for _ in range(steps):
        up = np.nextafter(up, np.array(np.inf, dtype=x.dtype))
        down = np.nextafter(down, np.array(-np.inf, dtype=x.dtype))
        parts += [up, down]
    out = np.concatenate(parts)
    out = out[np.isfinite(out.astype(np.float64))]
    _, index = np.unique(_bits_view(out), return_index=True)
    out = out[index]
    return out[np.argsort(out.astype(np.float64), kind="stable")]


def _zero_point_value(q: ElementType) -> int:
    """A nonzero, asymmetric zero point for the integer types (0 for the others)."""
    if q.kind != "integer" or q.name == "int32":
        return 0
    return int(q.lo + (q.hi - q.lo + 1) // 3)


def _pow2_scale(c: Config) -> float:
    # An int32 x or scale needs an even scale for x / scale to hit k + 0.5.
    return 2.0 if "int32" in (c.x_type, c.scale_type) else 0.125


def _awkward_scale(c: Config) -> float:
    if c.scale_type == "int32":
        # a float x over 2^24 + 1: quotients with more bits than float32 holds
        return 3.0 if c.op_type == "DequantizeLinear" else 16777217.0
    if c.scale_type == "float8e8m0":
        return 2.0**-5
    return 0.0731 if c.x_type != "int32" else 0.3


def _sample_ints(lo: int, hi: int, rng: np.random.Generator, edge: int = 24,
                 middle: int = 64) -> np.ndarray:
    """All of [lo, hi] when small; else both ends, around zero and a random sample."""
    if hi - lo < 4 * edge + middle:
        return np.arange(lo, hi + 1, dtype=np.int64)
    parts = [np.arange(lo, lo + edge), np.arange(hi - edge + 1, hi + 1),
             np.arange(max(lo, -edge // 2), min(hi, edge // 2) + 1),
             rng.integers(lo, hi + 1, size=middle)]
    return np.unique(np.concatenate(parts).astype(np.int64))


def _midpoints(q: ElementType) -> np.ndarray:
    """Positive midpoints between consecutive finite values of a small float type."""
    values = _finite_values(q)
    positive = values[values > 0]
    return (np.concatenate([[0.0], positive[:-1]]) + positive) / 2


def _grid_quotients(c: Config, q: ElementType, zp: int, rng) -> np.ndarray:
    """Target quotients x / scale: ties, range ends and values just past them."""
    if q.kind == "integer":
        a, b = q.lo - zp, q.hi - zp  # the quotients that land on the range ends
        ties = _sample_ints(a - 1, b, rng) + 0.5
        ends = np.array([a, b, a - 1, b + 1, a - 2, b + 2, a - 1.5, b + 1.5, 2 * a - 3,
                         2 * b + 3, a - 100.5, b + 100.5], dtype=np.float64)
        return np.concatenate([ties, ends])
    values = _finite_values(q)
    positive = values[values > 0]
    top = positive[-1]
    step = top - positive[-2]  # the spacing at the top of the range
    past = np.array([top + step / 2, top + step * 0.75, top + step, top + step * 1.5,
                     top + step * 2, 2 * top, 4 * top])
    if c.saturate == 0:
        # saturate changes nothing below the top of the range
        magnitudes = np.concatenate([positive[-4:], _midpoints(q)[-4:], past])
    else:
        magnitudes = np.concatenate([positive, _midpoints(q), past])
    return np.concatenate([magnitudes, -magnitudes])


def _fits_precision(x: np.ndarray, scale: float, c: Config) -> np.ndarray:
    """Mask of x whose quotient does not overflow the division precision (float16 can:
    65520 and beyond round to inf; those belong to the overflow family)."""
    if c.division_precision != "float16":
        return np.ones(x.shape, dtype=bool)
    return np.abs(x.astype(np.float64) / scale) < 65520.0


def _x_grid(c: Config, q, x_t, zp: int, scale: float, rng, quotients=None, steps=1):
    if quotients is None:
        quotients = _grid_quotients(c, q, zp, rng)
    x = _with_neighbours(_cast(quotients * scale, x_t), x_t, steps)
    return x[_fits_precision(x, scale, c)]


def _int32_near_ties(targets: np.ndarray) -> tuple[np.ndarray, float]:
    """int32 x = target·2^m + d (|d| <= 2) with the scale 2^m: quotients a few 2^-m from
    the ties, more bits than float32 holds (so a float32 quotient lands on the tie)."""
    largest = float(np.max(np.abs(targets)))
    m = min(19, 29 - math.ceil(math.log2(largest + 1)))
    exact = targets * 2.0**m
    exact = exact[(exact == np.rint(exact)) & (np.abs(exact) < 2**30)]
    x = np.unique(np.concatenate([exact + d for d in (-2, -1, 0, 1, 2)]))
    return x.astype(np.int32), 2.0**m


def _x_zeros(x: ElementType) -> np.ndarray:
    sub, normal = _smallest_subnormal(x), _smallest_normal(x)
    return _cast(np.array([0.0, -0.0, sub, -sub, 2 * sub, -2 * sub, normal - sub,
                           -(normal - sub)]), x)


def _x_nan(x: ElementType) -> np.ndarray:
    """Quiet NaN, -NaN, and signalling NaNs of both signs, by bit pattern."""
    bits = x.storage.itemsize * 8
    exponent_bits = {"float": 8, "float16": 5, "bfloat16": 8, "double": 11}[x.name]
    mantissa_bits = bits - 1 - exponent_bits
    exp_all = ((1 << exponent_bits) - 1) << mantissa_bits
    quiet = exp_all | (1 << (mantissa_bits - 1))
    sign = 1 << (bits - 1)
    patterns = [quiet, quiet | sign, exp_all | 1, exp_all | 1 | sign, quiet | 1]
    storage = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    return np.array(patterns, dtype=storage).view(x.dtype)


def _x_overflow(c: Config, q: ElementType, x: ElementType, scale: float) -> np.ndarray:
    if x.name == "int32":
        values = [2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1, 2**30 + 1, -(2**30 + 1)]
        return np.array(values, dtype=np.int32)
    top = _max_finite(x)
    values = [np.inf, -np.inf, top, -top]
    values += [q_ * scale for q_ in (2.0**31, -(2.0**31), 2.0**32, -(2.0**32), 1e10, -1e10,
                                     1e30, -1e30)]
    if c.division_precision == "float16":
        values += [65520 * scale, -65520 * scale, 65536 * scale, -65536 * scale]
    out = _cast(np.array(values), x)
    _, index = np.unique(_bits_view(out), return_index=True)
    return out[np.sort(index)]


def _random_quotients(q: ElementType, zp: np.ndarray, n: int, rng) -> np.ndarray:
    """Random quotients over the quantized range and a little past it, per element."""
    if q.kind == "integer":
        lo, hi = q.lo - zp, q.hi - zp
        span = hi - lo
        return rng.uniform(lo - 0.05 * span - 1, hi + 0.05 * span + 1, size=n)
    top = _max_finite(q)
    tiny = _smallest_subnormal(q)
    magnitude = np.exp2(rng.uniform(math.log2(tiny / 2), math.log2(top * 1.1), size=n))
    return np.where(rng.random(n) < 0.5, -magnitude, magnitude)


def _random_scales(c: Config, count: int, rng) -> np.ndarray:
    s = _etype(c.scale_type)
    if s.name == "int32":
        return rng.integers(1, 9, size=count).astype(np.int32)
    if s.name == "float8e8m0":
        return np.exp2(rng.integers(-8, 3, size=count)).astype(np.float32).astype(s.dtype)
    return _cast(np.exp(rng.uniform(math.log(0.01), math.log(1.0), size=count)), s)


def _random_shape(size: int) -> tuple[int, int, int]:
    return (2, 3, max(4, -(-size // 6)))


def _block_size(length: int) -> int:
    """A block size that leaves a partial last block when one exists."""
    for b in range(3, length):
        if length % b:
            return b
    return 2 if length > 2 else 1


def _granularity_params(c: Config, shape) -> tuple[tuple[int, ...], dict, tuple]:
    """Scale shape, node attributes, and how a scale broadcasts back to x."""
    if c.granularity == "per_tensor":
        return (), {}, ()
    if c.granularity == "per_axis":
        return (shape[1],), {}, ()  # axis left at its default, 1
    axis = len(shape) - 1
    b = c.block_size or _block_size(shape[axis])
    scale_shape = tuple(shape[:axis]) + (-(-shape[axis] // b),)
    return scale_shape, {"axis": -1, "block_size": b}, (axis, b)


def _expand(params: np.ndarray, shape, c: Config, how) -> np.ndarray:
    """Per-element view of scale-shaped parameters (float64)."""
    p = params.astype(np.float64)
    if c.granularity == "per_tensor":
        return np.broadcast_to(p, shape)
    if c.granularity == "per_axis":
        return np.broadcast_to(p.reshape(1, -1, *([1] * (len(shape) - 2))), shape)
    axis, b = how
    return np.repeat(p, b, axis=axis)[(slice(None),) * axis + (slice(0, shape[axis]),)]


def _zero_points(c: Config, q: ElementType, scale_shape, rng) -> np.ndarray:
    if q.kind == "integer":
        if c.family == "random":
            return rng.integers(q.lo, q.hi + 1, size=scale_shape).astype(q.dtype)
        return np.full(scale_shape, _zero_point_value(q)).astype(q.dtype)
    return np.zeros(scale_shape, dtype=np.float32).astype(q.dtype)


def _special_scales(c: Config) -> np.ndarray:
    s = _etype(c.scale_type)
    if s.name == "float8e8m0":
        # codes: 2^-127 and 2^-126 overflow most quotients; 255 is NaN
        codes = [0, 1, 255] if c.family == "scales_zero" else [124, 127, 128, 200, 254]
        return np.array(codes, dtype=np.uint8).view(s.dtype)
    if c.family == "scales":
        values = [1.0, -0.5, -3.0, 0.01, _max_finite(s)]
    elif c.family == "scales_zero":
        values = [0.0, -0.0, np.nan, _smallest_subnormal(s)]
    elif c.family == "scales_inf":
        values = [np.inf, -np.inf]
    else:  # DequantizeLinear: all of them over a few codes
        values = [1.0, -0.5, _max_finite(s), _smallest_subnormal(s), 0.0, -0.0, np.inf,
                  -np.inf, np.nan]
    return _cast(np.array(values), s)


def _node(c: Config, x, scale, zero_point, attributes: dict[str, int]):
    """The node's inputs under the spec's names (the zero point where the configuration
    gives one) and its attributes: the granularity's, then those the configuration sets."""
    names = [p.name for p in get_spec(c.op_type, c.version).inputs]
    inputs = list(zip(names, (x, scale, zero_point) if c.zero_point else (x, scale)))
    if c.saturate is not None:
        attributes["saturate"] = c.saturate
    if c.precision is not None:
        attributes["precision"] = c.precision
    if c.output_dtype is not None:
        attributes["output_dtype"] = _etype(c.output_dtype).onnx_id
    return inputs, attributes


def _q_inputs(c: Config, seed: int, size: int):
    rng = _rng(seed, c.name)
    q, x_t, s_t = _etype(c.qtype), _etype(c.x_type), _etype(c.scale_type)
    attributes: dict[str, int] = {}
    zp_value = _zero_point_value(q)
    zp = np.array(_cast(np.array(zp_value), q)).reshape(())
    if c.family == "grid":
        scale = _pow2_scale(c)
        x = _x_grid(c, q, x_t, zp_value, scale, rng)
        scale_a = _scalar(scale, s_t)
    elif c.family == "near_ties":
        if q.kind == "integer":
            quotients = _sample_ints(q.lo - zp_value - 1, q.hi - zp_value, rng, edge=12,
                                     middle=48) + 0.5
        else:
            quotients = np.concatenate([_midpoints(q), -_midpoints(q)])
        if x_t.name == "int32":
            x, scale = _int32_near_ties(quotients)
            scale_a = _scalar(scale, s_t)
        else:
            scale_a = _scalar(_awkward_scale(c), s_t)
            scale = float(scale_a.astype(np.float64))
            x = _x_grid(c, q, x_t, zp_value, scale, rng, quotients, steps=2)
    elif c.family in ("zeros", "nan", "overflow"):
        scale = _pow2_scale(c)
        scale_a = _scalar(scale, s_t)
        x = {"zeros": lambda: _x_zeros(x_t), "nan": lambda: _x_nan(x_t),
             "overflow": lambda: _x_overflow(c, q, x_t, scale)}[c.family]()
    elif c.family == "random":
        shape = _random_shape(size)
        scale_shape, attributes, how = _granularity_params(c, shape)
        scale_a = _random_scales(c, math.prod(scale_shape), rng).reshape(scale_shape)
        zp = _zero_points(c, q, scale_shape, rng)
        zp_e = _expand(zp, shape, c, how).reshape(-1) if q.kind == "integer" else 0
        quotients = _random_quotients(q, zp_e, math.prod(shape), rng)
        x = _cast(quotients * _expand(scale_a, shape, c, how).reshape(-1), x_t).reshape(shape)
    elif c.family in ("scales", "scales_zero", "scales_inf"):
        scale_a = _special_scales(c)
        column = [1.0, -1.0, 0.25, -0.001, 3.0, 100.0]
        if c.family == "scales_zero":
            column.append(0.0)
        x = _cast(np.repeat(np.array(column)[:, None], scale_a.size, axis=1), x_t)
        zp = _zero_points(c, q, scale_a.shape, rng)
    else:
        raise ValueError(f"QuantizeLinear has no input family {c.family!r}")
    return _node(c, x, scale_a, zp, attributes)


def _dq_codes(c: Config, q: ElementType, rng) -> np.ndarray:
    if q.name == "int32":
        special = [0, 1, -1, 2, -2, 2**24 - 1, 2**24, 2**24 + 1, 2**24 + 3, -(2**24 + 1),
                   2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1, 2**30 + 1, 123456789]
        randoms = rng.integers(-(2**31), 2**31, size=48)
        return np.concatenate([special, randoms]).astype(np.int32)
    if q.bits == 16:
        if c.full_sweep:
            return np.arange(q.lo, q.hi + 1).astype(q.dtype)
        return _sample_ints(q.lo, q.hi, rng, edge=128, middle=_CODE_SAMPLE - 4 * 128) \
            .astype(q.dtype)
    return _finite_codes(q)


def _output_spacing(values: np.ndarray, out: ElementType) -> np.ndarray:
    """The spacing of `out` (float16/bfloat16) at |values|, normal or subnormal."""
    mantissa = {"float16": 10, "bfloat16": 7}[out.name]
    tiny = _smallest_normal(out)
    magnitude = np.maximum(np.abs(values), tiny)
    return np.exp2(np.floor(np.log2(magnitude)) - mantissa)


def _dq_near_ties(c: Config, q: ElementType, scale: float, zp: int, rng) -> np.ndarray:
    """Codes whose exact product lies nearest a midpoint of the output type (up to 96)."""
    if q.name == "int32":
        candidates = np.concatenate([rng.integers(-(2**31), 2**31, size=1 << 16),
                                     rng.integers(-(2**26), 2**26, size=1 << 16)])
        candidates = candidates.astype(np.int32)
    elif q.bits == 16:
        candidates = np.arange(q.lo, q.hi + 1).astype(q.dtype)
    else:
        candidates = _finite_codes(q)
    values = candidates.astype(np.float64) - zp
    # exact for every code type but int32 (where float64 is close enough to choose codes)
    product = values * scale
    spacing = _output_spacing(product, _etype(c.y_type))
    distance = np.abs(np.abs(product) / spacing % 1.0 - 0.5)
    distance[product == 0] = 1.0
    order = np.argsort(distance, kind="stable")[:96]
    return candidates[np.sort(order)]


def _dq_inputs(c: Config, seed: int, size: int):
    rng = _rng(seed, c.name)
    q, s_t = _etype(c.qtype), _etype(c.scale_type)
    attributes: dict[str, int] = {}
    zp_value = _zero_point_value(q)
    zp = np.array(_cast(np.array(zp_value), q)).reshape(())
    if c.family == "codes":
        x = _dq_codes(c, q, rng)
        scale_a = _scalar(_awkward_scale(c), s_t)
    elif c.family == "nan_inf":
        codes = _all_codes(q)
        x = codes[~np.isfinite(codes.astype(np.float32))]
        scale_a = _scalar(_awkward_scale(c), s_t)
    elif c.family == "near_ties":
        scale_a = _scalar(_awkward_scale(c), s_t)
        x = _dq_near_ties(c, q, float(scale_a.astype(np.float64)), zp_value, rng)
    elif c.family == "random":
        shape = _random_shape(size)
        scale_shape, attributes, _how = _granularity_params(c, shape)
        scale_a = _random_scales(c, math.prod(scale_shape), rng).reshape(scale_shape)
        zp = _zero_points(c, q, scale_shape, rng)
        if q.name == "int32":
            x = rng.integers(-(2**31), 2**31, size=shape).astype(np.int32)
        else:
            codes = _finite_codes(q) if q.bits <= 8 else None
            if codes is None:
                x = rng.integers(q.lo, q.hi + 1, size=shape).astype(q.dtype)
            else:
                x = codes[rng.integers(0, codes.size, size=shape)]
    elif c.family == "scales":
        scale_a = _special_scales(c)
        if q.name == "int32":
            column = np.array([0, 1, -1, 2**24 + 1, 2**31 - 1, -(2**31)], dtype=np.int32)
        elif q.kind == "integer":
            column = np.array(sorted({q.lo, q.hi, 0, 1, zp_value, q.lo + 1}), dtype=np.int64) \
                .astype(q.dtype)
        else:
            finite = _finite_codes(q)
            values = finite.astype(np.float64)
            column = finite[[int(np.argmin(values)), int(np.argmax(values)),
                             int(np.argmin(np.abs(values - 1.0))), 0, 1]]
        x = np.repeat(column[:, None], scale_a.size, axis=1)
        zp = _zero_points(c, q, scale_a.shape, rng)
    else:
        raise ValueError(f"DequantizeLinear has no input family {c.family!r}")
    return _node(c, x, scale_a, zp, attributes)


def _dynamic_inputs(c: Config, seed: int, size: int):
    rng = _rng(seed, c.name)
    shape = _random_shape(size)
    n = math.prod(shape)
    if c.family == "random":
        x = rng.normal(0.0, 3.0, size=n)
    elif c.family == "positive":
        x = rng.uniform(0.5, 10.0, size=n)
    elif c.family == "negative":
        x = -rng.uniform(0.5, 10.0, size=n)
    elif c.family == "zeros":
        x = np.zeros(n)
        x[1::2] = -0.0
    elif c.family == "tiny":
        x = rng.normal(0.0, 1.0, size=n) * 1e-40
    elif c.family == "nan":
        x = rng.normal(0.0, 3.0, size=n)
        x[::7] = np.nan
    elif c.family == "inf":
        x = rng.normal(0.0, 3.0, size=n)
        x[3] = np.inf
    elif c.family == "neg_inf":
        x = rng.normal(0.0, 3.0, size=n)
        x[3] = -np.inf
    else:
        raise ValueError(f"DynamicQuantizeLinear has no input family {c.family!r}")
    return [("x", x.astype(np.float32).reshape(shape))], {}


# --------------------------------------------------------------------------------------
# Cast and CastLike: the source's values chosen by what the target can tell apart


def _float_landmarks(t: ElementType) -> tuple[list[float], list[float]]:
    """(values, midpoints) of a float-like target type, positive, as float64: the
    subnormal and normal ends, around 1 and the top of the range, and the midpoints
    between neighbours there (ties), with the overflow tie and magnitudes past max."""
    finfo = _finfo(t) if t.name != "double" else np.finfo(np.float64)
    sub, normal, top = (float(finfo.smallest_subnormal), float(finfo.smallest_normal),
                        float(finfo.max))
    one_ulp = float(finfo.eps)
    top_ulp = top - float(np.nextafter(np.array(top, dtype=t.dtype),
                                       np.array(0, dtype=t.dtype)).astype(np.float64))
    values = [sub, 2 * sub, 3 * sub, normal - sub, normal, normal + sub, 1.0, 1.0 + one_ulp,
              1.0 + 2 * one_ulp, 1.5, top - top_ulp, top]
    midpoints = [sub / 2, 3 * sub / 2, 5 * sub / 2, normal - sub / 2, normal + sub / 2,
                 1.0 + one_ulp / 2, 1.0 + 3 * one_ulp / 2, 1.0 - one_ulp / 4,
                 top - top_ulp / 2, top + top_ulp / 2, top + top_ulp, 2 * top]
    if t.kind == "small_float" and t.bits <= 6:
        values += [float(v) for v in _finite_values(t) if v > 0]
        midpoints += [float(v) for v in _midpoints(t) if v > 0]
    return values, midpoints


def _e8m0_landmarks() -> tuple[list[float], list[float]]:
    exponents = (-127, -126, -125, -1, 0, 1, 125, 126, 127)
    values = [2.0**k for k in exponents] + [2.0**-128, 2.0**-149, 0.75 * 2.0**-127, 2.0**128,
                                            -1.0, -(2.0**-127)]
    midpoints = [1.5 * 2.0**k for k in exponents]  # where "nearest" ties go up
    return values, midpoints


def _integer_landmarks(t: ElementType) -> list[float]:
    """Values around an integer or bool target's range ends and wrap points, fractions
    (truncation, ties) and magnitudes beyond every integer type."""
    if t.kind == "bool":
        return [0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 255.0, 256.0, 65536.0, 2.0**32]
    lo, hi, span = t.lo, t.hi, 1 << t.bits
    ends = [lo - 2, lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, hi + 2, span, span + 1,
            -span, span + hi, lo - span // 2]
    fractions = [0.25, 0.5, 0.75, 1.5, 2.5, lo - 0.5, hi + 0.5, hi - 0.5, lo + 0.5]
    beyond = [2.0**31, 2.0**32, 2.0**63, 2.0**64, 1e30]
    return [float(v) for v in ends] + fractions + [-f for f in fractions] + beyond + \
        [-b for b in beyond] + [0.0, 1.0, -1.0]


def _cast_probes(t: ElementType, s: ElementType) -> tuple[np.ndarray, np.ndarray]:
    """(exact points, points whose neighbours in the source matter), float64."""
    if t.kind in ("integer", "bool"):
        return np.array(_integer_landmarks(t)), np.array([])
    if t.name == "float8e8m0":
        values, midpoints = _e8m0_landmarks()
    elif t.name == "double" or (t.kind == s.kind == "value" and t.bits > s.bits
                                and t.name != "bfloat16"):
        # every source value is exact in the target: the source's own landmarks
        values, midpoints = _float_landmarks(s) if s.kind != "integer" else ([], [])
        midpoints = []
    else:
        values, midpoints = _float_landmarks(t)
    values, midpoints = np.array(values), np.array(midpoints)
    return (np.concatenate([values, -values]), np.concatenate([midpoints, -midpoints]))


def _integer_source(values: np.ndarray, s: ElementType) -> np.ndarray:
    """The integral values in the source's range, exactly (Python ints for 64 bits)."""
    picked = sorted({int(v) for v in values if np.isfinite(v) and v == math.floor(v)
                     and s.lo <= int(v) <= s.hi})
    return np.array(picked, dtype=object).astype(s.dtype)


def _float_source(points: np.ndarray, near: np.ndarray, s: ElementType) -> np.ndarray:
    exact = _cast(points, s)
    ties = _cast(near, s)
    if ties.size:
        ties = _with_neighbours(ties[np.isfinite(ties.astype(np.float64))], s)
    out = np.concatenate([exact, ties])
    out = out[np.isfinite(out.astype(np.float64))]
    _, index = np.unique(_bits_view(out), return_index=True)
    return out[np.sort(index)]


def _source_specials(s: ElementType) -> np.ndarray:
    finfo = _finfo(s) if s.name != "double" else np.finfo(np.float64)
    sub, normal, top = finfo.smallest_subnormal, finfo.smallest_normal, finfo.max
    finite = np.array([0.0, -0.0, np.inf, -np.inf, sub, -sub, normal - sub, -(normal - sub),
                       normal, -normal, top, -top], dtype=np.float64)
    values = finite.astype(s.dtype) if s.name in ("float", "float16", "double") else \
        np.array([float(v) for v in finite], dtype=np.float64).astype(np.float32).astype(s.dtype)
    return np.concatenate([values, _x_nan(s)])


def _all_source_codes(s: ElementType) -> np.ndarray:
    if s.kind == "bool":
        return np.array([False, True])
    return _all_codes(s)


def _cast_inputs(c: Config, seed: int, size: int):
    s, t = _etype(c.x_type), _etype(c.qtype)
    if c.family == "codes":
        x = _all_source_codes(s)
    elif c.family == "values":
        points, near = _cast_probes(t, s)
        if s.kind == "integer":
            extra = [s.lo, s.lo + 1, -1, 0, 1, s.hi - 1, s.hi]
            x = _integer_source(np.concatenate([points, near, np.array(extra, dtype=float)]),
                                s)
            if s.bits == 64:  # float64 cannot hold these ends exactly
                ends = [s.lo, s.lo + 1, s.hi - 1, s.hi, 2**53 + 1, 2**63 - 2**10 + 1]
                ends = [v for v in ends if s.lo <= v <= s.hi]
                x = np.concatenate([x, np.array(ends, dtype=object).astype(s.dtype)])
            if t.kind in ("value", "float64", "small_float") and s.bits >= 16:
                # integers one past the target's significand: ties of round-to-even
                bits = {"float": 24, "float16": 11, "bfloat16": 8, "double": 53}.get(t.name)
                if bits is not None and bits < s.bits - (s.lo < 0):
                    ties = [2**bits + 1, 2**bits + 3, 2**(bits + 1) + 2, 2**(bits + 1) + 6]
                    ties += [-v for v in ties]
                    ties = [v for v in ties if s.lo <= v <= s.hi]
                    x = np.concatenate([x, np.array(ties, dtype=object).astype(s.dtype)])
        else:
            x = _float_source(points, near, s)
    elif c.family == "specials":
        x = _source_specials(s)
    else:
        raise ValueError(f"{c.op_type} has no input family {c.family!r}")
    attributes: dict = {}
    inputs = [("input", np.ascontiguousarray(x))]
    if c.op_type == "Cast":
        # Cast-1's `to` is a string attribute, the TensorProto.DataType name
        attributes["to"] = t.name.upper() if c.version == 1 else t.onnx_id
    else:
        inputs.append(("target_type", np.zeros(1, dtype=t.storage).view(t.dtype)))
    if c.saturate is not None:
        attributes["saturate"] = c.saturate
    if c.round_mode is not None:
        attributes["round_mode"] = c.round_mode
    return inputs, attributes


def _integer_op_inputs(c: Config, seed: int, size: int):
    return integer_inputs(c, _rng(seed, c.name))


_INPUTS = {
    "QuantizeLinear": _q_inputs,
    "DequantizeLinear": _dq_inputs,
    "DynamicQuantizeLinear": _dynamic_inputs,
    "Cast": _cast_inputs,
    "CastLike": _cast_inputs,
    "MatMulInteger": _integer_op_inputs,
    "ConvInteger": _integer_op_inputs,
    "QLinearMatMul": _integer_op_inputs,
    "QLinearConv": _integer_op_inputs,
}


@in_default_fp_environment
def build_case(config: Config, seed: int = DEFAULT_SEED, size: int = DEFAULT_SIZE,
               datapath: Datapath | None = None) -> Case:
    """The case's inputs, attributes and expected outputs (computed by qemu_q), under
    `datapath` (None: the ONNX default). Every op call goes through `datapaths.call_op`.
    A case under a non-default datapath lists no peer divergence (the table compares
    the ONNX bits); with stochastic rounding its words are the input `random_bits`."""
    if not isinstance(config, Config):
        raise TypeError(f"config must be a qemu_q.golden Config (from iter_configs), got "
                        f"{type(config).__name__} {config!r}"[:300])
    _check_seed_and_size(seed, size)
    datapath = as_datapath(datapath)
    divergences = divergences_of(config) if datapath.is_onnx else []
    if config.op_type in BLOCK_SCALED_OPS:
        inputs, outputs, extras, builder = block_scaled_case(config, _rng(seed, config.name),
                                                             datapath, seed)
        for _name, array in inputs + outputs + extras:
            array.flags.writeable = False
        return Case(config=config, opset=config.version, attributes={}, inputs=inputs,
                    outputs=outputs, divergences=divergences, extras=extras,
                    model_builder=builder, datapath=datapath)
    inputs, attributes = _INPUTS[config.op_type](config, seed, size)
    inputs = [(name, np.ascontiguousarray(array)) for name, array in inputs]
    for _name, array in inputs:
        array.flags.writeable = False
    spec = get_spec(config.op_type, config.version)
    results, bits = run_node(config.op_type, [a for _n, a in inputs], attributes,
                             config.version, datapath, seed, config.name)
    outputs = [(p.name, np.asarray(r)) for p, r in zip(spec.outputs, results)]
    acc = accumulator(config, inputs, attributes, datapath) if config.w_type is not None else None
    extras = [] if acc is None else [("accumulator", acc)]
    if bits is not None:
        bits.flags.writeable = False
        inputs = inputs + [(RANDOM_BITS_INPUT, bits)]
    return Case(config=config, opset=config.version, attributes=attributes, inputs=inputs,
                outputs=outputs, divergences=divergences, extras=extras, datapath=datapath)


def generate(selection: Selection | None = None, seed: int = DEFAULT_SEED,
             size: int = DEFAULT_SIZE, datapath: Datapath | None = None) -> Iterator[Case]:
    # checked at the call, not at the first case: the generator's body runs later
    if selection is not None and not isinstance(selection, Selection):
        raise TypeError(f"selection must be a qemu_q.golden.Selection or None, got "
                        f"{type(selection).__name__} {selection!r}"[:300])
    _check_seed_and_size(seed, size)
    as_datapath(datapath)
    return (build_case(config, seed, size, datapath) for config in iter_configs(selection))


def _check_seed_and_size(seed, size) -> None:
    # (the CLI's --seed and --size: any int seeds the hash; a case has at least 1 element)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"size must be an int >= 1, got {type(size).__name__} {size!r}")
    if size < 1:
        raise ValueError(f"size={size}; a case needs at least 1 element (allowed: an int >= 1)")
