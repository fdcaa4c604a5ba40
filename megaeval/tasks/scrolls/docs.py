"""SCROLLS documents: rows grouped into examples, prompts rendered and fitted to a context, exemplars drawn.

Fitting a fixed context (`fit_few_shot`, then `fit_prompt` per example). The whole prompt, BOS + the
exemplars + the example, must fit in `max_context - max_new_tokens` tokens. Only documents lose tokens
(--truncation middle|left|right). Every exemplar's question, answer (its first reference) and joiners,
and the example's question and answer cue (the template's non-document parts), are always kept.

The few-shot prefix is fitted once per task, without looking at the example, so it is the same for
every example and its state is read once and cloned (the product's speed design). The rule:

1. Reserve R tokens for an example's non-document parts: the most that any example of the evaluated
   split needs (its template rendered with an empty document). Over the whole split, so --limit and
   sharding do not change the prefix.
2. Divide what is left after BOS, the exemplars' non-document parts and R equally among the shots + 1
   documents. Each exemplar's document is cut once, to at most that share. Its size is counted as the
   tokens it adds to its rendered exemplar.
3. The example gets every token that the prefix leaves: its own share, what short exemplars did not use,
   and R beyond its own question. Its document is cut to fit.

When nothing is left to divide, the exemplars keep no document. A task is refused only when even the
non-document parts of the prefix and of an example do not fit. With a chat template (or a system instruction),
`PromptForm` writes the prompts as turns; the same rule holds, the template's tokens and the system turn counted
among the non-document parts. Unlimited-context models
(max_context None) read everything, and nothing here changes their prompts. lm-evaluation-harness
instead cuts the whole few-shot context from the left (`max_length - max_gen_toks`), which drops BOS
and the first exemplar's question and answer before any document token.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ...errors import fail
from ...models.base import StreamingLM
from ...scoring.chat import ChatFormat, ChatTemplate, conversation, render_turns

TRUNCATIONS = ("middle", "left", "right")
SCHEMA_FIX = "use the SCROLLS schema: one object per row with string id, input and output"
INPUT_FIX = "write each input as SCROLLS does: the question, a blank line, then the document"
FIELDS = ("CONTEXT", "QUESTION")  # a template's fields: the document and the question
_FIELD = re.compile(r"\{([^{}]*)\}")  # any {...} of a template, known or not
_SLOT = re.compile(r"\{(CONTEXT|QUESTION)\}")
ANSWER_JOINER = " "  # between an exemplar's prompt and its answer
SHOT_JOINER = "\n\n"  # after each exemplar's answer
FIT_RULE = "equal_document_shares"  # the few-shot fitting rule's name in reports
_HOLE = "\u27e6megaeval: the example's prompt\u27e7"  # stands for the example's prompt when a prefix is rendered


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


def _row_problem(row: dict[str, str]) -> tuple[str, str] | None:
    """What makes a SCROLLS row unusable, and its fix: an input without a question or a document (the first
    blank line separates them), or an empty reference (every score against it would be 0)."""
    question, document = split_input(row["input"])
    if not row["input"].strip():
        return "'input' is empty", INPUT_FIX
    if "\n\n" not in row["input"]:
        return "'input' has no blank line, so the whole input would be the question and the document empty", INPUT_FIX
    if not question:
        return "'input' has no question before its first blank line", INPUT_FIX
    if not document.strip():
        return "'input' has no document after its first blank line", INPUT_FIX
    if not row["output"].strip():
        return (
            "'output' is empty: a reference answer every prediction would score 0 against",
            "give every row its reference answer (the SCROLLS test split has none: evaluate validation)",
        )
    return None


def group_examples(rows: list[Any], where: str = "data") -> list[Example]:
    """Rows sharing an id and its input become one example with several references (SCROLLS' way of carrying
    them), in first-seen order; a row without a question, a document or a reference, and one whose id an earlier row
    gives another input (its question would never be asked), are refused, naming `where` (its file) and its number."""
    examples: dict[str, Example] = {}
    first: dict[str, tuple[int, str]] = {}  # id -> the number and input of its first row
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise fail(f"{where} row {number} is a {type(row).__name__}, not an object", SCHEMA_FIX)
        for key in ("id", "input", "output"):
            if key not in row:
                raise fail(f"{where} row {number} has no {key!r} (it has {', '.join(map(str, row)) or 'nothing'})",
                           SCHEMA_FIX)  # fmt: skip
            if not isinstance(row[key], str):
                raise fail(f"{where} row {number}: {key!r} is {type(row[key]).__name__}, not a string", SCHEMA_FIX)
        problem = _row_problem(row)
        if problem is not None:
            raise fail(f"{where} row {number}: {problem[0]}", problem[1])
        if row["id"] in examples:
            number_first, input_first = first[row["id"]]
            if row["input"] != input_first:
                raise fail(f"{where} row {number}: id {row['id']!r} is also row {number_first}'s, with another "
                           "input: its question would never be asked and its answer would count as a reference of "
                           "the other", "give each question its own id (rows repeating an id repeat its input, to "
                           "add references)")  # fmt: skip
            examples[row["id"]].references.append(row["output"])
        else:
            first[row["id"]] = (number, row["input"])
            question, document = split_input(row["input"])
            examples[row["id"]] = Example(row["id"], question, document, [row["output"]])
    return list(examples.values())


def document_groups(examples: list[Example]) -> list[list[Example]]:
    """The examples grouped by their document (the same text), groups in order of their first example: questions
    whose prompts may share their reading."""
    groups: dict[str, list[Example]] = {}
    for example in examples:
        groups.setdefault(example.document, []).append(example)
    return list(groups.values())


def check_template(template: str, where: str = "--template") -> None:
    """Refuse a template that lacks {CONTEXT} or {QUESTION}, or holds any other field ({FOO}, {}, {0}), which a
    prompt would keep literally; `where` names the template's source in the error."""
    unknown = [m.group(0) for m in _FIELD.finditer(template) if m.group(1) not in FIELDS]
    if unknown:
        raise fail(
            f"{where} {template!r} has an unknown field {unknown[0]}",
            "use only {CONTEXT} (the document) and {QUESTION} (the question); other text takes no braces",
        )
    missing = [f"{{{name}}}" for name in FIELDS if f"{{{name}}}" not in template]
    if missing:
        raise fail(f"{where} {template!r} must contain {{CONTEXT}} and {{QUESTION}} (it has no {missing[0]})",
                   "write both fields, as the default '{CONTEXT} Q: {QUESTION} A:' does")  # fmt: skip


