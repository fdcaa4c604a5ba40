"""Sampling at a temperature and stopping at token ids (`scoring.decoding.Decoding`): greedy stays exactly greedy, a
row's samples depend on its own logits and seed only (any batch size, any order, the static decoder's slots or
stacked states), and equal a naive loop that re-reads prompt and tokens from scratch at every step; a stop id ends
a continuation and is kept, and `min_new_tokens` bars it (and EOS) before that many tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.scoring.decoding import MIN_TEMPERATURE, Decoding, Row
from megaeval.scoring.generate import decode_rows, generate_branches, greedy_generate, read

MODELS = ["embedded:transformer-tiny", "embedded:megalodon-tiny"]  # a KV cache, and MEGALODON (with its decoder)
NEWLINE = 13  # "\n" in both tiny models' tokenizer: the newline LongBench's samsum stops at


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_model(name, dtype="float64")
        return cache[name]

    return get


def prompts_for(lm, lengths=(3, 11, 6, 17, 1)) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, lm.tokenizer.vocab_size - 1, n) for n in lengths]


def decode(lm, prompts, tokens, batch_size=1, decoding=None, stop=None) -> list:
    rows = (read(lm, p, lm.init_state(1)) for p in prompts)
    return [(g.text, g.tokens, g.stop_reason) for g in decode_rows(lm, rows, tokens, stop, batch_size, decoding)]


def naive_samples(lm, prompt, temperature: float, seed: int, tokens: int) -> list[int]:
    """Each token drawn from softmax(logits / temperature) of a fresh full forward over the prompt and the tokens so
    far (no state carried), by one CPU generator seeded with `seed`; until EOS or `tokens` tokens."""
    generator, out = torch.Generator().manual_seed(seed), []
    while len(out) < tokens:
        ids = torch.tensor([[*prompt.tolist(), *out]])
        logits = lm.forward(ids, lm.init_state(1))[0][0, -1]
        probs = torch.softmax(logits.to(torch.float32) / temperature, -1)
        token = int(torch.multinomial(probs, 1, generator=generator))
        if token == lm.tokenizer.eos_id:
            break
        out.append(token)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_temperature_zero_is_the_default_greedy_path(models, name):
    lm = models(name)
    prompts = prompts_for(lm)
    default = decode(lm, prompts, 6, 3, stop=["e"])
    for decoding in (Decoding(), Decoding(temperature=0.0, seeds=(1, 2, 3, 4, 5))):
        assert decode(lm, prompts, 6, 3, decoding, stop=["e"]) == default
        assert decode(lm, prompts, 6, 1, decoding, stop=["e"]) == default
    got, _ = generate_branches(lm, prompts, lm.init_state(1), 6, ["e"], decoding=Decoding(), batch_size=2)
    assert [(g.text, g.tokens, g.stop_reason) for g in got] == default


@pytest.mark.parametrize("name", MODELS)
def test_seeded_samples_depend_on_the_row_alone(models, name):
    """The same samples twice, at batch sizes 1, 2 and 3 (rows end at different steps: stop ids, so rows join as
    others leave), with the prompts permuted (seeds with them), and through MEGALODON's static decoder."""
    lm = models(name)
    prompts, seeds = prompts_for(lm), (11, 22, 33, 44, 55)
    decoding = Decoding(temperature=1.0, seeds=seeds, stop_ids=(NEWLINE,))
    first = decode(lm, prompts, 8, 1, decoding)
    assert decode(lm, prompts, 8, 1, decoding) == first
    for batch_size in (2, 3):
        assert decode(lm, prompts, 8, batch_size, decoding) == first
    order = [3, 0, 4, 2, 1]
    permuted = Decoding(temperature=1.0, seeds=tuple(seeds[i] for i in order), stop_ids=(NEWLINE,))
    assert decode(lm, [prompts[i] for i in order], 8, 3, permuted) == [first[i] for i in order]
    if hasattr(lm, "static_decode"):  # MEGALODON: rows in the slots of its static decoder (eager off CUDA)
        lm.static_decode = "on"
        try:
            assert decode(lm, prompts, 8, 3, decoding) == first
        finally:
            lm.static_decode = "auto"
    assert len({len(tokens) for _, tokens, _ in first}) > 1  # rows ended at different steps
    assert first != decode(lm, prompts, 8, 1)  # and sampling is not greedy decoding


@pytest.mark.parametrize("name", MODELS)
def test_samples_equal_a_naive_loop_over_the_whole_sequence(models, name):
    lm = models(name)
    prompts, seeds = prompts_for(lm)[:3], (7, 8, 9)
    want = [naive_samples(lm, p, 0.7, s, 6) for p, s in zip(prompts, seeds, strict=True)]
    decoding = Decoding(temperature=0.7, seeds=seeds)
    assert [tokens for _, tokens, _ in decode(lm, prompts, 6, 2, decoding)] == want
    alone = [greedy_generate(lm, *read(lm, p, lm.init_state(1)), 6, decoding=Decoding(0.7, (s,))).tokens
             for p, s in zip(prompts, seeds, strict=True)]  # fmt: skip
    assert alone == want


