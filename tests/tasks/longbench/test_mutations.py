"""Property-based damage to LongBench's files (issue 57 A6, as issue 46 did for RULER and LongPPL): one line of a
v1 data file, a v2 item, a v1 prediction file (classification, retrieval and F1 tasks) or a v2 prediction file,
damaged at one drawn place (tests/helpers/megaeval_testing/mutation.py: a key deleted, a value of another JSON type),
gives the clean numbers or one line (a MegaevalError), never a traceback and never other numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaeval.commands.longbench import LongbenchSettings, run_longbench
from megaeval.tasks.longbench.data import read_v1, read_v2
from megaeval.tasks.longbench.spec import load_longbench_task
from megaeval_testing import REPO
from megaeval_testing.mutation import EXAMPLES, check, draw_damage

FIXTURES = REPO / "tests" / "fixtures" / "longbench"
V1, V2 = FIXTURES / "v1", FIXTURES / "v2" / "data.json"
READ = ("input", "context", "answers", "all_classes", "length")  # what a run takes of a v1 record
READ_V2 = ("_id", "domain", "sub_domain", "difficulty", "length", "question", "choice_A", "choice_B", "choice_C",
           "choice_D", "answer", "context")  # fmt: skip


def write(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def draw_line(data: st.DataObject, rows: list[dict]) -> list:
    """`rows` with one drawn row damaged at one drawn place."""
    n = data.draw(st.integers(0, len(rows) - 1), label="row")
    return [draw_damage(data, row) if i == n else row for i, row in enumerate(rows)]


@pytest.mark.parametrize("task", ["trec", "passage_retrieval_en", "qasper"])
def test_damaged_v1_data_lines(tmp_path, task):
    metric = load_longbench_task(task)["metric"]
    rows = [json.loads(line) for line in (V1 / "data" / f"{task}.jsonl").read_text().splitlines()]

    def taken() -> list[tuple]:
        return [tuple(json.dumps(r.get(k)) for k in READ) for r in read_v1(str(tmp_path), task, False, metric)[0]]

    write(tmp_path / f"{task}.jsonl", rows)
    expected = taken()

    @EXAMPLES
    @given(st.data())
    def damaged(data):
        write(tmp_path / f"{task}.jsonl", draw_line(data, rows))
        check(taken, expected)

    damaged()


def test_damaged_v2_items(tmp_path):
    items = json.loads(V2.read_text())
    path = tmp_path / "data.json"

    def taken() -> list[tuple]:
        return [tuple(x[k] for k in READ_V2) for x in read_v2(str(path))[0]]

    path.write_text(json.dumps(items))
    expected = taken()

    @EXAMPLES
    @given(st.data())
    def damaged(data):
        path.write_text(json.dumps(draw_line(data, items)))
        check(taken, expected)

    damaged()


@pytest.mark.parametrize(("tasks", "e"), [(("trec", "passage_retrieval_en", "qasper"), False), (("qasper",), True)])
def test_damaged_v1_prediction_lines(tmp_path, tasks, e):
    folder = tmp_path / "pred"
    folder.mkdir()
    rows = {}
    for task in tasks:  # every other prediction wrong, so a line counted twice or dropped changes the score
        rows[task] = [{"pred": r["answers"][0] if i % 2 else "no", "answers": r["answers"],
                       "all_classes": r["all_classes"], "length": r["length"]}
                      for i, r in enumerate(read_v1(str(V1), task, e)[0])]  # fmt: skip
        write(folder / f"{task}.jsonl", rows[task])
    settings = LongbenchSettings(predictions=str(folder), longbench_e=e, out=str(tmp_path / "r.json"))

    def scores() -> dict:
        out = run_longbench(settings, progress=False)["results"]
        return {"tasks": {t: (r["score"], r["n"], r.get("buckets")) for t, r in out["tasks"].items()},
                "board": out.get("leaderboard"), "buckets": out.get("buckets")}  # fmt: skip

    expected = scores()

    @EXAMPLES
    @given(st.data())
    def damaged(data):
        task = data.draw(st.sampled_from(tasks), label="task")
        write(folder / f"{task}.jsonl", draw_line(data, rows[task]))
        check(scores, expected)
        write(folder / f"{task}.jsonl", rows[task])

    damaged()


def test_damaged_v2_prediction_lines(tmp_path):
    rows = [{**x, "context": x["context"][:1000], "pred": "A", "judge": x["answer"] == "A"}
            for x in read_v2(str(V2))[0]]  # fmt: skip
    path = tmp_path / "v2.jsonl"
    settings = LongbenchSettings(version=2, predictions=str(path), out=str(tmp_path / "r.json"))

    def figures() -> tuple:
        res = run_longbench(settings, progress=False)["results"]
        return res["figures"], res["n"], res["answered"]

    write(path, rows)
    expected = figures()

    @EXAMPLES
    @given(st.data())
    def damaged(data):
        write(path, draw_line(data, rows))
        check(figures, expected)

    damaged()
