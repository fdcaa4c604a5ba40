"""`megaeval mtbench`: MT-Bench (the MEGALODON paper's Table 3) as FastChat's llm_judge answers, judges and scores
it, with any model and any judge, served or in this process.

Three modes, by what the run starts from:
- `--model SPEC` (generate): both turns of every question answered through the model's chat template, with
  gen_model_answer.py's rules (the category's temperature, greedy below 1e-4 and seeded sampling above, 1,024 new
  tokens, turn 2 after the model's own turn 1), written as FastChat's model_answer file; judged when --judge is given.
- `--answers FILE...` (answers): FastChat model_answer files judged (each file one model, named by its stem).
- `--judgments FILE...` (judgments): FastChat model_judgment files scored as show_result.py scores them, no model.

Judging is gen_judgment.py --mode single (`tasks.mtbench.matches`: which prompt, which fields), the judge asked at
temperature 0 for at most 2,048 tokens and its rating read as FastChat reads it (`judging`); the judgments are
written as FastChat's model_judgment file. Answers and judgments are units of the run skeleton's journal, and a
served model's or judge's every answered request is journaled as it arrives: --resume asks nothing twice."""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ..console import note_line
from ..distributed import broadcast_object
from ..errors import fail
from ..files import write_jsonl_atomic
from ..judging.judge import Judge, JudgeSettings
from ..judging.prompts import JudgePrompt, judge_prompt
from ..runs import Run, RunSettings, open_run
from ..runs.run import open_answerer
from ..runs.settings import ignored_flag
from ..scoring.answering import Query, Rule, chat_query, chat_template_of, generation_facts
from ..scoring.chat import turn_end_ids
from ..scoring.decoding import Decoding, check_temperature, unit_seed
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy
from ..serving.spec import answer_settings
from ..tasks.mtbench import data as mt
from ..tasks.mtbench.data import Answers, Judgment, Question, key
from ..tasks.mtbench.matches import PROMPTS, Match, check_references, make_matches
from ..tasks.mtbench.results import UNRATED
from .mtbench_files import (
    Inputs,
    answers_path,
    check_files,
    check_models,
    default_id,
    judgments_path,
    read_inputs,
    results_of,
    safe_name,
    samples_of,
    score_judgments,
)  # fmt: skip

MODES = ("generate", "answers", "judgments")
UNRATED_STOP = 10  # a judge whose first this many replies hold no rating is not following the prompt's format
GEN, JUDGED = ("generate",), ("generate", "answers")


