"""Property-based damage to every report kind's fields and to its samples lines (issue 46, B4 and D): a real report
of each kind (the golden run's, tests/fixtures/golden) damaged at one drawn place gives, in `report` (its table), in
`report --format html` (the page) and in `plot` (the kinds it draws), either a clean result or one line (a
MegaevalError), never another exception. Reports are validated once, when read: whatever is refused is refused by
all three alike."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaeval.commands.report.kinds import compare
from megaeval.commands.report.page import write_html
from megaeval.commands.report.plot import plot_reports
from megaeval_testing import REPO
from megaeval_testing.mutation import EXAMPLES, draw_damage, outcome

GOLDEN = REPO / "tests" / "fixtures" / "golden" / "files"
KINDS = {"sweep": True, "scrolls": False, "academic": False, "needle": True, "ruler": True, "longppl": False,
         "babilong": True}  # fmt: skip  # report file -> whether `plot` draws its kind
FEW = settings(EXAMPLES, max_examples=6)


def three_ways(path: Path, work: Path, plot: bool) -> list[str]:
    """The outcome of the table, the page and (a kind it draws) the plot of one report: what each gave."""
    kinds = [
        outcome(lambda: compare([path], fmt="csv"))[0],
        outcome(lambda: write_html([path], [], work / "p.html"))[0],
    ]
    if plot:
        results = json.loads(path.read_text()).get("results")
        curve = isinstance(results, dict) and "position_curve" in results
        kinds.append(outcome(lambda: plot_reports([path], work / "p.svg", position_curve=curve))[0])
    return kinds


@pytest.mark.parametrize("kind", list(KINDS))
def test_damaged_reports_of_every_kind(kind, tmp_path):
    report = json.loads((GOLDEN / f"{kind}.json").read_text())
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(report))
    assert set(three_ways(path, tmp_path, KINDS[kind])) == {"ok"}

    @FEW
    @given(st.data())
    def prop(data):
        path.write_text(json.dumps(draw_damage(data, report)))
        got = three_ways(path, tmp_path, KINDS[kind])
        if "error" in got and got[0] == "error":  # refused when read: refused by all
            assert set(got) == {"error"}, got

    prop()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "sweep"])
def test_damaged_samples_lines_of_every_kind(kind, tmp_path):
    report = json.loads((GOLDEN / f"{kind}.json").read_text())
    lines = (GOLDEN / f"{kind}.jsonl").read_text().splitlines()
    samples = tmp_path / f"{kind}.jsonl"

    @FEW
    @given(st.data())
    def prop(data):
        n = data.draw(st.integers(0, len(lines) - 1), label="line")
        damaged = [json.dumps(draw_damage(data, json.loads(line))) if i == n else line for i, line in enumerate(lines)]
        samples.write_text("".join(line + "\n" for line in damaged))
        report["data"]["samples_sha256"] = hashlib.sha256(samples.read_bytes()).hexdigest()  # the run's own file
        (tmp_path / f"{kind}.json").write_text(json.dumps(report))
        outcome(lambda: write_html([tmp_path / f"{kind}.json"], [samples], tmp_path / "p.html"))

    prop()
