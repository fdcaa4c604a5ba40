"""Layers the recurrent architectures share: the causal depthwise conv whose last inputs every one of them carries
(Mamba, Mamba-2, RecurrentGemma), the output layer's logits, and rows of states stacked and selected."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def causal_conv(x: Tensor, conv_state: Tensor, conv: nn.Conv1d, silu: bool = True) -> tuple[Tensor, Tensor]:
    """(silu of) the causal depthwise conv of x [B, T, C] continuing `conv_state` [B, C, k-1] (the inputs before x):
    ([B, T, C], the new conv state: the last k-1 inputs)."""
    k = conv.weight.shape[-1]
    if x.shape[1] == 0:
        return x, conv_state
    full = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=2)
    out = F.conv1d(full, conv.weight, conv.bias, groups=full.shape[1])
    return (F.silu(out) if silu else out).transpose(1, 2), full[:, :, full.shape[2] - (k - 1) :]


def output_logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """Logits [B, T, V] of final hidden states under the output weight: float32 (float64 for float64 models)."""
    return F.linear(hidden.to(weight.dtype), weight).to(torch.promote_types(weight.dtype, torch.float32))


def stacked_rows(layer_states: list[Any]) -> Any:
    """One layer state whose rows are those of `layer_states` (dataclasses of [B, ...] tensors), in order."""
    first = layer_states[0]
    return type(first)(*(torch.cat([getattr(s, f.name) for s in layer_states], 0) for f in fields(first)))


def selected_rows(layer_state: Any, index: Tensor) -> Any:
    """The layer state of the rows at `index` only (new tensors)."""
    return type(layer_state)(*(getattr(layer_state, f.name).index_select(0, index) for f in fields(layer_state)))


class PositionFreeRows:
    """`stack` and `select` for a state of per-layer dataclasses of [B, ...] tensors (`layers`) and a `position` that
    is bookkeeping only: rows of a recurrence need no positions (a stacked batch keeps the largest)."""

    layers: list[Any]
    position: int

    @classmethod
    def stack(cls, states: list[Any]) -> Any:
        """One batch of the rows of `states`, in order."""
        layers = [stacked_rows([s.layers[i] for s in states]) for i in range(len(states[0].layers))]
        return cls(layers, max(s.position for s in states))

    def select(self, rows: list[int]) -> Any:
        """A state of the given rows only, in that order (this one is left as it was)."""
        first = self.layers[0]
        index = torch.tensor(rows, dtype=torch.long, device=getattr(first, fields(first)[0].name).device)
        return type(self)([selected_rows(s, index) for s in self.layers], self.position)
