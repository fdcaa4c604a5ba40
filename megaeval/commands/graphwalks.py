"""`megaeval graphwalks`: Graphwalks (openai/graphwalks) on any model, scored as the published graders score it.

Every record is one unit of the run skeleton: its prompt as given (one user turn of the model's chat template, as
the card says it is meant to be sent; the text itself for a base model), answered greedily (or sampled with
--temperature), the last line's `Final Answer: [...]` read and scored by set F1 against the gold nodes
(`metrics.graphwalks`: lm-eval 0.4.13's rule by default, the card's snippets with --grader card). Means per
problem type and prompt_chars bucket (`tasks.graphwalks.results`). `--predictions FILE` scores a file of responses
(JSONL: id, response; a --samples file is one) without a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ..console import note_line
from ..errors import fail
from ..files import write_json_atomic, write_jsonl_atomic
from ..metrics.graphwalks import GRADERS, graphwalks_score
from ..runs import Run, RunSettings, open_run
from ..runs.answers import answer_measured, without_measurements
from ..runs.cost import announce_cost
from ..runs.memory import PeakMemory
from ..runs.report import build_report, environment
from ..runs.run import check_run_outputs
from ..runs.samples import prompt_ends
from ..runs.settings import ignored_flag, shared_modes
from ..scoring.answering import Query, Rule, chat_query, generation_facts
from ..scoring.bos import resolve_bos
from ..scoring.chat import turn_end_ids
from ..scoring.decoding import Decoding, check_temperature, unit_seed
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy
from ..tasks.graphwalks.data import Walk, read_walks
from ..tasks.graphwalks.results import bucket_of, graphwalks_results
from ..tasks.mrcr.prompts import RENDERS
from .mrcr import check_fit, fold_cells, read_responses, resolve_render

FIT = "use a model with a longer context (or a smaller --max-new-tokens), or --limit/--data without the longest records"
RUN_ONLY = ("max_new_tokens", "render", "chat_template", "temperature", "seed", "batch_size")


@dataclass(kw_only=True)
class GraphwalksSettings(RunSettings):
    """Every flag of `megaeval graphwalks`, defaults included (lm-eval's graphwalks task's where it has one)."""

    data: str | None = None
    predictions: str | None = None
    problem_types: str = "bfs,parents"
    limit: int | None = None  # the first N records of each problem type
    grader: str = "lm-eval"
    max_new_tokens: int = 16384  # lm-eval's max_gen_toks
    render: str = "auto"
    chat_template: str | None = None
    temperature: float = 0.0
    seed: int = 0
    bos: str = "auto"
    batch_size: str | int = "auto"
    out: str = "reports/graphwalks.json"
    samples: str | None = None

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size")
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        **dict.fromkeys(RUN_ONLY, ("--model",)),
        **shared_modes(run=("--model",), report=("--model", "--predictions")),
    }  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.data:
            raise fail("--data is required: the openai/graphwalks files the records come from",
                       "pass --data DIR (the folder its parquet files were downloaded to)")  # fmt: skip
        if self.predictions and self.model is not None:
            raise fail(f"--predictions scores the responses in {self.predictions} without a model, so --model would "
                       "be ignored", "drop --model, or drop --predictions")  # fmt: skip
        ignored = ignored_flag(self, self.MODES, "--predictions" if self.predictions else "--model")
        if ignored is not None:
            flag = f"--{ignored[0].replace('_', '-')}"
            raise fail(f"{flag} does not apply with --predictions (it would be ignored)",
                       f"use {flag} when a model answers, or leave it out")  # fmt: skip
        self.bos = bos_policy(self.bos)
        self.batch_size = parse_batch_size(self.batch_size)
        check_temperature(self.temperature, "--temperature")
        if self.grader not in GRADERS:
            raise fail(f"unknown --grader {self.grader!r}", f"use {' or '.join(GRADERS)}")
        if self.render not in RENDERS:
            raise fail(f"unknown --render {self.render!r}", f"use one of {', '.join(RENDERS)}")
        for flag, value in (("--max-new-tokens", self.max_new_tokens), ("--limit", self.limit)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise fail(f"{flag} must be at least 1, got {value}")
        if not self.types:
            raise fail("--problem-types is empty", "pass bfs, parents or both")

    @property
    def types(self) -> list[str]:
        return [t.strip() for t in self.problem_types.split(",") if t.strip()]


def run_graphwalks(settings: GraphwalksSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Answer and score every record (or score --predictions); write and return the report (rank 0)."""
    walks, source = read_walks(settings.data, settings.types, settings.limit)
    if settings.predictions is not None:
        return score_predictions(settings, walks, source)
    chosen: dict[str, Any] = {}

    def check(lm: Any) -> dict[str, Any]:
        render, chosen["template"] = resolve_render(lm, settings.render, settings.chat_template)
        chosen.update(render_effective=render, chat_template_effective=chosen["template"] and
                      chosen["template"].facts(), stop_ids_effective=list(turn_end_ids(lm)))  # fmt: skip
        return {"render": render, "template": chosen["chat_template_effective"]}

    with open_run("graphwalks", settings, reads=[settings.data], fingerprint={"data": source}, check=check,
                  progress=progress, on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, walks, source, chosen)


def walk_query(lm: Any, template: Any, render: str, walk: Walk, bos: str) -> Query:
    """A record's prompt as the model is asked it: one user turn through `template` (or a chat API), else as is."""
    if render == "template":
        return chat_query(lm, template, [{"role": "user", "content": walk.prompt}], f"Graphwalks {walk.id}", bos)
    start = [lm.tokenizer.bos_id] if resolve_bos(lm, bos) else []
    return Query([*start, *lm.tokenizer.encode(walk.prompt)], walk.prompt, ({"role": "user", "content": walk.prompt},),
                 f"Graphwalks {walk.id}")  # fmt: skip


