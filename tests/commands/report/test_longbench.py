"""LongBench reports in `megaeval report` (issue 57 A4, B): the leaderboard marks a category mean (and so its
language's Avg) that leaves out tasks not scored; an edited report is refused in one line by the table and the page
alike (one description of the results reads them for both), never a traceback, also under random damage; and an
ASCII-only standard output gets the tables in ASCII, never a UnicodeEncodeError."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.longbench import LongbenchSettings, run_longbench
from megaeval.commands.report.kinds import compare
from megaeval.commands.report.page import write_html
from megaeval.console import printable
from megaeval.errors import MegaevalError
from megaeval.tasks.longbench.data import read_v1, read_v2
from megaeval.tasks.longbench.tables import longbench_parts
from megaeval_testing import REPO
from megaeval_testing.mutation import EXAMPLES, draw_damage, outcome

FIXTURES = REPO / "tests" / "fixtures" / "longbench"
V1, V2 = FIXTURES / "v1", FIXTURES / "v2" / "data.json"


def report_of(tmp_path: Path, kind: str, tasks: tuple[str, ...] = ("qasper", "lcc")) -> Path:
    """A real report (v1, LongBench-E or v2) from prediction files of a model that answered every record right."""
    pred = tmp_path / f"pred-{kind}"
    pred.mkdir()
    if kind == "v2":
        rows = [{**x, "pred": x["answer"], "judge": True} for x in read_v2(str(V2))[0]]
        (pred / "v2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        settings = LongbenchSettings(version=2, predictions=str(pred / "v2.jsonl"), out=str(tmp_path / f"{kind}.json"))
    else:
        for task in tasks:
            rows = [{"pred": r["answers"][0], "answers": r["answers"], "all_classes": r["all_classes"],
                     "length": r["length"]} for r in read_v1(str(V1), task, kind == "e")[0]]  # fmt: skip
            (pred / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        settings = LongbenchSettings(predictions=str(pred), longbench_e=kind == "e", out=str(tmp_path / f"{kind}.json"))
    run_longbench(settings, progress=False)
    return Path(settings.out)


def test_the_leaderboard_marks_what_lacks_tasks(tmp_path):
    path = report_of(tmp_path, "v1", ("narrativeqa", "qasper", "multifieldqa_en", "lcc"))
    results = json.loads(path.read_text())["results"]
    # English single-document QA holds its three tasks; code lacks repobench-p; no Chinese task ran at all
    assert results["leaderboard_missing"]["English"]["Code Completion"] == ["repobench-p"]
    assert "Single-Doc QA" not in results["leaderboard_missing"]["English"]
    assert results["leaderboard_missing"]["Chinese"]["Single-Doc QA"] == ["multifieldqa_zh"]
    table = compare([path], fmt="markdown")
    assert "| English | 100.0* | 100.0 |  |  |  | 100.0* |  |" in table
    assert "| Chinese | 100.0* |  |  |  |  | 100.0* |  |" in table  # lcc alone: marked, never a plain average
    assert "*: over some of its tasks, the others not scored" in table
    write_html([path], [], tmp_path / "p.html")
    assert "100.0*" in (tmp_path / "p.html").read_text()


EDITS = {
    "a LongBench-E task row missing a bucket": ("e", lambda r: r["tasks"]["qasper"]["buckets"].pop("4-8k"),
                                                "results.tasks.qasper.buckets.4-8k is missing, not a number or null"),
    "a bucket value that is a string": ("e", lambda r: r["tasks"]["qasper"]["buckets"].update({"0-4k": "100"}),
                                        "results.tasks.qasper.buckets.0-4k is '100', not a number or null"),
    "a fifth bucket": ("e", lambda r: r["buckets"].update({"16k+": 1.0}), "results.buckets holds '16k+', not only"),
    "a fifth bucket in a task": ("e", lambda r: r["tasks"]["lcc"]["buckets"].update({"16k+": 1.0}),
                                 "results.tasks.lcc.buckets holds '16k+', not only 0-4k, 4-8k, 8k+"),
    "a leaderboard cell that is not a number": ("v1", lambda r: r["leaderboard"]["English"].update({"Avg": "x"}),
                                                "results.leaderboard.English.Avg is 'x', not a number or null"),
    "a leaderboard language that is not an object": ("v1", lambda r: r["leaderboard"].update({"Chinese": 3}),
                                                     "results.leaderboard.Chinese is 3, not a non-empty object"),
    "v2 figures that are not numbers": ("v2", lambda r: r["figures"].update({"easy": "all"}),
                                        "results.figures.easy is 'all', not a number or null"),
}  # fmt: skip


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_report_is_one_line_in_the_table_and_the_page(tmp_path, edit):
    kind, change, message = EDITS[edit]
    path = report_of(tmp_path, kind)
    report = json.loads(path.read_text())
    change(report["results"])
    with pytest.raises(MegaevalError, match=re.escape(message)):  # the one reading of the results names the field
        longbench_parts(report["results"])
    path.write_text(json.dumps(report))
    field = message.split(" ")[0].rsplit(".", 1)[0]  # load_report may refuse it first, naming the same place
    for argv in (["report", str(path)], ["report", str(path), "--format", "html", "--out", str(tmp_path / "p.html")]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2 and field in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "p.html").exists()


def test_an_ascii_only_output_gets_ascii_tables(tmp_path):
    path = report_of(tmp_path, "v1")
    result = CliRunner(charset="ascii").invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert "+---" in result.output and "| qasper" in result.output and "100.00" in result.output
    # a run prints its tables after writing its report: the same, never a traceback once the report is written
    run = CliRunner(charset="ascii").invoke(app, ["longbench", "--predictions", str(tmp_path / "pred-v1"), "--out",
                                                  str(tmp_path / "again.json")])  # fmt: skip
    assert run.exit_code == 0 and "| English | 100.0*" in run.output, run.output
    # box drawing becomes - | +; any other character the encoding lacks a "?" (two for a wide one, columns aligned)
    assert printable("┏━┳┓\n┃ 中a ┃\n└─┴┘", "ascii") == "+-++\n| ??a |\n+-++"
    assert printable("plain ┃ text", "utf-8") == "plain ┃ text" and printable("é┃", "latin-1") == "é|"


@pytest.mark.parametrize("kind", ["v1", "e", "v2"])
def test_damaged_longbench_reports(tmp_path, kind):
    """A LongBench report damaged at one drawn place: its table and its page both show it, or both refuse it in one
    line."""
    path = report_of(tmp_path, kind)
    report = json.loads(path.read_text())
    compare([path], fmt="csv")

    @EXAMPLES
    @given(st.data())
    def damaged(data):
        path.write_text(json.dumps({**report, "results": draw_damage(data, report["results"])}))
        got = [outcome(lambda: compare([path], fmt="csv"))[0], outcome(lambda: compare([path], fmt="table"))[0],
               outcome(lambda: write_html([path], [], tmp_path / "p.html"))[0]]  # fmt: skip
        assert len(set(got)) == 1, got

    damaged()
