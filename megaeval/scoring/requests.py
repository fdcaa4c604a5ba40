"""Requests as lm-evaluation-harness makes them: the BOS policy, encoding, truncation and log-likelihood scoring.

The one home of request handling above the StreamingLM seam; `megaeval academic`, `megaeval scrolls` and the
harness adapter (`megaeval.harness`) all call it.

* **BOS policy** (`--bos auto|always|never`, the harness's `bos=` model arg): checked once by `bos_policy`,
  read for a model by `resolve_bos`; `bos_prefix` is the tokens every context starts with ([BOS] or []).
* **Encoding** (lm_eval/api/model.py `TemplateLM._encode_pair`): trailing spaces of the context move to the
  continuation; context tokens = encode(context), continuation tokens = encode(context + continuation) after
  the context's tokens.
* **Truncation for generation**: a fixed-context model keeps the prompt's last max_context - max_new_tokens
  tokens, as the harness does (`truncate_prompt`).
* **Scoring** (`score_requests`, `score_request_pairs`): a choice scores the sum of its tokens'
  log-probabilities; shared context tokens are read once (`scoring.loglik.score_pairs`), a fixed-context model
  loses context tokens from the left as the harness truncates (the last max_context + 1 tokens of context +
  continuation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import fail
from ..models.base import StreamingLM
from ..tables import format_length
from .bos import BOS_POLICIES, bos_policy, resolve_bos  # noqa: F401  (the commands, harness and tests import them here)
from .chat import BASE, ChatFormat, ChatTemplate, chat_bos, conversation, render_turns, run_template
from .loglik import Prefix, score_pair_sets, score_pairs

EMPTY_CONTEXT = ("an empty context with bos=False cannot be scored", "keep BOS on (--bos always)")


def bos_prefix(lm: StreamingLM, policy: str | bool) -> list[int]:
    """[BOS] when the policy asks for it for this model, else []: what every context starts with."""
    return [lm.tokenizer.bos_id] if resolve_bos(lm, policy) else []


def encode_pair(lm: StreamingLM, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as the harness splits them (trailing context spaces move right)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = lm.tokenizer.encode(context + continuation)
    context_ids = lm.tokenizer.encode(context)
    return context_ids, whole[len(context_ids) :]


def truncate_prompt(ids: list[int], max_context: int | None, max_new_tokens: int) -> tuple[list[int], int]:
    """A generation prompt as the harness truncates it: its last max_context - max_new_tokens tokens (all of them
    for an unlimited context), and how many tokens were dropped from its start."""
    if max_context is None:
        return ids, 0
    budget = max_context - max_new_tokens
    if budget < 1:
        raise fail(f"max_context {max_context} leaves no room for a prompt and {max_new_tokens} new tokens",
                   "ask for fewer new tokens, or use a model with a longer context")  # fmt: skip
    dropped = max(0, len(ids) - budget)
    return ids[dropped:], dropped


@dataclass
class Scored:
    """Continuations scored: log-likelihoods, greedy flags and what was read."""

    loglikelihoods: list[float] = field(default_factory=list)
    is_greedy: list[bool] = field(default_factory=list)
    forward_tokens: int = 0  # tokens the model read, reusing the context's state
    from_scratch: int = 0  # tokens scoring each (context, continuation) pair from scratch would read
    truncated: int = 0  # context tokens a fixed-context model dropped (most for one continuation)


def score_request_pairs(
    lm: StreamingLM, pairs: list[tuple[list[int], list[int]]], fewshot: Prefix | None = None
) -> Scored:
    """Score (context, continuation) token pairs together: shared context tokens are read once, and a few-shot
    prefix every context starts with not again; an empty continuation scores 0.

    A fixed-context model keeps, as the harness does, the last max_context + 1 tokens of each context +
    continuation, scoring that pair on its own.
    """
    return score_request_pair_sets(lm, [(pairs, fewshot)])[0]


def score_request_pair_sets(
    lm: StreamingLM, sets: list[tuple[list[tuple[list[int], list[int]]], Prefix | None]]
) -> list[Scored]:
    """`score_request_pairs` for several documents' pairs (each with its few-shot prefix), each scored as alone;
    documents that fit the model's context share model calls (`scoring.loglik.score_pair_sets`)."""
    limit = lm.max_context
    together, results = [], []
    for pairs, fewshot in sets:
        if any(not ctx for ctx, _ in pairs):
            raise fail(*EMPTY_CONTEXT)
        todo = [k for k, (_, cont) in enumerate(pairs) if cont]  # an empty continuation scores 0
        fits = limit is None or all(len(pairs[k][0]) + len(pairs[k][1]) - 1 <= limit for k in todo)
        results.append(None if fits else _score_truncated(lm, pairs, todo))
        if fits:
            together.append((len(results) - 1, todo, [pairs[k] for k in todo], fewshot))
    batches = score_pair_sets(lm, [(mine, fewshot) for _, _, mine, fewshot in together])
    for (at, todo, _, _), batch in zip(together, batches, strict=True):
        pairs = sets[at][0]
        scores = [(0.0, True)] * len(pairs)
        for k, sc in zip(todo, batch.scores, strict=True):
            scores[k] = (sc.logprob, sc.is_greedy)
        scratch = sum(len(pairs[k][0]) + len(pairs[k][1]) - 1 for k in todo)
        results[at] = Scored([x[0] for x in scores], [x[1] for x in scores], batch.tokens_read, scratch)
    return results


