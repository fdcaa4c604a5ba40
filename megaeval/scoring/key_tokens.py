"""LongPPL's model passes (`metrics.longppl` holds the arithmetic): an evaluator's full-context and short-context
losses over a document, the key-token character spans they give, and the evaluated model's losses on its own tokens.

The full-context losses come from one streamed pass (`lm.score` from a fresh state: chunk by chunk for a
state-carrying model, through the KV cache for a Transformer), never from windows: a fixed-context evaluator shorter
than the document is refused. The short-context windows are read from fresh states, those of one length `batch_size`
at a time.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import fail
from ..metrics.longppl import KeySettings, key_positions, merge_spans, short_windows, tokens_inside
from ..models.base import StreamingLM
from .finite import require_finite

CONTEXT_FIX = (
    "use an evaluator whose context holds the document (--evaluator-args max_context=N where its positions allow it; "
    "--chunk-parallel P spreads its KV cache over P ranks under torchrun), or a state-carrying evaluator"
)


def check_fits(lm: StreamingLM, n_tokens: int, what: str, fix: str, whose: str = "the model") -> None:
    """Refuse a fixed-context model asked to read `n_tokens` in one pass (never windowed silently)."""
    if lm.max_context is not None and n_tokens > lm.max_context:
        raise fail(f"{what} has {n_tokens:,} tokens but {whose}'s context is {lm.max_context:,} tokens", fix)


def check_evaluator_fits(evaluator: StreamingLM, n_tokens: int, key: KeySettings, what: str) -> None:
    """Refuse a document the evaluator cannot judge: no token past `--trunc-len`, or more tokens than its context."""
    if key.trunc_len >= n_tokens:
        raise fail(f"--trunc-len {key.trunc_len:,} is not below {what}'s {n_tokens:,} evaluator tokens: no token has "
                   "a short context to compare with", "pass a smaller --trunc-len, or longer documents")  # fmt: skip
    check_fits(evaluator, n_tokens, what, CONTEXT_FIX, "the evaluator")


def full_nll(lm: StreamingLM, ids: list[int] | np.ndarray, what: str) -> np.ndarray:
    """NLL [n] (float64) of every token of `ids` given all tokens before it, one streamed pass; position 0: NaN."""
    tokens = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=lm.device)[None]
    out = np.full(tokens.shape[1], np.nan)
    if tokens.shape[1] > 1:
        with torch.inference_mode():
            nll, _ = lm.score(tokens[:, :-1], tokens[:, 1:], lm.init_state(1))
        out[1:] = require_finite(nll, f"the losses of {what}")[0].double().cpu().numpy()
    return out


def short_nll(lm: StreamingLM, ids: list[int] | np.ndarray, key: KeySettings, batch_size: int, what: str) -> np.ndarray:
    """NLL [n] of the positions each short-context window scores (the reference's windows), NaN elsewhere."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full(len(ids), np.nan)
    spans = short_windows(len(ids), key.trunc_len, key.sliding_window)
    by_length: dict[int, list[int]] = {}
    for start, end in spans:
        by_length.setdefault(end - start, []).append(start)
    for length, starts in by_length.items():
        for k in range(0, len(starts), batch_size):
            rows = starts[k : k + batch_size]
            window = torch.as_tensor(np.stack([ids[s : s + length] for s in rows]), device=lm.device)
            with torch.inference_mode():
                nll, _ = lm.score(window[:, :-1], window[:, 1:], lm.init_state(len(rows)))
            nll = require_finite(nll, f"the short-context losses of {what}").double().cpu().numpy()
            for row, start in enumerate(rows):  # nll[:, j] scores window position j + 1
                out[start + key.trunc_len : start + length] = nll[row, key.trunc_len - 1 :]
    return out


def key_spans(
    evaluator: StreamingLM, ids: list[int], offsets: list[tuple[int, int]], key: KeySettings, batch_size: int,
    what: str,
) -> tuple[list[tuple[int, int]], int]:  # fmt: skip
    """The document's key-token character spans (merged where they touch) and the evaluator's count of key tokens,
    from its tokens `ids` (default special tokens included) and their `offsets` (checked by `check_evaluator_fits`)."""
    full = full_nll(evaluator, ids, what)
    short = short_nll(evaluator, ids, key, batch_size, what)
    positions = key_positions(full, short, key.alpha, key.beta)
    return merge_spans([offsets[p] for p in positions]), len(positions)


def model_key_positions(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """The evaluated model's key target positions: its tokens wholly inside a span, except the first token, which
    no loss predicts (the reference would read loss index -1 there, the document's last loss)."""
    chosen = np.asarray(tokens_inside(offsets, spans), dtype=np.int64)
    return chosen[chosen >= 1]


def load_evaluator(spec: str, args: dict, lm: StreamingLM, dtype: str) -> StreamingLM:
    """The evaluator, on the model's device; under --chunk-parallel spread over the model's group as the model is."""
    from ..models import chunk_parallel_lm, load_model, model_options, naming

    with naming("--evaluator", spec):
        evaluator = load_model(spec, device=lm.device, dtype=dtype, **model_options(spec, args))
    if getattr(lm, "chunk", None) is not None:
        evaluator = chunk_parallel_lm(evaluator, lm.chunk)
    return evaluator
