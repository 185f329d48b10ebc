"""Hostile input (issue 9): no crash, no hang, no wrong bit, and only TypeError / ValueError
whose message names the argument, the value and what is allowed; inputs never modified.

tests/test_validation.py holds the ordinary validation errors; this file holds what a
hostile caller found: block sizes up to 2**64, out= buffers that alias, are misaligned or
read-only, attribute values of the wrong type, validation that depended on the plan
cache's history, huge and zero-size shapes, foreign dtypes, and a seeded generator of a few
thousand such calls run in one child process (tests/hostile_calls.py). Calls that may crash
run in child processes (tests/isolation.py).
"""

import fractions
import hashlib

import ml_dtypes
import numpy as np
import pytest

import qemu_q
from support import same_bits
from qemu_q import cli

from isolation import last_json_line, run_python  # noqa: E402

F32 = np.float32
ql = qemu_q.quantize_linear
dql = qemu_q.dequantize_linear

# Messages that name nothing: a numpy / Cython / Python error that escaped validation.
BARE_MESSAGES = (
    "Buffer has wrong number of dimensions", "Python int too large to convert",
    "value too large to convert", "'NoneType' object is not iterable", "object is not iterable",
    "cannot be interpreted as an integer", "Buffer dtype mismatch", "unhashable type",
    "dictionary update sequence", "underlying buffer is not",
)


class _Opaque:
    """An object of no type the library knows, whose repr (a test id) is the same in every
    process."""

    def __repr__(self) -> str:
        return "<opaque object>"


OPAQUE = _Opaque()


def _digest(values):
    digest = hashlib.sha256()
    for value in values:
        if isinstance(value, np.ndarray):
            digest.update(repr(value.tolist()).encode() if value.dtype.kind == "O" else value.tobytes())
        elif isinstance(value, (bytes, bytearray, memoryview)):
            digest.update(bytes(value))
    return digest.hexdigest()


def rejected(call, *inputs, error=(TypeError, ValueError), names=()):
    """call() raises `error` whose message holds every fragment of `names` and no bare
    numpy/Cython message, and leaves `inputs` unchanged. Returns the message."""
    before = _digest(inputs)
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert not [b for b in BARE_MESSAGES if b in message], f"bare message: {message}"
    for fragment in names:
        assert fragment in message, f"{fragment!r} not in the message: {message}"
    assert _digest(inputs) == before, "the call modified an input"
    return message


# =======================================================================================
# block_size beyond the axis: the bits of block_size = D (issue 9, defect 1)

_BLOCK_SCRIPT = """
import json, sys
import numpy as np
import qemu_q

op = sys.argv[1]
rng = np.random.default_rng(11)
# (x shape, axis): the issue's (300, 3, 300) on axis 1, an inner axis of 1, the last axis.
layouts = [((300, 3, 300), 1), ((5, 40000), 0), ((40000, 7), 1)]
huge = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 300, 2**63 - 3, 2**63 - 2, 2**63 - 1,
        np.int64(2**63 - 1), np.uint64(2**63 - 1)]
wrong = []
for shape, axis in layouts:
    scale_shape = list(shape)
    scale_shape[axis] = 1
    scale = rng.uniform(0.5, 2.0, scale_shape).astype(np.float32)
    if op == "quantize":
        x = (rng.standard_normal(shape) * 50).astype(np.float32)
        zp = rng.integers(0, 256, scale_shape).astype(np.uint8)
        call = lambda b, t: qemu_q.quantize_linear(x, scale, zp, axis=axis, block_size=b, n_threads=t)
    else:
        x = rng.integers(-128, 128, shape).astype(np.int8)
        zp = rng.integers(-128, 128, scale_shape).astype(np.int8)
        call = lambda b, t: qemu_q.dequantize_linear(x, scale, zp, axis=axis, block_size=b, n_threads=t)
    before = x.tobytes() + scale.tobytes() + zp.tobytes()
    expected = call(shape[axis], 1)
    for block_size in [shape[axis] + 1, shape[axis] + 2] + huge:
        for threads in (1, 2):
            print("x", shape, "axis", axis, "block_size", block_size, "threads", threads, flush=True)
            got = call(block_size, threads)
            if got.tobytes() != expected.tobytes():
                wrong.append(f"{shape} axis {axis} block_size={block_size} threads={threads}")
    if x.tobytes() + scale.tobytes() + zp.tobytes() != before:
        wrong.append(f"{shape}: an input was modified")
print(json.dumps(wrong))
"""


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_block_size_beyond_the_axis_gives_the_bits_of_d(op, package_home):
    # One block along the axis: any block_size >= D (up to 2**63 - 1) means the same.
    outcome = run_python(_BLOCK_SCRIPT, package_home, args=(op,), timeout=180)
    assert outcome.ok, outcome.describe()
    wrong = last_json_line(outcome)
    assert wrong == [], f"{len(wrong)} wrong:\n" + "\n".join(wrong)


