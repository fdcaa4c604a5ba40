"""Reading reports: a malformed needle report is refused by `report` and `plot` in one line naming the file and the
problem, as every other report kind is."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from megaeval.cli import app

runner = CliRunner()


def needle_report(lengths: tuple[int, ...] = (1024, 2048), depths: tuple[int, ...] = (0, 50, 100)) -> dict:
    """A well-formed needle report of one task, passkey, every cell at accuracy 1."""
    cells = [{"length": n, "depth": d, "n": 1, "accuracy": 1.0} for n in lengths for d in depths]
    passkey = {"n": len(cells), "metric": "accuracy", "accuracy": 1.0, "cells": cells,
               "lengths": [{"length": n, "n": len(depths), "accuracy": 1.0} for n in lengths]}  # fmt: skip
    return {"schema_version": 1, "command": "needle", "settings": {}, "model": {"spec": "hf:/models/tiny"},
            "data": {}, "environment": {},
            "results": {"passkey": passkey, "average": 1.0, "average_of": {"passkey": "accuracy"}}}  # fmt: skip


def _drop_tasks(r: dict) -> None:
    r["results"] = {"average": None, "average_of": {}}


def _twice(key: str, index: int = 0) -> Callable[[dict], None]:
    return lambda r: r["results"]["passkey"][key].append(dict(r["results"]["passkey"][key][index]))


def _set(key: str, field: str, value: object) -> Callable[[dict], None]:
    return lambda r: r["results"]["passkey"][key][1].update({field: value})


BROKEN = {
    "no-tasks": (_drop_tasks, r"is a needle report with no tasks in its results"),
    "cell-twice": (_twice("cells", 1), r"results\.passkey\.cells holds length 1024, depth 50 twice"),
    "length-twice": (_twice("lengths"), r"results\.passkey\.lengths holds length 1024 twice"),
    "cell-at-no-length": (_set("cells", "length", 4096),
                          r"results\.passkey\.cells has length 4096, which results\.passkey\.lengths lacks"),
    "depth-over-100": (_set("cells", "depth", 150), r"depth 150: lengths are positive integers, depths 0\.\.100"),
    "length-not-an-integer": (_set("lengths", "length", 1.5), r"length 1\.5: lengths are positive integers"),
    "accuracy-a-string": (_set("cells", "accuracy", "1.0"), r"results\.passkey\.cells is missing or malformed"),
    "accuracy-nan": (lambda r: r["results"]["passkey"].update(accuracy=float("nan")),
                     r"results\.passkey\.accuracy is nan, not a number"),
}  # fmt: skip


@pytest.mark.parametrize("command", ["report", "plot"])
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_malformed_needle_report_is_one_line_naming_the_file_and_the_problem(tmp_path: Path, case: str,
                                                                               command: str) -> None:  # fmt: skip
    break_it, problem = BROKEN[case]
    report = needle_report()
    break_it(report)
    path = tmp_path / "needle.json"
    path.write_text(json.dumps(report))
    argv = [command, str(path)] + (["--out", str(tmp_path / "heat.png")] if command == "plot" else [])
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {path}") and "Traceback" not in result.stderr
    assert re.search(problem, result.stderr), result.stderr
    assert "pass an unedited report written by megaeval --out" in result.stderr
    assert not (tmp_path / "heat.png").exists()


def test_needle_csv_rows_name_their_model_and_task_over_every_length(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(needle_report()))
    other = needle_report(lengths=(2048, 4096), depths=(0,))
    other["model"]["spec"] = "hf:/models/other"
    other["results"]["passkey"]["cells"][0]["accuracy"] = 0.5
    b.write_text(json.dumps(other))
    result = runner.invoke(app, ["report", str(a), str(b), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "model,task,depth,1K,2K,4K",
        "tiny,passkey,0%,1.00,1.00,", "tiny,passkey,50%,1.00,1.00,", "tiny,passkey,100%,1.00,1.00,",
        "tiny,passkey,mean,1.00,1.00,",
        "other,passkey,0%,,0.50,1.00", "other,passkey,mean,,1.00,1.00",
    ]  # fmt: skip
