"""SCROLLS results: per-task corpus scores from the examples' records, a model's or any system's given predictions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from ...errors import fail
from ...metrics.scrolls import example_scores, scrolls_scores
from ..data import read_rows
from .prepare import ScrollsTask

LINE_FIX = 'write one JSON object per line: {"task": ..., "id": ..., "prediction": "..."}'


def scrolls_results(tasks: dict[str, ScrollsTask], records: list[dict]) -> dict[str, Any]:
    """Per-task corpus scores (and facts about prompts and stops) from the examples' records."""
    results: dict[str, Any] = {}
    for name, task in tasks.items():
        mine = [r for r in records if r["task"] == name]
        if not mine:
            continue
        metric = task.chosen["metric"]
        scores = scrolls_scores(metric, [r["prediction"] for r in mine], [r["references"] for r in mine])
        scores.update({
            "metric": metric,
            "truncated_tokens": sum(r.get("truncated_tokens", 0) for r in mine),
            "examples_truncated": sum(1 for r in mine if r.get("truncated_tokens", 0)),
            "exemplar_ids": mine[0].get("exemplar_ids", []),
            "exemplar_truncated_tokens": mine[0].get("exemplar_truncated_tokens", []),
            "mean_prompt_tokens": sum(r.get("prompt_tokens", 0) for r in mine) / len(mine),
            "stop_reasons": dict(Counter(r.get("stop_reason", "given") for r in mine)),
        })  # fmt: skip
        results[name] = scores
    return results


def read_predictions(path: Path, by_task: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The predictions file's rows, checked: an object per line, a known task and id, a string prediction."""
    if not path.is_file():
        raise fail(f"predictions file not found: {path}", "pass the JSONL file your system wrote")
    tasks = list(by_task)
    records = []
    for number, row in enumerate(read_rows(path), 1):
        where = f"{path} line {number}"
        if not isinstance(row, dict):
            raise fail(f"{where} is a {type(row).__name__}, not an object", LINE_FIX)
        task = row.get("task") or (tasks[0] if len(tasks) == 1 else None)
        if task is None:
            raise fail(f"{where} names no task", 'add "task" to each line, or pass a single --tasks')
        if task not in by_task:
            raise fail(f"{where}: task {task!r} is not among --tasks {','.join(tasks)}")
        if "id" not in row or "prediction" not in row:
            raise fail(f'{where} needs "id" and "prediction"', LINE_FIX)
        if not isinstance(row["prediction"], str):
            raise fail(f"{where}: the prediction is {type(row['prediction']).__name__}, not a string",
                       'write "" for an empty answer')  # fmt: skip
        if not isinstance(row["id"], str) or row["id"] not in by_task[task]:
            raise fail(f"{where}: id {row['id']!r} is not in the {task} data", "check --tasks, --split and --limit")
        records.append({"task": task, "id": row["id"], "prediction": row["prediction"]})
    if not records:
        raise fail(f"{path} holds no predictions", LINE_FIX)
    seen = Counter((r["task"], r["id"]) for r in records)
    duplicated = [k for k, n in seen.items() if n > 1]
    if duplicated:
        raise fail(f"{path} predicts {duplicated[0][0]} id {duplicated[0][1]!r} more than once", "keep one line per id")
    return records


def prediction_results(
    path: Path, tasks: dict[str, ScrollsTask], allow_partial: bool = False
) -> tuple[list[dict], dict[str, Any]]:
    """Scoring-only mode: the records (prediction, references, scores) and results of any system's predictions,
    each task's coverage beside its scores; a task predicted in part is refused unless `allow_partial`."""
    by_task = {name: {ex.id: ex for ex in task.examples} for name, task in tasks.items()}
    records = read_predictions(path, by_task)
    covered = Counter(r["task"] for r in records)
    missing = {t: len(by_task[t]) - covered[t] for t in by_task if covered[t] < len(by_task[t])}
    if missing and not allow_partial:
        task, count = next(iter(missing.items()))
        raise fail(f"{path} predicts {covered[task]} of the {len(by_task[task])} {task} examples ({count} missing)",
                   "predict every example, or pass --allow-partial to score only those given")  # fmt: skip
    for r in records:
        ex = by_task[r["task"]][r["id"]]
        scores = example_scores(tasks[r["task"]].chosen["metric"], r["prediction"], ex.references)
        r.update(references=ex.references, scores=scores)
    results = scrolls_results(tasks, records)
    for name in results:
        results[name]["coverage"] = f"{results[name]['n']}/{len(by_task[name])}"
    return records, results
