"""MRCR and Graphwalks reports in `megaeval report`: the per-bin tables (table, markdown, csv), the HTML page's
section with the score-against-length curve per needle count (and per problem type), and a damaged report refused
alike by the table and the page (never a traceback): the mutation check every kind of report gets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaeval.commands.graphwalks import GraphwalksSettings, run_graphwalks
from megaeval.commands.mrcr import MrcrSettings, run_mrcr
from megaeval.commands.report.kinds import compare
from megaeval.commands.report.page import write_html
from megaeval_testing import REPO
from megaeval_testing.mutation import EXAMPLES, draw_damage, outcome

FIXTURES = REPO / "tests" / "fixtures"


def reports(tmp_path) -> dict[str, dict]:
    """An MRCR and a Graphwalks report, scored from made-up responses (no model)."""
    mrcr = tmp_path / "mrcr.jsonl"
    ids = [f"{n}needle/{n}needle_0.parquet#{i}" for n, k in ((2, 3), (4, 2), (8, 1)) for i in range(k)]
    mrcr.write_text("".join(json.dumps({"id": i, "response": "nothing"}) + "\n" for i in ids))
    walks = tmp_path / "walks.jsonl"
    walks.write_text("".join(json.dumps({"id": f"graphwalks_128k_and_shorter.parquet#{i}", "response":
                                         "Final Answer: [x]"}) + "\n" for i in range(4)))  # fmt: skip
    return {
        "mrcr": run_mrcr(MrcrSettings(data=str(FIXTURES / "mrcr" / "current"), predictions=str(mrcr),
                                      out=str(tmp_path / "mrcr.json"), samples=str(tmp_path / "mrcr.samples.jsonl")),
                         progress=False),
        "graphwalks": run_graphwalks(GraphwalksSettings(data=str(FIXTURES / "graphwalks"), predictions=str(walks),
                                                        out=str(tmp_path / "graphwalks.json"),
                                                        samples=str(tmp_path / "graphwalks.samples.jsonl")),
                                     progress=False),
    }  # fmt: skip


def test_report_prints_the_per_bin_tables_and_the_page_draws_the_curves(tmp_path):
    reports(tmp_path)
    table = compare([tmp_path / "mrcr.json"])
    assert "MRCR: mean grade by needles and o200k_base bin" in table and "4K-8K" in table and "<4K" in table
    assert "| needles |" in compare([tmp_path / "mrcr.json"], fmt="markdown")
    assert compare([tmp_path / "graphwalks.json"], fmt="csv").startswith("report,table,row,values")
    other = json.loads((tmp_path / "mrcr.json").read_text())
    other["model"]["spec"] = "another-model"
    (tmp_path / "other.json").write_text(json.dumps(other))
    both = compare([tmp_path / "mrcr.json", tmp_path / "other.json"], fmt="markdown")
    assert both.startswith("MRCR: mean grade by o200k_base bin\n| bin |") and "another-model" in both.splitlines()[1]
    assert [line.split(" | ")[0] for line in both.splitlines()[3:6]] == ["| <4K", "| 4K-8K", "| all"]
    page = write_html([tmp_path / "mrcr.json", tmp_path / "graphwalks.json"], [], tmp_path / "p.html").read_text()
    assert "MRCR mean grade by length" in page and "Graphwalks mean F1 by length" in page
    assert page.count("<svg") >= 2 and "2 needles" in page and "parents" in page
    samples = [tmp_path / "mrcr.samples.jsonl", tmp_path / "graphwalks.samples.jsonl"]
    browsed = write_html([tmp_path / "mrcr.json", tmp_path / "graphwalks.json"], samples, tmp_path / "s.html")
    text = browsed.read_text()  # the sample browser: each record by its group, its response and its gold answer
    assert "2needle/2needle_0.parquet#0" in text and "graphwalks_128k_and_shorter.parquet#3" in text
    assert "prefix_found" in text and "Final Answer: [x]" in text


@pytest.mark.parametrize("kind", ["mrcr", "graphwalks"])
def test_a_damaged_report_is_refused_alike_by_the_table_and_the_page(tmp_path, kind):
    report = reports(tmp_path)[kind]
    path = tmp_path / f"{kind}.json"
    broken = json.loads(json.dumps(report))
    first = next(iter(broken["results"]["needles" if kind == "mrcr" else "problem_types"].values()))
    next(iter(first["bins" if kind == "mrcr" else "buckets"].values()))["mean"] = "high"
    path.write_text(json.dumps(broken))
    table, page = outcome(lambda: compare([path])), outcome(lambda: write_html([path], [], tmp_path / "p.html"))
    assert table[0] == page[0] == "error" and "not a number or null" in table[1]

    @settings(EXAMPLES, max_examples=6)
    @given(st.data())
    def prop(data):
        path.write_text(json.dumps(draw_damage(data, report)))
        got = [outcome(lambda: compare([path], fmt="csv"))[0],
               outcome(lambda: write_html([path], [], tmp_path / "p.html"))[0]]  # fmt: skip
        if got[0] == "error":  # refused when read: refused by both
            assert set(got) == {"error"}, got

    prop()


@pytest.mark.parametrize("kind", ["mrcr", "graphwalks"])
def test_a_damaged_samples_line_is_shown_or_refused_in_one_line(tmp_path, kind):
    import hashlib

    report = reports(tmp_path)[kind]
    samples = tmp_path / f"{kind}.samples.jsonl"
    lines = samples.read_text().splitlines()

    @settings(EXAMPLES, max_examples=6)
    @given(st.data())
    def prop(data):
        n = data.draw(st.integers(0, len(lines) - 1), label="line")
        damaged = [json.dumps(draw_damage(data, json.loads(line))) if i == n else line for i, line in enumerate(lines)]
        samples.write_text("".join(line + "\n" for line in damaged))
        report["data"]["samples_sha256"] = hashlib.sha256(samples.read_bytes()).hexdigest()  # the run's own file
        (tmp_path / f"{kind}.json").write_text(json.dumps(report))
        outcome(lambda: write_html([tmp_path / f"{kind}.json"], [samples], tmp_path / "p.html"))

    prop()
