"""`megaeval babilong`: BABILong (Kuratov et al., 2024) as booydar/babilong runs it, on the published sets from 0k to
10M tokens: the 20 bAbI tasks' facts hidden in book text, each instance answered greedily and scored by the
official rule.

Every (task, length, instance) is one unit of the run skeleton: its prompt (the task's instruction, examples and
post-prompt, then the instance's context and question: `tasks.babilong.prompts`; one user turn of the model's chat
template with --chat-template, as the official Hugging Face path renders it) read and answered with 20 greedy
tokens, the answer stripped and scored (`metrics.babilong`). Instances of one (task, length) are decoded together;
with the shared schedule (state-carrying models) the prompt text they all start with is read once. A fixed-context
model whose context is shorter than an instance is refused: BABILong never truncates. `--predictions` scores the
official prediction files without a model, `--prepare-only` writes instances made by BABILong's generator (both in
`commands.babilong_files`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import fail
from ..files import check_writable
from ..metrics.babilong import compare_answers
from ..models.base import StreamingLM
from ..runs import Run, RunSettings, open_run
from ..runs.answers import answer_measured, fold_lengths, without_measurements
from ..runs.cost import announce_cost as cost_line
from ..runs.memory import PeakMemory
from ..runs.samples import prompt_ends
from ..runs.settings import ignored_flag, shared_modes
from ..scoring.answering import Query, Rule, chat_messages, generation_facts
from ..scoring.bos import resolve_bos
from ..scoring.chat import ChatFlags, run_template
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy, prompt_encoder
from ..tasks.babilong.data import HUB, read_instances
from ..tasks.babilong.predictions import held_lengths
from ..tasks.babilong.prompts import PromptParts, format_prompt
from ..tasks.babilong.results import babilong_results
from ..tasks.babilong.spec import length_tokens, load_babilong_task, parse_lengths
from ..tasks.specs import parse_tasks, spec_sha256
from .babilong_files import read_manifest

DEFAULT_TASKS = "qa1,qa2,qa3,qa4,qa5"
DEFAULT_LENGTHS = "0k,1k,2k,4k,8k,16k,32k,64k,128k"
SCHEDULES = ("auto", "shared", "naive")


@dataclass(kw_only=True)
class BabilongSettings(ChatFlags, RunSettings):
    """Every flag of `megaeval babilong`, defaults included (the published setting: qa1-qa5, every prompt part)."""

    data: str | None = None  # the sets: a folder in one of their layouts, or hub:NAME
    tasks: str = DEFAULT_TASKS
    # None: DEFAULT_LENGTHS, or with --predictions every length the folder holds for the tasks and prompt
    lengths: str | list[str] | None = None
    num_samples: int | None = None  # the first N instances of each task and length (None: all)
    instruction: bool = True
    examples: bool = True
    post_prompt: bool = True
    predictions: str | None = None  # score these official prediction files, no model
    write_predictions: str | None = None  # write the answers as the official prediction files
    prepare_only: bool = False  # write generated instances (--write-data), no model
    write_data: str | None = None
    babi: str | None = None  # the bAbI tasks (tasks_1-20_v1-2 layout)
    babi_split: str = "test"
    background: list[str] = field(default_factory=list)  # background books; none: the shipped public-domain ones
    text_field: str = "text"
    length_tokenizer: str = "gpt2"
    clean_up_spaces: bool = True
    seed: int = 42
    bos: str = "auto"
    schedule: str = "auto"
    batch_size: str | int = "auto"
    include_path: list[str] = field(default_factory=list)
    out: str = "reports/babilong.json"
    samples: str | None = None
    task_names: list[str] = field(default_factory=list)

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "write_data", "write_predictions",
                                               "batch_size")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        self.bos = bos_policy(self.bos)
        self.check_chat()
        self.batch_size = parse_batch_size(self.batch_size)
        self.task_names = parse_tasks(self.tasks, "babilong", self.include_path)
        self.lengths = parse_lengths(self.lengths if self.lengths is not None else self.held_lengths())
        if self.system_instruction:
            raise fail("--system-instruction: BABILong's official Hugging Face path renders the prompt as the only "
                       "turn and drops any system prompt", "drop --system-instruction")  # fmt: skip
        if self.num_samples is not None and self.num_samples < 1:
            raise fail(f"--num-samples must be at least 1, got {self.num_samples}")
        if self.seed < 1:
            raise fail(f"--seed must be at least 1, got {self.seed} (BABILong's noise injector ignores a seed of 0)")
        if self.schedule not in SCHEDULES:
            raise fail(f"unknown --schedule {self.schedule!r}", f"use {', '.join(SCHEDULES)}")
        if self.babi_split not in ("test", "train"):
            raise fail(f"--babi-split {self.babi_split!r}: bAbI's splits are test and train", "pass test or train")
        modes = [flag for flag, on in (("--data", self.data), ("--predictions", self.predictions),
                                       ("--prepare-only", self.prepare_only)) if on]  # fmt: skip
        if len(modes) != 1:
            given = ", ".join(modes) or "none"
            raise fail(f"pass exactly one of --data, --predictions and --prepare-only (given: {given})",
                       "--data DIR runs a model on the sets, --predictions DIR scores prediction files, "
                       "--prepare-only --write-data DIR --babi DIR writes instances")  # fmt: skip
        if self.prepare_only and not (self.write_data and self.babi):
            raise fail("--prepare-only writes generated instances", "pass --write-data DIR and --babi DIR")
        self.check_modes()
        if self.data and not self.data.startswith(HUB) and not Path(self.data).is_dir():
            raise fail(f"--data {self.data}: no such folder", "pass a folder of BABILong's sets, or hub:NAME")

    def held_lengths(self) -> str | list[str]:
        """The lengths when none are given: with --predictions, those the folder holds for the tasks and prompt (all
        of them scored, none left out), else DEFAULT_LENGTHS."""
        if not self.predictions or not Path(self.predictions).is_dir():
            return DEFAULT_LENGTHS
        held = held_lengths(self.predictions, self.task_names, self.parts)
        if not held:
            raise fail(f"--predictions {self.predictions} holds no prediction file of {', '.join(self.task_names)} "
                       f"made with the prompt {self.parts.name}", "pass the folder of one model's prediction files, "
                       "with the --tasks and prompt flags they were made with")  # fmt: skip
        return held

    # flag -> (its default, the modes it applies to): one table, checked once
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        **dict.fromkeys(("write_data", "babi", "background", "babi_split", "text_field", "length_tokenizer",
                         "clean_up_spaces", "seed"), ("--prepare-only",)),
        **dict.fromkeys(("write_predictions", "schedule", "batch_size"), ("--data",)),
        **shared_modes(run=("--data",), report=("--data", "--predictions")),
        "chat_template": ("--data", "--predictions"),
    }  # fmt: skip

    def check_modes(self) -> None:
        """Refuse a flag given for a mode it does not apply to (it would be ignored)."""
        mode = "--data" if self.data else "--predictions" if self.predictions else "--prepare-only"
        ignored = ignored_flag(self, self.MODES, mode)
        if ignored is not None:
            name, modes = ignored
            flag = f"--{name.replace('_', '-')}" if name != "clean_up_spaces" else "--no-clean-up-spaces"
            raise fail(f"{flag} does not apply with {mode} (it would be ignored)",
                       f"use {flag} with {' or '.join(modes)}, or leave it out")  # fmt: skip

    @property
    def parts(self) -> PromptParts:
        """The prompt parts in use, and whether a chat template renders the prompt."""
        return PromptParts(self.instruction, self.examples, self.post_prompt, self.chat.on)


def run_babilong(settings: BabilongSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Run the model on every task and length (or, with --predictions, score prediction files); write and return
    the report (rank 0; None on the other ranks)."""
    specs = {name: load_babilong_task(name, settings.include_path) for name in settings.task_names}
    if settings.predictions is not None:
        from .babilong_files import score_predictions

        return score_predictions(settings, specs)
    sets = {(t, n): read_instances(settings.data, t, n, specs[t]) for t in specs for n in settings.lengths}
    counts = instance_counts(sets, settings.num_samples)
    data = data_facts(settings, specs, sets)

    def check(lm: StreamingLM) -> dict[str, Any]:
        return check_model(lm, settings)

    if settings.write_predictions:
        if (
            not settings.data.startswith(HUB)
            and Path(settings.write_predictions).resolve() == Path(settings.data).resolve()
        ):
            raise fail("--write-predictions is the --data folder", "write the predictions to a folder of their own")
        first = Path(settings.write_predictions) / f"{settings.task_names[0]}_{settings.lengths[0]}.csv"
        check_writable(first, "--write-predictions")  # before any work, not after it
    reads = [settings.data if not settings.data.startswith(HUB) else None]
    with open_run("babilong", settings, reads=reads, fingerprint={"data": data}, check=check, progress=progress,
                  on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, specs, sets, counts, data)


