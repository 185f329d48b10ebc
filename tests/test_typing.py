"""The public API's type hints (py.typed) are accepted by mypy, and they mean something:
a usage snippet type-checks, and misuse is reported line by line."""

import os
import pathlib
import re
import site
import subprocess
import sys

import pytest

pytest.importorskip("mypy", reason="the typing check needs mypy (in the test extra)")

REPO = pathlib.Path(__file__).resolve().parents[1]
SNIPPETS = pathlib.Path(__file__).resolve().parent / "typing"
@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    # One cache for the module's runs: the second reads qemu_q's analysis from the first.
    return tmp_path_factory.mktemp("mypy_cache")


def mypy(package_home, tmp_path, cache, *arguments):
    # An installed package is found the way users' mypy finds it, through site-packages
    # and its py.typed; a source tree built in place through MYPYPATH. The run starts in
    # an empty directory: mypy takes modules under its working directory for the user's own.
    env = dict(os.environ)
    if str(package_home) not in site.getsitepackages() + [site.getusersitepackages()]:
        env["MYPYPATH"] = str(package_home)
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
               "--cache-dir", str(cache), "--no-error-summary", *map(str, arguments)]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)


def test_py_typed_marker_is_shipped(package_home):
    assert (package_home / "qemu_q" / "py.typed").is_file()
    assert 'qemu_q = ["py.typed", "*.pyi"]' in (REPO / "pyproject.toml").read_text()


def test_public_api_and_usage_type_check(package_home, tmp_path, mypy_cache):
    # From a source tree mypy also reports on the modules the snippet imports: every public
    # one (qemu_q/__init__.py imports them); pyproject.toml silences the internals.
    result = mypy(package_home, tmp_path, mypy_cache, SNIPPETS / "usage.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_misuse_is_reported(package_home, tmp_path, mypy_cache):
    misuse = SNIPPETS / "misuse.py"
    result = mypy(package_home, tmp_path, mypy_cache, misuse)
    marked = {number for number, line in enumerate(misuse.read_text().splitlines(), 1)
              if line.endswith("# error")}
    reported = {int(match) for match in re.findall(r"misuse\.py:(\d+): error", result.stdout)}
    assert reported == marked, result.stdout + result.stderr
