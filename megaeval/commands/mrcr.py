"""`megaeval mrcr`: OpenAI MRCR (openai/mrcr) as its dataset card runs and grades it, on any model.

Every record is one unit of the run skeleton: its messages rendered exactly as given (the model's chat template,
no system turn added; a plain transcript for a base model: `tasks.mrcr.prompts`), answered greedily (or sampled with
--temperature, a seed per record), the response graded by the card's `grade()` (`metrics.mrcr`, nothing stripped
unless --strip). Records are binned by their o200k_base tokens (`tasks.mrcr.o200k`, offline) as the card bins them
and the means tabled per needle count and bin (`tasks.mrcr.results`). --max-length keeps the bins whose upper edge
fits (default: the model's context; every bin for a state-carrying model). `--predictions FILE` grades a file of
responses (JSONL: id, response; a --samples file is one) against the records, without a model.

GDM MRCR v2's CSV files run the same way (`tasks.mrcr.data`): each record's flattened chat one user turn, its bin its
file's, its score GDM's `mrcr_v2_metric`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..console import note_line
from ..errors import fail
from ..files import write_json_atomic, write_jsonl_atomic
from ..metrics.mrcr import grade, mrcr_v2_metric
from ..runs import Run, RunSettings, open_run
from ..runs.answers import answer_measured, fold_lengths, without_measurements
from ..runs.cost import announce_cost
from ..runs.memory import PeakMemory
from ..runs.report import build_report, environment
from ..runs.run import check_run_outputs
from ..runs.samples import prompt_ends
from ..runs.settings import ignored_flag, shared_modes
from ..scoring.answering import Query, Rule, chat_query, chat_template_of, generation_facts
from ..scoring.bos import resolve_bos
from ..scoring.chat import select_template, turn_end_ids
from ..scoring.decoding import Decoding, check_temperature, unit_seed
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy
from ..tasks.mrcr.data import GDM_V2, Record, read_records, record_messages
from ..tasks.mrcr.o200k import o200k
from ..tasks.mrcr.prompts import RENDERS, plain_transcript
from ..tasks.mrcr.results import BIN_BY, BINS, bin_high, bin_of, binned_tokens, mrcr_results
from ..text import iter_jsonl

RUN_ONLY = ("max_new_tokens", "render", "chat_template", "temperature", "seed", "batch_size")


@dataclass(kw_only=True)
class MrcrSettings(RunSettings):
    """Every flag of `megaeval mrcr`, defaults included (the card's where it has one)."""

    data: str | None = None  # openai/mrcr's files: a folder in either layout, or one file
    predictions: str | None = None  # grade these responses (JSONL: id, response), no model
    needles: str = "2,4,8"
    limit: int | None = None  # the first N records of each needle count (None: all)
    bin_by: str = "prompt+answer"  # the card's; or prompt
    max_length: int | None = None  # keep bins whose upper edge is at most this (None: the model's context)
    max_new_tokens: int = 4096  # the card's snippet sets none (the API's own cap)
    strip: bool = False  # strip the response's whitespace before grading (the card does not)
    render: str = "auto"  # template, plain, or auto (template where the tokenizer has one)
    chat_template: str | None = None  # one of the model's several templates, by name
    temperature: float = 0.0  # greedy
    seed: int = 0  # sampled answers: a seed per record from this
    bos: str = "auto"
    batch_size: str | int = "auto"
    out: str = "reports/mrcr.json"
    samples: str | None = None
    needle_counts: list[int] | None = None

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size")
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        **dict.fromkeys(RUN_ONLY, ("--model",)),
        **shared_modes(run=("--model",), report=("--model", "--predictions")),
    }  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.data:
            raise fail("--data is required: the openai/mrcr files the records come from",
                       "pass --data DIR (the folder its files were downloaded to)")  # fmt: skip
        mode = "--predictions" if self.predictions else "--model"
        if self.predictions and self.model is not None:
            raise fail(f"--predictions grades the responses in {self.predictions} without a model, so --model would "
                       "be ignored", "drop --model, or drop --predictions")  # fmt: skip
        ignored = ignored_flag(self, self.MODES, mode)
        if ignored is not None:
            flag = f"--{ignored[0].replace('_', '-')}"
            raise fail(f"{flag} does not apply with --predictions (it would be ignored)",
                       f"use {flag} when a model answers, or leave it out")  # fmt: skip
        self.bos = bos_policy(self.bos)
        self.batch_size = parse_batch_size(self.batch_size)
        check_temperature(self.temperature, "--temperature")
        if self.bin_by not in BIN_BY:
            raise fail(f"unknown --bin-by {self.bin_by!r}", f"use {' or '.join(BIN_BY)}")
        if self.render not in RENDERS:
            raise fail(f"unknown --render {self.render!r}", f"use one of {', '.join(RENDERS)}")
        if self.render == "plain" and self.chat_template is not None:
            raise fail("--chat-template names a template, and --render plain uses none", "drop one of them")
        for flag, value in (("--max-new-tokens", self.max_new_tokens), ("--limit", self.limit),
                            ("--max-length", self.max_length)):  # fmt: skip
            if value is not None and (isinstance(value, bool) or value < 1):
                raise fail(f"{flag} must be at least 1, got {value}")
        try:
            counts = [int(n) for n in str(self.needles).split(",") if n.strip()]
        except ValueError:
            counts = []
        if not counts or any(n < 1 for n in counts):
            raise fail(f"bad --needles {self.needles!r}", "pass needle counts such as 2,4,8")
        self.needle_counts = sorted(set(counts))


