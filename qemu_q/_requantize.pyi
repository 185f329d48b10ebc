# The compiled module (pyx/_requantize.pyx) has no stubs of its own: everything in it is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

# (lowest, highest) accepted shift and multiplier per scheme (the Python layer reads them).
SHIFT_RANGES: dict[str, tuple[int, int]]
MULTIPLIER_RANGES: dict[str, tuple[int, int]]
