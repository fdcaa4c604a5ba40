"""A tokenizer alone where only a tokenizer is needed (`load_tokenizer`, issue 46 C): a transformers tokenizer folder
(no weights, no config.json) and a sentencepiece .model file load as the tokenizers of the models that carry them;
given where a model is needed they are refused in one line that says what they are, naming the flag."""

from __future__ import annotations

import shutil

import pytest

from megaeval import MegaevalError, load_model
from megaeval.models import ASSETS, load_tokenizer, naming

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"


@pytest.fixture
def folder(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(ASSETS / "transformer-tiny" / name, tmp_path / name)
    return tmp_path


def test_a_tokenizer_folder_or_a_sentencepiece_file_is_a_tokenizer(folder):
    hf = load_tokenizer("embedded:transformer-tiny")
    for spec in (str(folder), f"hf:{folder}"):
        alone = load_tokenizer(spec)
        assert alone.encode(TEXT) == hf.encode(TEXT) and alone.encode_offsets(TEXT, True) == hf.encode_offsets(
            TEXT, True
        )
    sp = load_tokenizer("embedded:megalodon-tiny")
    model_file = ASSETS / "megalodon-tiny" / "tokenizer.model"
    for spec in (str(model_file), f"megalodon:{model_file}", f"rfa:{model_file}"):
        alone = load_tokenizer(spec)
        assert alone.encode(TEXT) == sp.encode(TEXT) and alone.sha256 == sp.sha256
    with pytest.raises(MegaevalError, match=r"^option\(s\) max_context do not apply to a tokenizer without a model"):
        load_tokenizer(str(folder), max_context=8)


def test_a_tokenizer_where_a_model_is_needed_is_one_line_naming_the_flag(folder):
    with pytest.raises(MegaevalError, match=r"^--evaluator .*: .* is a tokenizer without a model \(no weights\)"):
        with naming("--evaluator", str(folder)):
            load_model(str(folder))
    model_file = ASSETS / "megalodon-tiny" / "tokenizer.model"
    with pytest.raises(MegaevalError, match=r"^--tokenizer megalodon:.*: .* is a sentencepiece tokenizer file, but a "
                       r"megalodon checkpoint is a folder holding config\.json and consolidated\*\.pth"):  # fmt: skip
        with naming("--tokenizer", f"megalodon:{model_file}"):
            load_model(f"megalodon:{model_file}")
    with pytest.raises(MegaevalError, match=r"is a file, but a megalodon checkpoint is a folder"):
        load_tokenizer(f"megalodon:{folder / 'tokenizer.json'}")
