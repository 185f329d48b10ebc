# Software prefetch for the kernels' input streams.
#
# The kernels walk their input PREFETCH_BLOCK elements at a time and prefetch the block
# PREFETCH_AHEAD elements further on. The hardware prefetchers alone lose the stream at
# page boundaries when a loop also reads per-element scales (per-axis along the last
# axis), which then ran at half the bandwidth; the plain loops gain some 10% too. The
# prefetch is non-temporal (locality 0): the input is read once, and the per-element
# scales it would otherwise push out of L1 stay there (another 5-10% on per-axis).
#
# Tried and left out: non-temporal (streaming) stores of large outputs through an
# L1-resident buffer. On the machine of docs/performance.md they changed no timing (1 or 2
# threads, 16M to 64M elements), and they would evict from the caches an output the
# caller is about to read.

cdef extern from *:
    """
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
    """
    void prefetch "qemu_q_prefetch" (const void* p, size_t n) noexcept nogil


cdef enum:
    PREFETCH_BLOCK = 512
    PREFETCH_AHEAD = 1024
