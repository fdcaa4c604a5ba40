"""An MT-Bench report's results as the tables `megaeval report` and its HTML page show them (show_result.py's
three figures per model, and the per-category means of its radar chart), every field read checked
(tasks.report_fields), so that `load_report`'s check of an mtbench report is this same reading."""

from __future__ import annotations

from typing import Any

from ...errors import fail
from ..report_fields import BOOLEAN, COUNT, FIX, NUMBER_OR_NULL, OBJECT, Part, exactly, field

TURNS = ("turn_1", "turn_2")


def mtbench_models(res: Any) -> dict[str, dict[str, Any]]:
    """Each model's row of an mtbench report's results, checked: its three means, counts and category means."""
    if not isinstance(res, dict):
        raise fail(f"results is {res!r:.40}, not an object", FIX)
    field(res, "categories_known", "results", BOOLEAN)
    models = field(res, "models", "results", OBJECT)
    out = {}
    for model, row in models.items():
        where = f"results.models.{model}"
        if not isinstance(row, dict):
            raise fail(f"{where} is {row!r:.40}, not an object", FIX)
        means = {k: field(row, k, where, NUMBER_OR_NULL) for k in (*TURNS, "overall")}
        rated = exactly(field(row, "rated", where, OBJECT), TURNS, f"{where}.rated", COUNT)
        unrated = field(row, "unrated", where, COUNT)
        categories = row.get("categories")
        if categories is not None:
            categories = exactly(field(row, "categories", where, OBJECT), tuple(categories), f"{where}.categories",
                                 NUMBER_OR_NULL)  # fmt: skip
        out[model] = {**means, "rated": rated, "unrated": unrated, "categories": categories}
    return out


def mtbench_parts(res: Any) -> list[Part]:
    """show_result.py's figures (a row per model, best first) and the category means, as (title, header, rows)."""
    models = mtbench_models(res)
    rows = [[m, _score(r["turn_1"]), _score(r["turn_2"]), _score(r["overall"]), str(sum(r["rated"].values())),
             str(r["unrated"])] for m, r in models.items()]  # fmt: skip
    parts = [("MT-Bench (single-answer grading, show_result.py's means)",
              ["model", "first turn", "second turn", "average", "rated", "unrated"], rows)]  # fmt: skip
    categories = list(dict.fromkeys(c for r in models.values() for c in (r["categories"] or {})))
    if categories:
        cells = [[m, *(_score((r["categories"] or {}).get(c)) for c in categories)] for m, r in models.items()]
        parts.append(("MT-Bench by category (the radar chart's means, both turns)", ["model", *categories], cells))
    return parts


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
