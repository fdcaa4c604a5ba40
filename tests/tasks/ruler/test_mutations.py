"""Property-based hostile inputs for RULER (issue 46 D): random damage to --data-dir records, to RULER task files (the
suite's own, loaded and damaged field by field, however deep in `args`), to QA files (squad.json and hotpotqa.json
shapes) and to essay files gives either the clean result or one line (a MegaevalError), quickly.

Damage is structural (tests/helpers/megaeval_testing/mutation.py: a key deleted, a value of another JSON type) or,
for files read as text, bytes spliced in anywhere: a byte that is not UTF-8, a lone surrogate escape, a run of text
without spaces. Instances are tiny: 1K tokens counted as words (a cheap stand-in for a tokenizer), one sample.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaeval.tasks.ruler.data import generate_instances, instances_path, read_instances
from megaeval.tasks.ruler.inputs import RulerInputs, read_essays
from megaeval.tasks.ruler.qa import load_qa
from megaeval.tasks.ruler.spec import check_ruler_spec, load_ruler_task
from megaeval_testing import REPO
from megaeval_testing.mutation import EXAMPLES, check, draw_damage, outcome

FIXTURES = REPO / "tests" / "fixtures" / "ruler"
LENGTH = 1024
SPLICES = [b"\xff", b"\xc3", b"\\ud800", b"\\udc00x", b"\x00", b'"']  # never valid text in a JSON string
NO_SPACES = "一二三四五六七八九十".encode() * 120  # valid text, but no essay RULER can cut into words


def words(text: str) -> int:
    """A cheap token count: white-space separated words."""
    return len(text.split())


def spliced(data: bytes, at: int, junk: bytes) -> bytes:
    return data[:at] + junk + data[at:]


def draw_splice(data: st.DataObject, raw: bytes, splices: list[bytes] = SPLICES) -> bytes:
    """`raw` with one of `splices` inserted at a drawn byte offset (never splitting a UTF-8 character)."""
    text = raw.decode("utf-8")
    at = len(text[: data.draw(st.integers(0, len(text)), label="at")].encode("utf-8"))
    return spliced(raw, at, data.draw(st.sampled_from(splices), label="junk"))


# --data-dir records ------------------------------------------------------------------------------------------------


def clean_records() -> list[dict]:
    spec = load_ruler_task("niah_single_1")
    return generate_instances(spec, words, LENGTH, 2, 42, RulerInputs())


def read_back(folder: Path, lines: bytes) -> list[tuple]:
    """What megaeval takes from the records (input, outputs, answer prefix, length), or one line."""
    path = instances_path(folder, LENGTH, "niah_single_1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lines)
    return [(r["input"], r["outputs"], r["answer_prefix"], r["length"])
            for r in read_instances(folder, LENGTH, "niah_single_1", 2)]  # fmt: skip


def test_damaged_data_dir_records(tmp_path):
    records = clean_records()
    expected = [(r["input"], r["outputs"], r["answer_prefix"], r["length"]) for r in records]
    lines = lambda rs: "".join(json.dumps(r) + "\n" for r in rs).encode()  # noqa: E731
    assert read_back(tmp_path, lines(records)) == expected

    @settings(EXAMPLES)
    @given(st.data())
    def damaged(data):
        check(lambda: read_back(tmp_path, lines(draw_damage(data, records))), expected)

    @settings(EXAMPLES, max_examples=8)
    @given(st.data())
    def spliced_in(data):
        check(lambda: read_back(tmp_path, draw_splice(data, lines(records))), expected)

    damaged()
    spliced_in()


@pytest.mark.parametrize("outputs", [[""], [" "], [], [7], [None], ["1", ""], "1"])
def test_records_that_give_full_credit_or_no_answer_are_refused(tmp_path, outputs):
    record = {**clean_records()[0], "outputs": outputs}
    kind, message = outcome(lambda: read_back(tmp_path, (json.dumps(record) + "\n").encode() * 2))
    assert kind == "error" and "`outputs`" in message


# RULER task files -----------------------------------------------------------------------------------------------


def qa_inputs() -> RulerInputs:
    return RulerInputs(qa_dir=FIXTURES / "inputs", english_words=[])


def records_of(spec: dict) -> list[dict]:
    """RULER's records for a (damaged) task definition, after the checks a task file gets when it is read."""
    check_ruler_spec(spec, "mine.yaml")
    return generate_instances(spec, words, LENGTH, 1, 42, qa_inputs())