def render_prompt(template: str, example: Example, document: str | None = None) -> str:
    """The prompt of an example: {CONTEXT} and {QUESTION} substituted in one pass, so braces in the document or
    the question (even a literal "{QUESTION}") stay as they are."""
    values = {"CONTEXT": example.document if document is None else document, "QUESTION": example.question}
    return _SLOT.sub(lambda m: values[m.group(1)], template)


def render_shot(template: str, exemplar: Example, document: str | None = None) -> str:
    """One exemplar as the prefix holds it: its prompt, " ", its first reference, then a blank line."""
    return render_prompt(template, exemplar, document) + ANSWER_JOINER + exemplar.references[0] + SHOT_JOINER


def render_prefix(template: str, exemplars: list[Example], documents: list[str] | None = None) -> str:
    """The few-shot block: the exemplars one after another (their own documents unless `documents` is given)."""
    docs: list[str | None] = list(documents) if documents is not None else [None] * len(exemplars)
    return "".join(render_shot(template, ex, doc) for ex, doc in zip(exemplars, docs, strict=True))


def cut_document(tokenizer: Any, doc: list[int], keep: int, mode: str) -> str:
    """The text of `keep` of the document's tokens: middle keeps its start and end, left its end, right its start."""
    if mode == "middle":
        head = keep // 2
        return tokenizer.decode(doc[:head]) + tokenizer.decode(doc[len(doc) - (keep - head) :])
    if mode == "left":
        return tokenizer.decode(doc[len(doc) - keep :])
    return tokenizer.decode(doc[:keep])


def fit_document(
    tokenizer: Any, render: Callable[[str], str], document: str, budget: int, mode: str, ids: list[int] | None = None
) -> tuple[list[int], str] | None:
    """`render(document)` encoded in at most `budget` tokens, cutting only the document.

    The kept parts are decoded and the whole text re-encoded, shrinking until it fits. Returns
    (ids, the document text kept), or None when even an empty document does not fit. `ids`: the
    encoding of `render(document)`, when the caller has it.
    """
    ids = tokenizer.encode(render(document)) if ids is None else ids
    if len(ids) <= budget:
        return ids, document
    doc = tokenizer.encode(document)
    keep = len(doc) - (len(ids) - budget)
    while keep > 0:
        text = cut_document(tokenizer, doc, keep, mode)
        fitted = tokenizer.encode(render(text))
        if len(fitted) <= budget:
            return fitted, text
        keep -= len(fitted) - budget
    bare = tokenizer.encode(render(""))
    return (bare, "") if len(bare) <= budget else None


