"""Chunk-local attention with RoPE: the plain-PyTorch reference against a full masked softmax, and the fast path
(PyTorch's fused SDPA with sliced value heads, the Triton rotary kernel) against the reference."""

from __future__ import annotations

import math

import pytest
import torch

from megaeval.kernels.attention import (
    apply_rope,
    chunked_attention,
    chunked_attention_fused,
    fused_attend,
    rotate,
    rotate_triton,
)
from megaeval.kernels.common import available
from megaeval_testing.naive_megalodon import naive_chunk_attention, naive_rope
from megaeval_testing.streaming import SPLITS, calls


def stream_attention(fn, q, k, v, sizes, chunk):
    B, _, H, dz = q.shape
    kc, vc = q.new_zeros(B, 0, H, dz), v.new_zeros(B, 0, H, v.shape[-1])
    outs = []
    for part in calls(q.shape[1], sizes):
        out, kc, vc = fn(q[:, part], k[:, part], v[:, part], kc, vc, chunk, 10000.0)
        assert kc.shape[1] == vc.shape[1] == part.stop % chunk  # only the partial chunk is kept
        outs.append(out)
    return torch.cat(outs, 1), kc, vc


# ----------------------------------------------------------------------------------- reference


def test_rope_rotates_adjacent_pairs():
    x = torch.randn(2, 7, 3, 8, dtype=torch.float64)
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    torch.testing.assert_close(apply_rope(x, pos, 10000.0), naive_rope(x, pos, 10000.0))
    # position 0 is the identity; the norm of each pair is preserved
    torch.testing.assert_close(apply_rope(x, torch.zeros(7, dtype=torch.long), 500.0), x)
    pairs = apply_rope(x, pos, 500.0).view(2, 7, 3, 4, 2).norm(dim=-1)
    torch.testing.assert_close(pairs, x.view(2, 7, 3, 4, 2).norm(dim=-1))


@pytest.mark.parametrize("sizes", [*SPLITS, [1] * 37, [3, 29, 5]])
@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_reference_matches_masked_softmax(sizes, chunk):
    torch.manual_seed(5)
    B, T, H = 2, 37, 2
    q, k = torch.randn(B, T, H, 6, dtype=torch.float64), torch.randn(B, T, H, 6, dtype=torch.float64)
    v = torch.randn(B, T, H, 5, dtype=torch.float64)
    expected = naive_chunk_attention(q, k, v, chunk, 10000.0)
    got, _, _ = stream_attention(chunked_attention, q, k, v, sizes, chunk)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_reference_scale_is_one():
    """Two keys with scores 0 and s: weight of the second is sigmoid(s), not sigmoid(s / sqrt(d))."""
    q = torch.zeros(1, 2, 1, 4, dtype=torch.float64)
    q[0, 1, 0, 0] = 1.0
    k = torch.zeros(1, 2, 1, 4, dtype=torch.float64)
    k[0, 1, 0, 0] = 3.0
    v = torch.tensor([0.0, 1.0], dtype=torch.float64).view(1, 2, 1, 1)
    # positions 0 and 1: the rotation of query 1 and key 1 is the same, so their dot product stays 3
    out, _, _ = chunked_attention(q, k, v, q[:, :0], v[:, :0], 8, 10000.0)
    assert math.isclose(float(out[0, 1, 0, 0]), 1 / (1 + math.exp(-3.0)), rel_tol=1e-12)


# ------------------------------------------------------------------------- PyTorch's fused SDPA


triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")


@triton_only
@pytest.mark.parametrize(
    "sizes, chunk, dv",
    [
        *((sizes, chunk, 24) for sizes in SPLITS for chunk in (4, 8, 64)),  # value heads: 4 slices of the q/k width
        *((sizes, 8, 5) for sizes in SPLITS),  # value heads narrower than q/k: no slicing
        ([1] * 37, 8, 24),  # token by token once: the interpreter is slow
    ],
)
def test_fused_matches_masked_softmax(sizes, chunk, dv):
    g = torch.Generator().manual_seed(8)
    B, T, H = 2, 37, 2
    q, k = (torch.randn(B, T, H, 6, dtype=torch.float64, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, dv, dtype=torch.float64, generator=g)
    expected = naive_chunk_attention(q, k, v, chunk, 10000.0)
    got, kc, vc = stream_attention(chunked_attention_fused, q.float(), k.float(), v.float(), sizes, chunk)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-6)
    _, kc_ref, vc_ref = stream_attention(chunked_attention, q.float(), k.float(), v.float(), sizes, chunk)
    torch.testing.assert_close(kc, kc_ref, rtol=0, atol=1e-6)
    assert torch.equal(vc, vc_ref)


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_kernel_matches_rotate_across_a_chunk_boundary(dtype):
    """13 tokens after 6 cached ones in chunks of 8: positions 6, 7, 0, ..., 7, 0, 1, 2 (rotary restarts)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 13, 3, 10, generator=g).to(dtype)
    k = torch.randn(2, 13, 3, 20, generator=g).to(dtype)[..., :10]  # a strided view, as a projection's slice
    cache = torch.zeros(2, 6, 3, 10, dtype=dtype)
    for got, expected in zip(rotate_triton(q, k, cache, 8, 500.0), rotate(q, k, cache, 8, 500.0), strict=True):
        assert got.dtype == dtype and got.is_contiguous()
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)


def test_fused_attend_slices_wide_value_heads_and_aligns_bottom_right():
    """Value heads 4x the q/k width, 3 queries after 5 cached keys: query i sees keys j <= i + 5, every slice of
    the value head weighted by its own head's softmax."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 3, 2, 4, dtype=torch.float64, generator=g)
    k = torch.randn(1, 8, 2, 4, dtype=torch.float64, generator=g)
    v = torch.randn(1, 8, 2, 16, dtype=torch.float64, generator=g)
    scores = torch.einsum("bihd,bjhd->bhij", q, k)
    allowed = torch.arange(8)[None, :] <= torch.arange(3)[:, None] + 5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("bhij,bjhd->bihd", weights, v)
    torch.testing.assert_close(fused_attend(q, k, v), expected, rtol=0, atol=1e-12)


def test_fused_takes_bfloat16():
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(1, 21, 2, 8, generator=g).bfloat16() for _ in range(2))
    v = torch.randn(1, 21, 2, 32, generator=g).bfloat16()
    expected, _, _ = stream_attention(chunked_attention, q, k, v, [21], 8)
    got, _, _ = stream_attention(chunked_attention_fused, q, k, v, [13, 8], 8)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=3e-2)