@pytest.mark.parametrize("task", ["niah_single_1", "vt", "cwe", "fwe", "qa_1"])
def test_damaged_task_files(task):
    spec = load_ruler_task(task)
    expected = records_of(copy.deepcopy(spec))

    @settings(EXAMPLES, max_examples=8)
    @given(st.data())
    def damaged(data):
        bad = draw_damage(data, spec)
        started = time.perf_counter()
        check(lambda: records_of(bad), expected)
        assert time.perf_counter() - started < 10

    damaged()


# QA files (squad.json, hotpotqa.json) ------------------------------------------------------------------------------

SQUAD = {"version": "v2.0", "data": [
    {"title": "A", "paragraphs": [
        {"context": "Ann wrote the letter in May.", "qas": [
            {"id": "1", "question": "Who wrote the letter?", "answers": [{"text": "Ann", "answer_start": 0}],
             "is_impossible": False},
            {"id": "2", "question": "Who read it?", "answers": [], "is_impossible": True}]},
        {"context": "Bob read it in June.", "qas": [
            {"id": "3", "question": "When did Bob read it?", "answers": [{"text": "June", "answer_start": 16}],
             "is_impossible": False}]}]}]}  # fmt: skip
HOTPOTQA = [
    {"_id": "1", "question": "Who wrote it?", "answer": "Ann", "type": "bridge",
     "context": [["Ann", ["Ann wrote it. ", "In May."]], ["Bob", ["Bob read it."]]]},
    {"_id": "2", "question": "Who read it?", "answer": "Bob", "type": "bridge",
     "context": [["Bob", ["Bob read it."]], ["Cy", ["Cy slept."]]]},
]  # fmt: skip


def qa_of(folder: Path, dataset: str, raw: bytes) -> tuple:
    (folder / ("squad.json" if dataset == "squad" else "hotpotqa.json")).write_bytes(raw)
    qa = load_qa(dataset, RulerInputs(qa_dir=folder))
    return qa.questions, qa.docs


@pytest.mark.parametrize("dataset, value", [("squad", SQUAD), ("hotpotqa", HOTPOTQA)])
def test_damaged_qa_files(tmp_path, dataset, value):
    raw = json.dumps(value).encode()
    expected = qa_of(tmp_path, dataset, raw)
    assert all(q["outputs"] and all(isinstance(a, str) and a for a in q["outputs"]) for q in expected[0])

    @settings(EXAMPLES)
    @given(st.data())
    def damaged(data):
        bad = draw_damage(data, value)
        kind, got = outcome(lambda: qa_of(tmp_path, dataset, json.dumps(bad).encode()))
        if kind == "ok":  # what is read is what RULER reads, and what megaeval writes from it it can read back
            assert all(isinstance(q["query"], str) and q["query"].strip() for q in got[0])
            assert all(q["outputs"] and all(isinstance(a, str) and a.strip() for a in q["outputs"]) for q in got[0])

    @settings(EXAMPLES, max_examples=8)
    @given(st.data())
    def spliced_in(data):
        check(lambda: qa_of(tmp_path, dataset, draw_splice(data, raw)), expected)

    damaged()
    spliced_in()


# Essays ------------------------------------------------------------------------------------------------------------


def test_damaged_essays(tmp_path):
    path = tmp_path / "essays.json"
    raw = json.dumps({"text": "It was a bright cold day in April. The clocks were striking thirteen."}).encode()
    path.write_bytes(raw)
    expected = read_essays(path)

    def read(data: bytes) -> str:
        path.write_bytes(data)
        return read_essays(path)

    @settings(EXAMPLES)
    @given(st.data())
    def spliced_in(data):
        check(lambda: read(draw_splice(data, raw, [*SPLICES, NO_SPACES])), expected)

    @settings(EXAMPLES, max_examples=6)
    @given(st.data())
    def damaged(data):
        check(lambda: read(json.dumps(draw_damage(data, {"text": expected})).encode()), expected)

    spliced_in()
    damaged()
