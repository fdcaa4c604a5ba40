"""A BABILong report in `megaeval report` (the table), the HTML page (the heatmap section, the sample browser) and
`megaeval plot` (the published heatmap): every cell drawn is the report's number; a broken report is one line."""

from __future__ import annotations

import json
import math
import re

import pytest

from megaeval.commands.report.kinds import babilong_tables
from megaeval.commands.report.page import write_html
from megaeval.commands.report.plot_retrieval import babilong_figure
from megaeval.errors import MegaevalError
from megaeval.runs.report import SCHEMA_VERSION, load_report
from megaeval.tasks.babilong.results import babilong_results


def report(tmp_path, records=None) -> tuple[dict, str]:
    records = records or [
        {"task": t, "length": n, "correct": k < right}
        for t, rights in {"qa1": (2, 1), "qa2": (0, 2), "qa3": (1, 1), "qa4": (2, 2), "qa5": (1, 0)}.items()
        for n, right in zip(("0k", "4k"), rights, strict=True) for k in range(2)
    ]  # fmt: skip
    results = babilong_results(records, sorted({r["task"] for r in records}), ["0k", "4k"])
    body = {"schema_version": SCHEMA_VERSION, "command": "babilong", "settings": {"samples": None},
            "model": {"spec": "m"}, "data": {}, "environment": {}, "results": results}  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(body))
    return body, str(path)


def test_results_and_the_table_hold_accuracy_and_the_average(tmp_path):
    body, path = report(tmp_path)
    res = load_report(path)["results"]
    assert res["tasks"]["qa1"] == {"0k": {"accuracy": 100.0, "correct": 2, "n": 2},
                                   "4k": {"accuracy": 50.0, "correct": 1, "n": 2}}  # fmt: skip
    assert [r["average"] for r in res["lengths"]] == [60.0, 60.0]  # (100+0+50+100+50)/5, (50+100+50+100+0)/5
    csv = babilong_tables([body], ["m"], "csv").splitlines()
    assert csv[0] == "model,task,0k,4k" and csv[1] == "m,qa1,100.0,50.0" and csv[-1] == "m,average,60.0,60.0"


def test_the_page_and_the_heatmap_draw_the_reports_numbers(tmp_path):
    body, path = report(tmp_path)
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        json.dumps(
            {
                "task": "qa1",
                "length": "0k",
                "id": "0k/0",
                "target": "hallway",
                "question": "Where is John?",
                "prediction": "hallway",
                "score": 1.0,
            }
        )
        + "\n"
    )
    body["settings"]["samples"] = str(samples)
    (tmp_path / "r.json").write_text(json.dumps(body))
    page = write_html([path], [str(samples)], tmp_path / "p.html").read_text()
    cells = re.findall(r'data-row="(\w+)" data-col="(\w+)"><rect[^>]*/><text[^>]*>(\d*)</text>', page)
    assert cells[:2] == [("qa1", "0k", "100"), ("qa1", "4k", "50")] and len(cells) == 12
    assert cells[-1] == ("average", "4k", "60") and '"hallway", "hallway"' in page  # prediction, references
    fig = babilong_figure(__import__("matplotlib.pyplot").pyplot, [body], ["m"])
    grid = fig.axes[0].images[0].get_array()
    assert grid.tolist() == [[100.0, 50.0], [0.0, 100.0], [50.0, 50.0], [100.0, 100.0], [50.0, 0.0], [60.0, 60.0]]
    assert sorted(t.get_text() for t in fig.axes[0].texts)[:3] == ["0", "0", "100"]


def test_a_missing_task_leaves_the_average_blank(tmp_path):
    body, path = report(tmp_path, [{"task": "qa1", "length": n, "correct": True} for n in ("0k", "4k")])
    assert [r["average"] for r in body["results"]["lengths"]] == [None, None]
    fig = babilong_figure(__import__("matplotlib.pyplot").pyplot, [body], ["m"])
    assert all(math.isnan(v) for v in fig.axes[0].images[0].get_array().data[-1])


@pytest.mark.parametrize(("damage", "message"), [
    (lambda r: r["results"].pop("tasks"), "results.tasks is missing"),
    (lambda r: r["results"]["tasks"]["qa1"].pop("4k"), "results.tasks.qa1 lacks an accuracy"),
    (lambda r: r["results"]["lengths"][0].update(average="high"), "results.lengths is missing or malformed"),
    (lambda r: r["results"].update(average_of=None), "results.average_of is missing"),
])  # fmt: skip
def test_a_broken_babilong_report_is_one_line(tmp_path, damage, message):
    body, path = report(tmp_path)
    damage(body)
    (tmp_path / "r.json").write_text(json.dumps(body))
    with pytest.raises(MegaevalError, match=message):
        load_report(path)