@pytest.mark.parametrize("name", MODELS)
def test_a_very_low_temperature_gives_the_greedy_tokens(models, name):
    lm = models(name)
    prompts = prompts_for(lm)
    cold = decode(lm, prompts, 8, 3, Decoding(temperature=1e-4, seeds=(1, 2, 3, 4, 5)))
    assert cold == decode(lm, prompts, 8, 3)


@pytest.mark.parametrize("name", MODELS)
def test_a_stop_id_ends_the_continuation_and_is_kept(models, name):
    lm = models(name)
    prompts = prompts_for(lm)
    greedy = decode(lm, prompts, 8)
    stopped = decode(lm, prompts, 8, 3, Decoding(stop_ids=(NEWLINE,)))
    assert any(NEWLINE in tokens for _, tokens, _ in greedy)  # some rows reach a newline within 8 tokens
    for (_, tokens, reason), (text, cut, why) in zip(greedy, stopped, strict=True):
        if NEWLINE in tokens:
            end = tokens.index(NEWLINE) + 1
            assert (cut, why) == (tokens[:end], "stop_id")
            assert text == lm.tokenizer.decode(cut) and text.endswith("\n")
        else:
            assert (cut, why) == (tokens, reason)


@pytest.mark.parametrize("name", MODELS)
def test_min_new_tokens_bars_eos_and_stop_ids_at_the_first_step(models, name):
    lm = models(name)
    prompt = prompts_for(lm)[1]
    logits, state = read(lm, prompt, lm.init_state(1))
    first = int(torch.argmax(logits))
    assert greedy_generate(lm, logits, state, 5, decoding=Decoding(stop_ids=(first,))).tokens == [first]
    barred = logits.clone()
    barred[[first, lm.tokenizer.eos_id]] = -torch.inf
    got = greedy_generate(lm, logits, state, 5, decoding=Decoding(stop_ids=(first,), min_new_tokens=1))
    assert got.tokens[0] == int(torch.argmax(barred)) != first

    # in a batch too, and when sampling: the barred token, which a cold sample mostly draws, is never drawn first
    def first_draws(min_new_tokens: int) -> list[int | None]:
        rows = [read(lm, prompt, lm.init_state(1)) for _ in range(6)]
        sampled = decode_rows(lm, rows, 1, None, 3, Decoding(0.2, tuple(range(6)), (first,), min_new_tokens))
        return [g.tokens[0] if g.tokens else None for g in sampled]

    assert first_draws(0).count(first) >= 3
    barred_draws = first_draws(1)
    assert None not in barred_draws and first not in barred_draws


def test_bad_decodings_are_refused(models):
    with pytest.raises(MegaevalError, match="without seeds"):
        Decoding(temperature=0.5)
    with pytest.raises(MegaevalError, match="bad temperature"):
        Decoding(temperature=-1.0, seeds=(1,))
    lm = models("embedded:megalodon-tiny")
    with pytest.raises(MegaevalError, match="2 sampling seeds for 3 prompts"):
        generate_branches(lm, prompts_for(lm)[:3], lm.init_state(1), 2, decoding=Decoding(1.0, (1, 2)))
    with pytest.raises(MegaevalError, match="no sampling seed for prompt 3"):
        decode(lm, prompts_for(lm)[:3], 2, 2, Decoding(1.0, (1, 2)))


def test_the_smallest_temperature_float32_holds_draws_the_argmax():
    """At MIN_TEMPERATURE a logit over about 4 overflows when divided: the draw is taken with the largest logit at 0
    (the same distribution), and is the argmax; a barred (-inf) token stays barred."""
    logits = torch.tensor([1.0, 30.0, 3.0, -5.0, -torch.inf])
    for seed in range(5):
        assert Row(0, [], Decoding(MIN_TEMPERATURE, (seed,))).choose(None, logits) == 1
        assert Row(0, [], Decoding(MIN_TEMPERATURE, (seed,))).choose(None, torch.tensor([2.0, 1.0])) == 0


@pytest.mark.parametrize("temperature", [1e-42, 1e-300, MIN_TEMPERATURE / 2])
def test_a_temperature_float32_sampling_cannot_divide_by_is_refused(temperature):
    with pytest.raises(MegaevalError, match=r"^temperature .* is below 1\.175e-38, the smallest temperature float32"):
        Decoding(temperature=temperature, seeds=(1,))
