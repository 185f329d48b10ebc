# The compiled module (pyx/_requantize.pyx) has no stubs of its own: everything in it is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
