from _fpenv cimport fp_state, fp_enter, fp_leave

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


cdef class DefaultFloatingPoint:
    """`with DefaultFloatingPoint():` runs its body in the default floating-point
    environment (_fpenv.pxd) on the calling thread, then restores the caller's: the
    numpy arithmetic of the Python layer (parameter conversions, DynamicQuantizeLinear's
    scale) must not read the caller's FTZ/DAZ or rounding mode either. One instance per
    use: each holds the state it restores."""
    cdef fp_state saved
    cdef bint entered

    def __enter__(self):
        if self.entered:
            raise RuntimeError("DefaultFloatingPoint is not reentrant; use a new instance")
        self.saved = fp_enter()
        self.entered = True
        return self

    def __exit__(self, exc_type, exc, traceback):
        fp_leave(self.saved)
        return False


# The kernels' enumerations, exported once from their .pxd definitions: the Python layer
# (qemu_q/_dtypes.py, the plans) reads them from here instead of copying the numbers.
from _codecs cimport (
    FMT_FLOAT32, FMT_FLOAT16, FMT_BFLOAT16, FMT_INT32, CODE_INTEGER, CODE_SMALL_FLOAT,
    SF_E4M3FN, SF_E4M3FNUZ, SF_E5M2, SF_E5M2FNUZ, SF_E2M1, SF_E2M3, SF_E3M2, SF_FAMILY,
    PATH_GENERAL, PATH_F32_INTEGER, PATH_F32_SMALL_FLOAT, SF_RULE_NAN_SIGN, SF_RULE_FNUZ_INF_NAN,
    SF_RULE_NAN_NEGATIVE_ZERO, SF_RULE_NAN_OPPOSITE_ZERO, CAST_FLOAT64, CAST_FLOAT32, CAST_FLOAT16, CAST_BFLOAT16,
    CAST_SMALL_FLOAT, CAST_E8M0, CAST_SIGNED, CAST_UNSIGNED, CAST_BOOL, CAST_PATH_GENERAL,
    CAST_PATH_F32_SMALL_FLOAT, CAST_PATH_F32_E8M0, CAST_PATH_SMALL_FLOAT_DATAPATH,
    CAST_PATH_F32_F16, CAST_PATH_F32_BF16, CAST_PATH_F32_INTEGER, CAST_PATH_F16_F32,
    CAST_PATH_BF16_F32, CAST_PATH_HALF_DATAPATH, E8M0_UP, E8M0_DOWN, E8M0_NEAREST,
)
from _layout cimport PER_TENSOR, PER_AXIS, BLOCKED

ENUMS = {
    "FMT_FLOAT32": FMT_FLOAT32, "FMT_FLOAT16": FMT_FLOAT16, "FMT_BFLOAT16": FMT_BFLOAT16,
    "FMT_INT32": FMT_INT32,
    "CODE_INTEGER": CODE_INTEGER, "CODE_SMALL_FLOAT": CODE_SMALL_FLOAT,
    "SF_E4M3FN": SF_E4M3FN, "SF_E4M3FNUZ": SF_E4M3FNUZ, "SF_E5M2": SF_E5M2,
    "SF_E5M2FNUZ": SF_E5M2FNUZ, "SF_E2M1": SF_E2M1, "SF_E2M3": SF_E2M3, "SF_E3M2": SF_E3M2,
    "SF_FAMILY": SF_FAMILY,
    "PATH_GENERAL": PATH_GENERAL, "PATH_F32_INTEGER": PATH_F32_INTEGER,
    "PATH_F32_SMALL_FLOAT": PATH_F32_SMALL_FLOAT,
    "SF_RULE_NAN_SIGN": SF_RULE_NAN_SIGN, "SF_RULE_FNUZ_INF_NAN": SF_RULE_FNUZ_INF_NAN,
    "PER_TENSOR": PER_TENSOR, "PER_AXIS": PER_AXIS, "BLOCKED": BLOCKED,
    "SF_RULE_NAN_NEGATIVE_ZERO": SF_RULE_NAN_NEGATIVE_ZERO,
    "SF_RULE_NAN_OPPOSITE_ZERO": SF_RULE_NAN_OPPOSITE_ZERO,
    "CAST_FLOAT64": CAST_FLOAT64, "CAST_FLOAT32": CAST_FLOAT32, "CAST_FLOAT16": CAST_FLOAT16,
    "CAST_BFLOAT16": CAST_BFLOAT16, "CAST_SMALL_FLOAT": CAST_SMALL_FLOAT, "CAST_E8M0": CAST_E8M0,
    "CAST_SIGNED": CAST_SIGNED, "CAST_UNSIGNED": CAST_UNSIGNED, "CAST_BOOL": CAST_BOOL,
    "CAST_PATH_GENERAL": CAST_PATH_GENERAL, "CAST_PATH_F32_SMALL_FLOAT": CAST_PATH_F32_SMALL_FLOAT,
    "CAST_PATH_F32_E8M0": CAST_PATH_F32_E8M0,
    "CAST_PATH_SMALL_FLOAT_DATAPATH": CAST_PATH_SMALL_FLOAT_DATAPATH,
    "CAST_PATH_F32_F16": CAST_PATH_F32_F16, "CAST_PATH_F32_BF16": CAST_PATH_F32_BF16,
    "CAST_PATH_F32_INTEGER": CAST_PATH_F32_INTEGER, "CAST_PATH_F16_F32": CAST_PATH_F16_F32,
    "CAST_PATH_BF16_F32": CAST_PATH_BF16_F32,
    "CAST_PATH_HALF_DATAPATH": CAST_PATH_HALF_DATAPATH,
    "E8M0_UP": E8M0_UP, "E8M0_DOWN": E8M0_DOWN, "E8M0_NEAREST": E8M0_NEAREST,
}
