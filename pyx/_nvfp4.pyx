# NVFP4 quantization: float32 elements into float4e2m1 codes, one float8e4m3fn scale per
# block of 16 (or per 16x16 tile) under one float32 tensor scale, by the float32 operation
# order of one named recipe (docs/semantics.md, "NVFP4", cites each line reproduced here).
# The Python layer (qemu_q/ops/nvfp4.py) validates, reduces the tensor amax when the
# caller gives none, and hands over x as (outer, length, inner) with blocks along length.
#
# Every float32 operation below is written as the recipe writes it: an operand order
# changes the bits (a * (b * c) is not (a * b) * c), so nothing is folded or reassociated;
# -ffp-contract=off keeps products and sums apart. A NaN is never inspected for its
# payload: each recipe's NaN codes are fixed (the GPUs they run on produce one canonical
# NaN), so the encoders test for NaN and write the recipe's code.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)
from libc.float cimport FLT_MAX
from libc.math cimport copysignf, fabsf, fmaxf, fminf, isnan, NAN
from libc.stdint cimport uint8_t, int32_t, uint32_t

from _tasks cimport run_tasks
from _codecs cimport (
    SF_E4M3FN, SF_E2M1, SmallFloat32Encoder, small_float32_encoder, encode_small_float32,
    SmallFloat32Decoder, small_float32_decoder, decode_small_float32, float_bits, bits_float,
    select_i32, DP_HALF_EVEN, DP_STOCHASTIC,
)
from _mx_codecs cimport round_to_code
from _memory cimport check_aligned

cdef enum NVFP4Recipe:
    RECIPE_TRANSFORMER_ENGINE = 0
    RECIPE_TORCHAO = 1
    RECIPE_MODELOPT = 2

cdef enum:
    BLOCK = 16
    # Blocks per task along the blocked axis: a few thousand elements, so that a long
    # single row still spreads over the team.
    BLOCKS_PER_TASK = 256


cdef struct NVFP4Plan:
    int recipe
    Py_ssize_t outer
    Py_ssize_t length
    Py_ssize_t inner
    Py_ssize_t n_blocks
    Py_ssize_t tile_outer     # rows of a tile across `outer` (16 for 16x16 tiles with axis=-1)
    Py_ssize_t tile_inner     # across `inner` (16 for 16x16 tiles with axis=0)
    Py_ssize_t outer_groups
    Py_ssize_t inner_groups
    Py_ssize_t block_chunks
    float global_amax
    float global_scale        # the decode scale the DequantizeLinear graph multiplies by
    float encode_scale        # transformer_engine: S_enc
    float scale_multiplier    # transformer_engine: S_enc * (1/6)
    float inverse_global      # torchao: 1 / per_tensor_scale
    float six_global          # modelopt: 6 * weights_scaling_factor_2
    SmallFloat32Encoder e4m3
    SmallFloat32Decoder e4m3_decoder
    SmallFloat32Encoder e2m1
    int rounding              # datapath: DatapathRounding of the element into e2m1
    # datapath subnormals: x magnitudes below x_min_normal (x's own type) are read as zeros
    # of their sign ("flush_inputs"; 0: none); a subnormal e2m1 result (+-0.5) is written as
    # a zero of its sign ("flush_outputs")
    float x_min_normal
    bint flush_outputs
    bint datapath_loop        # the element runs through encode_run_datapath


cdef struct NVFP4Work:
    const float* x
    const uint32_t* words     # datapath rounding "stochastic": one word per element of x
    uint8_t* codes
    uint8_t* scales
    NVFP4Plan plan


