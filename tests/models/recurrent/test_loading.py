"""The recurrent family end to end from a directory transformers wrote: routing (`hf:DIR` and a bare DIR), exact
logits against transformers' own one-pass forward from any split of calls, scoring, facts, the mamba_ssm layout,
torch-file weights, and one-line errors for weights that do not match."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from megaeval.errors import MegaevalError
from megaeval.models import load_model, load_tokenizer, parse_spec
from megaeval_testing.recurrent import MODEL_TYPES, float64_faithful, save_tiny, tiny_model
from megaeval_testing.shards import INDEX, shard_names, write_shards

SPLITS = [1, 5, 63, 2, 70, 9]  # 150 tokens: single tokens, odd sizes, across scan chunks and score chunks


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recurrent")
    return {kind: save_tiny(root / kind, kind) for kind in MODEL_TYPES}


def reference_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' one-pass forward (use_cache=False) in float64, its float32 casts lifted."""
    import transformers

    # loaded, then moved to float64: its buffers too (RecurrentGemma's rotary frequencies stay float32 otherwise)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).to(torch.float64).eval()
    with torch.no_grad(), float64_faithful():
        return model(input_ids=tokens, use_cache=False).logits


@pytest.mark.parametrize("kind", MODEL_TYPES)
def test_streamed_logits_equal_transformers_one_pass(saved: dict[str, Path], kind: str) -> None:
    folder = saved[kind]
    assert parse_spec(str(folder)) == ("recurrent", folder)
    assert parse_spec(f"hf:{folder}") == ("recurrent", folder)
    lm = load_model(f"hf:{folder}", dtype="float64")
    assert lm.family == "recurrent" and lm.max_context is None
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, lm.tokenizer.vocab_size, (2, sum(SPLITS)), generator=g)
    want = reference_logits(folder, tokens)
    state, parts, at = lm.init_state(2), [], 0
    sizes = []
    for n in SPLITS:
        logits, state = lm.forward(tokens[:, at : at + n], state)
        parts.append(logits)
        at += n
        sizes.append(state.nbytes())
    got = torch.cat(parts, 1)
    scale = want.abs().max()
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-8 * scale)
    assert len(set(sizes)) == 1  # RecurrentGemma's attention window is allocated whole from the start
    assert sizes[-1] == lm.state_bytes(2)


@pytest.mark.parametrize("kind", ["mamba", "falcon_mamba"])
def test_score_is_the_nll_of_forward(saved: dict[str, Path], kind: str) -> None:
    lm = load_model(saved[kind], dtype="float64")
    tokens = torch.randint(3, lm.tokenizer.vocab_size, (1, 90), generator=torch.Generator().manual_seed(2))
    logits, _ = lm.forward(tokens, lm.init_state(1))
    nll, _ = lm.score(tokens[:, :-1], tokens[:, 1:], lm.init_state(1))
    want = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:], reduction="none")
    torch.testing.assert_close(nll[0], want, rtol=1e-12, atol=1e-12)


def write_mamba_ssm(src: Path, out: Path, both_embeddings: bool = False) -> Path:
    """`src` (a transformers Mamba) in the original state-spaces layout: its config.json, pytorch_model.bin with
    `backbone.embedding`, no tokenizer; `both_embeddings`: transformers' name kept too (two names for one tensor)."""
    from safetensors.torch import load_file

    cfg = json.loads((src / "config.json").read_text())
    state = load_file(src / "model.safetensors")
    state["backbone.embedding.weight"] = state["backbone.embeddings.weight"]
    if not both_embeddings:
        del state["backbone.embeddings.weight"]
    out.mkdir()
    torch.save(state, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps({
        "d_model": cfg["hidden_size"], "n_layer": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
        "ssm_cfg": {"d_state": cfg["state_size"]}, "rms_norm": True, "residual_in_fp32": True,
        "fused_add_norm": True, "pad_vocab_size_multiple": 4, "tie_embeddings": True,
    }))  # fmt: skip
    return out