def test_cli_block_size_beyond_the_axis(tmp_path, package_home):
    rng = np.random.default_rng(12)
    np.save(tmp_path / "x.npy", (rng.standard_normal((300, 3, 300)) * 50).astype(F32))
    np.save(tmp_path / "s.npy", rng.uniform(0.5, 2.0, (300, 1, 300)).astype(F32))
    outcome = run_python(f"""
import json, pathlib
import numpy as np
from qemu_q.cli import main

home = pathlib.Path({str(tmp_path)!r})
wrong = []
for size in [3, 4, 2**32, 2**63 - 3, 2**63 - 1]:
    print("--block-size", size, flush=True)
    code = main(["quantize", str(home / "x.npy"), str(home / "s.npy"), "--axis", "1",
                 "--block-size", str(size), "-o", str(home / f"y{{size}}.npy")])
    if code != 0:
        wrong.append(f"--block-size {{size}}: exit {{code}}")
expected = np.load(home / "y3.npy")
for size in [4, 2**32, 2**63 - 3, 2**63 - 1]:
    path = home / f"y{{size}}.npy"
    if path.exists() and np.load(path).tobytes() != expected.tobytes():
        wrong.append(f"--block-size {{size}}: other bits than --block-size 3")
print(json.dumps(wrong))
""", package_home, timeout=180)
    assert outcome.ok, outcome.describe()
    wrong = last_json_line(outcome)
    assert wrong == [], f"{len(wrong)} wrong:\n" + "\n".join(wrong)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, 2**64, 2**100, np.uint64(2**63), np.uint64(2**64 - 1)])
@pytest.mark.parametrize("op", ["quantize", "dequantize"])
def test_block_size_not_an_int64(op, value):
    # One block along the axis, so the range check alone admits it: a ValueError naming
    # block_size and the value (not an OverflowError from the kernel's argument).
    if op == "quantize":
        x, s = np.zeros((4, 6), F32), np.ones((4, 1), F32)
        call = lambda: ql(x, s, axis=1, block_size=value)  # noqa: E731
    else:
        x, s = np.zeros((4, 6), np.int8), np.ones((4, 1), F32)
        call = lambda: dql(x, s, axis=1, block_size=value)  # noqa: E731
    rejected(call, x, s, error=ValueError, names=("block_size", str(int(value))))


@pytest.mark.parametrize("value", [-(2**63), -(2**64), -(2**100)])
def test_block_size_hugely_negative(value):
    x, s = np.zeros((4, 6), F32), np.ones((4, 1), F32)
    rejected(lambda: ql(x, s, axis=1, block_size=value), x, s, error=ValueError,
             names=("block_size", str(value)))


@pytest.mark.parametrize("size", [2**63, 2**64])
def test_cli_block_size_not_an_int64(tmp_path, capsys, size):
    np.save(tmp_path / "x.npy", np.zeros((4, 6), F32))
    np.save(tmp_path / "s.npy", np.ones((4, 1), F32))
    code = cli.main(["quantize", str(tmp_path / "x.npy"), str(tmp_path / "s.npy"), "--axis", "1",
                     "--block-size", str(size), "-o", str(tmp_path / "y.npy")])
    err = capsys.readouterr().err
    assert code in (1, 2), err
    assert len(err.strip().splitlines()) == 1 and "block" in err and str(size) in err, err
    assert not [b for b in BARE_MESSAGES if b in err], err
    assert not (tmp_path / "y.npy").exists()


# =======================================================================================
# out= buffers


def test_out_aliasing_the_zero_point_quantize():
    x, s = np.linspace(-3, 3, 6, dtype=F32), np.ones(6, F32)
    zp = np.arange(6, dtype=np.uint8)
    rejected(lambda: ql(x, s, zp, axis=0, out=zp), x, s, zp, error=ValueError,
             names=("out", "y_zero_point"))


def test_out_aliasing_the_zero_point_dequantize():
    buffer = np.zeros(24, np.uint8)
    zp = buffer[:6].view(np.int8)
    out = buffer.view(F32)
    x, s = np.arange(6, dtype=np.int8), np.ones(6, F32)
    rejected(lambda: dql(x, s, zp, axis=0, out=out), x, s, zp, error=ValueError,
             names=("out", "x_zero_point"))


def test_out_aliasing_the_packed_input():
    buffer = np.zeros(32, np.uint8)
    raw = buffer[:4]
    out = buffer.view(F32)
    rejected(lambda: dql(raw, F32(1), packed=True, dtype="int4", shape=(8,), out=out), raw,
             error=ValueError, names=("out", "x"))


def _read_only(n):
    out = np.zeros(n, np.uint8)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("make_out, names", [
    (lambda n: np.zeros(n, np.int8), ("out", "int8", "uint8")),
    (lambda n: np.zeros(n + 1, np.uint8), ("out", "(5,)", "(6,)")),
    (lambda n: np.zeros((n, 2), np.uint8)[:, 0], ("out", "contiguous")),
    (_read_only, ("out", "read-only")),
], ids=["dtype", "shape", "strided", "read_only"])
def test_quantize_packed_out_rejected(make_out, names):
    x = np.linspace(-5, 5, 10, dtype=F32)
    out = make_out(5)
    rejected(lambda: ql(x, F32(1), output_dtype="int4", packed=True, out=out), x, names=names)


