"""The optimized kernel paths give the same bits whatever runs them.

Every result here is compared bit for bit with one computed by the kernels' general scalar
path on one thread at the baseline instruction-set level (`qemu_q._dispatch.FAST_KERNELS =
False` forces that path; tests/test_kernels.py checks it against a naive reference), over:

- n_threads 1, 2 and 8;
- the fast (vectorized) paths and the general one;
- every instruction-set level built and supported here (qemu_q._kernels: baseline,
  x86-64-v3, x86-64-v4);
- sizes that straddle the kernels' boundaries: the 16384- to 131072-element tasks, the 512-element
  prefetch blocks, the 4096-element pack/unpack buffers, the 65536-element serial
  threshold, and partial blocks and bytes at the ends;

for QuantizeLinear from float32 into every quantized type and DequantizeLinear from every
quantized type into float32, per-tensor, per-axis (inner and last axis) and blocked (inner
and last axis). The fused paths are checked too: quantize_linear(..., packed=True) equals
pack(quantize_linear(...)), and dequantize_linear(pack(q), packed=True) equals
dequantize_linear(q).
"""

import itertools
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from support import assert_same_bits
from qemu_q import _dispatch, _kernels

THREADS = [1, 2, 8]
LEVELS = _kernels.available_levels()

INT_TYPES = {
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4, "int2": ml_dtypes.int2, "uint2": ml_dtypes.uint2,
}
FLOAT_TYPES = {
    "float8e4m3fn": ml_dtypes.float8_e4m3fn, "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8e5m2": ml_dtypes.float8_e5m2, "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float4e2m1": ml_dtypes.float4_e2m1fn, "float6e2m3": ml_dtypes.float6_e2m3fn,
    "float6e3m2": ml_dtypes.float6_e3m2fn,
}
ALL_TYPES = {**INT_TYPES, **FLOAT_TYPES}
SUB_BYTE = ["int4", "uint4", "int2", "uint2", "float4e2m1", "float6e2m3", "float6e3m2"]

# (id, shape, axis, block_size): granularities and sizes straddling the task (32768),
# prefetch-block (512), buffer (4096) and serial (65536) boundaries.
LAYOUTS = [
    ("tensor_odd", (3 * 32768 + 517,), None, 0),
    ("tensor_small", (1031,), None, 0),
    ("axis0_inner", (7, 9 * 1024 + 3), 0, 0),
    ("axis_last", (13, 5 * 4096 + 7), 1, 0),
    ("axis_middle", (3, 5, 4099), 1, 0),
    ("blocked_last_32", (9, 8192 + 45), 1, 32),
    ("blocked_last_odd", (5, 3 * 4096 + 1), 1, 37),
    ("blocked_inner", (67, 3, 600), 0, 16),
    ("blocked_last_big", (2, 70001), 1, 4096),
]


@pytest.fixture
def restore_kernels():
    level, fast = _kernels.active.level, _dispatch.FAST_KERNELS
    yield
    _kernels.use(level)
    _dispatch.FAST_KERNELS = fast


def _variants():
    """(level, fast, n_threads) for every combination but the reference one."""
    for level, fast, n in itertools.product(LEVELS, (True, False), THREADS):
        yield level, fast, n


def _reference(fn):
    _kernels.use("baseline")
    _dispatch.FAST_KERNELS = False
    try:
        return fn(1)
    finally:
        _dispatch.FAST_KERNELS = True


def _check_all(fn, what):
    expected = _reference(fn)
    for level, fast, n in _variants():
        _kernels.use(level)
        _dispatch.FAST_KERNELS = fast
        try:
            got = fn(n)
        finally:
            _dispatch.FAST_KERNELS = True
        assert_same_bits(got, expected, f"{what} level={level} fast={fast} n_threads={n}")
    return expected


