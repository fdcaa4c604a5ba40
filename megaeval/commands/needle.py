"""`megaeval needle`: passkey and RULER needle-in-a-haystack retrieval over a grid of lengths and depths.

Every (task, length, sample) is one unit of the run skeleton: its needles are drawn from the seed, its haystack
sized so that every depth's prompt + --max-new-tokens fits the length (`tasks.needle.prompts`), and its prompts
answered greedily. With the shared schedule (the default for state-carrying models) the haystack before each needle
is read once: prompts go in order of depth and each branches from a copy of the state read up to where it leaves
the next one (`scoring.generate.generate_branches`); a Transformer reads each prompt whole (a copy of a long KV
cache would double its memory). Scores: `metrics.needle`; the grid: `tasks.needle.results`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ..distributed import group_max
from ..errors import fail
from ..files import files_sha256
from ..metrics.needle import needle_score
from ..models.base import StreamingLM
from ..runs import Run, RunSettings, open_run
from ..runs.memory import PeakMemory
from ..runs.samples import prompt_ends
from ..scoring.answering import Query, Rule, chat_messages, generation_facts
from ..scoring.chat import ChatFlags, run_template
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy, check_prompts, prompt_encoder
from ..scoring.sweep_plan import parse_lengths
from ..tables import format_length
from ..tasks.needle.haystack import book_files, haystack_folder
from ..tasks.needle.prompts import build_prompts, draw_needles, haystack_words, needle_token_offset, sample_rng
from ..tasks.needle.results import needle_results
from ..tasks.needle.spec import load_needle_task
from ..tasks.specs import list_tasks, parse_tasks, spec_sha256

DEFAULT_DEPTHS = "0,10,20,30,40,50,60,70,80,90,100"
DEFAULT_NEEDLE_LENGTHS = "4K,8K,16K,32K,64K,128K"
SCHEDULES = ("auto", "shared", "naive")
MAX_LENGTH = 16 << 20  # a 16M-token prompt's text, ids and haystack take a few GB of host memory


@dataclass(kw_only=True)
class NeedleSettings(ChatFlags, RunSettings):
    """Every flag of `megaeval needle`, defaults included (lengths and depths as integers once parsed)."""

    tasks: str = "passkey"
    lengths: str | list[int] = DEFAULT_NEEDLE_LENGTHS
    depths: str | list[int] = DEFAULT_DEPTHS
    samples_per_cell: int = 1
    seed: int = 42  # RULER's default random_seed
    max_new_tokens: int | None = None  # None: the task's own (passkey 10, RULER 128)
    haystack: str | None = None  # folder of .txt books for RULER's essay haystack; None: the six Austen novels
    include_path: list[str] = field(default_factory=list)  # folders of the user's own task files
    bos: str = "auto"
    schedule: str = "auto"  # auto: shared for state-carrying models, naive for fixed-context ones
    batch_size: str | int = "auto"  # prompts decoded together (see `batch_size_for`); results do not depend on it
    out: str = "reports/needle.json"
    samples: str | None = None
    task_names: list[str] = field(default_factory=list)

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size")  # never changes a number

    def __post_init__(self) -> None:
        super().__post_init__()
        self.bos = bos_policy(self.bos)
        self.check_chat()
        self.batch_size = parse_batch_size(self.batch_size)
        self.lengths = parse_lengths(self.lengths)
        if self.lengths[-1] > MAX_LENGTH:
            raise fail(
                f"--lengths {format_length(self.lengths[-1])}: needle prompts are built whole in memory, "
                f"up to {format_length(MAX_LENGTH)} tokens",
                f"use --lengths up to {format_length(MAX_LENGTH)}",
            )
        if self.haystack is not None and not str(self.haystack).strip():
            raise fail("--haystack is empty", "pass a folder of .txt books, or leave --haystack out for the default")
        self.depths = parse_depths(self.depths)
        self.task_names = parse_tasks(self.tasks, "needle", self.include_path)
        if self.samples_per_cell < 1:
            raise fail(f"--samples-per-cell must be at least 1, got {self.samples_per_cell}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise fail(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.schedule not in SCHEDULES:
            raise fail(f"unknown --schedule {self.schedule!r}", f"use {', '.join(SCHEDULES)}")


def parse_depths(text: str | list[int]) -> list[int]:
    """Comma-separated needle depths in percent of the haystack (0 = its start, 100 = its end), sorted."""
    items = text if isinstance(text, list) else [t for t in str(text).split(",") if t.strip()]
    try:
        depths = sorted({int(str(t).strip()) for t in items})
    except ValueError:
        raise fail(f"bad --depths {text!r}", f"write percentages from 0 to 100, e.g. {DEFAULT_DEPTHS}") from None
    if not depths or depths[0] < 0 or depths[-1] > 100:
        raise fail(f"bad --depths {text!r}: depths are percentages from 0 to 100", f"e.g. --depths {DEFAULT_DEPTHS}")
    return depths


def run_needle(settings: NeedleSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Run the needle grid for every task; write and return the report (rank 0; None on the other ranks)."""
    specs = {name: load_needle_task(name, settings.include_path) for name in settings.task_names}
    if settings.haystack is not None and not any(_reads_books(s) for s in specs.values()):
        essays = ", ".join(n for n in list_tasks("needle", settings.include_path)
                           if _reads_books(load_needle_task(n, settings.include_path)))  # fmt: skip
        raise fail(f"--haystack: none of the tasks {', '.join(specs)} reads a haystack of books (the essay tasks "
                   f"{essays} do)", "drop --haystack")  # fmt: skip
    max_new = {name: settings.max_new_tokens or spec["max_new_tokens"] for name, spec in specs.items()}
    words = {name: haystack_words(spec, settings.haystack) for name, spec in specs.items()}
    data = _data(settings, specs)

    def check(lm: StreamingLM) -> dict[str, Any]:
        return check_prompts(lm, settings.lengths, settings.bos, settings.chat)

    reads = [settings.haystack] if any(words.values()) else []
    with open_run("needle", settings, reads=reads, fingerprint={"data": data}, check=check, progress=progress,
                  on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, specs, max_new, words, data)


