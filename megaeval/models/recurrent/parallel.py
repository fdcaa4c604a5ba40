"""Chunk parallel for Mamba and Mamba-2: P ranks share one long sequence, each reading a contiguous slice.

Every rank is given the whole call and the same starting state; rank r runs the model's own forward pass over
slice r (`chunk_slices`: whole score chunks, as evenly as they go) with a GroupSlice as its hooks. Per layer two
things cross a slice boundary, and both combine exactly:

* the conv's inputs: the conv state entering slice r is the last k-1 inputs before it (each rank's last k-1 inputs
  are all-gathered, [B, C, k-1] each);
* the SSM state, a linear function of the state before: a slice that starts from zero ends in h_local(r) and
  decays whatever entered it by a(r) = prod of its per-token decays, so h_in(r) = a(r-1) h_in(r-1) + h_local(r-1)
  from the carried state (rank 0 starts from it), the relay of MEGALODON's CEMA. Each rank gathers every
  (h_local, log a) pair, then adds what its entering state contributes to its outputs, C_t . (decay since the
  slice start * h_in): the SSM is linear, so that is the whole difference.

Every rank ends with the state after the call (the last rank's conv inputs and SSM state, which all of them
compute). RWKV-4 and RecurrentGemma are refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...distributed.exchange import Exchange
from ...errors import fail
from ..chunked import steps
from ..group import SliceParallelLM, chunk_slices
from .adapter import RecurrentLM

PARALLEL_MODULES = ("mamba", "mamba2")  # the architectures whose mixers take a GroupSlice


class GroupSlice:
    """Rank `exchange.rank`'s slice of a call of `length` tokens from `state`: the hooks MambaModel.forward's mixers
    ask where their conv and SSM states come from."""

    def __init__(self, lm: RecurrentLM, exchange: Exchange, batch: int, length: int, state: Any):
        self.ex, self.length, self.rank, self.size = exchange, length, exchange.rank, exchange.size
        self.slices = chunk_slices(length, self.size, lm.score_chunk, state.position)
        self.counts = [e - s for s, e in self.slices]
        self.start, self.end = self.slices[self.rank]
        self.steps = steps(state.position + self.start, self.end - self.start, lm.step(batch))

    def conv(self, x: Tensor, carried: Tensor) -> tuple[Tensor, Tensor]:
        """(the conv state entering this slice, the conv state after the whole call) for conv inputs x [B, n, C]."""
        held = carried.shape[2]
        mine = x.transpose(1, 2)[:, :, max(0, x.shape[1] - held) :].to(carried.dtype)
        mine = torch.cat([mine.new_zeros(*mine.shape[:2], held - mine.shape[2]), mine], 2)  # left-padded to k-1
        state, entering = carried, carried
        for j, last in enumerate(self.ex.all_gather(mine)):
            if j == self.rank:
                entering = state
            n = min(self.counts[j], held)
            if n:
                state = torch.cat([state, last[:, :, held - n :]], 2)[:, :, -held:]
        return entering, state

    def ssm(self, run: Any, log_decay: Tensor, carried: Any, h_carried: Tensor) -> tuple[Tensor, Tensor]:
        """The SSM over this slice: `run(h0)` -> (y, h at the end), `log_decay` its total log decay (broadcasting
        against h), `carried(h_in)` -> what a state entering the slice adds to y. Returns (y, the state after the
        whole call)."""
        y, h_local = run(h_carried if self.rank == 0 else torch.zeros_like(h_carried))
        ends = self.ex.all_gather(h_local)
        decays = self.ex.all_gather(log_decay.to(h_local.dtype).contiguous())
        h = ends[0]  # rank 0 started from the carried state: its end is the true one
        for j in range(1, self.size):
            if j == self.rank:
                y = y + carried(h)
            h = torch.exp(decays[j]) * h + ends[j]
        return y, h


class ChunkParallelLM(SliceParallelLM):
    """A Mamba or Mamba-2 RecurrentLM spread over chunk-parallel group `chunk` (models.group.SliceParallelLM)."""

    lm: RecurrentLM

    def make_slice(self, batch: int, length: int, state: Any) -> GroupSlice:
        return GroupSlice(self.lm, self.exchange, batch, length, state)


def chunk_parallel_lm(lm: RecurrentLM, chunk: Any) -> ChunkParallelLM:
    """`lm` over chunk-parallel group `chunk`, or a one-line refusal for the architectures that cannot share one."""
    if lm.architecture.module not in PARALLEL_MODULES:
        raise fail(f"--chunk-parallel runs Mamba, FalconMamba and Mamba-2 among recurrent models, not "
                   f"{lm.architecture.name}", "use --chunk-parallel 1")  # fmt: skip
    return ChunkParallelLM(lm, chunk)
