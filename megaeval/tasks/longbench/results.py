"""A LongBench run's results from its per-record scores: v1's per-task scores as eval.py rounds them, the
leaderboard's category averages (English, Chinese), LongBench-E's length buckets; v2's result.py figures."""

from __future__ import annotations

from typing import Any

from ...metrics.longbench import BUCKETS, leaderboard, leaderboard_missing, length_buckets, task_score, v2_figures
from ...runs.answers import MEMORY, SECONDS, STATE, most, rates


def v1_results(records: list[dict[str, Any]], tasks: list[str], longbench_e: bool) -> dict[str, Any]:
    """Per task: eval.py's score (and with LongBench-E its buckets), how many prompts were cut and by how many
    tokens; the leaderboard's categories and the tasks each lacks (LongBench) or each bucket's mean over the tasks
    (LongBench-E)."""
    per_task: dict[str, Any] = {}
    for task in tasks:
        mine = [r for r in records if r["task"] == task]
        row: dict[str, Any] = {
            "score": task_score([r["score"] for r in mine]), "n": len(mine), "metric": mine[0]["metric"],
            **truncation(mine), **cost(mine),
        }  # fmt: skip
        if longbench_e:
            row["buckets"] = length_buckets([r["score"] for r in mine], [r["length"] for r in mine])
        per_task[task] = row
    results: dict[str, Any] = {"version": 1, "longbench_e": longbench_e, "tasks": per_task}
    if longbench_e:
        results["buckets"] = {
            b: _mean([row["buckets"][b] for row in per_task.values() if row["buckets"][b] is not None]) for b in BUCKETS
        }
    else:
        results["leaderboard"] = leaderboard({t: row["score"] for t, row in per_task.items()})
        # the categories whose mean (and so each language's Avg) leaves out tasks that were not scored
        results["leaderboard_missing"] = leaderboard_missing(list(per_task))
    return results


def v2_results(records: list[dict[str, Any]], compensated: bool, protocol: str) -> dict[str, Any]:
    """result.py's figures over the items answered (an item whose output is empty is left out, as the official
    script writes no line for it), with how many were left out and how many prompts were cut."""
    answered = [r for r in records if not r.get("skipped")]
    return {
        "version": 2, "protocol": protocol, "compensated": compensated,
        "figures": v2_figures(answered, compensated) if answered else None,
        "n": len(records), "answered": len(answered), "empty_outputs": len(records) - len(answered),
        "no_answer_extracted": sum(r["pred"] is None for r in answered), **truncation(records), **cost(records),
    }  # fmt: skip


def truncation(records: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the records' prompts were cut in the middle, and the tokens dropped in all."""
    return {"truncated": sum(r.get("tokens_dropped", 0) > 0 for r in records),
            "tokens_dropped": sum(r.get("tokens_dropped", 0) for r in records)}  # fmt: skip


def cost(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What reading and answering the records cost (a run's, not given predictions'): the peak memory and largest
    model state of any batch, and the tokens read and generated per second (`runs.answers.rates`)."""
    if not records or SECONDS not in records[0]:
        return {}
    return {MEMORY: most(r[MEMORY] for r in records), STATE: most(r[STATE] for r in records), **rates(records)}


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None
