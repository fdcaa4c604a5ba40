"""The hf family's KV cache (megaeval.models.hf.kv_cache): a decoding step writes into the spare room of the layer's
buffers instead of copying the cache, gives transformers' own logits (float64), and copies, stacked rows and
selected rows never write into each other's buffers."""

from __future__ import annotations

import pytest
import torch

from megaeval import load_model
from megaeval.models.base import stack_states
from megaeval.models.hf import kv_cache
from megaeval.models.hf.kv_cache import spare_capacity
from megaeval_testing.hf_ranks import save_tiny_llama

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_model(f"hf:{save_tiny_llama(tmp_path_factory.mktemp('tiny-llama'), max_context=2048)}",
                      dtype="float64")  # fmt: skip


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 400, (1, n), generator=torch.Generator().manual_seed(seed))


def full_logits(lm, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' own forward over the whole sequence, no cache."""
    with torch.inference_mode():
        return lm.model(input_ids=tokens, use_cache=False).logits.double()


def first_layer(state):
    return state.cache.layers[0]


def test_decoding_steps_write_in_place_and_give_transformers_logits(lm):
    tokens = ids(330)
    reference = full_logits(lm, tokens)
    _, state = lm.forward_last(tokens[:, :300], lm.init_state(1), 1)
    layer = first_layer(state)
    buffer = layer._owned[2]
    assert buffer.shape[-2] == spare_capacity(300)  # room to spare, an eighth or SPARE_TOKENS at least
    assert state.nbytes() == sum(t.numel() * t.element_size() for t in (layer.keys, layer.values)) * len(
        state.cache.layers
    )  # the tokens held, not the room
    for i in range(300, 330):
        logits, state = lm.forward(tokens[:, i : i + 1], state)
        torch.testing.assert_close(logits[0, -1], reference[0, i], rtol=1e-10, atol=1e-10)
        assert layer.keys.data_ptr() == buffer.data_ptr()  # written into the room: the cache not copied
    assert layer.keys.shape[-2] == 330


def test_a_full_buffer_grows_and_keeps_what_it_held(lm, monkeypatch):
    monkeypatch.setattr(kv_cache, "SPARE_TOKENS", 4)  # a small room, so that it fills every 4 tokens
    tokens = ids(41, seed=1)
    reference = full_logits(lm, tokens)
    _, state = lm.forward_last(tokens[:, :1], lm.init_state(1), 1)
    buffers = set()
    for i in range(1, 41):
        logits, state = lm.forward(tokens[:, i : i + 1], state)
        buffers.add(first_layer(state)._owned[2].data_ptr())
        torch.testing.assert_close(logits[0, -1], reference[0, i], rtol=1e-10, atol=1e-10)
    assert first_layer(state)._owned[2].shape[-2] <= spare_capacity(41)
    assert 5 <= len(buffers) <= 11  # reallocated when full (every 4 tokens), not at every step


def test_copies_stacks_and_selections_never_write_into_each_others_buffers(lm):
    tokens, other = ids(64, seed=2), ids(64, seed=3)
    _, state = lm.forward_last(tokens[:, :50], lm.init_state(1), 1)
    before = first_layer(state).keys.clone()
    clone = state.clone()  # a deep copy: its own buffers
    clone_logits, clone = lm.forward(tokens[:, 50:51], clone)
    _, short = lm.forward_last(other[:, :40], lm.init_state(1), 1)
    batch = stack_states([state, short])  # rows stacked: fresh tensors, copied into fresh buffers at the next call
    batch_logits, batch = lm.forward(torch.stack([tokens[0, 50:51], other[0, 40:41]]), batch)
    kept = batch.select([0])  # a row kept: its own buffers at the next call
    kept_logits, kept = lm.forward(tokens[:, 51:52], kept)
    again_logits, again = lm.forward(tokens[:, 50:51], state)  # the original, still as it was
    assert torch.equal(first_layer(again).keys[..., :50, :], before)
    reference = full_logits(lm, tokens[:, :52])
    for logits in (clone_logits[0, -1], batch_logits[0, -1], again_logits[0, -1]):
        torch.testing.assert_close(logits, reference[0, 50], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kept_logits[0, -1], reference[0, 51], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(batch_logits[1, -1], full_logits(lm, other[:, :41])[0, 40], rtol=1e-10, atol=1e-10)