def test_mamba_ssm_layout_loads_the_same_model(saved: dict[str, Path], tmp_path: Path) -> None:
    """The original state-spaces layout: its config.json, pytorch_model.bin with `backbone.embedding`, no tokenizer."""
    src = saved["mamba"]
    out = write_mamba_ssm(src, tmp_path / "mamba_ssm")
    with pytest.raises(MegaevalError, match="ships no tokenizer"):
        load_model(out)
    lm = load_model(out, dtype="float64", tokenizer=str(src))
    assert lm.describe()["layout"] == "mamba_ssm"
    ref = load_model(src, dtype="float64")
    tokens = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(lm.forward(tokens, lm.init_state(1))[0], ref.forward(tokens, ref.init_state(1))[0])


def test_torch_file_weights_load_without_running_code(saved: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = shutil.copytree(saved["falcon_mamba"], tmp_path / "bin")
    torch.save(load_file(out / "model.safetensors"), out / "pytorch_model.bin")
    (out / "model.safetensors").unlink()
    lm = load_model(out, dtype="float64")
    ref = load_model(saved["falcon_mamba"], dtype="float64")
    tokens = torch.randint(3, 300, (1, 20), generator=torch.Generator().manual_seed(4))
    assert torch.equal(lm.forward(tokens, lm.init_state(1))[0], ref.forward(tokens, ref.init_state(1))[0])


def test_weights_that_do_not_match_the_config_fail_in_one_line(saved: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    out = shutil.copytree(saved["mamba"], tmp_path / "cut")
    state = load_file(out / "model.safetensors")
    del state["backbone.layers.1.mixer.D"]
    state["backbone.layers.0.mixer.dt_proj.bias"] = torch.zeros(3)
    save_file(state, out / "model.safetensors")
    with pytest.raises(MegaevalError) as err:
        load_model(out)
    text = str(err.value)
    assert "\n" not in text and "backbone.layers.1.mixer.D" in text and "dt_proj.bias [3]" in text


def test_hybrids_are_refused_naming_what_runs(saved: dict[str, Path], tmp_path: Path) -> None:
    out = shutil.copytree(saved["mamba"], tmp_path / "jamba")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "model_type": "jamba"}))
    with pytest.raises(MegaevalError, match="is a jamba model.*Mamba, FalconMamba, Mamba-2, RWKV-4 and RecurrentGemma"):
        load_model(f"hf:{out}")


def test_untied_output_layer_is_read(tmp_path: Path) -> None:
    """A checkpoint with its own lm_head: the loaded model's output layer is that tensor, not the embedding."""
    model = tiny_model("mamba", tie_word_embeddings=False)
    from megaeval_testing.hf_ranks import save_bpe_tokenizer

    save_bpe_tokenizer(tmp_path, vocab_size=300, chars=20_000)
    model.save_pretrained(tmp_path)
    lm = load_model(tmp_path, dtype="float64")
    torch.testing.assert_close(lm.model.lm_head.weight, model.lm_head.weight.double())
    assert not torch.equal(lm.model.lm_head.weight, lm.model.backbone.embeddings.weight)


@pytest.mark.parametrize("kind", MODEL_TYPES)
def test_facts_are_strict_json(saved: dict[str, Path], kind: str) -> None:
    """What reports record (Mamba-2's unbounded time_step_limit included) is plain JSON: no infinity, no NaN."""
    lm = load_model(saved[kind])
    facts = json.loads(json.dumps(lm.describe(), allow_nan=False))
    assert facts["family"] == "recurrent" and facts["max_context"] is None
    assert facts["state_bytes_per_sequence"] == lm.init_state(1).nbytes() > 0


