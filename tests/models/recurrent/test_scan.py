"""The blocked scan of h_t = a_t * h_{t-1} + b_t equals its token loop and an explicit sum."""

from __future__ import annotations

import pytest
import torch

from megaeval.models.recurrent.scan import BLOCK, scan, scan_reference


@pytest.mark.parametrize("T", [1, 2, 3, 2 * BLOCK - 1, 2 * BLOCK, 2 * BLOCK + 1, 17, 64, 100])
def test_scan_equals_token_loop(T: int) -> None:
    g = torch.Generator().manual_seed(T)
    a = torch.rand(2, T, 3, 4, generator=g, dtype=torch.float64)
    b = torch.randn(2, T, 3, 4, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    h, last = scan(a, b, h0)
    ref, ref_last = scan_reference(a, b, h0)
    torch.testing.assert_close(h, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, ref_last, rtol=1e-12, atol=1e-12)


def test_scan_equals_closed_form() -> None:
    """h_t = prod(a_1..a_t) h0 + sum_s prod(a_{s+1}..a_t) b_s, written out term by term."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(1, 9, 2, generator=g, dtype=torch.float64)
    b = torch.randn(1, 9, 2, generator=g, dtype=torch.float64)
    h0 = torch.randn(1, 2, generator=g, dtype=torch.float64)
    h, _ = scan(a, b, h0)
    for t in range(9):
        want = a[0, : t + 1].prod(0) * h0[0]
        for s in range(t + 1):
            want = want + a[0, s + 1 : t + 1].prod(0) * b[0, s]
        torch.testing.assert_close(h[0, t], want, rtol=1e-12, atol=1e-12)


def test_scan_broadcasts_and_survives_underflow() -> None:
    """Decays that underflow to zero (exp(-1000)) forget the past exactly, without inf or nan."""
    a = torch.exp(torch.full((1, 40, 1), -1000.0, dtype=torch.float32))
    b = torch.randn(1, 40, 5, dtype=torch.float32)
    h, last = scan(a, b, torch.full((1, 5), 1e30))
    assert torch.isfinite(h).all()
    torch.testing.assert_close(h, b.expand_as(h))
    torch.testing.assert_close(last, b[:, -1])


def test_scan_of_nothing_keeps_the_state() -> None:
    h0 = torch.randn(2, 3)
    h, last = scan(torch.ones(2, 0, 3), torch.zeros(2, 0, 3), h0)
    assert h.shape == (2, 0, 3) and torch.equal(last, h0)


def test_differentiable_path_equals_the_in_place_one_and_has_gradients() -> None:
    """With autograd on, `scan` runs out of place: same numbers, and gradients equal the token loop's."""
    g = torch.Generator().manual_seed(3)
    a = torch.rand(2, 21, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 21, 3, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        fast, _ = scan(a, b, h0)
    h, _ = scan(a, b, h0)
    torch.testing.assert_close(h, fast, rtol=1e-12, atol=1e-12)
    (h * torch.arange(3.0, dtype=torch.float64)).sum().backward()
    grads = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    ref, _ = scan_reference(a, b, h0)
    (ref * torch.arange(3.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(grads[0], a.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1], b.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scan_equals_token_loop_with_underflowing_decays_broadcast_and_promoted(dtype) -> None:
    """Random decays of which a third underflow to exactly 0 mid-block (the past forgotten there), a decay shared by
    the last axis (broadcast), h0 of another dtype: the blocked scan equals the token loop at every length."""
    g = torch.Generator().manual_seed(11)
    for T in (1, BLOCK, 3 * BLOCK + 5, 8 * BLOCK):
        logs = torch.randn(3, T, 5, 1, generator=g, dtype=torch.float64) * 200
        a = torch.exp(torch.where(logs < -100, logs * 10, logs.clamp(max=0) / 50)).to(dtype)  # 0 where < -100
        b = torch.randn(3, T, 5, 4, generator=g, dtype=dtype)
        h0 = torch.randn(3, 5, 4, generator=g, dtype=torch.float32)
        h, last = scan(a, b, h0)
        ref, ref_last = scan_reference(a, b, h0)
        assert h.dtype == ref.dtype == dtype and h.shape == (3, T, 5, 4) and (a == 0).any()
        tol = 1e-13 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(h, ref, rtol=tol, atol=tol)
        torch.testing.assert_close(last, ref_last, rtol=tol, atol=tol)