@dataclass(kw_only=True)
class MtbenchSettings(RunSettings):
    """Every flag of `megaeval mtbench`, defaults included (FastChat's where it has one)."""

    answers: list[str] = field(default_factory=list)  # FastChat model_answer files to judge (no model runs)
    judgments: list[str] = field(default_factory=list)  # FastChat model_judgment files to score (nothing runs)
    judge: str | None = None
    judge_args: dict[str, Any] = field(default_factory=dict)
    judge_max_tokens: int = 2048  # gen_judgment.py's max_tokens
    judge_temperature: float = 0.0  # gen_judgment.py's temperature
    judge_prompts: str | None = None  # a judge_prompts.jsonl; None: FastChat's, shipped
    judge_id: str | None = None  # the judge's name in the judgments; None: from --judge
    data: str | None = None  # a folder laid out as FastChat's data/mt_bench; None: FastChat's, shipped
    reference: str = mt.REFERENCE  # reference_answer/NAME.jsonl for math, reasoning and coding
    first_n: int | None = None  # only the first N questions (gen_judgment.py's --first-n)
    model_id: str | None = None  # the answers' model_id and file name; None: from --model
    max_new_tokens: int = 1024  # gen_model_answer.py's --max-new-token
    seed: int = 0  # sampled answers' seed (FastChat seeds choice 0 with torch.manual_seed(0))
    chat_template: str | None = None  # one of the model's several templates; None: its only or default one
    system_instruction: str | None = None  # a system turn before each question's turns
    bos: str = "auto"
    batch_size: str | int = "auto"
    output_dir: str = "reports/mt_bench"  # model_answer/ and model_judgment/ as FastChat lays them out
    allow_unrated: bool = False  # go on when the judge's first UNRATED_STOP replies hold no rating
    out: str = "reports/mtbench.json"
    samples: str | None = None

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size", "output_dir", "allow_unrated")
    # flag -> the modes it applies to (a flag given for another mode is refused: it would be ignored)
    FLAG_MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        "model_args": GEN, "kernels": GEN, "chunk_parallel": GEN, "bos": GEN, "device": JUDGED, "dtype": JUDGED,
        "dist_timeout": JUDGED, "resume": JUDGED, "judge": JUDGED, "judge_args": JUDGED, "judge_max_tokens": JUDGED,
        "judge_temperature": JUDGED, "judge_prompts": JUDGED, "judge_id": JUDGED, "reference": JUDGED,
        "first_n": JUDGED, "model_id": GEN, "max_new_tokens": GEN, "seed": GEN, "chat_template": GEN,
        "system_instruction": GEN, "batch_size": JUDGED, "output_dir": JUDGED, "allow_unrated": JUDGED,
    }  # fmt: skip
    JUDGE_FLAGS: ClassVar[tuple[str, ...]] = ("judge_args", "judge_max_tokens", "judge_temperature", "judge_prompts",
                                              "judge_id", "reference", "allow_unrated")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [flag for flag, on in (("--model", self.model is not None), ("--answers", bool(self.answers)),
                 ("--judgments", bool(self.judgments))) if on]  # fmt: skip
        if len(given) != 1:
            raise fail(f"pass exactly one of --model, --answers and --judgments (got {', '.join(given) or 'none'})",
                       "--model answers the questions (and --judge judges them), --answers judges FastChat answer "
                       "files, --judgments scores FastChat judgment files")  # fmt: skip
        ignored = ignored_flag(self, self.FLAG_MODES, self.mode)
        if ignored is not None:
            name, modes = ignored
            flag = f"--{name.replace('_', '-')}"
            raise fail(f"{flag} does not apply with {given[0]} (it would be ignored)",
                       f"use {flag} with {' or '.join('--' + m for m in modes).replace('--generate', '--model')}, "
                       "or leave it out")  # fmt: skip
        if self.mode == "answers" and self.judge is None:
            raise fail("--answers are judged, and no --judge is given", "pass --judge SPEC (a served or local model)")
        if self.judge is None:
            lone = ignored_flag(self, dict.fromkeys(self.JUDGE_FLAGS, ("judged",)), "unjudged")
            if lone is not None:
                flag = f"--{lone[0].replace('_', '-')}"
                raise fail(f"{flag} without --judge (it would be ignored)", f"pass --judge SPEC, or drop {flag}")
        self.bos = bos_policy(self.bos)
        self.batch_size = parse_batch_size(self.batch_size)
        check_temperature(self.judge_temperature, "--judge-temperature")
        JudgeSettings(self.judge_temperature, self.judge_max_tokens)  # its own checks, before any work
        for flag, value in (("--max-new-tokens", self.max_new_tokens), ("--first-n", self.first_n)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise fail(f"{flag} must be at least 1, got {value}")
        for flag, value in (("--model-id", self.model_id), ("--judge-id", self.judge_id), ("--reference",
                            self.reference)):  # fmt: skip
            if value is not None and not safe_name(value):
                raise fail(f"{flag} {value!r} is not a file name (FastChat names files by it)",
                           "use letters, digits, '.', '-' and '_'")  # fmt: skip

    @property
    def mode(self) -> str:
        """generate (--model), answers (--answers) or judgments (--judgments)."""
        return "generate" if self.model is not None else "answers" if self.answers else "judgments"

    def numeric(self) -> dict[str, Any]:
        """As RunSettings', with only the judge's --judge-args that can change its answers (not how requests go)."""
        return {**super().numeric(), "judge_args": answer_settings(self.judge, self.judge_args)}


def run_mtbench(settings: MtbenchSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Answer, judge or score as the mode says; write the files and the report, return it (rank 0; None on others)."""
    if settings.mode == "judgments":
        return score_judgments(settings)
    inputs = read_inputs(settings)
    if settings.mode == "answers":
        answers = [mt.load_answers(p) for p in settings.answers]
        check_models(answers)
        for a in answers:
            mt.check_answers(a, inputs.questions, inputs.asked)
        make_matches(inputs.questions, answers, inputs.reference)  # a missing reference refused before any work
        as_judge = copy.copy(settings)  # the run's model is the judge (the one model this mode runs)
        as_judge.model, as_judge.model_args = settings.judge, settings.judge_args
        reads = [*settings.answers, settings.data, settings.judge_prompts]
        with open_run("mtbench", as_judge, reads=reads, fingerprint={"data": _fingerprint(inputs, answers)},
                      progress=progress, on_unit=on_unit) as run:  # fmt: skip
            judge = Judge(run.answerer, JudgeSettings(settings.judge_temperature, settings.judge_max_tokens))
            check_files(settings, reads, {"the judgment file": judgments_path(settings, _judge_id(settings, judge))})
            model = {"spec": None, "answers": {a.model: {"path": str(a.path), "sha256": a.sha256} for a in answers}}
            return _judge_and_finish(run, settings, inputs, answers, judge, model)
    if settings.judge is not None:
        check_references(inputs.questions, inputs.reference)  # refused before the model answers anything
    judges: list[Judge] = []

    def check(lm: Any) -> dict[str, Any]:
        template = _answer_template(lm, settings)
        if settings.judge is None:
            return {"template": template and template.sha256}
        answerer = open_answerer(settings.judge, settings.judge_args, settings.device, settings.dtype)
        judges.append(Judge(answerer, JudgeSettings(settings.judge_temperature, settings.judge_max_tokens)))
        return {"template": template and template.sha256, "judge": judges[0].identity}

    reads = [settings.data, settings.judge_prompts]
    with open_run("mtbench", settings, reads=reads, fingerprint={"data": inputs.data}, check=check,
                  progress=progress, on_unit=on_unit) as run:  # fmt: skip
        model_id = settings.model_id or default_id(settings.model, run.lm)
        outputs = {"the answer file": answers_path(settings, model_id)}
        if judges:
            outputs["the judgment file"] = judgments_path(settings, _judge_id(settings, judges[0]))
        check_files(settings, reads, outputs)
        answers, records = _generate(run, settings, inputs, model_id)
        if not judges:
            return _finish(run, settings, inputs, [answers], records, [], None, {})
        if hasattr(judges[0].answerer, "keep_in"):  # a served judge's answers journaled with the run's
            judges[0].answerer.keep_in(run.journal)
        return _judge_and_finish(run, settings, inputs, [answers], judges[0], None, records)


def _answer_template(lm: Any, settings: MtbenchSettings) -> Any:
    """The chat template the model's turns are rendered with (None: a chat API's server renders them)."""
    chat_api = getattr(lm, "prompt_format", None) == "messages"
    if not chat_api and not getattr(getattr(lm.tokenizer, "tok", None), "chat_template", None):
        raise fail(f"MT-Bench asks {lm.spec} its questions through its chat template, and its tokenizer has none",
                   "use a chat model (a checkpoint whose tokenizer_config.json has a chat_template), or a served "
                   "one with --model-args api=chat")  # fmt: skip
    return chat_template_of(lm, settings.chat_template, settings.system_instruction)


def _judge_id(settings: MtbenchSettings, judge: Judge) -> str:
    return settings.judge_id or default_id(settings.judge, judge.answerer.lm)


def _fingerprint(inputs: Inputs, answers: list[Answers]) -> dict[str, Any]:
    return {**inputs.data, "answers": {a.model: a.sha256 for a in answers}}


def _generate(run: Run, settings: MtbenchSettings, inputs: Inputs, model_id: str) -> tuple[Answers, list]:
    """Both turns of every question answered by the run's model (gen_model_answer.py's rules): the answers, and each
    question's record (on every rank)."""
    lm = run.lm
    template = _answer_template(lm, settings)
    system = [{"role": "system", "content": settings.system_instruction}] if settings.system_instruction else []
    rows = run.answerer.rows(settings.batch_size, min(lm.max_context or 4096, 4096))
    ends = turn_end_ids(lm)  # transformers' generate stops at every eos id of generation_config.json

    def compute_batch(batch: list[Question]) -> list[dict[str, Any]]:
        texts: list[list[str]] = [[] for _ in batch]
        facts: list[list[dict[str, Any]]] = [[] for _ in batch]
        for turn in range(max(len(q.turns) for q in batch)):
            asked = [k for k, q in enumerate(batch) if turn < len(q.turns)]
            for temperature in dict.fromkeys(batch[k].temperature for k in asked):
                group = [k for k in asked if batch[k].temperature == temperature]
                queries = [_turn_query(lm, template, system, batch[k], texts[k], turn, settings) for k in group]
                greedy = temperature < mt.GREEDY_BELOW
                keys = [(batch[k].question_id, turn + 1) for k in group]
                seeds = None if greedy else tuple(unit_seed(settings.seed, *key) for key in keys)
                decoding = Decoding(0.0 if greedy else temperature, seeds, stop_ids=ends)
                answers, _ = run.answerer.answer(queries, Rule(settings.max_new_tokens, (), decoding), rows=rows)
                for k, query, gen in zip(group, queries, answers, strict=True):
                    texts[k].append(gen.text.strip())  # FastChat strips each answer
                    facts[k].append({"prompt_tokens": len(query.ids), "generated_tokens": gen.n_tokens,
                                     "stop_reason": gen.stop_reason, **generation_facts(gen)})  # fmt: skip
        now = time.time()
        return [{"question_id": q.question_id, "category": q.category, "temperature": q.temperature,
                 "turns": texts[k], "turn_facts": facts[k], "tstamp": now} for k, q in enumerate(batch)]  # fmt: skip

    questions = inputs.questions
    _announce_answers(run, settings, questions)
    records = run.map(questions, key=lambda q: ["answer", q.question_id], compute=lambda q: compute_batch([q])[0],
                      unit_name="questions", describe=lambda q: q.category, batch=rows,
                      compute_batch=compute_batch)  # fmt: skip
    records = broadcast_object(run.ctx, records)  # every rank judges (a collective run.map) what rank 0 gathered
    answers = Answers(model_id, None, None, {key(r["question_id"]): tuple(r["turns"]) for r in records})
    return answers, records


