"""The hf family's prefill rules (megaeval.models.hf.prefill): every rule reads a prompt to the logits transformers'
own full forward gives (float64), and greedy answers are the same under every rule, alone or in batches of mixed
lengths; a read the rule cannot make in one call falls back to steps and the count says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.models.hf import prefill
from megaeval.scoring.answering import LocalAnswerer, Query, Rule
from megaeval_testing.hf_ranks import save_tiny_llama

transformers = pytest.importorskip("transformers")

RULES = ("one-call", "steps-7", "steps-512", "auto")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), max_context=2048)


@pytest.fixture(scope="module")
def lm(llama_dir):
    return load_model(f"hf:{llama_dir}", dtype="float64")


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 400, (1, n), generator=torch.Generator().manual_seed(seed))


def full_logits(lm, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' own forward over the whole sequence, no cache: every position's logits."""
    with torch.inference_mode():
        return lm.model(input_ids=tokens, use_cache=False).logits.double()


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_reads_a_prompt_to_transformers_logits(lm, rule):
    tokens = ids(700)
    reference = full_logits(lm, tokens)
    with prefill.forced(rule):
        last, state = lm.forward_last(tokens[:, :600], lm.init_state(1), 1)  # a fresh read
        more, state = lm.forward_last(tokens[:, 600:], state, 3)  # a read that continues the cache
        every, _ = lm.forward(tokens, lm.init_state(1))  # every position (scoring): STEP_TOKENS per call
    torch.testing.assert_close(last[0, -1], reference[0, 599], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(more[0], reference[0, -3:], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(every, reference, rtol=1e-9, atol=1e-9)
    assert state.length == 700


def naive_greedy(lm, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding by transformers' forward over the whole text at every step, no cache."""
    out = list(prompt)
    for _ in range(steps):
        out.append(int(full_logits(lm, torch.tensor([out]))[0, -1].argmax()))
    return out[len(prompt) :]


def test_every_rule_gives_the_greedy_answers_alone_and_in_batches_of_mixed_lengths(lm):
    trunk = ids(300, seed=1)[0].tolist()
    prompts = [trunk + ids(n, seed=10 + n)[0].tolist() for n in (5, 40, 260)] + [ids(90, seed=3)[0].tolist()]
    expected = [naive_greedy(lm, p, 6) for p in prompts]
    queries = [Query(np.array(p)) for p in prompts]
    for rule in RULES:
        for shared, rows in ((False, 1), (True, 1), (True, 3), (False, 4)):
            with prefill.forced(rule):
                answers, _ = LocalAnswerer(lm).answer(queries, Rule(6), shared=shared, rows=rows)
            for answer, naive in zip(answers, expected, strict=True):  # an answer that ends early ended at EOS
                n = len(answer.tokens)
                assert answer.tokens == naive[:n] and (n == 6 or naive[n] == lm.tokenizer.eos_id), (rule, shared, rows)


def test_padded_rows_read_together_equal_each_row_read_alone(lm):
    rows = [ids(n, seed=n)[0].tolist() for n in (30, 520, 200)]
    with prefill.forced("one-call"):
        states = lm.read_rows(rows)
    for row, state in zip(rows, states, strict=True):
        nxt = torch.tensor([[5]])
        got, _ = lm.forward_last(nxt, state, 1)
        reference = full_logits(lm, torch.tensor([row + [5]]))[0, -1]
        torch.testing.assert_close(got[0, -1], reference, rtol=1e-9, atol=1e-9)


def test_a_read_too_big_for_one_masked_call_falls_back_to_steps_and_says_so(lm, monkeypatch):
    tokens = ids(400)
    reference = full_logits(lm, tokens)[0, -1]
    monkeypatch.setattr(prefill, "MASK_ELEMENTS", 100 * 400)  # a continuing read of 300 onto 100: at most 100 a call
    lm.prefill.used.clear()
    lm.prefill.tokens.clear()
    with prefill.forced("one-call"):
        _, state = lm.forward_last(tokens[:, :100], lm.init_state(1), 1)  # fresh, no mask: one call
        got, _ = lm.forward_last(tokens[:, 100:], state, 1)
    torch.testing.assert_close(got[0, -1], reference, rtol=1e-9, atol=1e-9)
    assert lm.prefill.describe()["reads"] == {"one-call": 1, "one-call (memory cut to steps-100)": 1}
    assert lm.prefill.describe()["tokens"] == {"one-call": 100, "one-call (memory cut to steps-100)": 300}


def test_a_fresh_read_whose_activations_pass_the_bound_is_cut_and_says_so(lm, monkeypatch):
    tokens = ids(500)
    reference = full_logits(lm, tokens)[0, -1]
    per_token = prefill.activation_bytes(lm.model.config, torch.float64)
    assert per_token == (3 * 64 + 4 * 32) * 8  # the tiny Llama: MLP width 64, hidden 32, float64
    monkeypatch.setattr(prefill, "CALL_BYTES", 128 * per_token)
    lm.prefill.used.clear()
    with prefill.forced("one-call"):
        got, _ = lm.forward_last(tokens, lm.init_state(1), 1)
    torch.testing.assert_close(got[0, -1], reference, rtol=1e-9, atol=1e-9)
    assert dict(lm.prefill.used) == {"one-call (memory cut to steps-128)": 1}


def test_auto_follows_the_measured_table():
    for (device, dtype), table in prefill.MEASURED.items():
        assert device and table == sorted(table)
        for up_to, rule in table:
            assert prefill.measured_rule(torch.device(device), dtype, up_to) == rule
        assert prefill.measured_rule(torch.device(device), dtype, table[-1][0] + 1) == prefill.UNMEASURED
    assert prefill.measured_rule(torch.device("meta"), torch.float16, 1000) == prefill.UNMEASURED
    assert prefill.parse(" Steps-0064 ") == "steps-64" and prefill.parse("AUTO") == "auto"
    assert prefill.measured_rule(torch.device("cpu"), torch.bfloat16, 4096) == "steps-512"


def test_auto_reads_a_fresh_prompt_in_one_call_and_a_continuation_in_steps(lm):
    lm.prefill.used.clear()
    _, state = lm.forward_last(ids(600), lm.init_state(1), 1)  # float64: nothing measured, one call
    lm.forward_last(ids(600, seed=1), state, 1)  # onto a cache: the masked rule
    assert dict(lm.prefill.used) == {"one-call": 1, prefill.MASKED: 1}


@pytest.mark.parametrize("value", ["fast", "steps-0", "steps-x", "steps-"])
def test_a_bad_prefill_option_is_one_line(llama_dir, value):
    with pytest.raises(MegaevalError, match=r"bad prefill rule .*; write prefill=auto, prefill=one-call or prefill="):
        load_model(f"hf:{llama_dir}", dtype="float64", prefill=value)


def test_the_option_is_recorded_and_each_rule_counted(llama_dir):
    lm = load_model(f"hf:{llama_dir}", dtype="float64", prefill="steps-64")
    assert lm.options()["prefill"] == "steps-64"
    lm.forward_last(ids(100), lm.init_state(1), 1)
    assert lm.describe()["prefill"] == {"rule": "steps-64", "reads": {"steps-64": 1}, "tokens": {"steps-64": 100}}
