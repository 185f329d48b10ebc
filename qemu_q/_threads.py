"""Thread-count policy: a module-level default, a per-call override, and no thread team
for inputs too small to repay it. Results never depend on the count."""

from __future__ import annotations

import operator
import os

from . import _parallel

# Below this many elements a call runs on the calling thread: starting a team costs more
# than the work.
SERIAL_BELOW = 1 << 16

_default_threads: int | None = None


def _validate(n_threads, argument: str) -> int:
    if isinstance(n_threads, bool):
        raise TypeError(f"{argument} must be a positive int, got {n_threads!r}")
    try:
        n = operator.index(n_threads)
    except TypeError:
        raise TypeError(f"{argument} must be a positive int, got {type(n_threads).__name__} {n_threads!r}") from None
    if n < 1:
        raise ValueError(f"{argument}={n}; it must be >= 1")
    return n


def get_num_threads() -> int:
    """The default thread count: set_num_threads(), else QEMU_Q_NUM_THREADS, else the
    OpenMP runtime's default (1 without OpenMP)."""
    if _default_threads is not None:
        return _default_threads
    env = os.environ.get("QEMU_Q_NUM_THREADS")
    if env:
        return _validate(int(env) if env.strip().lstrip("-").isdigit() else env, "QEMU_Q_NUM_THREADS")
    return max(1, _parallel.max_threads())


def set_num_threads(n_threads: int | None) -> None:
    """Set the default thread count for every kernel (None restores the default)."""
    global _default_threads
    _default_threads = None if n_threads is None else _validate(n_threads, "n_threads")


def resolve_threads(n_threads, size: int) -> int:
    n = get_num_threads() if n_threads is None else _validate(n_threads, "n_threads")
    return 1 if size < SERIAL_BELOW else n
