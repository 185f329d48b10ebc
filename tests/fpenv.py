"""The calling thread's floating-point environment, from Python, and the kernel calls whose
bits must not depend on it (tests/test_environment.py).

Two controls, both per thread:
- MXCSR, the SSE control/status register: FTZ (bit 15, flush results to zero), DAZ (bit 6,
  read subnormal inputs as zero) and the rounding control (bits 13-14). What
  torch.set_flush_denormal(True) or a library built with -ffast-math sets. Python cannot
  reach it, so a few lines of C (_mm_getcsr / _mm_setcsr) are compiled into a shared
  object at test time and loaded with ctypes (x86-64 only; needs a C compiler).
- the C rounding mode, fegetround / fesetround from libm (on x86-64 glibc fesetround sets
  the x87 and the SSE rounding control together).

`run_scenario` is what a child process runs (one FP mode, one scenario): it computes every
case's bits in the default environment first, sets the mode on the calling thread, calls
the library with 1 and 2 threads, restores the mode, and reports as JSON.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig

import numpy as np

FTZ = 1 << 15
DAZ = 1 << 6
RC_SHIFT = 13
RC_MASK = 3 << RC_SHIFT
RC_DOWN, RC_UP, RC_ZERO = 1 << RC_SHIFT, 2 << RC_SHIFT, 3 << RC_SHIFT
# The control bits of MXCSR (DAZ, the exception masks, RC, FTZ); bits 0-5 are sticky status
# flags that any arithmetic may raise, not part of the mode.
CONTROL_MASK = 0xFFC0

# x86-64 glibc <fenv.h>
FE_TONEAREST, FE_DOWNWARD, FE_UPWARD, FE_TOWARDZERO = 0, 0x400, 0x800, 0xC00

_MXCSR_SOURCE = r"""
#include <xmmintrin.h>
unsigned int qemu_q_test_getcsr(void) { return _mm_getcsr(); }
void qemu_q_test_setcsr(unsigned int value) { _mm_setcsr(value); }
"""

# name -> (MXCSR bits to set: (or-bits, rounding-control bits) or None, fesetround value or None)
MODES = {
    "ftz": ((FTZ, None), None),
    "daz": ((DAZ, None), None),
    "ftz_daz": ((FTZ | DAZ, None), None),
    "mxcsr_round_down": ((0, RC_DOWN), None),
    "mxcsr_round_up": ((0, RC_UP), None),
    "mxcsr_round_zero": ((0, RC_ZERO), None),
    "ftz_daz_round_up": ((FTZ | DAZ, RC_UP), None),
    "fesetround_downward": (None, FE_DOWNWARD),
    "fesetround_upward": (None, FE_UPWARD),
    "fesetround_towardzero": (None, FE_TOWARDZERO),
}


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def build_mxcsr_library(directory) -> tuple[str | None, str]:
    """Compile the MXCSR helper into `directory`: (path, "") or (None, why not)."""
    if not is_x86_64():
        return None, f"MXCSR exists on x86-64 only; this machine is {platform.machine()}"
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not compiler or shutil.which(compiler[0]) is None:
        for fallback in ("cc", "gcc", "clang"):
            if shutil.which(fallback):
                compiler = [fallback]
                break
        else:
            return None, "no C compiler found (CC, sysconfig CC, cc, gcc, clang) to build the MXCSR helper"
    source = os.path.join(str(directory), "mxcsr.c")
    library = os.path.join(str(directory), "libmxcsr.so")
    with open(source, "w") as handle:
        handle.write(_MXCSR_SOURCE)
    done = subprocess.run([*compiler, "-shared", "-fPIC", "-O1", "-o", library, source],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"the C compiler {compiler[0]} failed on the MXCSR helper: {done.stderr.strip()[:300]}"
    return library, ""


class FPControl:
    """The calling thread's MXCSR (when the helper library is given) and C rounding mode."""

    def __init__(self, mxcsr_library: str | None):
        self.libm = ctypes.CDLL(ctypes.util.find_library("m"))
        self.libm.fegetround.restype = ctypes.c_int
        self.libm.fesetround.argtypes = [ctypes.c_int]
        self.libm.fesetround.restype = ctypes.c_int
        self.csr = None
        if mxcsr_library:
            self.csr = ctypes.CDLL(mxcsr_library)
            self.csr.qemu_q_test_getcsr.restype = ctypes.c_uint
            self.csr.qemu_q_test_setcsr.argtypes = [ctypes.c_uint]

    def get_csr(self) -> int | None:
        return None if self.csr is None else int(self.csr.qemu_q_test_getcsr())

    def set_csr(self, value: int) -> None:
        self.csr.qemu_q_test_setcsr(value)

    def state(self) -> tuple:
        """(MXCSR control bits or None, fegetround())."""
        csr = self.get_csr()
        return (None if csr is None else csr & CONTROL_MASK, int(self.libm.fegetround()))

    def apply(self, mode: str):
        """Set `mode` on this thread; returns a function that restores what was there."""
        saved_csr, saved_round = self.get_csr(), int(self.libm.fegetround())
        csr_bits, round_mode = MODES[mode]
        if round_mode is not None:
            if self.libm.fesetround(round_mode) != 0:
                raise OSError(f"fesetround({round_mode:#x}) failed")
        if csr_bits is not None:
            if self.csr is None:
                raise RuntimeError(f"mode {mode} needs the MXCSR helper library")
            or_bits, rounding = csr_bits
            value = self.get_csr() | or_bits
            if rounding is not None:
                value = (value & ~RC_MASK) | rounding
            self.set_csr(value)

        def restore():
            if saved_csr is not None:
                self.set_csr(saved_csr)
            self.libm.fesetround(saved_round)

        return restore


