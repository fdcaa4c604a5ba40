"""CEMA: the plain-PyTorch reference against the token-by-token recurrence, and the Triton kernel against
the reference."""

from __future__ import annotations

import pytest
import torch

from megaeval.kernels.cema import block_len, cema, cema_triton, complex_powers
from megaeval.kernels.common import available
from megaeval.models.megalodon.model import MultiHeadComplexEMA
from megaeval_testing.naive_megalodon import naive_cema
from megaeval_testing.streaming import SPLITS, calls


def random_cema(dim: int, ndim: int, seed: int) -> MultiHeadComplexEMA:
    """The model's CEMA module, only for its parameterisation: coefficients() gives p, log q, gamma."""
    cema_module = MultiHeadComplexEMA(dim, ndim)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in cema_module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return cema_module


def stream_cema(fn, module, x, h, sizes):
    p, log_q, gamma = module.coefficients()
    ys = []
    for part in calls(x.shape[1], sizes):
        y, h = fn(x[:, part], h, p, log_q, gamma, module.omega)
        ys.append(y)
    return torch.cat(ys, 1), h


# ----------------------------------------------------------------------------------- reference


def test_complex_powers_match_direct_powers():
    log_q = torch.complex(torch.tensor([[-0.01, -0.5]]).double(), torch.tensor([[0.3, 2.9]]).double())
    got = complex_powers(log_q, 1000, torch.complex128)
    t = torch.arange(1000, dtype=torch.float64)
    expected = torch.exp(log_q[..., None] * t)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("sizes", SPLITS)
def test_reference_matches_token_by_token_recurrence_from_a_carried_state(sizes):
    module = random_cema(6, 3, seed=0).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 37, 6, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 6, 3, dtype=torch.complex128, generator=g)
    y, h = stream_cema(cema, module, x, h0, sizes)
    m = module
    y_naive, h_naive = naive_cema(x, m.alpha, m.delta, m.theta, m.gamma, m.omega, h0)
    torch.testing.assert_close(y, y_naive, rtol=0, atol=1e-10)
    torch.testing.assert_close(h, h_naive, rtol=0, atol=1e-10)


# -------------------------------------------------------------------------------------- Triton

triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")


@triton_only
@pytest.mark.parametrize("sizes", SPLITS)
def test_kernel_matches_reference_across_calls(sizes):
    module = random_cema(6, 3, seed=0)  # N = 3 and D = 6 are not powers of two: masked lanes
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 37, 6, generator=g)
    h0 = torch.randn(2, 6, 3, dtype=torch.complex64, generator=g)
    y_ref, h_ref = stream_cema(cema, module, x, h0, [37])
    y, h = stream_cema(cema_triton, module, x, h0, sizes)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-5)
    assert h.dtype == torch.complex64


@triton_only
def test_kernel_blocks_in_parallel_carry_the_state_exactly():
    """A call of 101 steps runs in 4 blocks (the last partial), each block's start state made from the end states
    of the blocks before it; the carried state enters the first."""
    assert -(-101 // block_len(101)) == 4
    module = random_cema(5, 3, seed=6)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 101, 5, generator=g)
    h0 = torch.randn(3, 5, 3, dtype=torch.complex64, generator=g)
    y_ref, h_ref = stream_cema(cema, module.double(), x.double(), h0.to(torch.complex128), [101])
    y, h = stream_cema(cema_triton, module, x, h0, [101])
    torch.testing.assert_close(y.double(), y_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(h.to(torch.complex128), h_ref, rtol=0, atol=1e-5)


@triton_only
def test_kernel_long_slowly_decaying_call_stays_accurate():
    """|q| ~ 0.9999 over 600 steps in two calls: float32 kernel within 1e-5 of the float64 reference."""
    module = random_cema(4, 3, seed=4)
    with torch.no_grad():
        module.alpha.fill_(-6.0)
        module.delta.fill_(-3.0)
    x = torch.randn(1, 600, 4, generator=torch.Generator().manual_seed(5))
    y64, h64 = stream_cema(cema, module.double(), x.double(), torch.zeros(1, 4, 3, dtype=torch.complex128), [600])
    y32, h32 = stream_cema(cema_triton, module.float(), x, torch.zeros(1, 4, 3, dtype=torch.complex64), [389, 211])
    assert (y32.double() - y64).abs().max() < 1e-5 * y64.abs().max()
    assert (h32.to(torch.complex128) - h64).abs().max() < 1e-5 * h64.abs().max()


@triton_only
def test_kernel_takes_bfloat16():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(1, 21, 12, generator=g) + 0.5).bfloat16()
    module = random_cema(12, 4, seed=3).bfloat16()
    h0 = torch.zeros(1, 12, 4, dtype=torch.complex64)
    y_ref, h_ref = stream_cema(cema, module, x, h0, [21])
    y, h = stream_cema(cema_triton, module, x, h0, [13, 8])
    assert y.dtype == torch.bfloat16 and h.dtype == torch.complex64
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-4)