def select(records: list[Record], settings: MrcrSettings, max_length: int | None) -> tuple[list[Record], list[str]]:
    """The records whose bin fits `max_length` (a bin is run whole or not at all; a record outside the card's bins by
    its own count), and the bins left out."""
    if max_length is None:
        return records, []
    kept, left = [], []
    for r in records:
        name = record_bin(r, settings)
        inside = r.bin is not None or name in BINS  # a file's bin (GDM v2), or one of the card's
        if (bin_high(name) if inside else binned_tokens(r, settings.bin_by)) <= max_length:
            kept.append(r)
        elif name not in left:
            left.append(name)
    return kept, left


def record_bin(record: Record, settings: MrcrSettings) -> str:
    """A record's bin: its file's (GDM v2), else the card's bin of its o200k_base count (--bin-by)."""
    return record.bin or bin_of(binned_tokens(record, settings.bin_by))


def check_release(records: list[Record], settings: MrcrSettings) -> None:
    """Refuse the flags GDM v2's records would ignore: its metric strips the response itself, its files are its bins."""
    if records[0].release != GDM_V2:
        return
    for flag, given in (("--strip", settings.strip), ("--bin-by", settings.bin_by != BIN_BY[0])):
        if given:
            raise fail(f"{flag} does not apply to GDM MRCR v2's records (it would be ignored: its metric strips the "
                       "response itself, and each file is one bin)", f"drop {flag}")  # fmt: skip


