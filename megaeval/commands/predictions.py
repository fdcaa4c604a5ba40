"""`megaeval scrolls --predictions FILE`: score any system's SCROLLS predictions against the references."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import fail
from ..files import file_sha256, write_json_atomic, write_jsonl_atomic
from ..metrics.scrolls import example_scores
from ..runs.report import build_report, environment
from ..tasks.data import read_rows

LINE_FIX = 'write one JSON object per line: {"task": ..., "id": ..., "prediction": "..."}'


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


def score_predictions(settings: Any, per_task: dict, examples: dict, data: dict) -> dict[str, Any]:
    """Scoring-only mode: predictions from any system, references from the data; writes the report."""
    from .scrolls import scrolls_results

    path = Path(settings.predictions)
    by_task = {t: {ex.id: ex for ex in examples[t]} for t in per_task}
    records = read_predictions(path, by_task)
    covered = Counter(r["task"] for r in records)
    missing = {t: len(by_task[t]) - covered[t] for t in by_task if covered[t] < len(by_task[t])}
    if missing and not settings.allow_partial:
        task, count = next(iter(missing.items()))
        raise fail(f"{path} predicts {covered[task]} of the {len(by_task[task])} {task} examples ({count} missing)",
                   "predict every example, or pass --allow-partial to score only those given")  # fmt: skip
    for r in records:
        ex = by_task[r["task"]][r["id"]]
        r.update(references=ex.references, scores=example_scores(per_task[r["task"]]["metric"], r["prediction"],
                                                                 ex.references))  # fmt: skip
    results = scrolls_results(list(per_task), per_task, records)
    for task in results:
        results[task]["coverage"] = f"{results[task]['n']}/{len(by_task[task])}"
    model = {"spec": None, "predictions": str(path), "predictions_sha256": file_sha256(path)}
    report = build_report("scrolls", {**asdict(settings), "per_task": per_task}, model, data, results,
                          environment("cpu", "none"))  # fmt: skip
    if settings.samples:
        write_jsonl_atomic(settings.samples, records)
    write_json_atomic(settings.out, report)
    return report