# ---------------------------------------------------------------------------------------
# The calls. Each case: name, fn(n_threads) -> tuple of arrays, and an exact oracle for
# some (computed from the definition with Python ints / float64 products that are exact,
# in the default environment). Every input has >= 2**16 elements so that 2 threads run.

N = (1 << 17) + 5


def _half_even(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """round(numerator / denominator) half to even, in integers (exact)."""
    numerator = numerator.astype(np.int64)
    q, r = np.divmod(numerator, denominator)
    twice = 2 * r
    up = (twice > denominator) | ((twice == denominator) & (q % 2 == 1))
    return q + up


def _signed_bits(magnitude: np.ndarray, negative: np.ndarray, sign_bit: int, dtype) -> np.ndarray:
    return (magnitude.astype(np.uint64) | (negative.astype(np.uint64) << sign_bit)).astype(dtype)


def build_cases(seed: int = 9):
    import ml_dtypes

    import qemu_q

    ql, dql = qemu_q.quantize_linear, qemu_q.dequantize_linear
    rng = np.random.default_rng(seed)
    f32, f16, bf16 = np.float32, np.float16, ml_dtypes.bfloat16
    cases = []

    # Every input is made here, in the default environment: a conversion made under the
    # mode (np.array(1 / 3, np.float32) rounds by it, a subnormal flushes under FTZ) would
    # change the caller's data, not qemu_q's arithmetic.
    def case(name, fn, oracle=None):
        cases.append((name, fn, oracle))

    # float32 subnormal x / subnormal scale 2**-148 -> n/2: subnormals and ties together.
    n = rng.integers(-60000, 60001, N)
    x = _signed_bits(np.abs(n), n < 0, 31, np.uint32).view(f32)
    s = np.array(2, np.uint32).view(f32)  # 2**-148
    case("quantize f32 subnormal x and scale, ties -> int16 (per-tensor)",
         lambda t, x=x, s=s: (ql(x, s, output_dtype="int16", n_threads=t),),
         (_half_even(n, 2).astype(np.int16),))

    # The example: float16 subnormals 2**-24 * m quantized with scale 2**-24 -> m.
    m = rng.integers(1, 1024, N)
    m[:3] = [1, 3, 16]
    negative = rng.random(N) < 0.5
    negative[:3] = False
    xh = _signed_bits(m, negative, 15, np.uint16).view(f16)
    signed_m = np.where(negative, -m, m)
    case("quantize f16 subnormal x, scale 2**-24 -> int16 (issue example [1, 3, 16])",
         lambda t, x=xh, s=np.array(2.0**-24, f16): (ql(x, s, output_dtype="int16", n_threads=t),),
         (signed_m.astype(np.int16),))
    case("quantize f16 subnormal x, subnormal scale 2**-23, ties -> int16",
         lambda t, x=xh, s=np.array(2.0**-23, f16): (ql(x, s, output_dtype="int16", n_threads=t),),
         (_half_even(signed_m, 2).astype(np.int16),))

    # bfloat16 subnormals 2**-133 * k, scale 2**-133 (-> k) and 2**-132 (-> k/2, ties).
    k = rng.integers(1, 128, N)
    negative_k = rng.random(N) < 0.5
    xb = _signed_bits(k, negative_k, 15, np.uint16).view(bf16)
    signed_k = np.where(negative_k, -k, k)
    scale_b1 = np.array(1, np.uint16).view(bf16).reshape(())
    scale_b2 = np.array(2, np.uint16).view(bf16).reshape(())
    case("quantize bf16 subnormal x and scale -> int8",
         lambda t, x=xb, s=scale_b1: (ql(x, s, output_dtype="int8", n_threads=t),),
         (signed_k.astype(np.int8),))
    case("quantize bf16 subnormal x and scale, ties -> int8",
         lambda t, x=xb, s=scale_b2: (ql(x, s, output_dtype="int8", n_threads=t),),
         (_half_even(signed_k, 2).astype(np.int8),))

    # Per-axis ties: x = (j + 1/2) * scale exactly, scales powers of two, uint8 zero points.
    rows, cols = 2049, 64
    j = rng.integers(-200, 200, (rows, cols))
    exponents = rng.integers(-3, 4, cols)
    scale_axis = np.ldexp(1.0, exponents).astype(f32)
    zp_axis = rng.integers(0, 256, cols).astype(np.uint8)
    x_ties = ((2 * j + 1).astype(np.float64) / 2 * scale_axis).astype(f32)
    oracle = np.clip(_half_even(2 * j + 1, 2) + zp_axis.astype(np.int64), 0, 255).astype(np.uint8)
    case("quantize f32 ties -> uint8 (per-axis, zero points)",
         lambda t, x=x_ties, s=scale_axis, z=zp_axis: (ql(x, s, z, axis=1, n_threads=t),),
         (oracle,))

    # Blocked, inexact division (the quotient's rounding follows the rounding mode).
    xr = (rng.standard_normal((256, 520)) * 50).astype(f32)
    scale_blocks = rng.uniform(0.1, 1.0, (256, 13)).astype(f32)
    case("quantize f32 -> int8 (blocked, inexact quotients)",
         lambda t, x=xr, s=scale_blocks: (ql(x, s, axis=1, block_size=40, output_dtype="int8", n_threads=t),))

    # float8 outputs from float32 subnormal x (DAZ reads them as 0) with ties between codes.
    mag = np.exp2(rng.uniform(0, 23, N)).astype(np.int64).clip(1, (1 << 23) - 1)
    mag[::7] = (rng.integers(1, 1 << 13, mag[::7].size) << 10)  # quotients on halfway points
    xs = _signed_bits(mag, rng.random(N) < 0.5, 31, np.uint32).view(f32)
    case("quantize f32 subnormal x -> float8e4m3fn (scale 2**-135)",
         lambda t, x=xs, s=np.array(2.0**-135, f32): (ql(x, s, output_dtype="float8e4m3fn", n_threads=t),))
    xn = (rng.standard_normal(N) * 1000).astype(f32)
    case("quantize f32 -> float8e5m2 (scale 1/3, saturate=0)",
         lambda t, x=xn, s=np.array(1 / 3, f32): (ql(x, s, output_dtype="float8e5m2", saturate=0, n_threads=t),))

    # Packed outputs: int4 per-axis, float4 blocked with halfway values between codes.
    x4 = (rng.standard_normal((4097, 32)) * 4).astype(f32)
    s4 = rng.uniform(0.5, 2.0, 32).astype(f32)
    zp4 = rng.integers(-8, 8, 32).astype(ml_dtypes.int4)
    case("quantize f32 -> int4 packed=True (per-axis)",
         lambda t, x=x4, s=s4, z=zp4: (ql(x, s, z, axis=1, packed=True, n_threads=t),))
    halfway = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0], f32)
    xf4 = rng.choice(np.concatenate([halfway, -halfway, rng.uniform(-8, 8, 64).astype(f32)]), (2048, 66))
    sf4 = np.exp2(rng.integers(-1, 2, (2048, 3))).astype(f32)
    case("quantize f32 -> float4e2m1 packed=True (blocked, halfway values)",
         lambda t, x=xf4.astype(f32), s=sf4: (ql(x, s, axis=1, block_size=22, output_dtype="float4e2m1",
                                                packed=True, n_threads=t),))

    # Dequantize to float32: per-axis scales with subnormal and inexact products; oracle
    # (code - zp) * scale exact in float64, rounded once to float32.
    codes = rng.integers(-128, 128, (2049, 64)).astype(np.int8)
    scale_pool = np.array([2.0**-149, 3 * 2.0**-147, 2.0**-140, 1.5, 0.1, 1 / 3, 2.0**-126, 7 * 2.0**-149], f32)
    scale_dq = scale_pool[np.arange(64) % scale_pool.size]
    zp_dq = rng.integers(-128, 128, 64).astype(np.int8)
    exact = (codes.astype(np.float64) - zp_dq.astype(np.float64)) * scale_dq.astype(np.float64)
    case("dequantize int8 -> f32 (per-axis, subnormal scales and products)",
         lambda t, c=codes, s=scale_dq, z=zp_dq: (dql(c, s, z, axis=1, n_threads=t),),
         (exact.astype(f32),))
    codes16 = rng.integers(-32768, 32768, N).astype(np.int16)
    exact16 = (codes16.astype(np.float64) - 5) * np.float64(f32(1 / 3))
    case("dequantize int16 -> f32 (inexact products)",
         lambda t, c=codes16, s=np.array(1 / 3, f32): (dql(c, s, np.array(5, np.int16), n_threads=t),),
         (exact16.astype(f32),))
    scale_h = np.array([2.0**-24, 3 * 2.0**-24, 0.1, 1 / 3, 2.0**-14, 1000.0, 5 * 2.0**-20, 0.7], f16)
    case("dequantize int8 -> float16 (float16 scales, subnormal outputs)",
         lambda t, c=codes, s=scale_h[np.arange(64) % 8], z=zp_dq: (dql(c, s, z, axis=1, n_threads=t),))
    scale_bf = np.array([2.0**-133, 0.1, 1 / 3, 3.0], bf16)
    case("dequantize int8 -> bfloat16 (bfloat16 scales)",
         lambda t, c=codes, s=scale_bf[np.arange(64) % 4], z=zp_dq: (dql(c, s, z, axis=1, n_threads=t),))
    raw4 = rng.integers(0, 256, N // 2 + 1).astype(np.uint8)
    case("dequantize int4 packed input -> f32",
         lambda t, r=raw4, s=np.array(0.1, f32): (dql(r, s, np.array(3, ml_dtypes.int4), packed=True,
                                shape=(2 * r.size,), n_threads=t),))
    f8 = np.tile(np.arange(256, dtype=np.uint8), N // 256 + 1).view(ml_dtypes.float8_e4m3fn)
    case("dequantize float8e4m3fn -> f32 (scale 2**-140, subnormal outputs)",
         lambda t, c=f8, s=np.array(2.0**-140, f32): (dql(c, s, n_threads=t),))
    case("dequantize float8e4m3fn -> float16 (scale 2**-20)",
         lambda t, c=f8, s=np.array(2.0**-20, f16): (dql(c, s, n_threads=t),))

    # DynamicQuantizeLinear: the scale (max - min) / 255 and the zero point are computed in
    # float32 (inexact); a subnormal range gives a subnormal scale.
    xd = (rng.standard_normal(N) * 3.3 + 0.7).astype(f32)
    xd_sub = _signed_bits(rng.integers(1, 1 << 22, N), rng.random(N) < 0.4, 31, np.uint32).view(f32)

    def dynamic(x):
        def fn(t):
            qemu_q.set_num_threads(t)
            try:
                return tuple(qemu_q.dynamic_quantize_linear(x))
            finally:
                qemu_q.set_num_threads(None)
        return fn

    case("dynamic_quantize_linear f32", dynamic(xd))
    case("dynamic_quantize_linear f32 subnormal range", dynamic(xd_sub))

    # pack / unpack (no arithmetic, but every kernel family runs under the mode).
    i4 = rng.integers(-8, 8, N).astype(ml_dtypes.int4)
    case("pack int4", lambda t, a=i4: (qemu_q.pack(a, n_threads=t),))
    case("unpack float4e2m1", lambda t, r=raw4: (qemu_q.unpack(r, "float4e2m1", (2 * r.size,), n_threads=t),))

    # MX: blocks whose amax and elements are float32 subnormals or tiny normals (DAZ would
    # zero the amax, FTZ the quotients x / X, a rounding mode the encoders' magic-number
    # rounding), and MXINT8's dequantization through its 2**-133 smallest scale.
    mx_x = (rng.standard_normal(N) * np.exp2(rng.integers(-150, -100, N).astype(np.float64))).astype(f32)
    mx_x[:8] = np.array([0x00000001, 0x80000003, 0x00400000, 0x007FFFFF, 0, 0x80000000, 0x00800001, 5],
                        np.uint32).view(f32)
    for element, rule in (("float8e4m3fn", "floor"), ("float4e2m1", "rceil_f32"), ("int8", "even")):
        case(f"mx_quantize {element} {rule} subnormal blocks, packed",
             lambda t, x=mx_x, e=element, r=rule: qemu_q.mx_quantize(x, e, scale_rule=r, packed=True, n_threads=t))
    mx_codes = rng.integers(-127, 128, N).astype(np.int8)
    mx_scales = rng.integers(0, 8, -(-N // 32)).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    case("mx_dequantize MXINT8 with scales 2**-127 .. 2**-120",
         lambda t, c=mx_codes, sc=mx_scales: (qemu_q.mx_dequantize(c, sc, n_threads=t),))

    # Cast: float32 subnormals and tiny normals into the small floats, float16 and bfloat16
    # (DAZ zeroes the inputs, FTZ the float16 subnormals, a rounding mode moves the
    # encoders' rounding); float16 subnormals into float8e5m2.
    cx = (rng.standard_normal(N) * np.exp2(rng.integers(-150, -4, N).astype(np.float64))).astype(f32)
    cx[:6] = np.array([0x00000001, 0x80000003, 0x00400000, 0x007FFFFF, 0x33800001, 0xB3000000],
                      np.uint32).view(f32)
    for to in ("float8e4m3fn", "float8e5m2fnuz", "float8e4m3fnuz", "float16", "bfloat16", "float8e8m0"):
        case(f"cast f32 subnormal and tiny x -> {to}", lambda t, x=cx, to=to: (qemu_q.cast(x, to, n_threads=t),))
    cxh = (rng.standard_normal(N) * np.exp2(rng.integers(-26, -10, N).astype(np.float64))).astype(f16)
    case("cast f16 subnormal x -> float8e5m2", lambda t, x=cxh: (qemu_q.cast(x, "float8e5m2", n_threads=t),))

    # Datapath options (issue 15): the modes' integer and float routes, the flushes (done by
    # the kernels on the bits, never by MXCSR), float64 quotients, stochastic words.
    Datapath = qemu_q.Datapath
    words = rng.integers(0, 1 << 32, N, dtype=np.uint64).astype(np.uint32)
    tiny = np.array(3e-39, f32)  # a float32 subnormal scale
    qx = (rng.standard_normal(N) * 2e-37).astype(f32)
    qx[::5] = cx[::5]
    for name, dp, out in (
            ("half_away reciprocal float32", Datapath(rounding="half_away", scale="reciprocal",
                                                      scale_precision="float32"), "int8"),
            ("to_odd divide float64 flush_outputs", Datapath(rounding="to_odd", scale_precision="float64",
                                                             subnormals="flush_outputs"), "float8e4m3fn"),
            ("down reciprocal float64", Datapath(rounding="down", scale="reciprocal",
                                                 scale_precision="float64"), "int16"),
            ("half_even reciprocal float64 (the direct double loop)",
             Datapath(scale="reciprocal", scale_precision="float64"), "int8"),
            ("stochastic", Datapath(rounding="stochastic"), "float8e5m2"),
            ("stochastic flush_inputs nan_to_integer max", Datapath(rounding="stochastic", subnormals="flush_inputs",
                                                                  nan_to_integer="max"), "int8")):
        bits_given = words if dp.rounding == "stochastic" else None
        case(f"quantize f32 -> {out} under {name}, subnormal scale",
             lambda t, dp=dp, out=out, w=bits_given: (ql(qx, tiny, output_dtype=out, datapath=dp,
                                                         random_bits=w, n_threads=t),))
    # The float32 quotient's codes (nearest_<mode>_divide_one, a normal scale): its tie
    # check and its rounding add 1.5 * 2**23, which another rounding mode would move. A
    # quarter of x near the half-integers' products (pieces it hands to the fused loop),
    # the rest ordinary, with tiny and subnormal x (under DAZ: zeros) in its second half.
    s37 = f32(0.37)
    hx = (rng.standard_normal(N) * 30).astype(f32)
    hx[:N // 4] = ((np.arange(N // 4) % 600 - 300 + 0.5) * np.float64(s37)).astype(f32)
    hx[N // 2::7] = cx[N // 2::7]
    for rounding in ("half_even", "half_up"):
        case(f"quantize f32 -> int8 under {rounding} divide float64 (the float32 quotient's codes)",
             lambda t, dp=Datapath(rounding=rounding, scale_precision="float64"): (
                 ql(hx, s37, output_dtype="int8", datapath=dp, n_threads=t),))
    case("cast f32 -> float8e4m3fn stochastic flush_both",
         lambda t: (qemu_q.cast(cx, "float8e4m3fn", datapath=Datapath(rounding="stochastic", subnormals="flush_both"),
                                random_bits=words, n_threads=t),))
    dq_codes = rng.integers(-128, 128, N).astype(np.int8)
    case("dequantize int8 -> f32 stochastic, subnormal scale",
         lambda t: (dql(dq_codes, tiny, np.array(3, np.int8), datapath=Datapath(rounding="stochastic"),
                        random_bits=words, n_threads=t),))
    case("dequantize int8 -> bfloat16 half_down flush_outputs, subnormal scale",
         lambda t: (dql(dq_codes, tiny, output_dtype="bfloat16",
                        datapath=Datapath(rounding="half_down", subnormals="flush_outputs"), n_threads=t),))
    # Into float16 / bfloat16 from float32 products (8-bit codes, half-format scales: Cast's
    # half loops of the mode round the products), results in the formats' subnormals.
    case("dequantize int8 -> float16 stochastic flush_outputs, subnormal float16 scale",
         lambda t, s=np.array(3 * 2.0**-18, f16): (dql(
             dq_codes, s, np.array(3, np.int8), datapath=Datapath(rounding="stochastic", subnormals="flush_outputs"),
             random_bits=words, n_threads=t),))
    case("dequantize uint8 -> bfloat16 half_down, subnormal bfloat16 scale",
         lambda t, s=np.array(3 * 2.0**-133, bf16): (dql(
             dq_codes.view(np.uint8), s, np.array(7, np.uint8), datapath=Datapath(rounding="half_down"),
             n_threads=t),))
    mx_words = words[:N // 32 * 32].reshape(-1, 32)
    mx_blocks = mx_x[:N // 32 * 32].reshape(-1, 32)
    case("mx_quantize float8e4m3fn stochastic, subnormal blocks",
         lambda t: qemu_q.mx_quantize(mx_blocks, "float8e4m3fn", datapath=Datapath(rounding="stochastic"),
                                      random_bits=mx_words, n_threads=t))

    # NVFP4: its float32 global scale and block scales; tiny amaxes.
    nv_x = (rng.standard_normal(N // 16 * 16) * np.exp2(rng.integers(-130, -100, N // 16 * 16).astype(np.float64))).astype(f32)
    case("nvfp4_quantize tiny blocks", lambda t: nvfp4_arrays(qemu_q.nvfp4_quantize(nv_x.reshape(-1, 16), n_threads=t)))
    nv_amax = np.array([1e-40, 3.7e-38, 1e-30, 448.0 * 6.0, 3.4e38], f32)
    case("nvfp4_global_scale of subnormal and tiny amaxes",
         lambda t: tuple(np.asarray(qemu_q.nvfp4_global_scale(a)) for a in nv_amax))

    # The integer ops' float requantization: a_scale * b_scale is a float32 subnormal.
    a = rng.integers(-128, 128, (300, 257)).astype(np.int8)
    b = rng.integers(-128, 128, (257, 440)).astype(np.int8)
    qlinear_parameters = (np.array(1e-20, f32), np.array(1, np.int8), np.array(3e-19, f32), np.array(-2, np.int8),
                          np.array(7e-36, f32), np.array(3, np.int8))
    for rule in ("float32", "float64"):
        case(f"qlinear_matmul requantization={rule}, subnormal a_scale * b_scale",
             lambda t, rule=rule, p=qlinear_parameters: (qemu_q.qlinear_matmul(
                 a, p[0], p[1], b, p[2], p[3], p[4], p[5], requantization=rule, n_threads=t),))

    # Parameter derivations in the Python layer: a compiler's qparams and multipliers.
    sub_range = (rng.standard_normal(4096) * 1e-38).astype(f32)
    case("choose_qparams int8 / uint8 / float8e4m3fn of a subnormal range",
         lambda t: sum((tuple(qemu_q.choose_qparams(sub_range, dt)) for dt in ("int8", "uint8", "float8e4m3fn")), ()))
    real_scales = np.array([5e-324, 1e-310, 2.2e-308, 1e-300, 0.3, 1 / 3], np.float64)
    case("quantize_multiplier tosa32 / gemmlowp of subnormal and tiny scales",
         lambda t: (tuple(qemu_q.quantize_multiplier(real_scales, "tosa32"))
                    + tuple(qemu_q.quantize_multiplier(real_scales, "gemmlowp"))))

    # The golden suite's cases: their inputs are drawn with numpy float arithmetic (ranges,
    # ties, subnormal scales) that the caller's mode changed before build_case ran in the
    # default environment.
    from qemu_q import golden

    sample = list(golden.iter_configs())[::50]
    case(f"golden.build_case of {len(sample)} configs (every 50th)",
         lambda t: tuple(array for config in sample for array in case_arrays(golden.build_case(config))))
    return cases


def case_arrays(case) -> list:
    return [np.asarray(array) for _, array in case.inputs + case.outputs + case.extras]


def nvfp4_arrays(result):
    return tuple(np.asarray(r) for r in result)


def same_bits(got, expected) -> bool:
    if len(got) != len(expected):
        return False
    for a, b in zip(got, expected):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            return False
    return True


def first_difference(got, expected) -> str:
    for index, (a, b) in enumerate(zip(got, expected)):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"output {index}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        rows_a = a.reshape(-1).view(np.uint8).reshape(-1, max(a.itemsize, 1))
        rows_b = b.reshape(-1).view(np.uint8).reshape(-1, max(b.itemsize, 1))
        differ = np.flatnonzero((rows_a != rows_b).any(axis=1))
        if differ.size:
            item = differ[0]
            return (f"output {index}: {differ.size} of {a.size} elements differ, first at "
                    f"{item}: got {a.reshape(-1)[item]!r}, expected {b.reshape(-1)[item]!r}")
    return "outputs differ in count"


def run_scenario(mxcsr_library: str | None, mode: str, scenario: str) -> dict:
    """One FP mode, one scenario ("fresh": the mode is set before any parallel call in this
    process; "after_parallel": a 2-thread call of every case runs first, then the mode is
    set). Returns lists of what went wrong (all empty when the library is right)."""
    cases = build_cases()
    control = FPControl(mxcsr_library)
    report = {"mode": mode, "scenario": scenario, "default_vs_oracle": [], "default_threads": [],
              "under_mode": [], "not_restored": [], "errors": [], "after_restore": []}
    expected = {}
    for name, fn, oracle in cases:
        expected[name] = fn(1)
        if oracle is not None and not same_bits(expected[name], oracle):
            report["default_vs_oracle"].append(f"{name}: {first_difference(expected[name], oracle)}")
    if scenario == "after_parallel":
        for name, fn, _ in cases:
            got = fn(2)
            if not same_bits(got, expected[name]):
                report["default_threads"].append(f"{name}: {first_difference(got, expected[name])}")
    results = []
    restore = control.apply(mode)
    try:
        state = control.state()
        for name, fn, _ in cases:
            for threads in (1, 2):
                try:
                    got = fn(threads)
                except Exception as error:  # reported after the mode is restored
                    got = error
                results.append((name, threads, got, control.state()))
    finally:
        restore()
    for name, threads, got, after in results:
        if isinstance(got, Exception):
            report["errors"].append(f"{name} [{threads} threads]: {type(got).__name__}: {got}")
        elif not same_bits(got, expected[name]):
            report["under_mode"].append(f"{name} [{threads} threads]: {first_difference(got, expected[name])}")
        if after != state:
            report["not_restored"].append(
                f"{name} [{threads} threads]: (MXCSR control bits, rounding mode) were "
                f"{state}, after the call {after}")
    # The mode is gone from the calling thread: worker threads must not keep it either.
    for name, fn, _ in cases:
        for threads in (1, 2):
            got = fn(threads)
            if not same_bits(got, expected[name]):
                report["after_restore"].append(f"{name} [{threads} threads]: {first_difference(got, expected[name])}")
    return report
