"""The scoring calls of the lm-eval adapter (`megaeval.harness`), on megaeval's request scoring: log-likelihoods
grouped by context, rolling log-likelihoods (one carried pass, or the harness's own windows), greedy generation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from .models import StreamingLM
from .scoring.finite import require_finite
from .scoring.generate import decode_rows, prefill
from .scoring.requests import score_request_pair_sets, truncate_prompt
from .scoring.windows import score_windows


def loglikelihoods(lm: StreamingLM, pairs: Sequence[tuple[list[int], list[int]]], progress: bool = False,
                   batch_size: int = 1) -> list[tuple[float, bool]]:  # fmt: skip
    """(log-probability, is_greedy) of each (context ids, continuation ids), in the given order.

    Requests are grouped by context: each distinct context is read once and its continuations are
    scored from clones of its state, so the numbers do not depend on the order of the requests.
    `batch_size` contexts are scored together (`score_request_pair_sets`: their choices share calls).
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (context, _) in enumerate(pairs):
        groups.setdefault(tuple(context), []).append(i)
    out: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
    items, step = list(groups.items()), max(batch_size, 1)
    chunks = [items[k : k + step] for k in range(0, len(items), step)]
    for chunk in tqdm(chunks, desc="megaeval loglikelihood", disable=not progress):
        sets = [([(list(context), list(pairs[i][1])) for i in members], None) for context, members in chunk]
        for (_, members), scored in zip(chunk, score_request_pair_sets(lm, sets), strict=True):
            for i, logprob, greedy in zip(members, scored.loglikelihoods, scored.is_greedy, strict=True):
                out[i] = (logprob, greedy)
    return out


def rolling_full(lm: StreamingLM, ids: list[int], window_policy: str = "disjoint") -> float:
    """log P(ids[1:] | ids[0]): one pass carrying the state, or `window_policy` windows for a fixed context."""
    if len(ids) < 2:
        return 0.0
    tokens = torch.tensor([ids], dtype=torch.long, device=lm.device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if lm.max_context is None:
        nll, _ = lm.score(inputs, targets, lm.init_state(1))
    else:
        nll = score_windows(lm, inputs, targets, window_policy, lm.max_context)
    return -float(require_finite(nll, "the NLLs of a document").double().sum())


def harness_windows(tokens: list[int], prefix: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """The harness's rolling windows of a document: (context, continuation) pairs, disjoint continuations."""
    return [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, prefix, max_length, 1)]


def rolling_harness(lm: StreamingLM, tokens: list[int], prefix: int, max_length: int) -> float:
    """log P(document) the harness's way: each of its windows read from a fresh state."""
    total = 0.0
    for context, continuation in harness_windows(tokens, prefix, max_length):
        ids = context + continuation
        targets = [-100] * (len(context) - 1) + continuation  # only the continuation is scored
        inputs = torch.tensor([ids[:-1]], dtype=torch.long, device=lm.device)
        nll, _ = lm.score(inputs, torch.tensor([targets], dtype=torch.long, device=lm.device), lm.init_state(1))
        total -= float(require_finite(nll, "the NLLs of a document window").double().sum())
    return total


def generate(lm: StreamingLM, ids: list[int], until: list[str], max_gen_toks: int) -> str:
    """Greedy continuation of `ids` on the carried state, cut at the first `until` string (or EOS)."""
    return generate_many(lm, [ids], until, max_gen_toks)[0]


def generate_many(lm: StreamingLM, prompts: list[list[int]], until: list[str], max_gen_toks: int,
                  batch_size: int = 1) -> list[str]:  # fmt: skip
    """`generate` for several prompts, decoded `batch_size` at a time (each gets what it gets alone)."""
    kept = [truncate_prompt(ids, lm.max_context, max_gen_toks)[0] for ids in prompts]  # as the harness truncates
    rows = (prefill(lm, ids, lm.init_state(1)) for ids in kept)
    return [g.text for g in decode_rows(lm, rows, max_gen_toks, until, batch_size)]
