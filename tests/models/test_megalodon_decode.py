"""MEGALODON's static decoder (megalodon/decode.py): its steps, one token per row in static buffers, equal
`forward` one token at a time (float64 within 1e-10, float32 within 1e-4), logits and the state after, across
chunk boundaries and for rows at different positions; the fused step (the Triton kernels of kernels/decode_step.py,
here in Triton's CPU interpreter) equals the unfused one; greedy generation through it equals generation without.

Off CUDA the step runs eagerly (what the CUDA graph captures); the graph itself is checked on a GPU only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megaeval import MegaevalError
from megaeval.distributed import ChunkGroup
from megaeval.kernels.common import available
from megaeval.models.megalodon import ChunkParallelLM, MegalodonLM, MegalodonState
from megaeval.models.megalodon.decode import StaticDecoder
from megaeval.scoring.generate import decode_rows, greedy_generate, read
from megaeval.tokenizers import SentencePieceTokenizer
from megaeval_testing import VOCAB, FakeTokenizer, random_model, small_args

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}
triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")


def make_lm(dtype: torch.dtype = torch.float64, seed: int = 0, **args) -> MegalodonLM:
    return MegalodonLM(random_model(small_args(**args), seed, dtype), FakeTokenizer(), None)


def tokens_for(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def assert_same_state(got: MegalodonState, want: MegalodonState, tol: float) -> None:
    """Positions, fills, norm counts equal; statistics, CEMA states and each row's cached keys/values close."""
    assert got.positions() == want.positions() and got.row_fills() == want.row_fills()
    assert (got.fills is None) == (want.fills is None) and got.history is None
    pairs = [(g.norm, w.norm) for g, w in zip(got.layers, want.layers, strict=True)]
    for g, w in [*pairs, (got.final_norm, want.final_norm)]:
        assert g.count == w.count
        torch.testing.assert_close(g.mean, w.mean, rtol=tol, atol=tol)
        torch.testing.assert_close(g.var, w.var, rtol=tol, atol=tol)
    for g, w in zip(got.layers, want.layers, strict=True):
        assert g.cema.dtype == w.cema.dtype and g.k.dtype == w.k.dtype and g.v.dtype == w.v.dtype
        torch.testing.assert_close(g.cema, w.cema, rtol=tol, atol=tol)
        for row, fill in enumerate(want.row_fills()):
            torch.testing.assert_close(g.k[row, :fill], w.k[row, :fill], rtol=tol, atol=tol)
            torch.testing.assert_close(g.v[row, :fill], w.v[row, :fill], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_steps_equal_forward_one_token_at_a_time_across_chunks(dtype):
    lm, tol = make_lm(dtype), TOLERANCE[dtype]
    tokens = tokens_for(2, 5 + 30 + 11)  # 5 read, 30 decoded (chunk 8: four boundaries), 11 read again
    _, state = lm.forward(tokens[:, :5], lm.init_state(2))
    decoder = StaticDecoder(lm.model, 2, fused=False)  # the fused step: test_fused_steps_equal_unfused_steps
    decoder.load(state)
    for t in range(5, 35):
        want, state = lm.forward(tokens[:, t : t + 1], state)
        got = decoder.step(tokens[:, t])
        assert got.dtype == want.dtype and got.shape == (2, VOCAB)
        torch.testing.assert_close(got, want[:, 0], rtol=tol, atol=tol)
        if t % 4 == 0 or t == 34:
            assert_same_state(decoder.state(), state, tol)
    # the state given back goes on eagerly, in a call of several tokens across a boundary
    more, _ = lm.forward(tokens[:, 35:], decoder.state())
    want, _ = lm.forward(tokens[:, 35:], state)
    torch.testing.assert_close(more, want, rtol=tol, atol=tol)


def test_a_fresh_state_with_prior_statistics_decodes_as_forward():
    lm = make_lm(seed=3)
    g = torch.Generator().manual_seed(0)
    for k, norm in enumerate([b.mega.timenorm for b in lm.model.layers] + [lm.model.output.final_norm]):
        norm.prior_count.fill_(k + 2)
        norm.prior_mean.copy_(torch.randn(norm.prior_mean.shape, generator=g, dtype=norm.prior_mean.dtype))
        norm.prior_logv.copy_(torch.randn(norm.prior_logv.shape, generator=g, dtype=norm.prior_logv.dtype))
    tokens, state = tokens_for(1, 12, seed=5), lm.init_state(1)
    decoder = StaticDecoder(lm.model, 1)  # starts from a fresh state of its own
    for t in range(12):
        want, state = lm.forward(tokens[:, t : t + 1], state)
        torch.testing.assert_close(decoder.step([int(tokens[0, t])]), want[:, 0], rtol=0, atol=1e-10)
    assert_same_state(decoder.state(), state, 1e-10)


LM64 = make_lm()


def row_states(lm: MegalodonLM, lengths: tuple[int, ...]) -> list[MegalodonState]:
    return [lm.forward(tokens_for(1, n, seed=n), lm.init_state(1))[1] if n else lm.init_state(1) for n in lengths]


def test_rows_at_different_positions_each_decode_as_alone():
    lengths = (1, 13, 0, 22, 8)  # fills 1, 5, 0, 6, 0
    alone = row_states(LM64, lengths)
    stacked = MegalodonState.stack([s.clone() for s in alone])
    decoder = StaticDecoder(LM64.model, len(lengths))
    decoder.load(stacked)
    assert_same_state(decoder.state(), stacked, 0)
    tokens = tokens_for(len(lengths), 12, seed=9)
    for t in range(12):
        got = decoder.step(tokens[:, t])
        want, stacked = LM64.forward(tokens[:, t : t + 1], stacked)  # `_forward_rows`
        torch.testing.assert_close(got, want[:, 0], rtol=0, atol=1e-10)
        for r in range(len(lengths)):
            one, alone[r] = LM64.forward(tokens[r : r + 1, t : t + 1], alone[r])
            torch.testing.assert_close(got[r], one[0, 0], rtol=0, atol=1e-10)
    assert_same_state(decoder.state(), stacked, 1e-10)
    for r in range(len(lengths)):
        assert_same_state(decoder.state([r]), alone[r], 1e-10)


def test_load_and_state_round_trip_by_slot():
    states = row_states(LM64, (3, 17, 10))
    decoder = StaticDecoder(LM64.model, 4)
    decoder.load(MegalodonState.stack([s.clone() for s in states]), [2, 0, 3])
    for slot, state in zip([2, 0, 3], states, strict=True):
        assert_same_state(decoder.state([slot]), state, 0)
    assert_same_state(decoder.state([1]), LM64.init_state(1), 0)  # untouched slot: the fresh state it began with
    together = decoder.state([0, 3])
    assert together.positions() == [17, 10] and together.row_fills() == [1, 2]
    assert all(not any(t is b for b in [decoder.counts, decoder.fill]) for t in together.tensors())
    decoder.load(states[0], [0])  # one slot replaced, the others kept
    assert_same_state(decoder.state([0, 2]), MegalodonState.stack([states[0], states[0]]), 0)
    assert_same_state(decoder.state([3]), states[2], 0)
    with pytest.raises(ValueError, match="does not fit"):
        decoder.load(states[0], [0, 1])


def test_bfloat16_steps_track_forward():
    lm = make_lm(torch.bfloat16)
    tokens = tokens_for(2, 20, seed=4)
    _, state = lm.forward(tokens[:, :3], lm.init_state(2))
    decoder = StaticDecoder(lm.model, 2, fused=False)
    decoder.load(state)
    assert decoder.layers[0].k.dtype == torch.float32 and decoder.layers[0].v.dtype == torch.bfloat16
    for t in range(3, 20):
        want, state = lm.forward(tokens[:, t : t + 1], state)
        got = decoder.step(tokens[:, t])
        assert float((got - want[:, 0]).abs().max()) <= 0.05 * float(want.abs().max())
    assert decoder.state().layers[0].k.dtype == torch.bfloat16


FEATURES = {  # every branch of the fused step: SwiGLU or not, FFN rescale, affine norms, scaled embeddings
    "small": {},
    "plain": dict(swiglu=False, rescale_nffn=True, norm_affine=False, scale_emb=True, norm_num_groups=2, cema_ndim=3),
}


@triton_only
@pytest.mark.parametrize(
    "dtype, features",
    [
        # the interpreter is slow: -m slow runs these (each fused kernel is held to its reference in the default run:
        # tests/kernels/test_decode_step.py)
        pytest.param(torch.float32, "small", marks=pytest.mark.slow),
        pytest.param(torch.float32, "plain", marks=pytest.mark.slow),
        pytest.param(torch.bfloat16, "small", marks=pytest.mark.slow),
    ],
)
def test_fused_steps_equal_unfused_steps_and_forward(dtype, features):
    """Rows at their own positions (fills 5, 0, 6), 11 steps across one or two chunk boundaries each (chunk 8): the
    fused step's logits and state equal the unfused step's and `forward`'s, in float32 to rounding (max |difference|
    / max |logit| <= 1e-5, 1e-4). In bfloat16 (a slow test) they differ by rounding that grows from step to step,
    some 3% of the largest logit at worst for the unfused step against `forward`, and twice that here for the fused
    one: the interpreter truncates to bfloat16 where a GPU rounds (rounding as a GPU does, the fused step is as close
    to `forward` as the unfused one); a wrong value is off by its own size, far more."""
    lm = make_lm(dtype, seed=11, **FEATURES[features])
    stacked = MegalodonState.stack([lm.forward(tokens_for(1, n, seed=n), lm.init_state(1))[1] for n in (13, 16, 22)])
    fused, unfused = StaticDecoder(lm.model, 3, fused=True), StaticDecoder(lm.model, 3, fused=False)
    assert fused.layers[0].k.dtype == dtype and unfused.layers[0].k.dtype == torch.float32
    fused.load(stacked)
    unfused.load(stacked)
    steps = 11  # the interpreter is slow
    tokens, diffs = tokens_for(3, steps, seed=12), []
    for t in range(steps):
        got, want = fused.step(tokens[:, t]), unfused.step(tokens[:, t])
        eager, stacked = lm.forward(tokens[:, t : t + 1], stacked)
        assert torch.isfinite(got).all() and got.dtype == want.dtype == torch.float32
        diffs.append([float((got - other).abs().max() / other.abs().max()) for other in (want, eager[:, 0])])
    worst, mean = torch.tensor(diffs).amax(0), torch.tensor(diffs).mean(0)
    if dtype == torch.float32:
        assert worst[0] <= 1e-5 and worst[1] <= 1e-4, diffs
    else:
        assert worst.max() <= 0.15 and mean.max() <= 0.05, diffs
    if dtype == torch.float32:
        assert_same_state(fused.state(), unfused.state(), 1e-4)
        assert_same_state(fused.state(), stacked, 1e-4)


def test_fused_needs_the_kernels():
    if available():
        assert StaticDecoder(LM64.model, 1).fused is False  # float64: the kernels compute in float32
        lm = make_lm(torch.float32)
        assert StaticDecoder(lm.model, 1).fused is True  # the interpreter runs them on the CPU
        for kernels, fused in (("auto", True), ("torch", False)):  # kernels "torch": no Triton in the step either
            other = MegalodonLM(lm.model, FakeTokenizer(), None, kernels=kernels)
            other.static_decode = "on"
            assert other.decoder(1).fused is fused
    with pytest.raises(MegaevalError, match="fused decoding step"):
        StaticDecoder(LM64.model, 1, fused=True)


def test_bad_tokens_are_refused():
    decoder = StaticDecoder(LM64.model, 2)
    with pytest.raises(MegaevalError, match=rf"token ids must lie in \[0, {VOCAB}\)"):
        decoder.step([1, VOCAB])
    with pytest.raises(ValueError, match="one token per slot"):
        decoder.step([1])


def test_which_lms_have_a_decoder():
    lm = make_lm()
    assert lm.decoder(2) is None  # "auto" off CUDA: decoding stays on forward
    lm.static_decode = "on"
    first = lm.decoder(2)
    assert isinstance(first, StaticDecoder) and lm.decoder(2) is first and lm.decoder(3) is not first
    window = MegalodonLM(lm.model, FakeTokenizer(), None, norm_stats="official-window")
    window.static_decode = "on"
    assert window.decoder(1) is None
    assert ChunkParallelLM(lm, ChunkGroup()).decoder(1) is None  # a group decodes through its own forward


# ---------------------------------------------------------------------- generation through the decoder


@pytest.fixture(scope="module")
def chat_lm(sp_model) -> MegalodonLM:
    """A random MEGALODON with chunk 8 and a real tokenizer (generations are decoded to text)."""
    return MegalodonLM(random_model(small_args(), 7), SentencePieceTokenizer(sp_model), None)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_generation_through_the_decoder_equals_generation_without(chat_lm, monkeypatch, batch_size):
    lm = chat_lm
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB - 1, n) for n in (3, 21, 9, 40, 1, 14, 30)]
    piece = lm.tokenizer.decode([int(rng.integers(3, VOCAB - 1))]).strip()
    stop = [piece[:1]] if piece else []  # rows end at different steps: slots free and refill

    def generate() -> list:
        return decode_rows(lm, (read(lm, p, lm.init_state(1)) for p in prompts), 13, stop, batch_size)

    lm.static_decode = "off"
    without = generate()
    steps = []
    original = StaticDecoder.step
    monkeypatch.setattr(StaticDecoder, "step", lambda self, tokens: steps.append(len(tokens)) or original(self, tokens))
    lm.static_decode = "on"
    try:
        got = generate()
    finally:
        lm.static_decode = "off"
    assert [(g.text, g.tokens, g.stop_reason) for g in got] == [(w.text, w.tokens, w.stop_reason) for w in without]
    assert steps and set(steps) == {batch_size}
    assert sum(len(w.tokens) for w in without) > 3 * len(prompts)  # the answers are not all empty


