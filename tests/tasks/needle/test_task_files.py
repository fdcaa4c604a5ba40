"""Needle task files and haystacks under hostile input: every broken field of a task file (shipped or from
--include-path) is one line naming the file and the field; sentences end at any Unicode terminal; a haystack too
short to place the asked depths is refused; the haystack is the largest that fits at every depth."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from megaeval.commands.needle import NeedleSettings
from megaeval.errors import MegaevalError
from megaeval.models import load_tokenizer
from megaeval.scoring.chat import select_template
from megaeval.scoring.requests import prompt_encoder
from megaeval.tasks.needle.haystack import book_words, split_sentences
from megaeval.tasks.needle.prompts import build_prompts, draw_needles, haystack_words, render, sample_rng
from megaeval.tasks.needle.spec import check_needle_spec, load_needle_task
from megaeval.tasks.specs import list_tasks

PASSKEY = load_needle_task("passkey")
NIAH = load_needle_task("niah_multikey_2")


def one_line_error(spec: dict, match: str) -> None:
    with pytest.raises(MegaevalError, match=match) as err:
        check_needle_spec(spec, "t.yaml")
    assert "\n" not in str(err.value) and "t.yaml" in str(err.value)


def changed(spec: dict, **fields) -> dict:
    spec = copy.deepcopy(spec)
    for key, value in fields.items():
        if value is KeyError:
            del spec[key]
        else:
            spec[key] = value
    return spec


@pytest.mark.parametrize("fields, match", [
    ({"needle": "The pass key is hidden. Remember it."}, r"`needle` lacks the placeholder \{key\}"),
    ({"needle": "The pass key is {key} and {value}."}, r"`needle` has the unknown placeholder \{value\}"),
    ({"needle": "The pass key is {key"}, r"`needle` is not a valid template"),
    ({"max_new_tokens": 0}, r"`max_new_tokens` is 0"),
    ({"max_new_tokens": "10"}, r"`max_new_tokens` is '10'"),
    ({"max_new_tokens": True}, r"`max_new_tokens` is True"),
    ({"filler": ""}, r"`filler` must be a non-empty text"),
    ({"question": KeyError}, r"`question` is missing"),
    ({"instruction": 5}, r"`instruction` must be a non-empty text"),
    ({"key_range": [50000, 1]}, r"`key_range` .*low <= high"),
    ({"key_range": "1-50000"}, r"`key_range` .*two integers"),
    ({"key_range": [7]}, r"`key_range` .*two integers"),
    ({"kind": "haystack"}, r"`kind` is 'haystack'"),
    ({"metric": "exact"}, r"`metric` is 'exact'"),
    ({"fillers": "x"}, r"`fillers` is not a field of a passkey task"),
])  # fmt: skip
def test_a_broken_passkey_field_is_one_line_naming_it(fields, match):
    one_line_error(changed(PASSKEY, **fields), match)


@pytest.mark.parametrize("fields, match", [
    ({"num_needle_k": 0}, r"`num_needle_k` is 0"),
    ({"num_needle_q": "2"}, r"`num_needle_q` is '2'"),
    ({"num_needle_v": 42}, r"more than RULER's 40 depths"),
    ({"template": "Find it. {query}"}, r"`template` lacks the placeholder \{context\}"),
    ({"template": "{context} {context} {query}"}, r"`template` must hold \{context\} exactly once"),
    ({"template": "{context} {question}"}, r"`template` has the unknown placeholder \{question\}"),
    ({"answer_prefix": " The {answer} is"}, r"`answer_prefix` has the unknown placeholder \{answer\}"),
    ({"needle": "The {key} is here."}, r"`needle` lacks the placeholder \{value\}"),
    ({"haystack": "books"}, r"`haystack` is 'books'"),
    ({"type_needle_v": "letters"}, r"`type_needle_v` is 'letters'"),
    ({"noise": None}, r"`noise` must be a non-empty text"),
])  # fmt: skip
def test_a_broken_ruler_field_is_one_line_naming_it(fields, match):
    one_line_error(changed(NIAH, **fields), match)


def test_every_shipped_task_file_passes_the_checks():
    for name in list_tasks("needle"):
        check_needle_spec(load_needle_task(name), name)


def write(folder, name: str, text: str):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")


def test_own_tasks_from_an_include_path_are_checked_like_the_shipped_ones(tmp_path):
    mine = tmp_path / "tasks"
    spec = {"include": "_ruler_niah.yaml", "haystack": "noise", "type_needle_k": "words", "type_needle_v": "numbers",
            "num_needle_k": 2}  # fmt: skip
    write(mine, "my_niah.yaml", yaml.safe_dump(spec))
    settings = NeedleSettings(tasks="my_niah,passkey", include_path=[str(mine)], lengths="1K")
    assert settings.task_names == ["my_niah", "passkey"]
    loaded = load_needle_task("my_niah", [str(mine)])
    assert loaded["num_needle_k"] == 2 and loaded["template"] == NIAH["template"]  # the shipped include merged in
    assert "my_niah" not in list_tasks("needle")  # only with --include-path
    write(mine, "passkey.yaml", "kind: passkey\n")
    with pytest.raises(MegaevalError, match=r"the task 'passkey' of .*passkey\.yaml is also defined by"):
        list_tasks("needle", [str(mine)])


@pytest.mark.parametrize("text, match", [
    ("- kind: passkey\n", r"is not a mapping"),
    ("kind: [passkey\n", r"is not valid YAML at line"),
    ("include: _missing.yaml\n", r"`include: _missing.yaml` names a file that does not exist"),
    ("include: ../x.yaml\n", r"must name a .yaml file \(no folders\)"),
    ("include: bad.yaml\n", r"includes itself again"),
    ("", r"is not a mapping"),
])  # fmt: skip
def test_a_task_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, text, match):
    write(tmp_path, "bad.yaml", text)
    with pytest.raises(MegaevalError, match=match) as err:
        load_needle_task("bad", [str(tmp_path)])
    assert "\n" not in str(err.value) and "bad.yaml" in str(err.value)


def test_sentences_end_at_unicode_terminals_and_line_breaks():
    assert split_sentences("我喜欢猫。你呢？好的！最后") == ["我喜欢猫。", "你呢？", "好的！", "最后"]
    assert split_sentences("यह एक वाक्य है। यह दूसरा है॥ तीसरा") == ["यह एक वाक्य है।", "यह दूसरा है॥", "तीसरा"]
    assert split_sentences("هل أنت هنا؟ نعم") == ["هل أنت هنا؟", "نعم"]
    assert split_sentences("no stop here\nnor here\n\nthe end") == ["no stop here", "nor here", "the end"]
    assert split_sentences("「行こう。」と言った。") == ["「行こう。」", "と言った。"]


def byte_encoder(text: str, prefix: str) -> tuple[np.ndarray, str, int]:
    whole = text + prefix
    return np.frombuffer(whole.encode(), np.uint8).astype(np.int32), whole, 0


def essay_task(tmp_path, book: str):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text(book, encoding="utf-8")
    spec = load_needle_task("niah_single_2")
    return spec, draw_needles(spec, sample_rng(1, "niah_single_2", 4096, 0)), book_words(str(tmp_path / "books"))


def test_a_chinese_book_places_each_depth_where_asked(tmp_path):
    spec, needles, words = essay_task(tmp_path, "今天天气很好。我们去公园散步吧！ " * 300)
    depths = [0, 25, 50, 75, 100]
    prompts = build_prompts(spec, needles, 4096, depths, 32, byte_encoder, words)
    at = [p.needle_char / len(p.text) for p in prompts]
    assert at == sorted(at) and len(set(at)) == len(depths)  # each depth its own place, deeper further in
    for d in depths:
        assert abs(render(spec, needles, prompts[0].haystack_units, d, words)[2] - d) <= 100 / 60


def test_a_book_without_sentence_ends_is_refused_rather_than_misplaced(tmp_path):
    spec, needles, words = essay_task(tmp_path, "一二三四五六七八九十 " * 500)
    with pytest.raises(MegaevalError, match=r"too few sentences to put the needle at depths 0% and 50%"):
        build_prompts(spec, needles, 4096, [0, 50, 100], 32, byte_encoder, words)
    with pytest.raises(MegaevalError, match=r"asked at depth 50% would sit at 0%"):
        build_prompts(spec, needles, 4096, [50], 32, byte_encoder, words)


@pytest.mark.parametrize("task, length", [("passkey", 256), ("passkey", 700), ("niah_single_1", 900),
                                          ("niah_multivalue", 1500)])  # fmt: skip
def test_the_haystack_is_the_largest_that_fits_at_every_depth(task, length):
    class Lm:
        tokenizer = load_tokenizer("embedded:megalodon-tiny")

    encode = prompt_encoder(Lm(), bos=False)
    spec = load_needle_task(task)
    words = haystack_words(spec, None)
    depths, new = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 10
    for sample in range(3):
        needles = draw_needles(spec, sample_rng(42, task, length, sample))
        prompts = build_prompts(spec, needles, length, depths, new, encode, words)
        units = prompts[0].haystack_units
        prefix = prompts[0].text[len(render(spec, needles, units, 0, words)[0]) :]
        tokens = [len(encode(render(spec, needles, units + 1, d, words)[0], prefix)[0]) for d in depths]
        assert max(len(p.ids) for p in prompts) <= length - new < max(tokens)  # one more unit is over the budget


def test_a_chat_template_that_does_not_render_is_one_line():
    class Lm:
        spec = "hf:tiny"
        tokenizer = load_tokenizer("embedded:transformer-tiny")

    Lm.tokenizer.tok.chat_template = "{% for m in messages %}{{ m.content }{% endfor %}"
    with pytest.raises(MegaevalError, match=r"the chat template 'default' cannot be rendered \(TemplateSyntaxError"):
        select_template(Lm(), "default")  # probed once when chosen, before any prompt


@pytest.mark.parametrize("flags, match", [
    ({"lengths": "1G"}, r"bad length '1G'"),
    ({"lengths": "4K,17M"}, r"--lengths 17M: needle prompts are built whole in memory, up to 16M"),
    ({"haystack": " "}, r"--haystack is empty"),
    ({"include_path": ["/no/such/folder"]}, r"--include-path /no/such/folder: no such folder"),
])  # fmt: skip
def test_impossible_needle_flags_are_one_line(flags, match):
    with pytest.raises(MegaevalError, match=match):
        NeedleSettings(**flags)