def test_quantize_packed_out_aliasing_x():
    x = np.linspace(-5, 5, 10, dtype=F32)
    out = x.view(np.uint8)[:5]
    rejected(lambda: ql(x, F32(1), output_dtype="int4", packed=True, out=out), x, error=ValueError,
             names=("out", "x"))


@pytest.mark.parametrize("out, fragments", [
    (np.zeros(4, np.int8), ("out", "int8")),
    (np.zeros(5, np.uint8), ("out", "(5,)", "(4,)")),
    (np.zeros((4, 2), np.uint8)[:, 0], ("out", "contiguous")),
    ([0, 0, 0, 0], ("out", "list")),
], ids=["dtype", "shape", "strided", "list"])
def test_pack_out_rejected_with_what_was_wrong(out, fragments):
    array = np.arange(-4, 4, dtype=np.int8).astype(ml_dtypes.int4)
    rejected(lambda: qemu_q.pack(array, out=out), array, names=fragments)


def test_pack_out_aliasing_the_array():
    buffer = np.zeros(8, np.uint8)
    array = buffer.view(ml_dtypes.uint4)
    array[...] = np.arange(8).astype(ml_dtypes.uint4)
    rejected(lambda: qemu_q.pack(array, out=buffer[:4]), array, error=ValueError, names=("out", "array"))


_MISALIGNED_SCRIPT = """
import json, sys
import ml_dtypes
import numpy as np
import qemu_q
from qemu_q import _kernels

case = sys.argv[1]
MIB = 1 << 20


def misaligned(n, dtype, offset):
    dtype = np.dtype(dtype)
    array = np.frombuffer(bytearray(n * dtype.itemsize + offset), dtype, count=n, offset=offset)
    assert array.flags.writeable and array.flags.c_contiguous
    return array


def calls():
    rng = np.random.default_rng(13)  # the same inputs at every level
    # (label, n elements of out, out dtype, fn(out) -> result, offsets)
    if case == "quantize_int16":
        for n in (1003, 4 * MIB + 3):  # 8 MiB of int16: the streaming-store loops
            x = (rng.standard_normal(n) * 1e4).astype(np.float32)
            yield f"n={n}", n, np.int16, lambda out, x=x: qemu_q.quantize_linear(x, np.float32(0.7), output_dtype="int16", out=out), (1, 3)
    elif case == "quantize_uint8":
        for n in (1003, 8 * MIB + 5):
            x = (rng.standard_normal(n) * 100).astype(np.float32)
            yield f"n={n}", n, np.uint8, lambda out, x=x: qemu_q.quantize_linear(x, np.float32(0.7), out=out), (1, 17, 33)
    elif case == "dequantize_float32":
        for n in (1003, 2 * MIB + 1):
            codes = rng.integers(-128, 128, n).astype(np.int8)
            yield f"n={n}", n, np.float32, lambda out, c=codes: qemu_q.dequantize_linear(c, np.float32(0.1), np.int8(3), out=out), (1, 2, 3)
    elif case == "dequantize_float16":
        for n in (1003, 4 * MIB + 1):
            codes = rng.integers(-128, 128, n).astype(np.int8)
            yield f"n={n}", n, np.float16, lambda out, c=codes: qemu_q.dequantize_linear(c, np.float16(0.1), out=out), (1,)
    elif case == "dequantize_bfloat16":
        for n in (1003, 4 * MIB + 1):
            codes = rng.integers(0, 256, n).astype(np.uint8)
            yield f"n={n}", n, ml_dtypes.bfloat16, lambda out, c=codes: qemu_q.dequantize_linear(c, np.array(0.3, ml_dtypes.bfloat16), out=out), (1,)
    elif case == "dequantize_packed_float32":
        for n in (1003, 2 * MIB + 1):
            raw = rng.integers(0, 256, (n + 1) // 2).astype(np.uint8)
            yield f"n={n}", n, np.float32, lambda out, r=raw, n=n: qemu_q.dequantize_linear(r, np.float32(0.1), packed=True, dtype="int4", shape=(n,), out=out), (1, 3)
    elif case == "quantize_packed_int4":
        for n in (1003, 16 * MIB + 1):  # 8 MiB of packed output
            x = (rng.standard_normal(n) * 4).astype(np.float32)
            yield f"n={n}", (n + 1) // 2, np.uint8, lambda out, x=x: qemu_q.quantize_linear(x, np.float32(0.5), output_dtype="int4", packed=True, out=out), (1, 3, 33)
    elif case == "quantize_packed_int16":
        for n in (1003, 4 * MIB + 3):
            x = (rng.standard_normal(n) * 1e4).astype(np.float32)
            yield f"n={n}", 2 * n, np.uint8, lambda out, x=x: qemu_q.quantize_linear(x, np.float32(0.7), output_dtype="int16", packed=True, out=out), (1, 3)
    elif case == "quantize_packed_float6":
        n = 4001
        x = (rng.standard_normal(n) * 4).astype(np.float32)
        yield f"n={n}", (n * 6 + 7) // 8, np.uint8, lambda out, x=x: qemu_q.quantize_linear(x, np.float32(0.5), output_dtype="float6e3m2", packed=True, out=out), (1, 3)
    elif case == "pack_int4":
        for n in (1003, 16 * MIB + 1):
            a = rng.integers(-8, 8, n).astype(ml_dtypes.int4)
            yield f"n={n}", (n + 1) // 2, np.uint8, lambda out, a=a: qemu_q.pack(a, out=out), (1, 3)


wrong = []
reference = {}
for level in _kernels.available_levels():
    previous = _kernels.use(level)
    try:
        for label, n, dtype, fn, offsets in calls():
            aligned = fn(None)
            key = (label,)
            if key in reference and reference[key] != aligned.tobytes():
                wrong.append(f"{level} {label}: aligned out differs from {_kernels.available_levels()[0]}")
            reference.setdefault(key, aligned.tobytes())
            for offset in offsets:
                print(level, label, "offset", offset, flush=True)
                out = misaligned(n, dtype, offset)
                try:
                    got = fn(out.reshape(aligned.shape))
                except (TypeError, ValueError) as error:
                    wrong.append(f"{level} {label} offset {offset}: rejected: {type(error).__name__}: {error}")
                    continue
                if got.reshape(-1).view(np.uint8).tobytes() != aligned.reshape(-1).view(np.uint8).tobytes():
                    wrong.append(f"{level} {label} offset {offset}: other bits than an aligned out=")
                if not np.shares_memory(got, out):
                    wrong.append(f"{level} {label} offset {offset}: the result is not out")
    finally:
        _kernels.use(previous)
print(json.dumps(wrong))
"""


