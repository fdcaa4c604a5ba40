"""LongBench's inputs read strictly, data files and prediction files alike (issue 57 A6, A9, B, C): a prediction
line is checked by the rules of its record type, as a data record is, and what the official scripts would
miscount, crash on or score 0 is refused in one line naming the file and the line, exit 2, no report written;
`--tasks present` runs the tasks a folder holds; each version names the other's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.longbench import LongbenchSettings, run_longbench
from megaeval.tasks.longbench.data import read_v1, read_v2
from megaeval_testing import REPO

FIXTURES = REPO / "tests" / "fixtures" / "longbench"
V1, V2 = FIXTURES / "v1", FIXTURES / "v2" / "data.json"
DELETE = object()


def lines(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def v1_predictions(task: str, e: bool = False) -> list[dict]:
    """pred.py's lines of a model that answered every record right."""
    records = read_v1(str(V1), task, e)[0]
    return [{"pred": r["answers"][0], "answers": r["answers"], "all_classes": r["all_classes"],
             "length": r["length"]} for r in records]  # fmt: skip


def v2_predictions() -> list[dict]:
    """v2 pred.py's lines (the item, its context cut to 1,000 characters, the response, pred and judge): the first
    four right, the rest answered "A"."""
    out = []
    for i, item in enumerate(read_v2(str(V2))[0]):
        pred = item["answer"] if i < 4 else "A"
        out.append({**item, "context": item["context"][:1000], "response": f"The correct answer is ({pred})",
                    "pred": pred, "judge": pred == item["answer"]})  # fmt: skip
    return out


def command(tmp_path: Path, *flags: str):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["longbench", "--no-progress", "--out", str(out), *flags])
    return result, out


def refused(tmp_path: Path, message: str, *flags: str) -> str:
    result, out = command(tmp_path, *flags)
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and message in text, result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    return text


@pytest.mark.parametrize(("task", "line", "message"), [
    ("qasper", {"answers": []}, "line 2: `answers` is list '[]'; it must be a non-empty list of texts"),
    ("qasper", {"answers": [42]}, "line 2: `answers` is list '[42]'; it must be a non-empty list of texts"),
    ("trec", {"all_classes": "Animal"}, "line 2: `all_classes` is str 'Animal'; it must be null or a list of texts"),
    ("trec", {"all_classes": None}, "line 2: `all_classes` is None; the classification metric needs the task's"),
    ("passage_retrieval_en", {"answers": ["the third"]}, "line 2: the answer 'the third' names no paragraph"),
    ("qasper", {"pred": None}, "line 2: `pred` is NoneType 'None'; it must be text"),
    ("qasper", {"judge": True, "answers": DELETE}, "line 2 is a LongBench v2 prediction (judge, pred); pass it with "
                                                 "--version 2"),
])  # fmt: skip
def test_damaged_v1_prediction_lines_are_refused_naming_file_and_line(tmp_path, task, line, message):
    folder = tmp_path / "pred"
    folder.mkdir()
    rows = v1_predictions(task)
    rows[1] = {k: v for k, v in {**rows[1], **line}.items() if v is not DELETE}
    lines(folder / f"{task}.jsonl", rows)
    text = refused(tmp_path, message, "--predictions", str(folder))
    assert f"{task}.jsonl line 2" in text


def test_a_longbench_e_length_below_zero_is_refused(tmp_path):
    folder = tmp_path / "pred"
    folder.mkdir()
    rows = v1_predictions("qasper", e=True)
    lines(folder / "qasper.jsonl", rows)
    result, out = command(tmp_path, "--e", "--predictions", str(folder))
    assert result.exit_code == 0, result.output
    rows[0]["length"] = -9876  # once the 0-4k bucket's
    lines(folder / "qasper.jsonl", rows)
    out.unlink()
    refused(tmp_path, "qasper.jsonl line 1: `length` is int '-9876'; it must be a whole number of at least 0", "--e",
            "--predictions", str(folder))  # fmt: skip


@pytest.mark.parametrize(("judge", "shown"), [(2, "int '2'"), ("false", "str 'false'"), (None, "NoneType 'None'"),
                                              (float("nan"), "float 'nan'"), (1, "int '1'")])  # fmt: skip
def test_v2_damaged_judges_are_refused(tmp_path, judge, shown):
    rows = v2_predictions()
    path = lines(tmp_path / "v2.jsonl", rows)
    result, out = command(tmp_path, "--version", "2", "--predictions", str(path))
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["results"]["figures"]
    assert figures["overall"] == round(100 * sum(r["judge"] for r in rows) / len(rows), 1)  # result.py's figure
    out.unlink()
    rows[2]["judge"] = judge
    lines(path, rows)
    refused(tmp_path, f"v2.jsonl line 3: `judge` is {shown}; it must be true or false", "--version", "2",
            "--predictions", str(path))  # fmt: skip