@dataclass(frozen=True)
class PromptForm:
    """How a task's prompts are written: the prefix (read once) and each example's text after it.

    Plain (no chat template, no system instruction): SCROLLS text, the exemplars (`render_prefix`), then the
    example (`render_prompt`). Otherwise the turns of `scoring.chat.conversation`, as lm-evaluation-harness builds
    them: the system instruction; each exemplar's SCROLLS prompt as a user turn and its first reference as an
    assistant turn (ANSWER_JOINER and SHOT_JOINER its target and few-shot delimiters); the example's SCROLLS prompt
    as the last user turn. A chat template renders them (a generation prompt after the last user turn; exemplars
    as turns with --fewshot-as-multiturn, else folded into that user turn); without one they are joined as text.
    The prefix is the rendering of all that comes before the example's prompt (the last user turn's header
    included). It is read once when every prompt starts with it as text; a template that writes the earlier turns
    differently for another question (`shared` False, see `shares_prefix`) has each prompt read whole instead."""

    template: str
    exemplars: list[Example] = field(default_factory=list)
    documents: list[str] | None = None  # the exemplars' documents as read (None: whole)
    chat: ChatTemplate | None = None
    fmt: ChatFormat = ChatFormat()
    shared: bool = True
    _heads: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # the last prefix rendered

    @property
    def plain(self) -> bool:
        """Whether prompts are the SCROLLS text alone (no turns)."""
        return self.chat is None and not self.fmt.system_instruction

    def _docs(self, documents: list[str] | None) -> list[str]:
        if documents is not None:
            return list(documents)
        return list(self.documents) if self.documents is not None else [ex.document for ex in self.exemplars]

    def whole(self, prompt: str, documents: list[str] | None = None) -> str:
        """The whole prompt's text (BOS aside) for an example's SCROLLS `prompt`, the exemplars with `documents`."""
        shots = [(render_prompt(self.template, ex, doc), ex.references[0])
                 for ex, doc in zip(self.exemplars, self._docs(documents), strict=True)]  # fmt: skip
        turns = conversation(prompt, shots, "", self.fmt, ANSWER_JOINER, SHOT_JOINER)
        return render_turns(self.chat, turns, self.fmt.fewshot_as_multiturn)

    def head(self, documents: list[str] | None = None) -> str:
        """The text before the example's prompt (what the fitting rule counts as the prefix)."""
        docs = self._docs(documents)
        if self.plain:
            return render_prefix(self.template, self.exemplars, docs)
        key = tuple(docs)
        if key not in self._heads:
            whole = self.whole(_HOLE, docs)
            self._heads.clear()  # one set of documents at a time: the fitted ones, or the rule's trial
            self._heads[key] = whole[: max(whole.find(_HOLE), 0)]
        return self._heads[key]

    def prefix(self, documents: list[str] | None = None) -> str:
        """The text read once for every example (empty when each prompt is read whole)."""
        return self.head(documents) if self.shared else ""

    def text(self, example: Example, document: str | None = None, documents: list[str] | None = None) -> str:
        """The example's text after the prefix, its document `document` (None: whole)."""
        prompt = render_prompt(self.template, example, document)
        if self.plain:
            return prompt
        whole = self.whole(prompt, documents)
        if not self.shared:
            return whole
        head = self.head(documents)
        if not whole.startswith(head):  # `shares_prefix` held for every question with empty documents
            raise fail(f"example {example.id}: the chat template writes the turns before its prompt differently "
                       "from the other examples', so the prefix read once does not start its prompt",
                       "drop --chat-template, or fix the template")  # fmt: skip
        return whole[len(head) :]


def shares_prefix(form: PromptForm, questions: Iterable[str]) -> bool:
    """Whether every prompt of these questions (documents empty) starts with the prefix's text as rendered: what a
    sane template does; one whose earlier turns depend on the last turn does not."""
    if form.plain:
        return True
    docs = [""] * len(form.exemplars)
    head = form.head(docs)
    return all(form.whole(render_prompt(form.template, Example("", q, "", []), ""), docs).startswith(head)
               for q in set(questions))  # fmt: skip


def fit_example(
    lm: StreamingLM, form: PromptForm, example: Example, budget: int | None, mode: str
) -> tuple[list[int], int, str]:
    """The example's tokens after the prefix within `budget`, dropping document tokens (never the question, the
    cue or a template's tokens). Returns (ids, tokens dropped, the text read). See `fit_document`."""
    render = partial(form.text, example)
    text = render(None)
    ids = lm.tokenizer.encode(text)
    if budget is None or len(ids) <= budget:
        return ids, 0, text
    fitted = fit_document(lm.tokenizer, render, example.document, budget, mode, ids)
    if fitted is None:
        bare = len(lm.tokenizer.encode(render("")))
        raise fail(f"example {example.id}: its question and answer cue need {bare} tokens but only {budget} are left",
                   "use fewer --shots, fewer --max-new-tokens, or a model with a longer context")  # fmt: skip
    return fitted[0], len(ids) - len(fitted[0]), render(fitted[1])


