"""MT-Bench's files in FastChat's llm_judge formats, read strictly (every refusal one line naming the file and line)
and written back in the same formats: questions (`question.jsonl`), answers (`model_answer/MODEL.jsonl`), reference
answers (`reference_answer/MODEL.jsonl`, answer files too) and single-answer judgments
(`model_judgment/JUDGE_single.jsonl`). FastChat's own files ship in suites/mtbench (source and licence there)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ...text import is_number, iter_jsonl

NEED_REF_CATS = ("math", "reasoning", "coding", "arena-hard-200")  # judged against a reference answer
# gen_model_answer.py's temperature per category; any other category samples at 0.7
TEMPERATURES = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0, "reasoning": 0.0,
                "stem": 0.1, "humanities": 0.1, "arena-hard-200": 0.0}  # fmt: skip
OTHER_TEMPERATURE = 0.7
GREEDY_BELOW = 1e-4  # FastChat samples only at a temperature of at least this
REFERENCE = "gpt-4"  # FastChat's reference answers are its judge's, gpt-4's


@dataclass(frozen=True)
class Question:
    """One MT-Bench question: its id (as the file writes it), category and turns."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]

    @property
    def temperature(self) -> float:
        """The temperature FastChat answers this question's category at."""
        return TEMPERATURES.get(self.category, OTHER_TEMPERATURE)


def builtin_data() -> Path:
    """FastChat's MT-Bench folder, shipped (suites/mtbench: question.jsonl, reference_answer/)."""
    return Path(str(resources.files("megaeval.suites").joinpath("mtbench")))


def data_folder(folder: str | Path | None) -> Path:
    """--data: a folder in FastChat's data/mt_bench layout (None: FastChat's own)."""
    path = builtin_data() if folder is None else Path(folder)
    if not (path / "question.jsonl").is_file():
        raise fail(f"--data {path} holds no question.jsonl",
                   "pass a folder laid out as FastChat's data/mt_bench: question.jsonl, reference_answer/")  # fmt: skip
    return path


def load_questions(path: str | Path) -> list[Question]:
    """The questions of a FastChat question.jsonl, in file order, each line checked."""
    questions: list[Question] = []
    seen: set[str] = set()
    for number, row in iter_jsonl(path, "question file"):
        where = f"question file {path} line {number}"
        if not isinstance(row, dict):
            raise fail(f"{where} is not a JSON object", "write one question a line, as FastChat's question.jsonl")
        qid = _question_id(row, where)
        category = row.get("category")
        if not isinstance(category, str) or not category:
            raise fail(f"{where}: category missing or not text", "give each question its category (writing, ...)")
        turns = row.get("turns")
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t for t in turns)):
            raise fail(f"{where}: turns missing or not a list of texts",
                       'give each question its turns, e.g. "turns": ["first", "second"]')  # fmt: skip
        if key(qid) in seen:
            raise fail(f"{where}: question_id {qid!r} a second time", "give each question its own id")
        seen.add(key(qid))
        questions.append(Question(qid, category, tuple(turns)))
    if not questions:
        raise fail(f"question file {path} holds no question", "pass FastChat's question.jsonl, or one like it")
    return questions


def key(question_id: int | str) -> str:
    """A question id as a dictionary key (ids are ints in FastChat's files, may be texts in others)."""
    return json.dumps(question_id)


def _question_id(row: dict[str, Any], where: str) -> int | str:
    qid = row.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
        raise fail(f"{where}: question_id is {qid!r:.40}, not an integer or a text", "give each record its question_id")
    return qid


@dataclass(frozen=True)
class Answers:
    """One model's answers: its name (the file's stem, as FastChat names a model by its answer file), the file and its
    checksum, and each question's first choice's turns by question key."""

    model: str
    path: Path | None
    sha256: str | None
    turns: dict[str, tuple[str, ...]]


def load_answers(path: str | Path, what: str = "answer file") -> Answers:
    """A model_answer file: per question, the turns of choice 0 (the choice FastChat judges), each line checked."""
    path = Path(path)
    if path.suffix != ".jsonl":
        raise fail(f"{what} {path} is not a .jsonl file", "pass FastChat's model_answer/MODEL.jsonl files")
    turns: dict[str, tuple[str, ...]] = {}
    for number, row in iter_jsonl(path, what):
        where = f"{what} {path} line {number}"
        if not isinstance(row, dict):
            raise fail(f"{where} is not a JSON object", "write one answer record a line (FastChat's model_answer)")
        qid = _question_id(row, where)
        choices = row.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        texts = first.get("turns") if isinstance(first, dict) else None
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
            raise fail(f"{where}: choices[0].turns missing or not a list of texts",
                       'write "choices": [{"index": 0, "turns": ["first answer", "second answer"]}]')  # fmt: skip
        if key(qid) in turns:
            raise fail(f"{where}: question_id {qid!r} a second time (FastChat would keep the last silently)",
                       "keep one answer per question (FastChat's reorg_answer_file does)")  # fmt: skip
        turns[key(qid)] = tuple(texts)
    if not turns:
        raise fail(f"{what} {path} holds no answer", "pass a FastChat model_answer file")
    return Answers(path.stem, path, file_sha256(path), turns)


