# Integer-only requantization (qemu_q.requantize): int32 accumulators scaled by a
# fixed-point multiplier and shift under one of the schemes of _fixedpoint.pxd, plus the
# zero point, saturated to the output type. The Python layer (qemu_q/ops/requantize.py)
# validates, lays the channel parameters out as int32 arrays of one entry per channel and
# hands over one RescaleConfig.
#
# An element the scheme's source leaves undefined stops its task; the entry returns the
# lowest such index over all tasks (the same whatever the thread count) and its reason.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.stdint cimport uint8_t, uint16_t, uint32_t, int32_t, int64_t, uint64_t

import numpy as np

from _tasks cimport run_tasks
from _memory cimport check_aligned
from _fixedpoint cimport (
    FP_OK, FP_TOSA32, FP_TOSA16, FP_GEMMLOWP, FP_TFLITE_SINGLE, FP_TVM_UPWARD,
    FP_TVM_TONEAREST, apply_fixed_point,
)

cdef enum:
    # Elements per task: large enough that scheduling is noise, small enough to balance.
    RESCALE_CHUNK = 32768

SCHEMES = {
    "tosa32": FP_TOSA32, "tosa16": FP_TOSA16, "gemmlowp": FP_GEMMLOWP,
    "tflite_single": FP_TFLITE_SINGLE, "tvm_upward": FP_TVM_UPWARD,
    "tvm_tonearest": FP_TVM_TONEAREST,
}
# The shift and multiplier each scheme's source accepts (docs/semantics.md); the Python
# layer reads these so that the two can never disagree.
SHIFT_RANGES = {
    "tosa32": (2, 62), "tosa16": (2, 62), "gemmlowp": (-31, 30), "tflite_single": (-31, 30),
    "tvm_upward": (-32, 31), "tvm_tonearest": (-32, 31),
}
MULTIPLIER_RANGES = {
    "tosa32": (0, 2**31 - 1), "tosa16": (0, 2**15 - 1), "gemmlowp": (-2**31, 2**31 - 1),
    "tflite_single": (0, 2**31 - 1), "tvm_upward": (-2**31, 2**31 - 1),
    "tvm_tonearest": (-2**31, 2**31 - 1),
}


cdef struct RescalePlan:
    int scheme
    bint double_round
    int out_bytes
    int64_t lo
    int64_t hi
    uint64_t mask
    Py_ssize_t channels
    Py_ssize_t inner


cdef struct RescaleWork:
    const int32_t* acc
    const int32_t* multiplier
    const int32_t* shift
    const int32_t* zero_point
    uint8_t* out
    Py_ssize_t n
    int64_t* first_bad   # per task: the first undefined element, or -1
    int* bad_status
    RescalePlan plan


cdef inline int rescale_run(int scheme, int out_bytes, const int32_t* acc, uint8_t* out,
                            Py_ssize_t a, Py_ssize_t b, int32_t m, int s, int64_t zp,
                            const RescalePlan* p) noexcept nogil:
    # One run of elements sharing their channel's parameters. The callers pass `scheme`
    # and `out_bytes` as constants, so that each inlined copy is one straight loop; the
    # statuses are OR-ed rather than tested, keeping the loop free of exits (the caller
    # finds the first undefined element again when one occurred).
    cdef Py_ssize_t i
    cdef int64_t value = 0
    cdef int any_status = 0
    cdef int64_t lo = p.lo
    cdef int64_t hi = p.hi
    cdef uint64_t mask = p.mask
    cdef bint double_round = p.double_round
    cdef uint64_t code
    for i in range(a, b):
        any_status |= apply_fixed_point(scheme, acc[i], m, s, double_round, &value)
        # result + zero point cannot overflow int64 (both are int32)
        value = min(max(value + zp, lo), hi)
        code = (<uint64_t>value) & mask
        if out_bytes == 1:
            out[i] = <uint8_t>code
        elif out_bytes == 2:
            (<uint16_t*>out)[i] = <uint16_t>code
        else:
            (<uint32_t*>out)[i] = <uint32_t>code
    return any_status