@pytest.mark.parametrize("case", [
    "quantize_int16", "quantize_uint8", "dequantize_float32", "dequantize_float16",
    "dequantize_bfloat16", "dequantize_packed_float32", "quantize_packed_int4",
    "quantize_packed_int16", "quantize_packed_float6", "pack_int4",
])
def test_misaligned_out_gives_the_bits_of_an_aligned_one(case, package_home):
    # out= at odd byte offsets (np.frombuffer(bytearray(...), offset=k)) is accepted and
    # written with exactly the bits of an aligned out=, small and >= 8 MiB (the streaming-
    # store size), at every instruction-set level this machine runs.
    outcome = run_python(_MISALIGNED_SCRIPT, package_home, args=(case,), timeout=300)
    assert outcome.ok, outcome.describe()
    wrong = last_json_line(outcome)
    assert wrong == [], f"{len(wrong)} wrong:\n" + "\n".join(wrong)


def test_misaligned_inputs_give_the_same_bits(package_home):
    outcome = run_python("""
import json
import numpy as np
import qemu_q
from qemu_q import _kernels

def misaligned(array):
    raw = bytearray(array.nbytes + 1)
    view = np.frombuffer(raw, array.dtype, count=array.size, offset=1).reshape(array.shape)
    view[...] = array
    return view

rng = np.random.default_rng(14)
x = (rng.standard_normal((700, 301)) * 30).astype(np.float32)
s = rng.uniform(0.1, 2, 301).astype(np.float32)
zp = rng.integers(-100, 100, 301).astype(np.int16)
codes = rng.integers(-30000, 30000, (700, 301)).astype(np.int16)
wrong = []
for level in _kernels.available_levels():
    previous = _kernels.use(level)
    try:
        print(level, flush=True)
        a = qemu_q.quantize_linear(x, s, zp, axis=1)
        b = qemu_q.quantize_linear(misaligned(x), misaligned(s), misaligned(zp), axis=1)
        if a.tobytes() != b.tobytes():
            wrong.append(f"{level}: quantize")
        a = qemu_q.dequantize_linear(codes, s, zp, axis=1)
        b = qemu_q.dequantize_linear(misaligned(codes), misaligned(s), misaligned(zp), axis=1)
        if a.tobytes() != b.tobytes():
            wrong.append(f"{level}: dequantize")
        a = qemu_q.dynamic_quantize_linear(x)
        b = qemu_q.dynamic_quantize_linear(misaligned(x))
        if any(p.tobytes() != q.tobytes() for p, q in zip(a, b)):
            wrong.append(f"{level}: dynamic")
    finally:
        _kernels.use(previous)
print(json.dumps(wrong))
""", package_home, timeout=180)
    assert outcome.ok, outcome.describe()
    wrong = last_json_line(outcome)
    assert wrong == [], f"{len(wrong)} wrong:\n" + "\n".join(wrong)


# =======================================================================================
# Smaller defects of issue 9