def run_mrcr(settings: MrcrSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Answer and grade every record (or grade --predictions); write and return the report (rank 0)."""
    encoding = o200k()
    records, source = read_records(settings.data, encoding, settings.needle_counts, settings.limit)
    check_release(records, settings)
    source = {**source, "o200k_backend": encoding.backend}
    if settings.predictions is not None:
        return score_predictions(settings, records, source)
    chosen: dict[str, Any] = {}

    def check(lm: Any) -> dict[str, Any]:
        facts, chosen["template"] = check_model(lm, settings)
        chosen.update(facts)
        return {"render": facts["render_effective"], "template": facts["chat_template_effective"]}

    data = {k: v for k, v in source.items() if k != "o200k_backend"}  # either counter gives the same counts
    with open_run("mrcr", settings, reads=[settings.data], fingerprint={"data": data}, check=check,
                  progress=progress, on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, records, source, chosen)


def resolve_render(lm: Any, render: str, name: str | None) -> tuple[str, Any]:
    """How chat messages reach `lm` under --render: `template` (its chat template, or a chat API's server) or
    `plain`; and the template (None: plain, or the server's)."""
    chat_api = getattr(lm, "prompt_format", None) == "messages"
    has_template = bool(getattr(getattr(lm.tokenizer, "tok", None), "chat_template", None))
    if chat_api and render == "plain":
        raise fail(f"{lm.spec} is asked through a chat API, which renders messages with the server's template",
                   "drop --render plain, or use --model-args api=completions")  # fmt: skip
    if chat_api:
        return "template", chat_template_of(lm, name)
    if render == "template" or (render == "auto" and has_template):
        return "template", select_template(lm, name)
    if name is not None:
        raise fail(f"--chat-template: {lm.spec}'s tokenizer has no chat template, so --render auto reads plain "
                   "prompts", "drop --chat-template")  # fmt: skip
    return "plain", None


def check_model(lm: Any, settings: MrcrSettings) -> tuple[dict[str, Any], Any]:
    """How the messages reach the model (what the report records: rendering, template, the length limit that
    selects records, the ids that end a turn), and the template itself (None: plain, or a server's)."""
    render, template = resolve_render(lm, settings.render, settings.chat_template)
    limit = settings.max_length if settings.max_length is not None else lm.max_context
    facts = {
        "render_effective": render,
        "chat_template_effective": template and template.facts(),
        "max_length_effective": limit,
        "stop_ids_effective": list(turn_end_ids(lm)),
    }
    return facts, template


MRCR_FIT = "pass a smaller --max-length (a bin's upper edge, in o200k_base tokens) or --max-new-tokens"


def check_fit(lm: Any, query: Query, max_new_tokens: int, fix: str) -> None:
    """Refuse a prompt that, with `max_new_tokens` to generate, passes a fixed-context model's context."""
    if lm.max_context is not None and len(query.ids) + max_new_tokens > lm.max_context:
        raise fail(f"{query.name}: its prompt is {len(query.ids):,} tokens, and with --max-new-tokens "
                   f"{max_new_tokens:,} it passes {lm.spec}'s max_context {lm.max_context:,}", fix)  # fmt: skip


def record_query(lm: Any, template: Any, render: str, record: Record, bos: str) -> Query:
    """A record's messages as the model is asked them: through `template` (or a chat API's server), else the plain
    transcript after BOS by the policy."""
    messages = record_messages(record)
    if render == "template":
        return chat_query(lm, template, messages, f"MRCR record {record.id}", bos)
    text = plain_transcript(messages)
    start = [lm.tokenizer.bos_id] if resolve_bos(lm, bos) else []
    return Query([*start, *lm.tokenizer.encode(text)], text, ({"role": "user", "content": text},),
                 f"MRCR record {record.id}")  # fmt: skip


def _evaluate(run: Run, settings: MrcrSettings, all_records: list[Record], source: dict[str, Any],
              chosen: dict[str, Any]) -> dict[str, Any] | None:  # fmt: skip
    lm = run.lm
    records, left = select(all_records, settings, chosen["max_length_effective"])
    if not records:
        raise fail(f"no record's bin fits {chosen['max_length_effective']:,} tokens (--max-length, or {lm.spec}'s "
                   "context)", "pass a larger --max-length, or use a model with a longer context")  # fmt: skip
    if left and run.ctx.is_main:
        note_line(f"mrcr: bins {', '.join(left)} pass {chosen['max_length_effective']:,} tokens and are left out")
    template = chosen.pop("template")
    meter = PeakMemory(lm.device)
    stop_ids = tuple(chosen["stop_ids_effective"])

    def compute_batch(batch: list[Record]) -> list[dict[str, Any]]:
        queries = [record_query(lm, template, chosen["render_effective"], r, settings.bos) for r in batch]
        for q in queries:
            check_fit(lm, q, settings.max_new_tokens, MRCR_FIT)
        seeds = None if settings.temperature == 0 else tuple(unit_seed(settings.seed, r.id) for r in batch)
        rule = Rule(settings.max_new_tokens, (), Decoding(settings.temperature, seeds, stop_ids=stop_ids))
        answers, measured = answer_measured(run, queries, rule, False, size, meter)
        return [_graded(settings, r, a.text, {"prompt_tokens": len(q.ids), "stop_reason": a.stop_reason,
                                              "generated_tokens": a.n_tokens, **prompt_ends(q.text or ""),
                                              **generation_facts(a), **measured})
                for r, q, a in zip(batch, queries, answers, strict=True)]  # fmt: skip

    # auto: as many rows as the longest record's KV cache allows (o200k_base's count stands in for the model's)
    longest = max(r.prompt_tokens for r in records) + settings.max_new_tokens
    size = run.answerer.rows(settings.batch_size, min(lm.max_context or longest, longest))

    def left_units(journal: Any) -> tuple[int, int, list[int], int]:
        todo = [r for r in records if r.id not in journal]
        return len(todo), len(records), [r.prompt_tokens for r in todo], len(todo) * settings.max_new_tokens

    if lm.max_context is not None:  # every prompt fits before any is answered (a bin runs whole or not at all)
        for r in records:
            check_fit(lm, record_query(lm, template, chosen["render_effective"], r, settings.bos),
                      settings.max_new_tokens, MRCR_FIT)  # fmt: skip
    announce_cost(run, "records", left_units, min(4096, lm.max_context or 4096), about=True,
                  rows=min(size, max(len(records), 1)))  # fmt: skip
    rows = run.map(records, key=lambda r: r.id, compute=lambda r: compute_batch([r])[0], unit_name="tokens",
                   weight=lambda r: r.prompt_tokens + 1, describe=lambda r: f"{r.needles} needles", batch=size,
                   compute_batch=compute_batch)  # fmt: skip
    if rows is None:
        return None
    cut = sum(1 for r in rows if r["stop_reason"] == "length")
    if cut:
        note_line(f"mrcr: {cut} of {len(rows)} responses reached --max-new-tokens {settings.max_new_tokens:,} "
                  "and were graded as cut")  # fmt: skip
    results = {**mrcr_results(rows), "cut_at_max_new_tokens": cut}
    fold_cells(results["bins"], rows, meter.method, "bin")
    samples = [without_measurements(r) for r in rows]
    data = {**source, "records": len(records), "left_out_bins": left}
    return run.finish({**asdict(settings), **chosen, "batch_size_effective": size}, data, results, samples=samples)


def fold_cells(cells: dict[str, dict[str, Any]], rows: list[dict[str, Any]], method: str, key: str) -> None:
    """Each bin's (bucket's) cell gets what reading its records cost: peak memory, the largest state, the prompt
    tokens read per second (`runs.answers.fold_lengths`)."""
    folded = [{key: name} for name in cells]
    fold_lengths(folded, rows, method, key)
    for row in folded:
        cells[row.pop(key)].update(row)


def _graded(settings: MrcrSettings, record: Record, response: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A record's samples line: its bin, the response, the answer and the card's grade."""
    if record.release == GDM_V2:  # GDM's metric: the random string anywhere (its last occurrence), texts stripped
        found, score = record.random_string in response.strip(), mrcr_v2_metric(response, record.answer)
        counts = {"context_len": record.prompt_tokens, "answer_token_count": record.answer_tokens}
    else:
        found = (response.strip() if settings.strip else response).startswith(record.random_string)
        score = grade(response, record.answer, record.random_string, settings.strip)
        counts = {"o200k_prompt_tokens": record.prompt_tokens, "o200k_answer_tokens": record.answer_tokens}
    return {"id": record.id, "needles": record.needles, "bin": record_bin(record, settings), **counts,
            "response": response, "answer": record.answer, "random_string_to_prepend": record.random_string,
            "prefix_found": found, "score": score, **extra}  # fmt: skip


def read_responses(path: str) -> dict[str, str]:
    """A predictions file: JSONL lines each with an `id` (a record's, `<file>#<row>`) and the `response` text."""
    if not Path(path).is_file():
        raise fail(f"--predictions {path}: no such file", "pass a JSONL file of {id, response} lines")
    responses: dict[str, str] = {}
    for number, row in iter_jsonl(path):
        where = f"{path} line {number}"
        if not (isinstance(row, dict) and isinstance(row.get("id"), str) and isinstance(row.get("response"), str)):
            raise fail(f"{where} is not an object with a text `id` and a text `response`",
                       'write one {"id": ..., "response": ...} object per line (a --samples file is one)')  # fmt: skip
        if row["id"] in responses:
            raise fail(f"{where}: id {row['id']!r} was given before", "keep one response per record")
        responses[row["id"]] = row["response"]
    if not responses:
        raise fail(f"--predictions {path} holds no responses", "pass a file of {id, response} lines")
    return responses


def score_predictions(settings: MrcrSettings, records: list[Record], source: dict[str, Any]) -> dict[str, Any]:
    """--predictions FILE: each selected record's response graded; ids that name no record, and records without a
    response, are refused in one line."""
    out = check_run_outputs(settings, [settings.data, settings.predictions])
    responses = read_responses(settings.predictions)
    known = {r.id for r in records}  # a response to a record --max-length leaves out is not graded, nor refused
    records, left = select(records, settings, settings.max_length)
    stray = next((i for i in responses if i not in known), None)
    if stray is not None:
        raise fail(f"--predictions {settings.predictions}: id {stray!r} is not one of the records selected from "
                   f"--data {settings.data}", "grade the responses against the data (and --needles, --limit) they "
                   "were made from")  # fmt: skip
    missing = next((r.id for r in records if r.id not in responses), None)
    if missing is not None:
        raise fail(f"--predictions {settings.predictions} has no response for record {missing} (of {len(records)} "
                   "selected)", "pass --needles/--limit/--max-length as when the responses were made")  # fmt: skip
    rows = [_graded(settings, r, responses[r.id], {}) for r in records]
    results = mrcr_results(rows)
    data = {**source, "records": len(records), "left_out_bins": left,
            "predictions": {"path": settings.predictions}}  # fmt: skip
    if settings.samples:
        data["samples_sha256"] = write_jsonl_atomic(settings.samples, rows)
    report = build_report("mrcr", asdict(settings), {"spec": None, "predictions": settings.predictions}, data, results,
                          environment("cpu", "none"))  # fmt: skip
    write_json_atomic(out, report)
    return report


def mrcr_summary(report: dict[str, Any]) -> str:
    """MRCR's tables of a report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import mrcr_tables

    return mrcr_tables([report], [report_label(report, "mrcr")])
