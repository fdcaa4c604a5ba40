"""The first-order linear recurrence h_t = a_t * h_{t-1} + b_t that every recurrent family runs, two ways.

`scan` is the hot path, a blocked scan with O(T) work: the time axis is cut into blocks of BLOCK tokens; one token
loop runs inside every block at once (each step an elementwise op over all blocks), keeping each token's decay
since its block began; the blocks' ends, a recurrence of one step per block, are scanned the same way; one last
pass adds each block's entering state. About four passes over the [B, T, ...] tensors and O(BLOCK log T) ops,
where a Hillis-Steele scan makes log2(T) passes of three ops each. Products of decays only (no division by a
cumulative decay), so it stays exact where decays underflow. `scan_reference` is the plain token loop the tests
hold it equal to. Callers may split long calls into chunks, so that memory never grows beyond one chunk's
[B, T, ...] tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 8  # tokens per block: the token loop inside runs over every block at once (8 was fastest on CPU)


def scan(a: Tensor, b: Tensor, h0: Tensor, overwrite: bool = False) -> tuple[Tensor, Tensor]:
    """h_t = a_t * h_{t-1} + b_t along dim 1 of a, b [B, T, ...] from h0 [B, ...]: (every h_t [B, T, ...], h_T).

    a and b broadcast against each other; the result has their common shape and h0's dtype promoted with theirs.
    `overwrite`: a and b are the caller's scratch (the scan may write into them and return b's memory), which saves
    two copies of each chunk.
    """
    a, b = torch.broadcast_tensors(a, b)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), h0.dtype)
    T = a.shape[1]
    if T == 0:
        return b.new_zeros(b.shape, dtype=dtype), h0
    if torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, h0)):
        return _scan_differentiable(a.to(dtype), b.to(dtype), h0.to(dtype))
    fresh = overwrite and a.dtype == b.dtype == dtype and a.shape == b.shape and a.is_contiguous()
    h = b if fresh and b.is_contiguous() else b.to(dtype).clone()  # becomes every h_t, in place
    a = a.to(dtype)
    B, rest = h.shape[0], h.shape[2:]
    nb = T // BLOCK if T >= 2 * BLOCK else 0
    carry = h0.to(dtype)
    if nb:
        main = h[:, : nb * BLOCK].view(B, nb, BLOCK, *rest)  # the blocks, each a token loop
        blocks = a[:, : nb * BLOCK].reshape(B, nb, BLOCK, *rest)
        decay = blocks if fresh else blocks.clone()  # becomes each token's decay since its block began
        for j in range(1, BLOCK):  # one loop for both (cumprod's CPU kernel is slow off the last axis)
            main[:, :, j].addcmul_(decay[:, :, j], main[:, :, j - 1])
            decay[:, :, j].mul_(decay[:, :, j - 1])
        # the blocks' ends follow the same recurrence, one step per block: scanned the same way (a shorter scan)
        after, carry = scan(decay[:, :, -1], main[:, :, -1], carry)
        entering = torch.cat([h0.to(dtype)[:, None], after[:, :-1]], 1)  # the state entering each block
        main.addcmul_(decay, entering[:, :, None])
    for t in range(nb * BLOCK, T):  # what the blocks left: a token loop
        carry = h[:, t].addcmul_(a[:, t], carry)
    return h, h[:, -1]


def _scan_differentiable(a: Tensor, b: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """`scan` out of place, so that autograd can run through it (training)."""
    b = torch.cat([b[:, :1] + a[:, :1] * h0[:, None], b[:, 1:]], dim=1)
    k = 1
    while k < a.shape[1]:
        b = torch.cat([b[:, :k], b[:, k:] + a[:, k:] * b[:, :-k]], dim=1)
        a = torch.cat([a[:, :k], a[:, k:] * a[:, :-k]], dim=1)
        k *= 2
    return b, b[:, -1]


def scan_reference(a: Tensor, b: Tensor, h0: Tensor, overwrite: bool = False) -> tuple[Tensor, Tensor]:
    """`scan` as a token loop (the reference it is tested against); it never writes into a or b."""
    a, b = torch.broadcast_tensors(a, b)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), h0.dtype)
    h = h0.to(dtype)
    out = []
    for t in range(a.shape[1]):
        h = a[:, t].to(dtype) * h + b[:, t].to(dtype)
        out.append(h)
    return (torch.stack(out, 1) if out else b.new_zeros(b.shape, dtype=dtype)), h
