"""Results to rank 0, in unit order: all at once (`gather`) or round by round (`gather_round`).

Results are Python objects (pickled) and travel over gloo, whatever the compute backend. Only the
leader of each chunk-parallel group contributes (its group's ranks hold the same result); the other
ranks of the group take part in the collective and send nothing. Rank 0 folds results in unit order,
so a report made from them equals one process's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from .faults import check

if TYPE_CHECKING:
    from .context import DistContext

T = TypeVar("T")


def _ordered(parts: list[dict[int, Any]]) -> dict[int, Any]:
    merged: dict[int, Any] = {}
    for part in parts:
        merged.update(part)
    return dict(sorted(merged.items()))


def gather(ctx: DistContext, local: dict[int, Any]) -> dict[int, Any] | None:
    """Collective: every rank passes {unit: result} for the units it computed; rank 0 gets every
    group leader's results merged, in unit order; the other ranks get None. One process: `local`,
    in unit order."""
    if not ctx.is_distributed:
        return _ordered([local])
    import torch.distributed as dist

    parts: list[dict[int, Any]] | None = [{} for _ in range(ctx.world_size)] if ctx.is_main else None
    dist.gather_object(local if ctx.reports else {}, parts, dst=0, group=ctx.object_group)
    return _ordered(parts) if parts is not None else None


def gather_round(
    ctx: DistContext, unit: int | None, result: Any = None, error: BaseException | None = None
) -> dict[int, Any] | None:
    """Collective, once per round (see sharding.rounds): first the error flag, then the results.

    Every rank passes its round's unit (None when idle) with its result, or the exception computing it
    raised. If any rank passes an error, every rank raises a MegaevalError ``rank N: <message>``
    (faults.check). Otherwise rank 0 gets {unit: result} for this round's units in unit order (idle
    groups contribute nothing) and the other ranks get None; rank 0 can then journal them.
    One process: re-raises `error`, else returns {unit: result} (or {} when idle).
    """
    check(ctx, error)
    return gather(ctx, {} if unit is None else {unit: result})


def broadcast_object(ctx: DistContext, obj: T | None) -> T:
    """Collective: rank 0's `obj` on every rank (e.g. the unit ids a resumed run still has to do, read
    from rank 0's journal). One process: `obj`."""
    if not ctx.is_distributed:
        return obj  # type: ignore[return-value]
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, group=ctx.object_group)
    return box[0]  # type: ignore[return-value]


def group_max(chunk: Any, value: int) -> int:
    """Collective over a chunk-parallel group (ChunkGroup): the largest of its ranks' `value`s."""
    if chunk.size == 1:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=chunk.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=chunk.group)
    return int(t.item())
