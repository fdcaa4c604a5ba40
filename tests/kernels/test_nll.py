"""Output projection + NLL: the plain-PyTorch reference against an explicit log-softmax, and the Triton
kernel against the reference."""

from __future__ import annotations

import pytest
import torch

from megaeval import MegaevalError
from megaeval.kernels import nll
from megaeval.kernels.common import available
from megaeval.kernels.nll import linear_nll, linear_nll_triton
from megaeval_testing import VOCAB


def random_case(vocab: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 37, 16, generator=g)
    weight = torch.randn(vocab, 16, generator=g) * 0.5
    targets = torch.randint(0, vocab, (2, 37), generator=g)
    targets[0, 3] = targets[1, 0] = -100
    return hidden, weight, targets


# ----------------------------------------------------------------------------------- reference


def test_reference_is_minus_log_softmax_of_the_target():
    hidden, weight, targets = random_case(VOCAB + 7)
    hidden, weight = hidden.double(), weight.double()
    got = linear_nll(hidden, weight, targets)
    logits = hidden @ weight.T
    expected = torch.logsumexp(logits, -1) - logits.gather(-1, targets.clamp_min(0)[..., None])[..., 0]
    expected[targets == -100] = 0.0
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


# -------------------------------------------------------------------------------------- Triton

triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")


@triton_only
@pytest.mark.parametrize("vocab", [VOCAB, VOCAB + 7])
@pytest.mark.parametrize("piece", [None, 5])
def test_kernel_matches_reference(vocab, piece, monkeypatch):
    if piece is not None:  # rows projected a few at a time: 74 rows in pieces of 5
        monkeypatch.setattr(nll, "LOGITS_PER_PIECE", vocab * piece)
    hidden, weight, targets = random_case(vocab)
    got = linear_nll_triton(hidden, weight, targets)
    assert got.shape == targets.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, linear_nll(hidden, weight, targets), rtol=0, atol=1e-5)
    assert got[0, 3] == got[1, 0] == 0.0
    # bfloat16: the projection rounds logits to bfloat16 as the reference does, so only the reduction order differs
    got = linear_nll_triton(hidden.bfloat16(), weight.bfloat16(), targets)
    torch.testing.assert_close(got, linear_nll(hidden.bfloat16(), weight.bfloat16(), targets), atol=1e-5, rtol=0)


@triton_only
def test_reduction_matches_log_softmax_and_keeps_nan():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 70, generator=g, dtype=torch.float64) * 30  # large spread: the online maximum matters
    targets = torch.tensor([0, 69, 5, -100, 33, 1])
    got = nll.lse_nll_triton(logits.float(), targets)
    expected = -torch.log_softmax(logits, -1).gather(-1, targets.clamp_min(0)[:, None])[:, 0]
    expected[3] = 0.0
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-4)
    logits[2, 40] = float("nan")
    assert torch.isnan(nll.lse_nll_triton(logits.float(), targets)[2])


@triton_only
def test_kernel_rejects_out_of_range_targets():
    with pytest.raises(MegaevalError, match="targets must lie in"):
        linear_nll_triton(torch.randn(1, 3, 4), torch.randn(10, 4), torch.tensor([[1, 10, 2]]))
