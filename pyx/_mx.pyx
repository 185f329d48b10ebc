# OCP Microscaling quantization (qemu_q/ops/mx.py): per block of block_size elements along
# an axis, the shared e8m0 scale from the block's amax (pyx/_mx_codecs.pxd) and the
# elements x / X rounded to nearest even into the element format, normals clamped to +-max.
# The Python layer validates and hands over float32 x (float16/bfloat16 widened exactly),
# one-per-byte or packed code storage, the e8m0 scale bytes and one MXQuantizeConfig.
#
# A task is a run of whole blocks ("groups": one outer index and one block index, all
# inner columns), so that every block is reduced and encoded by one thread and the bits
# never depend on the split. Packed output is written by whole bytes: the plan only fuses
# packing where every group starts on a whole packing group (qemu_q/ops/mx.py).

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.stdlib cimport malloc, free

from _tasks cimport run_tasks
from _codecs cimport (
    SF_COUNT, SmallFloat32Encoder, small_float32_encoder, small_float_format, SmallFloatFormat,
    float_bits, bits_float, round_biased, saturate_biased, select_i32, select_f32, pow2,
    DP_HALF_EVEN, DP_HALF_AWAY, DP_HALF_UP, DP_HALF_DOWN, DP_TOWARD_ZERO, DP_DOWN, DP_UP,
    DP_TO_ODD, DP_STOCHASTIC,
    rounded_count, half_even_count, datapath_round_f32_half_even, datapath_round_f32_half_away,
    datapath_round_f32_half_up, datapath_round_f32_half_down, datapath_round_f32_toward_zero,
    datapath_round_f32_down, datapath_round_f32_up, datapath_round_f32_to_odd,
    datapath_round_up,
)
from _mx_codecs cimport (
    MXElement, MX_FLOOR, MX_CEIL, MX_EVEN, MX_RCEIL, MX_RCEIL_F32, MX_SCALE_NAN,
    mx_scale_code, mx_inverse_scale, encode_mx_small_float, round_to_code, round_to_int8,
)
from _subbyte cimport pack_codes, packed_bytes
from _memory cimport prefetch_run

cdef enum:
    # Elements per task, in whole groups (at least one group per task).
    MX_TASK = 32768
    # Columns reduced together when the axis is not innermost: the amax, code and inverse
    # scale of each live on the stack.
    MX_COLUMNS = 256
    # MXINT8's implied element scale 2**-6, as the factor that turns x / X into code units.
    INT8_UNITS = 64

# The element id MXQuantizeConfig takes for MXINT8 (the small floats use their SF_* id).
ELEMENT_INT8 = -1
SCALE_RULES = {"floor": MX_FLOOR, "ceil": MX_CEIL, "even": MX_EVEN, "rceil": MX_RCEIL,
               "rceil_f32": MX_RCEIL_F32}


# The vectorized datapath loops' constants (_mx_datapath_loops.pxi), as int32 and float
# so that every select is one width.
cdef struct MXVectorConstants:
    int32_t flush_below      # flush_inputs: x magnitudes (float32 bits) below it are zeros
    int32_t exact            # 1: the exact quotient (a nonzero x's tiny q stays nonzero)
    int32_t min_normal_bits  # the element's smallest normal, as float32 bits
    int32_t shift            # 23 - mantissa_bits
    int32_t exponent_offset  # (127 - bias) << mantissa_bits
    int32_t round_bias       # half_even: half an ulp minus one, in float32 mantissa units
    float subnormal_magic    # half_even: a power of two whose ulp is the smallest subnormal
    int32_t subnormal_magic_bits
    int32_t min_normal_code  # flush_outputs: 1 << mantissa_bits (a smaller result is a zero), else 0
    int32_t max_code
    int32_t sign_shift       # width - 1
    float int8_max           # MXINT8: 127.0


