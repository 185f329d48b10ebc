"""Build the Cython kernels of qemu_q.

OpenMP is detected by compiling, linking and running a tiny parallel program (the
approach of astropy's extension-helpers and scikit-learn). Without it the kernels are
built serially and the build says so loudly; `qemu_q.openmp_enabled()` reports which.

Environment switches:
  QEMU_Q_DEBUG=1        restore bounds checks and wraparound in every kernel
  QEMU_Q_DISABLE_OPENMP=1  build serial kernels even where OpenMP works
  QEMU_Q_ARCH_FLAGS     extra code-generation flags for every module, e.g.
                        "-march=native" (results do not depend on them: no fast-math, no FP
                        contraction); the default build stays portable
  QEMU_Q_ISA_LEVELS     the x86-64 levels to build the hot kernels for besides the
                        baseline, comma-separated (default "x86-64-v3,x86-64-v4"; "" for
                        none)

Instruction-set levels: the hot kernel modules (ISA_MODULES) are compiled once more for
each x86-64 micro-architecture level the compiler supports (x86-64-v3: AVX2; x86-64-v4:
AVX-512), as qemu_q._quantize_x86_64_v3 and so on, from the same .pyx through a generated
one-line stub. qemu_q/_kernels.py loads the best level the running CPU supports (the
baseline module otherwise), so a build stays portable while using the wide vectors where
they exist. The levels change the vector width only, never a bit of a result: IEEE
arithmetic, no contraction, no fast-math.
"""

import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import warnings

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNEL_MODULES = ["_quantize", "_dequantize", "_packing", "_dynamic", "_parallel"]
# Built once more per instruction-set level (see the module docstring).
ISA_MODULES = ["_quantize", "_dequantize"]
ISA_LEVELS = {"x86-64-v3": ["-march=x86-64-v3"], "x86-64-v4": ["-march=x86-64-v4"]}
ISA_STUB_DIR = os.path.join("build", "isa_src")

# Bit-exactness: IEEE semantics everywhere. -ffp-contract=off forbids fusing a*b+c into
# an FMA whose single rounding would differ from the two roundings we specify.
# -fno-math-errno lets nearbyint/fabs inline; it changes no value.
BASE_COMPILE_ARGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-fast-math"]

OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        printf("%d\\n", n);
        return n > 0 ? 0 : 1;
    }
    """
)


def _compiler_command():
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def openmp_flags():
    """Return (compile_args, link_args) for OpenMP, or None when the probe fails."""
    if os.environ.get("QEMU_Q_DISABLE_OPENMP"):
        return None
    compile_flag = "-fopenmp"
    extra_cflags = shlex.split(os.environ.get("CFLAGS", ""))
    extra_ldflags = shlex.split(os.environ.get("LDFLAGS", ""))
    tmp = tempfile.mkdtemp(prefix="qemu_q_omp_")
    try:
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        cmd = _compiler_command() + extra_cflags + [compile_flag, src, "-o", exe] + extra_ldflags + [compile_flag]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            return None
        ran = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        if ran.returncode != 0 or not ran.stdout.strip().isdigit():
            return None
        return [compile_flag], [compile_flag]
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def isa_levels(compiler_is_msvc=False):
    """The levels to build: requested, x86-64, and accepted by the compiler."""
    requested = os.environ.get("QEMU_Q_ISA_LEVELS", ",".join(ISA_LEVELS))
    names = [n.strip() for n in requested.split(",") if n.strip()]
    unknown = [n for n in names if n not in ISA_LEVELS]
    if unknown:
        raise SystemExit(f"QEMU_Q_ISA_LEVELS: unknown level(s) {unknown}; known: {list(ISA_LEVELS)}")
    if compiler_is_msvc or platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    tmp = tempfile.mkdtemp(prefix="qemu_q_isa_")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("int main(void) { return 0; }\n")
        levels = []
        for name in names:
            cmd = _compiler_command() + ISA_LEVELS[name] + ["-c", src, "-o", os.path.join(tmp, "probe.o")]
            try:
                if subprocess.run(cmd, capture_output=True).returncode == 0:
                    levels.append(name)
            except OSError:
                pass
            if name not in levels:
                print(f"qemu_q: the compiler does not accept {ISA_LEVELS[name]}; no {name} kernels", file=sys.stderr)
        return levels
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def isa_suffix(level):
    return "_" + level.replace("-", "_")


def isa_stub(name, level):
    """A one-line .pyx that compiles pyx/<name>.pyx again under another module name."""
    os.makedirs(ISA_STUB_DIR, exist_ok=True)
    path = os.path.join(ISA_STUB_DIR, name + isa_suffix(level) + ".pyx")
    text = f'# Generated by setup.py: pyx/{name}.pyx built for {level}.\ninclude "{name}.pyx"\n'
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    return path


def write_build_config(openmp, compile_args, levels=()):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qemu_q", "_build_config.py")
    with open(path, "w") as f:
        f.write('"""Generated by setup.py: how the kernels of this installation were built."""\n\n')
        f.write(f"OPENMP = {openmp!r}\n")
        f.write(f"COMPILE_ARGS = {tuple(compile_args)!r}\n")
        f.write(f"DEBUG = {bool(os.environ.get('QEMU_Q_DEBUG'))!r}\n")
        f.write(f"ISA_LEVELS = {tuple(levels)!r}\n")


def extensions():
    debug = bool(os.environ.get("QEMU_Q_DEBUG"))
    omp = openmp_flags()
    if omp is None:
        message = (
            "\n" + "#" * 78 + "\n"
            "# qemu_q: OpenMP was NOT found (the compile-and-run probe failed or was\n"
            "# disabled). Reverting to non-parallel code: the kernels will run on one\n"
            "# thread. Results are identical, only slower. qemu_q.openmp_enabled() will\n"
            "# return False.\n" + "#" * 78 + "\n"
        )
        warnings.warn(message)
        print(message, file=sys.stderr)
        omp_compile, omp_link = [], []
    else:
        omp_compile, omp_link = omp
    arch = shlex.split(os.environ.get("QEMU_Q_ARCH_FLAGS", ""))
    compile_args = BASE_COMPILE_ARGS + arch + omp_compile
    if debug:
        compile_args = [a for a in compile_args if a != "-O3"] + ["-O0", "-g"]
    levels = isa_levels(compiler_is_msvc=sys.platform == "win32" and "GCC" not in sys.version)
    write_build_config(omp is not None, compile_args, levels)

    def extension(module, source, extra_args=()):
        return Extension(
            f"qemu_q.{module}",
            [source],
            include_dirs=[numpy.get_include(), "pyx"],
            extra_compile_args=compile_args + list(extra_args),
            extra_link_args=omp_link,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        )

    exts = [extension(name, f"pyx/{name}.pyx") for name in KERNEL_MODULES]
    exts += [
        extension(name + isa_suffix(level), isa_stub(name, level), ISA_LEVELS[level])
        for name in ISA_MODULES
        for level in levels
    ]
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": debug,
        "initializedcheck": debug,
        "cdivision": True,
        "nonecheck": False,
        "embedsignature": True,
    }
    return cythonize(exts, compiler_directives=directives, include_path=["pyx"], quiet=True)


class BuildExt(build_ext):
    def build_extensions(self):
        # Compilers that are not gcc-compatible get no gcc-only flags.
        if self.compiler.compiler_type == "msvc":
            self.extensions = [ext for ext in self.extensions if ext.name.split(".")[-1] in KERNEL_MODULES]
            for ext in self.extensions:
                ext.extra_compile_args = ["/O2", "/fp:precise"] + (["/openmp"] if "-fopenmp" in ext.extra_compile_args else [])
                ext.extra_link_args = []
        super().build_extensions()


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
