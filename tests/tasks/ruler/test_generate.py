"""RULER's generators against RULER itself: the records megaeval generates for a task, length and tokenizer equal,
byte for byte, those RULER's own prepare.py wrote (tests/fixtures/ruler/reference/<hf|sp|bpe>/, its seed, sample
count and inputs in ruler_reference.json there); and one line, not a hang, where RULER would loop for ever."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import math
import re
from pathlib import Path
from random import Random

import pytest

from megaeval.errors import MegaevalError
from megaeval.models import load_tokenizer
from megaeval.tasks.ruler import qa as ruler_qa
from megaeval.tasks.ruler.data import generate_instances
from megaeval.tasks.ruler.inputs import RulerInputs, token_counter
from megaeval.tasks.ruler.niah import AdjectiveNounWords, ruler_words
from megaeval.tasks.ruler.spec import load_ruler_task
from megaeval.tasks.ruler.words import cwe_words, generate_cwe, zeta
from megaeval_testing import REPO

FIXTURES = REPO / "tests" / "fixtures" / "ruler"
REFERENCE = FIXTURES / "reference"
# hf and sp share one vocabulary (the same counts); bpe, a byte-level BPE of 1,500 tokens, counts differently
TOKENIZERS = {"hf": "embedded:transformer-tiny", "sp": "embedded:megalodon-tiny",
              "bpe": str(FIXTURES / "tokenizer-bpe")}  # fmt: skip


@functools.cache
def counter(kind: str):
    """RULER's token count with the embedded transformers (hf) or sentencepiece (sp, RULER's "nemo") tokenizer, or
    the fixture's byte-level BPE (bpe, a transformers folder: RULER's "hf")."""
    return token_counter(load_tokenizer(TOKENIZERS[kind]))


def reference(kind: str, length: int, task: str) -> tuple[list[str], dict]:
    """RULER's records (one json line each) for a task at a length, and the settings RULER ran with."""
    settings = json.loads((REFERENCE / kind / "ruler_reference.json").read_text(encoding="utf-8"))
    with gzip.open(REFERENCE / kind / str(length) / task / "validation.jsonl.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines(), settings


def fixture_inputs() -> RulerInputs:
    return RulerInputs(qa_dir=FIXTURES / "inputs", english_words=[])  # RULER ran with an empty english_words.json


# cwe, fwe, qa_1, qa_2 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@pytest.mark.parametrize("task", ["cwe", "fwe", "qa_1", "qa_2"])
@pytest.mark.parametrize("length", [1024, 2048, 4096])
def test_word_and_qa_records_equal_rulers(kind, task, length):
    want, settings = reference(kind, length, task)
    records = generate_instances(load_ruler_task(task), counter(kind), length, settings["num_samples"],
                                 settings["seed"], fixture_inputs())  # fmt: skip
    assert [json.dumps(r) for r in records] == want


def test_zeta_is_scipys():
    special = pytest.importorskip("scipy.special")
    assert zeta(2.0) == float(special.zeta(2.0)) == math.pi**2 / 6  # RULER's alpha, bit for bit
    for s in (1.01, 1.1, 1.5, 2.5, 3.0, 4.0, 7.3, 10.0, 50.0):
        assert zeta(s) == pytest.approx(float(special.zeta(s)), rel=4e-16, abs=0)


def test_zeta_without_scipy():
    assert zeta(2.0) == math.pi**2 / 6
    assert zeta(4.0) == pytest.approx(math.pi**4 / 90, rel=1e-15, abs=0)
    assert zeta(3.0) == pytest.approx(1.2020569031595942, rel=1e-15, abs=0)  # Apery's constant
    with pytest.raises(ValueError):
        zeta(1.0)


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("task, name", [("qa_1", "squad.json"), ("qa_2", "hotpotqa.json")])
def test_missing_or_malformed_qa_files_get_one_line(tmp_path, task, name):
    spec, count = load_ruler_task(task), counter("sp")
    no_is_impossible = {"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": []}]}]}]}
    malformed = {"squad.json": json.dumps(no_is_impossible), "hotpotqa.json": json.dumps({"question": "q"})}
    for inputs, expected in [
        (RulerInputs(), f"{name}.*--qa-data"),
        (RulerInputs(qa_dir=tmp_path / "empty"), f"no {name}.*--qa-data"),
        (RulerInputs(qa_dir=write(tmp_path / "broken", name, "{")), f"{name} is not valid JSON"),
        (RulerInputs(qa_dir=write(tmp_path / "other", name, malformed[name])), f"{name} is not .* as RULER reads it"),
    ]:  # fmt: skip
        with pytest.raises(MegaevalError, match=expected) as excinfo:
            generate_instances(spec, count, 4096, 2, 42, inputs)
        one_line_error(excinfo)


