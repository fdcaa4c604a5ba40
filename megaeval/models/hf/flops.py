"""Matmul FLOPs per token of a transformers causal LM (the model FLOPs of `ppl-sweep`'s MFU)."""

from __future__ import annotations

from typing import Any

from torch import nn

EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def matmul_weights(model: nn.Module) -> int:
    """Multiply-adds per token of every linear layer (nn.Linear, and transformers' Conv1D of GPT-2), each weight
    counted once (a tied output layer is the one the forward pass runs): embedding lookups are not matmuls."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            key, size = id(module.weight), module.in_features * module.out_features
        elif type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
            key, size = id(module.weight), module.weight.numel()
        else:
            continue
        if key not in seen:
            seen.add(key)
            total += size
    return total


def window_keys_per_token(length: int, window: int | None) -> float:
    """Keys a token attends to under causal attention, sliding over the last `window` tokens (None: all), averaged
    over a fresh pass of `length` tokens."""
    if window is None or window >= length:
        return (length + 1) / 2
    return (window * (window + 1) / 2 + (length - window) * window) / length


def layer_windows(cfg: Any, layers: int) -> list[int | None]:
    """Each layer's attention window (None: full causal) from the config: `layer_types` where it has them, else
    `sliding_window` for every layer (unless `use_sliding_window` is false)."""
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) == layers:
        return [window if t == "sliding_attention" and isinstance(window, int) else None for t in types]
    if isinstance(window, int) and window > 0 and getattr(cfg, "use_sliding_window", True):
        return [window] * layers
    return [None] * layers


def flops_per_token(model: nn.Module, context_length: int) -> float | None:
    """2 x the linear layers' multiply-adds, plus causal attention: per layer, each key a token meets costs
    heads x head_dim multiply-adds for QK^T and as many for PV; averaged over a fresh pass of `context_length`
    tokens. None for mixture-of-experts models (not every weight runs) and configs without the usual fields."""
    cfg = model.config
    if any(isinstance(n := getattr(cfg, name, None), int) and n > 1 for name in EXPERT_FIELDS):
        return None
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None)
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0):
        return None
    head_dim = getattr(cfg, "head_dim", None) or (hidden // heads if isinstance(hidden, int) else None)
    if not isinstance(head_dim, int):
        return None
    attention = sum(window_keys_per_token(context_length, w) for w in layer_windows(cfg, layers))
    return 2 * matmul_weights(model) + 2 * attention * 2 * heads * head_dim
