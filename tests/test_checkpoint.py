"""The official checkpoint layout: loading, model-parallel shards, tokenizer rules, bad input."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.models.megalodon.checkpoint import SHARD_RULES, shard_dim
from megaeval.tokenizers import SentencePieceTokenizer
from megaeval_testing import VOCAB, random_model, small_args

TOKENS = torch.randint(0, VOCAB, (2, 45), generator=torch.Generator().manual_seed(0))


def logits_of(path, dtype="float32", **options):
    lm = load_model(str(path), dtype=dtype, **options)
    return lm.forward(TOKENS, lm.init_state(2))[0]


def test_loaded_checkpoint_reproduces_the_saved_model(make_checkpoint):
    path = make_checkpoint(seed=3)
    model = random_model(None, 3, torch.float32).double()  # the fp32 weights, computed in float64
    hidden, _ = model(TOKENS, model.init_state(2))
    torch.testing.assert_close(logits_of(path, dtype="float64"), model.logits(hidden), rtol=0, atol=1e-12)


@pytest.mark.parametrize("shards", [2, 4])
def test_model_parallel_shards_give_identical_logits(make_checkpoint, shards):
    args = small_args(num_heads=4, z_dim=16, norm_num_groups=4)
    one = make_checkpoint(args, seed=1, name="one")
    many = make_checkpoint(args, seed=1, shards=shards, name="many")
    assert sorted(p.name for p in many.glob("*.pth")) == [f"consolidated.{r:02d}.pth" for r in range(shards)]
    part = torch.load(many / "consolidated.01.pth", weights_only=True)
    assert part["embed.weight"].shape[1] == args.model_dim // shards  # really split
    assert part["layers.0.mega.wv.weight"].shape[0] == args.value_dim // shards
    assert torch.equal(logits_of(one), logits_of(many))


def test_every_state_dict_key_has_a_shard_rule():
    model = random_model(small_args(rescale_nffn=True, swiglu=True), 0)
    for key in model.state_dict():
        shard_dim(key)  # raises for a key with no rule
    assert len(SHARD_RULES) == 12


def test_bf16_checkpoint_loads_as_float32(make_checkpoint):
    path = make_checkpoint(dtype="bf16")
    lm = load_model(str(path), dtype="float32")
    assert lm.describe()["stored_dtype"] == "bf16"
    w = lm.model.layers[0].mega.wv.weight
    assert w.dtype == torch.float32 and torch.equal(w, w.bfloat16().float())


def test_share_emb_checkpoint_without_output_weight(make_checkpoint):
    path = make_checkpoint(small_args(share_emb=True))
    state = torch.load(path / "consolidated.pth", weights_only=True)
    state.pop("output.output.weight")
    state["rope.freqs"] = torch.ones(2)  # present in official checkpoints; recomputed, so ignored
    torch.save(state, path / "consolidated.pth")
    lm = load_model(str(path))
    assert lm.model.output.output.weight is lm.model.embed.weight


def test_tokenizer_resolution_and_override(make_checkpoint, sp_model, tmp_path):
    path = make_checkpoint()
    cfg = json.loads((path / "config.json").read_text())
    cfg["tokenizer"]["path"] = "/cluster/that/no/longer/exists/tokenizer.model"  # falls back to the copy beside
    (path / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(path)).tokenizer.path == path / "tokenizer.model"
    other = tmp_path / "elsewhere.model"
    shutil.copyfile(sp_model, other)
    os.remove(path / "tokenizer.model")
    with pytest.raises(MegaevalError, match="tokenizer not found"):
        load_model(str(path))
    assert load_model(f"megalodon:{path}", tokenizer=str(other)).tokenizer.path == other


def test_the_tokenizer_option_names_a_sentencepiece_file(make_checkpoint):
    path = make_checkpoint()
    with pytest.raises(MegaevalError, match="^option tokenizer= of megalodon models is empty; write tokenizer="):
        load_model(str(path), tokenizer="")
    with pytest.raises(MegaevalError, match=f"tokenizer={path} is a folder, but MEGALODON models take a sentencepiece "
                       f".model file; pass tokenizer={path / 'tokenizer.model'}$"):  # fmt: skip
        load_model(str(path), tokenizer=str(path))


def test_additional_vocabulary_allocates_specials_like_the_official_tokenizer(sp_model):
    tok = SentencePieceTokenizer(sp_model, additional_vocab_size=256)
    assert tok.vocab_size == VOCAB + 256
    assert (tok.bos_id, tok.eos_id) == (1, 2)  # the sentencepiece model defines them
    assert tok.decode(tok.encode("Anne Elliot") + [VOCAB + 5]) == "Anne Elliot"


def test_official_window_option_and_unknown_options(make_checkpoint):
    path = make_checkpoint()
    assert load_model(str(path), norm_stats="official-window").describe()["norm_stats"] == "official-window"
    with pytest.raises(MegaevalError, match="unknown norm_stats 'sliding'"):
        load_model(str(path), norm_stats="sliding")
    with pytest.raises(MegaevalError, match="unknown option.*flash"):
        load_model(str(path), flash=True)


# ------------------------------------------------------------------------------- bad input


def break_missing_pth(path):
    os.remove(path / "consolidated.pth")


def break_missing_shard(path):
    (path / "consolidate_config.json").write_text(json.dumps({"model_parallel_size": 2, "dtype": "fp32"}))


def break_corrupt_pth(path):
    data = (path / "consolidated.pth").read_bytes()
    (path / "consolidated.pth").write_bytes(data[: len(data) // 3])


def break_wrong_shape(path):
    state = torch.load(path / "consolidated.pth", weights_only=True)
    state["layers.1.mega.wz.weight"] = torch.zeros(3, 16)
    torch.save(state, path / "consolidated.pth")


def break_missing_key(path):
    state = torch.load(path / "consolidated.pth", weights_only=True)
    del state["layers.0.mega.cema.theta"]
    state["layers.0.mega.extra.weight"] = torch.zeros(1)
    torch.save(state, path / "consolidated.pth")


def break_int8_weight(path):
    state = torch.load(path / "consolidated.pth", weights_only=True)
    state["layers.0.mega.wv.weight"] = (state["layers.0.mega.wv.weight"] * 100).to(torch.int8)
    torch.save(state, path / "consolidated.pth")


def break_vocab(path):
    cfg = json.loads((path / "config.json").read_text())
    cfg["model"]["vocab_size"] = VOCAB + 1
    (path / "config.json").write_text(json.dumps(cfg))


def break_config_field(path):
    cfg = json.loads((path / "config.json").read_text())
    cfg["model"]["attention_sinks"] = 4
    (path / "config.json").write_text(json.dumps(cfg))


def break_config_json(path):
    (path / "config.json").write_text("{not json")


def break_consolidate_config(path):
    os.remove(path / "consolidate_config.json")


BAD = {
    "missing_pth": (break_missing_pth, r"missing weights file .*consolidated\.pth"),
    "missing_shard": (break_missing_shard, r"missing weights file .*consolidated\.00\.pth"),
    "corrupt_pth": (break_corrupt_pth, r"cannot read .*consolidated\.pth: corrupt"),
    "wrong_shape": (break_wrong_shape, r"shape mismatch .*layers\.1\.mega\.wz\.weight \[3, 16\] vs \[8, 16\]"),
    "int8_weight": (
        break_int8_weight,
        r"tensor layers\.0\.mega\.wv\.weight in .*consolidated\.pth is int8, .*quantized checkpoints are not supported",
    ),
    "missing_key": (
        break_missing_key,
        r"missing keys layers\.0\.mega\.cema\.theta; unexpected keys layers\.0\.mega\.extra",
    ),
    "vocab": (
        break_vocab,
        rf"tokenizer vocabulary \({VOCAB} pieces \+ 0 additional = {VOCAB}\) does not match "
        rf"model\.vocab_size {VOCAB + 1}",
    ),
    "config_field": (break_config_field, r"unknown model field\(s\) attention_sinks"),
    "config_json": (break_config_json, r"config\.json is not valid JSON"),
    "consolidate_config": (break_consolidate_config, r"missing consolidate_config\.json"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_checkpoints_raise_one_clear_error(make_checkpoint, case):
    path = make_checkpoint()
    breaker, message = BAD[case]
    breaker(path)
    with pytest.raises(MegaevalError, match=message) as info:
        load_model(str(path))
    assert "\n" not in str(info.value)


def test_an_integer_weight_in_one_model_parallel_shard_is_refused_before_merging(make_checkpoint):
    """Concatenating shards would promote a uint8 part to float without a word; the shard is named instead."""
    path = make_checkpoint(small_args(num_heads=4, z_dim=16, norm_num_groups=4), shards=2)
    state = torch.load(path / "consolidated.01.pth", weights_only=True)
    state["embed.weight"] = state["embed.weight"].to(torch.uint8)
    torch.save(state, path / "consolidated.01.pth")
    with pytest.raises(MegaevalError, match=r"tensor embed\.weight in .*consolidated\.01\.pth is uint8"):
        load_model(str(path))


class Payload:
    """Unpickling this would create a file: the marker of code that ran."""

    marker = None

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def test_pickle_that_would_run_code_is_refused(make_checkpoint, tmp_path):
    path = make_checkpoint()
    state = torch.load(path / "consolidated.pth", weights_only=True)
    Payload.marker = tmp_path / "PWNED"
    state["layers.0.mega.wv.weight"] = Payload()
    torch.save(state, path / "consolidated.pth")
    with pytest.raises(MegaevalError, match=r"refusing to load .*pickled code \(.*makedirs\)"):
        load_model(str(path))
    assert not (tmp_path / "PWNED").exists()


def test_bad_specs(tmp_path):
    with pytest.raises(MegaevalError, match="model not found"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(MegaevalError, match="checkpoint directory not found"):
        load_model(f"megalodon:{tmp_path / 'missing'}")
    with pytest.raises(MegaevalError, match="unknown model family 'gpt'"):
        load_model("gpt:whatever")
    with pytest.raises(MegaevalError, match="cannot tell which model family"):
        load_model(str(tmp_path))
    with pytest.raises(MegaevalError, match="unknown dtype 'fp8'"):
        load_model(None, dtype="fp8")