cdef struct MXPlan:
    Py_ssize_t outer
    Py_ssize_t axis_len
    Py_ssize_t inner
    Py_ssize_t block_size
    Py_ssize_t n_blocks
    Py_ssize_t groups_per_task
    int rule
    bint int8
    int nan_code          # every code of a NaN block (the element's NaN, or +0 without one)
    int code_bits         # packed width (4 or 6), 0 for one code per byte
    MXElement element
    SmallFloat32Encoder encoder
    # qemu_q.Datapath (docs/semantics.md, "Datapath options", MX): any of these runs the
    # general element loop (quantize_groups_datapath) instead of the fast one.
    bint datapath
    int rounding           # DatapathRounding of x / X into the element
    bint flush_inputs      # x below flush_below (float32 magnitude bits) is a signed zero
    uint32_t flush_below
    bint flush_outputs     # a subnormal element result is a signed zero
    bint quotient_f32      # x / X rounded to float32 (scale_precision="float32") first
    int mantissa_bits      # the element's, for the rounding
    int min_exponent
    int32_t max_code       # the element's largest finite code (OCP's clamp)
    int32_t sign_bit       # the element's sign bit
    # 1: the datapath runs the vectorized loops of _mx_datapath_loops.pxi (innermost axis),
    # 0: the scalar reference quantize_groups_datapath
    bint vector
    MXVectorConstants vector_constants


cdef struct MXWork:
    const float* x
    const uint32_t* words   # datapath rounding "stochastic": one word per element of x
    uint8_t* codes        # one per byte, or the packed bytes
    uint8_t* scales
    Py_ssize_t size
    Py_ssize_t n_groups
    int* failed           # set by a task whose buffer could not be allocated
    MXPlan plan


cdef void encode_run(const float* x, uint8_t* out, Py_ssize_t n, int code, const MXPlan* p) noexcept nogil:
    # The elements of one contiguous block, all under the scale `code`.
    cdef Py_ssize_t i
    cdef float inverse = mx_inverse_scale(code)
    cdef SmallFloat32Encoder encoder = p.encoder  # a local copy the compiler keeps in registers
    cdef uint8_t nan_code = <uint8_t>p.nan_code
    if code == MX_SCALE_NAN:
        for i in range(n):
            out[i] = nan_code
    elif p.int8:
        for i in range(n):
            out[i] = <uint8_t>(saturate_biased(round_biased((x[i] * inverse) * <float>INT8_UNITS), 0, -127, 127) & 0xFF)
    else:
        for i in range(n):
            out[i] = <uint8_t>encode_mx_small_float(x[i] * inverse, &encoder)


cdef inline uint32_t block_amax(const float* x, Py_ssize_t n) noexcept nogil:
    # The largest magnitude as float32 bits: integer order is value order for non-NaN
    # magnitudes, and a NaN's magnitude is above inf's.
    cdef const uint32_t* bits = <const uint32_t*>x
    cdef uint32_t m = 0
    cdef uint32_t a
    cdef Py_ssize_t i
    for i in range(n):
        a = bits[i] & 0x7FFFFFFF
        m = a if a > m else m
    return m


cdef inline float datapath_input(float v, const MXPlan* p) noexcept nogil:
    # subnormals "flush_inputs": a subnormal of x's own type becomes a zero of its sign.
    cdef uint32_t b = float_bits(v)
    if p.flush_inputs and (b & 0x7FFFFFFF) < p.flush_below:
        return bits_float(b & <uint32_t>0x80000000u)
    return v


cdef inline int datapath_element(float x, double inverse, uint32_t word, const MXPlan* p) noexcept nogil:
    # One element of a finite block under the datapath: q = x / X = x * 2**(127 - code)
    # exact in double (X a power of two, every such q a double normal), or rounded to
    # float32 first; rounded by the mode on the element's precision (MXINT8: units of
    # 2**-6), an output subnormal flushed if asked, clamped to +-max (OCP), x's sign kept.
    cdef double q = <double>x * inverse
    if p.quotient_f32:
        q = <double>(<float>q)
    if p.int8:
        return round_to_int8(q, p.rounding, word) & 0xFF
    return (round_to_code(q, p.rounding, word, p.mantissa_bits, p.min_exponent, p.max_code, p.flush_outputs)
            | select_i32(float_bits(x) >> 31, p.sign_bit, 0))