# The global parameters, as each recipe computes them from the tensor amax A. Operands
# are float32 variables so that C does float32 arithmetic (a double literal would promote).
cdef void global_parameters(NVFP4Plan* p, float amax) noexcept nogil:
    cdef float one = 1.0
    cdef float six = 6.0
    cdef float e4m3_times_e2m1 = 2688.0  # 448 * 6, exact
    cdef float s_enc, t
    p.global_amax = amax
    p.encode_scale = 1.0
    p.scale_multiplier = 0.0
    p.inverse_global = 0.0
    p.six_global = 0.0
    if p.recipe == RECIPE_TRANSFORMER_ENGINE:
        # compute_global_encode_scaling_factor_FP4: fp8_max * fp4_max / global_amax,
        # fminf(., FLT_MAX), 1 when the amax is 0 or the scale is 0 (an infinite amax).
        s_enc = e4m3_times_e2m1 / amax
        s_enc = fminf(s_enc, FLT_MAX)
        if amax == 0.0 or s_enc == 0.0:
            s_enc = 1.0
        p.encode_scale = s_enc
        # S_dec = 1.0 / S_enc in double, stored as float: rounding a double quotient of
        # float32 operands to float32 is the float32 quotient (53 >= 2 * 24 + 2).
        p.global_scale = <float>(1.0 / <double>s_enc)
        t = one / six  # constexpr fp4_max_inv = 1.0f / 6.0f
        p.scale_multiplier = s_enc * t
    elif p.recipe == RECIPE_TORCHAO:
        # per_tensor_amax_to_scale: amax / (F8E4M3_MAX * F4_E2M1_MAX)
        p.global_scale = amax / e4m3_times_e2m1
        p.inverse_global = one / p.global_scale  # (1.0 / per_tensor_scale)
    else:
        # get_weights_scaling_factor_2: amax / (6.0 * 448.0); 6.0 * wsf2 per block
        p.global_scale = amax / e4m3_times_e2m1
        p.six_global = six * p.global_scale


cdef inline int encode_e2m1_torchao(float q, const SmallFloat32Encoder* e) noexcept nogil:
    # torch.clamp(., -6, 6) then _f32_to_floatx_unpacked: the clamp changes nothing the
    # saturating encoder does not (beyond +-6 both give +-6). A NaN matches neither its
    # saturate_mask (x >= max_normal) nor its denormal_mask (x < min_normal), so the normal
    # branch's integer arithmetic runs on the NaN's bits: the canonical NaN 0x7FFFFFFF gives
    # 0x104, cut to uint8: 0x04.
    return select_i32(q != q, 0x4, encode_small_float32(q, e))


cdef inline int encode_e2m1_modelopt(float q, const SmallFloat32Encoder* e) noexcept nogil:
    # _cast_fp4: sign_bit = (weight < 0), so -0.0 is +0; searchsorted puts NaN after every
    # bound (ordinal 7, +6), and the ordinal plus the tie fix-up is round-half-even.
    cdef int code = encode_small_float32(q, e)
    code = select_i32(float_bits(q) == <uint32_t>0x80000000u, 0x0, code)
    return select_i32(q != q, 0x7, code)


cdef inline int encode_e2m1_datapath(float q, int recipe, int mode, uint32_t word,
                                     bint flush_outputs) noexcept nogil:
    # The recipe's float32 element q rounded by the datapath mode on e2m1's one mantissa
    # bit (smallest normal 1.0; an infinite q is clamped high first), saturated to +-6 as
    # every recipe's conversion does; the recipe's own NaN and -0 codes are kept.
    cdef int code
    if q != q:
        return 0x4 if recipe == RECIPE_TORCHAO else 0x7
    if recipe == RECIPE_MODELOPT and float_bits(q) == <uint32_t>0x80000000u:
        return 0x0
    # e2m1: 1 mantissa bit, smallest normal 2**0, largest code 0x7 (+6), sign 0x8
    code = round_to_code(<double>q, mode, word, 1, 0, 0x7, False) | select_i32(float_bits(q) >> 31, 0x8, 0)
    if flush_outputs and (code & 0x7) == 0x1:
        code = code & 0x8  # +-0.5, e2m1's one subnormal, after rounding: a zero of its sign
    return code


cdef void encode_run_datapath(const float* x, uint8_t* codes, const uint32_t* words, Py_ssize_t count,
                              Py_ssize_t stride, float factor, const NVFP4Plan* p) noexcept nogil:
    # encode_run under a datapath: x flushed, the recipe's element operation, then the mode.
    cdef Py_ssize_t j
    cdef float v, q
    cdef int recipe = p.recipe
    for j in range(count):
        v = x[j * stride]
        if fabsf(v) < p.x_min_normal:
            v = copysignf(0.0, v)
        q = v / factor if recipe == RECIPE_MODELOPT else v * factor
        codes[j * stride] = <uint8_t>encode_e2m1_datapath(
            q, recipe, p.rounding, words[j * stride] if words != NULL else 0, p.flush_outputs)


