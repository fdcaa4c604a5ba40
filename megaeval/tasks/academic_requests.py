"""Scoring academic documents as lm-evaluation-harness does: request encoding, log-likelihoods, greedy answers.

Multiple-choice requests are encoded as the harness encodes them (lm_eval/api/model.py `_encode_pair`):
trailing spaces of the context move to the continuation, context tokens = encode(context), continuation
tokens = encode(context + continuation)[len(context tokens):]. The model reads [BOS] (under the BOS
policy, `resolve_bos`) + context tokens once, and the choices continue that state in batched calls
(`scoring.loglik.score_pairs`); a choice scores the sum of its tokens' log-probabilities. WinoGrande scores
the shared continuation after each option's own context: the options' common start is read once. NQ and
TriviaQA decode greedily until "\\n", "." or "," and score exact match against every reference. Models
with a fixed context lose context tokens from the left, as the harness truncates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import fail
from ..metrics.academic import choice_predictions, exact_match
from ..models import StreamingLM
from ..models.base import BOS_POLICIES, resolve_bos
from ..scoring.generate import greedy_generate, prefill
from ..scoring.loglik import Prefix, read_prefix, score_pairs
from .academic_docs import Doc
from .academic_prepare import PreparedTask

__all__ = [
    "BOS_POLICIES", "FewshotCache", "Scored", "bos_prefix", "encode_pair", "evaluate_choices", "evaluate_generation",
    "resolve_bos", "score_choice_pairs", "score_requests",
]  # fmt: skip


@dataclass
class Scored:
    """The continuations of one context, scored: log-likelihoods, greedy flags and what was read."""

    loglikelihoods: list[float] = field(default_factory=list)
    is_greedy: list[bool] = field(default_factory=list)
    forward_tokens: int = 0  # tokens the model read, reusing the context's state
    from_scratch: int = 0  # tokens scoring each (context, continuation) pair from scratch would read
    truncated: int = 0  # context tokens a fixed-context model dropped (most for one continuation)

    def extend(self, other: Scored) -> None:
        """Add another context's continuations (WinoGrande: one context per option)."""
        self.loglikelihoods += other.loglikelihoods
        self.is_greedy += other.is_greedy
        self.forward_tokens += other.forward_tokens
        self.from_scratch += other.from_scratch
        self.truncated = max(self.truncated, other.truncated)


def encode_pair(lm: StreamingLM, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as the harness splits them (trailing context spaces move right)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = lm.tokenizer.encode(context + continuation)
    context_ids = lm.tokenizer.encode(context)
    return context_ids, whole[len(context_ids) :]


def bos_prefix(lm: StreamingLM, bos: bool | str) -> list[int]:
    """[BOS] when the policy asks for it (auto, always, never; True/False: always/never), else []."""
    return [lm.tokenizer.bos_id] if resolve_bos(lm, bos) else []


class FewshotCache:
    """BOS + the current few-shot block, read once for every document that starts with it
    (all of an MMLU subject's questions share their 5 exemplars)."""

    def __init__(self) -> None:
        self.key: tuple[tuple[int, ...], str] | None = None
        self.prefix: Prefix | None = None

    def get(
        self, lm: StreamingLM, bos: list[int], text: str, context: list[int] | None = None
    ) -> tuple[Prefix | None, int]:
        """The prefix for `text` and the tokens read to build it now (0 when cached).

        With `context` (the ids of a context that starts with `text`), the prefix is the part of bos +
        encode(text) that the context's own tokens start with: a byte-level BPE encodes "...\\n\\n" at the
        end of a text as one token, but as two before a word, so the block's last tokens may differ."""
        if not text:
            return None, 0
        if self.key != (tuple(bos), text):
            ids = bos + lm.tokenizer.encode(text)
            if context is not None:  # the longest start the two share
                shared = 0
                while shared < min(len(ids), len(context)) and ids[shared] == context[shared]:
                    shared += 1
                ids = ids[:shared]
            if lm.max_context is not None and len(ids) >= lm.max_context:
                self.key, self.prefix = (tuple(bos), text), None  # its contexts are truncated, each read alone
                return None, 0
            self.key, self.prefix = (tuple(bos), text), read_prefix(lm, ids)
            return self.prefix, len(self.prefix.ids)
        return self.prefix, 0


def score_choice_pairs(
    lm: StreamingLM, pairs: list[tuple[list[int], list[int]]], fewshot: Prefix | None = None
) -> Scored:
    """Score (context, continuation) token pairs together: shared context tokens are read once, and a few-shot
    prefix every context starts with not again; an empty continuation scores 0.

    A fixed-context model keeps, as the harness does, the last max_context + 1 tokens of each context +
    continuation, scoring that pair on its own.
    """
    if any(not ctx for ctx, _ in pairs):
        raise fail("an empty context with bos=False cannot be scored", "keep BOS on (--bos always)")
    scores: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)  # an empty continuation scores 0
    todo = [k for k, (_, cont) in enumerate(pairs) if cont]
    limit = lm.max_context
    scratch = sum(len(pairs[k][0]) + len(pairs[k][1]) - 1 for k in todo)
    if limit is None or all(len(pairs[k][0]) + len(pairs[k][1]) - 1 <= limit for k in todo):
        batch = score_pairs(lm, [pairs[k] for k in todo], fewshot) if todo else None
        for k, s in zip(todo, batch.scores if batch else [], strict=True):
            scores[k] = (s.logprob, s.is_greedy)
        return Scored([s[0] for s in scores], [s[1] for s in scores], batch.tokens_read if batch else 0, scratch)
    reused = dropped = 0
    for k in todo:
        context, cont = pairs[k]
        drop = max(0, len(context) + len(cont) - 1 - limit)
        if drop >= len(context):
            raise fail(f"a continuation of {len(cont)} tokens does not fit max_context {limit}")
        (s,) = score_pairs(lm, [(context[drop:], cont)]).scores
        scores[k] = (s.logprob, s.is_greedy)
        reused += len(context) - drop + len(cont) - 1
        dropped = max(dropped, drop)
    return Scored([s[0] for s in scores], [s[1] for s in scores], reused, reused, dropped)