def _score_truncated(lm: StreamingLM, pairs: list[tuple[list[int], list[int]]], todo: list[int]) -> Scored:
    """Pairs of a fixed-context model, each scored alone on its last max_context + 1 tokens."""
    limit = lm.max_context
    scores: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
    reused = dropped = 0
    for k in todo:
        context, cont = pairs[k]
        drop = max(0, len(context) + len(cont) - 1 - limit)
        if drop >= len(context):
            raise fail(f"a continuation of {len(cont)} tokens does not fit max_context {limit}")
        (sc,) = score_pairs(lm, [(context[drop:], cont)]).scores
        scores[k] = (sc.logprob, sc.is_greedy)
        reused += len(context) - drop + len(cont) - 1
        dropped = max(dropped, drop)
    return Scored([x[0] for x in scores], [x[1] for x in scores], reused, reused, dropped)


def score_requests(
    lm: StreamingLM, context: list[int], continuations: list[list[int]], fewshot: Prefix | None = None
) -> Scored:
    """Score continuations of one context: the context is read once (a few-shot prefix it starts with not
    again) and every continuation continues its state, in batched calls (see `score_request_pairs`)."""
    if not context:
        raise fail(*EMPTY_CONTEXT)
    return score_request_pairs(lm, [(context, c) for c in continuations], fewshot)


# (task text, answer prefix) -> (the ids the model reads, the whole prompt's text, where the task text starts in it)
Encoder = Callable[[str, str], tuple[np.ndarray, str, int]]


def check_prompts(lm: StreamingLM, lengths: list[int], policy: str, chat: ChatFormat) -> dict[str, Any]:
    """Refuse, before any work, prompts of `lengths` a fixed-context model cannot read and --chat-template for a
    tokenizer without that template; return what the run records: the BOS the prompts start with and the
    template's name and checksum."""
    longest = max(lengths)
    if lm.max_context is not None and longest > lm.max_context:
        raise fail(f"{lm.spec} reads at most max_context {lm.max_context:,} tokens, but --lengths asks for "
                   f"{format_length(longest)} ({longest:,})",
                   f"use --lengths up to {lm.max_context:,} (--chunk-parallel spreads a long KV cache over ranks, "
                   "but a model cannot read past its max_context)")  # fmt: skip
    template = run_template(lm, chat)
    probe = render_turns(template, conversation("", fmt=chat), chat.fewshot_as_multiturn) if template else None
    return {"bos_effective": prompt_bos(lm, policy, probe), "chat_template_effective": template and template.facts()}


def prompt_bos(lm: StreamingLM, policy: str, rendered: str | None = None) -> bool:
    """BOS under the policy; before a chat-rendered prompt, auto adds the tokenizer's default BOS unless the
    template writes it (lm-eval's tok_encode)."""
    return resolve_bos(lm, policy) if rendered is None else chat_bos(lm, policy, rendered)


def prompt_encoder(
    lm: StreamingLM, bos: bool, chat: ChatFormat = BASE, template: ChatTemplate | None = None
) -> Encoder:
    """How a task text and answer prefix become the ids the model reads: BOS (under the policy), the text (as one
    user turn of `template`, after the system instruction's turn), then the answer prefix after it (RULER puts it
    after the model's template). Without a template, a system instruction goes before the text, as lm-eval
    joins turns in base mode."""
    start = np.asarray([lm.tokenizer.bos_id] if bos else [], dtype=np.int32)
    # a tokenizer that gives an array builds no Python int per token (a 1M-token prompt would leave ~40 MB of them)
    to_array = getattr(lm.tokenizer, "encode_array", None) or (lambda t: np.asarray(lm.tokenizer.encode(t), np.int32))
    plain = template is None and not chat.system_instruction

    def encode(text: str, answer_prefix: str) -> tuple[np.ndarray, str, int]:
        whole = text if plain else render_turns(template, conversation(text, fmt=chat), chat.fewshot_as_multiturn)
        at = 0 if plain else max(whole.rfind(text), 0)
        whole += answer_prefix
        return np.concatenate([start, to_array(whole)]).astype(np.int32), whole, at

    return encode
