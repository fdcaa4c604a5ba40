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
    samples = read_babi(babi)[:-1]  # TaskDataset.__len__ is one short: the last question is never drawn
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


NLTK381 = FIXTURES / "nltk381"
RECORDED = json.loads((NLTK381 / "reference.json").read_text())


def test_sentences_split_as_nltk_381_splits_them_whatever_nltk_is_installed():
    """Passages of a curly-quote book split by megaeval equal nltk 3.8.1's splits (recorded: nltk381/README.md);
    nltk 3.10.2 and later split most of them otherwise (after a closing curly quote or guillemet)."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    from megaeval.tasks.babilong.sentences import sentence_splitter

    book = (NLTK381 / "curly.txt").read_text()
    passages = [book[start : start + 3000] for start in range(0, len(book), 7919)]
    assert [sentence_splitter().tokenize(p) for p in passages] == RECORDED["sentences"]
    installed = [PunktSentenceTokenizer().tokenize(p) for p in passages]
    assert RECORDED["nltk"] == "3.8.1" and (installed != RECORDED["sentences"]) == needs_pinning()


def needs_pinning() -> bool:
    import nltk

    return tuple(int(x) for x in nltk.__version__.split(".")[:3]) >= (3, 10, 2)


@pytest.mark.parametrize("key", sorted(RECORDED["instances"]))
def test_instances_on_a_curly_quote_book_equal_babilongs_under_nltk_381(gpt2, key):
    babi, length, n, seed = key.split("/")
    spec = load_babilong_task(babi.split("_")[0])
    got = generate(FIXTURES / "babi" / f"{babi}_test.txt", [(NLTK381 / "curly.txt").read_text()], gpt2, int(length),
                   int(n), int(seed), spec)  # fmt: skip
    assert got == RECORDED["instances"][key]


@pytest.mark.parametrize(("book", "why"), [
    ("Mary went to the kitchen and " * 10_000 + "stayed.", "one sentence of 280,000 characters"),
    ("Mary went to the kitchen and then she went to the garden. John went home.", "two sentences"),
    (" ".join(["Mary left.", "John came."] * 20), "every sentence under ten tokens"),
])  # fmt: skip
def test_books_without_a_usable_sentence_are_refused_not_drawn_forever(gpt2, book, why):
    with pytest.raises(MegaevalError, match=r"the background books \(mine.txt\) gave no sentence BABILong can use"):
        generate(FIXTURES / "babi" / "qa1_single-supporting-fact_test.txt", [book], gpt2, 1000, 1, 42,
                 load_babilong_task("qa1"), source="mine.txt")  # fmt: skip


def test_the_published_100_sets_from_64k_hold_the_questions_at_test_100_idxs(gpt2):
    """qa1's positions start 1, 4, 10: the published 64k and 128k sets start with those questions (the official
    predictions of Phi-3-mini at 128k), and --prepare-only takes them there by default, file order below 64k."""
    from megaeval.tasks.babilong.generator import published_positions, question_positions

    assert published_positions()["qa1"][:3] == [1, 4, 10] and sorted(published_positions()) == list(TASKS5)
    questions = [(s.question, s.answer) for s in read_babi(FIXTURES / "babi" / "qa1_single-supporting-fact_test.txt")]
    with open(FIXTURES / "predictions" / "microsoft" / "Phi-3-mini-128k-instruct" /
              "qa1_128k_instruction_yes_examples_yes_post_prompt_yes.csv", newline="") as f:  # fmt: skip
        published = [(r["question"], r["target"]) for r in csv.DictReader(f)][:3]
    assert published == [questions[1], questions[4], questions[10]]
    assert question_positions("qa1", "64k", "test")[:3] == [1, 4, 10] and question_positions("qa2", "10M", "test")
    assert question_positions("qa1", "32k", "test") is None
    assert question_positions("qa1", "1M", "train") is None and question_positions("qa6", "1M", "test") is None
    # at positions: the fixture holds 15 questions, so positions past 13 are refused, the first three taken
    spec = load_babilong_task("qa1")
    got = generate(FIXTURES / "babi" / "qa1_single-supporting-fact_test.txt", [(AUSTEN / "emma.txt").read_text()],
                   gpt2, 0, None, 42, spec, positions=[1, 4, 10])  # fmt: skip
    assert [(g["question"], g["target"]) for g in got] == published
    with pytest.raises(MegaevalError, match="holds 15 questions, but the published positions go to 17"):
        generate(FIXTURES / "babi" / "qa1_single-supporting-fact_test.txt", ["x"], gpt2, 0, None, 42, spec,
                 positions=[1, 17])  # fmt: skip


TASKS5 = ("qa1", "qa2", "qa3", "qa4", "qa5")


def test_more_samples_than_the_file_gives_are_refused_and_the_manifest_counts_what_was_written(tmp_path):
    """15 questions: --num-samples 500 is refused in one line; without it, 14 instances (TaskDataset leaves out the
    last question), which the manifest records."""
    flags = ["babilong", "--prepare-only", "--babi", str(FIXTURES / "babi"), "--background", str(AUSTEN), "--tasks",
             "qa1", "--lengths", "0k", "--no-progress"]  # fmt: skip
    refused = CliRunner().invoke(app, [*flags, "--write-data", str(tmp_path / "a"), "--num-samples", "500"])
    assert refused.exit_code == 2 and "--num-samples 500: " in refused.output and "holds 15 questions; pass " \
        "--num-samples 15 or fewer" in " ".join(refused.output.split())  # fmt: skip
    assert not (tmp_path / "a").exists()
    made = CliRunner().invoke(app, [*flags, "--write-data", str(tmp_path / "b")])
    assert made.exit_code == 0, made.output
    manifest = json.loads((tmp_path / "b" / "babilong_data.json").read_text())
    assert manifest["sets"] == {"qa1": {"0k": {"instances": 14, "questions": "file order"}}}
    assert len(json.loads((tmp_path / "b" / "qa1" / "0k.json").read_text())) == 14


@pytest.mark.parametrize(("line", "empty"), [("3 Where is John?\t\t1", "answer"), ("3 \thallway\t1", "question")])
def test_a_babi_question_with_an_empty_answer_or_question_is_refused(tmp_path, line, empty):
    path = tmp_path / "qa1_single-supporting-fact_test.txt"
    path.write_text(f"1 Mary went home.\n2 John went to the hallway.\n{line}\n")
    with pytest.raises(MegaevalError, match=rf"line 3 has an empty {empty}"):
        read_babi(path)
