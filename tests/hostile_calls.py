"""A seeded generator of hostile calls to the public API (tests/test_hostile.py runs `main`
in ONE child process, so that a crash shows as a signal exit without thousands of process
starts).

Each call draws its arguments from pools that are mostly invalid: dtypes numpy has and ONNX
does not, shapes (0-d, zero-size), non-contiguous / Fortran / read-only / misaligned
arrays, axes, block sizes up to 2**64, attribute values of the wrong type, opsets outside
the table (0, 9, 29, 21.0, True, "21"), thread counts beyond the ceiling, out= buffers,
packed buffers, run_op arities. Every call must return or raise TypeError / ValueError
(or a subclass) with a message that is not a bare numpy / Cython / Python one; its inputs
must be unchanged; and a call with an argument that is invalid whatever the others are
must not return.

Before each call its description goes to stdout (flushed): after a crash the last line
names the call. The last line is a JSON summary.
"""

from __future__ import annotations

import fractions
import hashlib
import json
import math
import random
import sys

import ml_dtypes
import numpy as np

import qemu_q

MAX_THREADS = getattr(qemu_q, "MAX_THREADS", 1024)

# Messages that name nothing: a Python / numpy / Cython error that escaped validation.
BARE_MESSAGES = (
    "Buffer has wrong number of dimensions", "Python int too large to convert",
    "value too large to convert", "'NoneType' object is not iterable", "object is not iterable",
    "cannot be interpreted as an integer", "Buffer dtype mismatch", "unhashable type",
    "dictionary update sequence", "ndarray is not contiguous", "underlying buffer is not",
    "object has no attribute", "Cannot convert", "did not contain a loop with signature",
    "only integer scalar arrays", "Expected a", "an integer is required",
)

ONNX_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.int16, np.uint16,
               np.int32, ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2,
               ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
               ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn,
               ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e8m0fnu]
# ONNX types only Cast takes: foreign to the quantization ops, valid for pack/unpack.
CAST_ONLY_DTYPES = [np.float64, np.int64, np.uint32, np.bool_]
FOREIGN_DTYPES = [np.float64, np.int64, np.uint32, np.bool_, np.complex64, np.complex128, object,
                  "datetime64[s]", "timedelta64[ms]", "U2", "S2", [("a", np.int8), ("b", np.float32)]]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 3, 5), (0, 3), (3, 0, 2), (1, 1, 1, 9), (2, 40), (300, 3)]

AXES_VALID = [0, 1, -1, 2, -2, np.int64(1), np.int32(0)]
AXES_INVALID_TYPE = ["1", 1.5, None, [1], np.float32(1)]
AXES_OTHER = [5, -7, 2**31, 2**63, -(2**63), 2**64, True]
BLOCKS_VALID = [0, 1, 2, 3, 4, 5, 16, np.int64(2)]
BLOCKS_INVALID = [-1, -(2**63), -(2**64), 2**63, 2**64 - 1, 2**64, 2**100, np.uint64(2**63),
                  np.uint64(2**64 - 1), "2", 1.5, np.float64(2), None]
BLOCKS_OTHER = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63 - 3, True]
SATURATE_VALID = [0, 1, np.int64(1), True, False]
SATURATE_INVALID = [2, -1, "1", 1.5, None, 2**64]
PRECISION_VALID = [0, 1, 10, 16]
PRECISION_INVALID = [3, -1, 2**63, "1", 1.0, None]
OUTPUT_VALID = [None, 0, "int8", "uint8", "int4", "uint2", "int16", "float8e4m3fn", "float4e2m1",
                3, 22, 17, "float", "float16", "bfloat16", 1, 10, 16, np.dtype(np.int8), ml_dtypes.int2]
OUTPUT_INVALID = [999, -1, 2**64, "int3", "", object(), 1.5, 2.0, [3], np.dtype(np.float64), np.float64]
OPSET_VALID = [None, 10, 11, 13, 19, 20, 21, 23, 24, 25, 28]
OPSET_INVALID = [0, -1, 9, 29, 2**64, 21.0, True, "21", fractions.Fraction(21), np.float64(21), b"21"]
CAST_TO_VALID = ["float", "double", 11, np.float64, "bool", np.bool_, "uint64", 13, "int4", "float8e8m0",
                 "float4e2m1", 17, ml_dtypes.bfloat16, "float6e3m2", "int2", np.dtype(np.int32)]