def _turn_query(lm: Any, template: Any, system: list[dict[str, str]], question: Question, previous: list[str],
                turn: int, settings: MtbenchSettings) -> Query:  # fmt: skip
    """Turn `turn` of a question as the model is asked it: the earlier turns with the model's own answers, then it."""
    turns = list(system)
    for j in range(turn):
        turns += [{"role": "user", "content": question.turns[j]}, {"role": "assistant", "content": previous[j]}]
    turns.append({"role": "user", "content": question.turns[turn]})
    query = chat_query(lm, template, turns, f"MT-Bench question {question.question_id}, turn {turn + 1}",
                       settings.bos)  # fmt: skip
    if lm.max_context is not None and len(query.ids) + settings.max_new_tokens > lm.max_context:
        raise fail(f"MT-Bench question {question.question_id}, turn {turn + 1}: its prompt of {len(query.ids):,} "
                   f"tokens and --max-new-tokens {settings.max_new_tokens:,} pass {lm.spec}'s max_context "
                   f"{lm.max_context:,}", "lower --max-new-tokens, or use a model with a longer context")  # fmt: skip
    return query


def _announce_answers(run: Run, settings: MtbenchSettings, questions: list[Question]) -> None:
    """The cost line of answering: questions and turns still to answer, and the new tokens they may take."""
    if not (run.progress and run.ctx.is_main and run.journal is not None):
        return
    todo = [q for q in questions if ["answer", q.question_id] not in run.journal]
    turns = sum(len(q.turns) for q in todo)
    note_line(f"mtbench: {len(todo)} of {len(questions)} questions to answer ({turns} turns, up to "
              f"{turns * settings.max_new_tokens:,} new tokens) by {run.lm.spec}")  # fmt: skip


