"""Chunk parallel: P ranks share one long MEGALODON sequence, each computing a contiguous slice.

Every rank of the group is given the whole segment (inputs and targets [B, T]: token ids are tiny
next to activations) and the same starting state; rank k computes only slice k, a contiguous range
of whole chunks (`chunk_slices`), so its activations and attention are those of its slice. All ranks
of the group end with the full NLL [B, T] (and, on request, the state after the segment).

Design: associative prefix combine, layer by layer, all ranks computing at once. What crosses a
slice boundary in a layer is small and combines exactly:

* TimestepNorm statistics (count, per-group mean and variance, float64) of the layer's input over
  each slice merge by Chan's formula: the statistics before slice k are the carried ones merged with
  those of slices 0..k-1.
* The CEMA is linear: if slice j leaves h_j starting from zero, and has n_j tokens, the state
  entering slice k is h_in(k) = q**n_{k-1} h_in(k-1) + h_{k-1}, from the carried state h_in(0).
* Attention is chunk-local and slices are chunk-aligned, so no keys or values cross a boundary.

Per layer each rank (1) takes the moments of its slice's input and all-gathers them (one [2, B, G]
float64 tensor per rank); (2) runs the layer's TimestepNorm from the merged statistics and its CEMA
from a zero state over its slice, keeping both outputs, and all-gathers the CEMA state it ends with
([B, D, N] complex); (3) adds to the CEMA output what the true entering state contributes,
Re(sum_n gamma_n q_n**(t+1) h_in,n) (the CEMA is linear; rank 0 of a fresh sequence has nothing to
add), and runs the rest of the layer (MovingAverageGatedAttention.gated_attention and the FFN),
stepping as MegalodonLM.score does. The final norm is (1) once more, then the NLL. Exchanged per
layer: two small all-gathers within the group, nothing else. Per-rank memory: three activations of
its slice ([B, n, D]: the input and the norm and CEMA outputs) plus one step's temporaries.

Why not a layer pipeline (rank k runs layer l after receiving rank k-1's state after layer l): it is
exact too and needs no merging, but rank k waits k layer-steps before starting, so P ranks on an
L-layer model go at most P L / (L + P - 1) times faster (1.6x for 2 ranks and 4 layers), while the
prefix combine keeps every rank busy from the start, at the cost of one extra reduction for the
moments and the carried-state term per layer (about 5-10% of a layer of the tiny model on CPU). Both
are exact up to floating-point rounding: the sum of NLLs matches one process to about 1e-16 relative
in float64. model.py gained one method for this, MovingAverageGatedAttention.gated_attention (the
layer after its norm and CEMA, split out of `forward`, which calls it; behaviour unchanged).

Only norm_stats="cumulative" is supported: "official-window" recomputes statistics from a window of
recent tokens that the slices do not share.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from ...errors import fail
from ...kernels.cema import complex_powers
from .adapter import MegalodonLM
from .model import LayerState, MegalodonState, NormState


def chunk_slices(length: int, parts: int, chunk: int, position: int = 0) -> list[tuple[int, int]]:
    """[start, end) of each of `parts` contiguous slices of a call of `length` tokens that starts at
    absolute `position`: boundaries on absolute chunk boundaries, whole chunks dealt as evenly as
    possible (the first ranks get one more when they do not divide; the last chunk may be partial;
    slice 0 also takes the tokens that complete a partial chunk the state ends in). Slices may be empty."""
    lead = min((-position) % chunk, length)
    n_chunks = -(-(length - lead) // chunk)
    q, r = divmod(n_chunks, parts)
    out, end = [], 0
    for i in range(parts):
        start = end
        end = min(length, start + (lead if i == 0 else 0) + (q + (i < r)) * chunk)
        out.append((start, end))
    return out


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


# ------------------------------------------------------------------------------------ exchange


class _Exchange:
    """all-gather within the chunk-parallel group (float and complex tensors of the same shape on every rank)."""

    def __init__(self, chunk: Any):
        import torch.distributed as dist

        self.dist, self.group, self.size, self.device = dist, chunk.group, chunk.size, chunk.device
        self.ranks = tuple(chunk.ranks)

    def all_gather(self, t: Tensor) -> list[Tensor]:
        home = t.device
        flat = torch.view_as_real(t) if t.is_complex() else t
        flat = flat.contiguous().to(self.device)
        out = [torch.empty_like(flat) for _ in range(self.size)]
        self.dist.all_gather(out, flat, group=self.group)
        out = [o.to(home) for o in out]
        return [torch.view_as_complex(o) for o in out] if t.is_complex() else out

    def broadcast(self, t: Tensor, src: int) -> Tensor:
        """`t` of group rank `src` (every rank passes a tensor of the right shape and dtype)."""
        buf = t.contiguous().to(self.device)
        self.dist.broadcast(buf, src=self.ranks[src], group=self.group)
        return buf.to(t.device)


# ------------------------------------------------------------------------------------ scoring


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


def _agree(ex: _Exchange, inputs: Tensor, targets: Tensor, state: MegalodonState) -> None:
    """Every rank of the group must hold the same segment: compare shapes and checksums (one tiny all-gather)."""
    shape = list(inputs.shape) if inputs.dim() == 2 else [-1, -1]
    summary = torch.tensor(
        [*shape, *(list(targets.shape) if targets.dim() == 2 else [-1, -1]), state.position,
         int(inputs.long().sum()) if inputs.numel() else 0, int(targets.long().sum()) if targets.numel() else 0],
        dtype=torch.int64,
    )  # fmt: skip
    seen = ex.all_gather(summary)
    if any(not torch.equal(s.cpu(), summary) for s in seen):
        raise fail(
            "the ranks of a chunk-parallel group were given different segments",
            "give every rank of the group the same inputs, targets and state",
        )


def _pieces(position: int, length: int, step: int) -> list[tuple[int, int]]:
    """[a, b) offsets covering `length` tokens from absolute `position`, cut at absolute multiples of
    `step` (the steps MegalodonLM.score takes, which bound activations within a layer)."""
    out, a = [], 0
    while a < length:
        b = min(length, a + step - (position + a) % step)
        out.append((a, b))
        a = b
    return out


@torch.inference_mode()
def score_chunk_parallel(
    lm: MegalodonLM,
    inputs: Tensor,
    targets: Tensor,
    chunk: Any,
    state: MegalodonState | None = None,
    *,
    keep_state: bool = False,
) -> tuple[Tensor, MegalodonState | None]:
    """NLL [B, T] of `targets` given `inputs`, computed by the `chunk.size` ranks of a chunk-parallel group.

    Collective over the group (megaeval.distributed.ChunkGroup: size, rank, ranks, group, device):
    every rank passes the same inputs, targets [B, T] and starting `state` (None: a fresh one); rank
    `chunk.rank` computes slice `chunk_slices(T, size, chunk_size, state.position)[rank]`. Returns, on
    every rank of the group, the full NLL (equal to `lm.score(inputs, targets, state)[0]` up to rounding)
    and, with `keep_state`, the state after the segment (else None; keeping it broadcasts the last
    partial chunk's keys and values). With size 1 this is `lm.score`. Bad input fails on every rank
    alike before any tensor is exchanged.
    """
    check_supported(lm)
    inputs = torch.as_tensor(inputs, device=lm.device)
    targets = torch.as_tensor(targets, device=lm.device)
    if state is None:
        state = lm.init_state(inputs.shape[0] if inputs.dim() == 2 else 1)
    if chunk.size == 1:
        nll, state = lm.score(inputs, targets, state)
        return nll, state if keep_state else None
    ex = _Exchange(chunk)
    _agree(ex, inputs, targets, state)
    inputs = lm._check_tokens(inputs, state)
    if targets.shape != inputs.shape:
        raise fail(f"targets shape {list(targets.shape)} differs from inputs shape {list(inputs.shape)}")
    B, T = inputs.shape
    if T == 0:
        nll, state = lm.score(inputs, targets, state)
        return nll, state if keep_state else None

    model, args = lm.model, lm.args
    C, G, P, k = args.chunk_size, args.norm_num_groups, chunk.size, chunk.rank
    slices = chunk_slices(T, P, C, state.position)
    counts = [e - s for s, e in slices]
    s, e = slices[k]
    pieces = _pieces(state.position + s, e - s, lm.step(B))

    x = model.embed(inputs[:, s:e])
    if model.emb_scale is not None:
        x = x * model.emb_scale
    final_layers: list[LayerState] = []
    for block, carried in zip(model.layers, state.layers, strict=True):
        mega = block.mega
        # (1) TimestepNorm statistics before this slice
        moments = ex.all_gather(slice_moments(x, G, pieces))
        before = _prefix(carried.norm, counts, moments, k)
        # (2) the layer's TimestepNorm and CEMA over the slice, the CEMA from a zero state; the state it
        # ends in, gathered, gives the exact CEMA state before this slice
        normed, cema_out = torch.empty_like(x), torch.empty_like(x)
        h_local, norm = torch.zeros_like(carried.cema), before
        for a, b in pieces:
            normed[:, a:b], norm = mega.timenorm(x[:, a:b], norm)
            cema_out[:, a:b], h_local = mega.cema(normed[:, a:b], h_local)
        h_all = ex.all_gather(h_local)
        _, log_q, gamma = mega.cema.coefficients()
        h_in = carried.cema
        for j in range(k):
            h_in = advance(h_in, log_q, counts[j]) + h_all[j]
        # (3) the CEMA output from that state (linear: add what the state contributes), then the rest of
        # the layer; a slice after the first starts a chunk, so it starts with empty K/V caches
        carry = k > 0 or bool(carried.cema.any())
        k_cache, v_cache = (carried.k, carried.v) if k == 0 else (carried.k[:, :0], carried.v[:, :0])
        for a, b in pieces:
            out_cema = cema_out[:, a:b]
            if carry:
                added = carried_output(advance(h_in, log_q, a), log_q, gamma, b - a)
                out_cema = (out_cema.to(added.dtype) + added).to(x.dtype)
            y, k_cache, v_cache = mega.gated_attention(x[:, a:b], normed[:, a:b], out_cema, k_cache, v_cache)
            x[:, a:b] = block.nffn(y, x[:, a:b])
        del normed, cema_out
        if keep_state:
            h_end = h_in
            for j in range(k, P):
                h_end = advance(h_end, log_q, counts[j]) + h_all[j]
            end_norm = _prefix(carried.norm, counts, moments, P)
            final_layers.append(LayerState(end_norm, h_end, k_cache, v_cache))

    moments = ex.all_gather(slice_moments(x, G, pieces))
    norm = _prefix(state.final_norm, counts, moments, k)
    nll = torch.zeros(B, max(counts), dtype=torch.promote_types(lm.dtype, torch.float32), device=lm.device)
    for a, b in pieces:
        hidden, norm = model.output.final_norm(x[:, a:b], norm)
        for c in range(a, b, C):  # one chunk of logits at a time
            d = min(b, c + C)
            nll[:, c:d] = model.nll(hidden[:, c - a : d - a], targets[:, s + c : s + d])
    del x
    full = torch.cat([part[:, :n] for part, n in zip(ex.all_gather(nll), counts, strict=True)], dim=1)
    if not keep_state:
        return full, None
    final_norm = _prefix(state.final_norm, counts, moments, P)
    return full, _final_state(ex, state, final_layers, final_norm, counts, T, C, k)


def _prefix(carried: NormState, counts: list[int], moments: list[Tensor], upto: int) -> NormState:
    """`carried` merged with the statistics of slices 0..upto-1."""
    out = carried
    for j in range(upto):
        out = merge(out, counts[j], moments[j][0], moments[j][1])
    return out


def _final_state(
    ex: _Exchange,
    state: MegalodonState,
    layers: list[LayerState],
    final_norm: NormState,
    counts: list[int],
    T: int,
    C: int,
    rank: int,
) -> MegalodonState:
    """The state after the segment on every rank: the merged statistics and CEMA states each rank already
    has, and the partial chunk's keys and values broadcast (in one tensor) from the rank owning the end."""
    owner = max(j for j, n in enumerate(counts) if n > 0)
    partial = (state.position + T) % C
    shapes = [(ls.k.shape[0], partial, *ls.k.shape[2:]) for ls in layers] + [
        (ls.v.shape[0], partial, *ls.v.shape[2:]) for ls in layers
    ]
    if partial:
        ref = layers[0].k
        if rank == owner:
            flat = torch.cat([ls.k.flatten() for ls in layers] + [ls.v.flatten() for ls in layers])
        else:
            flat = ref.new_empty(sum(math.prod(sh) for sh in shapes))
        flat = ex.broadcast(flat, owner)
        parts = list(flat.split([math.prod(sh) for sh in shapes]))
    else:
        parts = [layers[0].k.new_empty(sh) for sh in shapes]
    n = len(layers)
    layers = [
        replace(ls, k=parts[i].view(shapes[i]), v=parts[n + i].view(shapes[n + i])) for i, ls in enumerate(layers)
    ]
    return replace(state, layers=layers, final_norm=final_norm, position=state.position + T, history=None)