def data_facts(settings: BabilongSettings, specs: dict[str, dict], sets: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """Where each (task, length)'s instances come from (checksums, or the hub's fingerprint): in the report, and
    what a resumed run must find again."""
    sources = {f"{t}/{n}": instances.source for (t, n), instances in sets.items()}
    tasks = {name: {"sha256": spec_sha256("babilong", name, settings.include_path)} for name in specs}
    generated = None if settings.data.startswith(HUB) else read_manifest(settings.data)
    return {"data": settings.data, "sets": sources, "tasks": tasks, "prompt_name": settings.parts.name,
            "generated": generated}  # fmt: skip


def instance_counts(sets: dict[tuple[str, str], Any], num_samples: int | None) -> dict[tuple[str, str], int]:
    """How many instances of each (task, length) run, before any model loads; an empty set, and one with an
    instance that cannot be right, are refused. Each set is read to check it and dropped again, so that at most one
    is held."""
    counts = {}
    for key, instances in sets.items():
        if not len(instances):
            raise fail(f"{instances.where} holds no instances", "pass BABILong's sets as written, or drop that length")
        instances.check_all()
        counts[key] = len(instances) if num_samples is None else min(num_samples, len(instances))
        instances.release()
    return counts


def check_model(lm: StreamingLM, settings: BabilongSettings) -> dict[str, Any]:
    """Refuse lengths a fixed-context model cannot read (before any work) and a chat template the tokenizer lacks;
    what the run records: BOS and template."""
    if lm.max_context is not None:
        longest = max(settings.lengths, key=length_tokens)
        if length_tokens(longest) > lm.max_context:
            raise fail(f"{lm.spec} reads at most max_context {lm.max_context:,} tokens, but --lengths asks for "
                       f"{longest} ({length_tokens(longest):,} tokens); BABILong never truncates",
                       "use shorter --lengths, or a state-carrying model")  # fmt: skip
    template = run_template(lm, settings.chat)
    # the official path: the tokenizer's special tokens around a plain prompt; only the template's text around a
    # rendered one (apply_chat_template tokenizes without special tokens)
    bos = resolve_bos(lm, settings.bos) if template is None else settings.bos == "always"
    return {"bos_effective": bos, "chat_template_effective": template and template.facts()}


def past_context(lm: StreamingLM, spec: dict, task: str, length: str, index: int, tokens: int) -> Exception:
    """The refusal of a prompt a fixed-context model cannot read (BABILong never truncates): shorter --lengths
    where there are shorter ones, else a model with a longer context."""
    shortest = length_tokens(length) == 0
    fix = "use a model with a longer context (0k is BABILong's shortest set)" if shortest else "use shorter --lengths"
    return fail(f"{task} at {length}, instance {index}: its prompt is {tokens:,} tokens, and with "
                f"{spec['max_new_tokens']} new ones it passes {lm.spec}'s max_context {lm.max_context:,}; BABILong "
                "never truncates", fix)  # fmt: skip


def _evaluate(
    run: Run, settings: BabilongSettings, specs: dict[str, dict], sets: dict[tuple[str, str], Any],
    counts: dict[tuple[str, str], int], data: dict,
) -> dict[str, Any] | None:  # fmt: skip
    lm = run.lm
    chosen = check_model(lm, settings)
    template = run_template(lm, settings.chat)
    encode = prompt_encoder(lm, chosen["bos_effective"], settings.chat, template)
    shared = settings.schedule == "shared" or (settings.schedule == "auto" and lm.max_context is None)
    meter = PeakMemory(lm.device)

    def held(task: str, length: str) -> Any:
        for key, instances in sets.items():
            if key != (task, length):
                instances.release()
        return sets[task, length]

    def compute_batch(batch: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
        records = []
        for task, length in dict.fromkeys((t, n) for t, n, _ in batch):
            spec, indices = specs[task], [i for t, n, i in batch if (t, n) == (task, length)]
            instances = [held(task, length)[i] for i in indices]
            texts = [format_prompt(spec, x["input"], x["question"], settings.parts) for x in instances]
            prompts = [encode(text, "") for text in texts]
            for (ids, _, _), i in zip(prompts, indices, strict=True):
                if lm.max_context is not None and len(ids) + spec["max_new_tokens"] > lm.max_context:
                    raise past_context(lm, spec, task, length, i, len(ids))
            names = [f"babilong {task} at {length}, instance {i}" for i in indices]
            queries = [Query(ids, whole, chat_messages(settings.chat, text), name)
                       for (ids, whole, _), text, name in zip(prompts, texts, names, strict=True)]  # fmt: skip
            answers, measured = answer_measured(run, queries, Rule(spec["max_new_tokens"]), shared, size, meter)
            for i, x, (ids, text, _), answer in zip(indices, instances, prompts, answers, strict=True):
                output = answer.text.strip()
                records.append({
                    "task": task, "length": length, "id": f"{length}/{i}", "sample": i, "target": x["target"],
                    "question": x["question"], "prediction": output,
                    "correct": compare_answers(x["target"], output, x["question"], spec["labels"]),
                    "prompt_tokens": len(ids), "stop_reason": answer.stop_reason, **prompt_ends(text),
                    **generation_facts(answer), **measured,
                })  # fmt: skip
        return records

    size = run.answerer.rows(settings.batch_size, max(length_tokens(n) for n in settings.lengths) or 1)
    units = [(t, n, i) for t in specs for n in settings.lengths for i in range(counts[t, n])]
    announce_cost(run, units)
    records = run.map(units, key=list, compute=lambda u: compute_batch([u])[0], unit_name="tokens",
                      weight=lambda u: length_tokens(u[1]) + 300, describe=lambda u: f"{u[0]} {u[1]}", batch=size,
                      compute_batch=compute_batch)  # fmt: skip
    if records is None:
        return None
    results = babilong_results(records, list(specs), settings.lengths)
    fold_lengths(results["lengths"], records, meter.method)
    if settings.write_predictions:
        from .babilong_files import write_all

        write_all(settings, specs, records, lm)
    samples = [{**without_measurements(r), "score": float(r["correct"])} for r in records]
    effective = {**chosen, "schedule_effective": "shared" if shared else "naive", "batch_size_effective": size,
                 "prompt_name": settings.parts.name}  # fmt: skip
    return run.finish({**asdict(settings), **effective}, data, results, samples=samples)


def announce_cost(run: Run, units: list[tuple[str, str, int]]) -> None:
    """The cost line (`runs.cost`): the instances still to run, about how many prompt tokens they hold (their
    lengths' tokens and the prompt), at the model's read rate now."""

    def left(journal: Any) -> tuple[int, int, list[int], None]:
        todo = [u for u in units if list(u) not in journal]
        return len(todo), len(units), [length_tokens(n) + 300 for _, n, _ in todo], None

    cost_line(run, "instances", left, min(4096, run.lm.max_context or 4096), about=True)


def babilong_summary(report: dict[str, Any]) -> str:
    """BABILong's task x length table of a report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import babilong_tables

    return babilong_tables([report], [report_label(report, "babilong")])
