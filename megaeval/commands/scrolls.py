"""`megaeval scrolls`: NarrativeQA, Qasper and QMSum the way MEGALODON's Table 2 reads them.

Each example's prompt is the task template (default "{CONTEXT} Q: {QUESTION} A:") with the whole
document. Few-shot exemplars come from the train split (seeded), are rendered as their full
prompt followed by " " and their first reference, and are joined with "\\n\\n". That prefix is
encoded once, after BOS under the `bos` policy (auto: the model's convention, `scoring.requests.resolve_bos`),
and its state is cloned for every example. The prefix and each example are tokenized separately, so the
prefix tokens are the same for every example. Unlimited-context models read every document whole.
Fixed-context models fit the whole prompt (BOS + exemplars + example) in max_context - max_new_tokens:
documents lose tokens (--truncation middle|left|right), never a question, an answer, a joiner or the
cue. The exemplars' documents are cut once per task to an equal share of what the non-document parts
leave, so the prefix stays the same for every example and is still read once; the example gets the
rest (the rule: `megaeval.tasks.scrolls.docs`). Answers are greedy, and stop at EOS or at a stop string.
Questions on one document share its reading (`--share-documents`, the default): the examples are grouped by
document, a group is one unit of work (one resume line, never split across ranks), and the start its fitted prompts
share (a state-carrying model: the whole document; a fixed-context model: as far as the cuts agree) is read once,
each question branching from a copy of that state. Each task's report says how many prompt tokens were read
(`prompt_tokens_read`) and how many reading each prompt whole would read (`prompt_tokens_naive`), the prefix
counted once in both; `--no-share-documents` reads each prompt whole, with the same predictions.
Examples and prompts: `tasks.scrolls.docs`; choices, examples and exemplars, read before the model loads:
`tasks.scrolls.prepare`; the prefix and the answers: `tasks.scrolls.evaluate`; scores, and given predictions
(`--predictions`, no model): `tasks.scrolls.results`. This module wires them to the run skeleton.

Chat models (`scoring.chat`, as lm-evaluation-harness's --apply_chat_template): with `chat_template` each
example's SCROLLS prompt (its document inside) is the last user turn, after a `system_instruction` turn and, with
`fewshot_as_multiturn` (on by default with a template), each exemplar as a user turn (its prompt) and an assistant
turn (its first reference); without it the exemplars are folded into the user turn as plain text. The generation
prompt follows. Fitting a fixed context counts the template's tokens and the system turn as fixed parts: only
documents are cut (`tasks.scrolls.docs.PromptForm`). The rendering before the example's prompt is the prefix read
once. `bos` auto: the tokenizer's default unless the rendered text starts with the BOS text (`bos_effective`).
The report records the flags, the template's name and sha256 (`chat_template_effective`) and each task's
`first_prompt`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..distributed import group_max
from ..errors import fail
from ..files import file_sha256, write_json_atomic, write_jsonl_atomic
from ..models.base import State, StreamingLM
from ..runs import Run, RunSettings, open_run
from ..runs.answers import most
from ..runs.memory import PeakMemory
from ..runs.report import build_report, environment
from ..runs.run import check_run_outputs
from ..runs.settings import ignored_flag, shared_modes
from ..scoring.chat import ChatFlags, chat_bos, run_template
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy, resolve_bos
from ..tasks.data import data_folders
from ..tasks.scrolls.docs import TRUNCATIONS, Example, PromptForm, document_groups
from ..tasks.scrolls.evaluate import READ, evaluate_examples, first_prompt, fit_prefix, opening, prompt_form
from ..tasks.scrolls.prepare import ScrollsTask, prepare_scrolls_task
from ..tasks.scrolls.results import prediction_results, scrolls_results
from ..tasks.specs import parse_tasks

MEMORY = "peak_memory_bytes"  # per example: the process's peak while reading and answering it
STATE = "state_bytes"  # per example: the model state after the prompt (a Transformer's KV cache; its shard)
MEASURED = (MEMORY, STATE)  # in the report (largest over examples and over a group's ranks), not in samples


@dataclass(kw_only=True)
class ScrollsSettings(ChatFlags, RunSettings):
    """Every flag of `megaeval scrolls`, defaults included (None: the task's own default)."""

    tasks: str = "narrative_qa,qasper,qmsum"
    data_dir: str | None = None
    split: str | None = None
    limit: int | None = None
    shots: int | None = None
    seed: int = 0
    template: str | None = None
    max_new_tokens: int | None = None
    stop: list[str] | None = None
    truncation: str = "middle"
    bos: str = "auto"  # auto, always or never (True / False are taken as always / never)
    predictions: str | None = None
    allow_partial: bool = False
    batch_size: str | int = "auto"  # examples answered together; results do not depend on it
    share_documents: bool = True  # questions on one document read it once (False: each prompt whole, the reference)
    out: str = "reports/scrolls.json"
    samples: str | None = None

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size")  # never changes a number
    # flag -> the modes it applies to: a model's run, or --predictions (scoring a file); `run_scrolls` refuses
    # --model, --chat-template and --no-share-documents with --predictions in words of their own first
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        **shared_modes(run=("a model's run",), report=("a model's run", "--predictions")),
        **dict.fromkeys(("shots", "seed", "template", "max_new_tokens", "stop", "truncation", "batch_size"),
                        ("a model's run",)),
    }  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        self.bos = bos_policy(self.bos)
        self.batch_size = parse_batch_size(self.batch_size)
        self.check_chat()


