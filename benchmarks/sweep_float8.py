"""Sweep every float32 bit pattern through qemu_q.quantize_linear into the float8 formats.

For each format (float8e4m3fn, float8e4m3fnuz, float8e5m2, float8e5m2fnuz) and each
saturate value (0, 1), all 2^32 float32 bit patterns x are quantized with a float32 scale of
1.0 at opset 28 (no zero point) and compared bit-for-bit with an independent oracle.

With scale 1.0 the float32 quotient x / 1.0 is x itself (NaN stays NaN), so the expected
result is the float32 -> float8 conversion of docs/semantics.md ("QuantizeLinear into small
floats"). The oracle below computes it with integer operations on the float32 bits, written
from the format definitions (it does not use ml_dtypes' conversions or onnx.reference); it
is checked against tests/float_oracle.py (exact Fraction arithmetic) on a sample before the
sweep starts.

This is not part of CI: a full run takes a while. Examples:

    python benchmarks/sweep_float8.py                       # everything
    python benchmarks/sweep_float8.py --limit 16            # 16 chunks spread over the range
    python benchmarks/sweep_float8.py --formats float8e5m2 --chunk-bits 22
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # float_oracle
sys.path.insert(0, ROOT)  # qemu_q built in place


@dataclass(frozen=True)
class Float8:
    name: str  # ONNX output_dtype name
    oracle_name: str  # tests/float_oracle.py name
    exp_bits: int
    man_bits: int
    bias: int
    fnuz: bool  # no -0, single NaN 0x80, no inf
    has_inf: bool  # IEEE-style: exponent all ones is inf/NaN (e5m2)
    max_code: int  # positive code of the largest finite value

    @property
    def nan_code(self) -> int:
        return 0x80 if self.fnuz else 0x7F

    def overflow_codes(self, saturate: bool) -> tuple[int, int]:
        """(code for positive, code for negative) overflow and +-inf."""
        if saturate:
            return self.max_code, 0x80 | self.max_code
        if self.has_inf:
            return 0x7C, 0xFC
        return self.nan_code, self.nan_code


FORMATS = {
    f.name: f
    for f in (
        # e4m3fn: S.1111.111 is NaN, so the largest finite is S.1111.110 = 448.
        Float8("float8e4m3fn", "float8_e4m3fn", 4, 3, 7, False, False, 0x7E),
        # fnuz: 0x80 is the NaN; 0x7F is finite (240 / 57344).
        Float8("float8e4m3fnuz", "float8_e4m3fnuz", 4, 3, 8, True, False, 0x7F),
        # e5m2: IEEE-like, exponent 11111 is inf / NaN, largest finite 0x7B = 57344.
        Float8("float8e5m2", "float8_e5m2", 5, 2, 15, False, True, 0x7B),
        Float8("float8e5m2fnuz", "float8_e5m2fnuz", 5, 2, 16, True, False, 0x7F),
    )
}


class Oracle:
    """float32 bits -> float8 codes, vectorized over uint32 arrays.

    A finite float32 is S * 2^(e - 23) with the 24-bit significand S (hidden bit included;
    for float32 subnormals S = mantissa and e = -126). The target keeps `m` fraction bits
    at exponent max(e, emin), emin = 1 - bias, so S is shifted right by
    `23 - m + max(0, emin - e)` bits and rounded to nearest, ties to even. The code of the
    rounded significand r is `(max(e + bias - 1, 0) << m) + r`: in the normal range r has its
    hidden bit 2^m, which adds the missing 1 to the exponent field, and a carry out of the
    mantissa (r = 2^(m+1)) moves to the next binade by itself; in the subnormal range the
    code is r (r = 2^m is the smallest normal, exponent field 1). Overflow is decided on the
    rounded code: anything above max_code.
    """

    def __init__(self, fmt: Float8, n: int):
        self.fmt = fmt
        self.n = n
        self._a = np.empty(n, np.int64)
        self._b = np.empty(n, np.int64)
        self._c = np.empty(n, np.int64)
        self._mask = np.empty(n, bool)
        self._mask2 = np.empty(n, bool)

    def base(self, u: np.ndarray):
        """Rounded magnitude codes (int64, possibly beyond max_code), sign, special masks.

        Returns (mag, negative, nan, overflow_or_inf); mag is only meaningful where neither
        nan nor overflow_or_inf holds.
        """
        f = self.fmt
        m, bias = f.man_bits, f.bias
        n = u.size
        a, b, c = self._a[:n], self._b[:n], self._c[:n]
        np.bitwise_and(u, 0x7FFFFFFF, out=a)  # |x| bits
        nan = a > 0x7F800000
        inf = a == 0x7F800000
        negative = u >= 0x80000000
        # Exponent field E and significand S.
        np.right_shift(a, 23, out=b)  # E
        np.bitwise_and(a, 0x7FFFFF, out=a)  # mantissa
        is_normal = self._mask[:n]
        np.not_equal(b, 0, out=is_normal)
        a[is_normal] |= 1 << 23  # S
        # e = E - 127 (E = 0: e = -126). Work with t = e + bias - 1 (the exponent field minus
        # one); the right shift is 23 - m + max(0, -t).
        np.maximum(b, 1, out=b)
        b += bias - 1 - 127  # t
        np.negative(b, out=c)
        np.maximum(c, 0, out=c)
        c += 23 - m  # shift >= 20
        np.minimum(c, 40, out=c)  # S < 2^24: any shift >= 25 already gives 0 (no tie)
        # r = RNE(S / 2^shift)
        half = np.left_shift(1, c - 1)
        rem = np.bitwise_and(a, (half << 1) - 1)
        np.right_shift(a, c, out=a)  # floor
        up = self._mask2[:n]
        np.greater(rem, half, out=up)
        tie = rem == half
        tie &= (a & 1) == 1
        up |= tie
        a += up
        # code = (max(t, 0) << m) + r
        np.maximum(b, 0, out=b)
        np.left_shift(b, m, out=b)
        a += b
        overflow = a > f.max_code
        overflow |= inf
        return a, negative, nan, overflow

    def encode(self, u: np.ndarray, saturate: bool, base=None) -> np.ndarray:
        f = self.fmt
        mag, negative, nan, overflow = self.base(u) if base is None else base
        out = np.where(negative, mag | 0x80, mag)
        if f.fnuz:
            out[mag == 0] = 0  # no -0: -0 and negative values rounding to zero give +0
        pos, neg = f.overflow_codes(saturate)
        out[overflow & ~negative] = pos
        out[overflow & negative] = neg
        if not saturate and not f.fnuz and not f.has_inf:
            # e4m3fn, Cast-19..28 saturate=0: "-Inf -> -NaN" (a finite negative overflow
            # is "[x] < -FLT_MAX -> NaN": 0x7F).
            out[(u == 0xFF800000)] = 0xFF
        out[nan] = f.nan_code
        if not f.fnuz:
            out[nan & negative] = 0xFF  # "-NaN -> -NaN" (docs/semantics.md)
        return out.astype(np.uint8)


def validate_oracle(n_random: int = 1 << 18, seed: int = 0) -> None:
    """Compare the bit oracle with tests/float_oracle.py (exact arithmetic) on a sample:
    random bit patterns, every float32 near each float8 value and midpoint, specials."""
    import float_oracle

    rng = np.random.default_rng(seed)
    for f in FORMATS.values():
        ofmt = float_oracle.FORMATS[f.oracle_name]
        pieces = [rng.integers(0, 1 << 32, n_random, dtype=np.uint64).astype(np.uint32)]
        # Random patterns mostly have huge or tiny exponents: also draw the float8 range.
        mags = rng.integers(0x30000000, 0x48000000, n_random, dtype=np.uint32)
        pieces.append(mags | (rng.integers(0, 2, n_random, dtype=np.uint32) << 31))
        values, _ = float_oracle.positive_values(ofmt)
        points = [float(v) for v in values] + [float(v) for v in float_oracle.midpoints(ofmt)]
        centres = np.array(points, np.float32).view(np.uint32).astype(np.int64)
        offsets = np.arange(-3, 4, dtype=np.int64)
        near = (centres[:, None] + offsets[None, :]).reshape(-1)
        near = near[(near >= 0) & (near < 0x7F800000)].astype(np.uint32)
        pieces += [near, near | np.uint32(0x80000000)]
        specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                             0x7F800001, 0xFFFFFFFF, 1, 0x80000001, 0x007FFFFF, 0x00800000,
                             0x7F7FFFFF, 0xFF7FFFFF], np.uint32)
        pieces.append(specials)
        u = np.concatenate(pieces)
        oracle = Oracle(f, u.size)
        base = oracle.base(u)
        for saturate in (0, 1):
            got = oracle.encode(u, bool(saturate), base)
            want = float_oracle.encode_array(ofmt, u.view(np.float32), saturate)
            bad = np.flatnonzero(got != want)
            if bad.size:
                i = bad[0]
                raise SystemExit(
                    f"bit oracle disagrees with tests/float_oracle.py for {f.name} saturate="
                    f"{saturate}: x bits {u[i]:#010x} ({u.view(np.float32)[i]!r}) -> "
                    f"{got[i]:#04x}, float_oracle {want[i]:#04x} ({bad.size} of {u.size})"
                )
        # Exact scalar encoder on a few hundred of them, for good measure.
        idx = rng.choice(u.size, 300, replace=False)
        for saturate in (0, 1):
            got = oracle.encode(u[idx], bool(saturate))
            for k, i in enumerate(idx):
                want = float_oracle.encode(ofmt, float(u.view(np.float32)[i]), saturate)
                if got[k] != want:
                    raise SystemExit(f"bit oracle vs float_oracle.encode: {f.name} {u[i]:#010x}")
    print("oracle check: bit oracle agrees with tests/float_oracle.py on the sample", flush=True)


def chunk_starts(chunk_bits: int, limit: int | None) -> list[int]:
    n_chunks = 1 << (32 - chunk_bits)
    if limit is None or limit >= n_chunks:
        return [k << chunk_bits for k in range(n_chunks)]
    # Spread the chunks evenly over the range (first and last included), so a quick run sees
    # both signs and every exponent region.
    if limit == 1:
        ks = [0]
    else:
        ks = sorted({round(j * (n_chunks - 1) / (limit - 1)) for j in range(limit)})
    return [k << chunk_bits for k in ks]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    import ml_dtypes
    import qemu_q

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="comma-separated subset of " + ", ".join(FORMATS))
    parser.add_argument("--saturate", default="0,1", help="comma-separated saturate values")
    parser.add_argument("--chunk-bits", type=int, default=24,
                        help="log2 of the chunk size (default 24: 2^24 patterns per call)")
    parser.add_argument("--limit", type=int, default=None,
                        help="run only this many chunks, spread evenly over the 2^32 range")
    parser.add_argument("--threads", type=int, default=None, help="qemu_q n_threads")
    parser.add_argument("--show", type=int, default=10, help="mismatches to list per run")
    parser.add_argument("--skip-oracle-check", action="store_true")
    args = parser.parse_args(argv)

    names = [s.strip() for s in args.formats.split(",") if s.strip()]
    for name in names:
        if name not in FORMATS:
            parser.error(f"unknown format {name!r}; choose from {', '.join(FORMATS)}")
    saturates = [int(s) for s in args.saturate.split(",")]
    if not 8 <= args.chunk_bits <= 32:
        parser.error("--chunk-bits must be in [8, 32]")
    starts = chunk_starts(args.chunk_bits, args.limit)
    size = 1 << args.chunk_bits
    total = len(starts) * size

    print(f"qemu_q {qemu_q.__version__}, numpy {np.__version__}, ml_dtypes "
          f"{ml_dtypes.__version__}, python {platform.python_version()}")
    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}; qemu_q threads "
          f"{args.threads or qemu_q.get_num_threads()}, OpenMP {qemu_q.openmp_enabled()}")
    print(f"chunks: {len(starts)} x 2^{args.chunk_bits} = {total} patterns "
          f"({'all' if total == 1 << 32 else 'subset'} of 2^32) per format and saturate",
          flush=True)
    if not args.skip_oracle_check:
        validate_oracle()

    scale = np.array(1.0, np.float32)
    ulimit = np.arange(size, dtype=np.uint32)
    failures = 0
    summary = []
    for name in names:
        fmt = FORMATS[name]
        dtype = getattr(ml_dtypes, fmt.oracle_name)
        oracle = Oracle(fmt, size)
        outs = {s: np.empty(size, dtype=dtype) for s in saturates}
        mismatches = {s: 0 for s in saturates}
        shown = {s: [] for s in saturates}
        t_lib = {s: 0.0 for s in saturates}
        t_oracle = 0.0
        t0 = time.perf_counter()
        for k, start in enumerate(starts):
            u = ulimit + np.uint32(start)
            x = u.view(np.float32)
            t = time.perf_counter()
            base = oracle.base(u)
            wants = {s: oracle.encode(u, bool(s), base) for s in saturates}
            t_oracle += time.perf_counter() - t
            for s in saturates:
                t = time.perf_counter()
                qemu_q.quantize_linear(x, scale, output_dtype=name, saturate=s, opset=28,
                                       out=outs[s], n_threads=args.threads)
                t_lib[s] += time.perf_counter() - t
                got = outs[s].view(np.uint8)
                bad = np.flatnonzero(got != wants[s])
                if bad.size:
                    mismatches[s] += int(bad.size)
                    for i in bad[: max(0, args.show - len(shown[s]))]:
                        shown[s].append((int(u[i]), int(got[i]), int(wants[s][i])))
            if (k + 1) % 32 == 0 or k + 1 == len(starts):
                print(f"  {name}: {k + 1}/{len(starts)} chunks, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
        elapsed = time.perf_counter() - t0
        n_chunk_patterns = len(starts) * size
        for s in saturates:
            rate = n_chunk_patterns / t_lib[s] / 1e6
            print(f"{name} saturate={s}: {n_chunk_patterns} patterns, qemu_q {t_lib[s]:.1f} s "
                  f"({rate:.0f} M/s), mismatches {mismatches[s]}")
            for ub, g, w in shown[s]:
                xv = np.array([ub], np.uint32).view(np.float32)[0]
                print(f"    x bits {ub:#010x} ({xv!r}): qemu_q {g:#04x}, oracle {w:#04x}")
            failures += mismatches[s]
            summary.append((name, s, t_lib[s], rate, mismatches[s]))
        print(f"{name}: elapsed {elapsed:.1f} s (oracle {t_oracle:.1f} s)", flush=True)

    print("\nsummary: format, saturate, qemu_q seconds, M patterns/s, mismatches")
    for name, s, secs, rate, bad in summary:
        print(f"  {name:15s} {s}  {secs:8.1f}  {rate:6.0f}  {bad}")
    print("RESULT:", "all bits agree" if failures == 0 else f"{failures} mismatches")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
