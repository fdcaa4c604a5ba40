"""`megaeval ruler`: RULER's 13 tasks (Hsieh et al., 2024) with RULER's own instances, scores, averages and effective
length.

Instances are generated per (task, length) by the generators of `tasks.ruler.data` exactly as RULER's prepare.py
writes them for the model's tokenizer (or read back from RULER's layout with --data-dir). Every (task, length,
sample) is one unit of the run skeleton: its prompt (RULER's input, then its answer prefix; inside the model's chat
template with --chat-template) answered greedily with the task's token budget and scored by RULER's metric.
`--prepare-only` writes the instances (--write-data) with the tokenizer alone and loads no weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import fail
from ..files import cached_file_sha256, file_sha256
from ..metrics.needle import needle_score
from ..metrics.ruler import DEFAULT_THRESHOLD, ruler_results
from ..models.base import StreamingLM
from ..runs import Run, RunSettings, open_run
from ..runs.answers import answer_measured, fold_lengths, without_measurements
from ..runs.cost import announce_cost as cost_line
from ..runs.memory import PeakMemory
from ..runs.samples import prompt_ends
from ..runs.settings import ignored_flag, shared_modes
from ..scoring.answering import Query, Rule, chat_messages, generation_facts
from ..scoring.chat import ChatFlags, run_template
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy, check_prompts, prompt_encoder
from ..scoring.sweep_plan import parse_lengths
from ..tables import format_length
from ..tasks.ruler.data import (
    check_write_folder,
    generate_instances,
    instances_file,
    read_instances,
    write_instances,
)
from ..tasks.ruler.inputs import RulerInputs, token_counter
from ..tasks.ruler.spec import load_ruler_task
from ..tasks.specs import parse_tasks, spec_sha256

DEFAULT_RULER_LENGTHS = "4K,8K,16K,32K,64K,128K"
# What a run does with its instances, and how a message says it
PREPARE, DATA, GENERATE = "prepare", "data", "generate"
WHERE = {PREPARE: "with --prepare-only", DATA: "with --data-dir", GENERATE: "to a run that generates its instances"}


@dataclass(kw_only=True)
class RulerSettings(ChatFlags, RunSettings):
    """Every flag of `megaeval ruler`, defaults included (RULER's: 500 samples, seed 42, lengths 4K to 128K)."""

    tasks: str = "all"
    lengths: str | list[int] = DEFAULT_RULER_LENGTHS
    num_samples: int = 500
    seed: int = 42
    essays: str | None = None  # RULER's PaulGrahamEssays.json; None: the public-domain books stand in
    qa_data: str | None = None  # folder with RULER's squad.json and hotpotqa.json
    english_words: str | None = None  # RULER's english_words.json (cwe past the wonderwords list)
    data_dir: str | None = None  # read instances from RULER's layout instead of generating them
    write_data: str | None = None  # write the instances in RULER's layout
    prepare_only: bool = False
    tokenizer: str | None = None  # --prepare-only: a model spec whose tokenizer counts (default: --model's)
    bos: str = "auto"
    threshold: float = DEFAULT_THRESHOLD
    batch_size: str | int = "auto"  # instances of one (task, length) decoded together; results do not depend on it
    share_prefixes: bool = True  # instances of one (task, length) in a batch read the start they share once
    include_path: list[str] = field(default_factory=list)
    out: str = "reports/ruler.json"
    samples: str | None = None
    task_names: list[str] = field(default_factory=list)

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "write_data", "batch_size")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prepare_only and not self.write_data:
            raise fail("--prepare-only writes instances and nothing else", "pass --write-data DIR")
        if self.data_dir and self.prepare_only:
            raise fail("--data-dir reads prepared instances and --prepare-only writes them", "pass one of them")
        self.check_modes()
        self.bos = bos_policy(self.bos)
        self.check_chat()
        self.batch_size = parse_batch_size(self.batch_size)
        self.lengths = parse_lengths(self.lengths)
        self.task_names = parse_tasks(self.tasks, "ruler", self.include_path)
        if self.num_samples < 1:
            raise fail(f"--num-samples must be at least 1, got {self.num_samples}")
        if not 0 <= self.threshold <= 100:  # NaN included
            raise fail(f"--threshold {self.threshold} is not a score from 0 to 100", "RULER's is 85.6")
        for flag in ("essays", "qa_data", "english_words", "data_dir"):
            value = getattr(self, flag)
            if value is not None and not Path(value).exists():
                raise fail(f"--{flag.replace('_', '-')} {value}: no such file or folder", "check the path")
        if self.write_data:
            check_write_folder(self.write_data)
        self.check_readers()

    # flag -> the modes it applies to: one table, checked once; a flag at its default is not given
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        "tokenizer": (PREPARE,),
        **dict.fromkeys(("write_data", "seed", "essays", "qa_data", "english_words"), (PREPARE, GENERATE)),
        **dict.fromkeys(("chat_template", "system_instruction", "threshold", "batch_size"), (GENERATE, DATA)),
        **{flag: modes for flag, modes in shared_modes(run=(GENERATE, DATA), report=(GENERATE, DATA)).items()
           if flag not in ("model", "model_args")},  # --prepare-only counts tokens with --model's tokenizer
    }  # fmt: skip
    # flag -> (what a task must read for it to apply, whether a task file reads it)
    READERS: ClassVar[dict[str, tuple[str, Any]]] = {
        "essays": ("an essay haystack", lambda spec: spec["args"].get("type_haystack") == "essay"),
        "qa_data": ("QA files (qa_1, qa_2)", lambda spec: spec["kind"] == "qa"),
        "english_words": ("RULER's english words (cwe)", lambda spec: spec["kind"] == "common_words_extraction"),
    }

    @property
    def mode(self) -> str:
        """What the run does with its instances: prepare them, read them, or generate and answer them."""
        return PREPARE if self.prepare_only else DATA if self.data_dir else GENERATE

    def check_modes(self) -> None:
        """Refuse a flag given for a mode it does not apply to (it would be ignored)."""
        ignored = ignored_flag(self, self.MODES, self.mode)
        if ignored is not None:
            name, modes = ignored
            flag = f"--{name.replace('_', '-')}"
            raise fail(f"{flag} does not apply {WHERE[self.mode]} (it would be ignored)",
                       f"use {flag} only {' or '.join(WHERE[m] for m in modes)}, or leave it out")  # fmt: skip

    def check_readers(self) -> None:
        """Refuse an input file that none of the tasks reads (it would be ignored)."""
        specs = [load_ruler_task(name, self.include_path) for name in self.task_names]
        for name, (what, reads) in self.READERS.items():
            if getattr(self, name) is not None and not any(reads(spec) for spec in specs):
                flag = f"--{name.replace('_', '-')}"
                raise fail(f"{flag}: none of the tasks {', '.join(self.task_names)} reads {what} (it would be "
                           "ignored)", f"drop {flag}, or add a task that reads it")  # fmt: skip