@pytest.mark.parametrize("task, length, expected", [
    ("cwe", 128, "cwe cannot be generated at length 128: its template and 120 tokens"),
    ("fwe", 80, "fwe cannot be generated at length 80: RULER's vocabulary"),
    ("fwe", 110, "fwe cannot be generated at length 110: its template"),  # where RULER steps down for ever
    ("qa_1", 64, "qa_1 cannot be generated at length 64: its template"),
    ("qa_2", 512, "qa_2 cannot be generated at length 512: question 0's 10 documents"),  # the same draw for ever
])  # fmt: skip
def test_lengths_ruler_cannot_fill_get_one_line(task, length, expected):
    with pytest.raises(MegaevalError, match=expected) as excinfo:
        generate_instances(load_ruler_task(task), counter("sp"), length, 2, 42, fixture_inputs())
    assert "use a longer length" in one_line_error(excinfo)


def test_qa_refuses_more_samples_than_questions():
    with pytest.raises(MegaevalError, match=r"qa_1 asks for 1000 questions .* --num-samples") as excinfo:
        generate_instances(load_ruler_task("qa_1"), counter("sp"), 4096, 1000, 42, fixture_inputs())
    one_line_error(excinfo)


def test_cwe_past_wonderwords_needs_rulers_english_words():
    # one token per 45 characters makes RULER's search reach past wonderwords' words at 4K; few repeats keep it quick
    def count(text: str) -> int:
        return len(text) // 45

    spec = {**load_ruler_task("cwe"), "args": {"freq_cw": 2, "freq_ucw": 1, "num_cw": 10, "num_fewshot": 0}}
    with pytest.raises(MegaevalError, match=r"english_words\.json.*--english-words FILE") as excinfo:
        generate_cwe(spec, count, 4096, 1, 42, RulerInputs())
    one_line_error(excinfo)
    english = [f"word{i}" for i in range(40_000)]
    (record,) = generate_cwe(spec, count, 4096, 1, 42, RulerInputs(english_words=english))
    drawn = set(re.findall(r"\d+\. (word\d+)\b", record["input"]))
    assert len(drawn) > len(cwe_words(42)) and set(record["outputs"]) <= drawn


def test_qa_pre_samples_shift_the_questions_not_the_index():
    # RULER's --pre_samples (prepare.py's earlier chunks): sample i asks question i + pre_samples, numbered i
    want, settings = reference("sp", 4096, "qa_1")
    (record,) = ruler_qa.generate(load_ruler_task("qa_1"), counter("sp"), 4096, 1, settings["seed"], fixture_inputs(),
                                  pre_samples=1)  # fmt: skip
    assert record["index"] == 0 and record["outputs"] == json.loads(want[1])["outputs"]


# niah_*, vt --------------------------------------------------------------------------------------------------------

NIAH_VT = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
           "niah_multivalue", "niah_multiquery", "vt")  # fmt: skip