@pytest.mark.parametrize("make", [
    lambda data: memoryview(data)[::2],
    lambda data: memoryview(np.frombuffer(data, np.uint8).reshape(4, 4)[:, ::2]),
], ids=["strided_1d", "strided_2d"])
def test_unpack_of_a_non_contiguous_memoryview(make):
    data = bytes(range(16, 32))
    view = make(data)
    expected_bytes = np.asarray(view).tobytes()
    try:
        got = qemu_q.unpack(view, "int4", (16,))
    except (TypeError, ValueError) as error:
        assert "buffer" in str(error) and not [b for b in BARE_MESSAGES if b in str(error)], str(error)
    else:
        assert same_bits(got, qemu_q.unpack(expected_bytes, "int4", (16,)))


@pytest.mark.parametrize("value", ["bogus", "x86-64-v9", "AVX512"])
def test_bad_isa_variable_warns_and_falls_back(value, package_home):
    outcome = run_python("""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import numpy as np
    import qemu_q
    from qemu_q import _kernels
y = qemu_q.quantize_linear(np.array([2.5, -7.5], np.float32), np.float32(1), output_dtype="int8")
print(json.dumps({"warnings": [[w.category.__name__, str(w.message)] for w in caught],
                  "level": _kernels.active.level, "best": _kernels.available_levels()[0],
                  "y": y.tolist()}))
""", package_home, env={"QEMU_Q_ISA": value}, timeout=60)
    assert outcome.ok, outcome.describe()
    report = last_json_line(outcome)
    runtime = [m for c, m in report["warnings"] if c == "RuntimeWarning"]
    assert runtime and "QEMU_Q_ISA" in runtime[0] and value in runtime[0], report["warnings"]
    assert report["level"] == report["best"] and report["y"] == [2, -8]


def _limited_memory():
    import resource

    limit = 8 << 30  # a 4 TiB allocation fails instead of waking the OOM killer
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_empty_x_with_a_huge_broadcast_scale(package_home):
    # Shapes and out= are checked before anything is allocated or copied: a 2**40-long
    # scale that costs no memory (a broadcast) must not be materialized.
    outcome = run_python("""
import json
import numpy as np
import qemu_q

n = 2**40
scale = np.broadcast_to(np.float32(1), (n,))
report = {}

def attempt(name, fn, want):
    try:
        result = fn()
    except (TypeError, ValueError) as error:
        report[name] = ["rejected", type(error).__name__, str(error)]
    except BaseException as error:
        report[name] = ["raised", type(error).__name__, str(error)[:200]]
    else:
        report[name] = ["returned", str(result.dtype), list(result.shape)]

attempt("quantize, 1-byte out", lambda: qemu_q.quantize_linear(np.empty((0, n), np.float32), scale, axis=1, out=np.empty(1, np.uint8)), None)
attempt("dequantize, 1-byte out", lambda: qemu_q.dequantize_linear(np.empty((0, n), np.int8), scale, axis=1, out=np.empty(1, np.float32)), None)
attempt("quantize, broadcast zero point, 1-byte out", lambda: qemu_q.quantize_linear(np.empty((n, 0), np.float32), scale, np.broadcast_to(np.uint8(0), (n,)), axis=0, out=np.empty(1, np.uint8)), None)
attempt("quantize", lambda: qemu_q.quantize_linear(np.empty((0, n), np.float32), scale, axis=1), None)
attempt("dequantize", lambda: qemu_q.dequantize_linear(np.empty((0, n), np.int8), scale, axis=1), None)
print(json.dumps(report))
""", package_home, preexec_fn=_limited_memory, timeout=120)
    assert outcome.ok, outcome.describe()
    report = last_json_line(outcome)
    problems = []
    for name, (how, kind, detail) in report.items():
        if "out" in name:
            if how != "rejected" or "out" not in detail:
                problems.append(f"{name}: {how} {kind} {detail}")
        elif how == "raised":
            problems.append(f"{name}: {kind} {detail}")
        elif how == "returned" and detail != [0, 2**40]:
            problems.append(f"{name}: returned shape {detail}")
    assert not problems, "\n".join(problems)


def test_retained_scratch_memory_is_bounded():
    # A per-axis call with a 2**24-long float16 scale converts its parameters into
    # per-thread scratch arrays; what stays allocated after the call must be bounded
    # (issue 9: 128 MB and more were kept for the life of the thread).
    import gc
    import tracemalloc

    x = np.ones((1, 1 << 24), np.float16)
    s = np.ones(1 << 24, np.float16)
    zp = np.zeros(1 << 24, np.int8)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        y = ql(x, s, zp, axis=1)
        del y
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert retained <= 16 << 20, f"{retained / 2**20:.0f} MiB retained after the call"


