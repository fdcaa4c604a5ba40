"""SCROLLS examples answered as MEGALODON's Table 2 reads them: the few-shot prefix, each prompt, a greedy answer.

The prefix (BOS under the policy, `scoring.requests.bos_prefix`, then the exemplars) is fitted once per task by
the rule of `tasks.scrolls.docs` (whole for unlimited-context models) and read once; every example continues its
state with its own prompt (its document cut to the budget the prefix leaves) and is answered greedily until EOS or
a stop string. Prompts that share a start (questions on one document) read it once and branch from a copy of that
state (`read_prompts`); a prompt holds the same tokens either way, and the per-question reading (each prompt whole
from a copy of the prefix's state) stays as the reference (`shared=False`). With a chat template (or a system
instruction) the prompts are written by `docs.PromptForm` (`prompt_form`): the prefix is all the rendering before
the example's SCROLLS prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...errors import fail
from ...metrics.scrolls import example_scores
from ...models.base import State, StreamingLM
from ...runs.samples import decoded_ends
from ...scoring.answering import Answerer, Query, Rule, generation_facts
from ...scoring.chat import ChatFormat, ChatTemplate
from ...scoring.requests import bos_prefix
from .docs import (
    Example,
    FewShotFit,
    PromptForm,
    bare_prompt_tokens,
    document_groups,
    fit_example,
    fit_few_shot,
    fit_prompt,
    render_prompt,
    shares_prefix,
)
from .prepare import ScrollsTask

FIRST_PROMPT_CHARS = 20_000  # a longer first prompt is recorded as its two ends (half of this each)


def prompt_form(task: ScrollsTask, chat: ChatTemplate | None = None, fmt: ChatFormat | None = None) -> PromptForm:
    """How the task's prompts are written: plain SCROLLS text, or turns (a chat template's, or a system
    instruction's in base mode); whether they share the prefix is checked on every question of the split."""
    form = PromptForm(task.chosen["template"], task.exemplars, chat=chat, fmt=fmt or ChatFormat())
    return replace(form, shared=shares_prefix(form, task.questions))


def opening(form: PromptForm, task: ScrollsTask) -> str:
    """How the task's prompts begin (the first one's text, documents empty): what decides BOS with a template."""
    return form.whole(render_prompt(form.template, task.examples[0], ""), [""] * len(form.exemplars))


def first_prompt(lm: StreamingLM, task: ScrollsTask, fit: FewShotFit, truncation: str) -> str:
    """The text of the task's first example's prompt as the model reads it (BOS aside): the prefix's, then its own,
    its document cut to fit; beyond FIRST_PROMPT_CHARS, its two ends around a count of the characters left out."""
    text = fit.form.prefix() + fit_example(lm, fit.form, task.examples[0], fit.budget, truncation)[2]
    if len(text) <= FIRST_PROMPT_CHARS:
        return text
    half = FIRST_PROMPT_CHARS // 2
    return f"{text[:half]}[... {len(text) - 2 * half:,} characters not shown ...]{text[-half:]}"


