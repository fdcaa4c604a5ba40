"""The embedded model zoo: `embedded:NAME` specs, and each tiny model's held-out perplexity on Persuasion."""

from __future__ import annotations

import math

import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.models import DEFAULT_MODEL, embedded_models, parse_spec
from megaeval.scoring.windows import score_windows
from megaeval_testing import AUSTEN

FAMILIES = {"megalodon-tiny": "megalodon", "rfa-tiny": "rfa", "transformer-tiny": "hf", "mamba2-tiny": "recurrent"}
EXCERPT = 2048  # targets scored, from the first token of Persuasion (the book none of the models saw)
UNIFORM = 4096  # perplexity of a uniform guess over the shared 4,096-piece vocabulary


def needs(name: str) -> None:
    """Skip the models read with transformers' tokenizers without the hf extra."""
    if FAMILIES[name] in ("hf", "recurrent"):
        pytest.importorskip("transformers")


def test_the_zoo_is_the_four_tiny_models():
    assert embedded_models() == sorted(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_embedded_spec_resolves_to_its_family(name):
    family, path = parse_spec(f"embedded:{name}")
    assert family == FAMILIES[name] and path.name == name and path.is_dir()


def test_default_model_is_embedded_megalodon():
    assert parse_spec(None) == parse_spec("embedded:megalodon-tiny") == ("megalodon", DEFAULT_MODEL)


@pytest.mark.parametrize("spec", ["embedded:bogus", "embedded:", "embedded:../assets"])
def test_unknown_embedded_name_is_a_one_line_error(spec):
    with pytest.raises(MegaevalError) as err:
        parse_spec(spec)
    message = str(err.value)
    assert "\n" not in message and "unknown embedded model" in message
    assert all(f"embedded:{name}" in message for name in FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_embedded_model_loads_and_describes_itself(name):
    needs(name)
    lm = load_model(f"embedded:{name}")
    facts = lm.describe()
    assert facts["family"] == FAMILIES[name]
    assert 1_000_000 < facts["parameters"] < 2_000_000
    assert facts["tokenizer"]["vocab_size"] == UNIFORM
    assert (facts["tokenizer"]["bos_id"], facts["tokenizer"]["eos_id"]) == (1, 2)
    assert lm.max_context == (512 if name == "transformer-tiny" else None)


def heldout_ppl(name: str) -> float:
    lm = load_model(f"embedded:{name}")
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:20_000]
    ids = torch.tensor([[lm.tokenizer.bos_id, *lm.tokenizer.encode(text)][: EXCERPT + 1]])
    assert ids.shape[1] == EXCERPT + 1
    if lm.max_context is None:
        nll, _ = lm.score(ids[:, :-1], ids[:, 1:], lm.init_state(1))
    else:  # every target after the first window keeps at least 257 tokens of context
        nll = score_windows(lm, ids[:, :-1], ids[:, 1:], "sliding:256", lm.max_context)
    return math.exp(float(nll.double().mean()))


# Measured (float32, CPU, the first 2,048 targets): megalodon-tiny 84.5, rfa-tiny 98.9, transformer-tiny 76.8
# (sliding:256), mamba2-tiny 85.2; uniform is 4,096. The opening chapter is harder than the whole book (56-70, README).
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_heldout_perplexity_is_far_below_uniform(name):
    needs(name)
    assert heldout_ppl(name) < 400


def test_transformer_tokenizer_ids_equal_the_sentencepiece_ids():
    pytest.importorskip("transformers")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(DEFAULT_MODEL / "tokenizer.model"))
    hf = load_model("embedded:transformer-tiny").tokenizer
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:30_000]
    samples = [text, "  two  spaces,\ttabs\nand 12345 digits — naïve café ☃ 😀", "", " ", "   ", " lead", "x\n\n"]
    for sample in samples:
        assert hf.encode(sample) == sp.encode(sample), sample[:40]
    assert (hf.bos_id, hf.eos_id, hf.vocab_size) == (sp.bos_id(), sp.eos_id(), sp.get_piece_size())
    assert hf.decode(sp.encode(text[:2000])) == text[:2000]
