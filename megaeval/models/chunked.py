"""The calls every state-carrying family implements the same way, on top of one step of its model.

A family gives `_step(tokens, state)`: its model over a few tokens, returning the final hidden states and the
state after them. This base walks a call in steps aligned to absolute positions (`_run`), so that numbers do not
depend on how a sequence is split into calls, and gives from that one loop `forward`, `forward_last`, `score`
(at most one chunk of logits alive), `advance` and the token checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import fail
from .base import State, StreamingLM


def steps(position: int, length: int, step: int) -> list[tuple[int, int]]:
    """[a, b) offsets covering `length` tokens that start at absolute `position`, cut at absolute multiples of
    `step` (the internal steps of a call: any split of a sequence into calls steps alike)."""
    out, a = [], 0
    while a < length:
        b = min(length, a + step - (position + a) % step)
        out.append((a, b))
        a = b
    return out


class ChunkedStreamingLM(StreamingLM):
    """A StreamingLM that runs its model in steps of whole chunks. A family subclass provides:

    * `model`: the module, with `logits(hidden)` -> [B, T, out_size] logits (float32, float64 for float64 models)
      of final hidden states [B, T, D] (`forward_last` runs it only where logits are asked for);
    * `_step(tokens, state)`: the model over tokens [B, n] (n <= `step(B)`, never crossing an absolute multiple of
      it) -> (final hidden states [B, n, D], the state after them);
    * `_chunk_nll(hidden, targets)`: per-token NLL [B, c] of targets (-100 scores 0) after hidden states [B, c, D],
      c <= score_chunk (a family may fuse the output layer and the cross-entropy there);
    * `_batch_of(state)`: the batch size a state was made for;
    * `vocab_size` (token ids accepted), `out_size` (logits per position), `score_chunk` (positions whose logits
      `score` holds at once; steps are whole multiples of it);
    * states (`init_state`) satisfying `State`, with `position`: the number of tokens consumed.

    `step(batch_size)` (tokens per row per step: whole score chunks, about `step_tokens` for the whole batch,
    bounding activations) may be overridden.
    """

    vocab_size: int  # token ids accepted
    out_size: int  # logits per position
    score_chunk: int  # positions whose logits `score` holds at once
    step_tokens: int = 2048  # tokens (all batch rows together) per internal step: bounds activations
    model: Any  # has logits(hidden)

    def _step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def _batch_of(self, state: Any) -> int:
        raise NotImplementedError

    def _chunk_nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, batch_size: int) -> int:
        """Tokens per row per internal step: whole score chunks, about `step_tokens` for the whole batch."""
        return self.score_chunk * max(1, self.step_tokens // (batch_size * self.score_chunk))

    def _run(self, tokens: torch.Tensor, state: Any, consume: Callable[[int, torch.Tensor], None]) -> Any:
        """Run the model over `tokens` in steps aligned to absolute multiples of `step`, handing each step's start
        and final hidden states to `consume`; return the state after the last token."""
        if isinstance(state.position, list):  # rows at different positions (a stacked state)
            return self._run_rows(tokens, state, consume)
        for a, b in steps(state.position, tokens.shape[1], self.step(tokens.shape[0])):
            hidden, state = self._step(tokens[:, a:b], state)
            consume(a, hidden)
        return state

    def _run_rows(self, tokens: torch.Tensor, state: Any, consume: Callable[[int, torch.Tensor], None]) -> Any:
        """`_run` on rows at different positions: one token steps them together (the family's `_step` takes one
        position per row); longer calls run each row alone, as it would run by itself, and stack them back."""
        if tokens.shape[1] <= 1:
            hidden, state = self._step(tokens, state)
            consume(0, hidden)
            return state
        parts: list[torch.Tensor] = []
        rows = []
        for r in range(tokens.shape[0]):
            mine: list[torch.Tensor] = []
            rows.append(self._run(tokens[r : r + 1], state.select([r]), lambda a, h, mine=mine: mine.append(h)))
            parts.append(torch.cat(mine, 1))
        consume(0, torch.cat(parts, 0))
        return type(state).stack(rows)

    def forward(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Logits [B, T, V] for tokens [B, T] after `state`, and the state after them."""
        return self.forward_last(tokens, state, torch.as_tensor(tokens).shape[-1])

    @torch.inference_mode()
    def forward_last(self, tokens: torch.Tensor, state: State, last: int) -> tuple[torch.Tensor, State]:
        """Logits [B, last, V] of the last `last` positions only (the output layer runs only there), and the state."""
        tokens = self._check_tokens(tokens, state)
        first = tokens.shape[1] - min(max(last, 0), tokens.shape[1])
        logits: list[torch.Tensor] = []

        def consume(start: int, hidden: torch.Tensor) -> None:
            if start + hidden.shape[1] > first:
                logits.append(self.model.logits(hidden[:, max(0, first - start) :]))

        state = self._run(tokens, state, consume)
        if not logits:
            out_dtype = torch.promote_types(self.dtype, torch.float32)
            return torch.zeros(tokens.shape[0], 0, self.out_size, dtype=out_dtype, device=self.device), state
        return torch.cat(logits, dim=1), state

    @torch.inference_mode()
    def score(self, inputs: torch.Tensor, targets: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """NLL [B, T] of each target given the inputs so far (-100 scores 0); at most one chunk of logits lives."""
        inputs = self._check_tokens(inputs, state)
        targets = torch.as_tensor(targets, device=self.device)
        if targets.shape != inputs.shape:
            raise fail(f"targets shape {list(targets.shape)} differs from inputs shape {list(inputs.shape)}")
        targets = targets.long()
        B, T = inputs.shape
        nll = torch.zeros(B, T, dtype=torch.promote_types(self.dtype, torch.float32), device=self.device)
        chunk = self.score_chunk

        def score_step(start: int, hidden: torch.Tensor) -> None:
            for s in range(start, start + hidden.shape[1], chunk):
                piece = hidden[:, s - start : s - start + chunk]
                e = s + piece.shape[1]
                nll[:, s:e] = self._chunk_nll(piece, targets[:, s:e])

        state = self._run(inputs, state, score_step)
        return nll, state

    def advance(self, tokens: torch.Tensor, state: State) -> State:
        """The state after `tokens`, without computing any logits."""
        return self.forward_last(tokens, state, 0)[1]

    def _check_tokens(self, tokens: Any, state: Any) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, device=self.device)
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise fail(f"tokens must be an integer tensor [batch, time], got {tokens.dtype} {list(tokens.shape)}")
        if tokens.shape[0] != self._batch_of(state):
            raise fail(
                f"tokens have batch size {tokens.shape[0]} but the state was made for {self._batch_of(state)}",
                "use init_state(batch_size) with the same batch size",
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise fail(
                f"token ids must lie in [0, {self.vocab_size}), got [{int(tokens.min())}, {int(tokens.max())}]",
                "encode with this model's tokenizer",
            )
        return tokens.long()
