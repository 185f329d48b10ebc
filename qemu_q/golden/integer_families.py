"""Golden-suite inputs of the integer datapath ops: MatMulInteger, ConvInteger,
QLinearMatMul, QLinearConv (configurations in configs.py, `_integer_op_configs`).

Operand codes of an int8 operand are drawn from [-64, 63] (its zero point from the whole
range), and the uint8 filter of a ConvInteger with an int8 x from [0, 127] (a padded
element there is x's raw zero point, up to -128 or 127): no pair of raw products then
leaves int16, so the x86 "u8s8 pairs" accumulator (docs/semantics.md) and the exact int32
one give the same bits and every case compares bit for bit with onnxruntime whatever the
CPU. The pair saturation itself is pinned by tests/test_integer_differential.py.
"""

from __future__ import annotations

import numpy as np

from .._dtypes import ELEMENT_TYPES, ElementType
from .._opspec import get_spec
from .configs import Config

_INT8_CODES = (-64, 64)  # [lo, hi) of int8 operand codes (see the module docstring)
_UINT8_FILTER_CODES = (0, 128)  # [lo, hi) of ConvInteger's uint8 w beside an int8 x (ditto)


def _etype(name: str) -> ElementType:
    return ELEMENT_TYPES[name]


def _operand(t: ElementType, shape, rng, codes: tuple | None = None) -> np.ndarray:
    if t.kind == "integer":
        lo, hi = codes or (_INT8_CODES if t.name == "int8" else (t.lo, t.hi + 1))
        return rng.integers(lo, hi, size=shape).astype(t.dtype)
    codes = np.arange(256, dtype=np.uint8).view(t.dtype)
    finite = codes[np.isfinite(codes.astype(np.float32))]
    # moderate magnitudes: the requantized results stay inside the output's range mostly
    finite = finite[np.abs(finite.astype(np.float32)) <= 16]
    return finite[rng.integers(0, finite.size, size=shape)]


def _zero_point(t: ElementType, shape, rng, extreme: str | None = None) -> np.ndarray:
    if t.kind != "integer":
        return np.zeros(shape, dtype=np.uint8).view(t.dtype)  # float8: 0 (the spec's rule)
    if extreme is not None:
        return np.full(shape, t.lo if extreme == "low" else t.hi, dtype=t.dtype)
    return rng.integers(t.lo, t.hi + 1, size=shape).astype(t.dtype)


def _scale(value, shape, s: ElementType) -> np.ndarray:
    array = np.full(shape, value, dtype=np.float64)
    return array.astype(np.float32).astype(s.dtype)


# --------------------------------------------------------------------------------------
# Geometry: operand shapes, zero-point/scale shapes, node attributes

def _matmul_geometry(geometry: str):
    """(a shape, b shape, a parameter shape, b parameter shape)."""
    m, k, n = 3, 7, 5  # an odd K leaves a last unpaired product
    return {
        "matrix": ((m, k), (k, n), (), ()),
        "per_row_column": ((m, k), (k, n), (m,), (n,)),
        "batched": ((2, m, k), (k, n), (), ()),
        "vector": ((k,), (k, n), (), ()),
        "no_zero_point": ((m, k), (k, n), None, None),
    }[geometry]


def _conv_geometry(geometry: str):
    """(x shape, w shape, w parameter shape, attributes)."""
    if geometry in ("pads", "bias", "per_channel", "no_zero_point"):
        x, w, attributes = (2, 3, 5, 6), (4, 3, 3, 3), {"pads": [1, 0, 2, 1]}
    elif geometry in ("same_upper", "same_lower"):
        x, w = (1, 3, 6, 7), (2, 3, 3, 2)
        attributes = {"auto_pad": geometry.upper(), "strides": [2, 2]}
    elif geometry == "valid":
        x, w, attributes = (1, 3, 6, 5), (2, 3, 3, 3), {"auto_pad": "VALID"}
    elif geometry == "strides":
        x, w, attributes = (1, 3, 7, 6), (2, 3, 3, 3), {"strides": [2, 3], "pads": [1, 1, 1, 1]}
    elif geometry == "dilations":
        x, w, attributes = (1, 2, 7, 6), (3, 2, 3, 2), {"dilations": [2, 3], "pads": [2, 1, 2, 1]}
    elif geometry == "group":
        x, w, attributes = (1, 6, 5, 5), (6, 2, 3, 3), {"group": 3}
    elif geometry == "depthwise":
        x, w, attributes = (1, 4, 5, 5), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}
    elif geometry == "conv1d":
        x, w, attributes = (2, 3, 9), (2, 3, 3), {"pads": [1, 2]}
    elif geometry == "conv3d":
        x, w, attributes = (1, 2, 4, 4, 3), (2, 2, 2, 2, 2), {"strides": [1, 2, 1]}
    elif geometry == "kernel_shape":
        x, w, attributes = (1, 3, 5, 5), (2, 3, 2, 3), {"kernel_shape": [2, 3]}
    else:
        raise ValueError(f"no convolution geometry {geometry!r}")
    w_param = (w[0],) if geometry == "per_channel" else ()
    return x, w, w_param, attributes