def test_greedy_generate_leaves_the_given_state_untouched(chat_lm):
    lm = chat_lm
    logits, state = read(lm, np.arange(3, 30), lm.init_state(1))
    snapshot = state.clone()
    lm.static_decode = "on"
    try:
        got = greedy_generate(lm, logits, state, 20)
    finally:
        lm.static_decode = "off"
    assert got.tokens == greedy_generate(lm, logits, state, 20).tokens
    for a, b in zip(state.tensors(), snapshot.tensors(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_the_cuda_graph_replays_the_eager_step():
    model = random_model(small_args(chunk_size=8), 0, torch.float32).cuda()
    lm = MegalodonLM(model, FakeTokenizer(), None, kernels="torch")
    tokens = tokens_for(2, 25, seed=2).cuda()
    _, state = lm.forward(tokens[:, :4], lm.init_state(2))
    graph, eager = StaticDecoder(model, 2, graph=True), StaticDecoder(model, 2)
    graph.load(state)
    eager.load(state)
    for t in range(4, 25):
        want, state = lm.forward(tokens[:, t : t + 1], state)
        got = graph.step(tokens[:, t])
        torch.testing.assert_close(got, eager.step(tokens[:, t]), rtol=0, atol=1e-6)
        torch.testing.assert_close(got, want[:, 0], rtol=1e-4, atol=1e-4)
    assert_same_state(graph.state(), state, 1e-4)
