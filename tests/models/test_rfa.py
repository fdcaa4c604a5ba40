"""The rfa family: exactness against a token-loop reference, streaming invariants, strict loading."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from megaeval.errors import MegaevalError
from megaeval.files import file_sha256
from megaeval.models.megalodon import adapter as megalodon_adapter
from megaeval.models.rfa import RFAConfig, RFAModel, adapter, is_rfa_dir, load, load_tokenizer, save_checkpoint
from megaeval.models.rfa.model import feature_map, rfa_attention
from megaeval_testing import VOCAB
from tests.models.naive_rfa import naive_attention, naive_logits

CPU = torch.device("cpu")
F64 = torch.float64


def rfa_config(**overrides) -> RFAConfig:
    base = dict(
        vocab_size=VOCAB, model_dim=16, num_layers=2, num_heads=2, num_features=5, feature_map="gaussian",
        gated=True, ffn_hidden_dim=24, norm_eps=1e-5, denominator_floor=1e-6, tie_embeddings=False,
    )  # fmt: skip
    return RFAConfig(**{**base, **overrides})


def random_rfa(config: RFAConfig, seed: int = 0) -> RFAModel:
    """Fresh init, then norms, biases, sigma and gate biases perturbed so each is exercised."""
    model = RFAModel(config).init_weights(seed).to(F64)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "bias", "sigma")):
                p.add_(torch.randn(p.shape, generator=g, dtype=F64) * 0.3)
    return model


@pytest.fixture
def make_rfa(tmp_path, sp_model):
    def make(name: str = "rfa", seed: int = 0, **overrides):
        return save_checkpoint(random_rfa(rfa_config(**overrides), seed), tmp_path / name, sp_model)

    return make


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize(
    "feature, gated, tied",
    [("gaussian", True, False), ("gaussian", False, False), ("arccos", True, False), ("arccos", False, False),
     ("gaussian", True, True), ("arccos", False, True)],
)  # fmt: skip
def test_load_matches_token_loop_reference(make_rfa, feature, gated, tied):
    path = make_rfa(feature_map=feature, gated=gated, tie_embeddings=tied)
    lm = load(path, CPU, F64)
    lm.chunk_size = 8
    seq = tokens(1, 29, seed=3)
    logits, _ = lm.forward(seq, lm.init_state(1))
    assert logits.dtype == F64 and logits.shape == (1, 29, VOCAB)
    ref = naive_logits(path, seq[0].tolist())
    torch.testing.assert_close(logits[0], ref, rtol=0, atol=1e-8)


def test_default_chunk_matches_reference_past_a_chunk(make_rfa):
    path = make_rfa(feature_map="arccos", gated=True)
    lm = load(path, CPU, F64)
    seq = tokens(1, adapter.CHUNK + 7, seed=4)
    logits, _ = lm.forward(seq, lm.init_state(1))
    torch.testing.assert_close(logits[0], naive_logits(path, seq[0].tolist()), rtol=0, atol=1e-8)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("positive", [True, False])
def test_chunked_attention_equals_token_loop(gated, positive):
    g = torch.Generator().manual_seed(0)
    B, H, T, R, d = 2, 3, 45, 6, 4
    phi_q, phi_k = (torch.randn(B, H, T, R, generator=g, dtype=F64) for _ in range(2))
    if positive:
        phi_q, phi_k = phi_q.abs(), phi_k.abs()
    v = torch.randn(B, H, T, d, generator=g, dtype=F64)
    u = torch.randn(B, H, T, generator=g, dtype=F64) * 3
    s0 = torch.rand(B, H, R, d, generator=g, dtype=F64)
    z0 = torch.rand(B, H, R, generator=g, dtype=F64) + 1.0
    gate = (F.logsigmoid(u), F.logsigmoid(-u)) if gated else (None, None)
    for chunk, offset in [(1, 0), (4, 0), (8, 5), (16, 13), (64, 0)]:
        out, s, z = rfa_attention(phi_q, phi_k, v, *gate, s0, z0, chunk=chunk, floor=1e-6, offset=offset)
        for b in range(B):
            for h in range(H):
                ref, rs, rz = naive_attention(
                    phi_q[b, h], phi_k[b, h], v[b, h], torch.sigmoid(u[b, h]) if gated else None, 1e-6,
                    s0[b, h], z0[b, h],
                )  # fmt: skip
                scale = 1.0 if positive else max(1.0, float(ref.abs().max()))
                assert (out[b, h] - ref).abs().max() <= 1e-12 * scale, (chunk, offset)
                assert torch.allclose(s[b, h], rs, rtol=1e-13, atol=1e-13)
                assert torch.allclose(z[b, h], rz, rtol=1e-13, atol=1e-13)


def test_denominator_floor_applies():
    phi = torch.zeros(1, 1, 3, 4, dtype=F64)
    v = torch.ones(1, 1, 3, 2, dtype=F64)
    out, _, _ = rfa_attention(phi, phi, v, None, None, torch.zeros(1, 1, 4, 2, dtype=F64),
                              torch.zeros(1, 1, 4, dtype=F64), chunk=2, floor=0.5)  # fmt: skip
    assert torch.equal(out, torch.zeros_like(out))


def test_feature_maps_have_the_documented_size():
    x = F.normalize(torch.randn(1, 3, 2, 4, dtype=F64), dim=-1)
    w = torch.randn(2, 5, 4, dtype=F64)
    gaussian, arccos = feature_map(x, w, "gaussian"), feature_map(x, w, "arccos")
    assert gaussian.shape == (1, 2, 3, 10) and arccos.shape == (1, 2, 3, 5)
    torch.testing.assert_close(gaussian.pow(2).sum(-1), torch.ones(1, 2, 3, dtype=F64))  # sin² + cos², / F


def test_float32_is_close_to_float64(make_rfa):
    path = make_rfa(gated=False)
    seq = tokens(2, 150, seed=5)
    lm64, lm32 = load(path, CPU, F64), load(path, CPU, torch.float32)
    l64, _ = lm64.forward(seq, lm64.init_state(2))
    l32, _ = lm32.forward(seq, lm32.init_state(2))
    assert l32.dtype == torch.float32
    torch.testing.assert_close(l32.double(), l64, rtol=0, atol=1e-3)


# ------------------------------------------------------------------------------ streaming


@pytest.mark.parametrize("gated", [True, False])
def test_any_split_equals_one_call(make_rfa, gated):
    lm = load(make_rfa(gated=gated), CPU, F64)
    lm.chunk_size = 8
    seq = tokens(2, 61, seed=6)
    whole, whole_state = lm.forward(seq, lm.init_state(2))
    for sizes in ([1] * 61, [3, 5, 8, 1, 16, 9, 19], [7, 0, 30, 24], [61]):
        state, parts, start = lm.init_state(2), [], 0
        for n in sizes:
            out, state = lm.forward(seq[:, start : start + n], state)
            parts.append(out)
            start += n
        torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-10)
        assert state.position == 61
        for a, b in zip(state.tensors(), whole_state.tensors(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_internal_steps_match_one_step(make_rfa, monkeypatch):
    lm = load(make_rfa(), CPU, F64)
    lm.chunk_size = 4
    seq = tokens(1, 50, seed=7)
    whole, _ = lm.forward(seq, lm.init_state(1))
    monkeypatch.setattr(lm, "step_tokens", 8)  # steps of 8 tokens, aligned to absolute positions
    stepped, _ = lm.forward(seq, lm.init_state(1))
    torch.testing.assert_close(stepped, whole, rtol=0, atol=1e-10)


def test_score_is_cross_entropy_of_forward_and_bounds_logits(make_rfa, monkeypatch):
    lm = load(make_rfa(), CPU, F64)
    lm.chunk_size = 8
    inputs, targets = tokens(2, 40, seed=8), tokens(2, 40, seed=9)
    targets[0, 5] = targets[1, 33] = -100
    logits, _ = lm.forward(inputs, lm.init_state(2))
    expected = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="none")
    widths = []
    real_logits = lm.model.logits
    monkeypatch.setattr(lm.model, "logits", lambda h: widths.append(h.shape[1]) or real_logits(h))
    state = lm.init_state(2)
    nll1, state = lm.score(inputs[:, :13], targets[:, :13], state)
    nll2, state = lm.score(inputs[:, 13:], targets[:, 13:], state)
    nll = torch.cat([nll1, nll2], dim=1)
    torch.testing.assert_close(nll, expected, rtol=0, atol=1e-10)
    assert nll[0, 5] == 0 and nll[1, 33] == 0
    assert max(widths) <= lm.chunk_size


def test_state_size_is_constant(make_rfa):
    lm = load(make_rfa(), CPU, torch.float32)
    state = lm.init_state(2)
    sizes = []
    for n in (10, 990):
        _, state = lm.forward(tokens(2, n, seed=n), state)
        sizes.append(state.nbytes())
    assert state.position == 1000
    assert sizes[0] == sizes[1] == lm.state_bytes(2) == lm.init_state(2).nbytes()
    assert all(t.dtype == F64 for t in state.tensors())


def test_batch_rows_are_independent(make_rfa):
    lm = load(make_rfa(), CPU, F64)
    lm.chunk_size = 8
    seq = tokens(3, 21, seed=10)
    batched, _ = lm.forward(seq, lm.init_state(3))
    for b in range(3):
        alone, _ = lm.forward(seq[b : b + 1], lm.init_state(1))
        torch.testing.assert_close(batched[b : b + 1], alone, rtol=0, atol=1e-12)


def test_state_clone_is_independent(make_rfa):
    lm = load(make_rfa(), CPU, F64)
    prefix, cont = tokens(1, 17, seed=11), tokens(1, 9, seed=12)
    _, state = lm.forward(prefix, lm.init_state(1))
    snapshot = [t.clone() for t in state.tensors()]
    a, _ = lm.forward(cont, state.clone())
    b, after = lm.forward(cont, state.clone())
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert all(torch.equal(x, y) for x, y in zip(state.tensors(), snapshot, strict=True))
    assert state.position == 17 and after.position == 26


def test_bad_tokens_and_batch_are_one_line_errors(make_rfa):
    lm = load(make_rfa(), CPU, torch.float32)
    for bad, state in ((torch.tensor([[VOCAB]]), lm.init_state(1)), (tokens(2, 3), lm.init_state(1)),
                       (torch.zeros(1, 3), lm.init_state(1))):  # fmt: skip
        with pytest.raises(MegaevalError) as e:
            lm.forward(bad, state)
        assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------ facts


def test_describe_info_rows_and_checksum(make_rfa):
    path = make_rfa(tie_embeddings=True, feature_map="arccos")
    lm = load(path, CPU, torch.float32)
    facts = lm.describe()
    shared_keys = {
        "family", "path", "config", "parameters", "chunk_size", "max_context", "state_bytes_per_sequence",
        "dtype", "device", "stored_dtype", "model_parallel_size", "tokenizer",
    }  # fmt: skip
    assert set(facts) == shared_keys  # the facts every state-carrying family gives; no MEGALODON-only padding
    assert facts["family"] == "rfa" and facts["max_context"] is None
    assert facts["stored_dtype"] == "float64" and facts["dtype"] == "float32"
    assert facts["config"]["feature_map"] == "arccos" and facts["tokenizer"]["vocab_size"] == VOCAB
    assert facts["parameters"] == sum(p.numel() for p in lm.model.parameters())
    assert json.dumps(facts)
    labels = [label for label, _ in lm.info_rows()]
    for label in ("architecture", "feature map", "gated", "state per sequence", "dtype", "tokenizer", "vocabulary"):
        assert label in labels
    assert all(isinstance(value, str) for _, value in lm.info_rows())
    assert lm.weights_sha256() == file_sha256(path / "model.safetensors")


def test_detection_and_tokenizer(make_rfa, sp_model, tmp_path):
    path = make_rfa()
    assert is_rfa_dir(path) and not is_rfa_dir(tmp_path) and not megalodon_adapter.checkpoint.is_checkpoint_dir(path)
    assert load_tokenizer(path).vocab_size == VOCAB
    assert load_tokenizer(path, tokenizer=str(sp_model)).path == sp_model
    with pytest.raises(MegaevalError, match="tokenizer not found"):
        load_tokenizer(path, tokenizer=str(tmp_path / "nope.model"))


# ------------------------------------------------------------------------------ strict loading


def one_line_error(path, match: str, **kwargs) -> str:
    with pytest.raises(MegaevalError, match=match) as e:
        load(path, CPU, torch.float32, **kwargs)
    assert "\n" not in str(e.value)
    return str(e.value)


def edit_weights(path, change) -> None:
    state = load_file(str(path / "model.safetensors"))
    change(state)
    save_file(state, str(path / "model.safetensors"))


def test_missing_unexpected_and_misshaped_keys_are_named(make_rfa):
    path = make_rfa()
    edit_weights(path, lambda s: s.pop("layers.1.attn.sigma"))
    one_line_error(path, r"missing keys layers\.1\.attn\.sigma")
    path = make_rfa("extra")
    edit_weights(path, lambda s: s.update({"layers.0.attn.q_proj.bias": torch.zeros(16)}))
    one_line_error(path, r"unexpected keys layers\.0\.attn\.q_proj\.bias")
    path = make_rfa("shape")
    edit_weights(path, lambda s: s.update({"layers.0.attn.random_matrices": torch.zeros(2, 4, 8)}))
    one_line_error(path, r"shape mismatch .*layers\.0\.attn\.random_matrices \[2, 4, 8\] vs \[2, 5, 8\]")
    path = make_rfa("ints")
    edit_weights(path, lambda s: s.update({"embed.weight": torch.zeros(VOCAB, 16, dtype=torch.int32)}))
    one_line_error(path, r"tensor embed\.weight in .*model\.safetensors is int32, .*quantized checkpoints")


def test_gate_and_output_keys_follow_the_config(make_rfa):
    path = make_rfa(gated=False)  # ungated weights, config says gated
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "gated": True}))
    one_line_error(path, r"missing keys layers\.0\.attn\.gate\.bias, layers\.0\.attn\.gate\.weight")
    path = make_rfa("tied", tie_embeddings=False)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_embeddings": True}))
    one_line_error(path, r"unexpected keys output\.weight")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"vocab_size": 0}, "vocab_size must be a positive integer"),
        ({"num_heads": 3}, "model_dim 16 is not divisible by num_heads 3"),
        ({"num_layers": True}, "num_layers must be a positive integer"),
        ({"num_features": 2.5}, "num_features must be a positive integer"),
        ({"feature_map": "relu"}, "feature_map must be one of gaussian, arccos"),
        ({"gated": "yes"}, "gated must be true or false"),
        ({"norm_eps": -1}, "norm_eps must be a positive number"),
        ({"denominator_floor": 0}, "denominator_floor must be a positive number"),
        ({"rope_base": 10000}, "unknown field.*rope_base"),
        ({"ffn_hidden_dim": None}, "ffn_hidden_dim must be a positive integer"),
        ({"family": "megalodon"}, 'family must be "rfa"'),
        ({"tokenizer": 3}, "tokenizer must be a path"),
    ],
)
def test_config_errors_are_one_line(make_rfa, change, match):
    path = make_rfa()
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    one_line_error(path, match)


def test_missing_field_and_bad_json(make_rfa):
    path = make_rfa()
    config = json.loads((path / "config.json").read_text())
    del config["gated"]
    (path / "config.json").write_text(json.dumps(config))
    one_line_error(path, "missing field.*gated")
    (path / "config.json").write_text("{not json")
    one_line_error(path, "not valid JSON")


def test_tokenizer_vocabulary_must_match(make_rfa):
    path = make_rfa(vocab_size=VOCAB + 1)
    one_line_error(path, f"has {VOCAB} pieces but config.json says vocab_size {VOCAB + 1}")


def test_pickle_is_never_loaded(make_rfa, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pickle loader was called")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    path = make_rfa()
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    with open(path / "pytorch_model.bin", "wb") as f:
        pickle.dump(state, f)
    one_line_error(path, r"missing model\.safetensors .*refusing to load pytorch_model\.bin")
    (path / "pytorch_model.bin").rename(path / "model.safetensors")  # a pickle under the safetensors name
    one_line_error(path, r"not a valid safetensors file")


def test_missing_directory_and_weights(make_rfa, tmp_path):
    one_line_error(tmp_path / "absent", "checkpoint directory not found")
    path = make_rfa()
    (path / "model.safetensors").unlink()
    one_line_error(path, r"missing model\.safetensors")


def test_save_checkpoint_round_trip(make_rfa, tmp_path, sp_model):
    model = random_rfa(rfa_config(), seed=3)
    path = save_checkpoint(model, tmp_path / "out", sp_model, dtype=torch.float32)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.model"]
    config = json.loads((path / "config.json").read_text())
    assert config["family"] == "rfa" and config["tokenizer"] == "tokenizer.model"
    lm = load(path, CPU, torch.float32)
    assert lm.describe()["stored_dtype"] == "float32"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(lm.model.state_dict()[key], value.float(), rtol=0, atol=0)
    assert math.isfinite(float(lm.score(tokens(1, 5), tokens(1, 5), lm.init_state(1))[0].sum()))


def test_loads_through_the_family_registry(make_rfa, sp_model):
    from megaeval.models import load_model
    from megaeval.models import load_tokenizer as load_any_tokenizer

    path = make_rfa()
    for spec in (str(path), f"rfa:{path}"):
        lm = load_model(spec, device="cpu", dtype="float64")
        assert lm.family == "rfa" and lm.path == path and lm.spec == f"rfa:{path}"
        assert lm.options() == {"tokenizer": None}
    lm = load_model(f"rfa:{path}", tokenizer=str(sp_model))
    assert lm.options() == {"tokenizer": str(sp_model)} and lm.dtype == torch.float32
    assert load_any_tokenizer(f"rfa:{path}").vocab_size == VOCAB
    with pytest.raises(MegaevalError, match="unknown option"):
        load_model(f"rfa:{path}", norm_stats="official-window")
