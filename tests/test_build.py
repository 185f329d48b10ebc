"""The build's safety rails: setup.py refuses flags that could change a result bit, the C
compiler refuses a fast-math build through pyx/_fp_guard.pxd, and the OpenMP probe goes
through the setuptools compiler object."""

import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUARD_MESSAGE = "qemu_q must not be built with fast-math"

# Each spelling setup.py must refuse, as one word of a variable.
UNSAFE = [
    "-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-ffinite-math-only",
    "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-fapprox-func",
    "-fno-honor-nans", "-fno-honor-infinities", "-fcx-limited-range", "-fcx-fortran-rules",
    "-fcomplex-arithmetic=basic", "-fsingle-precision-constant",
    "-ffp-contract=fast", "-ffp-contract=on", "-ffp-contract=fast-honor-pragmas",
    "-ffp-model=fast", "-ffp-model=aggressive", "-ffp-eval-method=extended",
    "-fdenormal-fp-math=preserve-sign", "-fdenormal-fp-math-f32=positive-zero,ieee",
    "-mdaz-ftz", "-mrecip", "-mrecip=all", "-mno-ieee-fp", "-mfpmath=387", "-mfpmath=sse,387",
    "-menable-unsafe-fp-math", "-fp-model=fast", "-fp-model=fast=2", "/fp:fast", "-fp:fast",
    "/fp:contract", "/Qfast_transcendentals", "/clang:-ffast-math",
]
SAFE = (
    "-O3 -O2 -g -march=native -mtune=native -mavx2 -fopenmp -ffp-contract=off -fno-fast-math "
    "-fno-rounding-math -frounding-math -fno-math-errno -fno-trapping-math -mfpmath=sse "
    "-fdenormal-fp-math=ieee -fno-finite-math-only -fsigned-zeros -fhonor-nans "
    "-fno-unsafe-math-optimizations -fp-model=precise /fp:precise /fp:strict /O2 /openmp"
)
# The flags that make gcc and clang define a macro the guard tests.
GUARDED = ["-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-ffinite-math-only",
           "-fno-signed-zeros", "-freciprocal-math"]


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module: its checks and build command, without running setup()."""
    spec = importlib.util.spec_from_file_location("qemu_q_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def c_compiler():
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        pytest.skip(f"no C compiler on PATH (looked for {cc[0] if cc else 'cc'!r})")
    return cc


@pytest.mark.parametrize("variable", ["QEMU_Q_ARCH_FLAGS", "CFLAGS", "CPPFLAGS", "LDFLAGS", "CC", "LDSHARED"])
@pytest.mark.parametrize("flag", UNSAFE)
def test_setup_refuses_unsafe_flag(setup_py, variable, flag):
    environ = {variable: f"-O2 {flag} -g"}
    assert setup_py.unsafe_fp_flags(environ) == [(variable, flag)]
    with pytest.raises(SystemExit) as refused:
        setup_py.check_fp_flags(environ)
    message = str(refused.value)
    assert variable in message and flag in message and "bit" in message


def test_setup_refuses_two_word_intel_spelling(setup_py):
    assert setup_py.unsafe_fp_flags({"CFLAGS": "-fp-model fast"}) == [("CFLAGS", "-fp-model fast")]


def test_setup_accepts_safe_flags(setup_py):
    environ = {variable: SAFE for variable in setup_py.CHECKED_VARIABLES}
    assert setup_py.unsafe_fp_flags(environ) == []
    setup_py.check_fp_flags(environ)


def test_setup_py_exits_with_the_message():
    env = dict(os.environ, CFLAGS="-O2 -ffast-math")
    ran = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode != 0
    assert "CFLAGS contains '-ffast-math'" in ran.stderr, ran.stderr


def guard_source():
    """The C text of pyx/_fp_guard.pxd's extern block, as Cython emits it."""
    text = (ROOT / "pyx" / "_fp_guard.pxd").read_text()
    block = re.search(r'"""(.*?)"""', text, re.S).group(1)
    return block.replace("\\\\", "\\")


