"""The elementwise glue of the fast path (RMSNorm, a * silu(b), the shared query/key): the plain-PyTorch references
against explicit formulas, and the Triton kernels against the references."""

from __future__ import annotations

import math

import pytest
import torch

from megaeval.kernels.common import available
from megaeval.kernels.rms_norm import rms_norm, rms_norm_triton
from megaeval.kernels.shared_qk import shared_qk, shared_qk_triton
from megaeval.kernels.silu_mul import silu_mul, silu_mul_triton

triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")


def test_rms_norm_reference_is_x_over_its_root_mean_square():
    x = torch.tensor([[3.0, -4.0], [1.0, 1.0]], dtype=torch.float64)
    w = torch.tensor([0.5, -1.0], dtype=torch.float64)
    rms = torch.tensor([[math.sqrt(12.5)], [1.0]], dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, None, 0.0), x / rms, rtol=1e-15, atol=0)
    torch.testing.assert_close(rms_norm(x, w, 0.0), x / rms * (w + 1), rtol=1e-15, atol=0)


def test_silu_mul_reference_is_a_times_b_sigmoid_b():
    a, b = torch.tensor([2.0, -3.0, 0.5], dtype=torch.float64), torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    torch.testing.assert_close(silu_mul(a, b), a * b / (1 + torch.exp(-b)), rtol=1e-15, atol=0)


@triton_only
@pytest.mark.parametrize("width", [16, 37, 100])  # one block a row, a masked block, several blocks (16 per block)
@pytest.mark.parametrize("affine", [False, True])
def test_rms_norm_kernel_matches_reference(width, affine):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(2, 5, width, generator=g) * 3 + 1
    w = torch.randn(width, generator=g) * 0.2 if affine else None
    torch.testing.assert_close(rms_norm_triton(x, w, 1e-5), rms_norm(x, w, 1e-5), rtol=1e-6, atol=1e-6)
    xb, wb = x.bfloat16(), None if w is None else w.bfloat16()
    got = rms_norm_triton(xb, wb, 1e-5)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    torch.testing.assert_close(got.float(), rms_norm(xb, wb, 1e-5).float(), rtol=1e-2, atol=1e-2)
    # a strided view (the per-head norm of a projection's output) reads the same rows
    view = torch.randn(3, width * 2, generator=g)[:, :width]
    torch.testing.assert_close(rms_norm_triton(view, w, 1e-5), rms_norm(view, w, 1e-5), rtol=1e-6, atol=1e-6)


@triton_only
def test_silu_mul_kernel_matches_reference():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(3, 7, 11, generator=g) * 4, torch.randn(3, 7, 11, generator=g) * 4
    torch.testing.assert_close(silu_mul_triton(a, b), silu_mul(a, b), rtol=1e-6, atol=1e-6)
    got = silu_mul_triton(a.bfloat16(), b.bfloat16())
    assert got.dtype == torch.bfloat16
    exact = silu_mul(a.bfloat16().double(), b.bfloat16().double())
    # rounded once, so within one bfloat16 ulp (2**-7 relative; the interpreter truncates where a GPU rounds to nearest)
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-7).all()
    with pytest.raises(ValueError, match="one shape"):
        silu_mul_triton(a, b[:, :, :5])


def test_shared_qk_reference_normalises_each_head_then_maps_twice():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(2, 3, 8, dtype=torch.float64, generator=g)
    gamma, beta = (
        torch.randn(2, 8, dtype=torch.float64, generator=g),
        torch.randn(2, 8, dtype=torch.float64, generator=g),
    )
    q, k = shared_qk(z, gamma, beta, 2, 0.0)
    heads = z.view(2, 3, 2, 4)
    normed = heads / heads.pow(2).mean(-1, keepdim=True).sqrt()
    for i, got in enumerate((q, k)):
        expected = normed * ((gamma[i] + 1) / 2).view(2, 4) + beta[i].view(2, 4)
        torch.testing.assert_close(got, expected, rtol=1e-14, atol=1e-14)


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_qk_kernel_matches_reference(dtype):
    g = torch.Generator().manual_seed(6)
    z = (torch.randn(2, 19, 3 * 12, generator=g) * 2)[..., :30].to(dtype)  # 19 rows (a partial block), a view
    gamma, beta = (torch.randn(2, 30, generator=g).to(dtype) * 0.3 for _ in range(2))
    got, expected = shared_qk_triton(z, gamma, beta, 3, 1e-5), shared_qk(z, gamma, beta, 3, 1e-5)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == dtype and a.shape == (2, 19, 3, 10)
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
