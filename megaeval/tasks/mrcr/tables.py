"""An MRCR or Graphwalks report's results as the tables `megaeval report` and the HTML page show them, every field
read checked (tasks.report_fields), so that `load_report`'s check of such a report is this same reading."""

from __future__ import annotations

from typing import Any

from ...errors import fail
from ..report_fields import COUNT, FIX, NUMBER_OR_NULL, OBJECT, Part, field


def _cells(obj: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name, cell in obj.items():
        if not isinstance(cell, dict):
            raise fail(f"{where}.{name} is {cell!r:.40}, not an object", FIX)
        out[name] = {"mean": field(cell, "mean", f"{where}.{name}", NUMBER_OR_NULL),
                     "n": field(cell, "n", f"{where}.{name}", COUNT)}  # fmt: skip
    return out


def grouped_scores(res: Any, group: str, columns: str) -> tuple[dict[str, Any], list[str]]:
    """results[group]: per row name, its cells by column (results[group][row][columns]) and mean; the columns in
    the order results[columns] gives them."""
    if not isinstance(res, dict):
        raise fail(f"results is {res!r:.40}, not an object", FIX)
    field(res, "mean", "results", NUMBER_OR_NULL)
    field(res, "n", "results", COUNT)
    order = list(_cells(field(res, columns, "results", OBJECT), f"results.{columns}"))
    rows = {}
    for name, row in field(res, group, "results", OBJECT).items():
        where = f"results.{group}.{name}"
        if not isinstance(row, dict):
            raise fail(f"{where} is {row!r:.40}, not an object", FIX)
        cells = _cells(field(row, columns, where, OBJECT), f"{where}.{columns}")
        extra = next((c for c in cells if c not in order), None)
        if extra is not None:
            raise fail(f"{where}.{columns} holds {extra!r:.40}, which results.{columns} lacks", FIX)
        rows[name] = {"cells": cells, "mean": field(row, "mean", where, NUMBER_OR_NULL), "n": field(row, "n", where,
                                                                                                    COUNT)}  # fmt: skip
    return rows, order


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def score_parts(res: Any, title: str, group: str, columns: str, row_name: str) -> list[Part]:
    """One table: a row per group (needle count, problem type) with its mean per column (bin) and overall, then the
    row of every record; and the counts table."""
    rows, order = grouped_scores(res, group, columns)
    body = [[name, *(_score(r["cells"].get(c, {}).get("mean")) for c in order), _score(r["mean"])]
            for name, r in rows.items()]  # fmt: skip
    body.append(["all", *(_score(res[columns][c]["mean"]) for c in order), _score(res["mean"])])
    counts = [[name, *(str(r["cells"].get(c, {}).get("n", 0)) for c in order), str(r["n"])] for name, r in rows.items()]
    return [(title, [row_name, *order, "overall"], body),
            (f"{title}: records", [row_name, *order, "overall"], counts)]  # fmt: skip


def mrcr_parts(res: Any) -> list[Part]:
    """MRCR: mean grade per needle count and bin (the card's), the overall mean; the records per cell."""
    return score_parts(res, "MRCR: mean grade by needles and o200k_base bin", "needles", "bins", "needles")


def graphwalks_parts(res: Any) -> list[Part]:
    """Graphwalks: mean F1 per problem type and prompt_chars bucket, the overall mean; the records per cell."""
    return score_parts(res, "Graphwalks: mean F1 by problem type and prompt length", "problem_types", "buckets",
                       "problem")  # fmt: skip


def side_by_side(results: list[Any], labels: list[str], columns: str, title: str, order: Any) -> Part:
    """Several reports' means per bin (bucket) over every record, a column per report, the bins in `order` (a sort
    key), then every record's mean: the runs compared at each length."""
    read = []
    for res in results:
        grouped_scores(res, "needles" if columns == "bins" else "problem_types", columns)  # every field checked
        read.append(res)
    names = sorted({name for res in read for name in res[columns]}, key=order)
    rows = [[name, *(_score(res[columns].get(name, {}).get("mean")) for res in read)] for name in names]
    rows.append(["all", *(_score(res["mean"]) for res in read)])
    return title, [columns[:-1], *labels], rows
