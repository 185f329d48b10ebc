# What the kernels were compiled with, asked of the compiled code itself rather than of
# the build's records.

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
    """
    int qemu_q_openmp_compiled() nogil
    int qemu_q_max_threads() nogil


def openmp_compiled():
    """True when this extension was compiled with OpenMP."""
    return bool(qemu_q_openmp_compiled())


def max_threads():
    """The OpenMP runtime's default team size (1 without OpenMP)."""
    return qemu_q_max_threads()
