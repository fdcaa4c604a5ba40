"""What RULER's generators read (megaeval.tasks.ruler.inputs): the shipped Punkt model splits as NLTK does, word
lists and the essay haystack as RULER reads them, one-line errors for bad input files, and RULER's token counts
(checked against the instances RULER's own prepare.py wrote, tests/fixtures/ruler/reference)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from megaeval.errors import MegaevalError
from megaeval.tasks.ruler import inputs as ri
from megaeval_testing import AUSTEN, REPO

FIXTURES = REPO / "tests" / "fixtures" / "ruler"
BUDGETS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}  # RULER's tokens_to_generate per kind
TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")  # fmt: skip
NOT_GENERATED = {("hf", 1024, "niah_multiquery"), ("sp", 1024, "niah_multiquery")}  # RULER loops for ever there
TRICKY = (
    'Mr. Darcy arrived at 5 p.m. on Tuesday. "Is it so?" said she. Dr. Jones, of St. Albans, wrote to the U.S. '
    "embassy... It was late! Mrs. Bennet replied that he had not. i.e. nothing happened. (See ch. 4.) End"
)


def test_sent_tokenize_equals_nltk_with_the_same_data():
    text = TRICKY + " " + (AUSTEN / "prideprejudice.txt").read_text(encoding="utf-8")[:120_000]
    env = dict(os.environ, NLTK_DATA=str(ri.nltk_data_dir()))
    script = "import json, sys; from nltk.tokenize import sent_tokenize as s; print(json.dumps(s(sys.stdin.read())))"
    out = subprocess.run([sys.executable, "-c", script], input=text, capture_output=True, text=True, env=env,
                         encoding="utf-8", check=True)  # fmt: skip
    expected = json.loads(out.stdout)
    assert len(expected) > 500
    assert ri.sent_tokenize(text) == expected


def test_sent_tokenize_leaves_nltk_search_path_alone():
    nltk = pytest.importorskip("nltk")
    before = list(nltk.data.path)
    assert ri.sent_tokenize("Mr. Smith left. He came back.") == ["Mr. Smith left.", "He came back."]
    assert nltk.data.path == before


def test_punkt_files_are_the_documented_ones():
    import hashlib

    folder = ri.nltk_data_dir() / "tokenizers" / "punkt_tab" / "english"
    readme = (folder / "README.md").read_text(encoding="utf-8")
    for name in ri.PUNKT_FILES:
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert f"| {name} | {(folder / name).stat().st_size} | {digest} |" in readme


def test_wonderwords_lists_as_ruler_reads_them():
    from wonderwords import random_word

    nouns = ri.wonderwords_words("nounlist.txt")
    assert nouns == random_word._get_words_from_text_file("nounlist.txt") and len(nouns) > 1000
    nouns.append("changed")
    assert ri.wonderwords_words("nounlist.txt")[-1] != "changed"  # a fresh list each call
    with pytest.raises(MegaevalError, match="no word list"):
        ri.wonderwords_words("no-such-list.txt")


def test_essay_words_split_as_ruler_splits():
    text = "  One\ttwo\n\nthree  four.\n"
    assert ri.essay_words(ri.RulerInputs(essay_text=text)) == re.sub(r"\s+", " ", text).split(" ")
    assert ri.essay_words(ri.RulerInputs(essay_text=text))[0] == ""  # RULER keeps the empty ends
    books = ri.essay_words(ri.RulerInputs())  # no essays: the books stand in
    assert len(books) > 500_000


def test_books_essay_text_joins_the_default_books_in_path_order():
    text = ri.books_essay_text()
    first = (AUSTEN / "emma.txt").read_text(encoding="utf-8")
    assert text.startswith(first + " ")
    assert text.endswith((AUSTEN / "sensesensibility.txt").read_text(encoding="utf-8"))
    assert ri.books_essay_text(AUSTEN) == text


def test_read_essays(tmp_path):
    good = tmp_path / "essays.json"
    good.write_text(json.dumps({"text": "Some text.\nMore."}), encoding="utf-8")
    assert ri.read_essays(good) == "Some text.\nMore."
    assert ri.read_essays(FIXTURES / "inputs" / "essays.json").startswith("PRIDE AND PREJUDICE")
    cases = {
        "missing.json": (None, "no such file"),
        "bad.json": ("{not json", "not valid JSON"),
        "list.json": ("[1, 2]", "no 'text' field"),
        "other.json": ('{"title": "x"}', "no 'text' field"),
        "number.json": ('{"text": 3}', "not a string"),
        "empty.json": ('{"text": "  "}', "empty"),
        "latin1.json": (b'{"text": "caf\xe9"}', "line 1 is not UTF-8 text"),
        "surrogate.json": ('{"text": "a\\ud800 b"}', "line 1 holds a lone surrogate"),
        "chinese.json": (json.dumps({"text": "一二三四五。" * 400}, ensure_ascii=False), "without a space"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content, encoding="utf-8")
        with pytest.raises(MegaevalError, match=message) as e:
            ri.read_essays(path)
        assert "\n" not in str(e.value) and str(e.value).startswith(f"--essays {path}")


def test_qa_json(tmp_path):
    inputs = ri.RulerInputs(qa_dir=FIXTURES / "inputs")
    assert len(ri.qa_json(inputs, "hotpotqa")) == 40
    assert ri.qa_json(inputs, "squad")["version"] == "v2.0"
    with pytest.raises(MegaevalError, match="qa_1 needs squad.json"):
        ri.qa_json(ri.RulerInputs(), "squad")
    with pytest.raises(MegaevalError, match="no hotpotqa.json.*hotpot_dev_distractor_v1.json"):
        ri.qa_json(ri.RulerInputs(qa_dir=tmp_path), "hotpotqa")
    (tmp_path / "squad.json").write_text("{", encoding="utf-8")
    with pytest.raises(MegaevalError, match="not valid JSON"):
        ri.qa_json(ri.RulerInputs(qa_dir=tmp_path), "squad")
    with pytest.raises(MegaevalError, match="unknown RULER QA dataset"):
        ri.qa_json(inputs, "nq")


def test_token_counter_of_another_tokenizer_counts_its_ids():
    class Bytes:
        def encode(self, text: str) -> list[int]:
            return list(text.encode("utf-8"))

    assert ri.token_counter(Bytes())("héllo") == 6


def reference_records(kind: str):
    for length in (1024, 2048, 4096):
        for task in TASKS:
            path = FIXTURES / "reference" / kind / str(length) / task / "validation.jsonl.gz"
            if (kind, length, task) in NOT_GENERATED:
                assert not path.exists()
                continue
            with gzip.open(path, "rt", encoding="utf-8") as f:
                records = [json.loads(line) for line in f]
            assert [r["index"] for r in records] == [0, 1] or task.startswith("niah")  # niah's index is a position
            yield task, records


@pytest.mark.parametrize("kind, spec", [("hf", "embedded:transformer-tiny"), ("sp", "embedded:megalodon-tiny")])
def test_token_counts_equal_rulers(kind, spec):
    """RULER's `length` is its token count of the prompt (input + answer prefix) plus the generation budget."""
    if kind == "hf":
        pytest.importorskip("transformers")
    from megaeval.models import load_tokenizer

    count = ri.token_counter(load_tokenizer(spec))
    seen = 0
    for task, records in reference_records(kind):
        for r in records:
            assert set(r) >= {"index", "input", "outputs", "length", "answer_prefix"}
            assert count(r["input"] + r["answer_prefix"]) + BUDGETS[task.split("_")[0]] == r["length"], task
            seen += 1
    assert seen == 2 * (3 * len(TASKS) - 1)
