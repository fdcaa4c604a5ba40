"""RecurrentGemma's state: per layer, the recurrent conv and RG-LRU state or the attention window's keys and
values, and the tokens consumed (one position, or one per row for rows stacked from states of different lengths)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..base import one_or_per_row, per_row, repeated_rows
from .layers import selected_rows, stacked_rows


@dataclass
class RecurrentLayerState:
    """A recurrent layer: the conv's last inputs [B, W, k-1] (model dtype) and the RG-LRU state [B, W]."""

    conv: Tensor
    lru: Tensor

    def clone(self) -> RecurrentLayerState:
        return RecurrentLayerState(self.conv.clone(), self.lru.clone())

    def repeat(self, n: int) -> RecurrentLayerState:
        return RecurrentLayerState(self.conv.repeat_interleave(n, 0), self.lru.repeat_interleave(n, 0))


@dataclass
class AttentionLayerState:
    """An attention layer: keys and values [B, Hkv, window - 1, d] of the tokens before, the latest last (slots
    before the first token of a sequence hold zeros and are never attended to)."""

    keys: Tensor
    values: Tensor

    def clone(self) -> AttentionLayerState:
        return AttentionLayerState(self.keys.clone(), self.values.clone())

    def repeat(self, n: int) -> AttentionLayerState:
        return AttentionLayerState(self.keys.repeat_interleave(n, 0), self.values.repeat_interleave(n, 0))


@dataclass
class RecurrentGemmaState:
    """Every layer's state, and the number of tokens consumed: one int, or one per row for a batch stacked from
    states of different lengths."""

    layers: list[RecurrentLayerState | AttentionLayerState]
    position: int | list[int] = 0
    rows_share_calls: ClassVar[bool] = False  # stacked rows at different positions read more than a token row by row

    @property
    def lead(self) -> Tensor:
        """The first layer's main tensor (batch size and device)."""
        first = self.layers[0]
        return first.lru if isinstance(first, RecurrentLayerState) else first.keys

    @property
    def batch_size(self) -> int:
        """Sequences (rows) the state holds."""
        return self.lead.shape[0]

    def clone(self) -> RecurrentGemmaState:
        """A deep copy sharing no tensor."""
        return RecurrentGemmaState([s.clone() for s in self.layers], self.position)

    def repeat(self, n: int) -> RecurrentGemmaState:
        """A state for B * n sequences, row i * n + j a copy of row i (this one is left as it was)."""
        return RecurrentGemmaState([s.repeat(n) for s in self.layers], repeated_rows(self.position, n))

    def positions(self) -> list[int]:
        """Each row's position."""
        return per_row(self.position, self.batch_size)

    @staticmethod
    def stack(states: list[RecurrentGemmaState]) -> RecurrentGemmaState:
        """One batch of the rows of `states`, in order, each row keeping its own position."""
        layers = [stacked_rows([s.layers[i] for s in states]) for i in range(len(states[0].layers))]
        return RecurrentGemmaState(layers, one_or_per_row([p for s in states for p in s.positions()]))

    def select(self, rows: list[int]) -> RecurrentGemmaState:
        """A state of the given rows only, in that order (this one is left as it was)."""
        index, every = torch.tensor(rows, dtype=torch.long, device=self.lead.device), self.positions()
        layers = [selected_rows(s, index) for s in self.layers]
        return RecurrentGemmaState(layers, one_or_per_row([every[r] for r in rows]))

    def nbytes(self) -> int:
        """Bytes of every tensor held (constant: the attention window is allocated whole)."""
        return sum(t.numel() * t.element_size() for s in self.layers for t in vars(s).values())
