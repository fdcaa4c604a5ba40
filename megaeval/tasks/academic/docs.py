"""Documents of the academic suite as lm-evaluation-harness sees them: processing, prompts, choices, few-shot.

A task file (suites/academic/<task>.yaml) states each fact as data: the query template, where the choices and
the gold answer are, the description, the delimiters and the few-shot sampler. Templates substitute `{path}`
(a field, dotted for nested fields and list indices: `choices.text`, `choices.0`) and `{path|filter}` with the
filters `strip` (str.strip) and `spaced` ("_" -> " "). The two tasks whose documents need code (HellaSwag's
text cleaning, WinoGrande's per-option contexts) name a processor in `process`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import fail

TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"
_FIELD = re.compile(r"\{([A-Za-z_][\w.]*)(?:\|(\w+))?\}")
_FILTERS: dict[str, Callable[[str], str]] = {"strip": str.strip, "spaced": lambda s: s.replace("_", " ")}


def hellaswag_preprocess(text: str) -> str:
    """The harness's HellaSwag cleaning: strip, ' [title]' -> '. ', drop bracketed tags, one '  ' -> ' ' pass."""
    text = text.strip()
    text = text.replace(" [title]", ". ")  # WikiHow artifacts
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(doc: dict[str, Any]) -> dict[str, Any]:
    context = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()  # str.capitalize also lower-cases the rest
    query = hellaswag_preprocess(doc["activity_label"] + ": " + context)
    return {**doc, "query": query, "choices": [hellaswag_preprocess(e) for e in doc["endings"]]}


def _winogrande(doc: dict[str, Any]) -> dict[str, Any]:
    blank = doc["sentence"].index("_")
    contexts = [doc["sentence"][:blank] + option for option in (doc["option1"], doc["option2"])]
    gold = {"1": 0, "2": 1}[str(doc["answer"])]
    return {**doc, "contexts": contexts, "target": doc["sentence"][blank + 1 :].strip(), "gold": gold}


PROCESSORS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"hellaswag": _hellaswag, "winogrande": _winogrande}


def get_field(doc: dict[str, Any], path: str) -> Any:
    """A field of a document by dotted path ("choices.text", "choices.0")."""
    value: Any = doc
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


def render(template: str, doc: dict[str, Any]) -> str:
    """Fill `{path}` and `{path|filter}` from the document (values are inserted verbatim, never re-scanned)."""

    def fill(match: re.Match) -> str:
        value = text_field(doc, match.group(1))
        return _FILTERS[match.group(2)](value) if match.group(2) else value

    return _FIELD.sub(fill, template)


def text_field(doc: dict[str, Any], path: str) -> str:
    """A field that a prompt shows: it must be a string (a null or a number there is another schema)."""
    value = get_field(doc, path)
    if not isinstance(value, str):
        raise ValueError(f"{path} is {type(value).__name__} {value!r:.30}, not text")
    return value


def text_list(doc: dict[str, Any], path: str) -> list[str]:
    """A field holding a list of texts (choices, contexts, answers)."""
    values = get_field(doc, path)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{path} is {values!r:.40}, not a list of texts")
    return values


def as_index(value: Any) -> int:
    """A label as an int: an int, or a string of digits (the hub stores HellaSwag's and SIQA's labels so)."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise ValueError(f"label {value!r} is not an integer")
    return int(value)


@dataclass
class Doc:
    """One evaluation document: its requests' texts and its answer."""

    doc_id: int
    contexts: list[str]  # one shared context, or one per choice (multiple_input)
    continuations: list[str]  # one per choice, or one shared (multiple_input); target delimiter included
    choices: list[str]  # the choice texts whose lengths normalise acc_norm (multiple_choice)
    gold: int  # -1 for generation tasks
    references: list[str]  # generation tasks
    group: str | None = None  # MMLU subject
    fewshot: str = ""  # the description + exemplars that start every context (shared across a group)
    turns: Turns | None = None  # the prompt's parts, for rendering it as chat turns (`academic.chat`)


@dataclass
class Turns:
    """A document's prompt in parts, as lm-eval's fewshot_context takes them: the rendered description, the
    exemplars' (question, answer) pairs, the question (one per option for multiple_input) and the answer texts
    (choices, or the shared continuation) without the target delimiter."""

    description: str
    exemplars: list[tuple[str, str]]
    questions: list[str]
    answers: list[str]