def ruler_inputs(settings: RulerSettings) -> RulerInputs:
    """The essay text, QA folder and word list the generators read, from the flags (books stand in for essays)."""
    from ..tasks.ruler.inputs import books_essay_text, read_english_words, read_essays

    essay = read_essays(Path(settings.essays)) if settings.essays else books_essay_text()
    words = read_english_words(settings.english_words) if settings.english_words else None
    return RulerInputs(essay, Path(settings.qa_data) if settings.qa_data else None, words)


def data_facts(settings: RulerSettings, specs: dict[str, dict]) -> dict[str, Any]:
    """What the instances are made of (checksums), recorded in the report and identifying a resumed run."""
    files = {flag: getattr(settings, flag) for flag in ("essays", "english_words")}
    data: dict[str, Any] = {
        "tasks": {
            n: {"kind": s["kind"], "metric": s["metric"], "sha256": spec_sha256("ruler", n, settings.include_path)}
            for n, s in specs.items()
        },  # fmt: skip
        "essays": "public-domain books stand in for Paul Graham's essays" if not settings.essays else None,
    }
    for flag, path in files.items():
        if path:
            data[flag] = {"path": path, "sha256": file_sha256(Path(path))}
    if settings.qa_data:
        qa = {n: file_sha256(p) for n in ("squad.json", "hotpotqa.json") if (p := Path(settings.qa_data) / n).is_file()}
        data["qa_data"] = {"path": settings.qa_data, "sha256": qa}
    if settings.data_dir:  # the files read, by checksum: a resume with edited instances is another run
        files = {f"{n}/{t}": cached_file_sha256(instances_file(settings.data_dir, n, t)) for t in specs
                 for n in settings.lengths}  # fmt: skip
        data["data_dir"] = {"path": settings.data_dir, "sha256": files}
    return data