# --------------------------------------------------------------------------------------
# Families

def _overflow_operands(a_t: ElementType, b_t: ElementType):
    """Operands whose exact sums pass +-2^31 (the int32 accumulator wraps): a row of the
    largest |a - a_zp| times a column of the largest |b - b_zp|, long enough, both signs."""
    a_code, a_zp = (a_t.hi, a_t.lo) if a_t.name == "uint8" else (_INT8_CODES[1] - 1, a_t.lo)
    b_code, b_zp = (b_t.hi, b_t.lo) if b_t.name == "uint8" else (_INT8_CODES[1] - 1, b_t.lo)
    product = (a_code - a_zp) * (b_code - b_zp)
    k = 2**31 // product + 37
    a = np.full((2, k), a_code, dtype=a_t.dtype)
    a[1, ::2] = a_zp  # a second row summing to about half: no wrap
    b = np.full((k, 2), b_code, dtype=b_t.dtype)
    b[1::2, 1] = b_zp
    return a, b, np.array(a_zp, dtype=a_t.dtype), np.array(b_zp, dtype=b_t.dtype)


def _requantization_scales(c: Config, a_param, b_param):
    s = _etype(c.scale_type)
    if c.family == "ties":
        # acc * 1 * 1 / 2: every odd accumulator is a tie of round-half-to-even
        return _scale(1.0, a_param, s), _scale(1.0, b_param, s), _scale(2.0, (), s)
    if c.family == "saturation":
        return _scale(0.5, a_param, s), _scale(0.25, b_param, s), _scale(2.0**-6, (), s)
    # A power-of-two multiplier (2^-6) and an even y_zero_point: the float32 and float64
    # rules of the peers give the exact rule's bits, so these cases compare bit for bit;
    # the ties family keeps the rounding-order difference in its own cases.
    return _scale(0.0625, a_param, s), _scale(0.125, b_param, s), _scale(0.5, (), s)


def _small_operand(t: ElementType, shape, rng, zp) -> np.ndarray:
    """Codes within 3 of the zero point (ties: small accumulators, inside the output)."""
    wide = zp.astype(np.int64).reshape(-1)[0] + rng.integers(-3, 4, size=shape)
    lo, hi = _INT8_CODES if t.name == "int8" else (t.lo, t.hi + 1)
    return np.clip(wide, lo, hi - 1).astype(t.dtype)


def _y_zero_point(c: Config, y: ElementType, rng) -> np.ndarray:
    if y.kind != "integer":
        return _zero_point(y, (), rng)
    if c.family == "ties":
        return np.array(3 if y.name == "int8" else 101, dtype=y.dtype)  # odd: the orders differ
    if c.family == "zero_points":
        return np.array(y.hi - 1, dtype=y.dtype)  # the largest even one
    return np.array(int(_zero_point(y, (), rng)) & ~1, dtype=y.dtype)


def _operands(c: Config, a_shape, b_shape, a_param, b_param, rng):
    a_t, b_t = _etype(c.x_type), _etype(c.w_type)
    if c.family == "zero_points":
        a_zp = _zero_point(a_t, a_param or (), rng, "high")
        b_zp = _zero_point(b_t, b_param or (), rng, "low")
    else:
        a_zp = _zero_point(a_t, a_param or (), rng)
        b_zp = _zero_point(b_t, b_param or (), rng)
    if c.family == "ties" and a_t.kind == b_t.kind == "integer":
        a = _small_operand(a_t, a_shape, rng, a_zp)
        b = _small_operand(b_t, b_shape, rng, b_zp)
    else:
        b_codes = (_UINT8_FILTER_CODES if c.op_type == "ConvInteger" and (a_t.name, b_t.name) == ("int8", "uint8")
                   else None)
        a, b = _operand(a_t, a_shape, rng), _operand(b_t, b_shape, rng, b_codes)
    return a, b, a_zp, b_zp