_CACHE_ORDER_SCRIPT = """
import fractions, json, sys
import numpy as np
import qemu_q

case, order = sys.argv[1], sys.argv[2]
x = np.linspace(-3, 3, 12, dtype=np.float32)
codes = np.arange(12, dtype=np.int8)
CASES = {
    # (valid call, the same call with the value of another type that compares equal)
    "quantize_opset": (lambda: qemu_q.quantize_linear(x, np.float32(1), opset=21),
                       lambda: qemu_q.quantize_linear(x, np.float32(1), opset=21.0)),
    "quantize_opset_fraction": (lambda: qemu_q.quantize_linear(x, np.float32(1), opset=21),
                                lambda: qemu_q.quantize_linear(x, np.float32(1), opset=fractions.Fraction(21))),
    "dequantize_opset": (lambda: qemu_q.dequantize_linear(codes, np.float32(1), opset=21),
                         lambda: qemu_q.dequantize_linear(codes, np.float32(1), opset=21.0)),
    "run_op_opset": (lambda: qemu_q.run_op("QuantizeLinear", [x, np.float32(1)], {}, 21),
                     lambda: qemu_q.run_op("QuantizeLinear", [x, np.float32(1)], {}, 21.0)),
    "quantize_output_dtype": (lambda: qemu_q.quantize_linear(x, np.float32(1), output_dtype=3),
                              lambda: qemu_q.quantize_linear(x, np.float32(1), output_dtype=3.0)),
    "dequantize_output_dtype": (lambda: qemu_q.dequantize_linear(codes, np.float32(1), output_dtype=1),
                                lambda: qemu_q.dequantize_linear(codes, np.float32(1), output_dtype=True)),
}
good, bad = CASES[case]
steps = ["bad", "good", "bad"] if order == "bad_first" else ["good", "bad"]
results = []
for step in steps:
    try:
        (good if step == "good" else bad)()
        results.append([step, "returned", ""])
    except Exception as error:
        results.append([step, type(error).__name__, str(error)])
print(json.dumps(results))
"""


@pytest.mark.parametrize("order", ["bad_first", "good_first"])
@pytest.mark.parametrize("case", ["quantize_opset", "quantize_opset_fraction", "dequantize_opset",
                                  "run_op_opset", "quantize_output_dtype", "dequantize_output_dtype"])
def test_validation_does_not_depend_on_the_plan_cache(case, order, package_home):
    # opset=21.0 equals 21 and hashes alike: validation must type-check before the cache
    # key is formed, so 21.0 is a TypeError whether or not opset=21 ran before.
    outcome = run_python(_CACHE_ORDER_SCRIPT, package_home, args=(case, order), timeout=60)
    assert outcome.ok, outcome.describe()
    results = last_json_line(outcome)
    for step, kind, message in results:
        if step == "good":
            assert kind == "returned", f"the valid call failed: {kind} {message}"
        else:
            assert kind == "TypeError", f"{results}"
            assert "opset" in message or "output_dtype" in message, message


def test_opset_variants_in_this_process():
    x = np.linspace(-3, 3, 12, dtype=F32)
    assert same_bits(ql(x, F32(1), opset=21), ql(x, F32(1), opset=21))
    for opset in (21.0, True, "21", fractions.Fraction(21), np.float64(21)):
        rejected(lambda opset=opset: ql(x, F32(1), opset=opset), x, error=TypeError, names=("opset",))


@pytest.mark.parametrize("kwargs, error, names", [
    ({"axis": "1"}, TypeError, ("axis", "'1'")),
    ({"axis": None}, TypeError, ("axis", "None")),
    ({"axis": [1]}, TypeError, ("axis",)),
    ({"block_size": 1.5}, TypeError, ("block_size", "1.5")),
    ({"block_size": "2"}, TypeError, ("block_size", "'2'")),
    ({"block_size": np.float32(2)}, TypeError, ("block_size",)),
    ({"saturate": "1"}, TypeError, ("saturate",)),
    ({"saturate": 1.0}, TypeError, ("saturate", "1.0")),
    ({"saturate": 2**64}, ValueError, ("saturate", str(2**64))),
    ({"precision": 1.0}, TypeError, ("precision", "1.0")),
    ({"precision": 3}, ValueError, ("precision=3",)),
    ({"precision": 2**63}, ValueError, ("precision", str(2**63))),
    ({"output_dtype": OPAQUE}, TypeError, ("output_dtype",)),
    ({"output_dtype": 2.0}, TypeError, ("output_dtype", "2.0")),
    ({"output_dtype": [3]}, TypeError, ("output_dtype",)),
    ({"output_dtype": 2**64}, ValueError, ("output_dtype", str(2**64))),
    ({"packed": "yes"}, TypeError, ("packed",)),
], ids=lambda v: repr(v) if not isinstance(v, (tuple, type)) else None)
def test_quantize_attribute_of_the_wrong_type(kwargs, error, names):
    x, s = np.zeros((4, 6), F32), np.ones(6, F32)
    rejected(lambda: ql(x, s, **kwargs), x, s, error=error, names=names)


@pytest.mark.parametrize("kwargs, error, names", [
    ({"axis": 1.0}, TypeError, ("axis", "1.0")),
    ({"axis": 2**63}, ValueError, ("axis", str(2**63))),
    ({"axis": -(2**64)}, ValueError, ("axis", str(-(2**64)))),
    ({"block_size": np.float64(3)}, TypeError, ("block_size",)),
    ({"output_dtype": 1.0}, TypeError, ("output_dtype", "1.0")),
], ids=lambda v: repr(v) if not isinstance(v, (tuple, type)) else None)
def test_dequantize_attribute_of_the_wrong_type(kwargs, error, names):
    x, s = np.zeros((4, 6), np.int8), np.ones(6, F32)
    rejected(lambda: dql(x, s, **kwargs), x, s, error=error, names=names)


