"""What many test modules need: bit patterns and their comparison.

Results are compared as bit patterns, never as values: two NaNs of different codes, or +0
and -0, are different results.
"""

from __future__ import annotations

import numpy as np


def bits(a) -> np.ndarray:
    """The array's bit patterns as unsigned integers of its item size (any dtype,
    ml_dtypes included), contiguous."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def same_bits(a, b) -> bool:
    """Same dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_bits(got, expected, what: str = "") -> None:
    """Fail with the count and the first differing positions and bit patterns."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    g, e = bits(got).ravel(), bits(expected).ravel()
    bad = np.flatnonzero(g != e)
    if bad.size:
        i = bad[:8]
        raise AssertionError(
            f"{what}: {bad.size} of {g.size} differ; at {i.tolist()} got "
            f"{[hex(v) for v in g[i].tolist()]} expected {[hex(v) for v in e[i].tolist()]}"
        )


# docs/divergences.md: heading -> the name of the test that pins the entry (test_divergences.py
# checks that every heading has one); filled by `divergence_entry`.
DIVERGENCE_ENTRIES: dict[str, str] = {}


def divergence_entry(heading: str):
    """Decorator: the test pins the docs/divergences.md entry with this heading."""
    def register(test):
        DIVERGENCE_ENTRIES[heading] = test.__name__
        return test
    return register
