"""Build the Cython kernels of qemu_q.

OpenMP is detected by compiling, linking and running a tiny parallel program through the
build's own compiler object (the approach of astropy's extension-helpers and
scikit-learn), trying the flags of gcc and clang, MSVC, and Apple clang with libomp in
turn. Without it the kernels are built serially and the build says so loudly;
`qemu_q.openmp_enabled()` reports which.

Environment switches:
  QEMU_Q_DEBUG=1        restore bounds checks and wraparound in every kernel
  QEMU_Q_DISABLE_OPENMP=1  build serial kernels even where OpenMP works
  QEMU_Q_ARCH_FLAGS     extra code-generation flags for every module, e.g.
                        "-march=native"; the default build stays portable
  QEMU_Q_ISA_LEVELS     the x86-64 levels to build the hot kernels for besides the
                        baseline, comma-separated (default "x86-64-v3,x86-64-v4"; "" for
                        none)

Bit-exactness: a flag that lets the compiler change a floating-point result (fast math,
FP contraction, flushing subnormals, ...) in QEMU_Q_ARCH_FLAGS, CFLAGS, CPPFLAGS, LDFLAGS,
CC or LDSHARED stops the build (UNSAFE_FP_FLAG), and pyx/_fp_guard.pxd, cimported by every
module, makes the C compiler refuse what slips past that check.

Instruction-set levels: the hot kernel modules (ISA_MODULES) are compiled once more for
each x86-64 micro-architecture level the compiler supports (x86-64-v3: AVX2; x86-64-v4:
AVX-512), as qemu_q._quantize_x86_64_v3 and so on, from the same .pyx through a generated
one-line stub. qemu_q/_kernels.py loads the best level the running CPU supports (the
baseline module otherwise), so a build stays portable while using the wide vectors where
they exist. The levels change the vector width only, never a bit of a result.

Speed of (re)builds: the modules compile in parallel, one per core, unless -j says
otherwise (pip passes none). A module is regenerated or recompiled only when what it is
made from changed: its Cython sources, the Cython version and directives for the C file;
the C file, the compiler command and the flags for the binary. These signatures live in
build/; file times are not used, because pip's isolated build environment installs a fresh
Cython (with fresh times on its .pxd files) for every `pip install`, which made the
second of the README's two commands rebuild everything.
"""

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_MODULES = ["_quantize", "_dequantize", "_cast", "_packing", "_dynamic", "_parallel", "_integer", "_mx",
                  "_nvfp4", "_requantize"]
# Built once more per instruction-set level (see the module docstring).
ISA_MODULES = ["_quantize", "_dequantize", "_cast", "_mx", "_nvfp4", "_integer", "_requantize"]
ISA_LEVELS = {"x86-64-v3": ["-march=x86-64-v3"], "x86-64-v4": ["-march=x86-64-v4"]}
ISA_STUB_DIR = os.path.join("build", "isa_src")
PYX_DIR = "pyx"

# Bit-exactness: IEEE semantics everywhere. -ffp-contract=off forbids fusing a*b+c into
# an FMA whose single rounding would differ from the two roundings we specify (clang
# contracts by default). -fno-math-errno lets nearbyint/fabs inline; it changes no value.
GCC_COMPILE_ARGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-fast-math"]
MSVC_COMPILE_ARGS = ["/O2", "/fp:precise"]

# Flags that allow a compiler to return other bits than IEEE arithmetic in the written
# order would, in gcc, clang, MSVC or Intel spelling. Link flags matter too: gcc links
# crtfastmath.o for -ffast-math, which sets flush-to-zero for the whole process.
UNSAFE_FP_FLAG = re.compile(
    r"""(?:/clang:)?(?:
        -Ofast
      | -ffast-math
      | -funsafe-math-optimizations
      | -ffinite-math-only
      | -fassociative-math
      | -freciprocal-math
      | -fapprox-func
      | -fno-signed-zeros
      | -fno-honor-nans
      | -fno-honor-infinities
      | -fcx-limited-range
      | -fcx-fortran-rules
      | -fcomplex-arithmetic=basic
      | -fsingle-precision-constant
      | -ffp-contract=(?:fast|on|fast-honor-pragmas)
      | -ffp-model=(?:fast|aggressive)
      | -ffp-eval-method=(?:double|extended)
      | -fdenormal-fp-math(?:-f32)?=.*(?:preserve-sign|positive-zero).*
      | -mdaz-ftz
      | -mrecip(?:=.*)?
      | -mno-ieee-fp
      | -mfpmath=(?!sse$).*
      | -menable-(?:unsafe-fp-math|no-infs|no-nans)
      | -fp-model[=:\ ]fast.*
      | [/-]fp:(?:fast|contract)
      | [/-]Qfast_transcendentals
    )""",
    re.VERBOSE,
)
CHECKED_VARIABLES = ("QEMU_Q_ARCH_FLAGS", "CFLAGS", "CPPFLAGS", "LDFLAGS", "CC", "LDSHARED")


