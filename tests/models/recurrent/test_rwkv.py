"""RWKV-4 beyond the shared architecture tests: transformers' inference-mode rescaling over more layers than
`rescale_every`, narrower attention and tied embeddings, every chunk size against the token loop, the float32 WKV with
keys large enough that only the stable form survives, gradients, state bookkeeping, and config errors."""

from __future__ import annotations

import pytest
import torch

from megaeval.errors import MegaevalError
from megaeval.models.recurrent.rwkv import EMPTY_MAX, RwkvConfig, RwkvModel, wkv_chunk, wkv_reference
from megaeval_testing.recurrent import (
    float64_faithful,
    megaeval_copy,
    random_tokens,
    read_in_calls,
    stress_rwkv,
    tiny_model,
)


def pair(chunk: int = 16, **overrides) -> tuple[torch.nn.Module, RwkvModel]:
    """A float64 transformers RWKV with large random decays, bonuses and keys, and megaeval's copy of it."""
    ref = stress_rwkv(tiny_model("rwkv", **overrides).double())
    return ref, megaeval_copy(ref, chunk)


def logits_of(model: RwkvModel, tokens: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    return read_in_calls(model, tokens, sizes)[0]


def close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.parametrize(
    "overrides",
    [dict(num_hidden_layers=4, rescale_every=2), dict(num_hidden_layers=3, rescale_every=1),
     dict(num_hidden_layers=3, rescale_every=0),
     dict(num_hidden_layers=3, rescale_every=2, attention_hidden_size=24, intermediate_size=None),
     dict(num_hidden_layers=4, rescale_every=3, tie_word_embeddings=True)],
)  # fmt: skip
def test_rescaling_narrow_attention_and_tying_equal_transformers_eval_mode(overrides: dict) -> None:
    ref, model = pair(**overrides)
    tokens = random_tokens(2, 90)
    with torch.no_grad(), float64_faithful():
        want = ref(input_ids=tokens, use_cache=False).logits
        unscaled = ref.train()(input_ids=tokens, use_cache=False).logits  # training mode: no rescaling
    close(logits_of(model, tokens), want, 1e-8)
    close(logits_of(model, tokens, [1, 5, 17, 2, 65]), want, 1e-8)
    if overrides["rescale_every"] > 0:  # the layer norms' eps sees the halving: the test would catch its absence
        assert (unscaled - want).abs().max() > 1e-6 * want.abs().max()
    assert (model.head.weight is model.rwkv.embeddings.weight) == overrides.get("tie_word_embeddings", False)


def test_state_dict_is_transformers_one() -> None:
    ref, model = pair(num_hidden_layers=3, attention_hidden_size=24)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert [hasattr(b, "pre_ln") for b in model.rwkv.blocks] == [True, False, False]
    assert RwkvModel.TIED_KEYS == {"head.weight": "rwkv.embeddings.weight"}


@pytest.mark.parametrize("chunk", [1, 7, 16, 32, 64])
def test_every_chunk_size_equals_the_token_loop(chunk: int) -> None:
    _, model = pair(chunk=chunk, num_hidden_layers=3, rescale_every=2)
    tokens = random_tokens(2, 150, seed=1)
    with torch.no_grad():
        hidden, _ = model.forward_reference(tokens, model.init_state(2))
        want = model.logits(hidden)
    close(logits_of(model, tokens), want, 1e-10)
    close(logits_of(model, tokens, [1, 63, 2, 84]), want, 1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_wkv_chunks_with_keys_of_30_stay_exact(dtype: torch.dtype) -> None:
    """Unshifted, exp(k) of keys ~ +-30 (+-100 at the tails) overflows float32: chunk after chunk from a carried
    state, the chunk form stays finite and as close to a float64 token loop as float32 allows."""
    g = torch.Generator().manual_seed(2)
    k = (30 * torch.randn(2, 100, 8, generator=g, dtype=torch.float64)).to(dtype)
    v = torch.randn(2, 100, 8, generator=g, dtype=torch.float64).to(dtype)
    w = (-torch.exp(2 * torch.randn(8, generator=g, dtype=torch.float64))).to(dtype)
    u = (3 * torch.randn(8, generator=g, dtype=torch.float64)).to(dtype)
    start = [torch.zeros(2, 8, dtype=dtype), torch.zeros(2, 8, dtype=dtype), torch.full((2, 8), EMPTY_MAX, dtype=dtype)]
    outs, state = [], start
    for s in range(0, 100, 16):
        out, *state = wkv_chunk(w, u, k[:, s : s + 16], v[:, s : s + 16], *state)
        outs.append(out)
    got = torch.cat(outs, 1)
    exact, *end = wkv_reference(*(t.double() for t in (w, u, k, v, *start)))
    assert torch.isfinite(got).all() and got.dtype == dtype
    close(got.double(), exact, 1e-5 if dtype == torch.float32 else 1e-12)
    top = torch.maximum(state[2].double(), end[2])  # compare the sums the states stand for, at the larger max
    for a, b in ((state[0], end[0]), (state[1], end[1])):
        close(a.double() * (state[2].double() - top).exp(), b * (end[2] - top).exp(), 1e-5 if dtype == torch.float32
              else 1e-12)  # fmt: skip


def test_gradients_equal_the_token_loops_and_inference_mode_runs() -> None:
    _, model = pair(num_hidden_layers=2)
    model.train()
    tokens = random_tokens(2, 40, seed=3)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for forward in (model.forward, model.forward_reference):
        hidden, _ = forward(tokens, model.init_state(2))
        grads.append(torch.autograd.grad(model.logits(hidden).logsumexp(-1).sum(), params))
    for got, want in zip(*grads, strict=True):
        close(got, want, 1e-10)
    with torch.inference_mode():
        hidden, state = model(tokens, model.init_state(2))
    assert torch.isfinite(hidden).all() and state.position == 40


def test_state_bookkeeping() -> None:
    _, model = pair()
    state = model.init_state(2)
    assert all(t.dtype == torch.float64 for s in state.layers for t in (s.num, s.den, s.max))
    with torch.no_grad():
        _, after10 = model(random_tokens(2, 10), state.clone())
        _, after500 = model(random_tokens(2, 500), state.clone())
    assert after10.nbytes() == after500.nbytes() == state.nbytes() > 0
    assert after500.position == 500 and after500.batch_size == 2
    copy = after500.clone()
    ids = {t.data_ptr() for s in after500.layers for t in s.tensors()}
    assert not ids & {t.data_ptr() for s in copy.layers for t in s.tensors()}
    wide = after500.repeat(3)
    assert wide.batch_size == 6 and after500.batch_size == 2 and wide.position == 500
    torch.testing.assert_close(wide.layers[1].num[3:6], after500.layers[1].num[1:2].expand(3, -1), rtol=0, atol=0)
    f32 = RwkvModel(model.config).float().init_state(1)
    assert all(t.dtype == torch.float32 for s in f32.layers for t in (s.num, s.den, s.max))


@pytest.mark.parametrize(
    "field, value, message",
    [("hidden_size", "64", "hidden_size must be a positive integer"),
     ("num_hidden_layers", 0, "num_hidden_layers must be a positive integer"),
     ("intermediate_size", -3, "intermediate_size"), ("rescale_every", "6", "rescale_every must be an integer"),
     ("layer_norm_epsilon", 0, "layer_norm_epsilon must be a positive number"),
     ("tie_word_embeddings", "no", "tie_word_embeddings must be true or false")],
)  # fmt: skip
def test_config_errors_are_one_line(field: str, value, message: str) -> None:
    raw = tiny_model("rwkv").config.to_dict()
    with pytest.raises(MegaevalError, match=message) as err:
        RwkvConfig.from_hf({**raw, field: value}, "c.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("c.json")


@pytest.mark.parametrize("field", ["attention_hidden_size", "intermediate_size"])
def test_zero_sizes_are_refused_by_name(field: str) -> None:
    raw = tiny_model("rwkv").config.to_dict()
    with pytest.raises(MegaevalError, match=f"^c.json: {field} must be a positive integer, got 0$"):
        RwkvConfig.from_hf({**raw, field: 0}, "c.json")


def test_config_defaults_are_transformers_ones() -> None:
    c = RwkvConfig.from_hf({"model_type": "rwkv", "hidden_size": 64, "attention_hidden_size": None}, "c.json")
    assert (c.attention_hidden_size, c.intermediate_size, c.rescale_every, c.vocab_size) == (64, 256, 6, 50277)
    assert c.layer_norm_epsilon == 1e-5 and c.tie_word_embeddings is False and c.to_dict()["hidden_size"] == 64
