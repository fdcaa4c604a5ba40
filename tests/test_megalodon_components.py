"""Each MEGALODON component against its naive formula, in one call and carried across calls."""

from __future__ import annotations

import math

import pytest
import torch

from megaeval.models.megalodon.model import (
    MultiHeadComplexEMA,
    NormState,
    TimestepNorm,
    apply_rope,
    chunked_attention,
    complex_powers,
)
from tests.naive_megalodon import (
    explicit_timestep_norm,
    naive_cema,
    naive_chunk_attention,
    naive_rope,
    naive_timestep_norm,
)

SPLITS = [[37], [1] * 37, [5, 1, 13, 2, 16], [8, 8, 8, 13], [3, 29, 5]]


def split_calls(total: int, sizes: list[int]) -> list[tuple[int, int]]:
    assert sum(sizes) == total
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    return bounds


def random_norm(dim=12, groups=3, seed=0) -> TimestepNorm:
    torch.manual_seed(seed)
    norm = TimestepNorm(dim, groups, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.normal_(0, 0.3)
        norm.bias.normal_(0, 0.3)
    return norm


@pytest.mark.parametrize("sizes", SPLITS)
def test_timestep_norm_matches_welford_loop_across_calls(sizes):
    norm = random_norm()
    x = torch.randn(2, 37, 12, dtype=torch.float64) * 3 + 1.5
    expected = naive_timestep_norm(x, norm.weight, norm.bias, 3, 1e-5)
    state = norm.init_state(2)
    outs = []
    for s, e in split_calls(37, sizes):
        y, state = norm(x[:, s:e], state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=0, atol=1e-10)
    assert state.count == 37


def test_timestep_norm_equals_explicit_cumulative_statistics():
    norm = random_norm(seed=1)
    x = torch.randn(3, 20, 12, dtype=torch.float64) * torch.linspace(0.1, 5, 20)[None, :, None]
    y, state = norm(x, norm.init_state(3))
    torch.testing.assert_close(y, explicit_timestep_norm(x, norm.weight, norm.bias, 3, 1e-5), rtol=0, atol=1e-10)
    seen = x.view(3, 20, 3, 4).transpose(1, 2).reshape(3, 3, -1)
    torch.testing.assert_close(state.mean, seen.mean(-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(state.var, seen.var(-1, unbiased=False), rtol=0, atol=1e-12)


def test_timestep_norm_with_prior_statistics():
    norm = random_norm(seed=2)
    with torch.no_grad():
        norm.prior_count.fill_(5)
        norm.prior_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        norm.prior_logv.copy_(torch.tensor([0.0, 1.0, -1.0]))
    x = torch.randn(1, 9, 12, dtype=torch.float64)
    y, _ = norm(x, norm.init_state(1))
    prior = (5, norm.prior_mean.double(), norm.prior_logv.double().exp())
    torch.testing.assert_close(y, naive_timestep_norm(x, norm.weight, norm.bias, 3, 1e-5, prior), rtol=0, atol=1e-10)


def test_timestep_norm_float64_statistics_stay_exact_over_a_long_stream():
    """A float32 model still carries float64 statistics: 200 calls of a shifted signal."""
    norm = TimestepNorm(8, 2, eps=1e-5)
    state = norm.init_state(1)
    torch.manual_seed(3)
    chunks = [torch.randn(1, 50, 8) * 0.01 + 1000.0 for _ in range(200)]
    for c in chunks:
        _, state = norm(c, state)
    everything = torch.cat(chunks, 1).double().view(1, -1, 2, 4).transpose(1, 2).reshape(1, 2, -1)
    assert state.mean.dtype == torch.float64
    torch.testing.assert_close(state.mean, everything.mean(-1), rtol=0, atol=1e-9)
    torch.testing.assert_close(state.var, everything.var(-1, unbiased=False), rtol=1e-6, atol=0)


def random_cema(dim=6, ndim=4, seed=0) -> MultiHeadComplexEMA:
    torch.manual_seed(seed)
    cema = MultiHeadComplexEMA(dim, ndim).double()
    with torch.no_grad():
        for p in cema.parameters():
            p.normal_(0, 1.0)
    return cema


@pytest.mark.parametrize("sizes", SPLITS)
def test_cema_matches_token_by_token_recurrence(sizes):
    cema = random_cema()
    x = torch.randn(2, 37, 6, dtype=torch.float64)
    expected, h_expected = naive_cema(x, cema.alpha, cema.delta, cema.theta, cema.gamma, cema.omega)
    h = torch.zeros(2, 6, 4, dtype=torch.complex128)
    outs = []
    for s, e in split_calls(37, sizes):
        y, h = cema(x[:, s:e], h)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(h, h_expected, rtol=0, atol=1e-10)


def test_cema_float32_long_call_keeps_phase_accuracy():
    """Slowly decaying components over 5000 steps: float32 result within 1e-4 of float64."""
    cema = random_cema(dim=4, ndim=3, seed=4)
    with torch.no_grad():
        cema.alpha.fill_(-6.0)  # p ~ 0.0025 and 1 - p*delta ~ 0.9999: barely decaying
        cema.delta.fill_(-3.0)
    x = torch.randn(1, 5000, 4, dtype=torch.float64)
    y64, _ = cema(x, torch.zeros(1, 4, 3, dtype=torch.complex128))
    y32, _ = cema.float()(x.float(), torch.zeros(1, 4, 3, dtype=torch.complex64))
    assert (y32.double() - y64).abs().max() < 1e-4 * y64.abs().max()


def test_complex_powers_match_direct_powers():
    log_q = torch.complex(torch.tensor([[-0.01, -0.5]]).double(), torch.tensor([[0.3, 2.9]]).double())
    got = complex_powers(log_q, 1000, torch.complex128)
    t = torch.arange(1000, dtype=torch.float64)
    expected = torch.exp(log_q[..., None] * t)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-300)


def test_rope_rotates_adjacent_pairs():
    x = torch.randn(2, 7, 3, 8, dtype=torch.float64)
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    torch.testing.assert_close(apply_rope(x, pos, 10000.0), naive_rope(x, pos, 10000.0))
    # position 0 is the identity; the norm of each pair is preserved
    torch.testing.assert_close(apply_rope(x, torch.zeros(7, dtype=torch.long), 500.0), x)
    pairs = apply_rope(x, pos, 500.0).view(2, 7, 3, 4, 2).norm(dim=-1)
    torch.testing.assert_close(pairs, x.view(2, 7, 3, 4, 2).norm(dim=-1))


@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_chunked_attention_matches_masked_softmax(sizes, chunk):
    torch.manual_seed(5)
    B, T, H = 2, 37, 2
    q, k = torch.randn(B, T, H, 6, dtype=torch.float64), torch.randn(B, T, H, 6, dtype=torch.float64)
    v = torch.randn(B, T, H, 5, dtype=torch.float64)
    expected = naive_chunk_attention(q, k, v, chunk, 10000.0)
    kc, vc = q.new_zeros(B, 0, H, 6), q.new_zeros(B, 0, H, 5)
    outs = []
    for s, e in split_calls(T, sizes):
        out, kc, vc = chunked_attention(q[:, s:e], k[:, s:e], v[:, s:e], kc, vc, chunk, 10000.0)
        outs.append(out)
        assert kc.shape[1] == e % chunk  # only the partial chunk is kept
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=0, atol=1e-12)


def test_attention_scale_is_one():
    """Two keys with scores 0 and s: weight of the second is sigmoid(s), not sigmoid(s / sqrt(d))."""
    q = torch.zeros(1, 2, 1, 4, dtype=torch.float64)
    q[0, 1, 0, 0] = 1.0
    k = torch.zeros(1, 2, 1, 4, dtype=torch.float64)
    k[0, 1, 0, 0] = 3.0
    v = torch.tensor([0.0, 1.0], dtype=torch.float64).view(1, 2, 1, 1)
    # positions 0 and 1: the rotation of query 1 and key 1 is the same, so their dot product stays 3
    out, _, _ = chunked_attention(q, k, v, q[:, :0], v[:, :0], 8, 10000.0)
    assert math.isclose(float(out[0, 1, 0, 0]), 1 / (1 + math.exp(-3.0)), rel_tol=1e-12)


def test_norm_state_counts_are_carried():
    norm = random_norm()
    state = NormState(0, torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64))
    _, state = norm(torch.randn(1, 4, 12, dtype=torch.float64), state)
    _, state = norm(torch.randn(1, 6, 12, dtype=torch.float64), state)
    assert state.count == 10
