"""The whole MEGALODON model: naive reference, streaming equivalence, batches, state, norm modes."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megaeval.models.megalodon import MegalodonLM
from megaeval.models.megalodon.adapter import WINDOW_CHUNKS
from megaeval_testing import VOCAB, random_model, small_args
from megaeval_testing.naive_megalodon import naive_forward


class FakeTokenizer:
    vocab_size, bos_id, eos_id = VOCAB, 1, 2

    def describe(self):
        return {"kind": "fake"}


def make_lm(args=None, dtype=torch.float64, norm_stats="cumulative", seed=0) -> MegalodonLM:
    return MegalodonLM(random_model(args, seed, dtype), FakeTokenizer(), None, norm_stats=norm_stats)


def stream(lm: MegalodonLM, tokens: torch.Tensor, sizes: list[int], state=None) -> torch.Tensor:
    state = lm.init_state(tokens.shape[0]) if state is None else state
    outs, start = [], 0
    for n in sizes:
        logits, state = lm.forward(tokens[:, start : start + n], state)
        outs.append(logits)
        start += n
    assert start == tokens.shape[1]
    return torch.cat(outs, 1)


def tokens_for(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


VARIANTS = {
    "default": {},
    "one_head_no_swiglu": dict(num_heads=1, swiglu=False),
    "no_norm_affine": dict(norm_affine=False),
    "share_and_scale_emb": dict(share_emb=True, scale_emb=True),
    "rescale_nffn_rope_base": dict(rescale_nffn=True, rope_base=500.0),
    "output_size": dict(output_size=VOCAB + 7),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_matches_naive_reference(variant):
    lm = make_lm(small_args(**VARIANTS[variant]))
    tokens = tokens_for(2, 29)
    logits, _ = lm.forward(tokens, lm.init_state(2))
    expected = naive_forward(lm.model, tokens)
    assert logits.dtype == torch.float64 and logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-9)


LM64 = make_lm()
LM32 = make_lm(dtype=torch.float32)
LONG = tokens_for(2, 97, seed=1)  # 12 chunks of 8, plus 1
FULL64 = LM64.forward(LONG, LM64.init_state(2))[0]
FULL32 = LM32.forward(LONG, LM32.init_state(2))[0]


def sizes_strategy(total: int):
    return st.lists(st.integers(1, 30), min_size=1, max_size=total).map(lambda xs: cut_to(xs, total))


def cut_to(sizes: list[int], total: int) -> list[int]:
    out, left = [], total
    for n in sizes:
        if left == 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    return out + ([left] if left else [])


@settings(max_examples=30, deadline=None)
@given(sizes=sizes_strategy(97))
def test_any_split_gives_the_same_logits_float64(sizes):
    assert (stream(LM64, LONG, sizes) - FULL64).abs().max() <= 1e-9


@settings(max_examples=15, deadline=None)
@given(sizes=sizes_strategy(97))
def test_any_split_gives_the_same_logits_float32(sizes):
    assert (stream(LM32, LONG, sizes) - FULL32).abs().max() <= 1e-4


def test_one_token_at_a_time_and_far_beyond_a_chunk():
    assert (stream(LM64, LONG, [1] * 97) - FULL64).abs().max() <= 1e-9
    tokens = tokens_for(1, 8 * 40 + 3, seed=2)  # 40 chunks in one call, then odd pieces
    one = LM64.forward(tokens, LM64.init_state(1))[0]
    assert (stream(LM64, tokens, [250, 1, 7, 8, 57]) - one).abs().max() <= 1e-9


def test_batch_rows_do_not_affect_each_other():
    a, b = tokens_for(1, 40, seed=3), tokens_for(1, 40, seed=4)
    alone = LM64.forward(a, LM64.init_state(1))[0]
    together = LM64.forward(torch.cat([a, b]), LM64.init_state(2))[0]
    other = LM64.forward(torch.cat([a, tokens_for(1, 40, seed=5)]), LM64.init_state(2))[0]
    torch.testing.assert_close(together[:1], alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(other[:1], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_stats", ["cumulative", "official-window"])
def test_state_size_does_not_grow(norm_stats):
    lm = make_lm(dtype=torch.float32, norm_stats=norm_stats)
    chunk = lm.args.chunk_size
    tokens = tokens_for(1, 1000 * chunk, seed=6)
    state = lm.init_state(1)
    _, after10 = lm.forward(tokens[:, : 10 * chunk], state)
    _, after1000 = lm.forward(tokens[:, 10 * chunk :], after10)
    assert after1000.position == 1000 * chunk
    assert after10.nbytes() == after1000.nbytes()
    _, partial = lm.forward(tokens[:, : chunk - 1], after1000)  # the largest a state gets
    if norm_stats == "cumulative":
        assert partial.nbytes() == lm.state_bytes(1)
    else:
        assert partial.nbytes() <= lm.state_bytes(1)
        assert after1000.history.shape[1] == WINDOW_CHUNKS * chunk


def test_forward_leaves_the_given_state_untouched_and_clones_are_independent():
    state = LM64.init_state(2)
    _, prefix = LM64.forward(LONG[:, :13], state)
    snapshot = prefix.clone()
    first, _ = LM64.forward(LONG[:, 13:30], prefix)
    second, _ = LM64.forward(LONG[:, 13:30], prefix)  # same state object used twice
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    for a, b in zip(prefix.tensors(), snapshot.tensors(), strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(first, FULL64[:, 13:30], rtol=0, atol=1e-9)


def test_score_equals_log_softmax_of_forward_and_holds_one_chunk_of_logits(monkeypatch):
    targets = torch.roll(LONG, -1, dims=1)
    targets[0, 5] = -100  # ignored target scores 0
    widths = []
    original = LM64.model.logits
    monkeypatch.setattr(LM64.model, "logits", lambda h: widths.append(h.shape[1]) or original(h))
    nll, state = LM64.score(LONG, targets, LM64.init_state(2))
    assert max(widths) <= LM64.args.chunk_size
    expected = -torch.log_softmax(FULL64, -1).gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
    expected[0, 5] = 0.0
    torch.testing.assert_close(nll, expected, rtol=0, atol=1e-9)
    assert state.position == LONG.shape[1]


def test_bad_tokens_are_rejected_with_a_clear_error():
    from megaeval import MegaevalError

    with pytest.raises(MegaevalError, match=rf"token ids must lie in \[0, {VOCAB}\)"):
        LM64.forward(torch.tensor([[1, VOCAB]]), LM64.init_state(1))
    with pytest.raises(MegaevalError, match="batch size"):
        LM64.forward(tokens_for(3, 4), LM64.init_state(2))
    with pytest.raises(MegaevalError, match="integer tensor"):
        LM64.forward(torch.zeros(2, 3), LM64.init_state(2))


# ---------------------------------------------------------------------- official-window mode


def official_inference_loop(lm: MegalodonLM, tokens: torch.Tensor) -> torch.Tensor:
    """megalodon/inference.py's loop, transcribed: 2 chunks per step; from 8 chunks on, after each
    step but the last, norm statistics are replaced by a fresh pass over the last 6 chunks."""
    model, c = lm.model, lm.args.chunk_size
    B, length = tokens.shape
    n_chunks = length // c
    prev_pos = n_chunks * c
    state = model.init_state(B)
    logits = []
    for start_chunk in range(0, n_chunks, 2):
        s, e = start_chunk * c, min(start_chunk + 2, n_chunks) * c
        hidden, state = model(tokens[:, s:e], state)
        logits.append(model.logits(hidden))
        if 8 * c <= e and (e < n_chunks * c or prev_pos < length):
            _, fresh = model(tokens[:, e - 6 * c : e], model.init_state(B))
            layers = [replace(old, norm=new.norm) for old, new in zip(state.layers, fresh.layers, strict=True)]
            state = replace(state, layers=layers, final_norm=fresh.final_norm)
    if prev_pos < length:
        hidden, _ = model(tokens[:, prev_pos:], state)
        logits.append(model.logits(hidden))
    return torch.cat(logits, 1)


WINDOW = make_lm(norm_stats="official-window")


@pytest.mark.parametrize("n_tokens", [5 * 8 + 2, 8 * 8 + 3, 9 * 8, 12 * 8 + 5, 16 * 8, 20 * 8 + 1, 21 * 8])
def test_official_window_matches_inference_py(n_tokens):
    tokens = tokens_for(2, n_tokens, seed=n_tokens)
    expected = torch.no_grad()(official_inference_loop)(WINDOW, tokens)
    for sizes in ([n_tokens], [1] * n_tokens, cut_to([7, 19, 3, 30, 1, 50, 13, 40], n_tokens)):
        got = stream(WINDOW, tokens, sizes)
        assert (got - expected).abs().max() <= 1e-9, sizes


def test_official_window_differs_from_cumulative_only_after_eight_chunks():
    tokens = tokens_for(1, 16 * 8, seed=7)
    window = WINDOW.forward(tokens, WINDOW.init_state(1))[0]
    cumulative = LM64.forward(tokens, LM64.init_state(1))[0]
    torch.testing.assert_close(window[:, : 8 * 8], cumulative[:, : 8 * 8], rtol=0, atol=1e-12)
    assert (window[:, 8 * 8 :] - cumulative[:, 8 * 8 :]).abs().max() > 1e-3


def test_official_window_documented_odd_chunk_difference():
    """11 full chunks + 3 tokens: inference.py refreshes once more before the last 3 tokens."""
    tokens = tokens_for(1, 11 * 8 + 3, seed=8)
    expected = torch.no_grad()(official_inference_loop)(WINDOW, tokens)
    got = WINDOW.forward(tokens, WINDOW.init_state(1))[0]
    torch.testing.assert_close(got[:, : 11 * 8], expected[:, : 11 * 8], rtol=0, atol=1e-9)
    assert (got[:, 11 * 8 :] - expected[:, 11 * 8 :]).abs().max() > 1e-6
