"""`megaeval longbench --predictions`: the official prediction files scored without a model, as the official scripts
score them.

- v1 (LongBench/eval.py): a folder of `<task>.jsonl` files (pred.py's `pred, answers, all_classes, length` lines);
  every task file the folder holds (or those --tasks names). As eval.py does, a task's `all_classes` is its file's
  last line's. With --e, LongBench-E's buckets by `length`.
- v2 (result.py): one file of pred.py's lines (`judge, pred, difficulty, length`, ...), JSONL or a JSON list.

Each line is checked by the rules of its record type (`tasks.longbench.data`), the same the data files get: a line
that is not what pred.py writes is refused in one line naming the file, the line and the field."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..errors import fail
from ..files import file_sha256, write_json_atomic, write_jsonl_atomic
from ..metrics.longbench import score_prediction
from ..runs.report import build_report, environment
from ..runs.run import check_run_outputs
from ..tasks.longbench.data import V2_PREDICTION, check_v1_prediction, check_v2_all, v1_folder, v2_file
from ..tasks.longbench.results import v1_results, v2_results
from ..tasks.longbench.spec import load_longbench_task
from ..text import iter_jsonl, read_json


def score_predictions(settings: Any) -> dict[str, Any]:
    """Score --predictions (v1: a folder of task files; v2: one file); write the report (and samples), return it."""
    out = check_run_outputs(settings, [settings.predictions])
    if settings.version == 1:
        records, sources, tasks = _v1(settings)
        results = v1_results(records, tasks, settings.longbench_e)
    else:
        records, sources = _v2(settings)
        results = v2_results(records, settings.compensated, "official")
    data = {"predictions": sources}
    if settings.samples:
        data["samples_sha256"] = write_jsonl_atomic(settings.samples, records)
    model = {"spec": None, "predictions": settings.predictions}
    report = build_report("longbench", asdict(settings), model, data, results, environment("cpu", "none"))
    write_json_atomic(out, report)
    return report


def _v1(settings: Any) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    folder = v1_folder(settings.predictions, "--predictions")
    present = [t for t in settings.task_names if (folder / f"{t}.jsonl").is_file()]
    if settings.tasks not in ("all", "present") and len(present) < len(settings.task_names):
        missing = next(t for t in settings.task_names if t not in present)
        raise fail(f"--predictions {folder} holds no {missing}.jsonl", "ask for --tasks it holds (or --tasks present)")
    if not present:
        raise fail(f"--predictions {folder} holds no LongBench prediction file (<task>.jsonl)",
                   "pass the folder pred.py wrote (pred/<model>/ or pred_e/<model>/)")  # fmt: skip
    records, sources = [], {}
    for task in present:
        spec, path = load_longbench_task(task, settings.include_path), folder / f"{task}.jsonl"
        sources[task] = {"path": str(path), "sha256": file_sha256(path)}
        rows = [(n, row) for n, row in iter_jsonl(path, "prediction file")][: settings.num_samples]
        if not rows:
            raise fail(f"{path} holds no predictions", "pass the files pred.py wrote")
        for n, row in rows:
            check_v1_prediction(row, f"{path} line {n}", spec["metric"], settings.longbench_e)
        classes = rows[-1][1]["all_classes"]  # eval.py keeps the last line's
        for i, (_, row) in enumerate(rows):
            score = score_prediction(spec["metric"], row["pred"], row["answers"], classes, spec["first_line"])
            records.append({"task": task, "id": f"{task}/{i}", "sample": i, "metric": spec["metric"],
                            "length": row.get("length"), "answers": row["answers"], "prediction": row["pred"],
                            "score": score})  # fmt: skip
    return records, sources, present


def _v2(settings: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path = v2_file(settings.predictions, "--predictions")
    try:
        rows = read_json(path, "prediction file")
        numbered = [(f"{path} item {i + 1}", r) for i, r in enumerate(rows)] if isinstance(rows, list) else None
    except Exception:  # not one JSON value: JSON lines, as pred.py writes (result.py tries both, in this order)
        numbered = None
    if numbered is None:
        numbered = [(f"{path} line {n}", r) for n, r in iter_jsonl(path, "prediction file")]
    numbered = numbered[: settings.num_samples]
    if not numbered:
        raise fail(f"{path} holds no predictions", "pass the file pred.py wrote")
    rows = check_v2_all(numbered, V2_PREDICTION)  # judge true or false, each _id once: a line counts once
    records = [{"task": row.get("domain", "longbench_v2"), "id": row["_id"], **row, "score": float(row["judge"])}
               for row in rows]  # fmt: skip
    return records, {"path": str(path), "sha256": file_sha256(path)}