def score_requests(
    lm: StreamingLM, context: list[int], continuations: list[list[int]], fewshot: Prefix | None = None
) -> Scored:
    """Score continuations of one context: the context is read once (a few-shot prefix it starts with not
    again) and every continuation continues its state, in batched calls (see `score_choice_pairs`)."""
    if not context:
        raise fail("an empty context with bos=False cannot be scored", "keep BOS on (--bos always)")
    return score_choice_pairs(lm, [(context, c) for c in continuations], fewshot)


def evaluate_choices(
    lm: StreamingLM,
    prepared: PreparedTask,
    doc: Doc,
    bos: bool | str,
    cache: FewshotCache | None = None,
    charge_fewshot: bool | None = None,
) -> dict[str, Any]:
    """Score a multiple-choice (or multiple-input) document; its samples record.

    `charge_fewshot`: whether this document's forward_tokens include reading its few-shot block (None:
    when this call read it). A run passes True for the first of consecutive documents sharing a block,
    so the counts are those of one uninterrupted process, however the documents were spread or resumed.
    """
    prefix = bos_prefix(lm, bos)
    if prepared.spec["output"] == "multiple_input":  # one continuation after each option's context
        pairs = [encode_pair(lm, context, doc.continuations[0]) for context in doc.contexts]
    else:
        pairs = [encode_pair(lm, doc.contexts[0], c) for c in doc.continuations]
    pairs = [(prefix + ctx, cont) for ctx, cont in pairs]
    fewshot, prefix_read = (cache or FewshotCache()).get(lm, prefix, doc.fewshot, pairs[0][0])
    if charge_fewshot is not None:
        prefix_read = len(fewshot.ids) if charge_fewshot and fewshot is not None else 0
    scored = Scored(forward_tokens=prefix_read)
    scored.extend(score_choice_pairs(lm, pairs, fewshot))
    context_tokens: int | list[int] = [len(ctx) for ctx, _ in pairs]
    if prepared.spec["output"] != "multiple_input":
        context_tokens = len(pairs[0][0])
    pred, pred_norm = choice_predictions(scored.loglikelihoods, doc.choices)
    metrics = prepared.chosen["metrics"]
    return {
        "target": doc.gold, "loglikelihoods": scored.loglikelihoods, "is_greedy": scored.is_greedy,
        "prediction": pred, "acc": float(pred == doc.gold),
        "acc_norm": float(pred_norm == doc.gold) if "acc_norm" in metrics else None,
        "context_tokens": context_tokens, "forward_tokens": scored.forward_tokens,
        "forward_tokens_from_scratch": scored.from_scratch, "truncated_tokens": scored.truncated,
    }  # fmt: skip


def evaluate_generation(lm: StreamingLM, prepared: PreparedTask, doc: Doc, bos: bool | str) -> dict[str, Any]:
    """Greedy answer of a generation document and its exact match; its samples record."""
    chosen = prepared.chosen
    ids = bos_prefix(lm, bos) + lm.tokenizer.encode(doc.contexts[0])
    dropped = 0
    if lm.max_context is not None:  # the harness keeps the last max_length - max_gen_toks context tokens
        budget = lm.max_context - chosen["max_new_tokens"]
        if budget < 1:
            raise fail(f"max_context {lm.max_context} leaves no room for the prompt and {chosen['max_new_tokens']} "
                       "new tokens")  # fmt: skip
        dropped = max(0, len(ids) - budget)
        ids = ids[dropped:]
    logits, state = prefill(lm, ids, lm.init_state(1))
    gen = greedy_generate(lm, logits, state, chosen["max_new_tokens"], chosen["stop"])
    prediction = gen.text.strip()  # the remove_whitespace filter
    fed = len(ids) + len(gen.tokens) - (gen.stop_reason != "eos" and len(gen.tokens) > 0)
    return {
        "prediction": prediction, "references": doc.references,
        "exact_match": exact_match(prediction, doc.references, **chosen["exact_match"]),
        "stop_reason": gen.stop_reason, "prompt_tokens": len(ids), "generated_tokens": len(gen.tokens),
        "forward_tokens": fed, "forward_tokens_from_scratch": fed, "truncated_tokens": dropped,
    }  # fmt: skip
