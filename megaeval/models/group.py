"""GroupLM: the base of a family's model spread over a chunk-parallel group (`--chunk-parallel P`), and
SliceParallelLM: the one for families whose forward pass takes a slice's hooks (MEGALODON, Mamba, Mamba-2).

A chunk-parallel group is P ranks sharing one sequence. Its model is a StreamingLM like any other,
except that every call is collective over the group: every rank passes the same tokens and its own
part of the state, and every rank gets the whole result. So the commands run their usual code
(scoring, prefill, greedy decoding, batched choices) on every rank of the group, unchanged. Each
family that supports it registers a constructor (`Family.chunk_parallel`; `chunk_parallel_lm`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..distributed.exchange import Exchange
from ..kernels.nll import IGNORE_INDEX
from .base import State, StreamingLM
from .chunked import ChunkedStreamingLM


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


class GroupLM(StreamingLM):
    """A family's StreamingLM `lm` over chunk-parallel group `chunk` (megaeval.distributed.ChunkGroup); the
    facts, options and checksum are the model's own, plus the group's size."""

    def __init__(self, lm: StreamingLM, chunk: Any):
        self.lm, self.chunk = lm, chunk
        self.family, self.path, self.tokenizer = lm.family, lm.path, lm.tokenizer
        self.max_context, self.device, self.dtype = lm.max_context, lm.device, lm.dtype

    def describe(self) -> dict[str, Any]:
        return {**self.lm.describe(), "chunk_parallel": self.chunk.size}

    def options(self) -> dict[str, Any]:
        return self.lm.options()

    def info_rows(self) -> list[tuple[str, str]]:
        return [*self.lm.info_rows(), ("chunk parallel", f"{self.chunk.size} ranks per sequence")]

    def weights_sha256(self) -> str | None:
        return self.lm.weights_sha256()

    def flops_per_token(self, context_length: int) -> float | None:
        return self.lm.flops_per_token(context_length)

    def score_segment(
        self, inputs: torch.Tensor, targets: torch.Tensor, state: State | None = None, *, keep_state: bool = False
    ) -> tuple[torch.Tensor, State | None]:
        """`score` from `state` (None: a fresh one) on every rank of the group: the full NLL [B, T] and, with
        `keep_state`, this rank's state after the segment (else None)."""
        inputs = torch.as_tensor(inputs, device=self.device)
        if state is None:
            state = self.init_state(inputs.shape[0] if inputs.dim() == 2 else 1)
        nll, state = self.score(inputs, targets, state)
        return nll, state if keep_state else None


class SliceParallelLM(GroupLM, ChunkedStreamingLM):
    """A state-carrying model `lm` (a ChunkedStreamingLM) whose ranks each read a contiguous slice of every call.

    Reading (`score`, `advance`, and the prompt part of `forward_last`) is chunk parallel: ChunkedStreamingLM's
    calls over a `_run` that takes this rank's slice through `lm.model(tokens, state, hooks)` with the hooks of
    `make_slice` (the family's: they merge what crosses slices, layer by layer); `score` then gathers every rank's
    NLL. Every rank ends with the whole state. Logits of a few positions (a prompt's last token, a question's
    choices, each decoding step) are computed by every rank from that state, so every rank of the group holds the
    same results and the same state.

    A family gives `make_slice(batch, length, state)`: hooks with `start`, `end` (this rank's slice of the call) and
    `steps` (its [a, b) pieces, aligned as one process would step them), passed to its model's forward.
    """

    def __init__(self, lm: Any, chunk: Any):
        super().__init__(lm, chunk)
        self.model, self.vocab_size, self.out_size = lm.model, lm.vocab_size, lm.out_size
        self.score_chunk = lm.score_chunk
        self.exchange = Exchange(chunk) if chunk.size > 1 else None

    def make_slice(self, batch: int, length: int, state: Any) -> Any:
        raise NotImplementedError

    def init_state(self, batch_size: int) -> Any:
        return self.lm.init_state(batch_size)

    def step(self, batch_size: int) -> int:
        return self.lm.step(batch_size)

    def _batch_of(self, state: Any) -> int:
        return self.lm._batch_of(state)

    def _chunk_nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        return self.lm._chunk_nll(hidden, targets)

    def _run(self, tokens: Tensor, state: Any, consume: Any) -> Any:
        """This rank's slice of the call through the model, each of its steps handed to `consume` (positions within
        the call); the state after the whole call, on every rank."""
        if self.exchange is None:
            return self.lm._run(tokens, state, consume)
        part = self.make_slice(tokens.shape[0], tokens.shape[1], state)
        hidden, state = self.model(tokens[:, part.start : part.end], state, part)
        for a, b in part.steps:
            consume(part.start + a, hidden[:, a:b])
        return state

    @torch.inference_mode()
    def score(self, inputs: Tensor, targets: Tensor, state: Any) -> tuple[Tensor, Any]:
        """NLL [B, T] of `targets` on every rank; each rank computes its slice of the call."""
        inputs = torch.as_tensor(inputs, device=self.device)
        targets = torch.as_tensor(targets, device=self.device)
        if self.exchange is None or (inputs.dim() == 2 and inputs.shape[1] == 0):
            return self.lm.score(inputs, targets, state)
        self.exchange.agree(inputs, targets, state.position)  # before any check: bad input fails on every rank
        position = state.position
        nll, state = ChunkedStreamingLM.score(self, inputs, targets, state)
        slices = chunk_slices(nll.shape[1], self.chunk.size, self.score_chunk, position)
        counts = [e - s for s, e in slices]
        s, e = slices[self.chunk.rank]
        mine = nll.new_zeros(nll.shape[0], max(counts))
        mine[:, : e - s] = nll[:, s:e]
        return torch.cat([p[:, :n] for p, n in zip(self.exchange.all_gather(mine), counts, strict=True)], 1), state

    def advance(self, tokens: Tensor, state: Any) -> Any:
        """The state after `tokens`, read chunk parallel."""
        tokens = torch.as_tensor(tokens, device=self.device)
        return self.score(tokens, torch.full_like(tokens, IGNORE_INDEX), state)[1]

    def forward(self, tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        """Logits [B, T, V] of every position, computed by every rank (for the few positions decoding needs)."""
        return self.lm.forward(tokens, state)

    def forward_last(self, tokens: Tensor, state: Any, last: int) -> tuple[Tensor, Any]:
        """Read all but the last `last` positions chunk parallel, then their logits on every rank."""
        tokens = torch.as_tensor(tokens, device=self.device)
        keep = min(max(last, 0), tokens.shape[-1])
        if tokens.dim() == 2 and keep < tokens.shape[1]:
            state = self.advance(tokens[:, : tokens.shape[1] - keep], state)
            tokens = tokens[:, tokens.shape[1] - keep :]
        return self.lm.forward_last(tokens, state, keep)
