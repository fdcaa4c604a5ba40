"""The BOS policy (`--bos auto|always|never`): the rule per tokenizer kind, the CLI, and what reports record."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from megaeval import MegaevalError
from megaeval.cli import app
from megaeval.commands.academic import AcademicSettings, run_academic
from megaeval.commands.scrolls import ScrollsSettings, run_scrolls
from megaeval.scoring.requests import bos_policy, resolve_bos
from megaeval.tokenizers import SentencePieceTokenizer
from megaeval_testing import AUSTEN, REPO

transformers = pytest.importorskip("transformers")

SAMPLES = REPO / "data_prep" / "samples"
TEXT = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:20_000]


def bpe(template: bool):
    """A byte-level BPE (GPT-2 style); with `template`, a post-processor that puts <s> first, as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator([para + "\n\n" for para in TEXT.split("\n\n")], trainer)  # learns "\n\n" at an end
    if template:
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tk


def fast(template: bool):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe(template), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def llama(add_bos_token: bool):
    model = json.loads(bpe(False).to_str())["model"]
    merges = [tuple(m) for m in model["merges"]]
    return transformers.LlamaTokenizer(vocab=model["vocab"], merges=merges, add_bos_token=add_bos_token)


def with_tokenizer(tok) -> SimpleNamespace:
    """Just what resolve_bos reads of a model: its tokenizer."""
    from megaeval.models.hf import HFTokenizer

    return SimpleNamespace(tokenizer=HFTokenizer(tok, "in memory"))


@pytest.mark.parametrize(
    ("make", "adds"),
    [
        (lambda: fast(template=True), True),  # its post-processor adds BOS: transformers users get it
        (lambda: fast(template=False), False),  # GPT-2 style: a BOS token exists but encoding never adds it
        (lambda: llama(add_bos_token=True), True),  # Llama 2's tokenizer_config
        (lambda: llama(add_bos_token=False), False),
    ],
)
def test_auto_follows_what_an_hf_tokenizer_does_by_itself(make, adds):
    tok = make()
    by_default = tok("It is a truth")["input_ids"]  # what transformers users and the harness's HFLM feed the model
    assert (by_default[0] == tok.bos_token_id) is adds  # the fixture is what it claims to be
    lm = with_tokenizer(tok)
    assert lm.tokenizer.adds_bos is adds and lm.tokenizer.describe()["adds_bos"] is adds
    assert resolve_bos(lm, "auto") is adds
    assert resolve_bos(lm, "always") is True and resolve_bos(lm, "never") is False


def test_sentencepiece_families_add_bos(sp_model):
    lm = SimpleNamespace(tokenizer=SentencePieceTokenizer(sp_model))  # MEGALODON's and RFA's tokenizer
    assert resolve_bos(lm, "auto") is True and resolve_bos(lm, "never") is False
    no_bos = SimpleNamespace(tokenizer=SimpleNamespace(bos_id=-1, adds_bos=True))  # a model trained without BOS
    assert resolve_bos(no_bos, "auto") is False
    with pytest.raises(MegaevalError, match="the model's tokenizer has no BOS token"):
        resolve_bos(no_bos, "always")


def test_policy_values():
    assert [bos_policy(v) for v in ("auto", "always", "never", True, False)] == [
        "auto", "always", "never", "always", "never"]  # fmt: skip
    with pytest.raises(MegaevalError, match="unknown --bos 'yes'; use one of: auto, always, never"):
        bos_policy("yes")
    assert AcademicSettings(bos=False).bos == "never" and ScrollsSettings(bos=True).bos == "always"


