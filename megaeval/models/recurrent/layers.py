"""Layers the recurrent architectures share: the causal depthwise conv whose last inputs every one of them carries
(Mamba, Mamba-2, RecurrentGemma), and the output layer's logits."""

from __future__ import annotations

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
