"""MEGALODON's TimestepNorm and CEMA modules, for what tests/kernels (their ops against naive loops, in any split
of calls) does not cover: the module's prior statistics, float64 statistics under a float32 model, the count
carried from call to call, and the float32 reference's phase accuracy over a long call."""

from __future__ import annotations

import torch

from megaeval.models.megalodon.model import MultiHeadComplexEMA, TimestepNorm
from megaeval.models.megalodon.state import NormState
from megaeval_testing.naive_megalodon import naive_timestep_norm


def random_norm(dim=12, groups=3, seed=0) -> TimestepNorm:
    torch.manual_seed(seed)
    norm = TimestepNorm(dim, groups, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.normal_(0, 0.3)
        norm.bias.normal_(0, 0.3)
    return norm


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


def test_norm_state_counts_are_carried():
    norm = random_norm()
    state = NormState(0, torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64))
    _, state = norm(torch.randn(1, 4, 12, dtype=torch.float64), state)
    _, state = norm(torch.randn(1, 6, 12, dtype=torch.float64), state)
    assert state.count == 10


def test_cema_coefficients_are_computed_once_and_again_after_any_change():
    """Without gradients the coefficients are the same tensors call after call (the kernels keep their constants by
    them), recomputed after an in-place change, a dtype change or a new parameter; a module made in inference mode
    (whose parameters count no versions) works too."""
    cema = random_cema(seed=1)
    with torch.inference_mode():
        first = cema.coefficients()
        assert all(a is b for a, b in zip(first, cema.coefficients(), strict=True))
    with torch.no_grad():
        cema.alpha.add_(0.5)
        changed = cema.coefficients()
    assert not torch.equal(changed[0], first[0])
    expected = torch.sigmoid(cema.alpha.detach().double()).squeeze(-1)
    torch.testing.assert_close(changed[0], expected, rtol=0, atol=0)
    with torch.no_grad():
        cema.gamma = torch.nn.Parameter(cema.gamma * 2)
        assert torch.equal(cema.coefficients()[2], changed[2] * 2)
        assert cema.float().coefficients()[0].dtype == torch.float64  # recomputed from the float32 parameters
    assert cema.coefficients()[1] is not cema.coefficients()[1]  # with gradients: fresh every call
    with torch.inference_mode():
        made_here = random_cema(seed=2)
        assert made_here.alpha.is_inference()
        assert made_here.coefficients()[1] is made_here.coefficients()[1]