def run_scrolls(settings: ScrollsSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Evaluate (or, with `predictions`, only score) the SCROLLS tasks; write and return the report."""
    if settings.predictions is not None and (settings.model is not None or settings.model_args):
        given = f"--model {settings.model}" if settings.model is not None else "--model-args"
        raise fail(f"--predictions scores the predictions in {settings.predictions} without a model, so {given} "
                   "would be ignored", "drop --model and --model-args to score the predictions, or drop "
                   "--predictions to evaluate the model")  # fmt: skip
    if settings.predictions is not None and (settings.chat_template is not None or settings.system_instruction):
        given = "--chat-template" if settings.chat_template is not None else "--system-instruction"
        raise fail(f"--predictions scores the predictions in {settings.predictions} without prompting a model, so "
                   f"{given} would be ignored", f"drop {given}, or drop --predictions")  # fmt: skip
    if settings.predictions is not None and not settings.share_documents:
        raise fail(f"--predictions scores the predictions in {settings.predictions} without reading documents, so "
                   "--no-share-documents would be ignored",
                   "drop --no-share-documents, or drop --predictions")  # fmt: skip
    ignored = ignored_flag(settings, settings.MODES, "--predictions") if settings.predictions is not None else None
    if ignored is not None:
        flag = "--" + ignored[0].replace("_", "-")
        raise fail(f"--predictions scores the predictions in {settings.predictions} without a model, so {flag} would "
                   "be ignored", f"drop {flag}, or drop --predictions")  # fmt: skip
    if settings.truncation not in TRUNCATIONS:
        raise fail(f"unknown --truncation {settings.truncation!r}", f"use {', '.join(TRUNCATIONS)}")
    if settings.limit is not None and settings.limit < 1:
        raise fail("--limit must be at least 1")
    scoring_only = settings.predictions is not None
    data: dict[str, Any] = {}
    tasks = {
        name: prepare_scrolls_task(settings, name, data, exemplars=not scoring_only)
        for name in parse_tasks(settings.tasks, "scrolls")
    }  # before loading the model: bad data fails fast
    if scoring_only:
        check_run_outputs(settings, [*data_folders(settings.data_dir), settings.predictions])
        return _score_predictions(settings, tasks, data)

    forms: dict[str, PromptForm] = {}
    effective: dict[str, Any] = {}

    def check(lm: StreamingLM) -> dict[str, Any]:  # a tokenizer without BOS (or a template) fails now
        if not settings.chat.on and not settings.system_instruction:
            effective["bos_effective"] = resolve_bos(lm, settings.bos)
            return effective  # a resume must read the same tokens
        template = run_template(lm, settings.chat)
        forms.update({name: prompt_form(task, template, settings.chat) for name, task in tasks.items()})
        name = next(iter(tasks))
        effective.update(bos_effective=chat_bos(lm, settings.bos, opening(forms[name], tasks[name])),
                         chat_template_effective=template and template.facts())  # fmt: skip
        return effective  # the template's checksum identifies a resumed run too

    with open_run("scrolls", settings, reads=data_folders(settings.data_dir), fingerprint={"data": data},
                  check=check, progress=progress, on_unit=on_unit) as run:  # fmt: skip
        return _generate(run, settings, tasks, data, forms, effective)


def _generate(
    run: Run, settings: ScrollsSettings, tasks: dict[str, ScrollsTask], data: dict, forms: dict[str, PromptForm],
    effective: dict[str, Any],
) -> dict[str, Any] | None:  # fmt: skip
    lm = run.lm
    bos = effective["bos_effective"]
    # tokenizer work only: a prompt that cannot fit fails here, before any example is read
    fits = {name: fit_prefix(lm, task, bos, settings.truncation, forms.get(name)) for name, task in tasks.items()}
    meter = PeakMemory(lm.device)

    def measure(state: State) -> dict[str, int]:  # each prompt's state size (a group: its largest)
        return {STATE: group_max(run.ctx.chunk, state.nbytes())}

    def compute_batch(batch: list[tuple[str, list[Example]]]) -> list[dict[str, Any]]:
        """Document groups' records (one {"examples": [...]} each) in order; the examples of one task answered
        together (`size` rows at a time), each getting the peak memory of its task's part of the batch."""
        answered: dict[tuple[str, str], dict[str, Any]] = {}
        for name in dict.fromkeys(n for n, _ in batch):
            examples = [example for n, group in batch if n == name for example in group]
            meter.reset()
            records = evaluate_examples(run.answerer, tasks[name], fits[name], examples, settings.truncation,
                                        measure, size, settings.share_documents)  # fmt: skip
            # the memory of a model read here (none for a served model, whose memory is the server's)
            peak = group_max(run.ctx.chunk, meter.peak()) if any(STATE in r for r in records) else None
            answered.update({(name, r["id"]): {**r, MEMORY: peak} for r in records})
        return [{"examples": [answered[name, ex.id] for ex in group]} for name, group in batch]

    size = run.answerer.rows(settings.batch_size, lm.max_context or 4096)
    units = [(name, group) for name, task in tasks.items() for group in document_groups(task.examples)]
    examples = sum(len(group) for _, group in units)
    per_batch = max(1, size * len(units) // max(examples, 1))  # groups per batch: about `size` examples
    done = run.map(units, key=lambda u: [u[0], *(ex.id for ex in u[1])], compute=lambda u: compute_batch([u])[0],
                   unit_name="examples", weight=lambda u: len(u[1]), describe=lambda u: u[0], batch=per_batch,
                   compute_batch=compute_batch)  # fmt: skip
    if done is None:
        return None  # not rank 0
    by_id = {(r["task"], r["id"]): r for unit in done for r in unit["examples"]}
    records = [by_id[name, ex.id] for name, task in tasks.items() for ex in task.examples]  # the examples' order
    results = scrolls_results(tasks, records)
    for name in results:
        mine = [r for r in records if r["task"] == name]
        results[name].update({key: most(r.get(key) for r in mine) for key in MEASURED})
        results[name]["peak_memory_method"] = meter.method
        prefix = len(fits[name].ids)  # read once for the task either way
        results[name]["prompt_tokens_read"] = prefix + sum(r[READ] for r in mine)
        results[name]["prompt_tokens_naive"] = prefix + sum(r["prompt_tokens"] - prefix for r in mine)
    samples = [{k: v for k, v in r.items() if k not in (*MEASURED, READ)} for r in records]  # no measurements
    per_task = {name: {**task.chosen, "context_fit": fits[name].facts} for name, task in tasks.items()}
    if forms:  # with a chat template or a system instruction: the first example's prompt as read
        for name, task in tasks.items():
            per_task[name]["first_prompt"] = first_prompt(lm, task, fits[name], settings.truncation)
    recorded = {**asdict(settings), **effective, "batch_size_effective": size, "per_task": per_task}
    return run.finish(recorded, data, results, samples=samples)


def _score_predictions(settings: ScrollsSettings, tasks: dict[str, ScrollsTask], data: dict) -> dict[str, Any]:
    """Scoring-only mode (`--predictions FILE`): any system's predictions against the references; writes the
    report (and the samples file when asked)."""
    path = Path(settings.predictions)
    records, results = prediction_results(path, tasks, settings.allow_partial)
    model = {"spec": None, "predictions": str(path), "predictions_sha256": file_sha256(path)}
    per_task = {name: task.chosen for name, task in tasks.items()}
    if settings.samples:
        data = {**data, "samples_sha256": write_jsonl_atomic(settings.samples, records)}
    report = build_report("scrolls", {**asdict(settings), "per_task": per_task}, model, data, results,
                          environment("cpu", "none"))  # fmt: skip
    write_json_atomic(settings.out, report)
    return report