cdef void quantize_groups_datapath(const MXWork* w, Py_ssize_t g0, Py_ssize_t g1, uint8_t* out,
                                   Py_ssize_t out_base) noexcept nogil:
    # quantize_groups under a non-default datapath, one column of a block at a time, every
    # element through datapath_element: the blocks along an axis other than the innermost,
    # and the reference the vectorized loops (_mx_datapath_loops.pxi) are tested against
    # (reference_loop). The plan is copied to a local: stores through `out` could alias
    # w.plan, and would make the compiler reload every field per element.
    cdef MXPlan plan = w.plan
    cdef const MXPlan* p = &plan
    cdef const float* x = w.x
    cdef const uint32_t* words = w.words
    cdef Py_ssize_t g, o, b, rows, j, c, start, i
    cdef Py_ssize_t inner = plan.inner
    cdef uint32_t amax, a
    cdef int code
    cdef double inverse
    for g in range(g0, g1):
        o = g // plan.n_blocks
        b = g - o * plan.n_blocks
        rows = min(plan.block_size, plan.axis_len - b * plan.block_size)
        start = (o * plan.axis_len + b * plan.block_size) * inner
        for c in range(inner):
            amax = 0
            for j in range(rows):
                a = float_bits(datapath_input(x[start + j * inner + c], p)) & 0x7FFFFFFF
                amax = a if a > amax else amax
            code = mx_scale_code(amax, plan.rule, &plan.element)
            w.scales[g * inner + c] = <uint8_t>code
            if code == MX_SCALE_NAN:
                for j in range(rows):
                    out[start + j * inner + c - out_base] = <uint8_t>plan.nan_code
                continue
            inverse = pow2(127 - code)
            if words != NULL:
                for j in range(rows):
                    i = start + j * inner + c
                    out[i - out_base] = <uint8_t>datapath_element(datapath_input(x[i], p), inverse, words[i], p)
            else:
                for j in range(rows):
                    i = start + j * inner + c
                    out[i - out_base] = <uint8_t>datapath_element(datapath_input(x[i], p), inverse, 0, p)


cdef inline uint32_t block_amax_flushed(const float* x, Py_ssize_t n, int32_t flush_below) noexcept nogil:
    # block_amax of x with subnormals flush_inputs: a magnitude below flush_below is 0.
    cdef const uint32_t* bits = <const uint32_t*>x
    cdef uint32_t m = 0
    cdef uint32_t a
    cdef Py_ssize_t i
    for i in range(n):
        a = bits[i] & 0x7FFFFFFF
        a = <uint32_t>select_i32(<int32_t>a < flush_below, 0, <int32_t>a)
        m = a if a > m else m
    return m


# The datapath's vectorized element loops, one per rounding mode and input flush, generated
# from _mx_datapath_loops.pxi.tp by setup.py.
include "_mx_datapath_loops.pxi"


