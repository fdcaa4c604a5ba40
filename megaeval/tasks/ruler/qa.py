"""RULER's QA tasks, generated record for record as RULER generates them: qa_1 (SQuAD v2 dev) and qa_2 (HotpotQA
dev, distractor setting), a question among "Document i:" paragraphs, its own and others drawn from the dataset.

From NVIDIA/RULER at c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a, scripts/data/synthetic/qa.py (read_squad,
read_hotpotqa, generate_input_output, generate_samples). RULER runs the task in a fresh process after
`random.seed(seed)`; here one `random.Random(seed)` is that stream, drawn from in RULER's order (the estimate, the
search, each sample), and a fresh `random.Random(seed)` shuffles each prompt's documents as RULER's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import Any

from ...errors import MegaevalError, fail
from .fitting import HaystackTooSmall, draw_fitting, largest_fitting, ruler_record
from .inputs import QA_FILES, RulerInputs, TokenCounter, qa_json

INCREMENTAL = 10  # generate_samples' step, in documents
DOCUMENT = "Document {i}:\n{document}"


@dataclass
class QaData:
    """A QA dataset as RULER reads it: the distinct documents, sorted, and the answerable questions in file order,
    each with its answers, its own documents and (SQuAD) the other paragraphs of its article, as document indices."""

    questions: list[dict[str, Any]]
    docs: list[str]


class BadQa(ValueError):
    """A field of a QA file that RULER's reader would take wrongly: `where` (its path in the file) and the rule."""


def _get(obj: Any, key: str | int, kind: type, where: str) -> Any:
    """obj[key], checked to be of `kind` (a text: not empty); BadQa naming the field where it is not."""
    at = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key
    if not isinstance(obj, dict) or key not in obj:
        raise BadQa(f"`{at}` is missing")
    value = obj[key]
    names = {str: "a text", list: "a list", bool: "true or false", dict: "an object"}
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadQa(f"`{at}` is {value!r:.40}, not {names[kind]}")
    if kind is str and not value.strip():
        raise BadQa(f"`{at}` is an empty text")
    return value


def _items(obj: Any, key: str, where: str, kind: type = dict) -> list[tuple[str, Any]]:
    """(path, item) of each item of the list obj[key], each checked to be of `kind`."""
    at = f"{where}.{key}" if where else key
    items = _get(obj, key, list, where)
    for i, item in enumerate(items):
        if not isinstance(item, kind) or isinstance(item, bool):
            raise BadQa(f"`{at}[{i}]` is {item!r:.40}, not {'an object' if kind is dict else 'a list'}")
    return [(f"{at}[{i}]", item) for i, item in enumerate(items)]


def read_squad(data: Any) -> QaData:
    """SQuAD v2 (dev-v2.0.json, RULER's squad.json) as read_squad reads it; unanswerable questions left out. Every
    field RULER reads is checked: a question is a text, an answerable one has answers that are texts."""
    if not isinstance(data, dict):
        raise BadQa(f"the file holds a JSON {type(data).__name__}, not an object with `data`")
    articles = [(at, [(p_at, p) for p_at, p in _items(a, "paragraphs", at)]) for at, a in _items(data, "data", "")]
    docs = sorted({_get(p, "context", str, at) for _, paragraphs in articles for at, p in paragraphs})
    number = {doc: i for i, doc in enumerate(docs)}
    questions = []
    for _, paragraphs in articles:
        in_article = [number[p["context"]] for _, p in paragraphs]
        for p_at, paragraph in paragraphs:
            own = number[paragraph["context"]]
            for at, qa in _items(paragraph, "qas", p_at):
                question = _get(qa, "question", str, at)
                if _get(qa, "is_impossible", bool, at):
                    continue
                answers = [_get(answer, "text", str, a_at) for a_at, answer in _items(qa, "answers", at)]
                if not answers:
                    raise BadQa(f"`{at}.answers` is empty, and `is_impossible` is false")
                questions.append({
                    "query": question,
                    "outputs": answers,
                    "context": [own],
                    "more_context": [i for i in in_article if i != own],
                })  # fmt: skip
    return QaData(questions, docs)


