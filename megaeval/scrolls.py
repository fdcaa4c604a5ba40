"""`megaeval scrolls`: NarrativeQA, Qasper and QMSum the way MEGALODON's Table 2 reads them.

Each example's prompt is the task template (default "{CONTEXT} Q: {QUESTION} A:") with the whole
document. Few-shot exemplars come from the train split (seeded), are rendered as their full
prompt followed by " " and their first reference, and are joined with "\\n\\n". That prefix is
encoded once, with BOS, and its state is cloned for every example. The prefix and each example
are tokenized separately, so the prefix tokens are the same for every example. Unlimited-context
models read the whole document; fixed-context models lose document tokens (--truncation
middle|left|right) to fit max_context - max_new_tokens. Answers are greedy, and stop at EOS or at
a stop string.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .data import load_split, read_rows
from .errors import fail
from .files import check_outputs, check_writable, file_sha256, write_json_atomic, write_jsonl_atomic
from .generate import greedy_generate, prefill
from .loglik import read_prefix
from .metrics.scrolls import TASK_METRICS, example_scores, scrolls_scores
from .models import StreamingLM, load_model, model_options, parse_spec
from .progress import item_bar
from .progress_log import ProgressLog
from .report import build_report, environment, model_facts, numeric_settings
from .tasks import load_spec, parse_tasks

TRUNCATIONS = ("middle", "left", "right")
SHOT_JOINER = "\n\n"


@dataclass
class Example:
    """One SCROLLS example: rows that share an id, with all their references."""

    id: str
    question: str
    document: str
    references: list[str]


def split_input(text: str) -> tuple[str, str]:
    """SCROLLS puts the question first, then a blank line, then the document."""
    question, _, document = text.partition("\n\n")
    return question.strip(), document


def group_examples(rows: list[dict[str, Any]]) -> list[Example]:
    """Rows sharing an id become one example with several references, in first-seen order."""
    examples: dict[str, Example] = {}
    for row in rows:
        for key in ("id", "input", "output"):
            if key not in row:
                raise fail(
                    f"SCROLLS row without {key!r} (it has {', '.join(row)})",
                    "use the SCROLLS schema: id, pid, input, output",
                )
        if row["id"] in examples:
            examples[row["id"]].references.append(row["output"])
        else:
            question, document = split_input(row["input"])
            examples[row["id"]] = Example(row["id"], question, document, [row["output"]])
    return list(examples.values())


def render(template: str, example: Example, document: str | None = None) -> str:
    """The prompt of an example (plain replacement: documents contain braces)."""
    context = example.document if document is None else document
    return template.replace("{CONTEXT}", context).replace("{QUESTION}", example.question)


def fit_prompt(
    lm: StreamingLM, template: str, example: Example, budget: int | None, mode: str
) -> tuple[list[int], int]:
    """Prompt tokens within `budget`, dropping document tokens (never the question or the cue).

    middle keeps the document's start and end, left its end, right its start; the kept parts are
    decoded and the prompt re-encoded, shrinking until it fits. Returns (ids, tokens dropped).
    """
    ids = lm.tokenizer.encode(render(template, example))
    if budget is None or len(ids) <= budget:
        return ids, 0
    doc = lm.tokenizer.encode(example.document)
    keep = len(doc) - (len(ids) - budget)
    while True:
        if keep <= 0:
            raise fail(f"example {example.id}: the prompt without its document needs more than {budget} tokens",
                       "use a model with a longer context or fewer --max-new-tokens/--shots")  # fmt: skip
        if mode == "middle":
            head = keep // 2
            text = lm.tokenizer.decode(doc[:head]) + lm.tokenizer.decode(doc[len(doc) - (keep - head) :])
        elif mode == "left":
            text = lm.tokenizer.decode(doc[len(doc) - keep :])
        else:
            text = lm.tokenizer.decode(doc[:keep])
        fitted = lm.tokenizer.encode(render(template, example, text))
        if len(fitted) <= budget:
            return fitted, len(ids) - len(fitted)
        keep -= len(fitted) - budget


@dataclass
class ScrollsSettings:
    """Every flag of `megaeval scrolls`, defaults included (None: the task's own default)."""

    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
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
    bos: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    kernels: str | None = None
    predictions: str | None = None
    out: str = "reports/scrolls.json"
    samples: str | None = None
    resume: bool = False


def task_settings(settings: ScrollsSettings, task: str) -> dict[str, Any]:
    """The effective per-task choices: the task file's defaults unless a flag overrides them."""
    spec = load_spec("scrolls", task)
    chosen = {
        "hub": spec["hub"],
        "split": settings.split or spec["split"],
        "shot_split": spec["shot_split"],
        "shots": spec["shots"] if settings.shots is None else settings.shots,
        "template": settings.template or spec["template"],
        "max_new_tokens": spec["max_new_tokens"] if settings.max_new_tokens is None else settings.max_new_tokens,
        "stop": spec["stop"] if settings.stop is None else settings.stop,
        "metric": TASK_METRICS[task],
    }
    if "{CONTEXT}" not in chosen["template"] or "{QUESTION}" not in chosen["template"]:
        raise fail(f"--template {chosen['template']!r} must contain {{CONTEXT}} and {{QUESTION}}")
    if chosen["shots"] < 0 or chosen["max_new_tokens"] < 1:
        raise fail("--shots must be >= 0 and --max-new-tokens >= 1")
    return chosen


def pick_exemplars(pool: list[Example], shots: int, seed: int, task: str) -> list[Example]:
    """`shots` train examples, sampled with a seeded generator (the same for every run)."""
    if shots > len(pool):
        raise fail(f"{task}: {shots} shots asked but the train split has {len(pool)} examples")
    return random.Random(f"{seed}:{task}").sample(pool, shots)


def run_scrolls(
    settings: ScrollsSettings, progress: bool = True, on_example: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Evaluate (or, with `predictions`, only score) the SCROLLS tasks; write and return the report."""
    if settings.truncation not in TRUNCATIONS:
        raise fail(f"unknown --truncation {settings.truncation!r}", f"use {', '.join(TRUNCATIONS)}")
    if settings.limit is not None and settings.limit < 1:
        raise fail("--limit must be at least 1")
    tasks = parse_tasks(settings.tasks, "scrolls")
    per_task = {t: task_settings(settings, t) for t in tasks}
    data = {}
    examples = {}
    for task in tasks:
        rows, data[task] = load_split(task, per_task[task]["split"], settings.data_dir, per_task[task]["hub"])
        examples[task] = group_examples(rows)[: settings.limit]
    out = _check_outputs(settings, data)
    if settings.predictions is not None:
        return _score_predictions(settings, tasks, per_task, examples, data, out)
    exemplars = {}
    for task in tasks:  # before loading the model: bad data fails fast
        pool: list[Example] = []
        if per_task[task]["shots"]:
            choice = per_task[task]
            rows, data[f"{task}:shots"] = load_split(task, choice["shot_split"], settings.data_dir, choice["hub"])
            pool = group_examples(rows)
            _check_outputs(settings, data)
        exemplars[task] = pick_exemplars(pool, per_task[task]["shots"], settings.seed, task)

    options = model_options(settings.model, settings.model_args, kernels=settings.kernels)
    lm = load_model(settings.model, device=settings.device, dtype=settings.dtype, **options)
    facts = model_facts(lm, settings.model, options)
    fingerprint = {"settings": numeric_settings(settings), "weights_sha256": facts["weights_sha256"], "data": data}
    log = ProgressLog(out.with_name(out.name + ".partial.jsonl"), fingerprint, settings.resume)
    total = sum(len(v) for v in examples.values())
    bar, bar_task = item_bar("scrolls", "examples", total, len(log.done), progress)
    with bar:
        for task in tasks:
            choice = per_task[task]
            pending = [ex for ex in examples[task] if (task, ex.id) not in log.done]
            if not pending:
                continue
            bar.update(bar_task, description=task)
            prefix_ids, prefix_state = _prefix(lm, choice, exemplars[task], settings.bos)
            budget = None if lm.max_context is None else lm.max_context - choice["max_new_tokens"] - len(prefix_ids)
            if budget is not None and budget < 1:
                raise fail(
                    f"{task}: the {choice['shots']}-shot prefix ({len(prefix_ids)} tokens) leaves no room in "
                    f"max_context {lm.max_context}",
                    "use --shots 0 or a model with a longer context",
                )
            for ex in pending:
                ids, dropped = fit_prompt(lm, choice["template"], ex, budget, settings.truncation)
                logits, state = prefill(lm, ids, prefix_state.clone())
                gen = greedy_generate(lm, logits, state, choice["max_new_tokens"], choice["stop"])
                log.add({
                    "task": task, "id": ex.id, "prompt_tokens": len(prefix_ids) + len(ids), "truncated_tokens": dropped,
                    "prediction": gen.text.strip(), "references": ex.references, "stop_reason": gen.stop_reason,
                    "generated_tokens": len(gen.tokens), "exemplar_ids": [e.id for e in exemplars[task]],
                    "scores": example_scores(task, gen.text.strip(), ex.references),
                })  # fmt: skip
                bar.advance(bar_task, 1)
                if on_example is not None:
                    on_example(len(log.records))

    results = _results(tasks, per_task, log.records)
    report = build_report("scrolls", settings={**asdict(settings), "per_task": per_task}, model=facts,
                          data=data, results=results, env=environment(lm.device, lm.dtype))  # fmt: skip
    if settings.samples:
        write_jsonl_atomic(settings.samples, log.records)
    write_json_atomic(out, report)
    log.finish()
    return report


def _check_outputs(settings: ScrollsSettings, data: dict[str, Any]) -> Path:
    """No output may overwrite the data, the predictions, the model or another output."""
    out = Path(settings.out)
    reads = [d["path"] for d in data.values() if "path" in d] + [settings.predictions]
    if settings.predictions is None:
        reads.append(parse_spec(settings.model)[1])
    resume_file = out.with_name(out.name + ".partial.jsonl")
    outputs = {"--out": out, "--samples": settings.samples, "the resume file": resume_file}
    check_outputs(outputs, reads)
    check_writable(out)
    if settings.samples:
        check_writable(settings.samples, "--samples")
    return out


def _prefix(lm: StreamingLM, choice: dict, exemplars: list[Example], bos: bool) -> tuple[list[int], Any]:
    """Tokens and state of BOS + the few-shot exemplars (each example then starts from a clone)."""
    text = "".join(render(choice["template"], ex) + " " + ex.references[0] + SHOT_JOINER for ex in exemplars)
    prefix = read_prefix(lm, ([lm.tokenizer.bos_id] if bos else []) + (lm.tokenizer.encode(text) if text else []))
    return prefix.ids, prefix.state


def _results(tasks: list[str], per_task: dict, records: list[dict]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for task in tasks:
        mine = [r for r in records if r["task"] == task]
        if not mine:
            continue
        scores = scrolls_scores(task, [r["prediction"] for r in mine], [r["references"] for r in mine])
        scores.update({
            "metric": per_task[task]["metric"],
            "truncated_tokens": sum(r.get("truncated_tokens", 0) for r in mine),
            "examples_truncated": sum(1 for r in mine if r.get("truncated_tokens", 0)),
            "exemplar_ids": mine[0].get("exemplar_ids", []),
            "mean_prompt_tokens": sum(r.get("prompt_tokens", 0) for r in mine) / len(mine),
            "stop_reasons": dict(Counter(r.get("stop_reason", "given") for r in mine)),
        })  # fmt: skip
        results[task] = scores
    return results


def _score_predictions(settings, tasks, per_task, examples, data, out) -> dict[str, Any]:
    """Scoring-only mode: predictions from any system, references from the data."""
    path = Path(settings.predictions)
    if not path.is_file():
        raise fail(f"predictions file not found: {path}")
    by_task = {t: {ex.id: ex for ex in examples[t]} for t in tasks}
    records = []
    for number, row in enumerate(read_rows(path), 1):
        task = row.get("task") or (tasks[0] if len(tasks) == 1 else None)
        if task is None:
            raise fail(f"{path} line {number} names no task", 'add "task" to each line, or pass a single --tasks')
        if task not in by_task:
            raise fail(f"{path} line {number}: task {task!r} is not among --tasks {','.join(tasks)}")
        if "id" not in row or "prediction" not in row:
            raise fail(f'{path} line {number} needs "id" and "prediction"')
        ex = by_task[task].get(row["id"])
        if ex is None:
            raise fail(f"{path} line {number}: id {row['id']!r} is not in the {task} data")
        records.append({"task": task, "id": ex.id, "prediction": str(row["prediction"]), "references": ex.references,
                        "scores": example_scores(task, str(row["prediction"]), ex.references)})  # fmt: skip
    seen = Counter((r["task"], r["id"]) for r in records)
    duplicated = [k for k, n in seen.items() if n > 1]
    if duplicated:
        raise fail(f"{path} predicts {duplicated[0][0]} id {duplicated[0][1]!r} more than once")
    results = _results(tasks, per_task, records)
    for task in results:
        results[task]["coverage"] = f"{results[task]['n']}/{len(by_task[task])}"
    report = build_report("scrolls", settings={**asdict(settings), "per_task": per_task},
                          model={"spec": None, "predictions": str(path), "predictions_sha256": file_sha256(path)},
                          data=data, results=results, env=environment("cpu", "none"))  # fmt: skip
    if settings.samples:
        write_jsonl_atomic(settings.samples, records)
    write_json_atomic(out, report)
    return report