cdef inline void encode_run(const float* x, uint8_t* codes, Py_ssize_t count, Py_ssize_t stride,
                            float factor, int recipe, const SmallFloat32Encoder* e2m1) noexcept nogil:
    # The elements of one block row; one loop per recipe so that no recipe test runs per
    # element (branch-free bodies: the stride-1 loops vectorize).
    cdef Py_ssize_t j
    cdef SmallFloat32Encoder e = e2m1[0]
    if stride == 1:
        # the blocked axis is the last one: contiguous loops the compiler vectorizes
        if recipe == RECIPE_TRANSFORMER_ENGINE:
            for j in range(count):
                codes[j] = <uint8_t>encode_small_float32(x[j] * factor, &e)
        elif recipe == RECIPE_TORCHAO:
            for j in range(count):
                codes[j] = <uint8_t>encode_e2m1_torchao(x[j] * factor, &e)
        else:
            for j in range(count):
                codes[j] = <uint8_t>encode_e2m1_modelopt(x[j] / factor, &e)
        return
    if recipe == RECIPE_TRANSFORMER_ENGINE:
        # mul.f32x2, cvt.rn.satfinite.e2m1x2.f32 (NaN -> +6)
        for j in range(count):
            codes[j * stride] = <uint8_t>encode_small_float32(x[j * stride] * factor, &e)
    elif recipe == RECIPE_TORCHAO:
        # data_hp * reciprocal_scale; clamp to +-F4_E2M1_MAX; f32_to_f4_unpacked
        for j in range(count):
            codes[j * stride] = <uint8_t>encode_e2m1_torchao(x[j * stride] * factor, &e)
    else:
        # input / (scale.float() * wsf2); _cast_fp4
        for j in range(count):
            codes[j * stride] = <uint8_t>encode_e2m1_modelopt(x[j * stride] / factor, &e)


cdef inline uint32_t abs_max_bits(const float* x, Py_ssize_t count, Py_ssize_t stride,
                                  uint32_t* finite_max) noexcept nogil:
    # max |x| on the bits (non-negative floats order as their bits): the maximum of all
    # magnitudes (a NaN, above 0x7F800000, wins: torch.amax) and, in finite_max, of the
    # non-NaN ones (fmaxf from 0: a NaN never wins). Integer maxima vectorize; fmaxf does not.
    cdef Py_ssize_t j
    cdef uint32_t a, m_all = 0, m_num = 0
    if stride == 1:
        for j in range(count):
            a = float_bits(x[j]) & 0x7FFFFFFF
            m_all = a if a > m_all else m_all
            a = a if a <= 0x7F800000 else 0
            m_num = a if a > m_num else m_num
        finite_max[0] = m_num if m_num > finite_max[0] else finite_max[0]
        return m_all
    for j in range(count):
        a = float_bits(x[j * stride]) & 0x7FFFFFFF
        m_all = a if a > m_all else m_all
        a = a if a <= 0x7F800000 else 0
        m_num = a if a > m_num else m_num
    finite_max[0] = m_num if m_num > finite_max[0] else finite_max[0]
    return m_all


cdef inline float block_factor(const NVFP4Plan* p, float amax, bint nan_seen, int* scale_code) noexcept nogil:
    # The e4m3 block scale (into scale_code) and the factor the elements are multiplied
    # (TE, torchao) or divided (ModelOpt) by.
    cdef float s, factor, decoded
    cdef float six = 6.0
    cdef float one = 1.0
    cdef float e4m3_min_normal = 0.015625  # torch.finfo(torch.float8_e4m3fn).tiny, 2**-6
    cdef float e4m3_max = 448.0
    if p.recipe == RECIPE_TRANSFORMER_ENGINE:
        # compute_decoding_scaling_factor: block_amax * (S_enc * fp4_max_inv), fminf
        # FLT_MAX, cast with __NV_SATFINITE; then the "correct" encode factor
        # fminf(1.0f / (float(S_dec_b_fp8) * S_dec), FLT_MAX).
        s = amax * p.scale_multiplier
        s = fminf(s, FLT_MAX)
        scale_code[0] = encode_small_float32(s, &p.e4m3)
        decoded = decode_small_float32(<uint32_t>scale_code[0], &p.e4m3_decoder)
        factor = decoded * p.global_scale
        factor = one / factor
        return fminf(factor, FLT_MAX)
    if nan_seen:
        amax = NAN  # torch.amax propagates NaN
    if p.recipe == RECIPE_TORCHAO:
        # block_scale = max_abs / F4_E2M1_MAX; / per_tensor_scale; clamp to
        # [E4M3_EPS, F8E4M3_MAX] (NaN passes torch.clamp); .to(float8_e4m3fn);
        # reciprocal_scale = (1.0 / per_tensor_scale) / scaled_block_scales_fp32.
        s = amax / six
        s = s / p.global_scale
        if not isnan(s):
            s = fminf(fmaxf(s, e4m3_min_normal), e4m3_max)
        scale_code[0] = encode_small_float32(s, &p.e4m3)
        decoded = decode_small_float32(<uint32_t>scale_code[0], &p.e4m3_decoder)
        return p.inverse_global / decoded
    # per_block_scale = per_block_amax / (6.0 * wsf2); == 0 -> 1.0; .to(e4m3fn) without a
    # clamp; the divisor is float(e4m3) * wsf2.
    s = amax / p.six_global
    if s == 0.0:
        s = 1.0
    scale_code[0] = encode_small_float32(s, &p.e4m3)
    decoded = decode_small_float32(<uint32_t>scale_code[0], &p.e4m3_decoder)
    return decoded * p.global_scale