def _evaluate(
    run: Run, settings: NeedleSettings, specs: dict[str, dict], max_new: dict[str, int], words: dict, data: dict
) -> dict[str, Any] | None:
    lm = run.lm
    template = run_template(lm, settings.chat)
    chosen = check_prompts(lm, settings.lengths, settings.bos, settings.chat)  # what `check` recorded
    bos = chosen["bos_effective"]
    encode = prompt_encoder(lm, bos, settings.chat, template)
    shared = settings.schedule == "shared" or (settings.schedule == "auto" and lm.max_context is None)
    meter = PeakMemory(lm.device)

    def compute(unit: tuple[str, int, int]) -> dict[str, Any]:
        task, length, sample = unit
        spec = specs[task]
        needles = draw_needles(spec, sample_rng(settings.seed, task, length, sample))
        prompts = build_prompts(spec, needles, length, settings.depths, max_new[task], encode, words[task])
        state_bytes = None  # stays None where no state is read here (a served model)

        def after_prompt(state: Any) -> None:
            nonlocal state_bytes
            state_bytes = max(state_bytes or 0, state.nbytes())

        meter.reset()
        queries = [Query(p.ids, p.text, chat_messages(settings.chat, p.asked), f"needle {task} at {length}, depth "
                         f"{p.depth}%, sample {sample}") for p in prompts]  # fmt: skip
        rows_together = run.answerer.rows(settings.batch_size, length)
        answers, read = run.answerer.answer(queries, Rule(max_new[task]), shared=shared, rows=rows_together,
                                            after_prompt=after_prompt)  # fmt: skip
        peak = None if state_bytes is None else group_max(run.ctx.chunk, meter.peak())
        rows = []
        for p, gen in zip(prompts, answers, strict=True):
            offset = needle_token_offset(p, lm.tokenizer.encode, bos)
            rows.append({
                "task": task, "id": f"{length}/{p.depth}/{sample}", "length": length, "depth": p.depth,
                "sample": sample, "prompt_tokens": len(p.ids), "needle_token_offset": offset,
                "haystack_units": p.haystack_units, "answer": p.answers,
                "prediction": gen.text, "score": needle_score(spec["metric"], gen.text, p.answers),
                "stop_reason": gen.stop_reason, "generated_tokens": gen.n_tokens,
                **prompt_ends(p.text), **generation_facts(gen),
            })  # fmt: skip
        naive = sum(len(p.ids) for p in prompts)
        state = None if state_bytes is None else group_max(run.ctx.chunk, state_bytes)
        return {"prompts": rows, "tokens_read": read, "tokens_naive": naive,
                "peak_memory_bytes": peak, "state_bytes": state}  # fmt: skip

    units = [(task, length, sample) for task in specs for length in settings.lengths
             for sample in range(settings.samples_per_cell)]  # fmt: skip
    records = run.map(units, key=list, compute=compute, unit_name="tokens",
                      weight=lambda u: u[1] * len(settings.depths),
                      describe=lambda u: f"{u[0][:8]} {format_length(u[1])}")  # fmt: skip
    if records is None:
        return None  # not rank 0
    for unit, record in zip(units, records, strict=True):
        record.update(task=unit[0], length=unit[1])
    results = needle_results(records, specs, settings.lengths, settings.depths)
    for name in specs:
        results[name].update(max_new_tokens=max_new[name], peak_memory_method=meter.method)
    samples = [row for r in records for row in r["prompts"]]
    batch = {n: run.answerer.rows(settings.batch_size, n) for n in settings.lengths}
    effective = {**chosen, "chat_template_effective": template and template.facts(),
                 "schedule_effective": "shared" if shared else "naive", "max_new_tokens_effective": max_new,
                 "batch_size_effective": batch}  # fmt: skip
    return run.finish({**asdict(settings), **effective}, data, results, samples=samples)


def _data(settings: NeedleSettings, specs: dict[str, dict]) -> dict[str, Any]:
    """What the prompts are made of: the haystack books (with checksums) when a task reads them, and the task
    files' sources."""
    data: dict[str, Any] = {"tasks": {name: {"kind": s["kind"], "metric": s["metric"], "haystack": s.get("haystack",
                            "filler"), "sha256": spec_sha256("needle", name, settings.include_path)}
                            for name, s in specs.items()}}  # fmt: skip
    if any(_reads_books(s) for s in specs.values()):
        folder = haystack_folder(settings.haystack)
        books = book_files(folder)
        data["haystack"] = {"path": str(folder), "books": [p.name for p in books], "sha256": files_sha256(books)}
    return data


def _reads_books(spec: dict[str, Any]) -> bool:
    return spec["kind"] == "ruler_niah" and spec["haystack"] == "essay"


def needle_summary(report: dict[str, Any]) -> str:
    """The per-task accuracy, by length, of a needle report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import needle_tables

    return needle_tables([report], [report_label(report, "needle")])
