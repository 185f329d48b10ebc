# What the kernels were compiled with, and what the CPU they run on supports, asked of the
# compiled code itself rather than of the build's records.

cimport _fp_guard  # refuses a fast-math build (see _fp_guard.pxd)

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int qemu_q_openmp_compiled(void) { return 1; }
    static int qemu_q_max_threads(void) { return omp_get_max_threads(); }
    #else
    static int qemu_q_openmp_compiled(void) { return 0; }
    static int qemu_q_max_threads(void) { return 1; }
    #endif

    /* x86-64 micro-architecture levels of the running CPU (and OS: the compiler's CPU
       model checks that the OS saves the AVX / AVX-512 state). 0 where unknown. */
    #if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
    static int qemu_q_cpu_supports_v3(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
            && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2")
            && __builtin_cpu_supports("avx");
    }
    static int qemu_q_cpu_supports_v4(void) {
        __builtin_cpu_init();
        return qemu_q_cpu_supports_v3() && __builtin_cpu_supports("avx512f")
            && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd")
            && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    }
    #else
    static int qemu_q_cpu_supports_v3(void) { return 0; }
    static int qemu_q_cpu_supports_v4(void) { return 0; }
    #endif
    """
    int qemu_q_openmp_compiled() nogil
    int qemu_q_max_threads() nogil
    int qemu_q_cpu_supports_v3() nogil
    int qemu_q_cpu_supports_v4() nogil


def openmp_compiled():
    """True when this extension was compiled with OpenMP."""
    return bool(qemu_q_openmp_compiled())


def max_threads():
    """The OpenMP runtime's default team size (1 without OpenMP)."""
    return qemu_q_max_threads()


def cpu_supports(level):
    """True when the running CPU (and OS) can execute code built for this x86-64 level."""
    if level == "x86-64-v3":
        return bool(qemu_q_cpu_supports_v3())
    if level == "x86-64-v4":
        return bool(qemu_q_cpu_supports_v4())
    return level == "baseline"