def test_dequantize_packed_not_a_bool():
    raw = np.zeros(12, np.uint8)
    rejected(lambda: dql(raw, F32(1), packed="yes", dtype="int4", shape=(4, 6)), raw,
             error=TypeError, names=("packed", "'yes'"))


def test_saturate_numpy_integer_accepted():
    x = np.array([500.0, -500.0, 1.3], F32)
    expected = ql(x, F32(1), output_dtype="float8e4m3fn", saturate=1)
    assert same_bits(ql(x, F32(1), output_dtype="float8e4m3fn", saturate=np.int64(1)), expected)
    assert same_bits(ql(x, F32(1), output_dtype="float8e4m3fn", saturate=np.int8(0)),
                     ql(x, F32(1), output_dtype="float8e4m3fn", saturate=0))


# --- run_op ------------------------------------------------------------------------------


def test_run_op_inputs_not_a_list():
    rejected(lambda: qemu_q.run_op("QuantizeLinear", None, {}, 21), error=TypeError, names=("inputs", "None"))


def test_run_op_attributes_not_a_mapping():
    x = np.zeros(3, F32)
    rejected(lambda: qemu_q.run_op("QuantizeLinear", [x, F32(1)], "axis", 21), x,
             error=TypeError, names=("attributes",))


def test_run_op_attribute_value_of_the_wrong_type():
    x = np.zeros((2, 3), F32)
    rejected(lambda: qemu_q.run_op("QuantizeLinear", [x, np.ones(3, F32)], {"axis": "1"}, 21), x,
             error=TypeError, names=("axis", "'1'"))


def test_run_op_dynamic_with_two_inputs():
    x = np.zeros(3, F32)
    rejected(lambda: qemu_q.run_op("DynamicQuantizeLinear", [x, F32(1)], {}, 11), x,
             error=ValueError, names=("at most 1",))


def test_run_op_op_type_not_a_string():
    rejected(lambda: qemu_q.run_op(None, [], {}, 21), error=TypeError, names=("op_type", "None"))


# --- pack / unpack -----------------------------------------------------------------------


@pytest.mark.parametrize("shape, names", [
    (None, ("shape", "None")), ((2.5,), ("shape", "2.5")), ("12", ("shape", "'12'")),
    ((np.float32(2),), ("shape",)), ([None], ("shape", "None")),
])
def test_unpack_shape_of_the_wrong_type(shape, names):
    rejected(lambda: qemu_q.unpack(bytes(1), "int4", shape), error=TypeError, names=names)


@pytest.mark.parametrize("shape", [(2**62,), (2**63,), (2**64,), (2**40, 2**40), (0, 2**64)])
def test_unpack_huge_shape(shape):
    # Nothing is allocated: the buffer does not hold that many elements.
    rejected(lambda: qemu_q.unpack(bytes(4), "int4", shape), error=ValueError, names=("buffer",))


@pytest.mark.parametrize("buffer, names", [
    ([1, 2], ("buffer", "list")), ("ab", ("buffer", "str")), (None, ("buffer", "None")),
    (3, ("buffer", "int")),
])
def test_unpack_buffer_of_the_wrong_type(buffer, names):
    rejected(lambda: qemu_q.unpack(buffer, "int4", (2,)), error=TypeError, names=names)


@pytest.mark.parametrize("dtype, error", [(object(), TypeError), ("float80", ValueError), (np.complex64, ValueError),
                                          (3.0, TypeError), (None, (TypeError, ValueError))])
def test_unpack_dtype_rejected(dtype, error):
    # None is no type (numpy would read it as float64): the message names what was given.
    names = ("dtype", "None") if dtype is None else ("dtype",)
    rejected(lambda: qemu_q.unpack(bytes(2), dtype, (2,)), error=error, names=names)


# bool and float64 are ONNX types (Cast's): pack gives their little-endian bytes.
@pytest.mark.parametrize("dtype", [object, np.complex64, "datetime64[s]", np.longdouble, "U2"])
def test_pack_foreign_dtype(dtype):
    array = np.zeros(4, dtype)
    rejected(lambda: qemu_q.pack(array), array, error=TypeError, names=("array", str(np.dtype(dtype))))


def test_pack_and_unpack_0d_and_empty():
    assert qemu_q.pack(np.array(3, ml_dtypes.int4)).tolist() == [3]
    assert qemu_q.pack(np.array(-1, ml_dtypes.int2)).tolist() == [3]
    assert qemu_q.pack(np.zeros((3, 0), ml_dtypes.int4)).tolist() == []
    y = qemu_q.unpack(b"", "float4e2m1", (3, 0))
    assert y.shape == (3, 0) and y.dtype == ml_dtypes.float4_e2m1fn
    y = qemu_q.unpack(b"\x0b", "int4", ())
    assert y.shape == () and int(y) == -5


