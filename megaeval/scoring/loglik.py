"""Log-likelihood of continuations given a context, reading the context once and reusing its state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..models.base import StreamingLM
from .generate import prefill


@dataclass
class Continuation:
    """Score of one continuation: sum of its tokens' log-probabilities, and whether greedy decoding
    would have produced it."""

    logprob: float
    is_greedy: bool
    tokens: int


@dataclass
class Prefix:
    """The start of many contexts (a few-shot block, say), read once, and the state after it."""

    ids: list[int]
    state: Any


def read_prefix(lm: StreamingLM, ids: list[int]) -> Prefix:
    """Read `ids` from a fresh state."""
    state = lm.init_state(1)
    if ids:
        _, state = prefill(lm, ids, state)
    return Prefix(list(ids), state)


def starts_with(context: list[int], prefix: Prefix | None) -> bool:
    """Whether `context` begins with the prefix's tokens and goes on after them."""
    return prefix is not None and 0 < len(prefix.ids) < len(context) and context[: len(prefix.ids)] == prefix.ids


def continuation_logprobs(
    lm: StreamingLM, context: list[int], continuations: list[list[int]], prefix: Prefix | None = None
) -> list[Continuation]:
    """Score each continuation after `context` (non-empty, e.g. starting with BOS).

    The context is read once; its state is cloned for every continuation, so the model reads
    len(context) + sum(len(c) - 1) tokens instead of sum(len(context) + len(c)). When `context`
    starts with `prefix`'s tokens, only the rest of it is read, from a clone of the prefix's state.
    """
    state, rest = lm.init_state(1), context
    if starts_with(context, prefix):
        state, rest = prefix.state.clone(), context[len(prefix.ids) :]
    logits, state = prefill(lm, rest, state)
    first = torch.log_softmax(logits.double(), -1)
    scores = []
    for cont in continuations:
        if not cont:
            raise ValueError("empty continuation")
        logprob = float(first[cont[0]])
        greedy = int(first.argmax()) == cont[0]
        if len(cont) > 1:
            step, _ = lm.forward(torch.tensor([cont[:-1]], device=lm.device), state.clone())
            logp = torch.log_softmax(step[0].double(), -1)
            target = torch.tensor(cont[1:], device=logp.device)
            logprob += float(logp.gather(-1, target[:, None]).sum())
            greedy = greedy and bool((logp.argmax(-1) == target).all())
        scores.append(Continuation(logprob, greedy, len(cont)))
    return scores


def forward_tokens(context: list[int], continuations: list[list[int]]) -> tuple[int, int]:
    """(tokens read with the context state reused, tokens read scoring each pair from scratch)."""
    reused = len(context) + sum(len(c) - 1 for c in continuations)
    scratch = sum(len(context) + len(c) - 1 for c in continuations)
    return reused, scratch
