"""TimestepNorm: the plain-PyTorch reference against naive loops, and the Triton kernel against the reference."""

from __future__ import annotations

import pytest
import torch

from megaeval.kernels.common import available
from megaeval.kernels.timestep_norm import timestep_norm, timestep_norm_triton
from megaeval_testing.naive_megalodon import naive_timestep_norm
from megaeval_testing.streaming import SPLITS, calls


def stream_norm(fn, x, weight, bias, sizes, count=0, mean=None, var=None):
    B, G = x.shape[0], 3
    mean = torch.zeros(B, G, dtype=torch.float64) if mean is None else mean
    var = torch.ones(B, G, dtype=torch.float64) if var is None else var
    ys = []
    for part in calls(x.shape[1], sizes):
        y, mean, var = fn(x[:, part], weight, bias, count, mean, var, 1e-5)
        count += part.stop - part.start
        ys.append(y)
    return torch.cat(ys, 1), mean, var


# ----------------------------------------------------------------------------------- reference


@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("prior", [0, 5])
def test_reference_matches_welford_loop_across_calls(sizes, prior):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 12, generator=g, dtype=torch.float64) * 3 + 1.5
    weight, bias = torch.randn(12, generator=g) * 0.3, torch.randn(12, generator=g) * 0.3
    prior_mean, prior_var = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 2.7, 0.4])
    y, mean, var = stream_norm(
        timestep_norm, x, weight, bias, sizes, prior, prior_mean.repeat(2, 1), prior_var.double().repeat(2, 1)
    )
    expected = naive_timestep_norm(x, weight, bias, 3, 1e-5, (prior, prior_mean, prior_var.double()))
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-10)
    seen = x.view(2, 37, 3, 4).transpose(1, 2).reshape(2, 3, -1)
    if prior == 0:
        torch.testing.assert_close(mean, seen.mean(-1), rtol=0, atol=1e-12)
        torch.testing.assert_close(var, seen.var(-1, unbiased=False), rtol=0, atol=1e-12)


# -------------------------------------------------------------------------------------- Triton

triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")


@triton_only
@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("prior", [0, 5])
def test_kernel_matches_reference_across_calls(sizes, prior):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 12, generator=g) * 3 + 1.5
    weight, bias = torch.randn(12, generator=g) * 0.3, torch.randn(12, generator=g) * 0.3
    prior_mean = torch.tensor([[0.5, -1.0, 2.0]] * 2, dtype=torch.float64)
    prior_var = torch.tensor([[1.0, 2.7, 0.4]] * 2, dtype=torch.float64)
    expected = stream_norm(timestep_norm, x, weight, bias, [37], prior, prior_mean, prior_var)
    got = stream_norm(timestep_norm_triton, x, weight, bias, sizes, prior, prior_mean, prior_var)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=2e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-6)  # float32 inputs, rounding ~1e-7
    torch.testing.assert_close(got[2], expected[2], rtol=1e-6, atol=0)
    assert got[1].dtype == got[2].dtype == torch.float64


@triton_only
def test_kernel_blocks_in_parallel_start_from_pooled_statistics():
    """One call of 150 timesteps runs in 5 blocks (the last partial), each started from the carried statistics
    pooled with those of the blocks before it."""
    from megaeval.kernels.timestep_norm import _config, block_len

    assert -(-150 // block_len(150, _config(150, 4)["BLOCK_T"])) == 5
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 150, 12, generator=g) * 2 - 0.7
    weight, bias = torch.randn(12, generator=g) * 0.3, torch.randn(12, generator=g) * 0.3
    mean = torch.randn(2, 3, generator=g, dtype=torch.float64)
    var = torch.rand(2, 3, generator=g, dtype=torch.float64) + 0.5
    expected = stream_norm(timestep_norm, x, weight, bias, [150], 7, mean, var)
    got = stream_norm(timestep_norm_triton, x, weight, bias, [150], 7, mean, var)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=2e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[2], expected[2], rtol=1e-6, atol=0)


@triton_only
@pytest.mark.slow  # a larger size of test_kernel_matches_reference_across_calls (float64 statistics across calls)
def test_kernel_statistics_stay_float64_exact_over_a_long_shifted_stream():
    """8 calls of 250 tokens at 1000 +- 0.01: float32 arithmetic, statistics as exact as float64."""
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randn(1, 250, 8, generator=g) * 0.01 + 1000.0 for _ in range(8)]
    zeros = torch.zeros(8)
    count, mean, var = 0, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    ref_mean, ref_var = mean, var
    for c in chunks:
        _, mean, var = timestep_norm_triton(c, zeros, zeros, count, mean, var, 1e-5)
        _, ref_mean, ref_var = timestep_norm(c, zeros, zeros, count, ref_mean, ref_var, 1e-5)
        count += c.shape[1]
    everything = torch.cat(chunks, 1).double().view(1, -1, 2, 4).transpose(1, 2).reshape(1, 2, -1)
    for m, v in ((mean, var), (ref_mean, ref_var)):  # the kernel and the float64 reference, against exact values
        torch.testing.assert_close(m, everything.mean(-1), rtol=0, atol=1e-9)
        torch.testing.assert_close(v, everything.var(-1, unbiased=False), rtol=1e-6, atol=0)
    torch.testing.assert_close(mean, ref_mean, rtol=0, atol=1e-9)


@triton_only
def test_kernel_takes_bfloat16():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(1, 21, 12, generator=g) + 0.5).bfloat16()
    weight, bias = torch.randn(12, generator=g).bfloat16(), torch.randn(12, generator=g).bfloat16()
    expected = stream_norm(timestep_norm, x, weight, bias, [21])
    got = stream_norm(timestep_norm_triton, x, weight, bias, [13, 8])
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0].float(), expected[0].float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-6)