def check_answers(answers: Answers, questions: list[Question], asked: list[Question] | None = None,
                  what: str = "answer file") -> None:  # fmt: skip
    """Every question of `questions` (those judged) answered, in as many turns as it has (FastChat's check_data), and
    nothing answered that the question file (`asked`, all its questions; default: `questions`) lacks."""
    known = {key(q.question_id) for q in (asked if asked is not None else questions)}
    where = f"{what} {answers.path}" if answers.path else f"the answers of {answers.model}"
    missing = [q.question_id for q in questions if key(q.question_id) not in answers.turns]
    if missing:
        raise fail(f"{where} has no answer to question {missing[0]!r} ({len(missing)} of {len(questions)} missing)",
                   "answer every question of --data (or pass --first-n to judge the first questions only)")  # fmt: skip
    extra = [k for k in answers.turns if k not in known]
    if extra:
        raise fail(f"{where} answers question {json.loads(extra[0])!r}, which the question file lacks",
                   "pass the answers to these questions (--data names the question file)")  # fmt: skip
    for q in questions:
        if len(answers.turns[key(q.question_id)]) < len(q.turns):
            raise fail(f"{where}: question {q.question_id!r} has {len(q.turns)} turns, its answer "
                       f"{len(answers.turns[key(q.question_id)])}", "answer every turn")  # fmt: skip


def answer_record(question_id: int | str, model_id: str, turns: list[str], tstamp: float) -> dict[str, Any]:
    """A FastChat model_answer line; its answer_id is derived from what it holds (FastChat draws a random one), so
    that the same answers get the same id."""
    body = json.dumps([question_id, model_id, turns], ensure_ascii=False)
    answer_id = hashlib.sha256(body.encode()).hexdigest()[:22]
    return {"question_id": question_id, "answer_id": answer_id, "model_id": model_id,
            "choices": [{"index": 0, "turns": turns}], "tstamp": tstamp}  # fmt: skip


@dataclass(frozen=True)
class Judgment:
    """One single-answer judgment as FastChat writes it: the model judged, the question, the turn judged (1; 2 for
    the multi-turn prompts) and the rating (-1: none could be read)."""

    question_id: int | str
    model: str
    turn: int
    score: float


def judgment_record(question_id: int | str, model: str, judge: tuple[str, str], user_prompt: str, judgment: str,
                    score: float | int, turn: int, tstamp: float) -> dict[str, Any]:  # fmt: skip
    """A FastChat model_judgment line (gen_judgment.py --mode single)."""
    return {"question_id": question_id, "model": model, "judge": list(judge), "user_prompt": user_prompt,
            "judgment": judgment, "score": score, "turn": turn, "tstamp": tstamp}  # fmt: skip


def load_judgments(path: str | Path) -> list[Judgment]:
    """The judgments of a model_judgment file (single-answer grading), each line checked."""
    out: list[Judgment] = []
    for number, row in iter_jsonl(path, "judgment file"):
        where = f"judgment file {path} line {number}"
        if not isinstance(row, dict):
            raise fail(f"{where} is not a JSON object", "pass FastChat's model_judgment/JUDGE_single.jsonl files")
        if "g1_winner" in row:
            raise fail(f"{where} is a pairwise judgment", "pass single-answer judgments (JUDGE_single.jsonl)")
        qid = _question_id(row, where)
        model, score, turn = row.get("model"), row.get("score"), row.get("turn")
        if not isinstance(model, str) or not model:
            raise fail(f"{where}: model missing or not text", "pass an unedited FastChat judgment file")
        if not is_number(score):
            raise fail(f"{where}: score is {score!r:.40}, not a number", "pass an unedited FastChat judgment file")
        if turn not in (1, 2) or isinstance(turn, bool):
            raise fail(f"{where}: turn is {turn!r:.40}, not 1 or 2", "pass an unedited FastChat judgment file")
        out.append(Judgment(qid, model, turn, score))
    if not out:
        raise fail(f"judgment file {path} holds no judgment", "pass FastChat's model_judgment files")
    return out


def repeated(judgments: list[Judgment]) -> int:
    """How many judgments judge a (model, question, turn) an earlier one judged already: show_result.py averages every
    line, repeats included (a rerun of gen_judgment.py appends them), and so does megaeval, saying how many."""
    places = [(j.model, key(j.question_id), j.turn) for j in judgments]
    return len(places) - len(set(places))