def test_embedded_mamba2_equals_transformers_reading_of_it() -> None:
    """The embedded tiny Mamba-2 (trained with megaeval's code) read by transformers gives megaeval's logits."""
    import transformers

    from megaeval.models import ASSETS

    lm = load_model("embedded:mamba2-tiny", dtype="float64")
    text = "It was a truth universally acknowledged, said Anne, that a long walk in the rain was no hardship."
    tokens = torch.tensor([[lm.tokenizer.bos_id, *lm.tokenizer.encode(text)]])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(ASSETS / "mamba2-tiny").to(torch.float64).eval()
    with torch.no_grad(), float64_faithful():
        want = theirs(input_ids=tokens, use_cache=False).logits
    got, _ = lm.forward(tokens, lm.init_state(1))
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-8 * want.abs().max())


@pytest.mark.slow  # long: run with -m slow
def test_academic_and_scrolls_run_the_embedded_mamba2(tmp_path: Path) -> None:
    """The commands run a recurrent model unchanged: batched choices from a repeated state, carried-state decoding."""
    from typer.testing import CliRunner

    from megaeval.cli import app

    samples = Path(__file__).resolve().parents[3] / "data_prep" / "samples"
    runner = CliRunner()
    model = ["--model", "embedded:mamba2-tiny"]
    academic = runner.invoke(app, ["academic", *model, "--data-dir", str(samples), "--tasks", "arc_easy,hellaswag",
                                   "--limit", "3", "--out", str(tmp_path / "a.json")])  # fmt: skip
    assert academic.exit_code == 0, academic.output
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["model"]["family"] == "recurrent"
    for task in ("arc_easy", "hellaswag"):
        assert report["results"][task]["n"] == 3
    scrolls = runner.invoke(app, ["scrolls", *model, "--tasks", "qmsum", "--data-dir", str(samples / "scrolls"),
                                  "--limit", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "s.json"),
                                  "--samples", str(tmp_path / "s.jsonl")])  # fmt: skip
    assert scrolls.exit_code == 0, scrolls.output
    sample = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])
    assert isinstance(sample["prediction"], str)  # what 6 greedy tokens of a 1.2M-parameter model decode to
    assert json.loads((tmp_path / "s.json").read_text())["model"]["family"] == "recurrent"


def test_mamba_ssm_names_that_load_as_one_are_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    """backbone.embedding and backbone.embeddings both become the embedding: one would silently win."""
    out = write_mamba_ssm(saved["mamba"], tmp_path / "both", both_embeddings=True)
    with pytest.raises(MegaevalError) as err:
        load_model(out, tokenizer=str(saved["mamba"]))
    text = str(err.value)
    assert "\n" not in text and "pytorch_model.bin holds both backbone.embedding" in text
    assert "backbone.embedding.weight" in text and "which both load as backbone.embeddings.weight" in text


def sharded_copy(src: Path, out: Path, **changes) -> tuple[Path, dict[str, torch.Tensor]]:
    """A copy of `src` with its weights in two shards and an index (`changes`: see write_shards)."""
    from safetensors.torch import load_file

    shutil.copytree(src, out)
    state = load_file(out / "model.safetensors")
    write_shards(out, state, **changes)
    return out, state


def test_sharded_weights_load_as_their_index_says(saved: dict[str, Path], tmp_path: Path) -> None:
    out, _ = sharded_copy(saved["mamba"], tmp_path / "shards")
    lm, ref = load_model(out, dtype="float64"), load_model(saved["mamba"], dtype="float64")
    tokens = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(5))
    assert torch.equal(lm.forward(tokens, lm.init_state(1))[0], ref.forward(tokens, ref.init_state(1))[0])


