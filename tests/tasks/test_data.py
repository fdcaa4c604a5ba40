"""The shared data readers (`tasks.data`): what they read is checked, naming file and row, in every suite that reads
through them, and what they read is identified by the checksums of its files (a resume compares them)."""

from __future__ import annotations

import re
import shutil
import sys

import pytest

from megaeval.cli import main
from megaeval.cli import root as cli_root
from megaeval.errors import MegaevalError
from megaeval.tasks.data import load_split, read_documents
from megaeval_testing.parquet import break_utf8, damage_page, write_parquet

ROWS = [{"id": f"v{i}", "pid": f"v{i}_0", "input": f"Question {i}?\n\nThe document of question {i}.",
         "output": f"answer {i}"} for i in range(10)]  # fmt: skip


@pytest.mark.parametrize(("damage", "message"), [
    (damage_page, r"validation\.parquet rows 6-10 cannot be read: a damaged page \(.*\); re-export the data"),
    (lambda p: break_utf8(p, "The document of question 7"),
     r"validation\.parquet row 8: `input` holds bytes that are not UTF-8 \(invalid start byte\); convert the file"),
])  # fmt: skip
def test_a_damaged_parquet_split_is_one_line_through_the_command(monkeypatch, capsys, tmp_path, damage, message):
    (tmp_path / "data" / "qasper").mkdir(parents=True)
    damage(write_parquet(tmp_path / "data" / "qasper" / "validation.parquet", ROWS))
    argv = ["scrolls", "--predictions", tmp_path / "p.jsonl", "--data-dir", tmp_path / "data", "--tasks", "qasper",
            "--out", tmp_path / "r.json"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["megaeval", *map(str, argv)])
    monkeypatch.setattr(cli_root, "interrupt_on_sigterm", lambda: None)
    with pytest.raises(SystemExit) as exited:
        main()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exited.value.code == 2 and len(lines) == 1 and re.match(r"error: .*" + message, lines[0]), lines
    assert not (tmp_path / "r.json").exists()


def test_a_damaged_parquet_of_documents_is_one_line(tmp_path):
    path = damage_page(write_parquet(tmp_path / "books.parquet", [{"text": f"Book {i}. " * 20} for i in range(10)]))
    with pytest.raises(MegaevalError, match=r"books\.parquet rows 6-10 cannot be read: a damaged page"):
        read_documents([str(path)])


def test_a_split_from_the_hub_is_identified_by_the_checksums_of_its_files(monkeypatch, tmp_path):
    """`datasets`' fingerprint stays when a cached arrow file is replaced; the checksums in the source do not."""
    import datasets

    for name, rows in (("a", ROWS[:5]), ("b", ROWS[5:])):
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / name))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.load_from_disk(str(tmp_path / "a")))
    hub = {"name": "tau/scrolls", "config": "qasper"}
    rows, before = load_split("qasper", "validation", None, hub)
    (arrow,) = (tmp_path / "a").glob("*.arrow")
    shutil.copy(next((tmp_path / "b").glob("*.arrow")), arrow)
    rows_after, after = load_split("qasper", "validation", None, hub)
    assert rows[0]["id"] == "v0" and rows_after[0]["id"] == "v5"
    assert before["fingerprint"] == after["fingerprint"] and before["sha256"] != after["sha256"]
    assert set(after["sha256"]) == {arrow.name}
