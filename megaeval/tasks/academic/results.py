"""Academic results: per-task scores with standard errors, MMLU's subjects and categories, and the average."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ...metrics.academic import group_scores, mean, mean_stderr
from .prepare import AcademicTask


def _with_stderr(name: str, values: list[float]) -> dict[str, float | None]:
    return {name: mean(values), f"{name}_stderr": mean_stderr(values)}


def task_results(prepared: AcademicTask, records: list[dict]) -> dict[str, Any]:
    """One task's scores from its samples records."""
    spec, chosen = prepared.spec, prepared.chosen
    result: dict[str, Any] = {"metric": chosen["headline"], "shots": chosen["shots"]}
    if spec.get("group_by"):
        by_group: dict[str, list[float]] = defaultdict(list)
        for r in records:
            by_group[r["subject"]].append(r["acc"])
        pooled = group_scores(by_group)
        result.update(acc=pooled["weighted"], acc_stderr=pooled["stderr"], acc_macro=pooled["macro"])
        result["subjects"] = {s: {**_with_stderr("acc", v), "n": len(v), "category": spec["subjects"][s]}
                              for s, v in sorted(by_group.items())}  # fmt: skip
        by_category: dict[str, dict[str, list[float]]] = defaultdict(dict)
        for s, v in by_group.items():
            by_category[spec["subjects"][s]][s] = v
        result["categories"] = {}
        for category, groups in sorted(by_category.items()):
            scores = group_scores(groups)
            result["categories"][category] = {"acc": scores["weighted"], "acc_stderr": scores["stderr"],
                                              "acc_macro": scores["macro"], "n": scores["n"]}  # fmt: skip
    else:
        for metric in chosen["metrics"]:
            result.update(_with_stderr(metric, [r[metric] for r in records]))
    result["n"] = len(records)
    reused = sum(r["forward_tokens"] for r in records)
    scratch = sum(r["forward_tokens_from_scratch"] for r in records)
    result.update(forward_tokens=reused, forward_tokens_from_scratch=scratch,
                  forward_tokens_saved=1 - reused / scratch if scratch else 0.0,
                  truncated_tokens=sum(r["truncated_tokens"] for r in records),
                  documents_truncated=sum(1 for r in records if r["truncated_tokens"]))  # fmt: skip
    if spec["output"] == "generate_until":
        result["stop_reasons"] = dict(Counter(r["stop_reason"] for r in records))
        result["mean_generated_tokens"] = mean([r["generated_tokens"] for r in records])
    return result


def academic_results(prepared: dict[str, AcademicTask], records: list[dict]) -> dict[str, Any]:
    """Per-task results and `average`: the mean over tasks of each task's headline metric."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    results: dict[str, Any] = {}
    for task, p in prepared.items():
        if by_task[task]:
            results[task] = task_results(p, by_task[task])
    headlines = {task: r[r["metric"]] for task, r in results.items()}
    results["average"] = mean(list(headlines.values())) if headlines else None
    results["average_of"] = {task: results[task]["metric"] for task in headlines}
    return results