cdef inline int rescale_run_bytes(int scheme, const int32_t* acc, uint8_t* out, Py_ssize_t a,
                                  Py_ssize_t b, int32_t m, int s, int64_t zp,
                                  const RescalePlan* p) noexcept nogil:
    if p.out_bytes == 1:
        return rescale_run(scheme, 1, acc, out, a, b, m, s, zp, p)
    if p.out_bytes == 2:
        return rescale_run(scheme, 2, acc, out, a, b, m, s, zp, p)
    return rescale_run(scheme, 4, acc, out, a, b, m, s, zp, p)


cdef int rescale_segment(const int32_t* acc, uint8_t* out, Py_ssize_t a, Py_ssize_t b,
                         int32_t m, int s, int64_t zp, const RescalePlan* p) noexcept nogil:
    if p.scheme == FP_TOSA32:
        return rescale_run_bytes(FP_TOSA32, acc, out, a, b, m, s, zp, p)
    if p.scheme == FP_TOSA16:
        return rescale_run_bytes(FP_TOSA16, acc, out, a, b, m, s, zp, p)
    if p.scheme == FP_GEMMLOWP:
        return rescale_run_bytes(FP_GEMMLOWP, acc, out, a, b, m, s, zp, p)
    if p.scheme == FP_TFLITE_SINGLE:
        return rescale_run_bytes(FP_TFLITE_SINGLE, acc, out, a, b, m, s, zp, p)
    if p.scheme == FP_TVM_UPWARD:
        return rescale_run_bytes(FP_TVM_UPWARD, acc, out, a, b, m, s, zp, p)
    return rescale_run_bytes(FP_TVM_TONEAREST, acc, out, a, b, m, s, zp, p)


