"""The cost line's estimate (runs.cost): a short probe scaled to each prompt by the model's FLOPs per token."""

from __future__ import annotations

import pytest

from megaeval import load_model
from megaeval.runs.cost import decode_scale, reading_seconds
from megaeval.scoring.generate import read_rate


@pytest.fixture(scope="module")
def transformer():
    return load_model("embedded:transformer-tiny", dtype="float32")


def test_a_prompt_is_scaled_by_its_flops_per_token_against_the_probes(transformer):
    lm, rate = transformer, 1000.0
    fpt = lm.flops_per_token
    expected = 256 / rate * fpt(256) / fpt(64) + 512 / rate * fpt(512) / fpt(64)
    assert reading_seconds(lm, 64, rate, [256, 512]) == pytest.approx(expected, rel=1e-12)
    # attention: a token of a longer prompt costs more, so the estimate grows faster than the tokens
    assert reading_seconds(lm, 64, rate, [512]) > 2 * reading_seconds(lm, 64, rate, [256]) > 4 * 64 / rate
    # the next token after n positions costs what n + 1 positions add to n's FLOPs
    step = lambda n: (n + 1) * fpt(n + 1) - n * fpt(n)  # noqa: E731
    assert decode_scale(lm, 64, 400) == pytest.approx(step(400) / step(64), rel=1e-12) and step(400) > step(64)
    assert decode_scale(lm, 64, 10) == 1.0  # never below the probe's own


def test_a_family_without_flops_reads_every_token_at_the_probes_rate():
    lm = load_model("embedded:mamba2-tiny", dtype="float32")
    if lm.flops_per_token(64) is not None:
        pytest.skip("the family knows its FLOPs")
    assert reading_seconds(lm, 64, 500.0, [100, 3000]) == pytest.approx(3100 / 500.0)
    assert decode_scale(lm, 64, 3000) == 1.0


def test_the_probe_fits_a_model_s_context(transformer):
    rate, step = read_rate(transformer, 10_000)  # asked for more than its 512 positions: reads what fits
    assert rate > 0 and step > 0


def test_the_probe_decodes_as_many_rows_as_the_command_will(transformer, monkeypatch):
    calls = []
    forward_last = transformer.forward_last

    def counting(tokens, state, last):
        calls.append(tokens.shape[0])
        return forward_last(tokens, state, last)

    monkeypatch.setattr(transformer, "forward_last", counting)
    rate, step = read_rate(transformer, 64, steps=3, rows=4)
    assert rate > 0 and step > 0 and calls[-3:] == [4, 4, 4]  # the new tokens, 4 rows a call
