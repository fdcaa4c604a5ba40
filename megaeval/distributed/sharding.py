"""Static assignment of units to data-parallel groups, by index.

A unit is whatever a command computes independently and reports once: a sweep batch, a SCROLLS
example, an academic document. Units are dealt round-robin: unit i (the i-th of the list) goes to
group i mod G, G = DistContext.num_groups. Round k is units [kG, (k+1)G): every group computes one
of them, so rank 0 can fold and journal the results after every round (collect.gather_round). All
ranks of a chunk-parallel group get the same units. The assignment depends only on the list and G,
so every rank computes it alone, with no communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import DistContext


def _as_units(units: int | Sequence[int]) -> list[int]:
    return list(range(units)) if isinstance(units, int) else list(units)


def shard(units: int | Sequence[int], ctx: DistContext, contiguous: bool = False) -> list[int]:
    """The units this rank's data-parallel group computes, in order.

    `units`: a count n (units 0..n-1) or the unit ids still to do (e.g. those a resumed run lacks).
    Round-robin by default; `contiguous` gives group g the g-th of G near-equal consecutive ranges
    instead (neighbouring units that share work, such as a few-shot block, stay on one rank).
    One process: all of them.
    """
    ids = _as_units(units)
    if contiguous:
        n, G, g = len(ids), ctx.num_groups, ctx.group_index
        return ids[g * n // G : (g + 1) * n // G]
    return ids[ctx.group_index :: ctx.num_groups]


def num_rounds(units: int | Sequence[int], ctx: DistContext, contiguous: bool = False) -> int:
    """Rounds needed so every group computes all its units (the largest group's share)."""
    n = len(_as_units(units))
    return -(-n // ctx.num_groups)


def rounds(units: int | Sequence[int], ctx: DistContext, contiguous: bool = False) -> list[int | None]:
    """This rank's unit for each round, the same number of rounds on every rank: the k-th unit of its
    share (see `shard`), or None once the share has run out (idle in the last rounds). Every rank must
    take part in each round's collective (gather_round), idle or not."""
    mine = shard(units, ctx, contiguous)
    return [mine[k] if k < len(mine) else None for k in range(num_rounds(units, ctx, contiguous))]
