"""Time qemu_q's kernels in two source trees built in place, for before/after records.

    python benchmarks/compare_builds.py OLD_TREE NEW_TREE [--rounds 3] [--repeat 15]

Each tree is imported in its own process (the two builds share module names); the
processes alternate, round after round, so that load from elsewhere hits both alike, and
each case keeps its best time over all rounds. Only public API calls with out= are timed,
so any two versions with the same API compare. The cases are the 4096x4096 float32 ones
of benchmarks/run.py at 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import ml_dtypes, numpy as np, qemu_q
repeat, threads = int(sys.argv[2]), int(sys.argv[3])
rows = cols = 4096
rng = np.random.default_rng(0)
x = rng.standard_normal((rows, cols)).astype(np.float32)
x16 = x.astype(np.float16)
s = np.float32(0.02)
s_axis = rng.uniform(0.01, 0.03, cols).astype(np.float32)
s_block = rng.uniform(0.01, 0.03, (rows, cols // 32)).astype(np.float32)
codes8 = rng.integers(-128, 128, (rows, cols)).astype(np.int8)
codes_f8 = rng.integers(0, 256, (rows, cols)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
codes_f8 = np.where(np.isnan(codes_f8.astype(np.float32)), 0, codes_f8).astype(ml_dtypes.float8_e4m3fn)
int4 = qemu_q.quantize_linear(x, s_block, axis=1, block_size=32, output_dtype="int4")
raw4 = qemu_q.pack(int4)
out8 = np.empty((rows, cols), np.int8)
out_f8 = np.empty((rows, cols), ml_dtypes.float8_e4m3fn)
out4 = np.empty(raw4.size, np.uint8)
outf = np.empty((rows, cols), np.float32)
zp = np.int8(3)
cases = {
    "q_int8_tensor": lambda: qemu_q.quantize_linear(x, s, zp, out=out8, n_threads=threads),
    "q_int8_axis_last": lambda: qemu_q.quantize_linear(x, s_axis, np.zeros(cols, np.int8), axis=1, out=out8, n_threads=threads),
    "q_f16_int8_tensor": lambda: qemu_q.quantize_linear(x16, np.float16(0.02), zp, out=out8, n_threads=threads),
    "q_f8e4m3fn_tensor": lambda: qemu_q.quantize_linear(x, s, output_dtype="float8e4m3fn", out=out_f8, n_threads=threads),
    "q_int4_block32_packed": lambda: qemu_q.quantize_linear(x, s_block, axis=1, block_size=32, output_dtype="int4", packed=True, out=out4, n_threads=threads),
    "dq_int8_tensor": lambda: qemu_q.dequantize_linear(codes8, s, zp, out=outf, n_threads=threads),
    "dq_int8_axis_last": lambda: qemu_q.dequantize_linear(codes8, s_axis, np.zeros(cols, np.int8), axis=1, out=outf, n_threads=threads),
    "dq_f8e4m3fn_tensor": lambda: qemu_q.dequantize_linear(codes_f8, s, out=outf, n_threads=threads),
    "dq_int4_block32_packed": lambda: qemu_q.dequantize_linear(raw4, s_block, axis=1, block_size=32, packed=True, dtype="int4", shape=(rows, cols), out=outf, n_threads=threads),
}
best = {}
for name, fn in cases.items():
    fn()
    times = []
    for _ in range(repeat):
        time.sleep(0.02)
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    best[name] = min(times)
print(json.dumps(best))
"""


def run(tree: str, repeat: int, threads: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(tree), str(repeat), str(threads)],
                          capture_output=True, text=True, cwd=os.path.abspath(tree), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    best = {"old": {}, "new": {}}
    for _ in range(args.rounds):
        for side in ("old", "new"):
            for name, t in run(getattr(args, side), args.repeat, args.threads).items():
                best[side][name] = min(t, best[side].get(name, float("inf")))
    print(f"{'case':28s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}")
    for name in best["old"]:
        old, new = best["old"][name] * 1e3, best["new"][name] * 1e3
        print(f"{name:28s} {old:9.3f} {new:9.3f} {new / old:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