def _scored(settings: GraphwalksSettings, walk: Walk, response: str, extra: dict[str, Any]) -> dict[str, Any]:
    score, nodes, failed = graphwalks_score(response, list(walk.gold), settings.grader)
    return {"id": walk.id, "problem_type": walk.problem_type, "prompt_chars": walk.prompt_chars,
            "bucket": bucket_of(walk.prompt_chars), "response": response, "nodes": nodes, "gold": list(walk.gold),
            "failed": failed, "score": score, **extra}  # fmt: skip


def _evaluate(run: Run, settings: GraphwalksSettings, walks: list[Walk], source: dict[str, Any],
              chosen: dict[str, Any]) -> dict[str, Any] | None:  # fmt: skip
    lm = run.lm
    template = chosen.pop("template")
    meter = PeakMemory(lm.device)
    stop_ids = tuple(chosen["stop_ids_effective"])

    def compute_batch(batch: list[Walk]) -> list[dict[str, Any]]:
        queries = [walk_query(lm, template, chosen["render_effective"], w, settings.bos) for w in batch]
        for q in queries:
            check_fit(lm, q, settings.max_new_tokens, FIT)
        seeds = None if settings.temperature == 0 else tuple(unit_seed(settings.seed, w.id) for w in batch)
        rule = Rule(settings.max_new_tokens, (), Decoding(settings.temperature, seeds, stop_ids=stop_ids))
        answers, measured = answer_measured(run, queries, rule, False, size, meter)
        return [_scored(settings, w, a.text, {"prompt_tokens": len(q.ids), "stop_reason": a.stop_reason,
                                              "generated_tokens": a.n_tokens, **prompt_ends(q.text or ""),
                                              **generation_facts(a), **measured})
                for w, q, a in zip(batch, queries, answers, strict=True)]  # fmt: skip

    # auto: as many rows as the longest record's KV cache allows (two characters a token: hash-named nodes split
    # finely; a fixed-context model's own context bounds it)
    longest = max(w.prompt_chars for w in walks) // 2 + settings.max_new_tokens
    size = run.answerer.rows(settings.batch_size, min(lm.max_context or longest, longest))

    def left_units(journal: Any) -> tuple[int, int, list[int], int]:
        todo = [w for w in walks if w.id not in journal]
        return len(todo), len(walks), [w.prompt_chars // 4 for w in todo], len(todo) * settings.max_new_tokens

    if lm.max_context is not None:  # every prompt fits before any is answered
        for w in walks:
            check_fit(lm, walk_query(lm, template, chosen["render_effective"], w, settings.bos),
                      settings.max_new_tokens, FIT)  # fmt: skip
    announce_cost(run, "records", left_units, min(4096, lm.max_context or 4096), about=True,
                  rows=min(size, max(len(walks), 1)))  # fmt: skip
    rows = run.map(walks, key=lambda w: w.id, compute=lambda w: compute_batch([w])[0], unit_name="chars",
                   weight=lambda w: w.prompt_chars + 1, describe=lambda w: w.problem_type, batch=size,
                   compute_batch=compute_batch)  # fmt: skip
    if rows is None:
        return None
    cut = sum(1 for r in rows if r["stop_reason"] == "length")
    if cut:
        note_line(f"graphwalks: {cut} of {len(rows)} responses reached --max-new-tokens {settings.max_new_tokens:,}")
    results = {**graphwalks_results(rows), "cut_at_max_new_tokens": cut}
    fold_cells(results["buckets"], rows, meter.method, "bucket")
    samples = [without_measurements(r) for r in rows]
    effective = {**asdict(settings), **chosen, "batch_size_effective": size}
    return run.finish(effective, {**source, "records": len(walks)}, results, samples=samples)


def score_predictions(settings: GraphwalksSettings, walks: list[Walk], source: dict[str, Any]) -> dict[str, Any]:
    """--predictions FILE: each record's response scored; ids that name no record, and records without a response,
    are refused in one line."""
    out = check_run_outputs(settings, [settings.data, settings.predictions])
    responses = read_responses(settings.predictions)
    known = {w.id for w in walks}
    stray = next((i for i in responses if i not in known), None)
    if stray is not None:
        raise fail(f"--predictions {settings.predictions}: id {stray!r} is not one of the records selected from "
                   f"--data {settings.data}", "score the responses against the data (and --problem-types, --limit) "
                   "they were made from")  # fmt: skip
    missing = next((w.id for w in walks if w.id not in responses), None)
    if missing is not None:
        raise fail(f"--predictions {settings.predictions} has no response for record {missing} (of {len(walks)} "
                   "selected)", "pass --problem-types/--limit as when the responses were made")  # fmt: skip
    rows = [_scored(settings, w, responses[w.id], {}) for w in walks]
    data = {**source, "records": len(walks), "predictions": {"path": settings.predictions}}
    if settings.samples:
        data["samples_sha256"] = write_jsonl_atomic(settings.samples, rows)
    report = build_report("graphwalks", asdict(settings), {"spec": None, "predictions": settings.predictions}, data,
                          graphwalks_results(rows), environment("cpu", "none"))  # fmt: skip
    write_json_atomic(out, report)
    return report


def graphwalks_summary(report: dict[str, Any]) -> str:
    """Graphwalks' tables of a report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import graphwalks_tables

    return graphwalks_tables([report], [report_label(report, "graphwalks")])
