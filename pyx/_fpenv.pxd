# The floating-point environment the kernels compute in, whatever the caller's.
#
# The bits of every result assume IEEE round-to-nearest-even with subnormals honoured. A
# caller's thread may run with other settings: flush-to-zero / denormals-are-zero (what
# torch.set_flush_denormal(True) or a library built with -ffast-math sets), another
# rounding mode (fesetround), or unmasked exceptions. OpenMP worker threads keep the
# settings of the moment they were created. So every thread that computes for a kernel
# saves its settings, installs the default ones for the duration of its share, and
# restores them: `saved = fp_enter()` ... `fp_leave(saved)` around each thread's work.
#
# On x86-64 the SSE/AVX arithmetic reads MXCSR only (no x87 code is generated: there is
# no long double here), and 0x1F80 is its power-on value: every exception masked, round
# to nearest, FTZ and DAZ off. On AArch64, FPCR with the rounding mode, FZ and FZ16
# cleared. Elsewhere the C rounding mode, the one setting ISO C can reach.

cdef extern from *:
    """
    #if defined(__x86_64__) || defined(_M_X64) || (defined(__i386__) && defined(__SSE2__))
    #include <xmmintrin.h>
    typedef struct { unsigned int saved; } qemu_q_fp_state;
    static inline qemu_q_fp_state qemu_q_fp_enter(void) {
        qemu_q_fp_state s;
        s.saved = _mm_getcsr();
        _mm_setcsr(0x1F80);
        return s;
    }
    static inline void qemu_q_fp_leave(qemu_q_fp_state s) { _mm_setcsr(s.saved); }
    #elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
    typedef struct { unsigned long long saved; } qemu_q_fp_state;
    static inline qemu_q_fp_state qemu_q_fp_enter(void) {
        qemu_q_fp_state s;
        unsigned long long fpcr;
        __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
        s.saved = fpcr;
        /* RMode (bits 22-23) = nearest, FZ (24) and FZ16 (19) off, exception traps (8-15) off. */
        fpcr &= ~((3ULL << 22) | (1ULL << 24) | (1ULL << 19) | (0xFFULL << 8));
        __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
        return s;
    }
    static inline void qemu_q_fp_leave(qemu_q_fp_state s) {
        __asm__ __volatile__("msr fpcr, %0" : : "r"(s.saved));
    }
    #else
    #include <fenv.h>
    typedef struct { int saved; } qemu_q_fp_state;
    static inline qemu_q_fp_state qemu_q_fp_enter(void) {
        qemu_q_fp_state s;
        s.saved = fegetround();
        fesetround(FE_TONEAREST);
        return s;
    }
    static inline void qemu_q_fp_leave(qemu_q_fp_state s) { fesetround(s.saved); }
    #endif
    """
    ctypedef struct fp_state "qemu_q_fp_state":
        pass
    # The state is returned by value: assigned inside a parallel block, it is private to
    # each thread.
    fp_state fp_enter "qemu_q_fp_enter" () noexcept nogil
    void fp_leave "qemu_q_fp_leave" (fp_state state) noexcept nogil
