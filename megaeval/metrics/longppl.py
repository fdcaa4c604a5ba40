"""LongPPL's arithmetic (Fang et al., ICLR 2025, arXiv 2410.23771) on per-token losses, as the reference computes
it (`longppl` 0.3.0, longppl/longppl.py = PKU-ML/LongPPL@1decd2a): the pieces a command puts around model passes.

Losses here are indexed by target position: `nll[p]` is -log P(token p | tokens before p) in nats (p >= 1; position
0 has no loss).

- Short-context windows (`find_key_token`): for s in range(0, n - T, W) the evaluator reads ids[s : s + T + W]
  (the last window shortened to the text's end) and scores positions [s + T, s + T + W): each scored token sees T to
  T + W - 1 tokens, and the first T positions are never key.
- A key token: short - full > alpha and full < -beta (both strict; alpha 2, beta -2 by default).
- Key tokens become the evaluator's character spans (offset mapping), merged where one ends exactly where the next
  starts (`merge_intervals`); the evaluated model's key tokens are its tokens lying wholly inside a span, bounds
  included (`cal_overlap`), so the two tokenizers may differ.
- LongPPL of a document: exp(mean NLL over its key tokens), None without key tokens; over documents, token-weighted
  (the repository's perplexity.py since July 2025): exp(sum of key-token NLLs / number of key tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import fail

DEFAULT_TRUNC_LEN = 4096
DEFAULT_SLIDING_WINDOW = 1024
DEFAULT_ALPHA = 2.0
DEFAULT_BETA = -2.0
DEFAULT_SETTINGS = {"trunc_len": DEFAULT_TRUNC_LEN, "sliding_window": DEFAULT_SLIDING_WINDOW, "alpha": DEFAULT_ALPHA,
                    "beta": DEFAULT_BETA}  # fmt: skip


@dataclass(frozen=True)
class KeySettings:
    """How key tokens are found: the short context and the two thresholds (the reference's names)."""

    trunc_len: int
    sliding_window: int
    alpha: float
    beta: float


def short_windows(n: int, trunc_len: int, sliding_window: int) -> list[tuple[int, int]]:
    """The evaluator's short-context windows over a text of `n` tokens: (start, end) of each slice ids[start:end];
    each scores positions [start + trunc_len, end)."""
    if trunc_len < 1 or sliding_window < 1:
        raise fail(f"--trunc-len {trunc_len} and --sliding-window {sliding_window} must be positive",
                   "use the reference's 4096 and 1024, or other positive sizes")  # fmt: skip
    return [(s, min(s + trunc_len + sliding_window, n)) for s in range(0, n - trunc_len, sliding_window)]


def key_positions(full_nll: np.ndarray, short_nll: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """Target positions whose loss falls by more than `alpha` with the whole context and is below -`beta` with it
    (positions without a short-context loss, NaN in `short_nll`, are never key)."""
    full, short = np.asarray(full_nll, dtype=np.float64), np.asarray(short_nll, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        key = ((short - full) > alpha) & (full < -beta) & ~np.isnan(short)
    return np.flatnonzero(key)


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character spans in order, merged where one ends exactly where the next starts (not across a gap)."""
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((int(start), int(end)))
    return merged


def tokens_inside(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of the tokens (by their character offsets, in order) lying wholly inside one of the spans (in order),
    bounds included: the reference's two-pointer walk."""
    chosen, i, j = [], 0, 0
    while i < len(offsets) and j < len(spans):
        (a_start, a_end), (b_start, b_end) = offsets[i], spans[j]
        if a_start >= b_start and a_end <= b_end:
            chosen.append(i)
            i += 1
        elif a_start < b_start:
            i += 1
        else:
            j += 1
    return chosen


def document_longppl(nll: np.ndarray, key: Sequence[int]) -> float | None:
    """exp(mean NLL over the key target positions), or None when there are none."""
    key = [p for p in key if p >= 1]  # position 0 is predicted by nothing
    if not key:
        return None
    return math.exp(float(np.mean(np.asarray(nll, dtype=np.float64)[key])))


def pooled_perplexity(documents: Sequence[tuple[float | None, int]]) -> float | None:
    """A perplexity over documents weighted as the reference's perplexity.py weights them: exp(sum n_d log P_d /
    sum n_d) (LongPPL: n_d its key tokens; perplexity: its tokens); documents without a value (None: no key tokens)
    are left out, and None when no document has one."""
    kept = [(value, n) for value, n in documents if value is not None and n > 0]
    total = sum(n for _, n in kept)
    if total == 0:
        return None
    return math.exp(sum(n * math.log(value) for value, n in kept) / total)