def test_v2_a_repeated_line_is_refused(tmp_path):
    rows = v2_predictions()
    path = lines(tmp_path / "v2.jsonl", [*rows, rows[0]])
    refused(tmp_path, f"v2.jsonl line 9: the _id '{rows[0]['_id']}' was given before ({path} line 1)", "--version",
            "2", "--predictions", str(path))  # fmt: skip


@pytest.mark.parametrize(("task", "change", "message"), [
    ("trec", {"all_classes": None}, "trec.jsonl line 2: `all_classes` is None; the classification metric needs"),
    ("passage_retrieval_en", {"answers": ["none"]}, "passage_retrieval_en.jsonl line 2: the answer 'none' names no "
                                                    "paragraph"),
])  # fmt: skip
def test_data_a_metric_cannot_score_is_refused_before_the_model_loads(tmp_path, task, change, message):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [json.loads(line) for line in (V1 / "data" / f"{task}.jsonl").read_text().splitlines()]
    rows[1].update(change)
    lines(folder / f"{task}.jsonl", rows)
    # a model spec that cannot load: the refusal comes first, when the data is read
    refused(tmp_path, message, "--model", str(tmp_path / "no-model"), "--data", str(tmp_path), "--tasks", task)


@pytest.mark.parametrize(("flags", "message"), [
    (["--data", str(V2)], "is LongBench v2's data.json (its records hold choice_A .. choice_D); pass it with "
                          "--version 2"),
    (["--version", "2", "--data", str(V1)], "is LongBench v1's folder (2wikimqa, 2wikimqa_e, dureader"),
    (["--predictions", "V2PRED"], "is a LongBench v2 prediction file (its records hold choice_A .. choice_D); pass "
                                  "it with --version 2"),
    (["--version", "2", "--predictions", "V1PRED"], "is a folder of LongBench v1 prediction files (qasper); pass it "
                                                    "with --version 1"),
    (["--version", "2", "--protocol", "loglik", "--max-prompt-tokens", "100", "--data", str(V2)],
     "--max-prompt-tokens does not apply with --protocol loglik (it would be ignored); use it with --version 1 or "
     "--version 2 --protocol official"),
    (["--tasks", "present", "--data", "hub:"], "--tasks present names the tasks a --data folder holds"),
])  # fmt: skip
def test_the_other_versions_files_are_named_as_such(tmp_path, flags, message):
    v1 = tmp_path / "v1pred"
    v1.mkdir()
    lines(v1 / "qasper.jsonl", v1_predictions("qasper"))
    v2 = lines(tmp_path / "v2.jsonl", v2_predictions())
    flags = [{"V2PRED": str(v2), "V1PRED": str(v1)}.get(f, f) for f in flags]
    if "--data" in flags:
        flags += ["--model", str(tmp_path / "no-model")]
    refused(tmp_path, message, *flags)


def test_tasks_present_runs_the_tasks_a_folder_holds(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    for task in ("trec", "qasper", "qasper_e"):
        (folder / f"{task}.jsonl").write_text((V1 / "data" / f"{task}.jsonl").read_text())
    common = dict(model="embedded:megalodon-tiny", data=str(tmp_path), out=str(tmp_path / "r.json"))
    assert LongbenchSettings(tasks="present", **common).task_names == ["qasper", "trec"]  # in the suite's order
    assert LongbenchSettings(tasks="present", longbench_e=True, **common).task_names == ["qasper"]
    result, _ = command(tmp_path, "--model", str(tmp_path / "no-model"), "--data", str(tmp_path))
    assert result.exit_code == 2 and "--tasks present" in result.output  # the message names the way out
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(tmp_path, "holds no LongBench task file", "--tasks", "present", "--model", "x", "--data", str(empty))
    # --predictions: all is already what the folder holds; present says the same
    pred = tmp_path / "pred"
    pred.mkdir()
    lines(pred / "qasper.jsonl", v1_predictions("qasper"))
    report = run_longbench(LongbenchSettings(tasks="present", predictions=str(pred), out=str(tmp_path / "p.json")),
                           progress=False)  # fmt: skip
    assert list(report["results"]["tasks"]) == ["qasper"] and report["results"]["tasks"]["qasper"]["score"] == 100.0
