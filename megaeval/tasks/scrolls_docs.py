"""SCROLLS documents: rows grouped into examples, prompts rendered and fitted to a context, exemplars drawn."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..errors import fail
from ..models import StreamingLM

TRUNCATIONS = ("middle", "left", "right")
SCHEMA_FIX = "use the SCROLLS schema: one object per row with string id, input and output"


@dataclass
class Example:
    """One SCROLLS example: rows that share an id, with all their references."""

    id: str
    question: str
    document: str
    references: list[str]


def split_input(text: str) -> tuple[str, str]:
    """SCROLLS puts the question first, then a blank line, then the document."""
    question, _, document = text.partition("\n\n")
    return question.strip(), document


def group_examples(rows: list[Any], where: str = "data") -> list[Example]:
    """Rows sharing an id become one example with several references, in first-seen order."""
    examples: dict[str, Example] = {}
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise fail(f"{where} row {number} is a {type(row).__name__}, not an object", SCHEMA_FIX)
        for key in ("id", "input", "output"):
            if key not in row:
                raise fail(f"{where} row {number} has no {key!r} (it has {', '.join(map(str, row)) or 'nothing'})",
                           SCHEMA_FIX)  # fmt: skip
            if not isinstance(row[key], str):
                raise fail(f"{where} row {number}: {key!r} is {type(row[key]).__name__}, not a string", SCHEMA_FIX)
        if row["id"] in examples:
            examples[row["id"]].references.append(row["output"])
        else:
            question, document = split_input(row["input"])
            examples[row["id"]] = Example(row["id"], question, document, [row["output"]])
    return list(examples.values())


def render_prompt(template: str, example: Example, document: str | None = None) -> str:
    """The prompt of an example (plain replacement: documents contain braces)."""
    context = example.document if document is None else document
    return template.replace("{CONTEXT}", context).replace("{QUESTION}", example.question)


def fit_prompt(
    lm: StreamingLM, template: str, example: Example, budget: int | None, mode: str
) -> tuple[list[int], int]:
    """Prompt tokens within `budget`, dropping document tokens (never the question or the cue).

    middle keeps the document's start and end, left its end, right its start; the kept parts are
    decoded and the prompt re-encoded, shrinking until it fits. Returns (ids, tokens dropped).
    """
    ids = lm.tokenizer.encode(render_prompt(template, example))
    if budget is None or len(ids) <= budget:
        return ids, 0
    doc = lm.tokenizer.encode(example.document)
    keep = len(doc) - (len(ids) - budget)
    while True:
        if keep <= 0:
            raise fail(f"example {example.id}: the prompt without its document needs more than {budget} tokens",
                       "use a model with a longer context or fewer --max-new-tokens/--shots")  # fmt: skip
        if mode == "middle":
            head = keep // 2
            text = lm.tokenizer.decode(doc[:head]) + lm.tokenizer.decode(doc[len(doc) - (keep - head) :])
        elif mode == "left":
            text = lm.tokenizer.decode(doc[len(doc) - keep :])
        else:
            text = lm.tokenizer.decode(doc[:keep])
        fitted = lm.tokenizer.encode(render_prompt(template, example, text))
        if len(fitted) <= budget:
            return fitted, len(ids) - len(fitted)
        keep -= len(fitted) - budget


def pick_exemplars(pool: list[Example], shots: int, seed: int, task: str) -> list[Example]:
    """`shots` train examples, sampled with a seeded generator (the same for every run)."""
    if shots > len(pool):
        raise fail(f"{task}: {shots} shots asked but the train split has {len(pool)} examples")
    return random.Random(f"{seed}:{task}").sample(pool, shots)