def _judge_and_finish(
    run: Run, settings: MtbenchSettings, inputs: Inputs, answers: list[Answers], judge: Judge,
    model: dict[str, Any] | None, answer_records: list | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """Every match judged (gen_judgment.py --mode single), then the files and the report written."""
    matches = make_matches(inputs.questions, answers, inputs.reference)
    prompts = {name: judge_prompt(inputs.prompts, name) for name in PROMPTS.values()}
    rows = judge.answerer.rows(settings.batch_size, min(judge.answerer.lm.max_context or 4096, 4096))

    first: list[Any] = []  # the first replies this process got, and their scores

    def compute_batch(batch: list[Match]) -> list[dict[str, Any]]:
        judged = judge.judge([(prompts[m.prompt], m.fields) for m in batch], rows=rows)
        first.extend(judged[: UNRATED_STOP - len(first)])
        if not settings.allow_unrated and len(first) == UNRATED_STOP and all(j.score == UNRATED for j in first):
            raise fail(f"the judge ({judge.answerer.lm.spec}) gave no rating in its first {UNRATED_STOP} replies (the "
                       f"last: {first[-1].reply[-80:]!r}): it does not follow the judge prompts' [[rating]] format",
                       "use a stronger judge (and api=chat for a served one), or pass --allow-unrated to judge on: "
                       "FastChat leaves unrated turns out of the means")  # fmt: skip
        now = time.time()
        return [{"reply": j.reply, "score": j.score, "user_prompt": j.turns[-1]["content"], "tstamp": now}
                for j in judged]  # fmt: skip

    _announce_judging(run, judge, matches, prompts, settings)
    records = run.map(matches, key=lambda m: m.unit, compute=lambda m: compute_batch([m])[0], unit_name="judgments",
                      describe=lambda m: f"{m.question.category} t{m.turn}", batch=rows,
                      compute_batch=compute_batch)  # fmt: skip
    if records is None:
        return None
    return _finish(run, settings, inputs, answers, answer_records or [], list(zip(matches, records, strict=True)),
                   judge, model or {})  # fmt: skip


def _announce_judging(run: Run, judge: Judge, matches: list[Match], prompts: dict[str, JudgePrompt],
                      settings: MtbenchSettings) -> None:  # fmt: skip
    """The cost line of judging: judgments still to ask, the judge prompt tokens they send, at most how many new."""
    if not (run.progress and run.ctx.is_main and run.journal is not None):
        return
    todo = [m for m in matches if m.unit not in run.journal]
    encode = judge.answerer.lm.tokenizer.encode
    tokens = sum(len(encode(t["content"])) for m in todo for t in prompts[m.prompt].render(m.fields))
    note_line(f"mtbench: {len(todo)} of {len(matches)} judgments to ask {judge.answerer.lm.spec}, about {tokens:,} "
              f"prompt tokens (and up to {len(todo) * settings.judge_max_tokens:,} to generate)")  # fmt: skip


def _finish(
    run: Run, settings: MtbenchSettings, inputs: Inputs, answers: list[Answers], answer_records: list,
    judged: list[tuple[Match, dict[str, Any]]], judge: Judge | None, model: dict[str, Any],
) -> dict[str, Any] | None:  # fmt: skip
    """FastChat's answer and judgment files, then the samples and the report (rank 0)."""
    if run.journal is None:
        return None
    files: dict[str, Any] = {}
    if answer_records:
        (own,) = answers
        path = answers_path(settings, own.model)
        lines = [mt.answer_record(r["question_id"], own.model, r["turns"], r["tstamp"]) for r in answer_records]
        files["answers"] = {"path": str(path), "sha256": write_jsonl_atomic(path, lines, "the answer file")}
    judgments: list[Judgment] = []
    if judge is not None:
        judge_id = _judge_id(settings, judge)
        lines = [mt.judgment_record(m.question.question_id, m.model, (judge_id, m.prompt), r["user_prompt"], r["reply"],
                                 r["score"], m.turn, r["tstamp"]) for m, r in judged]  # fmt: skip
        path = judgments_path(settings, judge_id)
        files["judgments"] = {"path": str(path), "sha256": write_jsonl_atomic(path, lines, "the judgment file")}
        judgments = [Judgment(m.question.question_id, m.model, m.turn, r["score"]) for m, r in judged]
    results = results_of(judgments, inputs.questions, [a.model for a in answers])
    data = {**inputs.data, "files": files}
    if judge is not None:
        used = [inputs.prompts[name] for name in PROMPTS.values()]
        data["judge"] = {**judge.facts(used), "id": _judge_id(settings, judge)}
        stats = getattr(judge.answerer, "stats", None)
        if stats is not None and judge.answerer is not run.answerer:
            data["judge"]["serving"] = stats()
    samples = samples_of(inputs.questions, answers, judged)
    effective = {"mode": settings.mode, "model_id_effective": answers[0].model if answer_records else None,
                 "stop_ids_effective": list(turn_end_ids(run.lm)) if answer_records else None,
                 "judge_id_effective": _judge_id(settings, judge) if judge else None,
                 "temperatures_effective": {q.category: q.temperature for q in inputs.questions}}  # fmt: skip
    if model:
        run.facts = model
    report = run.finish({**asdict(settings), **effective}, data, results, samples=samples)
    return report


def mtbench_summary(report: dict[str, Any]) -> str:
    """MT-Bench's tables of a report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import mtbench_tables

    return mtbench_tables([report], [report_label(report, "mtbench")])
