"""BABILong's generator, seeded, against BABILong's own classes (`TaskDataset`, `SentenceSampler`,
`NoiseInjectionDataset` driven as data/create_tasks.py drives them, with the same seeds, bAbI files, books and GPT-2
tokenizer: tests/fixtures/babilong/reference/generator.json), and its 0k instances against the published sets."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.errors import MegaevalError
from megaeval.tasks.babilong.generator import generate, read_babi
from megaeval.tasks.babilong.spec import load_babilong_task
from megaeval.tasks.babilong.tokenizer import length_tokenizer
from megaeval_testing import AUSTEN, REPO

FIXTURES = REPO / "tests" / "fixtures" / "babilong"
REFERENCE = json.loads((FIXTURES / "reference" / "generator.json").read_text())


@pytest.fixture(scope="module")
def gpt2():
    return length_tokenizer("gpt2")


@pytest.mark.parametrize("key", sorted(REFERENCE))
def test_instances_equal_babilongs_classes_given_the_same_seeds(gpt2, key):
    """Both decodings: transformers 5's (plain) and transformers 4.x's clean-up (what made the published sets)."""
    mode, shelf, babi, length, n, seed = key.split("/")
    books = ([(AUSTEN / name).read_text() for name in ("emma.txt", "persuasion.txt")] if shelf == "austen"
             else [(FIXTURES / "books" / "spaced.txt").read_text()])  # fmt: skip
    spec = load_babilong_task(babi.split("_")[0])
    got = generate(FIXTURES / "babi" / f"{babi}_test.txt", books, gpt2, int(length), int(n), int(seed), spec,
                   clean_up=mode == "clean")  # fmt: skip
    assert got == REFERENCE[key]


def test_the_two_decodings_differ_where_a_space_precedes_punctuation():
    """The reference tells them apart: on prose with spaces before its punctuation, and only there."""
    plain = {k.partition("/")[2]: v for k, v in REFERENCE.items() if k.startswith("plain/")}
    clean = {k.partition("/")[2]: v for k, v in REFERENCE.items() if k.startswith("clean/")}
    assert {k.split("/")[0] for k in plain if plain[k] != clean[k]} == {"spaced"}


def test_zero_k_is_the_questions_in_file_order_with_their_facts_joined_by_spaces(gpt2):
    babi = FIXTURES / "babi" / "qa1_single-supporting-fact_test.txt"
    got = generate(babi, [(AUSTEN / "emma.txt").read_text()], gpt2, 0, None, 42, load_babilong_task("qa1"))
    samples = read_babi(babi)
    assert [(g["question"], g["target"]) for g in got] == [(s.question, s.answer) for s in samples]
    assert all(g["input"] == " ".join(s.facts) for g, s in zip(got, samples, strict=True))
    # the published 0k set's first questions (from the official predictions of Phi-3-mini on RMT-team/babilong)
    published = FIXTURES / "predictions" / "microsoft" / "Phi-3-mini-128k-instruct"
    with open(published / "qa1_0k_instruction_yes_examples_yes_post_prompt_yes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["question"], r["target"]) for r in rows[: len(got)]] == [(g["question"], g["target"]) for g in got]


def test_read_babi_keeps_each_questions_facts_and_the_fact_limit():
    samples = read_babi(FIXTURES / "babi" / "qa2_two-supporting-facts_test.txt")
    assert [s.answer for s in samples] == ["kitchen", "office", "hallway", "hallway"]
    assert samples[1].facts[-1] == "John went to the hallway." and len(samples[1].facts) == 9  # earlier question out
    assert samples[3].facts == (
        "John picked up the milk there.",
        "John journeyed to the hallway.",
        "Mary travelled to the garden.",
        "John discarded the milk.",
        "John went to the bedroom.",
    )
    assert len(read_babi(FIXTURES / "babi" / "qa2_two-supporting-facts_test.txt", max_facts=6)) == 3


@pytest.mark.parametrize(("text", "message"), [
    ("2 Mary went home.\n", "line 1 does not start a story"),
    ("1 Mary went home.\nWhere is Mary?\tkitchen\t1\n", "line 2 is not a bAbI line"),
])  # fmt: skip
def test_a_bad_babi_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "qa1_single-supporting-fact_test.txt"
    path.write_text(text)
    with pytest.raises(MegaevalError, match=message):
        read_babi(path)


def test_prepare_only_writes_the_frozen_fixture_again(tmp_path):
    """`--prepare-only` in the sets' layout: the committed fixture (made by this command) again, byte for byte, with
    a manifest saying the shipped books stand in for PG-19."""
    out = tmp_path / "made"
    result = CliRunner().invoke(app, [
        "babilong", "--prepare-only", "--write-data", str(out), "--babi", str(FIXTURES / "babi"), "--background",
        str(AUSTEN), "--tasks", "qa1,qa2,qa3,qa4,qa5", "--lengths", "0k,1k,4k", "--num-samples", "2",
        "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    for path in (FIXTURES / "frozen").glob("qa*/*.json"):
        assert (out / path.parent.name / path.name).read_bytes() == path.read_bytes(), path
    manifest = json.loads((out / "babilong_data.json").read_text())
    assert manifest["seed"] == 42 and manifest["generator"]["commit"].startswith("7a6efee")
    assert manifest["background_note"] is None  # --background given
    assert json.loads((FIXTURES / "frozen" / "babilong_data.json").read_text())["babi_split"] == "test"
