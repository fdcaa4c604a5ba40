"""Scoring segments longer than a model's max_context (W) with a window policy.

* ``error``: refuse.
* ``disjoint``: score the segment in pieces of W targets, each from a fresh state.
* ``sliding:S``: windows of W inputs starting at 0, S, 2S, ...; each window scores only the targets
  no earlier window scored (the first scores all W, later ones their last S), so every target
  is scored exactly once, with at least W - S + 1 tokens of context after the first window.

Windows start at the segment's start and the last one is cut at the segment's end, so a target's
window never depends on the segment's length: a shorter segment is a prefix of a longer one, as
the sweep's shared-prefix schedule needs.
"""

from __future__ import annotations

import torch

from ..errors import fail
from ..models.base import StreamingLM

POLICIES = "error, disjoint or sliding:S"


def parse_window_policy(text: str) -> tuple[str, int | None]:
    """'error' | 'disjoint' | 'sliding:S' -> (kind, stride)."""
    kind, _, stride = str(text).partition(":")
    if kind in ("error", "disjoint") and not stride:
        return kind, None
    if kind == "sliding" and stride.isdigit() and int(stride) > 0:
        return kind, int(stride)
    raise fail(f"bad --window-policy {text!r}", f"use {POLICIES} (S a positive number of tokens)")


def windows(length: int, max_context: int, policy: str) -> list[tuple[int, int, int]]:
    """(start, end, first_scored) of each window over inputs [0, length): it reads [start, end)
    and scores targets first_scored .. end-1 (target i follows input i)."""
    kind, stride = parse_window_policy(policy)
    if length <= max_context:
        return [(0, length, 0)]
    if kind == "error":
        raise fail(f"context length {length:,} exceeds the model's max_context {max_context:,}",
                   "use shorter --lengths, or --window-policy disjoint or sliding:S")  # fmt: skip
    if kind == "disjoint":
        return [(s, min(s + max_context, length), s) for s in range(0, length, max_context)]
    if stride > max_context:
        raise fail(f"sliding stride {stride} exceeds max_context {max_context}", "targets would go unscored")
    out, scored = [], 0
    start = 0
    while scored < length:
        end = min(start + max_context, length)
        out.append((start, end, scored))
        scored = end
        start += stride
    return out


def score_windows(
    lm: StreamingLM, inputs: torch.Tensor, targets: torch.Tensor, policy: str, max_context: int
) -> torch.Tensor:
    """NLL [B, T] of a segment, every window read by `lm.score` from a fresh state."""
    nll = None
    for start, end, first in windows(inputs.shape[1], max_context, policy):
        part, _ = lm.score(inputs[:, start:end], targets[:, start:end], lm.init_state(inputs.shape[0]))
        if nll is None:
            nll = part.new_zeros(inputs.shape)
        nll[:, first:end] = part[:, first - start :]
    return nll
