"""Type aliases of the public signatures (for type checkers; nothing here runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ._dtypes import ElementType

# The ops take numpy arrays (or numpy scalars), never lists: the dtype is the ONNX type.
Array = Union[np.ndarray, np.generic]
# What element_type resolves: an ElementType, an ONNX data-type int, a name or a dtype.
TypeSpec = Union["ElementType", int, str, npt.DTypeLike]
Shape = Union[int, Sequence[int]]
