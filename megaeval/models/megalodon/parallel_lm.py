"""ChunkParallelLM: MEGALODON over a chunk-parallel group, as a StreamingLM (`--chunk-parallel P`).

Reading (`score`, `advance`, and the prompt part of `forward_last`) is chunk parallel: every rank computes
its slice (`score_chunk_parallel`) and ends with the whole state, which MEGALODON keeps at a constant size.
Logits of a few positions (a prompt's last token, a question's choices, each decoding step) are computed
by every rank from that state, so every rank of the group holds the same results and the same state.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...kernels.nll import IGNORE_INDEX
from ..group import GroupLM
from .adapter import MegalodonLM
from .chunk_parallel import check_supported, score_chunk_parallel
from .model import MegalodonState


class ChunkParallelLM(GroupLM):
    """MegalodonLM `lm` spread over group `chunk`: every call is collective over the group (see GroupLM)."""

    lm: MegalodonLM

    def __init__(self, lm: MegalodonLM, chunk: Any):
        check_supported(lm)
        super().__init__(lm, chunk)

    def init_state(self, batch_size: int) -> MegalodonState:
        return self.lm.init_state(batch_size)

    def score(self, inputs: Tensor, targets: Tensor, state: MegalodonState) -> tuple[Tensor, MegalodonState]:
        """NLL [B, T] of `targets` on every rank; each rank computes its slice of the call."""
        nll, state = score_chunk_parallel(self.lm, inputs, targets, self.chunk, state, keep_state=True)
        return nll, state

    def advance(self, tokens: Tensor, state: MegalodonState) -> MegalodonState:
        """The state after `tokens`, read chunk parallel."""
        tokens = torch.as_tensor(tokens, device=self.device)
        return self.score(tokens, torch.full_like(tokens, IGNORE_INDEX), state)[1]

    def forward(self, tokens: Tensor, state: MegalodonState) -> tuple[Tensor, MegalodonState]:
        """Logits [B, T, V] of every position, computed by every rank (for the few positions decoding needs)."""
        return self.lm.forward(tokens, state)

    def forward_last(self, tokens: Tensor, state: MegalodonState, last: int) -> tuple[Tensor, MegalodonState]:
        """Read all but the last `last` positions chunk parallel, then their logits on every rank."""
        tokens = torch.as_tensor(tokens, device=self.device)
        keep = min(max(last, 0), tokens.shape[-1])
        if tokens.dim() == 2 and keep < tokens.shape[1]:
            state = self.advance(tokens[:, : tokens.shape[1] - keep], state)
            tokens = tokens[:, tokens.shape[1] - keep :]
        return self.lm.forward_last(tokens, state, keep)
