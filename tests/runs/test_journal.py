"""The resume journal: durable per-unit records, a cut last line tolerated, anything else refused by name."""

from __future__ import annotations

import json
import os

import pytest

from megaeval import MegaevalError
from megaeval.runs.journal import Journal, differences


def test_records_survive_a_reopen_and_a_cut_last_line(tmp_path):
    path = tmp_path / "r.json.partial.jsonl"
    journal = Journal(path, {"settings": {"a": 1}}, resume=False)
    journal.add(["qmsum", "id-1"], {"score": 0.1 + 0.2})
    journal.add(3, {"nll": [1.5, 2.25]})
    with open(path, "a") as f:
        f.write('{"unit": 4, "rec')  # what a kill during a write leaves
    journal.close()  # (a killed process's lock goes with it)
    again = Journal(path, {"settings": {"a": 1}}, resume=True)
    assert len(again) == 2 and ["qmsum", "id-1"] in again and 4 not in again
    assert again.get(["qmsum", "id-1"])["score"] == 0.1 + 0.2  # floats come back bit for bit
    assert len(path.read_text().splitlines()) == 3  # rewritten without the cut line
    again.finish()
    assert not path.exists()


def test_a_changed_run_is_refused_naming_each_difference(tmp_path):
    path = tmp_path / "j.jsonl"
    Journal(path, {"settings": {"lengths": [16, 32], "dtype": "float32"}, "tokens_sha256": "ab"}, resume=False).close()
    with pytest.raises(MegaevalError, match="pass --resume"):
        Journal(path, {"settings": {}}, resume=False)
    with pytest.raises(MegaevalError, match=r"settings.dtype: 'float32' then, 'float64' now; tokens_sha256: 'ab' then"):
        Journal(path, {"settings": {"lengths": [16, 32], "dtype": "float64"}, "tokens_sha256": "cd"}, resume=True)


def test_a_journal_in_use_is_refused_naming_its_process(tmp_path):
    path = tmp_path / "j.jsonl"
    first = Journal(path, {"settings": {"a": 1}}, resume=False)
    first.add(1, {"x": 1})
    in_use = rf"another megaeval run \(process {os.getpid()}\) is writing .*j\.jsonl"
    for resume in (False, True):
        with pytest.raises(MegaevalError, match=in_use):
            Journal(path, {"settings": {"a": 1}}, resume=resume)
    assert len(path.read_text().splitlines()) == 2  # untouched
    first.close()
    assert len(Journal(path, {"settings": {"a": 1}}, resume=True)) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]\n", "not a megaeval resume journal"),
        ('{"fingerprint": {}}\n{"record": {}}\n{"unit": 1, "record": {}}\n', "line 2 is not a unit record"),
        ('{"fingerprint": {}}\nnot json\n{"unit": 1, "record": {}}\n', "line 2 is not valid JSON"),
    ],
)
def test_a_damaged_journal_is_refused(tmp_path, content, message):
    path = tmp_path / "j.jsonl"
    path.write_text(content)
    with pytest.raises(MegaevalError, match=message):
        Journal(path, {}, resume=True)


def test_differences_walks_nested_settings():
    assert differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == (
        "a.c: 2 then, 3 now; d: None then, 4 now"
    )
    assert json.dumps(differences({"x": 1}, {"x": 1})) == '""'


def test_an_interrupt_says_how_far_the_run_got_and_what_resume_will_do(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal(path, {}, resume=False)
    journal.units = 3
    stop = KeyboardInterrupt()
    journal.abandon(stop)  # nothing finished: the journal goes, and the interrupt stays a bare one
    assert not path.exists() and stop.args == ()
    journal = Journal(path, {}, resume=False)
    journal.units = 3
    journal.add(0, {"x": 1})
    stop = KeyboardInterrupt()
    journal.abandon(stop)
    assert str(stop) == (f"interrupted after 1 of 3 units; run the same command with --resume to continue with the 2 "
                         f"left (the finished ones are kept in {path})")  # fmt: skip
    journal = Journal(path, {}, resume=True)
    journal.units = 2
    journal.add(1, {"x": 2})
    journal.abandon(stop := KeyboardInterrupt())
    assert str(stop).startswith("interrupted after 2 of 2 units; run the same command with --resume to write the")
