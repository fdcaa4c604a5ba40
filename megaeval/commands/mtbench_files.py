"""What an `megaeval mtbench` run reads and writes besides its report: the questions, reference answers and judge
prompts (`read_inputs`), FastChat's answer and judgment files (where they go, checked before any work), the samples,
the results of an unjudged run, and --judgments: FastChat judgment files scored as show_result.py scores them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..console import note_line
from ..errors import fail
from ..files import check_outputs, check_writable, file_sha256, write_json_atomic, write_jsonl_atomic
from ..judging.prompts import JudgePrompt, judge_prompt, load_judge_prompts
from ..models import parse_spec
from ..runs.report import build_report, environment
from ..runs.run import check_run_outputs
from ..serving.spec import is_served
from ..tasks.mtbench import data as mt
from ..tasks.mtbench.data import Answers, Judgment, Question, key
from ..tasks.mtbench.matches import PROMPTS, Match
from ..tasks.mtbench.results import mtbench_results


@dataclass
class Inputs:
    """What a run reads: the questions (the first --first-n), their source, the reference answers, judge prompts."""

    questions: list[Question]
    asked: list[Question]  # every question of the file (--first-n judges the first of them)
    data: dict[str, Any]
    reference: Answers | None
    prompts: dict[str, JudgePrompt]


def safe_name(name: str) -> bool:
    """Whether a model's, judge's or reference's name can name a file (FastChat names files by them)."""
    return bool(name) and name not in (".", "..") and all(c.isalnum() or c in "._-" for c in name)


def default_id(spec: str, lm: Any = None) -> str:
    """A model's name in FastChat's files: a served model's name, else its folder's (or embedded model's) name;
    characters a file name cannot hold replaced by '-'."""
    if is_served(spec):
        name = str(getattr(lm, "model_name", "") or "served")
        name = name.rstrip("/").rsplit("/", 1)[-1] if "/" in name and Path(name).is_absolute() else name
    else:
        name = parse_spec(spec)[1].name
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip(".") or "model"


def read_inputs(settings: Any) -> Inputs:
    """The question file, and (when judging) the reference answers the questions need and the judge prompts."""
    folder = mt.data_folder(settings.data)
    path = folder / "question.jsonl"
    asked = mt.load_questions(path)
    questions = asked[: settings.first_n]
    data: dict[str, Any] = {"questions": {"path": str(path), "sha256": file_sha256(path), "n": len(questions)}}
    if settings.judge is None:
        return Inputs(questions, asked, data, None, {})
    prompts = load_judge_prompts(settings.judge_prompts)
    for name in PROMPTS.values():
        if judge_prompt(prompts, name).type != "single":
            raise fail(f"judge prompt {name} is not a single-answer prompt", "pass FastChat's judge_prompts.jsonl")
    source = settings.judge_prompts or "FastChat's judge_prompts.jsonl (shipped)"
    data["judge_prompts"] = {"path": str(source), "sha256": {n: prompts[n].sha256 for n in PROMPTS.values()}}
    reference = None
    ref_path = folder / "reference_answer" / f"{settings.reference}.jsonl"
    if ref_path.is_file():
        reference = mt.load_answers(ref_path, "reference answer file")
        data["reference"] = {"path": str(ref_path), "sha256": reference.sha256}
    return Inputs(questions, asked, data, reference, prompts)


def check_models(answers: list[Answers]) -> None:
    """Refuse two answer files of one name: FastChat names a model by its file, and two would be one model."""
    names = [a.model for a in answers]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise fail(f"two --answers files are named {twice}.jsonl (FastChat names a model by its answer file)",
                   "give each model's answers its own file name")  # fmt: skip


def answers_path(settings: Any, model_id: str) -> Path:
    """Where a model\'s FastChat answer file goes."""
    return Path(settings.output_dir) / "model_answer" / f"{model_id}.jsonl"


def judgments_path(settings: Any, judge_id: str) -> Path:
    """Where a judge\'s FastChat judgment file goes."""
    return Path(settings.output_dir) / "model_judgment" / f"{judge_id}_single.jsonl"


def check_files(settings: Any, reads: list[Any], outputs: dict[str, Path]) -> None:
    """FastChat's files this run writes: writable, and none of them an input or another output."""
    for what, path in outputs.items():
        check_writable(path, what)
    check_outputs({"--out": Path(settings.out), "--samples": settings.samples, **outputs}, reads)


def results_of(judgments: list[Judgment], questions: list[Question], models: list[str]) -> dict[str, Any]:
    """show_result.py's figures of the judgments; a model not judged (answers only) has a row without numbers."""
    if not judgments:
        empty = {"turn_1": None, "turn_2": None, "overall": None, "rated": {"turn_1": 0, "turn_2": 0}, "unrated": 0,
                 "categories": None}  # fmt: skip
        return {"models": {m: dict(empty) for m in models}, "categories_known": False, "judged": False}
    return {**mtbench_results(judgments, questions), "judged": True}


def samples_of(questions: list[Question], answers: list[Answers], judged: list[tuple[Match, dict[str, Any]]]) -> list:
    """One line per model and question: the turns asked, the answers, and each turn's rating and judgment."""
    marks = {(m.model, key(m.question.question_id), m.turn): r for m, r in judged}
    out = []
    for a in answers:
        for q in questions:
            k = key(q.question_id)
            turns = [marks.get((a.model, k, t)) for t in (1, 2)]
            out.append({"task": q.category, "id": q.question_id, "model": a.model, "questions": list(q.turns),
                        "answers": list(a.turns.get(k, ())), "scores": [t and t["score"] for t in turns],
                        "judgments": [t and t["reply"] for t in turns]})  # fmt: skip
    return out


def score_judgments(settings: Any) -> dict[str, Any]:
    """--judgments: FastChat judgment files scored as show_result.py scores them; the report written and returned."""
    out = check_run_outputs(settings, [*settings.judgments, settings.data])
    judgments: list[Judgment] = []
    sources = {}
    for path in settings.judgments:
        judgments += mt.load_judgments(path)
        sources[str(path)] = file_sha256(path)
    repeats = mt.repeated(judgments)
    folder = mt.data_folder(settings.data)
    questions = mt.load_questions(folder / "question.jsonl")
    results = {**mtbench_results(judgments, questions), "judged": True, "repeated_judgments": repeats}
    if repeats:
        note_line(f"mtbench: {repeats} judgments judge a model's turn judged earlier in the files; show_result.py "
                  "averages them all, and so does this report")  # fmt: skip
    if not results["categories_known"]:
        note_line(f"mtbench: the judgments judge questions {folder / 'question.jsonl'} lacks: the per-category means "
                  "are left out (--data names the question set)")  # fmt: skip
    data = {"judgments": sources, "questions": {"path": str(folder / "question.jsonl"),
            "sha256": file_sha256(folder / "question.jsonl")}}  # fmt: skip
    if settings.samples:
        rows = [asdict(j) for j in judgments]
        data["samples_sha256"] = write_jsonl_atomic(settings.samples, rows)
    model = {"spec": None, "judgments": list(sources)}
    report = build_report("mtbench", {**asdict(settings), "mode": "judgments"}, model, data, results,
                          environment("cpu", "none"))  # fmt: skip
    write_json_atomic(out, report)
    return report