def fit_prompt(
    lm: StreamingLM, form: PromptForm, example: Example, budget: int | None, mode: str
) -> tuple[list[int], int]:
    """Prompt tokens within `budget`, dropping document tokens (never the question or the cue).

    Returns (ids, tokens dropped). See `fit_document` for how the document is cut.
    """
    return fit_example(lm, form, example, budget, mode)[:2]


def bare_prompt_tokens(tokenizer: Any, form: PromptForm, questions: Iterable[str]) -> int:
    """The most tokens any of these questions' prompts needs without its document (question and cue; with a chat
    template, its turn's tokens too; when no prefix is shared, the whole prompt with the exemplars' documents
    empty)."""
    docs = [""] * len(form.exemplars)
    return max((len(tokenizer.encode(form.text(Example("", q, "", []), "", docs))) for q in set(questions)),
               default=0)  # fmt: skip


@dataclass
class FewShotFit:
    """A task's few-shot prefix as the model reads it (the same for every example), and what it leaves."""

    ids: list[int]  # BOS (under the policy) + the exemplars (BOS alone when prompts share no prefix)
    budget: int | None  # tokens left for each example's prompt; None: unlimited context
    dropped: list[int]  # per exemplar: tokens the prefix lost to cutting its document
    facts: dict[str, Any] | None  # the rule and its numbers, for the report; None: unlimited context
    form: PromptForm  # how prompts are written, the exemplars' documents as fitted


def fit_few_shot(
    tokenizer: Any, form: PromptForm, start: list[int], max_context: int | None, max_new_tokens: int, mode: str,
    reserve: int,
) -> FewShotFit:  # fmt: skip
    """The prefix `start` + the form's exemplars, fitted by the module's rule; `reserve`: R, an example's
    non-document need.

    With max_context None the exemplars are kept whole. `dropped[i]` is how much shorter the prefix got when
    exemplar i's document was cut (the earlier ones already cut), so the counts add up to the prefix's loss.
    When prompts share no prefix (`PromptForm.shared`), the rule runs on the text before each example's prompt all
    the same, but only `start` is read once and each example's whole prompt gets the rest.
    """
    exemplars, shots = form.exemplars, len(form.exemplars)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text) if text else []

    if max_context is None:
        return FewShotFit(start + encode(form.prefix()), None, [0] * shots, None, form)
    prompt_budget = max_context - max_new_tokens
    fixed = len(start) + len(encode(form.head([""] * shots)))
    to_share = prompt_budget - fixed - reserve
    share = max(0, to_share) // (shots + 1)
    while True:  # a cut can tokenize a token longer inside the joined prefix: shrink the share until it fits
        kept = []
        for ex in exemplars:
            render = partial(render_shot, form.template, ex)
            fitted = fit_document(tokenizer, render, ex.document, len(tokenizer.encode(render(""))) + share, mode)
            assert fitted is not None  # an empty document always fits its exemplar's own size
            kept.append(fitted[1])
        ids = start + encode(form.head(kept))
        over = len(ids) - (prompt_budget - reserve)
        if over <= 0 or share == 0:
            break
        share = max(0, share - over)
    documents, dropped = [ex.document for ex in exemplars], []
    length = len(start) + len(encode(form.head(documents)))
    for i, text in enumerate(kept):
        if text == documents[i]:
            dropped.append(0)
            continue
        documents[i] = text
        shorter = len(start) + len(encode(form.head(documents)))
        dropped.append(length - shorter)
        length = shorter
    read = ids if form.shared else list(start)
    facts = {"rule": FIT_RULE, "prompt_budget": prompt_budget, "prefix_fixed_tokens": fixed,
             "example_reserve": reserve, "document_share": share, "prefix_tokens": len(read),
             "example_budget": prompt_budget - len(read)}  # fmt: skip
    if not form.plain:
        facts["prefix_shared"] = form.shared
    return FewShotFit(read, prompt_budget - len(read), dropped, facts, replace(form, documents=kept))


def pick_exemplars(pool: list[Example], shots: int, seed: int, task: str) -> list[Example]:
    """`shots` train examples, sampled with a seeded generator (the same for every run)."""
    if shots > len(pool):
        raise fail(f"{task}: {shots} shots asked but the train split has {len(pool)} examples")
    return random.Random(f"{seed}:{task}").sample(pool, shots)