cdef void quantize_groups(const MXWork* w, Py_ssize_t g0, Py_ssize_t g1, uint8_t* out, Py_ssize_t out_base) noexcept nogil:
    # Groups [g0, g1); `out` receives the one-per-byte code of flat element i at
    # out[i - out_base].
    cdef const MXPlan* p = &w.plan
    cdef Py_ssize_t g, o, b, rows, j, r, c0, n_cols, start, scale_base
    cdef uint32_t amax[MX_COLUMNS]
    cdef float inverse[MX_COLUMNS]
    cdef int32_t is_nan[MX_COLUMNS]
    cdef uint32_t a
    cdef int code
    cdef const float* row
    cdef const uint32_t* row_bits
    cdef uint8_t* dest
    cdef SmallFloat32Encoder encoder = p.encoder
    cdef int32_t nan_code = p.nan_code
    cdef int32_t encoded
    cdef bint int8 = p.int8
    cdef Py_ssize_t inner = p.inner
    cdef const float* x = w.x
    cdef MXElement element = p.element
    cdef int rule = p.rule
    cdef Py_ssize_t block_size = p.block_size
    cdef Py_ssize_t axis_len = p.axis_len
    cdef Py_ssize_t n_blocks = p.n_blocks
    cdef uint8_t* scales = w.scales
    if p.datapath:
        if p.vector:
            quantize_groups_datapath_vector(w, g0, g1, out, out_base)
        else:
            quantize_groups_datapath(w, g0, g1, out, out_base)
        return
    if inner == 1:
        # Consecutive groups of the innermost axis are consecutive runs of x: one division
        # for the task, none per block; the plan's fields are in locals, since the stores
        # through uint8_t pointers may alias the plan.
        o = g0 // n_blocks
        b = g0 - o * n_blocks
        start = o * axis_len + b * block_size
        for g in range(g0, g1):
            rows = min(block_size, axis_len - b * block_size)
            code = mx_scale_code(block_amax(x + start, rows), rule, &element)
            scales[g] = <uint8_t>code
            encode_run(x + start, out + (start - out_base), rows, code, p)
            start += rows
            b += 1
            if b == n_blocks:
                b = 0
        return
    for g in range(g0, g1):
        o = g // p.n_blocks
        b = g - o * p.n_blocks
        rows = min(p.block_size, p.axis_len - b * p.block_size)
        start = (o * p.axis_len + b * p.block_size) * p.inner
        scale_base = g * p.inner
        # The axis is not innermost: the block of column r is rows elements `inner` apart;
        # MX_COLUMNS columns are reduced and encoded together, row by row.
        c0 = 0
        while c0 < p.inner:
            n_cols = min(<Py_ssize_t>MX_COLUMNS, p.inner - c0)
            for r in range(n_cols):
                amax[r] = 0
            for j in range(rows):
                row_bits = <const uint32_t*>(x + start + j * inner + c0)
                for r in range(n_cols):
                    a = row_bits[r] & 0x7FFFFFFF
                    amax[r] = a if a > amax[r] else amax[r]
            for r in range(n_cols):
                code = mx_scale_code(amax[r], p.rule, &p.element)
                w.scales[scale_base + c0 + r] = <uint8_t>code
                inverse[r] = mx_inverse_scale(code)
                is_nan[r] = code == MX_SCALE_NAN
            # Two loops, so that neither branches per element; the plan's fields are read
            # into locals first (a store through dest may alias the plan).
            if int8:
                for j in range(rows):
                    row = x + start + j * inner + c0
                    dest = out + (start + j * inner + c0 - out_base)
                    for r in range(n_cols):
                        encoded = saturate_biased(round_biased((row[r] * inverse[r]) * <float>INT8_UNITS), 0, -127, 127) & 0xFF
                        dest[r] = <uint8_t>select_i32(is_nan[r], nan_code, encoded)
            else:
                for j in range(rows):
                    row = x + start + j * inner + c0
                    dest = out + (start + j * inner + c0 - out_base)
                    for r in range(n_cols):
                        encoded = encode_mx_small_float(row[r] * inverse[r], &encoder)
                        dest[r] = <uint8_t>select_i32(is_nan[r], nan_code, encoded)
            c0 += n_cols


cdef inline Py_ssize_t group_start(const MXWork* w, Py_ssize_t g) noexcept nogil:
    cdef const MXPlan* p = &w.plan
    cdef Py_ssize_t o
    if g >= w.n_groups:
        return w.size
    o = g // p.n_blocks
    return (o * p.axis_len + (g - o * p.n_blocks) * p.block_size) * p.inner


