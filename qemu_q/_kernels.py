"""The kernel modules for the running CPU.

The hot kernel modules are built once per x86-64 instruction-set level besides the
portable baseline (setup.py: ISA_MODULES, ISA_LEVELS), from the same source. At import
the best level that was built and that the CPU supports is loaded; every level gives the
same bits (the tests run each one), only the vector width differs.

QEMU_Q_ISA=baseline|x86-64-v3|x86-64-v4 caps the level (a level the CPU lacks is never
loaded); `use(level)` switches at run time (the tests do).
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass
from types import ModuleType

from . import _build_config, _parallel

# Best first; "baseline" is the plain build every CPU runs.
LEVELS = ("x86-64-v4", "x86-64-v3", "baseline")


@dataclass(frozen=True)
class KernelSet:
    level: str
    quantize: ModuleType
    dequantize: ModuleType
    cast: ModuleType
    mx: ModuleType
    nvfp4: ModuleType
    integer: ModuleType
    requantize: ModuleType


def _suffix(level: str) -> str:
    return "" if level == "baseline" else "_" + level.replace("-", "_")


def available_levels() -> list[str]:
    """The levels built into this installation that the running CPU supports, best first."""
    built = set(getattr(_build_config, "ISA_LEVELS", ())) | {"baseline"}
    return [level for level in LEVELS if level in built and _parallel.cpu_supports(level)]


def load(level: str) -> KernelSet:
    if level not in LEVELS:
        raise ValueError(f"unknown instruction-set level {level!r}; known: {', '.join(LEVELS)}")
    if level not in available_levels():
        raise ValueError(
            f"instruction-set level {level!r} is not available here (built and supported: "
            f"{', '.join(available_levels())})"
        )
    suffix = _suffix(level)
    return KernelSet(
        level,
        importlib.import_module(f"qemu_q._quantize{suffix}"),
        importlib.import_module(f"qemu_q._dequantize{suffix}"),
        importlib.import_module(f"qemu_q._cast{suffix}"),
        importlib.import_module(f"qemu_q._mx{suffix}"),
        importlib.import_module(f"qemu_q._nvfp4{suffix}"),
        importlib.import_module(f"qemu_q._integer{suffix}"),
        importlib.import_module(f"qemu_q._requantize{suffix}"),
    )


def _default() -> KernelSet:
    cap = os.environ.get("QEMU_Q_ISA", "").strip()
    if cap and cap not in LEVELS:
        # A typo in an environment variable must not make the package unimportable.
        warnings.warn(
            f"QEMU_Q_ISA={cap!r} is not an instruction-set level (known: {', '.join(LEVELS)}); "
            f"ignoring it",
            RuntimeWarning,
            stacklevel=2,
        )
        cap = ""
    levels = available_levels()
    if cap:
        levels = [level for level in levels if LEVELS.index(level) >= LEVELS.index(cap)]
    for level in levels:
        try:
            return load(level)
        except ImportError:  # a level recorded but not installed: fall back
            continue
    return load("baseline")


active: KernelSet = _default()


def use(level: str) -> str:
    """Switch every kernel call to `level`; returns the previous level."""
    global active
    previous = active.level
    active = load(level)
    return previous
