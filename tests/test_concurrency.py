"""Calls from several Python threads at once give the bits of the same calls made one at a
time: the kernels release the GIL, so two calls can run their OpenMP teams side by side,
and the Python layer's reused state (per-thread scratch arrays for parameter conversions,
the cached plans) must not leak from one call into another.

Each call's expected bits are its serial result in this process (the other tests check
those bits against oracles); here only interference between concurrent calls can fail."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

import qemu_q


def _calls():
    rng = np.random.default_rng(41)
    n = 1 << 16
    calls = []
    for k in range(2):
        x = (rng.standard_normal((64, n // 64)) * 10).astype(np.float32)
        scales = rng.uniform(0.05, 2, x.shape[1]).astype(np.float32)
        zero_points = rng.integers(-10, 10, x.shape[1]).astype(np.int8)
        block_scales = rng.uniform(0.05, 2, (64, x.shape[1] // 32)).astype(np.float32)
        words = rng.integers(0, 1 << 32, x.shape, dtype=np.uint64).astype(np.uint32)
        codes = rng.integers(-128, 128, x.shape).astype(np.int8)
        a = rng.integers(-128, 128, (96, 200)).astype(np.int8)
        b = rng.integers(-128, 128, (200, 150)).astype(np.int8)
        b_scale = np.float32((0.1, 0.07)[k])
        acc = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
        stochastic = qemu_q.Datapath(rounding="stochastic")
        calls += [
            (f"quantize per axis {k}",
             lambda t, x=x, s=scales, z=zero_points: qemu_q.quantize_linear(x, s, z, axis=1, n_threads=t)),
            (f"quantize blocked, float64 quotient {k}",
             lambda t, x=x, s=block_scales: qemu_q.quantize_linear(
                 x, s, None, output_dtype="float8e4m3fn", axis=1, block_size=32, n_threads=t,
                 datapath=qemu_q.Datapath(scale_precision="float64"))),
            (f"quantize stochastic {k}",
             lambda t, x=x, s=scales, z=zero_points, w=words: qemu_q.quantize_linear(
                 x, s, z, axis=1, n_threads=t, datapath=stochastic, random_bits=w)),
            (f"dequantize per axis into bfloat16, stochastic {k}",
             lambda t, c=codes, s=scales, z=zero_points, w=words: qemu_q.dequantize_linear(
                 c, s, z, axis=1, output_dtype="bfloat16", n_threads=t, datapath=stochastic, random_bits=w)),
            (f"cast {k}", lambda t, x=x: qemu_q.cast(x, "float8e5m2", n_threads=t)),
            (f"mx_quantize {k}", lambda t, x=x: qemu_q.mx_quantize(x, "float4e2m1", n_threads=t)),
            (f"nvfp4_quantize {k}", lambda t, x=x: qemu_q.nvfp4_quantize(x, n_threads=t)),
            (f"qlinear_matmul {k}",
             lambda t, a=a, b=b, s=b_scale: qemu_q.qlinear_matmul(
                 a, np.float32(0.02), np.int8(1), b, s, np.int8(-2), np.float32(3.0), np.int8(0),
                 requantization="float32", n_threads=t)),
            (f"requantize {k}",
             lambda t, acc=acc, k=k: qemu_q.requantize(acc, 1518500250 - k, (36, -5)[k],
                                                      scheme=("tosa32", "gemmlowp")[k], n_threads=t)),
            (f"dynamic_quantize_linear {k}", lambda t, x=x: qemu_q.dynamic_quantize_linear(x)),
        ]
    return calls


def _digest(result) -> str:
    h = hashlib.sha256()
    for array in result if isinstance(result, tuple) else (result,):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("python_threads", [2, 4])
def test_concurrent_calls_give_the_serial_bits(python_threads):
    calls = _calls()
    expected = {name: _digest(fn(1)) for name, fn in calls}
    wrong, errors = [], []
    start = threading.Barrier(python_threads)

    def worker(seed):
        rng = np.random.default_rng(seed)
        start.wait()
        try:
            for step in range(3 * len(calls)):
                name, fn = calls[int(rng.integers(len(calls)))]
                threads = int(rng.integers(1, 3))
                if _digest(fn(threads)) != expected[name]:
                    wrong.append(f"{name} (n_threads={threads}, Python thread {seed}, step {step})")
        except Exception as error:  # reported below, with the thread that raised it
            errors.append(f"Python thread {seed}: {type(error).__name__}: {error}")

    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(python_threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in workers), "a Python thread did not finish in 300 s"
    assert not errors, errors
    assert not wrong, f"{len(wrong)} concurrent calls gave other bits than serially: {wrong[:10]}"
