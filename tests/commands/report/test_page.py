"""`megaeval report --format html` (issue 36): the page's numbers are the reports' numbers, samples are matched to
their reports, bad input is one line; and in a real browser (headless Chromium, installed by `make test` when
missing) the page loads from disk with no script error, shows the tables, and its filter for wrong answers shows
exactly the wrong samples."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from megaeval import MegaevalError
from megaeval.commands.report.kinds import compare
from megaeval.commands.report.page import render_page, write_html
from megaeval.tables import format_value

REQUIRE_BROWSER = os.environ.get("MEGAEVAL_REQUIRE_BROWSER") == "1"  # `make test` installs Chromium and sets it


def base(command: str, spec: str, settings: dict, results: dict) -> dict:
    return {"schema_version": 1, "command": command, "settings": settings, "model": {"spec": spec, "weights_sha256":
            "ab" * 32}, "data": {"tokens_scored": 4096}, "environment": {"date": "2026-11-27T00:00:00+00:00",
            "megaeval": "0.1.0", "torch": "2.13.0", "git_revision": "c0ffee"}, "results": results}  # fmt: skip


@pytest.fixture
def runs(tmp_path) -> dict:
    """Two ppl-sweep reports, two academic reports with samples files (one right answer in three for the first
    run, two for the second), and a needle report."""
    paths = {}
    for name, ppls in (("mega", [30.0, 25.0, 21.0]), ("llama", [28.0, 26.0, 27.5])):
        rows = [{"context_length": 256 << i, "ppl": p, "nll_sum": 4096 * math.log(p), "bits_per_byte": 1.0 + i / 8}
                for i, p in enumerate(ppls)]  # fmt: skip
        curve = [{"context_length": 1024, "buckets": [{"start": 0, "end": 1, "mean_nll": 6.0},
                                                      {"start": 1, "end": 1024, "mean_nll": 5.0}]}]  # fmt: skip
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(base("ppl-sweep", f"megalodon:/{name}", {"lengths": [256, 512, 1024]},
                                               {"lengths": rows, "position_curve": curve})))  # fmt: skip
    for name, accs, err in (("a1", [1.0, 0.0, 0.0], 0.01), ("a2", [1.0, 1.0, 0.0], 0.01)):
        samples = tmp_path / f"{name}.jsonl"
        lines = [{"task": "arc_easy", "doc_id": i, "target": 1, "prediction": 1 if acc else 0, "acc": acc,
                  "acc_norm": acc, "prompt_head": f"Question {i}: which <b>is</b> it?", "prompt_tail": "Answer:"}
                 for i, acc in enumerate(accs)]  # fmt: skip
        samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
        results = {"arc_easy": {"metric": "acc", "acc": sum(accs) / 3, "acc_stderr": err, "n": 3}}
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(base("academic", f"hf:/{name}", {"samples": str(samples), "shots": 0},
                                               results)))  # fmt: skip
    cells = [{"length": n, "depth": d, "accuracy": a, "n": 1} for n, d, a in
             ((1024, 0, 1.0), (1024, 100, 0.0), (2048, 0, 0.5), (2048, 100, 1.0))]  # fmt: skip
    lengths = [{"length": 1024, "accuracy": 0.5, "n": 2}, {"length": 2048, "accuracy": 0.75, "n": 2}]
    paths["needle"] = tmp_path / "needle.json"
    paths["needle"].write_text(json.dumps(base("needle", "megalodon:/mega", {}, {
        "passkey": {"metric": "accuracy", "accuracy": 0.625, "n": 4, "cells": cells, "lengths": lengths},
        "average": 0.625})))  # fmt: skip
    return paths


class Tables(HTMLParser):
    """Every table's rows of cell texts, and every SVG point's (x, y)."""

    def __init__(self):
        super().__init__()
        self.tables, self.points, self.cell, self.in_script = [], [], None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = ""
        elif tag == "g" and attrs.get("class") == "point":
            self.points.append((int(attrs["data-x"]), float(attrs["data-y"])))

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def page_data(page: str) -> dict:
    """The page's sample data: its runs, and its samples as objects (the page holds rows of FIELDS' values)."""
    found = re.search(r'<script type="application/json" id="samples-data">(.*?)</script>', page, re.S)
    assert "<" not in found.group(1) and ">" not in found.group(1)  # every one escaped: no markup inside
    raw = json.loads(found.group(1))
    samples = [dict(zip(raw["fields"], row, strict=True)) for row in raw["samples"]]
    return {"runs": raw["runs"], "omitted": raw["omitted"],
            "samples": [{**s, "run": raw["runs"][s["run"]]} for s in samples]}  # fmt: skip


def test_the_page_holds_the_reports_numbers_and_the_samples(runs, tmp_path):
    order = ["mega", "llama", "a1", "a2", "needle"]
    out = write_html([runs[k] for k in order], [tmp_path / "a2.jsonl", tmp_path / "a1.jsonl"], tmp_path / "p.html")
    page = out.read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    parsed = Tables()
    parsed.feed(page)
    sweep = parsed.tables[0]
    reports = {k: json.loads(runs[k].read_text()) for k in order}
    for row, mega, llama in zip(sweep[1:], reports["mega"]["results"]["lengths"],
                                reports["llama"]["results"]["lengths"], strict=True):  # fmt: skip
        assert row[1:3] == [format_value(mega["ppl"]), format_value(llama["ppl"])]
    drawn = {(x, y) for x, y in parsed.points}
    for name in ("mega", "llama"):
        assert {(r["context_length"], r["ppl"]) for r in reports[name]["results"]["lengths"]} <= drawn
    academic = next(t for t in parsed.tables if t[0][0] == "task")
    assert academic[1][1:] == [f"{format_value(1 / 3)} ± 0.0100", f"{format_value(2 / 3)} ± 0.0100"]
    assert 'class="differs"' in page  # 2/3 vs 1/3 with stderr 0.01 each: highlighted
    assert page.count('class="cell"') == 4  # one needle heatmap, a cell per (length, depth)
    data = page_data(page)
    assert data["runs"] == ["mega", "llama", "a1", "a2", "mega #2"]  # the needle run: the same model
    samples = sorted((s["run"], s["id"], s["correct"]) for s in data["samples"])
    assert samples == [("a1", "0", True), ("a1", "1", False), ("a1", "2", False),
                       ("a2", "0", True), ("a2", "1", True), ("a2", "2", False)]  # fmt: skip
    assert data["samples"][0]["prompt_head"] == "Question 0: which <b>is</b> it?"  # data, never markup
    assert "<b>is</b>" not in page.split('id="samples-data"')[0]


def test_bad_inputs_are_one_line(runs, tmp_path):
    stray = tmp_path / "stray.jsonl"
    stray.write_text(json.dumps({"task": "arc_easy", "acc": 1.0}) + "\n")
    with pytest.raises(MegaevalError, match=r"samples file .*stray\.jsonl belongs to none of the given reports"):
        write_html([runs["a1"]], [stray], tmp_path / "p.html")
    (tmp_path / "a1.jsonl").write_text(json.dumps({"task": "boolq", "acc": 1.0}) + "\n")
    with pytest.raises(MegaevalError, match=r"a1\.jsonl line 1 is a sample of task 'boolq', which its report"):
        write_html([runs["a1"]], [tmp_path / "a1.jsonl"], tmp_path / "p.html")
    with pytest.raises(MegaevalError, match=r"--out .*p\.txt must end in \.html"):
        write_html([runs["mega"]], [], tmp_path / "p.txt")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(MegaevalError, match=r"broken\.json"):
        write_html([tmp_path / "broken.json"], [], tmp_path / "p.html")
    assert not (tmp_path / "p.html").exists()


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        if REQUIRE_BROWSER:
            pytest.fail("Chromium is missing although `make test` installs it: run `make browser`")
        pytest.skip("no Chromium (`make test` installs Debian's package)")
    return found


def browse(page: Path, *args: str, fragment: str = "") -> subprocess.CompletedProcess:
    """Headless Chromium on the page from disk, JavaScript on, its console on stderr."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
               "--user-data-dir=" + str(page.parent / "chromium-profile"), *args, page.as_uri() + fragment]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_real_browser_shows_the_tables_and_filters_the_wrong_answers(runs, tmp_path):
    order = ["mega", "llama", "a1", "a2", "needle"]
    page = write_html([runs[k] for k in order], [tmp_path / "a1.jsonl", tmp_path / "a2.jsonl"], tmp_path / "p.html")
    for fragment, expected in (("", 6), ("#result=wrong", 3), ("#result=wrong&run=a2", 1), ("#result=right", 3)):
        shown = browse(page, "--dump-dom", fragment=fragment)
        assert shown.returncode == 0, shown.stderr[-2000:]
        dom = shown.stdout
        assert 'data-ready="1"' in dom and "data-error" not in dom, dom[-2000:]
        assert not re.search(r"Uncaught|CONSOLE.*(Error|error)", shown.stderr), shown.stderr[-2000:]
        assert f'data-samples="{expected}"' in dom
        cards = re.findall(r'<div class="card (\w+)" data-run="([^"]+)"', dom)
        assert len(cards) == expected
        if "wrong" in fragment:
            assert {c for c, _ in cards} == {"wrong"}
        assert "<td>256</td>" in dom and f"<td>{format_value(30.0)}</td>" in dom  # the sweep table, drawn
    shot = tmp_path / "page.png"
    taken = browse(page, "--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_scrolls_samples_are_scored_on_their_tasks_headline_metric(tmp_path):
    from megaeval.commands.report.samples import browser_rows

    report = base(
        "scrolls",
        "m",
        {},
        {
            "qasper": {"metric": "f1", "f1": 50.0, "n": 2},
            "qmsum": {"metric": "geometric_rouge", "geometric_rouge": 20.0, "n": 1},
        },
    )
    lines = [{"task": "qasper", "id": "a", "scores": {"f1": 100.0, "exact_match": 100.0}},
             {"task": "qasper", "id": "b", "scores": {"f1": 50.0, "exact_match": 0.0}},
             {"task": "qmsum", "id": "c", "scores": {"rouge1": 40.0, "rouge2": 10.0, "rougeL": 20.0}}]  # fmt: skip
    rows = browser_rows(lines, report, "m", tmp_path / "s.jsonl")
    assert [(r["score"], r["correct"]) for r in rows[:2]] == [(1.0, True), (0.5, False)]
    assert rows[2]["score"] == pytest.approx((0.4 * 0.1 * 0.2) ** (1 / 3)) and rows[2]["correct"] is False


def test_ruler_and_longppl_reports_get_their_tables(tmp_path):
    ruler = base("ruler", "m", {}, {
        "tasks": {"niah_single_1": {"lengths": [{"length": 4096, "score": 100.0}, {"length": 8192, "score": 40.0}]},
                  "vt": {"lengths": [{"length": 4096, "score": 80.0}, {"length": 8192, "score": 20.0}]}},
        "lengths": [{"length": 4096, "average": 90.0}, {"length": 8192, "average": 30.0}], "average": 60.0,
        "wavg_inc": 50.0, "wavg_dec": 70.0, "threshold": 85.6, "effective_length": 4096})  # fmt: skip
    docs = [{"id": "d1", "longppl": 3.0, "ppl": 20.0, "n_key_tokens": 5, "n_tokens": 100},
            {"id": "d2", "longppl": None, "ppl": 30.0, "n_key_tokens": 0, "n_tokens": 50}]  # fmt: skip
    longppl = base("longppl", "m2", {}, {"documents": docs, "longppl": 3.0, "ppl": 23.0, "n_key_tokens": 5,
                                         "n_tokens": 150})  # fmt: skip
    for name, report in (("ruler", ruler), ("longppl", longppl)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    page = write_html([tmp_path / "ruler.json", tmp_path / "longppl.json"], [], tmp_path / "p.html").read_text()
    parsed = Tables()
    parsed.feed(page)
    grid, table = parsed.tables
    assert grid[1:] == [["niah_single_1", format_value(100.0), format_value(40.0)],
                        ["vt", format_value(80.0), format_value(20.0)],
                        ["average", format_value(90.0), format_value(30.0)]]  # fmt: skip
    assert "effective length 4K" in page
    assert table[1:] == [["d1", format_value(3.0), format_value(20.0)], ["d2", "", format_value(30.0)],
                         ["all (pooled)", format_value(3.0), format_value(23.0)]]  # fmt: skip


def test_a_large_samples_file_stays_a_page_of_a_few_megabytes(runs, tmp_path):
    """15,000 realistic samples (prompt ends of 300 characters holding markup, log-likelihoods, ids) all stay."""
    lines = [{"task": "arc_easy", "doc_id": f"ARC-Easy/test/Mercury_{7000000 + i}", "target": 1, "prediction": 0,
              "acc": float(i % 3 == 0), "acc_norm": 0.0, "loglikelihoods": [-12.3456789, -10.987654, -11.5, -13.25],
              "prompt_head": f"{i} <p>é" + "h" * 294, "prompt_tail": "t" * 297 + f" {i}"}
             for i in range(15_000)]  # fmt: skip
    (tmp_path / "a1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = write_html([runs["a1"]], [tmp_path / "a1.jsonl"], tmp_path / "p.html")
    assert page.stat().st_size < 5_000_000
    data = page_data(page.read_text())
    samples = data["samples"]
    assert len(samples) == 15_000 and data["omitted"] == 0 and sum(s["correct"] for s in samples) == 5_000
    assert all(
        s["prompt_head"].startswith(f"{i} <p>é") and s["prompt_tail"].endswith(f" {i}") for i, s in enumerate(samples)
    )


def test_long_ids_are_cut_and_stay_distinct_and_past_the_budget_a_subset_is_kept(runs, tmp_path):
    from megaeval.commands.report import samples as S

    lines = [{"task": "arc_easy", "doc_id": "x" * 20_000 + str(i), "target": 1, "prediction": 0, "acc": 1.0,
              "acc_norm": 1.0} for i in range(2_000)]  # fmt: skip
    (tmp_path / "a1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = write_html([runs["a1"]], [tmp_path / "a1.jsonl"], tmp_path / "p.html")
    assert page.stat().st_size < 1_000_000
    ids = [s["id"] for s in page_data(page.read_text())["samples"]]
    assert len(set(ids)) == 2_000 and max(map(len, ids)) == S.ID_CHARS
    # a budget that cutting text cannot meet: a fixed subset of the documents, the same in both runs, is kept
    rows = [{"run": run, "task": "t", "id": str(i), "length": None, "depth": None, "score": 1.0, "correct": True,
             **dict.fromkeys(S.TEXTS, "y" * 100)} for run in ("a", "b") for i in range(1_000)]  # fmt: skip
    kept, omitted = S.fit_page(rows, 50_000)
    assert 0 < len(kept) < 2_000 and omitted == 2_000 - len(kept)
    assert sum(map(S._size, kept)) <= 50_000
    assert {r["id"] for r in kept if r["run"] == "a"} == {r["id"] for r in kept if r["run"] == "b"}
    page = render_page([json.loads(runs["a1"].read_text())], ["a", "b"], kept, omitted)
    assert f"({omitted} more left out)" in page


def test_samples_are_tied_to_their_run_by_checksum(runs, tmp_path):
    """A report recording its samples file's sha256 takes that file under any name, and no other file under its
    name (another run's, beside it); one file given twice is refused; an id twice in one file stays two samples."""
    from megaeval.files import file_sha256

    report = json.loads(runs["a1"].read_text())
    report["data"]["samples_sha256"] = file_sha256(tmp_path / "a1.jsonl")
    runs["a1"].write_text(json.dumps(report))
    moved = tmp_path / "renamed.jsonl"
    shutil.copyfile(tmp_path / "a1.jsonl", moved)
    assert len(page_data(write_html([runs["a1"]], [moved], tmp_path / "p.html").read_text())["samples"]) == 3
    with pytest.raises(MegaevalError, match=r"renamed\.jsonl and .*a1\.jsonl both belong to report .*a1\.json"):
        write_html([runs["a1"]], [moved, tmp_path / "a1.jsonl"], tmp_path / "q.html")
    with pytest.raises(MegaevalError, match=r"a1\.jsonl and .*a1\.jsonl both belong"):
        write_html([runs["a1"], runs["a2"]], [tmp_path / "a1.jsonl", tmp_path / "a1.jsonl"], tmp_path / "q.html")
    shutil.copyfile(tmp_path / "a2.jsonl", tmp_path / "a1.jsonl")  # another run's file, under this run's name
    with pytest.raises(MegaevalError, match=r"a1\.jsonl is not the one the run of .*a1\.json wrote"):
        write_html([runs["a1"]], [tmp_path / "a1.jsonl"], tmp_path / "q.html")
    assert not (tmp_path / "q.html").exists()
    lines = [{"task": "arc_easy", "doc_id": 0, "acc": a, "acc_norm": a, "target": 1, "prediction": 1} for a in (1, 0)]
    (tmp_path / "a2.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    shown = page_data(write_html([runs["a2"]], [tmp_path / "a2.jsonl"], tmp_path / "p.html").read_text())
    assert [(s["id"], s["correct"]) for s in shown["samples"]] == [("0", True), ("0 #2", False)]


def test_an_academic_sample_shows_the_choice_of_each_metric(tmp_path):
    from megaeval.commands.report.samples import browser_rows

    report = base("academic", "m", {}, {"hellaswag": {"metric": "acc_norm", "acc": 0.0, "acc_norm": 0.5, "n": 2}})
    lines = [{"task": "hellaswag", "doc_id": 0, "target": 3, "prediction": 2, "acc": 0.0, "acc_norm": 1.0},
             {"task": "hellaswag", "doc_id": 1, "target": 3, "prediction": 2, "acc": 0.0, "acc_norm": 0.0}]  # fmt: skip
    rows = browser_rows(lines, report, "m", tmp_path / "s.jsonl")
    assert [(r["correct"], r["prediction"]) for r in rows] == [
        (True, "acc_norm: choice 3; acc: choice 2"),
        (False, "acc_norm: a choice other than 3; acc: choice 2"),
    ]


def test_a_longppl_id_twice_is_two_rows(tmp_path):
    docs = [{"id": "d.txt", "longppl": v, "ppl": 2 * v, "n_key_tokens": 1, "n_tokens": 10} for v in (3.0, 5.0)]
    report = base("longppl", "m", {}, {"documents": docs, "longppl": 4.0, "ppl": 8.0, "n_key_tokens": 2,
                                       "n_tokens": 20})  # fmt: skip
    (tmp_path / "l.json").write_text(json.dumps(report))
    parsed = Tables()
    parsed.feed(write_html([tmp_path / "l.json"], [], tmp_path / "p.html").read_text())
    assert [row[:2] for row in parsed.tables[0][1:]] == [["d.txt", "3.0000"], ["d.txt #2", "5.0000"],
                                                        ["all (pooled)", "4.0000"]]  # fmt: skip
    assert "d.txt #2,5.0000" in compare([tmp_path / "l.json"], fmt="csv")


HOSTILE = ["<!--<script>", "<!-- <script>alert(1)</script> -->", "</script><script>document.body.dataset.error='x'"
           "</script>", "<img src=x onerror=\"document.body.dataset.error='img'\">", "a\u2028b\u2029c", "nul\x00here",
           "]]>", "<![CDATA[", "x" * 1_000_000, "</SCRIPT >", "&lt;&amp;", "<scr<script>ipt>"]  # fmt: skip


def test_hostile_sample_texts_in_a_real_browser(runs, tmp_path):
    """Model outputs and documents hold HTML: in every field and id, the page shows every sample as text (one
    browser launch)."""
    lines = [{"task": "arc_easy", "doc_id": f"{k}{text[:50]}", "target": 1, "prediction": text, "acc": 1.0,
              "acc_norm": float(k % 2), "prompt_head": text, "prompt_tail": text[::-1]}
             for k, text in enumerate(HOSTILE)]  # fmt: skip
    (tmp_path / "a1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = write_html([runs["a1"]], [tmp_path / "a1.jsonl"], tmp_path / "p.html")
    samples = page_data(page.read_text())["samples"]
    assert [s["prompt_head"][:300] for s in samples] == [t[:300] for t in HOSTILE]
    shown = browse(page, "--dump-dom")
    assert shown.returncode == 0, shown.stderr[-2000:]
    dom = shown.stdout
    assert 'data-ready="1"' in dom and "data-error" not in dom, dom[-2000:]
    assert f'data-samples="{len(HOSTILE)}"' in dom and dom.count('<div class="card ') == len(HOSTILE)
    assert "<img" not in dom and "&lt;!--&lt;script&gt;" in dom