def prepare_ruler(settings: RulerSettings, progress: bool = True) -> list[Path]:
    """--prepare-only: write every (task, length)'s instances in RULER's layout under --write-data; no weights."""
    from ..models import load_tokenizer, model_options, naming

    spec = settings.tokenizer or settings.model
    with naming("--tokenizer" if settings.tokenizer else "--model", spec):
        count = token_counter(load_tokenizer(spec, **model_options(spec, settings.model_args)))
    specs = {name: load_ruler_task(name, settings.include_path) for name in settings.task_names}
    return write_all(settings, specs, count, ruler_inputs(settings))


def write_all(settings: RulerSettings, specs: dict[str, dict], count, inputs: RulerInputs, check=None) -> list[Path]:
    """Generate every (task, length)'s instances (deterministic from the seed), `check(task, length, records)`
    them, and write them under --write-data: every set, whichever units a resumed run or a rank still has to do."""
    written = []
    for name, spec in specs.items():
        for length in settings.lengths:
            records = generate_instances(spec, count, length, settings.num_samples, settings.seed, inputs)
            if check is not None:
                check(name, length, records)
            written.append(write_instances(settings.write_data, length, name, records))
    return written


def run_ruler(settings: RulerSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Run RULER for every task and length; write and return the report (rank 0; None on the other ranks)."""
    specs = {name: load_ruler_task(name, settings.include_path) for name in settings.task_names}
    inputs = ruler_inputs(settings) if not settings.data_dir else RulerInputs()
    data = data_facts(settings, specs)

    def check(lm: StreamingLM) -> dict[str, Any]:
        return check_prompts(lm, settings.lengths, settings.bos, settings.chat)

    reads = [settings.essays, settings.qa_data, settings.english_words, settings.data_dir]
    with open_run("ruler", settings, reads=reads, fingerprint={"data": data}, check=check, progress=progress,
                  on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, specs, inputs, data)


def _evaluate(run: Run, settings: RulerSettings, specs: dict, inputs: RulerInputs, data: dict) -> dict | None:
    lm = run.lm
    template = run_template(lm, settings.chat)
    chosen = check_prompts(lm, settings.lengths, settings.bos, settings.chat)  # what `check` recorded
    bos = chosen["bos_effective"]
    encode = prompt_encoder(lm, bos, settings.chat, template)
    count = token_counter(lm.tokenizer)
    cache: dict[tuple[str, int], list[dict]] = {}
    meter = PeakMemory(lm.device)

    def fitted(task: str, length: int, i: int, record: dict) -> tuple:
        """The instance's prompt as the model reads it, refused where it and the generation budget exceed `length`
        (RULER's length counts the prompt without special tokens, and the tokens to generate)."""
        ids, text, at = encode(record["input"], record["answer_prefix"])
        budget = specs[task]["tokens_to_generate"]
        if len(ids) - bos + budget > length:
            raise fail(f"ruler {task} at length {length}, instance {i}: its prompt as the model reads it holds "
                       f"{len(ids) - bos:,} tokens{' after BOS' if bos else ''}, and with its {budget} tokens to "
                       f"generate that is {len(ids) - bos + budget:,}, past the length",
                       overflow_fix(settings))  # fmt: skip
        return ids, text, at

    def check_set(task: str, length: int, records: list[dict]) -> None:
        for i, record in enumerate(records):  # each prompt dropped once checked: one set holds 500 long prompts
            fitted(task, length, i, record)

    if settings.write_data and run.ctx.is_main:  # every set, before any unit: resumed units and other ranks' too
        write_all(settings, specs, count, inputs, check_set)

    def instances(task: str, length: int) -> list[dict]:
        if (task, length) not in cache:
            cache.clear()  # units go task by task, length by length: keep one set of instances alive
            if settings.data_dir or (settings.write_data and run.ctx.is_main):  # written above: read them back
                folder = settings.data_dir or settings.write_data
                cache[task, length] = read_instances(folder, length, task, settings.num_samples)
            else:
                records = generate_instances(specs[task], count, length, settings.num_samples, settings.seed, inputs)
                cache[task, length] = records
        return cache[task, length]

    def query(task: str, length: int, i: int, ids: Any, text: str) -> Query:
        """An instance as the model is asked it (a chat API gets RULER's input and answer prefix as one user turn, as
        RULER's own API client sends them)."""
        record = instances(task, length)[i]
        turns = chat_messages(settings.chat, record["input"] + record["answer_prefix"])
        return Query(ids, text, turns, f"ruler {task} at length {length}, instance {i}")

    def compute_batch(batch: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
        """Instances' records in order; those of one (task, length) are decoded together, `size` rows at a time."""
        records = []
        for task, length in dict.fromkeys((t, n) for t, n, _ in batch):
            spec, chosen = specs[task], [i for t, n, i in batch if (t, n) == (task, length)]
            prompts = [fitted(task, length, i, instances(task, length)[i]) for i in chosen]
            queries = [query(task, length, i, ids, text) for i, (ids, text, _) in zip(chosen, prompts, strict=True)]
            rule = Rule(spec["tokens_to_generate"])
            answers, measured = answer_measured(run, queries, rule, settings.share_prefixes, size, meter, tree=True)
            for i, (ids, text, _), answer in zip(chosen, prompts, answers, strict=True):
                record = instances(task, length)[i]
                records.append({
                    "task": task, "id": f"{length}/{i}", "length": length, "sample": i, "prompt_tokens": len(ids),
                    "outputs": record["outputs"], "prediction": answer.text,
                    "score": needle_score(spec["metric"], answer.text, record["outputs"]),
                    "stop_reason": answer.stop_reason, "token_position_answer": record.get("token_position_answer"),
                    **prompt_ends(text), **generation_facts(answer), **measured,
                })  # fmt: skip
        return records

    # one batch size for every length: the longest length's, so that a batch of the longest prompts fits
    size = run.answerer.rows(settings.batch_size, max(settings.lengths))
    units = [(t, n, i) for t in specs for n in settings.lengths for i in range(settings.num_samples)]
    announce_cost(run, specs, units, min(size, settings.num_samples))  # a batch decodes one task's instances
    records = run.map(units, key=list, compute=lambda u: compute_batch([u])[0], unit_name="tokens",
                      weight=lambda u: u[1], describe=lambda u: f"{u[0][:8]} {format_length(u[1])}", batch=size,
                      compute_batch=compute_batch)  # fmt: skip
    if records is None:
        return None
    results = ruler_results(records, {t: s["metric"] for t, s in specs.items()}, settings.threshold)
    fold_lengths(results["lengths"], records, meter.method)
    samples = [without_measurements(r) for r in records]
    effective = {**chosen, "chat_template_effective": template and template.facts(), "batch_size_effective": size}
    return run.finish({**asdict(settings), **effective}, data, results, samples=samples)


def overflow_fix(settings: RulerSettings) -> str:
    """What to do about a prompt longer than its length: drop what lengthened it, or prepare it for what it is."""
    if settings.chat.on or settings.system_instruction:
        return (
            "drop --system-instruction / --chat-template (RULER's base-mode instances leave no room for them), "
            "or prepare instances with room for them"
        )
    if settings.data_dir:
        return "prepare the instances for this model's tokenizer (megaeval ruler --prepare-only --tokenizer MODEL)"
    return "use a task file with fewer tokens_to_generate, or a longer --lengths"


def announce_cost(run: Run, specs: dict[str, dict], units: list[tuple[str, int, int]], rows: int) -> None:
    """The cost line (`runs.cost`): the instances and prompt tokens still to read and their answers' budget, at the
    rates the model reads and generates now (`rows` instances decoded together)."""
    lengths = sorted({n for _, n, _ in units})

    def left(journal: Any) -> tuple[int, int, list[int], int]:
        todo = [u for u in units if list(u) not in journal]
        new = sum(specs[t]["tokens_to_generate"] for t, _, _ in todo)
        return len(todo), len(units), [n for _, n, _ in todo], new

    cost_line(run, "instances", left, min(lengths[0], run.lm.max_context or lengths[0]), rows=rows)


def ruler_summary(report: dict[str, Any]) -> str:
    """RULER's table of a report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import ruler_tables

    return ruler_tables([report], [report_label(report, "ruler")])