# One length per task and embedded tokenizer, for speed: every haystack (noise, needle, essay), both noise steps
# (below and from 4K), an essay too short for RULER's binary search (1K); `-m slow` runs every case RULER filled for
# them. Every case RULER filled for bpe runs by default (with its own counts, a second check of every haystack)
QUICK = {
    "hf": {"niah_single_1": 1024, "niah_single_2": 2048, "niah_single_3": 1024, "niah_multikey_1": 1024,
           "niah_multikey_2": 4096, "niah_multikey_3": 2048, "niah_multivalue": 1024, "niah_multiquery": 2048,
           "vt": 4096},
    "sp": {"niah_single_1": 4096, "niah_single_2": 1024, "niah_single_3": 2048, "niah_multikey_1": 2048,
           "niah_multikey_2": 1024, "niah_multikey_3": 4096, "niah_multivalue": 2048, "niah_multiquery": 4096,
           "vt": 1024},
}  # fmt: skip


@functools.cache
def essay_inputs() -> RulerInputs:
    """The essay RULER's reference runs read (as PaulGrahamEssays.json)."""
    return RulerInputs(essay_text=json.loads((FIXTURES / "inputs" / "essays.json").read_text(encoding="utf-8"))["text"])


def ruler_runs(kind: str) -> list[dict]:
    """How RULER's reference run for a tokenizer went, per (task, length): "status" ok, timeout or failed."""
    return json.loads((REFERENCE / kind / "ruler_reference.json").read_text(encoding="utf-8"))["runs"]


def ruler_filled(kind: str) -> list[tuple[str, int]]:
    """The (niah or vt task, length) pairs RULER's reference run filled for a tokenizer."""
    return [(r["task"], r["length"]) for r in ruler_runs(kind) if r["task"] in NIAH_VT and r["status"] == "ok"]


def assert_niah_vt_equal_rulers(kind: str, task: str, length: int) -> None:
    want, settings = reference(kind, length, task)
    records = generate_instances(load_ruler_task(task), counter(kind), length, settings["num_samples"],
                                 settings["seed"], essay_inputs())  # fmt: skip
    assert [json.dumps(r) for r in records] == want


@pytest.mark.parametrize("kind, task, length", [(k, t, n) for k, cases in QUICK.items() for t, n in cases.items()]
                         + [("bpe", t, n) for t, n in ruler_filled("bpe")])  # fmt: skip
def test_niah_and_vt_records_equal_rulers(kind, task, length):
    assert_niah_vt_equal_rulers(kind, task, length)


@pytest.mark.slow
@pytest.mark.parametrize("kind, task, length", [(k, t, n) for k in QUICK for t, n in ruler_filled(k)])
def test_niah_and_vt_records_equal_rulers_everywhere(kind, task, length):
    assert_niah_vt_equal_rulers(kind, task, length)


@pytest.mark.parametrize("kind, task, length", [
    ("hf", "niah_single_1", 200),  # the template and 128 tokens to generate alone are longer
    ("hf", "niah_multikey_3", 300),
    ("hf", "vt", 150),  # past the worked example, which fits its 500 tokens
    ("sp", "niah_multiquery", 1024),  # 500 essay words and four needles: RULER's reference run kept looping
])  # fmt: skip
def test_lengths_ruler_loops_forever_on_get_one_line(kind, task, length):
    pattern = rf"RULER's {task} does not fit in {length} tokens: .*RULER itself would loop forever"
    with pytest.raises(MegaevalError, match=pattern) as excinfo:
        generate_instances(load_ruler_task(task), counter(kind), length, 2, 42, essay_inputs())
    assert one_line_error(excinfo).endswith("use a longer length")


@pytest.mark.parametrize("kind, task, length", [(k, r["task"], r["length"]) for k in TOKENIZERS for r in ruler_runs(k)
                                                 if r["status"] != "ok"])  # fmt: skip
def test_what_rulers_reference_run_could_not_generate_gets_one_line(kind, task, length):
    # hf, sp: niah_multiquery at 1K; bpe (more tokens per word): every essay task at 1K. RULER kept looping on each
    inputs = essay_inputs() if task in NIAH_VT else fixture_inputs()
    with pytest.raises(MegaevalError, match=rf"\b{task}\b.* {length}\b") as excinfo:
        generate_instances(load_ruler_task(task), counter(kind), length, 2, 42, inputs)
    message = one_line_error(excinfo)
    assert message.endswith("use a longer length")
    assert task not in NIAH_VT or "RULER itself would loop forever" in message


