# Cimported by every kernel module so that the C compiler itself refuses a build whose
# flags let it change floating-point results: setup.py checks the flags it is given, this
# catches the rest (a compiler default, a flag from a wrapper script or a spec file).
# GCC, clang and MSVC define these macros for fast math and its parts; nothing is defined
# for FP contraction under gcc or clang, which setup.py's check and -ffp-contract=off cover.

cdef extern from *:
    """
    #if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__) \\
        || defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) \\
        || defined(__NO_SIGNED_ZEROS__) || defined(_M_FP_FAST) || defined(_M_FP_CONTRACT)
    #error "qemu_q must not be built with fast-math or FP contraction: its results must be bit-exact IEEE arithmetic (remove -ffast-math, -Ofast, -funsafe-math-optimizations, /fp:fast or the like)"
    #endif
    """