def compile_c(cc, tmp_path, source, flags, *extra):
    src = tmp_path / "guard.c"
    src.write_text(source)
    return subprocess.run(cc + flags + list(extra) + ["-c", str(src), "-o", str(tmp_path / "guard.o")],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag", GUARDED)
def test_guard_stops_the_compiler(setup_py, tmp_path, flag):
    cc = c_compiler()
    program = "int main(void) { return 0; }\n"
    if compile_c(cc, tmp_path, program, [flag]).returncode != 0:
        pytest.skip(f"{cc[0]} does not know {flag}")
    failed = compile_c(cc, tmp_path, guard_source() + program, [flag])
    assert failed.returncode != 0
    assert GUARD_MESSAGE in failed.stderr, failed.stderr


def test_guard_passes_the_real_flags(setup_py, tmp_path):
    cc = c_compiler()
    built = compile_c(cc, tmp_path, guard_source() + "int main(void) { return 0; }\n", setup_py.GCC_COMPILE_ARGS)
    assert built.returncode == 0, built.stderr


def test_every_module_cimports_the_guard(setup_py):
    for name in setup_py.KERNEL_MODULES:
        text = (ROOT / "pyx" / f"{name}.pyx").read_text()
        assert re.search(r"^cimport _fp_guard\b", text, re.M), f"pyx/{name}.pyx does not cimport _fp_guard"


def test_generated_c_carries_the_guard(setup_py, tmp_path):
    """The C that Cython generated from each module (left in pyx/ by an in-tree build)
    holds the guard, and the preprocessor stops on it under -ffast-math."""
    generated = [ROOT / "pyx" / f"{name}.c" for name in setup_py.KERNEL_MODULES]
    if not all(path.exists() for path in generated):
        pytest.skip("no generated C in pyx/: build in place or pip install from this tree first")
    for path in generated:
        assert GUARD_MESSAGE in path.read_text(), f"{path.name} lacks the guard"
    cc = c_compiler()
    include = sysconfig.get_paths()["include"]
    preprocess = cc + ["-E", "-I", include, str(ROOT / "pyx" / "_dynamic.c"), "-o", os.devnull]
    assert subprocess.run(preprocess, capture_output=True, timeout=120).returncode == 0
    failed = subprocess.run(preprocess + ["-ffast-math"], capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and GUARD_MESSAGE in failed.stderr, failed.stderr


@pytest.fixture
def build_ext_command(setup_py):
    from setuptools import Distribution
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    c_compiler()
    dist = Distribution({"name": "qemu_q", "ext_modules": setup_py.extensions(), "cmdclass": {"build_ext": setup_py.BuildExt}})
    command = dist.get_command_obj("build_ext")
    command.finalize_options()
    command.compiler = new_compiler()
    customize_compiler(command.compiler)
    return command


def test_modules_compile_in_parallel_by_default(setup_py, build_ext_command):
    assert build_ext_command.parallel == setup_py.available_cores()


def test_openmp_probe_through_the_compiler_object(build_ext_command, tmp_path, monkeypatch):
    import qemu_q

    monkeypatch.delenv("QEMU_Q_DISABLE_OPENMP", raising=False)
    found = build_ext_command.openmp_flags(str(tmp_path))
    if qemu_q.openmp_enabled():
        assert found is not None, "the installed kernels use OpenMP, but the probe finds no flag"
    monkeypatch.setenv("QEMU_Q_DISABLE_OPENMP", "1")
    assert build_ext_command.openmp_flags(str(tmp_path)) is None


def test_unknown_isa_level_is_refused(build_ext_command, tmp_path, monkeypatch):
    monkeypatch.setenv("QEMU_Q_ISA_LEVELS", "x86-64-v3,bogus")
    with pytest.raises(SystemExit, match="bogus"):
        build_ext_command.isa_levels(str(tmp_path))


def test_unchanged_files_keep_their_time(setup_py, tmp_path):
    path = tmp_path / "generated.py"
    setup_py.write_if_changed(str(path), "X = 1\n")
    os.utime(path, ns=(1, 1))
    setup_py.write_if_changed(str(path), "X = 1\n")
    assert path.stat().st_mtime_ns == 1
    setup_py.write_if_changed(str(path), "X = 2\n")
    assert path.read_text() == "X = 2\n"


def test_signature_stamp_follows_the_target(setup_py, tmp_path):
    target, stamp = tmp_path / "module.so", str(tmp_path / "stamps" / "module.json")
    target.write_bytes(b"binary")
    setup_py.BuildExt._write_stamp(stamp, "abc", str(target))
    assert setup_py.BuildExt._stamp_matches(stamp, "abc", str(target))
    assert not setup_py.BuildExt._stamp_matches(stamp, "other flags", str(target))
    target.write_bytes(b"replaced")
    assert not setup_py.BuildExt._stamp_matches(stamp, "abc", str(target))
