"""Academic documents scored as lm-evaluation-harness scores them: the few-shot block, choices and greedy answers.

Requests are encoded, truncated and scored by `scoring.requests` (the harness's encoding; BOS under the policy).
A multiple-choice document reads [BOS] + its context once, and its choices continue that state in batched calls;
a choice scores the sum of its tokens' log-probabilities. WinoGrande (multiple_input) scores the shared
continuation after each option's own context: the options' common start is read once. A few-shot block shared
by consecutive documents (an MMLU subject's 5 exemplars) is read once (`FewshotCache`). NQ and TriviaQA decode
greedily until "\\n", "." or "," and score exact match against every reference. Models with a fixed context lose
context tokens from the left, as the harness truncates.
"""

from __future__ import annotations

from typing import Any

from ...metrics.academic import choice_predictions, exact_match
from ...models.base import StreamingLM
from ...runs.samples import decoded_ends
from ...scoring.answering import Answerer, Query, Rule, generation_facts
from ...scoring.loglik import Prefix, read_prefix
from ...scoring.requests import bos_prefix, encode_pair, score_request_pair_sets, truncate_prompt
from .docs import Doc
from .prepare import AcademicTask


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


def evaluate_choices(
    lm: StreamingLM,
    prepared: AcademicTask,
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
    return evaluate_choice_docs(lm, prepared, [doc], bos, cache, [charge_fewshot])[0]


def evaluate_choice_docs(
    lm: StreamingLM,
    prepared: AcademicTask,
    docs: list[Doc],
    bos: bool | str,
    cache: FewshotCache | None = None,
    charge_fewshot: list[bool | None] | None = None,
) -> list[dict[str, Any]]:
    """`evaluate_choices` for documents of one task scored together: each reads its context once, and their
    choices share model calls where the family allows (`scoring.requests.score_request_pair_sets`)."""
    cache = cache or FewshotCache()
    prefix, options = bos_prefix(lm, bos), prepared.spec["output"] == "multiple_input"
    metrics = prepared.chosen["metrics"]
    sets, charged = [], []
    for doc, charge in zip(docs, charge_fewshot or [None] * len(docs), strict=True):
        if options:  # one continuation after each option's context
            pairs = [encode_pair(lm, context, doc.continuations[0]) for context in doc.contexts]
        else:
            pairs = [encode_pair(lm, doc.contexts[0], c) for c in doc.continuations]
        pairs = [(prefix + ctx, cont) for ctx, cont in pairs]
        fewshot, prefix_read = cache.get(lm, prefix, doc.fewshot, pairs[0][0])
        if charge is not None:
            prefix_read = len(fewshot.ids) if charge and fewshot is not None else 0
        sets.append((pairs, fewshot))
        charged.append(prefix_read)
    records = []
    for doc, (pairs, _), prefix_read, scored in zip(
        docs, sets, charged, score_request_pair_sets(lm, sets), strict=True
    ):
        scored.forward_tokens += prefix_read  # this document's share of reading the few-shot block
        context_tokens = [len(ctx) for ctx, _ in pairs] if options else len(pairs[0][0])
        pred, pred_norm = choice_predictions(scored.loglikelihoods, doc.choices)
        records.append({
            "target": doc.gold, "loglikelihoods": scored.loglikelihoods, "is_greedy": scored.is_greedy,
            "prediction": pred, "acc": float(pred == doc.gold),
            "acc_norm": float(pred_norm == doc.gold) if "acc_norm" in metrics else None,
            **({"prediction_norm": pred_norm} if "acc_norm" in metrics else {}),  # acc_norm's choice
            "context_tokens": context_tokens, "forward_tokens": scored.forward_tokens,
            "forward_tokens_from_scratch": scored.from_scratch, "truncated_tokens": scored.truncated,
            **decoded_ends(lm.tokenizer, pairs[0][0]),
        })  # fmt: skip
    return records


def evaluate_generation(answerer: Answerer, prepared: AcademicTask, doc: Doc, bos: bool | str) -> dict[str, Any]:
    """Greedy answer of a generation document and its exact match; its samples record."""
    return evaluate_generations(answerer, prepared, [doc], bos)[0]


def evaluate_generations(
    answerer: Answerer, prepared: AcademicTask, docs: list[Doc], bos: bool | str, batch_size: int = 1
) -> list[dict[str, Any]]:
    """Greedy answers of generation documents of one task, each prompt read whole from a fresh state and decoded
    `batch_size` at a time (`Answerer.answer_groups`: each gets what it gets alone); their samples records, in
    order."""
    lm, chosen = answerer.lm, prepared.chosen
    prompts = []
    for doc in docs:
        prompt = bos_prefix(lm, bos) + lm.tokenizer.encode(doc.contexts[0])
        prompts.append(truncate_prompt(prompt, lm.max_context, chosen["max_new_tokens"]))
    rule = Rule(chosen["max_new_tokens"], tuple(chosen["stop"]))
    names = [f"{prepared.spec['task']} document {doc.doc_id}" for doc in docs]
    groups = [[Query(ids, name=name)] for name, (ids, _) in zip(names, prompts, strict=True)]
    grouped = answerer.answer_groups(Query([], name="no prefix"), groups, rule, shared=False, rows=batch_size)
    records = []
    for doc, (ids, dropped), (gen,) in zip(docs, prompts, grouped.answers, strict=True):
        prediction = gen.text.strip()  # the remove_whitespace filter
        fed = len(ids) + gen.n_tokens - (gen.stop_reason != "eos" and gen.n_tokens > 0)
        records.append({
            "prediction": prediction, "references": doc.references,
            "exact_match": exact_match(prediction, doc.references, **chosen["exact_match"]),
            "stop_reason": gen.stop_reason, "prompt_tokens": len(ids), "generated_tokens": gen.n_tokens,
            "forward_tokens": fed, "forward_tokens_from_scratch": fed, "truncated_tokens": dropped,
            **decoded_ends(lm.tokenizer, ids), **generation_facts(gen),
        })  # fmt: skip
    return records