cdef void nvfp4_task(const void* work, Py_ssize_t task) noexcept nogil:
    cdef const NVFP4Work* w = <const NVFP4Work*>work
    cdef const NVFP4Plan* p = &w.plan
    cdef Py_ssize_t chunk = task % p.block_chunks
    cdef Py_ssize_t group = task // p.block_chunks
    cdef Py_ssize_t og = group // p.inner_groups
    cdef Py_ssize_t ig = group % p.inner_groups
    cdef Py_ssize_t o0 = og * p.tile_outer
    cdef Py_ssize_t o1 = min(o0 + p.tile_outer, p.outer)
    cdef Py_ssize_t i0 = ig * p.tile_inner
    cdef Py_ssize_t i1 = min(i0 + p.tile_inner, p.inner)
    cdef Py_ssize_t kb0 = chunk * BLOCKS_PER_TASK
    cdef Py_ssize_t kb1 = min(kb0 + BLOCKS_PER_TASK, p.n_blocks)
    cdef Py_ssize_t kb, k0, k1, o, i, at
    cdef uint32_t all_max, finite_max
    cdef float factor
    cdef int scale_code = 0
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK
        k1 = min(k0 + BLOCK, p.length)
        # 1. The block (or tile) amax: its rows along the blocked axis, stride `inner`.
        all_max = 0
        finite_max = 0
        for o in range(o0, o1):
            for i in range(i0, i1):
                at = (o * p.length + k0) * p.inner + i
                all_max = max(all_max, abs_max_bits(w.x + at, k1 - k0, p.inner, &finite_max))
        if bits_float(finite_max) < p.x_min_normal:
            # flush_inputs: a block whose largest non-NaN magnitude is subnormal holds only
            # zeros once flushed (NaN detection is unchanged: all_max)
            finite_max = 0
        # 2. The e4m3 block scale and the element factor. TransformerEngine reduces with
        # fmaxf from 0 (a NaN element never wins); torch.amax propagates NaN.
        factor = block_factor(p, bits_float(finite_max), all_max > 0x7F800000, &scale_code)
        # 3. The elements, and the scale repeated over the tile's rows (TransformerEngine's
        # 2-D layout: one scale per row of each 16-element block).
        for o in range(o0, o1):
            for i in range(i0, i1):
                at = (o * p.length + k0) * p.inner + i
                if p.datapath_loop:
                    encode_run_datapath(w.x + at, w.codes + at, w.words + at if w.words != NULL else NULL,
                                        k1 - k0, p.inner, factor, p)
                else:
                    encode_run(w.x + at, w.codes + at, k1 - k0, p.inner, factor, p.recipe, &p.e2m1)
                w.scales[(o * p.n_blocks + kb) * p.inner + i] = <uint8_t>scale_code


_RECIPES = {"transformer_engine": RECIPE_TRANSFORMER_ENGINE, "torchao": RECIPE_TORCHAO,
            "modelopt": RECIPE_MODELOPT}