cdef void rescale_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const RescaleWork* w = <const RescaleWork*>work
    cdef const RescalePlan* p = &w.plan
    cdef Py_ssize_t start = task * RESCALE_CHUNK
    cdef Py_ssize_t stop = min(start + RESCALE_CHUNK, w.n)
    cdef Py_ssize_t c = (start // p.inner) % p.channels
    cdef Py_ssize_t a = start
    cdef Py_ssize_t b, i
    cdef int64_t value
    cdef int status
    w.first_bad[task] = -1
    while a < stop:
        # the run of elements up to the next channel change
        b = min(stop, a + p.inner - a % p.inner)
        if rescale_segment(w.acc, w.out, a, b, w.multiplier[c], w.shift[c], w.zero_point[c], p):
            for i in range(a, b):
                status = apply_fixed_point(p.scheme, w.acc[i], w.multiplier[c], w.shift[c],
                                           p.double_round, &value)
                if status != FP_OK:
                    w.first_bad[task] = i
                    w.bad_status[task] = status
                    return
        a = b
        c += 1
        if c == p.channels:
            c = 0


cdef class RescaleConfig:
    """One requantization plan, as qemu_q/ops/requantize.py decides it; every field is
    checked here."""
    cdef RescalePlan plan

    def __init__(self, *, str scheme, bint double_round, int64_t lo, int64_t hi, int out_bytes,
                 uint64_t mask, Py_ssize_t channels, Py_ssize_t inner):
        # lo, hi: the output type's saturation range (narrow ranges included); out_bytes:
        # its storage width; mask: the bits of the storage element a value's two's complement
        # fills (an ONNX int4's low 4 bits, a family int5's whole byte: qemu_q/codecs.py).
        if scheme not in SCHEMES:
            raise ValueError(f"RescaleConfig: scheme={scheme!r}; allowed {', '.join(SCHEMES)}")
        if double_round and scheme != "tosa32":
            raise ValueError("RescaleConfig: double_round applies to tosa32 only")
        if out_bytes not in (1, 2, 4):
            raise ValueError(f"RescaleConfig: out_bytes={out_bytes}; allowed 1, 2, 4")
        width = int(mask).bit_length()
        if mask != (1 << width) - 1 or not 2 <= width <= 8 * out_bytes:
            raise ValueError(f"RescaleConfig: mask={mask:#x}; allowed 2**k - 1 with 2 <= k <= "
                             f"{8 * out_bytes} (the storage's bits)")
        # every value of [lo, hi] must have its own code in `width` bits
        if lo < 0:
            fits = -(1 << (width - 1)) <= lo <= hi < (1 << (width - 1))
        else:
            fits = lo <= hi < (1 << width)
        if not fits:
            raise ValueError(f"RescaleConfig: lo={lo}, hi={hi} do not fit {width}-bit codes "
                             f"(mask={mask:#x})")
        if channels < 1 or inner < 1:
            raise ValueError(f"RescaleConfig: channels={channels}, inner={inner}; both must be >= 1")
        p = &self.plan
        p.scheme = SCHEMES[scheme]
        p.double_round = double_round
        p.out_bytes = out_bytes
        p.mask = mask
        p.lo = lo
        p.hi = hi
        p.channels = channels
        p.inner = inner

    @property
    def out_bytes(self):
        return self.plan.out_bytes


def requantize(const int32_t[::1] acc, const int32_t[::1] multiplier, const int32_t[::1] shift,
               const int32_t[::1] zero_point, uint8_t[::1] out, RescaleConfig config,
               int n_threads):
    """out = saturate(scheme(acc, multiplier, shift) + zero_point), per channel; returns
    (-1, 0), or (index, status) of the lowest element the scheme leaves undefined."""
    cdef RescaleWork work
    cdef Py_ssize_t n = acc.shape[0]
    cdef Py_ssize_t n_tasks, t
    cdef int64_t[::1] first_bad
    cdef int[::1] bad_status
    work.plan = config.plan
    if out.shape[0] != n * work.plan.out_bytes:
        raise ValueError(f"requantize: out holds {out.shape[0]} bytes, {n} elements need {n * work.plan.out_bytes}")
    for name, view in (("multiplier", multiplier), ("shift", shift), ("zero_point", zero_point)):
        if view.shape[0] != work.plan.channels:
            raise ValueError(f"requantize: {name} has {view.shape[0]} entries, the config {work.plan.channels} channels")
    if n % (work.plan.channels * work.plan.inner):
        raise ValueError("requantize: acc does not hold whole channel runs of the configured layout")
    # The shifts bound every shift count of the schemes (a count outside is undefined in C)
    name = [k for k, v in SCHEMES.items() if v == work.plan.scheme][0]
    lo_shift, hi_shift = SHIFT_RANGES[name]
    lo_m, hi_m = MULTIPLIER_RANGES[name]
    for t in range(work.plan.channels):
        if not lo_shift <= shift[t] <= hi_shift:
            raise ValueError(f"requantize: shift[{t}]={shift[t]} outside [{lo_shift}, {hi_shift}]")
        if not lo_m <= multiplier[t] <= hi_m:
            raise ValueError(f"requantize: multiplier[{t}]={multiplier[t]} outside [{lo_m}, {hi_m}]")
    if n == 0:
        return (-1, 0)
    check_aligned(&out[0], work.plan.out_bytes, "out")
    n_tasks = (n + RESCALE_CHUNK - 1) // RESCALE_CHUNK
    first_bad = np.full(n_tasks, -1, dtype=np.int64)
    bad_status = np.zeros(n_tasks, dtype=np.intc)
    work.acc = &acc[0]
    work.multiplier = &multiplier[0]
    work.shift = &shift[0]
    work.zero_point = &zero_point[0]
    work.out = &out[0]
    work.n = n
    work.first_bad = &first_bad[0]
    work.bad_status = &bad_status[0]
    with nogil:
        run_tasks(rescale_task, &work, n_tasks, n_threads)
    for t in range(n_tasks):
        if first_bad[t] >= 0:
            return (int(first_bad[t]), int(bad_status[t]))
    return (-1, 0)