runner = CliRunner()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["academic", "--bos", "maybe"], "error: unknown --bos 'maybe'"),
        (["scrolls", "--bos", "sometimes"], "error: unknown --bos 'sometimes'"),
        (["academic", "--no-bos", "--bos", "always"], "error: --no-bos contradicts --bos always"),
    ],
)
def test_cli_bos_errors_are_one_line(argv, message):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_cli_no_bos_is_never(tmp_path):
    out = tmp_path / "r.json"
    argv = ["academic", "--tasks", "arc_easy", "--limit", "1", "--data-dir", str(SAMPLES), "--no-bos",
            "--out", str(out), "--no-progress"]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.stderr
    settings = json.loads(out.read_text())["settings"]
    assert settings["bos"] == "never" and settings["bos_effective"] is False


@pytest.fixture(scope="module")
def gpt2_style_llama(tmp_path_factory):
    """A tiny random Llama whose tokenizer (GPT-2 style) has a BOS token but never adds it."""
    folder = tmp_path_factory.mktemp("gpt2-style")
    tok = fast(template=False)
    tok.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine: a second thread costs more than it brings
    yield
    torch.set_num_threads(before)


def test_reports_record_the_effective_policy_and_auto_means_it(gpt2_style_llama, tmp_path, one_thread):
    base = dict(model=f"hf:{gpt2_style_llama}", tasks="arc_easy,boolq", data_dir=str(SAMPLES), limit=2)
    reports = {}
    for bos in ("auto", "never", "always"):
        settings = AcademicSettings(**base, bos=bos, out=str(tmp_path / f"{bos}.json"),
                                    samples=str(tmp_path / f"{bos}.jsonl"))  # fmt: skip
        reports[bos] = run_academic(settings, progress=False)
        assert reports[bos]["settings"]["bos"] == bos
        assert reports[bos]["settings"]["bos_effective"] is (bos == "always")
        assert {t["bos"] for t in reports[bos]["settings"]["per_task"].values()} == {bos == "always"}
    lines = {b: (tmp_path / f"{b}.jsonl").read_text().splitlines() for b in reports}
    assert lines["auto"] == lines["never"] != lines["always"]  # auto read exactly what never read
    scrolls = ScrollsSettings(model=f"hf:{gpt2_style_llama}", tasks="qmsum", data_dir=str(SAMPLES / "scrolls"),
                              limit=1, shots=0, max_new_tokens=2, out=str(tmp_path / "s.json"))  # fmt: skip
    report = run_scrolls(scrolls, progress=False)
    assert report["settings"]["bos"] == "auto" and report["settings"]["bos_effective"] is False


def test_a_byte_level_bpe_still_reads_the_few_shot_block_once(gpt2_style_llama, one_thread):
    """GPT-2-style BPE encodes the block's closing "\\n\\n" as one token alone but as two before a question, so the
    block is read up to where the questions' own tokens agree with it (reading it whole would never be reused)."""
    from megaeval import load_model
    from megaeval.scoring.requests import encode_pair, score_requests
    from megaeval.tasks.academic.evaluate import FewshotCache, evaluate_choices
    from megaeval.tasks.academic.prepare import prepare_academic_task

    lm = load_model(f"hf:{gpt2_style_llama}", dtype="float64")
    p = prepare_academic_task(AcademicSettings(tasks="mmlu", data_dir=str(SAMPLES)), "mmlu", {})
    docs = [d for d in p.docs if d.group == p.docs[0].group]
    block, context = lm.tokenizer.encode(docs[0].fewshot), lm.tokenizer.encode(docs[0].contexts[0])
    assert context[: len(block)] != block  # the premise
    cache = FewshotCache()
    records = [evaluate_choices(lm, p, d, "auto", cache) for d in docs]
    for doc, record in zip(docs, records, strict=True):
        pairs = [encode_pair(lm, doc.contexts[0], c) for c in doc.continuations]
        alone = score_requests(lm, pairs[0][0], [c for _, c in pairs])  # no few-shot state at all
        assert record["loglikelihoods"] == pytest.approx(alone.loglikelihoods, rel=0, abs=1e-9)
    question = len(lm.tokenizer.encode(docs[1].contexts[0])) - len(block)
    assert records[1]["forward_tokens"] <= question + 2  # the second question reads only itself (and " A")
