"""The environment a call runs in: the thread count (a module-level default, a per-call
override, a ceiling, no thread team for inputs too small to repay it, one thread in a
forked child) and the floating-point environment. Results depend on neither."""

from __future__ import annotations

import functools
import operator
import os
from typing import Callable, ParamSpec, TypeVar

from . import _parallel

# Below this many elements a call runs on the calling thread: starting a team costs more
# than the work.
SERIAL_BELOW = 1 << 16

# The most threads a call may ask for. OpenMP runtimes fail in their own ways far above
# any real core count (libgomp segfaults at 10**5 threads and exits the process at 5*10**4),
# so larger requests are refused rather than passed on; a kernel's team is also never
# larger than its number of tasks.
MAX_THREADS = 1024

_default_threads: int | None = None

# libgomp's thread team does not survive fork(): a child that enters a parallel region
# its parent had used waits forever for threads that do not exist. A forked child of a
# process that has run a team therefore computes on its own thread (same bits, only
# slower); processes started with "spawn" or "forkserver" keep their threads.
_team_used = False
_serial_after_fork = False


def _after_fork_in_child() -> None:
    global _serial_after_fork
    if _team_used:
        _serial_after_fork = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _validate(n_threads, argument: str) -> int:
    if isinstance(n_threads, bool):
        raise TypeError(f"{argument} must be an int in [1, {MAX_THREADS}], got {n_threads!r}")
    try:
        n = operator.index(n_threads)
    except TypeError:
        raise TypeError(
            f"{argument} must be an int in [1, {MAX_THREADS}], got {type(n_threads).__name__} "
            f"{n_threads!r}"
        ) from None
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"{argument}={n}; it must be in [1, {MAX_THREADS}] (qemu_q.MAX_THREADS)")
    return n


def _from_environment() -> int | None:
    # Read on every call (a process may set it after import), parsed once per value.
    text = os.environ.get("QEMU_Q_NUM_THREADS")
    if text is None:
        return None
    return _parse_environment(text)


@functools.lru_cache(maxsize=8)
def _parse_environment(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"QEMU_Q_NUM_THREADS={text!r}; it must be an int in [1, {MAX_THREADS}]"
        ) from None
    return _validate(value, "QEMU_Q_NUM_THREADS")


def get_num_threads() -> int:
    """The default thread count: set_num_threads(), else QEMU_Q_NUM_THREADS, else the
    OpenMP runtime's default (1 without OpenMP), at most MAX_THREADS."""
    if _default_threads is not None:
        return _default_threads
    env = _from_environment()
    if env is not None:
        return env
    return max(1, min(MAX_THREADS, _parallel.max_threads()))


def set_num_threads(n_threads: int | None) -> None:
    """Set the default thread count for every kernel, 1 to MAX_THREADS (None restores the
    default)."""
    global _default_threads
    _default_threads = None if n_threads is None else _validate(n_threads, "n_threads")


def resolve_threads(n_threads, size: int) -> int:
    """The team size of one call: validated, 1 for small inputs and in a forked child."""
    global _team_used
    n = get_num_threads() if n_threads is None else _validate(n_threads, "n_threads")
    if size < SERIAL_BELOW or _serial_after_fork:
        return 1
    if n > 1:
        _team_used = True
    return n


_P = ParamSpec("_P")
_R = TypeVar("_R")


def in_default_fp_environment(op: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run `op` in the default floating-point environment on the calling thread
    (pyx/_fpenv.pxd): the Python layer's own arithmetic (parameter conversions, zero-point
    checks, DynamicQuantizeLinear's scale) must not read the caller's FTZ/DAZ or rounding
    mode any more than the kernels do."""
    @functools.wraps(op)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _parallel.DefaultFloatingPoint():
            return op(*args, **kwargs)
    return guarded
