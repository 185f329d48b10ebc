"""The public API's type hints (py.typed) are accepted by mypy, and they mean something:
a usage snippet type-checks, and misuse is reported line by line."""

import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("mypy", reason="the typing check needs mypy (in the test extra)")

REPO = pathlib.Path(__file__).resolve().parents[1]
SNIPPETS = pathlib.Path(__file__).resolve().parent / "typing"
# The modules that define what qemu_q.__all__ exports.
PUBLIC_MODULES = [
    "__init__.py", "qparams.py", "ops/__init__.py", "ops/quantize_linear.py",
    "ops/dequantize_linear.py", "ops/dynamic_quantize_linear.py", "_pack.py", "_registry.py",
    "_threads.py", "_dtypes.py", "_opspec.py", "_typing.py",
]


def mypy(package_home, tmp_path, *files):
    # Run where the package under test lives (the source tree or site-packages), so that
    # `import qemu_q` finds it and its py.typed; the configuration is the project's.
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
               "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", *map(str, files)]
    return subprocess.run(command, cwd=package_home, capture_output=True, text=True)


def test_py_typed_marker_is_shipped(package_home):
    assert (package_home / "qemu_q" / "py.typed").is_file()
    assert 'qemu_q = ["py.typed", "*.pyi"]' in (REPO / "pyproject.toml").read_text()


def test_public_api_and_usage_type_check(package_home, tmp_path):
    files = [pathlib.Path("qemu_q", name) for name in PUBLIC_MODULES] + [SNIPPETS / "usage.py"]
    result = mypy(package_home, tmp_path, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_misuse_is_reported(package_home, tmp_path):
    misuse = SNIPPETS / "misuse.py"
    result = mypy(package_home, tmp_path, misuse)
    marked = {number for number, line in enumerate(misuse.read_text().splitlines(), 1)
              if line.endswith("# error")}
    reported = {int(match) for match in re.findall(r"misuse\.py:(\d+): error", result.stdout)}
    assert reported == marked, result.stdout + result.stderr
