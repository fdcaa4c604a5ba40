"""Splitting a sequence into calls, for the tests that carry state from call to call."""

from __future__ import annotations

# odd calls, single-token decoding steps, and calls that cross chunk (8) and kernel tile boundaries
SPLITS = [[37], [5, 1, 13, 2, 16], [3, 1, 1, 1, 16, 15], [8, 8, 8, 13]]


def calls(total: int, sizes: list[int]) -> list[slice]:
    """Consecutive slices of the given sizes, covering [0, total)."""
    assert sum(sizes) == total
    bounds = [0] + [sum(sizes[: i + 1]) for i in range(len(sizes))]
    return [slice(s, e) for s, e in zip(bounds, bounds[1:], strict=False)]
