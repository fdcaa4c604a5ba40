"""SCROLLS examples answered as MEGALODON's Table 2 reads them: the few-shot prefix, each prompt, a greedy answer.

The prefix (BOS under the policy, `scoring.requests.bos_prefix`, then the exemplars) is fitted once per task by
the rule of `tasks.scrolls_docs` (whole for unlimited-context models) and read once; every example starts from a
copy of its state, reads its own prompt (its document cut to the budget the prefix leaves) and is answered
greedily until EOS or a stop string.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import fail
from ..metrics.scrolls import example_scores
from ..models.base import State, StreamingLM
from ..scoring.generate import decode_rows, prefill
from ..scoring.requests import bos_prefix
from .scrolls_docs import Example, FewShotFit, bare_prompt_tokens, fit_few_shot, fit_prompt
from .scrolls_prepare import ScrollsTask


def fit_prefix(lm: StreamingLM, task: ScrollsTask, bos: bool | str, truncation: str = "middle") -> FewShotFit:
    """BOS (under the policy) + the task's exemplars, fitted to a fixed context by the rule of
    `megaeval.tasks.scrolls_docs` (whole for unlimited-context models), and the budget left for each example.

    Room is reserved for the longest question of the whole split (so --limit and sharding do not change the
    prefix). Refuses, naming the counts, when the non-document parts of the evaluated examples cannot fit."""
    chosen, template, exemplars = task.chosen, task.chosen["template"], task.exemplars
    start = bos_prefix(lm, bos)
    if lm.max_context is None:
        return fit_few_shot(lm.tokenizer, template, exemplars, start, None, chosen["max_new_tokens"], truncation, 0)
    reserve = bare_prompt_tokens(lm.tokenizer, template, task.questions)
    fit = fit_few_shot(lm.tokenizer, template, exemplars, start, lm.max_context, chosen["max_new_tokens"],
                       truncation, reserve)  # fmt: skip
    needed = bare_prompt_tokens(lm.tokenizer, template, [ex.question for ex in task.examples])
    assert fit.budget is not None and fit.facts is not None
    if fit.budget < max(needed, 1):  # then the exemplars kept no document: the prefix is all non-document parts
        fixed, budget = fit.facts["prefix_fixed_tokens"], fit.facts["prompt_budget"]
        shots = ["the exemplars' questions, answers and joiners"] * bool(exemplars)
        parts = " and ".join(["BOS"] * bool(start) + shots)
        fixes = ", ".join(["fewer --shots"] * bool(exemplars) + ["fewer --max-new-tokens"])
        raise fail(f"{task.name}: the prompt without its documents needs {fixed + needed:,} tokens ("
                   + (f"{fixed:,} for {parts}, " if parts else "")
                   + f"{needed:,} for the longest question and answer cue), but max_context {lm.max_context:,} - "
                   f"--max-new-tokens {chosen['max_new_tokens']:,} leaves {max(budget, 0):,}",
                   f"use {fixes}, or a model with a longer context")  # fmt: skip
    return fit


def evaluate_examples(
    lm: StreamingLM, task: ScrollsTask, fit: FewShotFit, prefix: State, examples: list[Example],
    truncation: str = "middle", after_prompt: Callable[[State], None] | None = None, batch_size: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """Answer examples of one task, each from a copy of the prefix's state, decoded `batch_size` at a time
    (`scoring.generate.decode_rows`: each gets what it gets alone); their samples records, in order."""
    chosen = task.chosen
    prompts = [fit_prompt(lm, chosen["template"], example, fit.budget, truncation) for example in examples]

    def rows():
        for ids, _ in prompts:
            logits, state = prefill(lm, ids, prefix.clone())
            if after_prompt is not None:
                after_prompt(state)
            yield logits, state

    gens = decode_rows(lm, rows(), chosen["max_new_tokens"], chosen["stop"], batch_size)
    records = []
    for example, (ids, dropped), gen in zip(examples, prompts, gens, strict=True):
        prediction = gen.text.strip()
        records.append({
            "task": task.name, "id": example.id, "prompt_tokens": len(fit.ids) + len(ids),
            "truncated_tokens": dropped, "exemplar_truncated_tokens": fit.dropped,
            "prediction": prediction, "references": example.references, "stop_reason": gen.stop_reason,
            "generated_tokens": len(gen.tokens), "exemplar_ids": [e.id for e in task.exemplars],
            "scores": example_scores(chosen["metric"], prediction, example.references),
        })  # fmt: skip
    return records