@pytest.mark.parametrize("task, change, expected", [
    ("niah_multivalue", {"num_needle_v": 41}, "places at most 40 needles in an essay"),
    ("niah_single_1", {"num_needle_k": 8}, "cannot insert 8 items into its smallest haystack of 5"),
    ("vt", {"num_hops": 5}, r"vt \(its worked example\) cannot insert 6 items into its smallest haystack of 5"),
    ("vt", {"template": "{context} Memorize and track the chains."}, "first 20 characters"),
    # the worked example's search settles on 6 lines, its draw does not fit, and 1 line cannot take a chain
    ("vt", {"num_chains": 2}, r"vt \(its worked example\) cannot insert 5 items into its smallest haystack of 1 "
                              r".*worked example in 500 tokens at every length"),
])  # fmt: skip
def test_niah_and_vt_settings_ruler_cannot_run_get_one_line(task, change, expected):
    spec = copy.deepcopy(load_ruler_task(task))
    spec.update({k: v for k, v in change.items() if k == "template"})
    spec["args"].update({k: v for k, v in change.items() if k != "template"})
    with pytest.raises(MegaevalError, match=expected) as excinfo:
        generate_instances(spec, counter("sp"), 2048, 1, 42, essay_inputs())
    one_line_error(excinfo)


def test_word_keys_are_rulers_sorted_pairs_without_building_them():
    # adjectives that extend others with a hyphen sort between their pairs; duplicates and spaces as wonderwords has
    adjectives = ["blue", "blue-eyed", "ad hoc", "ad", "x-rated", "x", "old", "old-fashioned", "old-fashioned-ish",
                  "blue", "teeny-tiny"]  # fmt: skip
    nouns = ["eyed-cat", "cat", "dog", "a", "zebra", "arm-rest", "eyed", "fashioned", "rated", "Zulu", "c-clamp"]
    want = sorted({f"{adj}-{noun}" for adj in adjectives for noun in nouns})
    words = AdjectiveNounWords(adjectives, nouns)
    assert len(words) == len(want) and list(words) == want
    assert [Random(seed).choice(words) for seed in range(50)] == [Random(seed).choice(want) for seed in range(50)]


@pytest.mark.slow
def test_word_keys_equal_rulers_list():
    from wonderwords.random_word import _get_words_from_text_file

    nouns, adjectives = _get_words_from_text_file("nounlist.txt"), _get_words_from_text_file("adjectivelist.txt")
    want = sorted(set(f"{adj}-{noun}" for adj in adjectives for noun in nouns))  # niah.py's `words`
    assert list(ruler_words()) == want


@pytest.mark.parametrize("length, expected", [
    (400, "question 1's 10 documents are longer"),  # RULER's search fits 10: question 1 redraws the same for ever
    (600, "question 1 has 10 documents of its own, and RULER's retry steps down to 1"),  # searched 11: sample raises
])  # fmt: skip
def test_qa_question_whose_documents_never_fit_gets_one_line(tmp_path, length, expected):
    # RULER's search sizes the haystack on question 0 (short documents); question 1's own documents are long
    def question(q: int, words: int) -> dict:
        context = [[f"T{q}.{i}", [" ".join(["word"] * words) + "."]] for i in range(10)]
        return {"question": f"Q{q}?", "answer": "word", "context": context}

    write(tmp_path, "hotpotqa.json", json.dumps([question(0, 2), question(1, 200)]))
    with pytest.raises(MegaevalError, match=f"qa_2 cannot be generated at length {length}: {expected}") as excinfo:
        generate_instances(load_ruler_task("qa_2"), counter("sp"), length, 2, 42, RulerInputs(qa_dir=tmp_path))
    one_line_error(excinfo)
