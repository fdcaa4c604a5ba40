"""A LongBench report's results as the tables `megaeval report` and its HTML page show them, read through one
description that checks each field as it reads it: v1's task rows and leaderboard (a category that lacks some of
its tasks, and so its language's Avg, marked `*`), LongBench-E's buckets, v2's figures. The renderers (text, csv,
markdown, HTML) read a report's results only here, and `load_report`'s check of a longbench report is meant to be
this same reading (one description, no second list of fields to drift): whatever the tables would not show is
refused in one line naming the field, never a traceback. It imports nothing of runs/, so runs/report.py can call it."""

from __future__ import annotations

from typing import Any

from ...errors import fail
from ...metrics.longbench import BUCKETS, GROUPS, LANGUAGES, leaderboard_missing
from ..report_fields import BOOLEAN, COUNT, FIX, NUMBER, NUMBER_OR_NULL, OBJECT, TEXT, Check, Part, exactly, field

FIGURES = ("overall", "easy", "hard", "short", "medium", "long")
INCOMPLETE = "*"  # after a category mean (or Avg) that leaves out tasks that were not scored
VERSION: Check = (lambda v: v in (1, 2) and not isinstance(v, bool), "1 or 2")
FIGURES_OR_NULL: Check = (lambda v: v is None or isinstance(v, dict), "an object or null")


def longbench_parts(res: Any) -> list[Part]:
    """A LongBench report's results as (title, header, rows) tables, every field read checked."""
    if not isinstance(res, dict):
        raise fail(f"results is {res!r:.40}, not an object", FIX)
    if field(res, "version", "results", VERSION) == 2:
        return [v2_part(res)]
    tasks = field(res, "tasks", "results", OBJECT)
    rows = {task: task_row(row, f"results.tasks.{task}") for task, row in tasks.items()}
    if field(res, "longbench_e", "results", BOOLEAN):
        return [e_part(res, rows)]
    return [v1_part(rows), leaderboard_part(res, list(rows))]


def task_row(row: Any, where: str) -> dict[str, Any]:
    """One v1 task's row: its score, n, metric, prompts cut, and (LongBench-E) its buckets."""
    if not isinstance(row, dict):
        raise fail(f"{where} is {row!r:.40}, not an object", FIX)
    out = {key: field(row, key, where, check) for key, check in
           (("score", NUMBER), ("n", COUNT), ("metric", TEXT), ("truncated", COUNT))}  # fmt: skip
    if "buckets" in row:
        out["buckets"] = exactly(field(row, "buckets", where, OBJECT), BUCKETS, f"{where}.buckets", NUMBER_OR_NULL)
    return out


def v1_part(rows: dict[str, dict[str, Any]]) -> Part:
    """eval.py's per-task table."""
    cells = [[t, r["metric"], _score(r["score"]), str(r["n"]), str(r["truncated"])] for t, r in rows.items()]
    return "LongBench (eval.py scores)", ["task", "metric", "score", "n", "prompts cut"], cells


def leaderboard_part(res: dict[str, Any], tasks: list[str]) -> Part:
    """The README leaderboard's category means by language; a mean that leaves out tasks not scored is marked."""
    board = field(res, "leaderboard", "results", OBJECT)
    board = exactly(board, LANGUAGES, "results.leaderboard", OBJECT)
    missing = leaderboard_missing(tasks)
    columns = ("Avg", *GROUPS)
    rows = []
    for language in LANGUAGES:
        cells = exactly(board[language], columns, f"results.leaderboard.{language}", NUMBER_OR_NULL)
        lacking = {c for c in GROUPS if c in missing[language]} | ({"Avg"} if missing[language] else set())
        rows.append([language, *(_mark(_percent(cells[c]), c in lacking) for c in columns)])
    note = f"; {INCOMPLETE}: over some of its tasks, the others not scored" if any(missing.values()) else ""
    title = f"LongBench leaderboard (category means{note})"
    return title, ["", *columns], rows


def e_part(res: dict[str, Any], rows: dict[str, dict[str, Any]]) -> Part:
    """LongBench-E's table: a row per task by length bucket, and each bucket's mean over the tasks."""
    means = exactly(field(res, "buckets", "results", OBJECT), BUCKETS, "results.buckets", NUMBER_OR_NULL)
    table = []
    for task, row in rows.items():
        if "buckets" not in row:
            raise fail(f"results.tasks.{task}.buckets is missing, not an object", FIX)
        table.append([task, *(_score(row["buckets"][b]) for b in BUCKETS), _score(row["score"])])
    table.append(["average", *(_score(means[b]) for b in BUCKETS), ""])
    return "LongBench-E by length (words; characters in Chinese)", ["task", *BUCKETS, "all"], table


def v2_part(res: dict[str, Any]) -> Part:
    """result.py's row: overall, easy, hard, short, medium, long."""
    figures = field(res, "figures", "results", FIGURES_OR_NULL)
    figures = exactly(figures, FIGURES, "results.figures", NUMBER_OR_NULL) if figures is not None else {}
    n, answered, truncated = (field(res, key, "results", COUNT) for key in ("n", "answered", "truncated"))
    protocol = field(res, "protocol", "results", TEXT)
    how = "compensated, " if field(res, "compensated", "results", BOOLEAN) else ""
    title = f"LongBench v2 ({protocol} protocol, {how}{answered} of {n} items answered, {truncated} prompts cut)"
    row = ["accuracy", *(_percent(figures.get(name)) for name in FIGURES)]
    return title, ["", *(name.capitalize() for name in FIGURES)], [row]


def _mark(text: str, incomplete: bool) -> str:
    return f"{text}{INCOMPLETE}" if text and incomplete else text


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