def _param_shape(shape, axis, block_size):
    if axis is None:
        return ()
    if block_size == 0:
        return (shape[axis],)
    s = list(shape)
    s[axis] = -(-shape[axis] // block_size)
    return tuple(s)


def _scales(rng, pshape, special=True):
    """float32 scales: random magnitudes, powers of two (exact ties), and, where asked,
    zero, negative, infinite and NaN scales."""
    n = int(np.prod(pshape))
    s = (rng.uniform(0.01, 0.2, n) * rng.choice([1, -1], n, p=[0.9, 0.1])).astype(np.float32)
    pow2 = rng.random(n) < 0.4
    s[pow2] = np.float32(2.0) ** rng.integers(-6, 2, pow2.sum()).astype(np.float32)
    if special and n >= 8:
        s[rng.choice(n, 4, replace=False)] = [0.0, np.inf, np.nan, -0.0]
    return s.reshape(pshape) if pshape else np.float32(s[0])


def _quantize_inputs(rng, shape):
    x = (rng.standard_normal(shape) * rng.choice([0.05, 1.0, 30.0, 3000.0], shape)).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    # Ties of the power-of-two scales, specials, float8 boundaries.
    ties = (rng.integers(-300, 300, n // 8) + 0.5).astype(np.float32) * np.float32(0.25)
    flat[rng.choice(n, ties.size, replace=False)] = ties
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 464.0, 480.0, 496.0, 61440.0,
                         65536.0, 1e-45, -1e-45, 2.0**-10, 3.4e38], np.float32)
    flat[rng.choice(n, 8 * specials.size, replace=False)] = np.tile(specials, 8)
    return x


def _zero_point(rng, qtype, pshape):
    dtype = np.dtype(ALL_TYPES[qtype])
    n = int(np.prod(pshape)) if pshape else 1
    if qtype in FLOAT_TYPES:
        values = np.zeros(n, np.float32)
        if qtype not in ("float8e4m3fnuz", "float8e5m2fnuz"):
            values[rng.random(n) < 0.5] = -0.0
        zp = values.astype(dtype)
    else:
        info = ml_dtypes.iinfo(dtype)
        zp = rng.integers(int(info.min), int(info.max) + 1, n).astype(dtype)
    return zp.reshape(pshape) if pshape else zp.reshape(())


@pytest.mark.parametrize("layout", LAYOUTS, ids=[l[0] for l in LAYOUTS])
@pytest.mark.parametrize("qtype", list(ALL_TYPES))
def test_quantize_threads_levels_paths(qtype, layout, restore_kernels):
    name, shape, axis, block_size = layout
    rng = np.random.default_rng(zlib.crc32(f"{qtype} {name}".encode()))
    x = _quantize_inputs(rng, shape)
    pshape = _param_shape(shape, axis, block_size)
    scale = _scales(rng, pshape)
    zp = _zero_point(rng, qtype, pshape)
    kw = {"axis": axis if axis is not None else 1, "block_size": block_size}
    _check_quantize_paths(qtype, x, scale, zp, kw, f"{qtype} {name}")


def _check_quantize_paths(qtype, x, scale, zp, kw, what):
    """Every level, path and thread count gives the reference bits, for each saturate the
    type has, and the fused path (quantize straight into the ONNX bytes) gives pack(y)."""
    for saturate in ([0, 1] if qtype in FLOAT_TYPES else [1]):
        def run(n, saturate=saturate):
            with np.errstate(all="ignore"):
                return qemu_q.quantize_linear(x, scale, zp, saturate=saturate, n_threads=n, **kw)

        expected = _check_all(run, f"{what} saturate={saturate}")

        def run_packed(n, saturate=saturate):
            with np.errstate(all="ignore"):
                return qemu_q.quantize_linear(x, scale, zp, saturate=saturate, packed=True,
                                              n_threads=n, **kw)

        packed = _check_all(run_packed, f"{what} saturate={saturate} packed")
        assert_same_bits(packed, qemu_q.pack(expected), f"{what} packed == pack(y)")


@pytest.mark.parametrize("layout", LAYOUTS, ids=[l[0] for l in LAYOUTS])
@pytest.mark.parametrize("qtype", list(ALL_TYPES))
def test_dequantize_threads_levels_paths(qtype, layout, restore_kernels):
    name, shape, axis, block_size = layout
    rng = np.random.default_rng(zlib.crc32(f"{qtype} {name} dq".encode()))
    dtype = np.dtype(ALL_TYPES[qtype])
    if dtype.itemsize == 2:
        codes = rng.integers(0, 2**16, shape, dtype=np.uint16).view(dtype)
    else:
        codes = rng.integers(0, 256, shape, dtype=np.uint8)
        width = qemu_q.element_type(qtype).bits
        codes = (codes & ((1 << width) - 1)).astype(np.uint8).view(dtype)
    pshape = _param_shape(shape, axis, block_size)
    scale = _scales(rng, pshape)
    zp = _zero_point(rng, qtype, pshape)
    kw = {"axis": axis if axis is not None else 1, "block_size": block_size}

    def run(n):
        return qemu_q.dequantize_linear(codes, scale, zp, n_threads=n, **kw)

    expected = _check_all(run, f"{qtype} {name}")

    # The fused path: dequantize straight from the ONNX bytes.
    raw = qemu_q.pack(codes)

    def run_packed(n):
        return qemu_q.dequantize_linear(raw, scale, zp, packed=True, shape=shape, n_threads=n, **kw)

    got = _check_all(run_packed, f"{qtype} {name} packed")
    assert_same_bits(got, expected, f"{qtype} {name} packed == unpacked")


@pytest.mark.parametrize("qtype", SUB_BYTE + ["int8", "int16", "float8e5m2"])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 4095, 4097, 65536 + 3, 2 * 32768 + 1])
def test_packed_round_trip_sizes(qtype, count):
    rng = np.random.default_rng(count)
    x = (rng.standard_normal(count) * 4).astype(np.float32)
    scale = np.float32(0.5)
    zp = _zero_point(rng, qtype, ())
    y = qemu_q.quantize_linear(x, scale, zp)
    for n in THREADS:
        raw = qemu_q.quantize_linear(x, scale, zp, packed=True, n_threads=n)
        assert raw.dtype == np.uint8 and raw.shape == ((count * qemu_q.element_type(qtype).bits + 7) // 8,)
        assert_same_bits(raw, qemu_q.pack(y), f"{qtype} {count} n_threads={n}")
        back = qemu_q.dequantize_linear(raw, scale, zp, packed=True, shape=(count,), n_threads=n)
        assert_same_bits(back, qemu_q.dequantize_linear(y, scale, zp), f"{qtype} {count} back")
        # bytes objects are accepted as packed input too
        back = qemu_q.dequantize_linear(raw.tobytes(), scale, zp, packed=True, shape=count)
        assert_same_bits(back, qemu_q.dequantize_linear(y, scale, zp), f"{qtype} {count} bytes")


def test_packed_out_is_reused():
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    scale = np.float32(0.5)
    zp = np.array(0, ml_dtypes.int4)
    out = np.full(501, 0xAA, np.uint8)
    got = qemu_q.quantize_linear(x, scale, zp, packed=True, out=out)
    assert got is out
    assert_same_bits(out, qemu_q.pack(qemu_q.quantize_linear(x, scale, zp)), "out=")
    y = np.empty(1001, np.float32)
    back = qemu_q.dequantize_linear(out, scale, zp, packed=True, shape=(1001,), out=y)
    assert back is y


def test_packed_whole_byte_output_is_raw_data():
    x = np.array([[1.0, -2.5], [300.0, np.nan]], np.float32)
    raw = qemu_q.quantize_linear(x, np.float32(0.5), np.array(0, np.int16), packed=True)
    assert raw.dtype == np.uint8 and raw.shape == (8,)
    assert raw.tobytes() == np.array([2, -5, 600, -32768], "<i2").tobytes()
    back = qemu_q.dequantize_linear(raw, np.float32(0.5), packed=True, dtype="int16", shape=(2, 2))
    assert_same_bits(back, np.array([[1.0, -2.5], [300.0, -16384.0]], np.float32), "int16 back")


def test_packed_errors():
    x = np.ones(10, np.float32)
    zp = np.array(0, ml_dtypes.int4)
    with pytest.raises(ValueError, match=r"uint8 array of shape \(5,\)"):
        qemu_q.quantize_linear(x, np.float32(1), zp, packed=True, out=np.empty(10, np.uint8))
    with pytest.raises(ValueError, match="overlaps"):
        raw = np.zeros(64, np.uint8)
        qemu_q.quantize_linear(raw[:40].view(np.float32), np.float32(1), zp, packed=True, out=raw[:5])
    raw = qemu_q.quantize_linear(x, np.float32(1), zp, packed=True)
    with pytest.raises(TypeError, match="shape="):
        qemu_q.dequantize_linear(raw, np.float32(1), zp, packed=True)
    with pytest.raises(TypeError, match="dtype="):
        qemu_q.dequantize_linear(raw, np.float32(1), packed=True, shape=(10,))
    with pytest.raises(TypeError, match="conflicts"):
        qemu_q.dequantize_linear(raw, np.float32(1), zp, packed=True, shape=(10,), dtype="uint4")
    with pytest.raises(ValueError, match="x has 5 bytes; 11 elements of int4 take 6"):
        qemu_q.dequantize_linear(raw, np.float32(1), zp, packed=True, shape=(11,))
    with pytest.raises(TypeError, match="uint8 bytes"):
        qemu_q.dequantize_linear(raw.view(np.int8), np.float32(1), zp, packed=True, shape=(10,))
    with pytest.raises(TypeError, match="pass packed=True"):
        qemu_q.dequantize_linear(np.zeros(10, ml_dtypes.int4), np.float32(1), shape=(10,))


def test_levels_report():
    assert "baseline" in LEVELS
    assert _kernels.active.level in LEVELS
    with pytest.raises(ValueError, match="unknown instruction-set level"):
        _kernels.load("x86-64-v9")


def test_small_inputs_run_serially():
    # Below SERIAL_BELOW no thread team is started, whatever n_threads says.
    from qemu_q._threads import SERIAL_BELOW, resolve_threads
    assert resolve_threads(8, SERIAL_BELOW - 1) == 1
    assert resolve_threads(8, SERIAL_BELOW) == 8


@pytest.mark.parametrize("qtype", ["int8", "int4", "float8e4m3fn", "uint16"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_streamed_large_outputs(qtype, axis, restore_kernels):
    # DequantizeLinear outputs of 8 MiB or more are written with streaming stores
    # (pyx/_memory.pxd); the halves here are below that size, so they are not. The bits
    # must be the same either way, for every level, path and thread count.
    rows, cols = 1024, 2100  # 2150400 elements: 8.2 MiB of float32
    rng = np.random.default_rng(zlib.crc32(f"stream {qtype} {axis}".encode()))
    dtype = np.dtype(ALL_TYPES[qtype])
    if dtype.itemsize == 2:
        codes = rng.integers(0, 2**16, (rows, cols), dtype=np.uint16).view(dtype)
    else:
        width = qemu_q.element_type(qtype).bits
        codes = (rng.integers(0, 256, (rows, cols), dtype=np.uint8) & ((1 << width) - 1)).astype(np.uint8).view(dtype)
    pshape = _param_shape((rows, cols), axis, 0)
    scale = _scales(rng, pshape)
    zp = _zero_point(rng, qtype, pshape)
    kw = {"axis": axis if axis is not None else 1}
    halves = []
    for part in (slice(0, rows // 2), slice(rows // 2, rows)):
        # Per-axis along axis 0 takes the scales of its rows.
        s, z = (scale[part], zp[part]) if axis == 0 else (scale, zp)
        halves.append(qemu_q.dequantize_linear(codes[part], s, z, n_threads=1, **kw))
    expected = np.concatenate(halves)

    def run(n):
        return qemu_q.dequantize_linear(codes, scale, zp, n_threads=n, **kw)

    assert_same_bits(_check_all(run, f"{qtype} axis={axis}"), expected, "streamed == halves")
    if qtype == "int4":
        raw = qemu_q.pack(codes)
        got = qemu_q.dequantize_linear(raw, scale, zp, packed=True, shape=codes.shape, n_threads=2, **kw)
        assert_same_bits(got, expected, "packed, streamed == halves")



# (id, qtype, axis, block_size, datapath keywords, output_dtype): the datapath loops on
# outputs of 8 MiB or more, written through the streamed pieces.
STREAMED_DATAPATHS = [
    ("int8_tensor_half_away", "int8", None, 0, {"rounding": "half_away"}, None),
    ("int8_axis1_stochastic", "int8", 1, 0, {"rounding": "stochastic"}, None),
    ("e4m3fn_tensor_flush", "float8e4m3fn", None, 0,
     {"rounding": "toward_zero", "subnormals": "flush_both", "nan": "canonical"}, None),
    ("int4_blocked_half_down", "int4", 1, 32, {"rounding": "half_down"}, None),
    ("uint8_axis0_up_float16", "uint8", 0, 0, {"rounding": "up"}, "float16"),
]


@pytest.mark.parametrize("case", STREAMED_DATAPATHS, ids=[c[0] for c in STREAMED_DATAPATHS])
def test_streamed_datapath_outputs(case, restore_kernels):
    # A datapath's loops write a large output through L1 pieces streamed out, the pieces
    # after the first starting on a 64-byte line of the output: the bits equal the two
    # halves' (each below the streaming size) wherever the output starts within a line,
    # at every level and thread count, with each element's random word where stochastic.
    _, qtype, axis, block_size, options, output_dtype = case
    rows, cols = 1024, 2100  # 2150400 elements: 8.2 MiB of float32, 4.1 MiB of float16
    if output_dtype == "float16":
        rows = 2048
    rng = np.random.default_rng(zlib.crc32(f"streamed datapath {case[0]}".encode()))
    dtype = np.dtype(ALL_TYPES[qtype])
    width = qemu_q.element_type(qtype).bits
    codes = (rng.integers(0, 256, (rows, cols), dtype=np.uint8) & ((1 << width) - 1)).astype(np.uint8).view(dtype)
    pshape = _param_shape((rows, cols), axis, block_size)
    scale = _scales(rng, pshape, special=False)
    zp = _zero_point(rng, qtype, pshape)
    datapath = qemu_q.Datapath(**options)
    words = rng.integers(0, 2**32, (rows, cols), dtype=np.uint32) if options["rounding"] == "stochastic" else None
    kw = {"axis": axis if axis is not None else 1, "block_size": block_size, "datapath": datapath,
          "output_dtype": output_dtype}
    halves = []
    for part in (slice(0, rows // 2), slice(rows // 2, rows)):
        s, z = (scale[part], zp[part]) if axis == 0 or block_size else (scale, zp)
        bits = words[part] if words is not None else None
        halves.append(qemu_q.dequantize_linear(codes[part], s, z, random_bits=bits, n_threads=1, **kw))
    expected = np.concatenate(halves)
    storage = np.empty(rows * cols + 64, dtype=expected.dtype)
    lead = (-storage.ctypes.data % 64) // storage.itemsize
    for level, n in itertools.product(LEVELS, (1, 2)):
        _kernels.use(level)
        for offset in (0, 5, 15):
            out = storage[lead + offset: lead + offset + rows * cols].reshape(rows, cols)
            out[...] = 0
            got = qemu_q.dequantize_linear(codes, scale, zp, random_bits=words, out=out, n_threads=n, **kw)
            assert got is out
            assert_same_bits(out, expected, f"{case[0]} level={level} n_threads={n} offset={offset}")


# The one-pass float32 loops' code kinds (pyx/_dequantize.pyx, FUSED_*): each streamed from
# its registers at the AVX2 and AVX-512 levels (fused_stream) on large outputs.
FUSED_KIND_TYPES = ["int4", "uint4", "int16", "uint16", "float8e4m3fn", "int8", "uint8"]
ROUNDINGS = ["half_even", "half_away", "half_up", "half_down", "toward_zero", "down", "up",
             "to_odd", "stochastic"]


@pytest.mark.parametrize("qtype", FUSED_KIND_TYPES)
def test_fused_loops_streamed_from_registers(qtype, restore_kernels):
    # Large float32 outputs of the one-pass loops: at the AVX2 and AVX-512 levels each
    # whole 64-byte line is streamed from the registers (per tensor, runs of one scale per
    # row, one scale per element, blocks of 16 and 32 along the last axis, blocks along the
    # first), the partial lines at the ends of each piece written by the L1 loops, and a
    # piece with products those loops hand back (infinite, NaN, too tiny: the huge,
    # subnormal and NaN scales and codes here) written again by them. Every mode, and the
    # result pass (output flush, canonical NaN), equals the two halves' bits (each below
    # the streaming size, so not streamed) at each level that has them.
    rows, cols = 1024, 2112  # 2162688 elements: 8.25 MiB of float32
    rng = np.random.default_rng(zlib.crc32(f"fused streamed {qtype}".encode()))
    dtype = np.dtype(ALL_TYPES[qtype])
    if dtype.itemsize == 2:
        codes = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16).view(dtype)
    else:
        width = qemu_q.element_type(qtype).bits
        codes = (rng.integers(0, 256, (rows, cols), dtype=np.uint8) & ((1 << width) - 1)).view(dtype)
    words = rng.integers(0, 2**32, (rows, cols), dtype=np.uint32)
    # per tensor, one scale per row, per element, blocks along the last axis, and blocks
    # along the first (a scale per element of each row, rows of 2112 in 32-row blocks)
    layouts = [(None, 0), (0, 0), (1, 0), (1, 16), (1, 32), (0, 32)]
    datapaths = [{"rounding": mode} for mode in ROUNDINGS] + [
        {"rounding": "half_even", "nan": "canonical", "subnormals": "flush_outputs"},
        {"rounding": "half_up", "nan": "canonical", "subnormals": "flush_both"},
        {"rounding": "stochastic", "subnormals": "flush_outputs"},
        {"rounding": "stochastic", "nan": "canonical"},
    ]
    storage = np.empty(rows * cols + 64, np.float32)
    lead = (-storage.ctypes.data % 64) // 4
    # the levels with these loops (the L1 route of the others: test_streamed_datapath_outputs)
    streaming_levels = [lv for lv in LEVELS if lv in ("x86-64-v3", "x86-64-v4")] or LEVELS[-1:]
    for case, (options, (axis, block_size)) in enumerate(itertools.product(datapaths, layouts)):
        pshape = _param_shape((rows, cols), axis, block_size)
        # every other case has only finite scales below 2**110, the others also huge, inf
        # and NaN ones (integer codes are streamed from the registers by the modes' loops
        # only in calls of the former: those loops do not check for infinite products)
        special = (case + case // len(layouts)) % 2 == 1
        scale = _scales(rng, pshape, special=special)
        if pshape:
            flat = scale.reshape(-1)
            # stochastic's bounded cases: integer codes take the loop that needs no nonzero
            # scale below 2**-103 where there is none (its bounds here: 2**-103 and the
            # float32 below 2**110), and not where one is (a scale with a full fraction)
            tiny = 1.2345678 * 2.0 ** -110 if case % 2 else 2.0 ** -103
            flat[rng.choice(flat.size, 6, replace=False)] = (
                [3e38, -3e38, 1e-42, -2e-40, 2.0 ** -100, 2.0 ** 120] if special
                else [2.0 ** 109, -2.0 ** 109, tiny, -1.9999999 * 2.0 ** 109, 2.0 ** -100, -0.0]
                if options["rounding"] == "stochastic"
                else [2.0 ** 109, -2.0 ** 109, 1e-42, -2e-40, 2.0 ** -100, -0.0])
        zp = _zero_point(rng, qtype, pshape)
        datapath = qemu_q.Datapath(**options)
        bits = words if options["rounding"] == "stochastic" else None
        kw = {"axis": axis if axis is not None else 1, "block_size": block_size, "datapath": datapath}
        halves = []
        for part in (slice(0, rows // 2), slice(rows // 2, rows)):
            # the rows' parameters: per row, per block of rows, or the same for both halves
            rows_per_param = block_size if axis == 0 and block_size else 1
            params = slice(part.start // rows_per_param, part.stop // rows_per_param)
            s, z = (scale[params], zp[params]) if axis == 0 or block_size else (scale, zp)
            halves.append(qemu_q.dequantize_linear(codes[part], s, z, n_threads=1,
                                                   random_bits=None if bits is None else bits[part], **kw))
        expected = np.concatenate(halves)
        offset = (0, 5, 15)[case % 3]
        out = storage[lead + offset: lead + offset + rows * cols].reshape(rows, cols)
        for level in streaming_levels:
            _kernels.use(level)
            out[...] = 0
            got = qemu_q.dequantize_linear(codes, scale, zp, random_bits=bits, out=out, n_threads=2, **kw)
            assert got is out
            assert_same_bits(out, expected, f"{qtype} {options} axis={axis} block={block_size} "
                                            f"level={level} offset={offset}")
    # the AVX2 and AVX-512 levels stream these layouts from the registers
    for level in set(LEVELS) & {"x86-64-v3", "x86-64-v4"}:
        _kernels.use(level)
        module = _dispatch.entry_module(_dispatch.Path.DEQUANTIZE)
        for axis, block_size in layouts:
            pshape = _param_shape((rows, cols), axis, block_size)
            plan = module_plan(codes, pshape, axis, block_size, qemu_q.Datapath(rounding="up"))
            assert module.DequantizeConfig(**dict(plan.kernel_fields)).streams_fused_loops, (level, axis, block_size)


def module_plan(codes, pshape, axis, block_size, datapath):
    dq = sys.modules["qemu_q.ops.dequantize_linear"]
    return dq.dequantize_plan(None, (codes.dtype, codes.shape), (np.dtype(np.float32), pshape), None,
                              1 if axis is None else axis, block_size, None, _dispatch.FAST_KERNELS, datapath)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("qtype", ["int4", "uint8", "int16", "float4e2m1", "float8e4m3fn"])
def test_quantize_whole_blocks(qtype, block_size, restore_kernels):
    # Blocks of 16 to 128 along a last axis they tile take their own constant-size loops
    # (pyx/_quantize.pyx: whole_blocks); the rows here span several tasks and pieces, and
    # one row is shorter than a piece.
    for shape in [(37, 4096 + 5 * block_size), (300, 3 * block_size)]:
        rng = np.random.default_rng(zlib.crc32(f"whole {qtype} {block_size} {shape}".encode()))
        x = _quantize_inputs(rng, shape)
        pshape = _param_shape(shape, 1, block_size)
        scale = _scales(rng, pshape)
        zp = _zero_point(rng, qtype, pshape)
        kw = {"axis": 1, "block_size": block_size}
        _check_quantize_paths(qtype, x, scale, zp, kw, f"{qtype} {shape} block {block_size}")


@pytest.mark.parametrize("qtype", ["int8", "uint8", "int16", "uint16", "int4"])
@pytest.mark.parametrize("axis", [None, 0])
def test_streamed_large_quantize_outputs(qtype, axis, restore_kernels):
    # QuantizeLinear outputs of 8 MiB or more with integer codes and one scale per run are
    # written with streaming stores at the AVX-512 level (pyx/_quantize.pyx:
    # stream_integer_codes), plain stores around them; the halves here are below that
    # size, so they are not. The bits must be the same either way, for every level, path
    # and thread count. Rows of 2137 codes put the 64-byte lines at every offset.
    dtype = np.dtype(ALL_TYPES[qtype])
    rows = -(-(1 << 23) // (2137 * dtype.itemsize)) + 1
    shape = (rows + rows % 2, 2137)
    rng = np.random.default_rng(zlib.crc32(f"stream q {qtype} {axis}".encode()))
    x = _quantize_inputs(rng, shape)
    pshape = _param_shape(shape, axis, 0)
    scale = _scales(rng, pshape)
    zp = _zero_point(rng, qtype, pshape)
    kw = {"axis": axis if axis is not None else 1}
    halves = []
    for part in (slice(0, shape[0] // 2), slice(shape[0] // 2, shape[0])):
        s, z = (scale[part], zp[part]) if axis == 0 else (scale, zp)
        with np.errstate(all="ignore"):
            halves.append(qemu_q.quantize_linear(x[part], s, z, n_threads=1, **kw))
    expected = np.concatenate(halves)
    assert expected.nbytes >= 1 << 23 > halves[0].nbytes

    def run(n):
        with np.errstate(all="ignore"):
            return qemu_q.quantize_linear(x, scale, zp, n_threads=n, **kw)

    assert_same_bits(_check_all(run, f"{qtype} axis={axis}"), expected, "streamed == halves")


# ------------------------------------------------ the integer datapath: thread-count independence

@pytest.mark.parametrize("rule", ["exact", "float32", "float64"])
@pytest.mark.parametrize("accumulator", ["int32", "x86-u8s8-pairs", "int32-saturate", "int16", "int24-saturate"])
def test_integer_datapath_threads(rule, accumulator, restore_kernels):
    # every thread count on the best level, and every other built level, give the same bits
    rng = np.random.default_rng(13)
    a = rng.integers(0, 256, (3, 96, 200), dtype=np.uint8)
    b = rng.integers(-128, 128, (200, 300), dtype=np.int8)
    args = (a, np.float32(0.02), np.uint8(7), b, np.float32(0.003), np.int8(-5),
            np.float32(0.01), np.uint8(128))
    x = rng.integers(0, 256, (2, 8, 40, 40), dtype=np.uint8)
    w = rng.integers(-128, 128, (16, 4, 3, 3), dtype=np.int8)
    conv_args = (x, np.float32(0.05), np.uint8(3), w, np.float32(0.004), np.int8(1),
                 np.float32(0.07), np.uint8(9), rng.integers(-9999, 9999, 16).astype(np.int32))
    # QLinearMatMul-21 with float8 operands (NaN and inf codes included) into float8
    e4m3 = ml_dtypes.float8_e4m3fn
    f8a = rng.integers(0, 256, (2, 40, 64), dtype=np.uint8).view(e4m3)
    f8b = rng.integers(0, 256, (64, 50), dtype=np.uint8).view(e4m3)
    zero8, y8 = np.zeros((), e4m3), np.zeros((), ml_dtypes.float8_e5m2)
    results = []
    for level, n in [(LEVELS[0], 1), (LEVELS[0], 2), (LEVELS[0], 3), (LEVELS[0], 8)] + [(lv, 2) for lv in LEVELS[1:]]:
        _kernels.use(level)
        results.append((
            qemu_q.matmul_integer(a, b, np.uint8(7), np.int8(-5), accumulator=accumulator, n_threads=n),
            qemu_q.qlinear_matmul(*args, requantization=rule, accumulator=accumulator, n_threads=n),
            qemu_q.conv_integer(x, w, np.uint8(3), np.int8(1), group=2, pads=[1, 0, 2, 1],
                                accumulator="int32" if accumulator == "x86-u8s8-pairs" else accumulator,
                                n_threads=n),
            qemu_q.qlinear_conv(*conv_args, group=2, strides=[2, 1], auto_pad="SAME_LOWER",
                                requantization=rule, accumulator=accumulator, n_threads=n),
            qemu_q.qlinear_matmul(f8a, np.float32(0.5), zero8, f8b, np.float32(0.25), zero8, np.float32(3.0),
                                  y8, requantization=rule, opset=21, n_threads=n),
        ))
    _kernels.use(LEVELS[0])
    for other in results[1:]:
        for first, got in zip(results[0], other):
            assert first.dtype == got.dtype
            np.testing.assert_array_equal(first.view(np.uint8), got.view(np.uint8))
