"""Chunk parallel: P ranks share one long MEGALODON sequence, each computing a contiguous slice.

Every rank of the group is given the whole segment (inputs and targets [B, T]: token ids are tiny
next to activations) and the same starting state; rank k computes only slice k, a contiguous range
of whole chunks (`chunk_slices`), so its activations and attention are those of its slice. All ranks
of the group end with the full NLL [B, T] and the state after the segment.

Design: associative prefix combine, layer by layer, all ranks computing at once. What crosses a
slice boundary in a layer is small and combines exactly:

* TimestepNorm statistics (count, per-group mean and variance, float64) of the layer's input over
  each slice merge by Chan's formula: the statistics before slice k are the carried ones merged with
  those of slices 0..k-1.
* The CEMA is linear: if slice j leaves h_j starting from zero, and has n_j tokens, the state
  entering slice k is h_in(k) = q**n_{k-1} h_in(k-1) + h_{k-1}, from the carried state h_in(0).
* Attention is chunk-local and slices are chunk-aligned, so no keys or values cross a boundary.

The forward pass is model.py's, run once over the rank's slice: `Megalodon.forward` and its layers ask
their hooks (state.LocalSlice) where the call stands, and `GroupSlice` answers for a rank's slice. Per
layer each rank (1) takes the moments of its slice's input and all-gathers them (one [2, B, G] float64
tensor per rank: `norm_before`); (2) runs the layer's TimestepNorm from the merged statistics and its
CEMA from a zero state (`cema_start`) over its slice, keeping both outputs, and all-gathers the CEMA
state it ends with ([B, D, N] complex: `cema_carry`); (3) adds to the CEMA output what the true
entering state contributes, Re(sum_n gamma_n q_n**(t+1) h_in,n) (the CEMA is linear; rank 0 of a fresh
sequence has nothing to add), and runs the rest of the layer (gated attention and the FFN), stepping as
MegalodonLM.score does (`pieces`). The final norm is (1) once more, then the NLL (ChunkedStreamingLM's).
Exchanged per layer: two small all-gathers within the group, nothing else; at the end, the keys and
values of the last partial chunk are broadcast from the rank that holds them (`state_after`). Per-rank
memory: three activations of its slice ([B, n, D]: the input and the norm and CEMA outputs) plus one
step's temporaries.

Why not a layer pipeline (rank k runs layer l after receiving rank k-1's state after layer l): it is
exact too and needs no merging, but rank k waits k layer-steps before starting, so P ranks on an
L-layer model go at most P L / (L + P - 1) times faster (1.6x for 2 ranks and 4 layers), while the
prefix combine keeps every rank busy from the start, at the cost of one extra reduction for the
moments and the carried-state term per layer (about 5-10% of a layer of the tiny model on CPU). Both
are exact up to floating-point rounding: the sum of NLLs matches one process to about 1e-16 relative
in float64.

Only norm_stats="cumulative" is supported: "official-window" recomputes statistics from a window of
recent tokens that the slices do not share.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from ...distributed.exchange import Exchange
from ...errors import fail
from ...kernels.cema import complex_powers
from ..chunked import steps
from ..group import SliceParallelLM, chunk_slices
from .adapter import MegalodonLM
from .state import CarryTerm, LocalSlice, MegalodonState, NormState

# ------------------------------------------------------------------------------------ statistics


def slice_moments(x: Tensor, groups: int, pieces: list[tuple[int, int]]) -> Tensor:
    """[2, B, G] float64: mean and (population) variance of each group over the timesteps of x [B, n, D],
    each timestep an equally weighted sample (as TimestepNorm pools them), computed piece by piece.

    With every timestep of a group the same size, these pooled moments are the plain mean and variance
    of all the group's elements (law of total variance), taken here in two passes."""
    B, _, D = x.shape
    acc: NormState | None = None
    for a, b in pieces:
        xg = x[:, a:b].reshape(B, b - a, groups, D // groups).double()
        mean = xg.mean((1, 3))
        var = (xg - mean[:, None, :, None]).square().mean((1, 3))
        acc = NormState(b - a, mean, var) if acc is None else merge(acc, b - a, mean, var)
    if acc is None:
        return torch.zeros(2, B, groups, dtype=torch.float64, device=x.device)
    return torch.stack([acc.mean, acc.var])


def merge(state: NormState, count: int, mean: Tensor, var: Tensor) -> NormState:
    """The statistics of `state`'s timesteps followed by `count` more with moments mean, var (Chan et al.)."""
    if count == 0:
        return state
    if state.count == 0:  # a fresh state's prior carries no weight (as in cumulative_moments)
        return NormState(count, mean.clone(), var.clone())
    n = state.count + count
    delta = mean - state.mean
    new_mean = state.mean + delta * (count / n)
    new_var = (state.count * state.var + count * var) / n + delta * delta * (state.count * count / (n * n))
    return NormState(n, new_mean, new_var.clamp_min(0))


def advance(h: Tensor, log_q: Tensor, steps: int) -> Tensor:
    """q**steps * h: the CEMA state `steps` timesteps later with zero input. log_q [D, N] complex128."""
    return h * torch.exp(log_q * steps).to(h.dtype)


CARRY_BLOCK = 256  # timesteps per block of powers in carried_output: bounds its [D, N, block] temporaries


def carried_output(h: Tensor, log_q: Tensor, gamma: Tensor, length: int) -> Tensor:
    """What a carried CEMA state h [B, D, N] adds to the CEMA's output over the next `length` timesteps,
    Re(sum_n gamma_n q_n**(t+1) h_n) for t < length, as [B, length, D] (real dtype of h), the term
    megaeval.kernels.cema adds for its carried state; in blocks of CARRY_BLOCK timesteps, each one
    batched real product over the dimensions d: [B, 2N] x [2N, block]."""
    q_pow = complex_powers(log_q, min(length, CARRY_BLOCK) + 1, h.dtype)[..., 1:]  # [D, N, block]
    q_re_im = torch.cat([q_pow.real, q_pow.imag], 1)  # [D, 2N, block]
    out = []
    for a in range(0, length, CARRY_BLOCK):
        n = min(CARRY_BLOCK, length - a)
        hg = advance(h, log_q, a) * gamma.to(h.dtype)  # [B, D, N]
        lhs = torch.cat([hg.real, -hg.imag], -1).transpose(0, 1)  # [D, B, 2N]
        out.append(torch.bmm(lhs, q_re_im[..., :n]))  # [D, B, n]
    return torch.cat(out, 2).permute(1, 2, 0)


# ------------------------------------------------------------------------------------ hooks


class GroupSlice(LocalSlice):
    """Rank `exchange.rank`'s slice of a call of `length` tokens from `state`, shared by the group: the hooks of
    Megalodon.forward (state.LocalSlice), answered by merging what the slices of every rank contribute."""

    def __init__(self, lm: MegalodonLM, exchange: Exchange, batch: int, length: int, state: MegalodonState):
        self.ex, self.length, self.chunk_size = exchange, length, lm.args.chunk_size
        self.groups, self.rank, self.size = lm.args.norm_num_groups, exchange.rank, exchange.size
        self.slices = chunk_slices(length, self.size, self.chunk_size, state.position)
        self.counts = [e - s for s, e in self.slices]
        self.start, self.end = self.slices[self.rank]
        self.steps = steps(state.position + self.start, self.end - self.start, lm.step(batch))
        self.moments: list[Tensor] = []  # every slice's [2, B, G] moments of the current norm's input

    def pieces(self, length: int) -> list[tuple[int, int]]:
        return self.steps

    def norm_before(self, x: Tensor, carried: NormState) -> NormState:
        self.moments = self.ex.all_gather(slice_moments(x, self.groups, self.steps))
        return self._merged(carried, self.rank)

    def norm_after(self, carried: NormState, local: NormState) -> NormState:
        return self._merged(carried, self.size)  # the moments of the norm `norm_before` last saw: the same one

    def _merged(self, carried: NormState, upto: int) -> NormState:
        """`carried` merged with the statistics of slices 0..upto-1."""
        for j in range(upto):
            carried = merge(carried, self.counts[j], self.moments[j][0], self.moments[j][1])
        return carried

    def cema_start(self, carried: Tensor) -> Tensor:
        return torch.zeros_like(carried)

    def cema_carry(self, cema: nn.Module, carried: Tensor, local: Tensor) -> tuple[CarryTerm | None, Tensor]:
        h_all = self.ex.all_gather(local)
        _, log_q, gamma = cema.coefficients()
        h_in = carried
        for j in range(self.rank):
            h_in = advance(h_in, log_q, self.counts[j]) + h_all[j]
        h_end = h_in
        for j in range(self.rank, self.size):
            h_end = advance(h_end, log_q, self.counts[j]) + h_all[j]
        entering = h_in if self.rank > 0 or bool(carried.any()) else None  # None: nothing entered this slice

        def carry(a: int, b: int, out: Tensor) -> Tensor:
            out = out.contiguous()  # time-major, as a slice's CEMA output has always been read (to the last bit)
            if entering is None:
                return out
            added = carried_output(advance(entering, log_q, a), log_q, gamma, b - a)
            return (out.to(added.dtype) + added).to(out.dtype)

        return carry, h_end

    def kv_start(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """A slice after the first starts a chunk, so it starts with empty caches."""
        return (k, v) if self.rank == 0 else (k[:, :0], v[:, :0])

    def state_after(self, before: MegalodonState, after: MegalodonState) -> MegalodonState:
        """The state after the call on every rank: the merged statistics and CEMA states each rank already has,
        and the partial chunk's keys and values broadcast (in one tensor) from the rank owning the end."""
        owner = max(j for j, n in enumerate(self.counts) if n > 0)
        partial = (before.position + self.length) % self.chunk_size
        layers = after.layers
        shapes = [(s.k.shape[0], partial, *s.k.shape[2:]) for s in layers]
        shapes += [(s.v.shape[0], partial, *s.v.shape[2:]) for s in layers]
        if partial:
            if self.rank == owner:
                flat = torch.cat([s.k.flatten() for s in layers] + [s.v.flatten() for s in layers])
            else:
                flat = layers[0].k.new_empty(sum(math.prod(sh) for sh in shapes))
            parts = list(self.ex.broadcast(flat, owner).split([math.prod(sh) for sh in shapes]))
        else:
            parts = [layers[0].k.new_empty(sh) for sh in shapes]
        n = len(layers)
        layers = [
            replace(s, k=parts[i].view(shapes[i]), v=parts[n + i].view(shapes[n + i])) for i, s in enumerate(layers)
        ]
        return replace(after, layers=layers, position=before.position + self.length, history=None)


# ------------------------------------------------------------------------------------ the model


def check_supported(lm: Any) -> None:
    """Refuse, with one line, models and modes chunk parallel cannot run exactly."""
    if not isinstance(lm, MegalodonLM):
        raise fail(
            f"--chunk-parallel runs MEGALODON models only, not {getattr(lm, 'family', type(lm).__name__)}",
            "use --chunk-parallel 1",
        )
    if lm.norm_stats != "cumulative":
        raise fail(
            f"--chunk-parallel needs --norm-stats cumulative, not {lm.norm_stats}: the official window recomputes"
            " statistics from recent tokens that the slices do not share",
            "use --norm-stats cumulative or --chunk-parallel 1",
        )


class ChunkParallelLM(SliceParallelLM):
    """MegalodonLM `lm` spread over chunk-parallel group `chunk` (models.group.SliceParallelLM): each rank reads its
    slice of a call through `Megalodon.forward` with a GroupSlice. Every rank ends with the whole state, which
    MEGALODON keeps at a constant size."""

    lm: MegalodonLM

    def __init__(self, lm: MegalodonLM, chunk: Any):
        check_supported(lm)
        super().__init__(lm, chunk)

    def make_slice(self, batch: int, length: int, state: MegalodonState) -> GroupSlice:
        return GroupSlice(self.lm, self.exchange, batch, length, state)


def score_chunk_parallel(
    lm: MegalodonLM, inputs: Tensor, targets: Tensor, chunk: Any, state: MegalodonState | None = None, *,
    keep_state: bool = False,
) -> tuple[Tensor, MegalodonState | None]:  # fmt: skip
    """NLL [B, T] of `targets` given `inputs`, computed by the `chunk.size` ranks of a chunk-parallel group.

    Collective over the group (megaeval.distributed.ChunkGroup: size, rank, ranks, group, device):
    every rank passes the same inputs, targets [B, T] and starting `state` (None: a fresh one); rank
    `chunk.rank` computes slice `chunk_slices(T, size, chunk_size, state.position)[rank]`. Returns, on
    every rank of the group, the full NLL (equal to `lm.score(inputs, targets, state)[0]` up to rounding)
    and, with `keep_state`, the state after the segment (else None). With size 1 this is `lm.score`. Bad
    input fails on every rank alike.
    """
    return ChunkParallelLM(lm, chunk).score_segment(inputs, targets, state, keep_state=keep_state)