CAST_TO_INVALID = [8, "string", 999, -1, "int3", "", object(), 1.5, [3], np.complex64, True]
ROUND_MODE_VALID = ["up", "down", "nearest", b"up", b"nearest"]
ROUND_MODE_INVALID = ["UP", "", 1, None, b"\xff", "sideways"]
THREADS_VALID = [None, 1, 2, np.int64(2)]
THREADS_INVALID = [0, -1, MAX_THREADS + 1, 10**5, 2**31, 2**63, 2**64, True, False, 1.5, "2", [2]]

ALLOWED = (TypeError, ValueError)


def pick(rng, valid, invalid, other=(), p_invalid=0.2, p_other=0.1):
    """(value, invalid?) from the pools."""
    r = rng.random()
    if r < p_invalid:
        return rng.choice(invalid), True
    if other and r < p_invalid + p_other:
        return rng.choice(other), False
    return rng.choice(valid), False


def make_array(rng: random.Random, nrng, dtype, shape, layout="c"):
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    if dtype.kind in "OMmUSV" or dtype.names:
        if dtype.kind == "O":
            array = np.empty(shape, object)
            array.reshape(-1)[...] = [rng.randint(-3, 3) for _ in range(size)] if size else []
        elif dtype.kind in "US":
            array = np.full(shape, "ab", dtype)
        else:
            array = np.zeros(shape, dtype)
    elif dtype.kind == "b":
        array = nrng.random(shape) < 0.5
    elif dtype.kind in "iu" and dtype.itemsize >= 1 and dtype in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16),
                                                                   np.dtype(np.uint16), np.dtype(np.int32), np.dtype(np.int64),
                                                                   np.dtype(np.uint32)):
        info = np.iinfo(dtype)
        array = nrng.integers(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape, endpoint=True).astype(dtype)
    else:
        values = nrng.standard_normal(size) * rng.choice([1.0, 100.0, 1e-40, 1e30])
        if size and rng.random() < 0.3:
            values[nrng.integers(0, size, max(1, size // 4))] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 5e-324, 0.5, 2.5])
        with np.errstate(all="ignore"):
            if dtype.kind in "iu" or dtype.name in ("int4", "uint4", "int2", "uint2"):
                info = ml_dtypes.iinfo(dtype)
                array = nrng.integers(int(info.min), int(info.max), size, endpoint=True).astype(dtype)
            else:
                array = values.astype(dtype)
        array = array.reshape(shape)
    if layout == "c" or array.ndim == 0:
        return array
    if layout == "fortran":
        return np.asfortranarray(array)
    if layout == "strided":
        wide = np.repeat(array[..., None], 2, axis=-1)  # (..., 2): every other element
        return wide[..., 0]
    if layout == "readonly":
        array = array.copy()
        array.flags.writeable = False
        return array
    if layout == "misaligned" and array.dtype.kind not in "OV" and array.dtype.itemsize > 1:
        raw = bytearray(array.nbytes + 1)
        view = np.frombuffer(raw, array.dtype, count=array.size, offset=1).reshape(array.shape)
        view[...] = array
        return view
    return array


def layout_choice(rng):
    return rng.choice(["c", "c", "c", "c", "fortran", "strided", "readonly", "misaligned"])


def describe(value, depth=0) -> str:
    if isinstance(value, np.ndarray):
        flags = "" if value.flags.c_contiguous else " noncontig"
        flags += "" if value.flags.writeable else " readonly"
        flags += "" if value.flags.aligned else " misaligned"
        return f"array({value.dtype}, {value.shape}{flags})"
    if isinstance(value, (bytes, bytearray)):
        return f"{type(value).__name__}[{len(value)}]"
    if isinstance(value, memoryview):
        return f"memoryview[{value.nbytes}, contiguous={value.c_contiguous}]"
    if isinstance(value, (list, tuple)) and depth < 2:
        inner = ", ".join(describe(v, depth + 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict) and depth < 2:
        return "{" + ", ".join(f"{k!r}: {describe(v, depth + 1)}" for k, v in value.items()) + "}"
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def fingerprint(value):
    """The bytes of every array / buffer reachable from `value` (lists, tuples, dicts)."""
    digest = hashlib.sha256()

    def walk(v, depth=0):
        if isinstance(v, np.ndarray):
            if v.dtype.kind == "O":
                digest.update(repr(v.tolist()).encode())
            else:
                digest.update(v.tobytes())
        elif isinstance(v, (bytes, bytearray)):
            digest.update(bytes(v))
        elif isinstance(v, memoryview):
            digest.update(v.tobytes())
        elif isinstance(v, (list, tuple)) and depth < 3:
            for item in v:
                walk(item, depth + 1)
        elif isinstance(v, dict) and depth < 3:
            for item in v.values():
                walk(item, depth + 1)
    walk(value)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------


def gen_x(rng, nrng, foreign_p=0.15, dtypes=None):
    shape = rng.choice(SHAPES)
    if rng.random() < foreign_p:
        return make_array(rng, nrng, rng.choice(FOREIGN_DTYPES), shape), True
    dtype = rng.choice(dtypes or ONNX_DTYPES)
    return make_array(rng, nrng, dtype, shape, layout_choice(rng)), False


def gen_scale(rng, nrng, x_shape, axis, block_size):
    dtype = rng.choice([np.float32] * 6 + [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu,
                                           np.int32, np.float64, np.int8, object])
    rank = len(x_shape)
    kind = rng.random()
    shape = ()
    try:
        a = int(axis) % rank if rank and isinstance(axis, (int, np.integer)) and abs(int(axis)) < 2**62 else 0
    except (TypeError, ValueError):
        a = 0
    if kind < 0.3 or rank == 0:
        shape = rng.choice([(), (1,)])
    elif kind < 0.55:
        shape = (x_shape[a] + rng.choice([0, 0, 0, 1, -1]),) if x_shape[a] or rng.random() < 0.5 else (0,)
    elif kind < 0.85:
        d = x_shape[a]
        try:
            bs = int(block_size)
        except (TypeError, ValueError, OverflowError):
            bs = 1
        blocks = -(-d // bs) if 0 < bs < 2**62 else 1
        s = list(x_shape)
        s[a] = max(0, rng.choice([blocks, blocks, 1, 0, d + 1]))
        shape = tuple(s)
    else:
        shape = rng.choice(SHAPES)
    shape = tuple(max(0, v) for v in shape)
    scale = make_array(rng, nrng, dtype, shape, layout_choice(rng) if rng.random() < 0.2 else "c")
    if scale.dtype.kind == "f" and scale.size and rng.random() < 0.8:
        with np.errstate(all="ignore"):
            scale = np.abs(scale).astype(scale.dtype) if scale.flags.writeable else scale
    return scale


def gen_zero_point(rng, nrng, scale):
    r = rng.random()
    if r < 0.45 or not isinstance(scale, np.ndarray):
        return None
    dtype = rng.choice(ONNX_DTYPES + [np.float64, object])
    shape = scale.shape if r < 0.9 else rng.choice(SHAPES)
    zp = make_array(rng, nrng, dtype, shape)
    if rng.random() < 0.5 and np.dtype(dtype).kind not in "O":
        try:
            zp = np.zeros(shape, dtype)
        except TypeError:
            pass
    return zp


def gen_out(rng, nrng, x):
    r = rng.random()
    if r < 0.6:
        return None, False
    if r < 0.67:
        return [0] * 3, True
    shape = x.shape if isinstance(x, np.ndarray) and rng.random() < 0.7 else rng.choice(SHAPES)
    dtype = rng.choice([np.uint8, np.int8, np.int16, np.float32, np.float16, ml_dtypes.int4, np.float64])
    out = np.zeros(shape, dtype)
    invalid = False
    if r < 0.75 and out.size:
        out.flags.writeable = False
        invalid = True
    elif r < 0.8 and isinstance(x, np.ndarray) and x.dtype.kind not in "OV" and x.nbytes:
        # aliasing x: x's own bytes as the output
        base = x if x.flags.c_contiguous and x.flags.writeable else None
        if base is not None:
            out = base.reshape(-1).view(np.uint8)
            invalid = True
    elif r < 0.85 and out.size > 1:
        out = np.zeros(shape + (2,), dtype)[..., 0]
        invalid = True
    elif r < 0.9:
        out = np.zeros(1, np.uint8)
    return out, invalid


def gen_call(rng: random.Random, nrng):
    """(description, callable, inputs to fingerprint, reasons the call must be rejected)."""
    op = rng.choices(["quantize", "dequantize", "dynamic", "pack", "unpack", "run_op", "cast", "nvfp4",
                      "integer"],
                     weights=[40, 25, 5, 10, 10, 10, 12, 8, 14])[0]
    reasons = []
    kwargs = {}

    def attribute(name, valid, invalid, other=(), p=0.5):
        if rng.random() < p:
            value, bad = pick(rng, valid, invalid, other)
            kwargs[name] = value
            if bad:
                reasons.append(f"{name}={describe(value)}")

    if op in ("quantize", "dequantize"):
        if op == "dequantize" and rng.random() < 0.2:
            packed_type = rng.choice(["int4", "uint4", "int2", "float4e2m1", "float6e3m2", "int8",
                                      "float8e5m2", object(), "int3", 999])
            shape = rng.choice(SHAPES + [(2**62,), (2**63,), (2**40, 2**40), (-1,), None, "12", (2.5,)])
            count = math.prod(shape) if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) else 5
            n_bytes = max(0, min(64, (max(count, 0) * 4 + 7) // 8 + rng.choice([0, 0, 1, -1])))
            x = rng.choice([bytes(n_bytes), bytearray(n_bytes), np.zeros(n_bytes, np.uint8),
                            memoryview(bytes(2 * n_bytes))[::2], np.zeros(n_bytes, np.int8), [0] * n_bytes, None])
            kwargs.update(packed=True, dtype=packed_type, shape=shape)
            foreign = False
            x_shape = shape if isinstance(shape, tuple) and all(isinstance(d, int) and 0 <= d < 2**31 for d in shape) else (5,)
        else:
            preferred = ([np.float32] * 8 + [np.float16, ml_dtypes.bfloat16] * 3 if op == "quantize" else
                         [np.int8, np.uint8, ml_dtypes.int4, np.int16, ml_dtypes.float8_e4m3fn] * 3)
            x, foreign = gen_x(rng, nrng, foreign_p=0.08, dtypes=preferred + ONNX_DTYPES)
            x_shape = x.shape
            if rng.random() < 0.05:
                x = rng.choice([[1.0, 2.0], None, 1.5, "x"])
                foreign = True
            if foreign:
                reasons.append(f"x={describe(x)}")
        attribute("axis", AXES_VALID, AXES_INVALID_TYPE, AXES_OTHER, p=0.7)
        attribute("block_size", BLOCKS_VALID, BLOCKS_INVALID, BLOCKS_OTHER, p=0.5)
        scale = gen_scale(rng, nrng, x_shape if len(x_shape) else (), kwargs.get("axis", 1), kwargs.get("block_size", 0))
        if rng.random() < 0.03:
            scale = rng.choice([1.0, None, [1.0]])
            reasons.append(f"scale={describe(scale)}")
        elif scale.dtype.kind in "O" or scale.dtype == np.float64:
            reasons.append(f"scale dtype {scale.dtype}")
        zero_point = gen_zero_point(rng, nrng, scale)
        if zero_point is not None and (zero_point.dtype.kind == "O" or zero_point.dtype == np.float64):
            reasons.append(f"zero point dtype {zero_point.dtype}")
        attribute("output_dtype", OUTPUT_VALID, OUTPUT_INVALID, p=0.4)
        attribute("opset", OPSET_VALID, OPSET_INVALID, p=0.5)
        attribute("n_threads", THREADS_VALID, THREADS_INVALID, p=0.3)
        if op == "quantize":
            attribute("saturate", SATURATE_VALID, SATURATE_INVALID, p=0.3)
            attribute("precision", PRECISION_VALID, PRECISION_INVALID, p=0.3)
            if rng.random() < 0.15:
                kwargs["packed"] = rng.choice([True, True, "yes"])
                if kwargs["packed"] == "yes":
                    reasons.append("packed='yes'")
        out, bad_out = gen_out(rng, nrng, x if isinstance(x, np.ndarray) else None)
        if out is not None:
            kwargs["out"] = out
            if bad_out:
                reasons.append(f"out={describe(out)}")
        fn = qemu_q.quantize_linear if op == "quantize" else qemu_q.dequantize_linear
        args = [x, scale] + ([zero_point] if zero_point is not None else [])
        inputs = (args,)
        text = f"{op}({', '.join(describe(a) for a in args)}, {describe(kwargs)})"
        return text, (lambda: fn(*args, **kwargs)), inputs, reasons

    if op == "cast":
        x, foreign = gen_x(rng, nrng, foreign_p=0.2, dtypes=ONNX_DTYPES + CAST_ONLY_DTYPES)
        if foreign and x.dtype not in [np.dtype(d) for d in CAST_ONLY_DTYPES]:
            reasons.append(f"x={describe(x)}")
        to, bad = pick(rng, CAST_TO_VALID, CAST_TO_INVALID)
        if bad:
            reasons.append(f"to={describe(to)}")
        attribute("saturate", SATURATE_VALID, SATURATE_INVALID, p=0.3)
        attribute("round_mode", ROUND_MODE_VALID, ROUND_MODE_INVALID, p=0.3)
        attribute("opset", OPSET_VALID + [1, 6, 9, 13], [v for v in OPSET_INVALID[:-5] if v != 9] + [0], p=0.5)
        attribute("n_threads", THREADS_VALID, THREADS_INVALID, p=0.3)
        out, bad_out = gen_out(rng, nrng, x)
        if out is not None:
            kwargs["out"] = out
            if bad_out:
                reasons.append(f"out={describe(out)}")
        return (f"cast({describe(x)}, {describe(to)}, {describe(kwargs)})",
                lambda: qemu_q.cast(x, to, **kwargs), (x,), reasons)

    if op == "nvfp4":
        x, foreign = gen_x(rng, nrng, foreign_p=0.1,
                           dtypes=[np.float32] * 6 + [np.float16, ml_dtypes.bfloat16] + ONNX_DTYPES)
        if x.dtype not in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
            reasons.append(f"x={describe(x)}")
        attribute("recipe", ["transformer_engine", "torchao", "modelopt"], ["te", 3, None, b"torchao"], p=0.6)
        attribute("axis", AXES_VALID, AXES_INVALID_TYPE, AXES_OTHER, p=0.5)
        attribute("block_shape", [(1, 16), (16, 16)], [(1, 32), (16,), "x", None, (1.0, 16)], p=0.4)
        attribute("global_amax", [None, np.float32(1.0), 2.0, np.float32(np.inf), np.float32(np.nan)],
                  [-1.0, 0.1, "1", np.ones(3, np.float32)], p=0.3)
        attribute("packed", [False, True], ["yes", 1], p=0.2)
        attribute("n_threads", THREADS_VALID, THREADS_INVALID, p=0.3)
        return (f"nvfp4_quantize({describe(x)}, {describe(kwargs)})",
                lambda: qemu_q.nvfp4_quantize(x, **kwargs), (x,), reasons)
    if op == "integer":
        return gen_integer_call(rng, nrng, reasons, kwargs, attribute)

    if op == "dynamic":
        x, foreign = gen_x(rng, nrng, foreign_p=0.3, dtypes=[np.float32] * 6 + ONNX_DTYPES)
        if foreign or x.dtype != np.float32:
            reasons.append(f"x={describe(x)}")
        attribute("opset", OPSET_VALID[:1] + [11, 13, 21, 28], OPSET_INVALID, p=0.4)
        return (f"dynamic_quantize_linear({describe(x)}, {describe(kwargs)})",
                lambda: qemu_q.dynamic_quantize_linear(x, **kwargs), (x,), reasons)

    if op == "pack":
        x, foreign = gen_x(rng, nrng, foreign_p=0.25)
        if foreign and x.dtype not in [np.dtype(d) for d in CAST_ONLY_DTYPES]:
            reasons.append(f"array={describe(x)}")
        if rng.random() < 0.3:
            size = (math.prod(x.shape) * 4 + 7) // 8
            out = rng.choice([np.zeros(size, np.uint8), np.zeros(size + 1, np.uint8), np.zeros(size, np.int8),
                              np.zeros(max(size, 1), np.uint8)[::-1], [0] * size])
            kwargs["out"] = out
        attribute("n_threads", THREADS_VALID, THREADS_INVALID, p=0.3)
        return (f"pack({describe(x)}, {describe(kwargs)})", lambda: qemu_q.pack(x, **kwargs), (x,), reasons)

    if op == "unpack":
        dtype = rng.choice(["int4", "uint4", "int2", "uint2", "float4e2m1", "float6e2m3", "int8", "uint16",
                            "float8e4m3fn", "bfloat16", ml_dtypes.int4, 22, object(), "int3", 999, None, np.complex64])
        shape = rng.choice(SHAPES + [5, np.int64(3), [2, 3], (2**62,), (2**63,), (2**64,), (2**40, 2**40),
                                     (-1,), None, "12", (2.5,), (np.float32(2),), [None]])
        count = math.prod(shape) if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape) else 6
        n_bytes = max(0, min(64, (max(count, 0) * 8 + 7) // 8 + rng.choice([0, 0, 0, 1, -1])))
        buffer = rng.choice([bytes(n_bytes), bytearray(n_bytes), np.zeros(n_bytes, np.uint8), memoryview(bytes(n_bytes)),
                             memoryview(bytes(2 * n_bytes))[::2], np.zeros(n_bytes, np.int8), np.zeros((n_bytes, 1), np.uint8),
                             [0] * n_bytes, None, "ab", 3])
        attribute("n_threads", THREADS_VALID, THREADS_INVALID, p=0.3)
        if dtype in ("int3", 999, None, np.complex64) or type(dtype) is object:
            reasons.append(f"dtype={describe(dtype)}")
        if shape is None or shape == "12" or shape in ((2.5,), (-1,), [None]):
            reasons.append(f"shape={describe(shape)}")
        if buffer is None or isinstance(buffer, (list, str, int)):
            reasons.append(f"buffer={describe(buffer)}")
        return (f"unpack({describe(buffer)}, {describe(dtype)}, {describe(shape)}, {describe(kwargs)})",
                lambda: qemu_q.unpack(buffer, dtype, shape, **kwargs), (buffer,), reasons)

    # run_op
    op_type = rng.choice(["QuantizeLinear"] * 3 + ["DequantizeLinear"] * 2 + ["DynamicQuantizeLinear", "Foo", None, 3])
    if op_type in ("Foo", None, 3):
        reasons.append(f"op_type={op_type!r}")
    n_inputs = rng.choice([0, 1, 2, 2, 3, 4])
    x, foreign = gen_x(rng, nrng, foreign_p=0.1)
    inputs = [x, gen_scale(rng, nrng, x.shape, 1, 0), None, None][:n_inputs]
    if n_inputs >= 3 and rng.random() < 0.5:
        inputs[2] = np.zeros(inputs[1].shape, rng.choice([np.uint8, np.int8, ml_dtypes.int4]))
    if rng.random() < 0.1:
        inputs = rng.choice([None, "abc", 3, (x,)])
        if inputs is None or inputs == 3:
            reasons.append(f"inputs={inputs!r}")
    attrs = {}
    for name, valid, invalid in (("axis", AXES_VALID, AXES_INVALID_TYPE), ("block_size", BLOCKS_VALID, BLOCKS_INVALID),
                                 ("saturate", SATURATE_VALID, SATURATE_INVALID),
                                 ("precision", PRECISION_VALID, PRECISION_INVALID),
                                 ("output_dtype", [0, 3, 2, 22, 1, 10], [999, -1, 1.5, "int8", object()])):
        if rng.random() < 0.25:
            value, bad = pick(rng, valid, invalid)
            attrs[name] = value
            if bad:
                reasons.append(f"attribute {name}={describe(value)}")
    if rng.random() < 0.1:
        attrs[rng.choice(["foo", "Axis", 1])] = 1
        reasons.append("unknown attribute")
    if rng.random() < 0.05:
        attrs = rng.choice([None, "axis", [("axis", 1)], 3])
        if attrs in ("axis", 3):
            reasons.append(f"attributes={attrs!r}")
    opset, bad = pick(rng, [10, 13, 19, 21, 23, 25, 28], OPSET_INVALID[:-1])
    if bad:
        reasons.append(f"opset={opset!r}")
    return (f"run_op({op_type!r}, {describe(inputs)}, {describe(attrs)}, {opset!r})",
            lambda: qemu_q.run_op(op_type, inputs, attrs, opset), (inputs,), reasons)


INTEGER_CODE_DTYPES = [np.uint8, np.int8]
FLOAT8_DTYPES = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz]
REQUANTIZATION_VALID = ["exact", "float32", "float64", None]
REQUANTIZATION_INVALID = ["EXACT", "", 1, "float16", b"exact"]
ACCUMULATOR_VALID = [None, "int32", "x86-u8s8-pairs", "int32-saturate", "int24", "int16-saturate", "int8"]
ACCUMULATOR_INVALID = ["int64", "", 32, "pairs", "int7", "int016", "int16-sat", "INT16"]
AUTO_PAD_VALID = ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]
AUTO_PAD_INVALID = ["SAME", "", None, 1, "valid"]
INTS_VALID = [None, [1, 1], [2, 1], (1, 2), [3, 3], np.array([1, 2])]
INTS_INVALID = [[0, 1], [-1, 1], "11", 1, [1.5, 1], [2**63, 1], [None, 1]]


def gen_integer_call(rng, nrng, reasons, kwargs, attribute):
    """MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv: mostly valid codes and
    geometry, with foreign dtypes, mismatched shapes, bad options and attributes."""
    which = rng.choice(["matmul_integer", "qlinear_matmul", "conv_integer", "qlinear_conv"])
    conv = "conv" in which

    def codes(shape, dtypes=INTEGER_CODE_DTYPES):
        dtype = rng.choice(dtypes)
        if rng.random() < 0.08:
            dtype = rng.choice(FOREIGN_DTYPES)
            try:
                array = np.zeros(shape, dtype)
            except TypeError:
                array = np.zeros(shape, np.float64)
            reasons.append(f"codes of dtype {array.dtype}")
            return array
        array = make_array(rng, nrng, dtype, shape, layout_choice(rng))
        return array

    def scalar(dtype):
        return np.array(0, dtype) if rng.random() < 0.5 else np.zeros(rng.choice([(), (1,)]), dtype)

    if conv:
        rank = rng.choice([1, 2, 3])
        n, c, m = rng.choice([0, 1, 2]), rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        spatial = tuple(rng.choice([1, 3, 5]) for _ in range(rank))
        kernel = tuple(rng.choice([1, 2, 3]) for _ in range(rank))
        x = codes((n, c) + spatial)
        group = rng.choice([1, 1, 2, 0, -1, c])
        w_shape = (m, max(1, c // max(group, 1))) + kernel
        if rng.random() < 0.1:
            w_shape = rng.choice([(m,), (m, c), (m, c + 1) + kernel])
        w = codes(w_shape)
        kwargs["group"] = group
        if group < 1:
            reasons.append(f"group={group}")
        for name in ("strides", "dilations"):
            if rng.random() < 0.4:
                value = rng.choice(INTS_VALID + INTS_INVALID)
                kwargs[name] = value
                if any(value is v for v in INTS_INVALID):
                    reasons.append(f"{name}={describe(value)}")
        if rng.random() < 0.3:
            kwargs["pads"] = rng.choice([[1] * (2 * rank), [0] * (2 * rank), [-1] * (2 * rank), [1], "1"])
            if kwargs["pads"] in ([-1] * (2 * rank), "1"):
                reasons.append(f"pads={kwargs['pads']!r}")
        if rng.random() < 0.3:
            value, bad = pick(rng, AUTO_PAD_VALID, AUTO_PAD_INVALID)
            kwargs["auto_pad"] = value
            if bad:
                reasons.append(f"auto_pad={value!r}")
        first, second = x, w
    else:
        m, k, n = rng.choice([0, 1, 3, 8]), rng.choice([0, 1, 5, 33]), rng.choice([1, 2, 7])
        a_shape = rng.choice([(m, k), (k,), (2, m, k), (1, 2, m, k)])
        b_shape = rng.choice([(k, n), (k,), (2, k, n)])
        if rng.random() < 0.1:
            b_shape = (k + 1, n)
        float8 = which == "qlinear_matmul" and rng.random() < 0.3
        first = codes(a_shape, FLOAT8_DTYPES if float8 else INTEGER_CODE_DTYPES)
        second = codes(b_shape, FLOAT8_DTYPES + INTEGER_CODE_DTYPES if float8 else INTEGER_CODE_DTYPES)
    zp_first = scalar(first.dtype) if first.dtype.kind != "O" else None
    zp_second = scalar(second.dtype) if second.dtype.kind != "O" else None
    if rng.random() < 0.05 and zp_second is not None:
        zp_second = np.zeros((3, 3), zp_second.dtype)
    attribute("accumulator", ACCUMULATOR_VALID, ACCUMULATOR_INVALID, p=0.3)
    attribute("n_threads", THREADS_VALID, THREADS_INVALID, p=0.3)
    attribute("opset", OPSET_VALID, OPSET_INVALID, p=0.3)
    if which.startswith("qlinear"):
        attribute("requantization", REQUANTIZATION_VALID, REQUANTIZATION_INVALID, p=0.4)
        scale = rng.choice([np.float32(0.5), np.float32(3.0), np.float32(np.nan), np.float32(0.0), np.float32(np.inf),
                            np.float16(0.25), np.float64(0.5)])
        if isinstance(scale, np.float64):
            reasons.append("a float64 scale")
        y_zp = scalar(rng.choice([np.uint8, np.int8, ml_dtypes.float8_e4m3fn]))
        args = [first, scale, zp_first, second, np.float32(0.25), zp_second, np.float32(0.125), y_zp]
        if conv and rng.random() < 0.5:
            args.append(rng.choice([np.zeros(second.shape[0], np.int32), np.zeros(3, np.int32),
                                    np.zeros(second.shape[0], np.int64)]))
            if args[-1].dtype == np.int64:
                reasons.append("an int64 bias")
    else:
        args = [first, second, zp_first, zp_second]
    x_like = first if isinstance(first, np.ndarray) else None
    out, bad_out = gen_out(rng, nrng, x_like)
    if out is not None:
        kwargs["out"] = out
        if bad_out:
            reasons.append(f"out={describe(out)}")
    fn = getattr(qemu_q, which)
    text = f"{which}({', '.join(describe(a) for a in args)}, {describe(kwargs)})"
    return text, (lambda: fn(*args, **kwargs)), (args,), reasons


def main(seed: int, count: int) -> dict:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    violations = []
    counts = {"returned": 0, "TypeError": 0, "ValueError": 0, "other": 0}
    for index in range(count):
        text, call, inputs, reasons = gen_call(rng, nrng)
        print(f"#{index} {text}", flush=True)
        before = fingerprint(inputs)
        try:
            result = call()
        except ALLOWED as error:
            counts["TypeError" if isinstance(error, TypeError) else "ValueError"] += 1
            message = str(error)
            bare = [b for b in BARE_MESSAGES if b in message]
            if bare or not message.strip():
                violations.append(("bare message", f"{type(error).__name__}: {message[:160]}", text))
        except BaseException as error:  # noqa: BLE001 - the point is to see every other kind
            counts["other"] += 1
            violations.append((f"raised {type(error).__name__}", str(error)[:160], text))
        else:
            counts["returned"] += 1
            if reasons:
                violations.append(("accepted an invalid argument", "; ".join(reasons), text))
            del result
        if fingerprint(inputs) != before:
            violations.append(("modified an input", "", text))
    return {"counts": counts, "violations": violations}


if __name__ == "__main__":
    report = main(int(sys.argv[1]), int(sys.argv[2]))
    print(json.dumps(report))
