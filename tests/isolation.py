"""Running a piece of Python in a child process, for calls that may crash or hang.

A crash (a signal) or a hang in the child fails the one test that ran it instead of ending or
blocking the whole suite. The child imports the qemu_q under test (`package_home` first on
sys.path, cwd there too) and can import the helpers in tests/ (this directory). It runs in a
session of its own, so that on a timeout its whole process group (forked children and pool
workers included) is killed, not only the process we started.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass

TESTS = pathlib.Path(__file__).resolve().parent


@dataclass
class Outcome:
    returncode: int | None  # None when killed after the timeout
    stdout: str
    stderr: str
    timed_out: bool
    timeout: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0

    def describe(self) -> str:
        """How the child ended, in words a failing assertion can show."""
        if self.timed_out:
            how = f"hung: killed after {self.timeout:g} s"
        elif self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            how = f"crashed: killed by {name}"
        else:
            how = f"exited with status {self.returncode}"
        tail = "\n".join(self.stderr.strip().splitlines()[-15:])
        out = "\n".join(self.stdout.strip().splitlines()[-15:])
        return f"child {how}\n--- stdout (tail) ---\n{out}\n--- stderr (tail) ---\n{tail}"


def run_python(code: str, package_home, *, timeout: float = 60, env: dict | None = None,
               preexec_fn=None, args=()) -> Outcome:
    """Run `code` (dedented) with `python -c` in a fresh process; see the module docstring.
    `env` entries are added to the current environment (a value of None removes one)."""
    prelude = (
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        f"sys.path.insert(0, {str(package_home)!r})\n"
    )
    child_env = dict(os.environ)
    child_env["PYTHONDONTWRITEBYTECODE"] = "1"
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    process = subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *map(str, args)],
        cwd=str(package_home), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=preexec_fn,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        return Outcome(process.returncode, stdout, stderr, False, timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
        return Outcome(None, stdout, stderr, True, timeout)


def last_json_line(outcome: Outcome):
    """The child's report: the last stdout line that parses as JSON (None if there is none)."""
    import json

    for line in reversed(outcome.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None
