"""RULER's numbers from per-sample scores, as scripts/eval/evaluate.py and the paper compute them (NVIDIA/RULER @
c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a): a task's score is the mean of its samples x 100 rounded to 2 places; a
length's average is the mean of its tasks' scores; wAvg weighs lengths linearly, increasing (inc) or decreasing (dec)
with length; the effective length is the longest length up to which every average exceeds the threshold (85.6:
Llama-2-7B's score at 4K, the paper's baseline)."""

from __future__ import annotations

from typing import Any

DEFAULT_THRESHOLD = 85.6


def task_score(sample_scores: list[float]) -> float:
    """RULER's score of one task at one length: the mean sample score x 100, rounded to 2 places."""
    return round(sum(sample_scores) / len(sample_scores) * 100, 2)


def weighted_average(averages: list[float], increasing: bool) -> float:
    """RULER's wAvg over the lengths in ascending order: weights 1..L (inc) or L..1 (dec), normalised."""
    n = len(averages)
    weights = range(1, n + 1) if increasing else range(n, 0, -1)
    return sum(w * a for w, a in zip(weights, averages, strict=True)) / sum(weights)


def effective_length(lengths: list[int], averages: list[float], threshold: float) -> int | None:
    """The longest length up to which every length's average exceeds `threshold` (None: not even the shortest)."""
    best = None
    for length, average in sorted(zip(lengths, averages, strict=True)):
        if average <= threshold:
            break
        best = length
    return best


def ruler_results(samples: list[dict[str, Any]], metrics: dict[str, str], threshold: float) -> dict[str, Any]:
    """A report's results from its scored samples ({task, length, score}): per task its metric and a score per
    length (with n), then `ruler_summary`'s averages, wAvg and effective length."""
    by_task: dict[str, dict[int, list[float]]] = {}
    for s in samples:
        by_task.setdefault(s["task"], {}).setdefault(s["length"], []).append(s["score"])
    table = {t: {n: task_score(scores) for n, scores in rows.items()} for t, rows in by_task.items()}
    summary = ruler_summary(table, threshold)
    tasks = {t: {"metric": metrics[t], "lengths": [{"length": n, "score": table[t][n], "n": len(rows[n])}
                                                   for n in sorted(rows)]}
             for t, rows in by_task.items()}  # fmt: skip
    averages = summary.pop("average_by_length")
    return {"tasks": tasks, "lengths": [{"length": n, "average": a} for n, a in averages.items()], **summary}


def ruler_summary(scores: dict[str, dict[int, float]], threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """From {task: {length: score}} (every task at every length): the per-length averages, the overall average,
    wAvg inc and dec, and the effective length."""
    lengths = sorted({n for by_length in scores.values() for n in by_length})
    averages = [sum(scores[t][n] for t in scores) / len(scores) for n in lengths]
    return {
        "average_by_length": dict(zip(lengths, averages, strict=True)),
        "average": sum(averages) / len(averages),
        "wavg_inc": weighted_average(averages, increasing=True),
        "wavg_dec": weighted_average(averages, increasing=False),
        "threshold": threshold,
        "effective_length": effective_length(lengths, averages, threshold),
    }
