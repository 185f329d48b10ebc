from libc.stdint cimport int32_t, uint32_t, uintptr_t

# Memory-traffic helpers: software prefetch of the kernels' input streams, and streaming
# (non-temporal) stores for DequantizeLinear's large outputs.
#
# Prefetch: the QuantizeLinear kernels walk their input PREFETCH_BLOCK elements at a time
# and prefetch the block PREFETCH_AHEAD elements further on: the hardware prefetchers
# alone lose the stream at page boundaries when a loop also reads per-element scales
# (per-axis along the last axis). The prefetch is non-temporal (locality 0): the input is
# read once, and the per-element scales it would otherwise push out of L1 stay there.
# DequantizeLinear reads one byte per element and writes four: the hardware prefetchers
# keep up with its codes, so they are not prefetched.
#
# Streaming stores: DequantizeLinear writes 2 or 4 bytes per 1-byte code. Through plain
# stores those output lines pass through L1 and push the per-element scales out, so they
# are computed into an L1-resident buffer and streamed out, or, where an AVX2 or AVX-512
# loop computes them (pyx/_dequantize.pyx: stream_integer_values and the datapath's
# fused_stream loops), streamed straight from the registers. QuantizeLinear's outputs are
# 4 to 16 times smaller than its input and stay plain stores, except its integer codes
# with one scale per run, streamed straight from the registers by an AVX-512 loop
# (pyx/_quantize.pyx: stream_integer_codes). Only outputs of STREAM_MIN_BYTES or more are
# streamed: a smaller one is better left in the caches for the caller that reads it next.
# Only how the bytes reach memory changes, never a value. docs/performance.md has the
# measurements behind each choice.

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>

    /* Prefetch the lines of [p, p + n) for a single read (prefetchnta on x86): a hint
       that never faults, even beyond the end of an array. */
    static inline void qemu_q_prefetch(const void *p, size_t n) {
    #if defined(__GNUC__) || defined(__clang__)
        const char *c = (const char *)p;
        size_t i;
        for (i = 0; i < n; i += 64) __builtin_prefetch(c + i, 0, 0);
    #else
        (void)p; (void)n;
    #endif
    }

    /* How far ahead the stochastic loops ask for their inputs (prefetcht0 on x86): with the
       hardware prefetchers alone those loops waited on the random words, their largest
       stream (docs/performance.md). prefetch_run: the lines of the next run of n float32
       elements of x and of the words. Runs of QEMU_Q_PREFETCH_RUN elements; Cast's loops
       into the small floats and float16 take them at the AVX-512 level only
       (QEMU_Q_PREFETCH_RUN_SMALL 0: no runs): elsewhere their compute-bound loops lost
       more to the runs' overheads than the prefetches gave. */
    #define QEMU_Q_PREFETCH_AHEAD 2048
    #define QEMU_Q_PREFETCH_RUN 64
    #if defined(__AVX512F__)
    #define QEMU_Q_PREFETCH_RUN_SMALL 64
    #else
    #define QEMU_Q_PREFETCH_RUN_SMALL 0
    #endif
    static inline void qemu_q_prefetch_run(const float *x, const uint32_t *words, size_t n) {
    #if defined(__GNUC__) || defined(__clang__)
        size_t k;
        for (k = 0; k < n * 4; k += 64) {
            __builtin_prefetch((const char *)x + QEMU_Q_PREFETCH_AHEAD + k, 0, 3);
            __builtin_prefetch((const char *)words + QEMU_Q_PREFETCH_AHEAD + k, 0, 3);
        }
    #else
        (void)x; (void)words; (void)n;
    #endif
    }

    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #include <immintrin.h>
    #if defined(__AVX512F__)
    #define QEMU_Q_STREAM_WIDTH 64
    #elif defined(__AVX__)
    #define QEMU_Q_STREAM_WIDTH 32
    #else
    #define QEMU_Q_STREAM_WIDTH 16
    #endif
    /* Copy n bytes to dst with streaming stores (plain ones for the unaligned head and
       the tail). */
    static inline void qemu_q_stream_store(void *dst, const void *src, size_t n) {
        char *d = (char *)dst;
        const char *s = (const char *)src;
        size_t head = (size_t)(-(uintptr_t)d) & (QEMU_Q_STREAM_WIDTH - 1);
        if (head > n) head = n;
        memcpy(d, s, head);
        d += head; s += head; n -= head;
        for (; n >= QEMU_Q_STREAM_WIDTH; n -= QEMU_Q_STREAM_WIDTH, d += QEMU_Q_STREAM_WIDTH, s += QEMU_Q_STREAM_WIDTH) {
    #if defined(__AVX512F__)
            _mm512_stream_si512((__m512i *)d, _mm512_loadu_si512((const void *)s));
    #elif defined(__AVX__)
            _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
    #else
            _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    #endif
        }
        memcpy(d, s, n);
    }
    /* Streaming stores are weakly ordered: fence them before the thread team's barrier
       publishes the output. */
    static inline void qemu_q_stream_fence(void) { _mm_sfence(); }
    #define QEMU_Q_HAVE_STREAM 1
    #else
    static inline void qemu_q_stream_store(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
    static inline void qemu_q_stream_fence(void) { }
    #define QEMU_Q_HAVE_STREAM 0
    #endif
    """
    void prefetch "qemu_q_prefetch" (const void* p, size_t n) noexcept nogil
    void prefetch_run "qemu_q_prefetch_run" (const float* x, const uint32_t* words, size_t n) noexcept nogil
    enum: PREFETCH_RUN "QEMU_Q_PREFETCH_RUN"
    enum: PREFETCH_RUN_SMALL "QEMU_Q_PREFETCH_RUN_SMALL"
    void stream_store "qemu_q_stream_store" (void* dst, const void* src, size_t n) noexcept nogil
    void stream_fence "qemu_q_stream_fence" () noexcept nogil
    enum: HAVE_STREAM "QEMU_Q_HAVE_STREAM"


cdef enum:
    PREFETCH_BLOCK = 512
    PREFETCH_AHEAD = 1024
    # Outputs of at least this many bytes are streamed (where the CPU has streaming stores).
    STREAM_MIN_BYTES = 1 << 23
    # Elements computed into the L1-resident buffer per streamed piece (a multiple of 8):
    # 2 KiB of float32, the best of 512 to 4096 on per-axis output.
    STREAM_PIECE = 512


cdef inline Py_ssize_t line_head(const void* p, size_t element_size) noexcept nogil:
    # Elements from p to the next 64-byte line (0 where p starts one; p aligned to its
    # element size): the plain-store head before a run of whole streamed lines.
    return <Py_ssize_t>((-<uintptr_t>p) & 63) // <Py_ssize_t>element_size


cdef inline int check_aligned(const void* data, size_t element_size, str argument) except -1:
    # The vector loops, and the head/line split of the streamed ones, assume every array is
    # aligned to its element size (the Python layer guarantees it, copying where a caller's
    # buffer is not): checked here so that no caller can break that assumption.
    if (<size_t>data) % element_size != 0:
        raise ValueError(f"{argument} is not aligned to its {element_size}-byte elements")
    return 0


cdef inline const uint32_t* random_words(object random_bits, bint stochastic, Py_ssize_t size,
                                         str where) except? NULL:
    # A stochastic datapath's words, one per element, read in place (the caller keeps the
    # array alive for the call); NULL for other roundings and for an empty x.
    cdef const uint32_t[::1] words
    if not stochastic:
        if random_bits is not None:
            raise ValueError(f"{where}random_bits are read by stochastic rounding only")
        return NULL
    if random_bits is None:
        raise ValueError(f"{where}stochastic rounding needs random_bits, one uint32 word per element")
    words = random_bits
    if words.shape[0] != size:
        raise ValueError(f"{where}random_bits has {words.shape[0]} words; x has {size} elements")
    if size == 0:
        return NULL
    check_aligned(&words[0], sizeof(uint32_t), "random_bits")
    return &words[0]


# The scale and zero-point arrays of a call, as the pointers a kernel's plan holds. The
# Python layer passes the dtype each path reads (qemu_q/_params.py); a pointer a path does
# not read points at one zero instead of NULL, so that no loop ever forms an address from
# NULL. The caller keeps the arrays alive for the call.
cdef extern from *:
    """
    static const double qemu_q_no_double[1] = {0.0};
    static const float qemu_q_no_float[1] = {0.0f};
    static const int32_t qemu_q_no_int32[1] = {0};
    """
    const double NO_DOUBLE "qemu_q_no_double" [1]
    const float NO_FLOAT "qemu_q_no_float" [1]
    const int32_t NO_INT32 "qemu_q_no_int32" [1]


cdef inline const double* float64_parameters(object values, Py_ssize_t needed, str what) except NULL:
    cdef const double[::1] view = values
    if view.shape[0] < needed:
        raise ValueError(f"this path needs {needed} float64 {what}, got {view.shape[0]}")
    return &view[0]


cdef inline const float* float32_parameters(object values, Py_ssize_t needed, str what) except NULL:
    cdef const float[::1] view = values
    if view.shape[0] < needed:
        raise ValueError(f"this path needs {needed} float32 {what}, got {view.shape[0]}")
    return &view[0]


cdef inline const int32_t* int32_parameters(object values, Py_ssize_t needed, str what) except NULL:
    cdef const int32_t[::1] view = values
    if view.shape[0] < needed:
        raise ValueError(f"this path needs {needed} int32 {what}, got {view.shape[0]}")
    return &view[0]