def test_shards_that_disagree_with_their_index_are_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    """A stray copy in another shard, a tensor the index puts in the wrong shard, a shard holding a tensor the index
    does not list, a missing shard, a shard outside the folder: each one line naming the tensor and the files."""
    from safetensors.torch import load_file

    first, second = shard_names(2)
    key = min(load_file(saved["mamba"] / "model.safetensors"))  # the first name: write_shards puts it in `first`
    stray = {1: {key: torch.zeros(2)}}

    def refused(name: str, pattern: str, **changes) -> None:
        out, state = sharded_copy(saved["mamba"], tmp_path / name, **changes)
        with pytest.raises(MegaevalError, match=pattern) as err:
            load_model(out)
        assert "\n" not in str(err.value)

    refused("twice", rf"tensor {key} is stored twice, in .*/{first} and in .*/{second}", extra=stray)
    refused("moved", rf"{INDEX} puts tensor {key} in .*/{second}, which does not hold it \(it is in .*/{first}\)",
            weight_map={key: second})  # fmt: skip
    refused("unlisted", rf"{first} holds tensor {key}, which .*{INDEX} does not list", weight_map={key: None})
    refused("missing", r"shard\(s\) model-00003-of-00003\.safetensors named by .* are missing",
            weight_map={key: "model-00003-of-00003.safetensors"})  # fmt: skip
    refused("outside", r"puts .* in '\.\./elsewhere\.safetensors', which is not a file beside the index",
            weight_map={key: "../elsewhere.safetensors"})  # fmt: skip


def test_integer_weights_are_refused_as_quantized(saved: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    out = shutil.copytree(saved["mamba"], tmp_path / "int8")
    state = load_file(out / "model.safetensors")
    key = "backbone.layers.0.mixer.in_proj.weight"
    state[key] = (state[key] * 100).to(torch.int8)
    save_file(state, out / "model.safetensors")
    with pytest.raises(MegaevalError, match=rf"tensor {key} in .*model\.safetensors is int8, .*quantized checkpoints "
                       "are not supported"):  # fmt: skip
        load_model(out)


# ------------------------------------------------------------------------------------- tokenizers


def bare_copy(src: Path, out: Path) -> Path:
    """`src`'s config.json and weights alone: a checkpoint without its tokenizer files."""
    out.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src / name, out / name)
    return out


def test_a_checkpoint_without_tokenizer_files_is_refused_until_tokenizer_dir_names_them(saved, tmp_path) -> None:
    """transformers would build a 2-entry tokenizer from config.json alone, without a word."""
    out = bare_copy(saved["mamba"], tmp_path / "bare")
    where = re.escape(str(out))
    for load in (load_tokenizer, load_model):
        with pytest.raises(MegaevalError, match=rf"^{where} holds no tokenizer files \(expected one of tokenizer\.json,"
                           r".*\); pass --model-args tokenizer=DIR") as err:  # fmt: skip
            load(out)
        assert "\n" not in str(err.value)
    assert load_model(out, tokenizer=str(saved["mamba"])).tokenizer.vocab_size == 300


def test_a_tokenizer_without_a_vocabulary_is_refused(saved, tmp_path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    out = bare_copy(saved["mamba"], tmp_path / "config-only")
    where = re.escape(str(out))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPTNeoXTokenizer"}))
    with pytest.raises(MegaevalError, match=rf"^the tokenizer at {where} has only 2 entries, too few .*tokenizer=PATH"):
        load_tokenizer(out)
    nothing = Tokenizer(models.BPE(vocab={f"<x{i}>": i for i in range(20)}, merges=[]))  # no piece of English
    PreTrainedTokenizerFast(tokenizer_object=nothing).save_pretrained(out)
    with pytest.raises(MegaevalError, match=rf"^the tokenizer at {where} encodes ordinary text \('The .*\) to no"):
        load_model(out)


def test_the_tokenizer_option_names_a_folder(saved: dict[str, Path]) -> None:
    folder, path = saved["mamba"], re.escape(str(saved["mamba"]))
    with pytest.raises(MegaevalError, match="^option tokenizer= of recurrent models is empty; write tokenizer="):
        load_tokenizer(folder, tokenizer=" ")
    with pytest.raises(MegaevalError, match=rf"tokenizer={path}/tokenizer.json is a file, but recurrent models take "
                       rf"a folder of transformers tokenizer files; pass tokenizer={path}$"):  # fmt: skip
        load_tokenizer(folder, tokenizer=str(folder / "tokenizer.json"))
