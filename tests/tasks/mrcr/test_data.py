"""MRCR's records: both hub layouts read as the same records, the card's bins at their edges, the transcript a base
model reads, and a broken record refused in one line naming the file, row and field."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from megaeval.errors import MegaevalError
from megaeval.tasks.mrcr.data import data_files, read_records
from megaeval.tasks.mrcr.o200k import o200k
from megaeval.tasks.mrcr.prompts import plain_transcript
from megaeval.tasks.mrcr.results import ABOVE, BELOW, BINS, bin_high, bin_of, mrcr_results
from megaeval_testing import REPO

FIXTURES = REPO / "tests" / "fixtures" / "mrcr"


def test_both_layouts_hold_the_same_records():
    current, source = read_records(FIXTURES / "current", o200k())
    first, old = read_records(FIXTURES / "first_release", o200k())
    assert source["layout"] == "current" and old["layout"] == "first release"
    assert [r.id for r in current][:3] == [f"2needle/2needle_0.parquet#{i}" for i in range(3)]
    assert [r.id for r in first][:3] == [f"2needle.parquet#{i}" for i in range(3)]
    strip = [(r.needles, r.answer, r.random_string, r.prompt_tokens, r.answer_tokens) for r in current]
    assert strip == [(r.needles, r.answer, r.random_string, r.prompt_tokens, r.answer_tokens) for r in first]
    assert {r.needles for r in current} == {2, 4, 8} and any(bin_of(r.prompt_tokens) == "4K-8K" for r in current)
    one, _ = read_records(FIXTURES / "current", o200k(), needles=[4], limit=1)
    assert [r.id for r in one] == ["4needle/4needle_0.parquet#0"]


def test_counts_are_kept_by_the_files_checksum_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAEVAL_CACHE_DIR", str(tmp_path))
    first, source = read_records(FIXTURES / "current", o200k(), needles=[2])
    assert sorted(p.stem for p in (tmp_path / "mrcr_o200k").iterdir()) == [source["files"]["2needle/2needle_0.parquet"]]

    class Refuses:
        def count(self, text):
            raise AssertionError("counted again")

    again, _ = read_records(FIXTURES / "current", Refuses(), needles=[2])
    assert [(r.prompt_tokens, r.answer_tokens) for r in again] == [(r.prompt_tokens, r.answer_tokens) for r in first]


def test_the_cards_bins_at_their_edges():
    assert BINS == ("4K-8K", "8K-16K", "16K-32K", "32K-64K", "64K-128K", "128K-256K", "256K-512K", "512K-1M")
    assert [bin_of(n) for n in (4095, 4096, 8192, 8193, 16384, 524288, 524289, 1048576, 1048577)] == [
        BELOW, "4K-8K", "4K-8K", "8K-16K", "8K-16K", "256K-512K", "512K-1M", "512K-1M", ABOVE]  # fmt: skip
    assert bin_high("4K-8K") == 8192 and bin_high("512K-1M") == 1048576


def test_means_per_needle_count_and_bin():
    rows = [{"needles": 2, "bin": "4K-8K", "score": 1.0}, {"needles": 2, "bin": "4K-8K", "score": 0.5},
            {"needles": 2, "bin": "8K-16K", "score": 0.0}, {"needles": 8, "bin": "8K-16K", "score": 0.25}]  # fmt: skip
    res = mrcr_results(rows)
    assert res["needles"]["2"]["bins"] == {"4K-8K": {"mean": 0.75, "n": 2}, "8K-16K": {"mean": 0.0, "n": 1}}
    assert res["needles"]["2"]["mean"] == 0.5 and res["needles"]["8"]["mean"] == 0.25
    assert res["bins"]["8K-16K"] == {"mean": 0.125, "n": 2} and res["mean"] == 1.75 / 4 and res["n"] == 4


def test_a_base_model_reads_a_transcript_ending_with_the_assistant_cue():
    messages = [{"role": "user", "content": "write a poem"}, {"role": "assistant", "content": "A poem."},
                {"role": "user", "content": "Prepend x to the 1st poem."}]  # fmt: skip
    expected = "User: write a poem\n\nAssistant: A poem.\n\nUser: Prepend x to the 1st poem.\n\nAssistant:"
    assert plain_transcript(messages) == expected


def write(tmp_path, rows, name="2needle.parquet"):
    pd.DataFrame(rows).to_parquet(tmp_path / name, index=False)
    return tmp_path


GOOD = {"prompt": json.dumps([{"role": "user", "content": "hi"}]), "answer": "xyzA", "random_string_to_prepend": "xyz",
        "n_needles": 2}  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [
    ({"random_string_to_prepend": None}, r"2needle\.parquet row 1 has no random_string_to_prepend"),
    ({"prompt": json.dumps({"role": "user", "content": "hi"})}, r"row 1: prompt is dict, not a JSON list"),
    ({"prompt": "not json"}, r"row 1: prompt is not JSON"),
    ({"prompt": json.dumps([{"role": "user", "content": 3}])}, r"row 1: prompt message 0 is not a \{role, content\}"),
    ({"n_needles": 0}, r"row 1: n_needles is 0, not a count"),
    ({"answer": 5}, r"row 1: answer is int, not a text"),
])  # fmt: skip
def test_a_broken_record_is_refused_in_one_line(tmp_path, change, message):
    path = tmp_path / "2needle.jsonl"  # one file of records (JSON: any value in any field)
    path.write_text("".join(json.dumps(r) + "\n" for r in [GOOD, {**GOOD, **change}]))
    with pytest.raises(MegaevalError, match=message.replace("parquet", "jsonl")):
        read_records(path, o200k())


def test_a_folder_of_both_layouts_or_none_is_refused(tmp_path):
    write(tmp_path, [GOOD])
    (tmp_path / "2needle").mkdir()
    write(tmp_path / "2needle", [GOOD], "2needle_0.parquet")
    with pytest.raises(MegaevalError, match="holds files of two releases"):
        data_files(tmp_path)
    with pytest.raises(MegaevalError, match="holds no MRCR files"):
        data_files(REPO / "tests" / "fixtures" / "graphwalks")
