"""BABILong results: accuracy x 100 per task and length (collect_results' table), and per length the qa1-qa5
average the paper reports (None where one of those five is missing)."""

from __future__ import annotations

from typing import Any

from ...metrics.babilong import accuracy, average

AVERAGED = ("qa1", "qa2", "qa3", "qa4", "qa5")  # the published average (collect_results: the first five rows)


def babilong_results(records: list[dict[str, Any]], tasks: list[str], lengths: list[str]) -> dict[str, Any]:
    """From one record per instance (task, length, correct): the task x length table and the per-length rows."""
    table: dict[str, dict[str, dict[str, Any]]] = {t: {} for t in tasks}
    for task in tasks:
        for length in lengths:
            mine = [r for r in records if r["task"] == task and r["length"] == length]
            right = sum(bool(r["correct"]) for r in mine)
            table[task][length] = {"accuracy": accuracy(right, len(mine)), "correct": right, "n": len(mine)}
    rows = []
    for length in lengths:
        cells = [table[t][length]["accuracy"] if t in table else None for t in AVERAGED]
        rows.append({"length": length, "average": average(cells), "n": sum(table[t][length]["n"] for t in tasks)})
    return {"tasks": table, "lengths": rows, "average_of": list(AVERAGED)}