class TaskDocs:
    """A task spec applied to documents (rows in the hub schema)."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.task = spec["task"]
        self.output = spec["output"]
        self.description = spec.get("description") or ""
        self.fewshot_delimiter = spec.get("fewshot_delimiter", FEWSHOT_DELIMITER)
        self.target_delimiter = spec.get("target_delimiter", TARGET_DELIMITER)
        process = spec.get("process")
        self._process = PROCESSORS[process] if process else (lambda doc: doc)

    def process(self, row: dict[str, Any], where: str, file: str | None = None) -> dict[str, Any]:
        """The document as the harness's process_docs leaves it, with a clear error for rows of another schema.

        The answer is checked with the prompt (`target` reads the gold index or the references), so a label
        of the wrong type or out of range is refused before any model loads; `file` (the rows' file, when
        local) is named in the error.
        """
        try:
            doc = self._process(row)
            self.query(doc), self.target(doc)  # every field the prompt needs is there
            return doc
        except (KeyError, ValueError, IndexError, AttributeError, TypeError) as e:
            fields = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
            reason = " ".join(f"{type(e).__name__}: {e}".split())
            raise fail(f"{self.task}: {where} does not fit the task's schema ({reason}; it has {fields})"
                       + (f" in {file}" if file else ""),
                       f"use the hub schema of {self.spec['hub']['name']}") from None  # fmt: skip

    def query(self, doc: dict[str, Any]) -> str:
        """The question part of a prompt (for WinoGrande: the gold option's context, as an exemplar shows it)."""
        if self.output == "multiple_input":
            return self.contexts(doc)[self.gold(doc)]
        return render(self.spec["query"], doc)

    def choices(self, doc: dict[str, Any]) -> list[str]:
        """The answer options (multiple_choice)."""
        spec = self.spec["choices"]
        if "literal" in spec:
            return [str(c) for c in spec["literal"]]
        if "fields" in spec:
            return [text_field(doc, f) for f in spec["fields"]]
        return text_list(doc, spec["field"])

    def contexts(self, doc: dict[str, Any]) -> list[str]:
        """One context per option (multiple_input)."""
        return text_list(doc, self.spec["contexts"]["field"])

    def gold(self, doc: dict[str, Any]) -> int:
        """Index of the right option."""
        spec = self.spec["gold"]
        value = get_field(doc, spec["field"])
        if "index_in" in spec:
            labels = list(get_field(doc, spec["index_in"]))
            if value not in labels:
                raise ValueError(f"{spec['field']} {value!r} is not among {labels}")
            return labels.index(value)
        gold = as_index(value) + spec.get("offset", 0)
        options = len(self.contexts(doc) if self.output == "multiple_input" else self.choices(doc))
        if not 0 <= gold < options:
            raise ValueError(f"gold index {gold} outside the {options} options")
        return gold

    def references(self, doc: dict[str, Any]) -> list[str]:
        """The accepted answers (generation tasks)."""
        path = self.spec["references"]["field"]
        refs = [get_field(doc, path)] if isinstance(get_field(doc, path), str) else text_list(doc, path)
        if not refs:
            raise ValueError("no reference answer")
        return refs

    def target(self, doc: dict[str, Any]) -> str:
        """The gold answer text an exemplar shows after the target delimiter."""
        if self.output == "generate_until":
            return self.references(doc)[0]
        if self.output == "multiple_input":
            return render(self.spec["target"], doc)
        return self.choices(doc)[self.gold(doc)]

    def prefix(self, doc: dict[str, Any], exemplars: list[dict[str, Any]]) -> str:
        """Description and rendered exemplars, each `query + delimiter + target + fewshot delimiter`."""
        shots = "".join(
            self.query(ex) + self.target_delimiter + self.target(ex) + self.fewshot_delimiter for ex in exemplars
        )
        return render(self.description, doc) + shots

    def build(self, doc_id: int, doc: dict[str, Any], exemplars: list[dict[str, Any]]) -> Doc:
        """The document's requests: contexts, continuations, choices, gold, references."""
        prefix = self.prefix(doc, exemplars)
        group = text_field(doc, self.spec["group_by"]) if "group_by" in self.spec else None
        shots = [(self.query(ex), self.target(ex)) for ex in exemplars]
        description = render(self.description, doc)
        if self.output == "generate_until":
            turns = Turns(description, shots, [self.query(doc)], [])
            return Doc(doc_id, [prefix + self.query(doc)], [], [], -1, self.references(doc), group, prefix, turns)
        if self.output == "multiple_input":
            target = render(self.spec["target"], doc)
            contexts = [prefix + c for c in self.contexts(doc)]
            turns = Turns(description, shots, list(self.contexts(doc)), [target])
            return Doc(doc_id, contexts, [self.target_delimiter + target], list(self.contexts(doc)), self.gold(doc), [],
                       group, prefix, turns)  # fmt: skip
        choices = self.choices(doc)
        continuations = [self.target_delimiter + c for c in choices]
        turns = Turns(description, shots, [self.query(doc)], choices)
        return Doc(doc_id, [prefix + self.query(doc)], continuations, choices, self.gold(doc), [], group, prefix,
                   turns)  # fmt: skip


def draw_exemplars(
    spec: dict[str, Any], docs: list[dict[str, Any]], pool: list[dict[str, Any]], shots: int, seed: int
) -> list[list[int]]:
    """Indices into `pool` of each document's exemplars, drawn in document order as the harness draws them.

    `first_n`: the first `shots` of the pool (MMLU passes each subject's dev docs). `random`: one
    random.Random(seed) per task; for every document in order, `sample(pool, shots)`, or, where the harness's
    few-shot split equals its (absent) test split (`exclude_eval_doc`), `sample(pool, shots + 1)` with the
    evaluated document removed and the first `shots` kept (lm_eval/api/samplers.py ContextSampler.sample).
    """
    if shots == 0:
        return [[] for _ in docs]
    extra = 1 if spec.get("exclude_eval_doc") else 0
    if shots + extra > len(pool):
        raise fail(
            f"{spec['task']}: {shots} shots need {shots + extra} few-shot docs but the {spec['shot_split']} split has "
            f"{len(pool)}",
            "use fewer --shots or a larger few-shot split",
        )
    if spec["sampler"] == "first_n":
        return [list(range(shots)) for _ in docs]
    rng = random.Random(seed)
    indices = list(range(len(pool)))
    drawn = []
    for doc in docs:
        picks = rng.sample(indices, shots + extra)
        if extra:
            picks = [i for i in picks if pool[i] != doc][:shots]
            if len(picks) < shots:  # the pool holds the document more than once: draw again without it
                picks = rng.sample([i for i in indices if pool[i] != doc], shots)
        drawn.append(picks)
    return drawn