def read_hotpotqa(data: Any) -> QaData:
    """HotpotQA dev distractor (hotpot_dev_distractor_v1.json, RULER's hotpotqa.json) as read_hotpotqa reads it: each
    paragraph is its title, a line break and its sentences joined. Questions and answers are checked to be texts."""
    if not isinstance(data, list):
        raise BadQa(f"the file holds a JSON {type(data).__name__}, not a list of questions")

    def document(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    rows = []
    for i, row in enumerate(data):
        at = f"[{i}]"
        if not isinstance(row, dict):
            raise BadQa(f"`{at}` is {row!r:.40}, not an object")
        paragraphs = []
        for p_at, paragraph in _items(row, "context", at, list):
            if len(paragraph) != 2 or not isinstance(paragraph[0], str) or not isinstance(paragraph[1], list) \
                    or not all(isinstance(s, str) for s in paragraph[1]):  # fmt: skip
                raise BadQa(f"`{p_at}` is not a [title, [sentences]] pair of texts")
            paragraphs.append(document(*paragraph))
        rows.append((_get(row, "question", str, at), _get(row, "answer", str, at), paragraphs))
    docs = sorted({d for _, _, paragraphs in rows for d in paragraphs})
    number = {doc: i for i, doc in enumerate(docs)}
    questions = [{"query": q, "outputs": [a], "context": [number[d] for d in paragraphs]} for q, a, paragraphs in rows]
    return QaData(questions, docs)


READERS = {"squad": (read_squad, "SQuAD v2 dev"), "hotpotqa": (read_hotpotqa, "HotpotQA dev distractor")}


def load_qa(dataset: str, inputs: RulerInputs) -> QaData:
    """RULER's QA data for `dataset` from `inputs.qa_dir`, or one line naming the file that is missing or malformed."""
    data = qa_json(inputs, dataset)
    read, what = READERS[dataset]
    name = QA_FILES[dataset]
    try:
        qa = read(data)
    except BadQa as e:
        raise fail(f"--qa-data {inputs.qa_dir}: {name} is not {what} as RULER reads it ({e})",
                   f"pass the {what} file that RULER's download script saves as {name}") from None  # fmt: skip
    return qa


@dataclass
class _QaRun:
    """One QA run: the data, the prompt template and the random stream."""

    qa: QaData
    template: str
    seed: int
    rng: Random


def generate(
    spec: dict[str, Any], count_tokens: TokenCounter, max_seq_length: int, num_samples: int, seed: int,
    inputs: RulerInputs, *, pre_samples: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """RULER's qa records (qa.py under prepare.py's base template). Sample i asks question i + pre_samples (RULER's
    --pre_samples, the samples of earlier chunks; 0 unless prepare.py splits the task), and is numbered i."""
    task, to_generate = spec.get("task", "qa"), spec["tokens_to_generate"]
    qa = load_qa(spec["args"]["dataset"], inputs)
    needed = max(pre_samples + num_samples, 1)  # RULER's estimate asks the first question
    if needed > len(qa.questions):  # past the last, RULER's IndexError lands in its endless retry
        raise fail(f"{task} asks for {needed} questions and "
                   f"{QA_FILES[spec['args']['dataset']]} has {len(qa.questions)} answerable ones",
                   f"use --num-samples {max(len(qa.questions) - pre_samples, 0)} or fewer")  # fmt: skip
    run = _QaRun(qa, spec["template"] + spec["answer_prefix"], seed, Random(seed))
    if count_tokens(run.template.format(context="", query="")) + to_generate > max_seq_length:
        raise _too_short(task, max_seq_length, f"its template and {to_generate} tokens to generate are longer")

    def first_question(num_docs: int) -> str:
        drawn = _draw_prompt(run, 0, num_docs)
        if drawn is None:  # RULER's random.sample raises, uncaught here
            raise fail(f"{task}: the first question has more documents of its own than RULER's smallest haystack "
                       f"({INCREMENTAL})", "fix the QA file")  # fmt: skip
        return drawn[0]

    tokens_per_doc = count_tokens(first_question(INCREMENTAL)) / INCREMENTAL
    upper = max(int((max_seq_length / tokens_per_doc) * 3), INCREMENTAL * 2)
    found = largest_fitting(lambda n: count_tokens(first_question(n)) + to_generate, INCREMENTAL, upper, max_seq_length)
    num_docs = INCREMENTAL if found is None else found
    records = []
    for index in range(num_samples):
        attempt = _attempt(run, index + pre_samples, count_tokens, to_generate, max_seq_length, task)
        (text, answer), length = draw_fitting(attempt, num_docs, INCREMENTAL, max_seq_length, task)
        records.append(ruler_record(index, text, answer, length, spec["answer_prefix"]))
    return records


def _attempt(
    run: _QaRun, question: int, count_tokens: TokenCounter, to_generate: int, max_seq_length: int, task: str
) -> Callable[[int], tuple[tuple[str, list[str]], int]]:
    """One of RULER's per-sample draws for `question`, as draw_fitting takes it: ((prompt, answers), length)."""

    def attempt(num_docs: int) -> tuple[tuple[str, list[str]], int]:
        before = run.rng.getstate()
        drawn = _draw_prompt(run, question, num_docs)
        if drawn is None:  # fewer documents than the question's own: RULER's random.sample raises, before drawing
            own = len(run.qa.questions[question]["context"])
            if num_docs <= INCREMENTAL:  # RULER's retry can step no lower, and raises again for ever
                raise _too_short(task, max_seq_length, f"question {question} has {own} documents of its own, and "
                                 f"RULER's retry steps down to {num_docs} documents")  # fmt: skip
            raise HaystackTooSmall(own, num_docs)
        length = count_tokens(drawn[0]) + to_generate
        # At the smallest haystack a draw that did not move the stream (no documents left to draw) comes back the
        # same on every retry: RULER loops for ever
        if length > max_seq_length and num_docs <= INCREMENTAL and run.rng.getstate() == before:
            raise _too_short(task, max_seq_length, f"question {question}'s {num_docs} documents are longer")
        return drawn, length

    return attempt


def _draw_prompt(run: _QaRun, index: int, num_docs: int) -> tuple[str, list[str]] | None:
    """RULER's generate_input_output: the question's own documents, then the rest of its article, then random
    others, up to `num_docs`, shuffled by a fresh Random(seed); None where RULER's random.sample raises."""
    question, docs = run.qa.questions[index], run.qa.docs
    own, more = question["context"], question.get("more_context", [])
    if num_docs < len(docs):
        if num_docs - len(own) > len(more):
            taken = set(own + more)
            others = [i for i in range(len(docs)) if i not in taken]
            chosen = own + more + run.rng.sample(others, max(0, num_docs - len(own) - len(more)))
        elif num_docs < len(own):
            return None
        else:
            chosen = own + run.rng.sample(more, num_docs - len(own))
        shown = [docs[i] for i in chosen]
    else:
        # RULER's quirk: the whole dataset repeated and cut, so the question's own documents may be cut off
        repeats = (num_docs + len(docs) - 1) // len(docs)
        shown = (docs * repeats)[:num_docs]
    Random(run.seed).shuffle(shown)
    context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(shown))
    return run.template.format(context=context, query=question["query"]), question["outputs"]


def _too_short(task: str, length: int, reason: str) -> MegaevalError:
    """The one line for a length RULER cannot fill (where its script would loop for ever)."""
    return fail(f"{task} cannot be generated at length {length}: {reason}", "use a longer length")