def fit_prefix(
    lm: StreamingLM, task: ScrollsTask, bos: bool | str, truncation: str = "middle", form: PromptForm | None = None
) -> FewShotFit:  # fmt: skip
    """BOS (under the policy) + the task's exemplars, fitted to a fixed context by the rule of
    `megaeval.tasks.scrolls.docs` (whole for unlimited-context models), and the budget left for each example;
    `form`: how prompts are written (None: plain SCROLLS text).

    Room is reserved for the longest question of the whole split (so --limit and sharding do not change the
    prefix). Refuses, naming the counts, when the non-document parts of the evaluated examples cannot fit."""
    chosen, exemplars = task.chosen, task.exemplars
    form = form or PromptForm(chosen["template"], exemplars)
    start = bos_prefix(lm, bos)
    if lm.max_context is None:
        return fit_few_shot(lm.tokenizer, form, start, None, chosen["max_new_tokens"], truncation, 0)
    reserve = bare_prompt_tokens(lm.tokenizer, form, task.questions)
    fit = fit_few_shot(lm.tokenizer, form, start, lm.max_context, chosen["max_new_tokens"], truncation, reserve)
    needed = bare_prompt_tokens(lm.tokenizer, form, [ex.question for ex in task.examples])
    assert fit.budget is not None and fit.facts is not None
    if fit.budget < max(needed, 1):  # then the exemplars kept no document: the prefix is all non-document parts
        fixed, budget = fit.facts["prefix_fixed_tokens"], fit.facts["prompt_budget"]
        shots = ["the exemplars' questions, answers and joiners"] * bool(exemplars)
        what = "the longest question and answer cue"
        if not form.shared:  # each prompt is read whole: `needed` counts its every non-document part
            fixed, shots, what = len(start), [], "the longest prompt without documents"
        turns = [("the system instruction", form.fmt.system_instruction), ("the chat template's tokens", form.chat)]
        named = ["BOS"] * bool(start) + [name for name, on in turns if on and form.shared] + shots
        parts = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
        fixes = ", ".join(["fewer --shots"] * bool(exemplars) + ["fewer --max-new-tokens"])
        raise fail(f"{task.name}: the prompt without its documents needs {fixed + needed:,} tokens ("
                   + (f"{fixed:,} for {parts}, " if parts else "")
                   + f"{needed:,} for {what}), but max_context {lm.max_context:,} - "
                   f"--max-new-tokens {chosen['max_new_tokens']:,} leaves {max(budget, 0):,}",
                   f"use {fixes}, or a model with a longer context")  # fmt: skip
    return fit


READ = "prompt_tokens_read"  # per example: the tokens read for it after the prefix (a shared start counted once)


def evaluate_examples(
    answerer: Answerer, task: ScrollsTask, fit: FewShotFit, examples: list[Example], truncation: str = "middle",
    after_prompt: Callable[[State], dict[str, Any]] | None = None, batch_size: int = 1, shared: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """Answer examples of one task after its few-shot prefix (`fit.ids`, read once), document by document
    (`Answerer.answer_groups`: with `shared`, each start a document's questions share read once) and decoded
    `batch_size` at a time (each gets what it gets alone); their samples records, in order, with the tokens read for
    each (READ) and what `after_prompt` says of each one's state once read."""
    lm, chosen = answerer.lm, task.chosen
    prompts = [fit_prompt(lm, fit.form, example, fit.budget, truncation) for example in examples]
    position = {id(example): i for i, example in enumerate(examples)}
    members = [[position[id(example)] for example in group] for group in document_groups(examples)]
    prefix = Query(fit.ids, name=f"scrolls {task.name}'s few-shot prefix")
    groups = [[Query(prompts[i][0], name=f"scrolls {task.name} example {examples[i].id}") for i in group]
              for group in members]  # fmt: skip
    rule = Rule(chosen["max_new_tokens"], tuple(chosen["stop"]))
    grouped = answerer.answer_groups(prefix, groups, rule, shared=shared, rows=batch_size, after_prompt=after_prompt)
    gens, counts, measured = {}, {}, {}
    for group, answers, read, notes in zip(members, grouped.answers, grouped.read, grouped.notes, strict=True):
        for k, i in enumerate(group):
            gens[i], counts[i], measured[i] = answers[k], read[k], notes[k] or {}
    records = []
    for i, (example, (ids, dropped)) in enumerate(zip(examples, prompts, strict=True)):
        gen = gens[i]
        prediction = gen.text.strip()
        records.append({
            "task": task.name, "id": example.id, "prompt_tokens": len(fit.ids) + len(ids),
            "truncated_tokens": dropped, "exemplar_truncated_tokens": fit.dropped,
            "prediction": prediction, "references": example.references, "stop_reason": gen.stop_reason,
            "generated_tokens": gen.n_tokens, "exemplar_ids": [e.id for e in task.exemplars],
            "scores": example_scores(chosen["metric"], prediction, example.references),
            **decoded_ends(lm.tokenizer, [*fit.ids, *ids]), **generation_facts(gen), READ: counts[i], **measured[i],
        })  # fmt: skip
    return records