def unsafe_fp_flags(environ=None):
    """[(variable, flag)] for every flag of CHECKED_VARIABLES that UNSAFE_FP_FLAG refuses."""
    environ = os.environ if environ is None else environ
    found = []
    for variable in CHECKED_VARIABLES:
        words = shlex.split(environ.get(variable, ""))
        # Intel's compilers also take "-fp-model fast" as two words.
        words += [f"{a} {b}" for a, b in zip(words, words[1:]) if a == "-fp-model"]
        found += [(variable, word) for word in words if UNSAFE_FP_FLAG.fullmatch(word)]
    return found


def check_fp_flags(environ=None):
    found = unsafe_fp_flags(environ)
    if found:
        listed = "; ".join(f"{variable} contains {flag!r}" for variable, flag in found)
        raise SystemExit(
            f"qemu_q: refusing to build: {listed}. qemu_q must reproduce IEEE results bit "
            "for bit, and this flag lets the compiler change them (fast math, FP "
            "contraction, flushed subnormals or excess precision). Remove it; vector "
            "width flags such as -march=native are fine."
        )


OPENMP_PROBE = textwrap.dedent(
    """
    #ifndef _OPENMP
    #error the OpenMP flag was accepted but did not enable OpenMP
    #endif
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
# (compile flags, link flags): gcc and clang; MSVC; Apple clang with Homebrew's libomp,
# whose include and library directories come from CPPFLAGS / LDFLAGS.
OPENMP_CANDIDATES = [
    (["-fopenmp"], ["-fopenmp"]),
    (["/openmp"], []),
    (["-Xpreprocessor", "-fopenmp"], ["-lomp"]),
]
OPENMP_MISSING = (
    "\n" + "#" * 78 + "\n"
    "# qemu_q: OpenMP was NOT found (the compile-and-run probe failed or was\n"
    "# disabled). Reverting to non-parallel code: the kernels will run on one\n"
    "# thread. Results are identical, only slower. qemu_q.openmp_enabled() will\n"
    "# return False.\n" + "#" * 78 + "\n"
)


def isa_suffix(level):
    return "_" + level.replace("-", "_")


def write_if_changed(path, text):
    """Write text to path unless it already holds it (keeping its time for make-like tools)."""
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def isa_stub(name, level):
    """A one-line .pyx that compiles pyx/<name>.pyx again under another module name."""
    path = os.path.join(ISA_STUB_DIR, name + isa_suffix(level) + ".pyx")
    write_if_changed(path, f'# Generated by setup.py: pyx/{name}.pyx built for {level}.\ninclude "{name}.pyx"\n')
    return path


def build_config_text(openmp, compile_args, debug, levels):
    return (
        '"""Generated by setup.py: how the kernels of this installation were built."""\n\n'
        f"OPENMP = {openmp!r}\n"
        f"COMPILE_ARGS = {tuple(compile_args)!r}\n"
        f"DEBUG = {debug!r}\n"
        f"ISA_LEVELS = {tuple(levels)!r}\n"
    )


def digest(*parts):
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def render_templates():
    """Expand every pyx/*.tp (Tempita, shipped with Cython) into the file it names: code
    that differs only by constants is generated rather than spelled out."""
    from Cython import Tempita

    for name in sorted(os.listdir(PYX_DIR)):
        if name.endswith(".tp"):
            path = os.path.join(PYX_DIR, name)
            with open(path) as f:
                text = Tempita.sub(f.read())
            write_if_changed(path[:-3], text)


def cython_sources_digest():
    # Every module may include or cimport any file of pyx/, so any change there
    # regenerates all of them (a few seconds).
    names = sorted(n for n in os.listdir(PYX_DIR) if n.endswith((".pyx", ".pxd", ".pxi")))
    return digest([(n, file_digest(os.path.join(PYX_DIR, n))) for n in names])


def available_cores():
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = available_cores()

    def run(self):
        self._build_config = None
        super().run()
        if self.inplace and self._build_config is not None:
            write_if_changed(os.path.join(HERE, "qemu_q", "_build_config.py"), self._build_config)

    # --- probes through the compiler object -------------------------------------------

    def _compiles(self, tmp, source, compile_args, link_args=None):
        """Whether source compiles with compile_args (and, given link_args, links and runs)."""
        from setuptools.errors import CompileError, LinkError

        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(source)
        try:
            objects = self.compiler.compile([src], output_dir=tmp, extra_postargs=compile_args)
            if link_args is None:
                return True
            ldflags = shlex.split(os.environ.get("LDFLAGS", ""))
            self.compiler.link_executable(objects, "probe", output_dir=tmp, extra_postargs=link_args + ldflags)
            exe = os.path.join(tmp, self.compiler.executable_filename("probe"))
            ran = subprocess.run([exe], capture_output=True, text=True, timeout=60)
            return ran.returncode == 0 and ran.stdout.strip().isdigit()
        except (CompileError, LinkError, OSError, subprocess.SubprocessError):
            return False

    def openmp_flags(self, tmp):
        """(compile_args, link_args) of the first OpenMP candidate that works, or None."""
        if os.environ.get("QEMU_Q_DISABLE_OPENMP"):
            return None
        for compile_args, link_args in OPENMP_CANDIDATES:
            if self._compiles(tmp, OPENMP_PROBE, compile_args, link_args):
                return compile_args, link_args
        return None

    def isa_levels(self, tmp):
        """The levels to build: requested, x86-64, and accepted by the compiler."""
        requested = os.environ.get("QEMU_Q_ISA_LEVELS", ",".join(ISA_LEVELS))
        names = [n.strip() for n in requested.split(",") if n.strip()]
        unknown = [n for n in names if n not in ISA_LEVELS]
        if unknown:
            raise SystemExit(f"QEMU_Q_ISA_LEVELS: unknown level(s) {unknown}; known: {list(ISA_LEVELS)}")
        if self.compiler.compiler_type == "msvc" or platform.machine().lower() not in ("x86_64", "amd64"):
            return []
        levels = []
        for name in names:
            if self._compiles(tmp, "int main(void) { return 0; }\n", ISA_LEVELS[name]):
                levels.append(name)
            else:
                print(f"qemu_q: the compiler does not accept {ISA_LEVELS[name]}; no {name} kernels", file=sys.stderr)
        return levels

    # --- configuration, generation, compilation -----------------------------------------

    def build_extensions(self):
        debug = bool(os.environ.get("QEMU_Q_DEBUG"))
        tmp = tempfile.mkdtemp(prefix="qemu_q_probe_")
        try:
            omp = self.openmp_flags(tmp)
            levels = self.isa_levels(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if omp is None:
            warnings.warn(OPENMP_MISSING)
            print(OPENMP_MISSING, file=sys.stderr)
            omp = [], []
        omp_compile, omp_link = omp

        msvc = self.compiler.compiler_type == "msvc"
        base = MSVC_COMPILE_ARGS if msvc else GCC_COMPILE_ARGS
        compile_args = base + shlex.split(os.environ.get("QEMU_Q_ARCH_FLAGS", "")) + omp_compile
        if debug:
            optimize, no_optimize = ("/O2", ["/Od", "/Zi"]) if msvc else ("-O3", ["-O0", "-g"])
            compile_args = [a for a in compile_args if a != optimize] + no_optimize

        wanted = {f"qemu_q.{name}": (os.path.join(PYX_DIR, name + ".pyx"), []) for name in KERNEL_MODULES}
        wanted.update(
            {f"qemu_q.{name}{isa_suffix(level)}": (isa_stub(name, level), ISA_LEVELS[level]) for name in ISA_MODULES for level in levels}
        )
        self.extensions = [ext for ext in self.extensions if ext.name in wanted]
        for ext in self.extensions:
            ext.sources = [wanted[ext.name][0]]
            ext.extra_compile_args = compile_args + wanted[ext.name][1]
            ext.extra_link_args = list(omp_link)
        self.cythonize(debug)

        config = build_config_text(bool(omp_compile), compile_args, debug, levels)
        write_if_changed(os.path.join(self.build_lib, "qemu_q", "_build_config.py"), config)
        self._build_config = config
        # The biggest modules first, so that no core is left with one big module at the end.
        self.extensions.sort(key=lambda ext: -os.path.getsize(ext.sources[0]))
        # Our signatures, not file times, decide what is recompiled (see the module docstring).
        self.requested_force, self.force = self.force, True
        super().build_extensions()

    def cythonize(self, debug):
        """Turn each extension's .pyx source into its C file, regenerating only what changed."""
        import Cython
        from Cython.Build import cythonize

        directives = {
            "language_level": 3,
            "boundscheck": debug,
            "wraparound": debug,
            "initializedcheck": debug,
            "cdivision": True,
            "nonecheck": False,
            "embedsignature": True,
        }
        render_templates()
        inputs = cython_sources_digest()
        stale = []
        for ext in self.extensions:
            pyx = ext.sources[0]
            c_file = os.path.splitext(pyx)[0] + ".c"
            signature = digest(inputs, file_digest(pyx), Cython.__version__, directives)
            stamp = self._stamp_path("c", c_file)
            if self.force or not os.path.exists(c_file) or not self._stamp_matches(stamp, signature, c_file):
                stale.append((ext, pyx, c_file, stamp, signature))
            ext.sources = [c_file]
        if stale:
            cythonize(
                [Extension(ext.name, [pyx]) for ext, pyx, _, _, _ in stale],
                compiler_directives=directives,
                include_path=[PYX_DIR],
                quiet=True,
                force=True,
                nthreads=min(int(self.parallel), len(stale)) if len(stale) > 1 else 0,
            )
            for _, _, c_file, stamp, signature in stale:
                self._write_stamp(stamp, signature, c_file)

    def build_extension(self, ext):
        ext_path = self.get_ext_fullpath(ext.name)
        compiler = {k: getattr(self.compiler, k, None) for k in ("compiler_type", "compiler_so", "linker_so", "cc", "linker")}
        signature = digest(
            [file_digest(s) for s in ext.sources], ext.extra_compile_args, ext.extra_link_args,
            ext.define_macros, ext.undef_macros, ext.include_dirs, ext.libraries, ext.library_dirs,
            self.include_dirs, self.library_dirs, self.libraries, self.debug, compiler,
            sys.implementation.cache_tag, sysconfig.get_config_var("EXT_SUFFIX"),
        )
        stamp = self._stamp_path("so", ext_path)
        if not self.requested_force and os.path.exists(ext_path) and self._stamp_matches(stamp, signature, ext_path):
            print(f"qemu_q: {ext.name} is up to date (same C file, compiler and flags)\n", end="", file=sys.stderr)
            return
        super().build_extension(ext)
        self._write_stamp(stamp, signature, ext_path)

    def _stamp_path(self, kind, target):
        name = hashlib.sha256(os.path.abspath(target).encode()).hexdigest()[:16]
        return os.path.join(self.build_temp, "qemu_q_signatures", f"{kind}-{os.path.basename(target)}-{name}.json")

    @staticmethod
    def _stamp_matches(stamp, signature, target):
        # The target's size and time guard against it being replaced behind our back.
        try:
            with open(stamp) as f:
                recorded = json.load(f)
            st = os.stat(target)
        except (OSError, ValueError):
            return False
        return recorded == {"signature": signature, "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    @staticmethod
    def _write_stamp(stamp, signature, target):
        st = os.stat(target)
        os.makedirs(os.path.dirname(stamp), exist_ok=True)
        with open(stamp, "w") as f:
            json.dump({"signature": signature, "size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)


def extensions():
    """Every module that may be built, with its Cython source; build_ext drops the levels
    the compiler rejects and sets the flags once it has a compiler to ask."""
    exts = [Extension(f"qemu_q.{name}", [os.path.join(PYX_DIR, name + ".pyx")], include_dirs=[PYX_DIR]) for name in KERNEL_MODULES]
    exts += [
        Extension(f"qemu_q.{name}{isa_suffix(level)}", [os.path.join(PYX_DIR, name + ".pyx")], include_dirs=[PYX_DIR])
        for name in ISA_MODULES
        for level in ISA_LEVELS
    ]
    return exts


if __name__ == "__main__":
    check_fp_flags()
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