# --- 0-d, zero-size, foreign dtypes ------------------------------------------------------


def test_zero_d_quantize_and_dequantize():
    y = ql(np.array(2.5, F32), np.array(1.0, F32), np.array(10, np.uint8))
    assert y.shape == () and y.dtype == np.uint8 and int(y) == 12  # 2.5 -> 2 (half to even)
    y = dql(np.array(-3, np.int8), np.array(0.5, F32), np.array(1, np.int8))
    assert y.shape == () and y.view(np.uint32) == np.float32(-2.0).view(np.uint32)
    y, scale, zp = qemu_q.dynamic_quantize_linear(np.array(3.0, F32))
    assert y.shape == () and int(y) == 255 and int(zp) == 0
    assert scale.view(np.uint32) == (F32(3.0) / F32(255.0)).view(np.uint32)


@pytest.mark.parametrize("shape, axis, scale_shape", [
    ((0,), 0, ()), ((3, 0, 5), 1, (0,)), ((3, 0, 5), 2, (5,)), ((0, 7), 1, (7,)), ((2, 0), 0, (2,)),
])
def test_zero_size_x(shape, axis, scale_shape):
    x = np.zeros(shape, F32)
    y = ql(x, np.ones(scale_shape, F32), axis=axis)
    assert y.shape == shape and y.dtype == np.uint8
    y = dql(np.zeros(shape, np.int8), np.ones(scale_shape, F32), axis=axis)
    assert y.shape == shape and y.dtype == np.float32
    y = ql(x, np.ones(scale_shape, F32), axis=axis, output_dtype="int4", packed=True)
    assert y.shape == (0,)


def test_zero_size_blocked():
    # D = 0 along a blocked axis: an empty result or a clear error, never a crash.
    x = np.zeros((2, 0), F32)
    try:
        y = ql(x, np.ones((2, 0), F32), axis=1, block_size=1)
    except ValueError as error:
        assert "block_size" in str(error)
    else:
        assert y.shape == (2, 0)


def test_dynamic_quantize_of_an_empty_x():
    y, scale, zp = qemu_q.dynamic_quantize_linear(np.zeros((0, 3), F32))
    assert y.shape == (0, 3) and y.dtype == np.uint8
    assert scale.dtype == F32 and zp.dtype == np.uint8


FOREIGN = [object, np.complex64, np.complex128, np.bool_, "datetime64[s]", "timedelta64[ms]", "U2", "S2",
           [("a", np.int8), ("b", np.float32)], np.int64, np.uint32]


@pytest.mark.parametrize("dtype", FOREIGN, ids=lambda d: str(np.dtype(d)))
def test_foreign_dtype_of_x(dtype):
    x = np.zeros((2, 3), dtype)
    for call, name in [(lambda: ql(x, F32(1)), "x"), (lambda: dql(x, F32(1)), "x"),
                       (lambda: qemu_q.dynamic_quantize_linear(x), "x")]:
        rejected(call, x, error=TypeError, names=(name, str(x.dtype)))


@pytest.mark.parametrize("dtype", FOREIGN, ids=lambda d: str(np.dtype(d)))
def test_foreign_dtype_of_the_scale_and_zero_point(dtype):
    x = np.zeros((2, 3), F32)
    odd = np.zeros((), dtype)
    rejected(lambda: ql(x, odd), x, odd, error=TypeError, names=("y_scale", str(odd.dtype)))
    rejected(lambda: ql(x, F32(1), odd), x, odd, error=TypeError, names=("y_zero_point", str(odd.dtype)))
    codes = np.zeros((2, 3), np.int8)
    rejected(lambda: dql(codes, odd), codes, odd, error=TypeError, names=("x_scale", str(odd.dtype)))


# =======================================================================================
# The generator: a few thousand hostile calls in one child process


@pytest.mark.parametrize("seed", [20240901, 7])
def test_generated_hostile_calls(seed, package_home):
    # tests/hostile_calls.py: each call returns or raises TypeError / ValueError with a
    # message that is not a bare numpy/Cython one, modifies no input, and an argument that
    # is invalid whatever the others are (n_threads > MAX_THREADS, opset 21.0, block_size
    # 2**63...) is never accepted. A crash shows as a signal exit naming the last call.
    outcome = run_python(
        "import json, hostile_calls\n"
        f"print(json.dumps(hostile_calls.main({seed}, 4000)))\n",
        package_home, preexec_fn=_limited_memory, timeout=240)
    assert outcome.ok, outcome.describe()
    report = last_json_line(outcome)
    groups = {}
    for kind, detail, call in report["violations"]:
        key = (kind, detail[:70])
        groups.setdefault(key, []).append(call)
    lines = [f"{len(calls)} x {kind}: {detail} -- e.g. {calls[0][:200]}" for (kind, detail), calls in
             sorted(groups.items(), key=lambda item: -len(item[1]))]
    assert not lines, f"{len(report['violations'])} violations in {sum(report['counts'].values())} calls " \
                      f"({report['counts']}):\n" + "\n".join(lines[:40])