cdef class NVFP4Config:
    """One NVFP4 quantization, as qemu_q/ops/nvfp4.py decides it; every field is checked here."""
    cdef NVFP4Plan plan

    def __init__(self, *, str recipe, Py_ssize_t outer, Py_ssize_t length, Py_ssize_t inner,
                 Py_ssize_t tile_outer, Py_ssize_t tile_inner, float global_amax,
                 int rounding=DP_HALF_EVEN, float x_min_normal=0.0, bint flush_outputs=False):
        if recipe not in _RECIPES:
            raise ValueError(f"NVFP4Config: unknown recipe {recipe!r}; known {', '.join(_RECIPES)}")
        if outer < 0 or length < 0 or inner < 0:
            raise ValueError(f"NVFP4Config: negative layout ({outer}, {length}, {inner})")
        if tile_outer not in (1, BLOCK) or tile_inner not in (1, BLOCK) or (tile_outer > 1 and tile_inner > 1):
            raise ValueError(f"NVFP4Config: tiles span 1 or 16 along one side, got {tile_outer} x {tile_inner}")
        if not (global_amax >= 0.0 or global_amax != global_amax):
            raise ValueError(f"NVFP4Config: global_amax={global_amax} is negative")
        if not DP_HALF_EVEN <= rounding <= DP_STOCHASTIC:
            raise ValueError(f"NVFP4Config: rounding code {rounding}; allowed {DP_HALF_EVEN}..{DP_STOCHASTIC}")
        if not 0.0 <= x_min_normal <= 2.0 ** -14:
            raise ValueError(f"NVFP4Config: x_min_normal={x_min_normal}; allowed 0 (no flush), "
                             "2**-126 (float32, bfloat16 x) or 2**-14 (float16 x)")
        p = &self.plan
        p.rounding = rounding
        p.x_min_normal = x_min_normal
        p.flush_outputs = flush_outputs
        # the default (half_even, keep) runs the recipes' own vectorized loops
        p.datapath_loop = rounding != DP_HALF_EVEN or x_min_normal != 0.0 or flush_outputs
        p.recipe = _RECIPES[recipe]
        p.outer = outer
        p.length = length
        p.inner = inner
        p.n_blocks = (length + BLOCK - 1) // BLOCK
        p.tile_outer = tile_outer
        p.tile_inner = tile_inner
        p.outer_groups = (outer + tile_outer - 1) // tile_outer
        p.inner_groups = (inner + tile_inner - 1) // tile_inner
        p.block_chunks = max(1, (p.n_blocks + BLOCKS_PER_TASK - 1) // BLOCKS_PER_TASK)
        global_parameters(p, global_amax)
        # TransformerEngine casts with __NV_SATFINITE; torch's .to(float8_e4m3fn) gives NaN
        # (0x7F) beyond 464 (torchao clamps first, ModelOpt does not).
        p.e4m3 = small_float32_encoder(SF_E4M3FN, p.recipe == RECIPE_TRANSFORMER_ENGINE, 0)
        p.e4m3_decoder = small_float32_decoder(SF_E4M3FN)
        # satfinite float4: beyond +-6 gives +-6, NaN +6 (0x7) unless the recipe says otherwise
        p.e2m1 = small_float32_encoder(SF_E2M1, True, 0)

    @property
    def global_scale(self):
        return self.plan.global_scale

    @property
    def n_scales(self):
        return self.plan.outer * self.plan.n_blocks * self.plan.inner


def global_scale(str recipe, float global_amax):
    """The float32 decode scale a recipe derives from the tensor amax (the scale of the
    outer DequantizeLinear)."""
    cdef NVFP4Plan p
    if recipe not in _RECIPES:
        raise ValueError(f"global_scale: unknown recipe {recipe!r}; known {', '.join(_RECIPES)}")
    p.recipe = _RECIPES[recipe]
    global_parameters(&p, global_amax)
    return p.global_scale


def quantize(const float[::1] x, uint8_t[::1] codes, uint8_t[::1] scales, NVFP4Config config,
             int n_threads, const uint32_t[::1] random_bits=None):
    """codes (one float4e2m1 code per byte) and block scales (float8e4m3fn bytes) of x;
    random_bits (one word per element) with the datapath rounding "stochastic"."""
    cdef NVFP4Work work
    cdef Py_ssize_t n
    work.plan = config.plan
    n = work.plan.outer * work.plan.length * work.plan.inner
    if x.shape[0] != n or codes.shape[0] != n:
        raise ValueError(f"quantize: x has {x.shape[0]} and codes {codes.shape[0]} elements; the layout has {n}")
    if scales.shape[0] != config.n_scales:
        raise ValueError(f"quantize: scales has {scales.shape[0]} bytes; the layout has {config.n_scales} blocks")
    if (config.plan.rounding == DP_STOCHASTIC) != (random_bits is not None):
        raise ValueError("quantize: random_bits go with the rounding 'stochastic', and only with it")
    if random_bits is not None and random_bits.shape[0] != n:
        raise ValueError(f"quantize: random_bits has {random_bits.shape[0]} words; x has {n} elements")
    work.words = NULL
    if n == 0:
        return
    if random_bits is not None:
        work.words = &random_bits[0]
    check_aligned(&x[0], 4, "x")
    work.x = &x[0]
    work.codes = &codes[0]
    work.scales = &scales[0]
    with nogil:
        run_tasks(nvfp4_task, &work,
                  work.plan.outer_groups * work.plan.inner_groups * work.plan.block_chunks, n_threads)