def _matmul_inputs(c: Config, rng):
    a_shape, b_shape, a_param, b_param = _matmul_geometry(c.geometry)
    if c.family == "overflow":
        a, b, a_zp, b_zp = _overflow_operands(_etype(c.x_type), _etype(c.w_type))
    else:
        a, b, a_zp, b_zp = _operands(c, a_shape, b_shape, a_param, b_param, rng)
    if c.op_type == "MatMulInteger":
        if a_param is None:  # no_zero_point
            return [a, b], {}
        return [a, b, a_zp, b_zp], {}
    y = _etype(c.qtype)
    a_scale, b_scale, y_scale = _requantization_scales(c, a_param, b_param)
    return [a, a_scale, a_zp, b, b_scale, b_zp, y_scale, _y_zero_point(c, y, rng)], {}


def _conv_inputs(c: Config, rng):
    x_shape, w_shape, w_param, attributes = _conv_geometry(c.geometry)
    if c.family == "overflow":
        a, b, x_zp, w_zp = _overflow_operands(_etype(c.x_type), _etype(c.w_type))
        k = a.shape[1]
        x = np.ascontiguousarray(a[:1].reshape(1, k, 1, 1))
        w = np.ascontiguousarray(b.T.reshape(2, k, 1, 1))
        attributes = {}
    else:
        x, w, x_zp, w_zp = _operands(c, x_shape, w_shape, (), w_param, rng)
    if c.op_type == "ConvInteger":
        if c.geometry == "no_zero_point":
            return [x, w], attributes
        return [x, w, x_zp, w_zp], attributes
    y = _etype(c.qtype)
    x_scale, w_scale, y_scale = _requantization_scales(c, (), w_param)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, _y_zero_point(c, y, rng)]
    if c.geometry == "bias":
        inputs.append(rng.integers(-(2**20), 2**20, size=w.shape[0]).astype(np.int32))
    return inputs, attributes


def integer_inputs(c: Config, rng):
    """The node's (name, array) inputs under the spec's names, and its attributes."""
    arrays, attributes = (_matmul_inputs if "MatMul" in c.op_type else _conv_inputs)(c, rng)
    names = [p.name for p in get_spec(c.op_type, c.version).inputs]
    return list(zip(names, arrays)), attributes


def accumulator(c: Config, inputs, attributes, datapath=None) -> np.ndarray | None:
    """The int32 accumulator of a QLinear case with integer operands (bias included), the
    value requantization starts from: an extra output for RTL teams (docs/golden.md).
    Under a datapath, its `accumulator` (the bias is added with int32 wrap-around)."""
    from .. import conv_integer, matmul_integer
    from .datapaths import call_op

    if not c.op_type.startswith("QLinear"):
        return None
    arrays = dict(inputs)
    if c.op_type == "QLinearMatMul":
        if _etype(c.x_type).kind != "integer" or _etype(c.w_type).kind != "integer":
            return None
        return call_op(matmul_integer, arrays["a"], arrays["b"], arrays["a_zero_point"],
                       arrays["b_zero_point"], opset=c.version, datapath=_accumulating(datapath))
    acc = call_op(conv_integer, arrays["x"], arrays["w"], arrays["x_zero_point"],
                  arrays["w_zero_point"], opset=c.version, datapath=_accumulating(datapath),
                  **attributes)
    if "B" in arrays:
        bias = arrays["B"].astype(np.int64).reshape((1, -1) + (1,) * (acc.ndim - 2))
        acc = ((acc.astype(np.int64) + bias + 2**31) % 2**32 - 2**31).astype(np.int32)
    return acc


def _accumulating(datapath):
    """The part of the datapath that MatMulInteger / ConvInteger read for the QLinear
    accumulator: its accumulator (the requantization fields belong to the QLinear op)."""
    from ..datapath import as_datapath, Datapath

    return Datapath(accumulator=as_datapath(datapath).accumulator)


__all__ = ["accumulator", "integer_inputs"]