cdef void mx_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const MXWork* w = <const MXWork*>work
    cdef const MXPlan* p = &w.plan
    cdef Py_ssize_t g0 = task * p.groups_per_task
    cdef Py_ssize_t g1 = min(g0 + p.groups_per_task, w.n_groups)
    cdef Py_ssize_t start, stop
    cdef uint8_t* buffer
    if p.code_bits == 0:
        quantize_groups(w, g0, g1, w.codes, 0)
        return
    # Packed: the task's codes one per byte in a private buffer, then packed into its own
    # whole bytes (the plan guarantees every group starts on a packing group).
    start = group_start(w, g0)
    stop = group_start(w, g1)
    buffer = <uint8_t*>malloc(stop - start)
    if buffer == NULL:
        w.failed[0] = 1  # the entry raises MemoryError: no output is left unset silently
        return
    quantize_groups(w, g0, g1, buffer, start)
    pack_codes(buffer, stop - start, w.codes + start * p.code_bits // 8, p.code_bits)
    free(buffer)


cdef class MXQuantizeConfig:
    """One mx_quantize plan, as qemu_q/ops/mx.py decides it; every field is checked here."""
    cdef MXPlan plan

    def __init__(self, *, Py_ssize_t outer, Py_ssize_t axis_len, Py_ssize_t inner,
                 Py_ssize_t block_size, int element, int rule, int code_bits,
                 int rounding=DP_HALF_EVEN, bint flush_inputs=False, uint32_t flush_below=0x00800000,
                 bint flush_outputs=False, bint quotient_f32=False, bint canonical_nan=False,
                 bint reference_loop=False):
        cdef SmallFloatFormat f
        cdef MXVectorConstants* k
        if outer < 0 or axis_len < 1 or inner < 1:
            raise ValueError(f"MXQuantizeConfig: extents ({outer}, {axis_len}, {inner}) must be >= (0, 1, 1)")
        if not 1 <= block_size <= axis_len:
            raise ValueError(f"MXQuantizeConfig: block_size={block_size} outside [1, {axis_len}]")
        if rule not in SCALE_RULES.values():
            raise ValueError(f"MXQuantizeConfig: unknown rule {rule}")
        if element != ELEMENT_INT8 and not 0 <= element < SF_COUNT:
            raise ValueError(f"MXQuantizeConfig: element={element} is neither a small float nor ELEMENT_INT8")
        if code_bits not in (0, 4, 6):
            raise ValueError(f"MXQuantizeConfig: code_bits={code_bits}; allowed 0 (one per byte), 4, 6")
        p = &self.plan
        p.outer = outer
        p.axis_len = axis_len
        p.inner = inner
        p.block_size = block_size
        p.n_blocks = axis_len // block_size + (axis_len % block_size != 0)
        p.groups_per_task = max(1, MX_TASK // (block_size * inner))
        p.rule = rule
        p.int8 = element == ELEMENT_INT8
        p.code_bits = code_bits
        if not DP_HALF_EVEN <= rounding <= DP_STOCHASTIC:
            raise ValueError(f"MXQuantizeConfig: rounding code {rounding}; allowed {DP_HALF_EVEN}..{DP_STOCHASTIC}")
        if flush_below not in (0x00800000, 0x38800000):
            raise ValueError(f"MXQuantizeConfig: flush_below={flush_below:#x}; allowed 0x00800000 "
                             "(float32, bfloat16) or 0x38800000 (float16)")
        p.rounding = rounding
        p.flush_inputs = flush_inputs
        p.flush_below = flush_below
        p.flush_outputs = flush_outputs
        p.quotient_f32 = quotient_f32
        # Round to nearest even of a float32 quotient is the exact quotient's (below 2**-126
        # both are far below half the smallest element subnormal): only the other modes
        # and the flushes need the general loop.
        p.datapath = rounding != DP_HALF_EVEN or flush_inputs or flush_outputs
        if p.int8:
            max_value = 127.0 / 64.0
            p.element.fraction_bits = 6
            p.nan_code = 0
            p.mantissa_bits = 6
            p.min_exponent = 0
            p.max_code = 127
            p.sign_bit = 0
            p.encoder = small_float32_encoder(0, True, 0)
        else:
            f = small_float_format(element)
            if code_bits and code_bits != f.width:
                raise ValueError(f"MXQuantizeConfig: code_bits={code_bits} but the element has {f.width} bits")
            max_value = f.max_finite
            p.element.fraction_bits = f.mantissa_bits
            # The element's quiet NaN where it has one (e4m3fn 0x7F, e5m2 0x7E), else +0.
            p.nan_code = f.nan_code if f.nan_code >= 0 else 0
            if canonical_nan and f.nan_code >= 0:
                p.nan_code = 0x7F  # datapath nan="canonical": NVIDIA's one NaN code
            p.mantissa_bits = f.mantissa_bits
            p.min_exponent = f.min_exponent
            p.max_code = f.max_code
            p.sign_bit = 1 << (f.width - 1)
            if f.unsigned_zero:
                # encode_mx_small_float writes -0 codes: FNUZ formats are no MX elements.
                raise ValueError(f"MXQuantizeConfig: element={element} is an FNUZ format, no MX element")
            # NaN and inf never reach the encoder (their blocks take nan_code); normals
            # beyond +-max clamp to +-max (OCP).
            p.encoder = small_float32_encoder(element, True, 0)
        emax = 0
        while 2.0 ** (emax + 1) <= max_value:
            emax += 1
        p.element.emax = emax
        p.element.max_fraction = <uint32_t>((max_value / 2.0 ** emax - 1.0) * 8388608.0)
        p.element.max_reciprocal = <float>(1.0 / max_value)
        # The innermost axis runs the vectorized datapath loops; other axes, and tests that
        # ask for it (reference_loop), the scalar reference loop.
        p.vector = p.datapath and inner == 1 and not reference_loop
        k = &p.vector_constants
        k.flush_below = <int32_t>(flush_below if flush_inputs else 0)
        k.exact = not quotient_f32
        k.min_normal_bits = (p.min_exponent + 127) << 23
        k.shift = 23 - p.mantissa_bits
        k.exponent_offset = p.encoder.exponent_offset
        k.round_bias = p.encoder.round_bias
        k.subnormal_magic = p.encoder.subnormal_magic
        k.subnormal_magic_bits = p.encoder.subnormal_magic_bits
        k.min_normal_code = (1 << p.mantissa_bits) if flush_outputs else 0
        k.int8_max = <float>127.0
        k.max_code = p.max_code
        k.sign_shift = p.encoder.sign_shift

    @property
    def datapath_loop(self):
        """The element loop this plan runs: "default" (no datapath option changes a bit),
        "vector" (_mx_datapath_loops.pxi) or "scalar" (quantize_groups_datapath)."""
        if not self.plan.datapath:
            return "default"
        return "vector" if self.plan.vector else "scalar"

    @property
    def n_scales(self):
        return self.plan.outer * self.plan.n_blocks * self.plan.inner

    @property
    def emax(self):
        return self.plan.element.emax

    @property
    def max_fraction(self):
        return self.plan.element.max_fraction


def mx_quantize(const float[::1] x, uint8_t[::1] codes, uint8_t[::1] scales,
                MXQuantizeConfig config not None, int n_threads, const uint32_t[::1] random_bits=None):
    """codes, scales = MX(x): codes one per byte (config.code_bits == 0) or packed;
    random_bits (one word per element of x) with the datapath rounding "stochastic"."""
    cdef MXWork work
    cdef Py_ssize_t size = x.shape[0]
    cdef Py_ssize_t n_tasks
    cdef int failed = 0
    work.plan = config.plan
    if size != work.plan.outer * work.plan.axis_len * work.plan.inner:
        raise ValueError(f"mx_quantize: x has {size} elements; the layout has "
                         f"{work.plan.outer * work.plan.axis_len * work.plan.inner}")
    if work.plan.code_bits == 0:
        if codes.shape[0] != size:
            raise ValueError(f"mx_quantize: codes has {codes.shape[0]} bytes; {size} codes take {size}")
    elif codes.shape[0] != packed_bytes(size, work.plan.code_bits):
        raise ValueError(f"mx_quantize: codes has {codes.shape[0]} bytes; {size} packed codes of "
                         f"{work.plan.code_bits} bits take {packed_bytes(size, work.plan.code_bits)}")
    if scales.shape[0] != config.n_scales:
        raise ValueError(f"mx_quantize: scales has {scales.shape[0]} bytes; the layout has {config.n_scales} blocks")
    if (work.plan.rounding == DP_STOCHASTIC) != (random_bits is not None):
        raise ValueError("mx_quantize: random_bits go with the rounding 'stochastic', and only with it")
    if random_bits is not None and random_bits.shape[0] != size:
        raise ValueError(f"mx_quantize: random_bits has {random_bits.shape[0]} words; x has {size} elements")
    work.words = NULL
    if size == 0:
        return
    if random_bits is not None:
        work.words = &random_bits[0]
    if work.plan.code_bits:
        # Every group must start on a whole packing group (4 codes) for tasks to own whole bytes.
        if (work.plan.block_size * work.plan.inner) % 4 or (work.plan.axis_len * work.plan.inner) % 4:
            raise ValueError("mx_quantize: packed output needs block_size * inner and axis_len * inner "
                             "to be multiples of 4")
    work.x = &x[0]
    work.codes = &codes[0]
    work.scales = &scales[0]
    work.size = size
    work.n_groups = work.plan.outer * work.plan.n_blocks
    work.failed = &failed
    n_tasks = (work.n_groups + work.plan.groups_per_task - 1) // work.plan.groups_per_task
    with nogil:
        run_tasks(mx_task, &work, n_tasks, n_threads)
    if failed:
        raise MemoryError("mx_quantize: no memory for a task's code buffer")
