"""The first-order linear recurrence h_t = a_t * h_{t-1} + b_t that every recurrent family runs, two ways.

`scan` is the hot path: a parallel (Hillis-Steele) scan over the time axis of one chunk, log2(T) elementwise steps
with no Python loop over tokens; products of decays only (no division by a cumulative decay), so it stays exact
where decays underflow. `scan_reference` is the plain token loop the tests hold it equal to. Callers split long
calls into chunks themselves, so memory never grows beyond one chunk's [B, T, ...] tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor


def scan(a: Tensor, b: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """h_t = a_t * h_{t-1} + b_t along dim 1 of a, b [B, T, ...] from h0 [B, ...]: (every h_t [B, T, ...], h_T).

    a and b broadcast against each other; the result has their common shape and h0's dtype promoted with theirs.
    """
    a, b = torch.broadcast_tensors(a, b)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), h0.dtype)
    T = a.shape[1]
    if T == 0:
        return b.new_zeros(b.shape, dtype=dtype), h0
    if torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, h0)):
        return _scan_differentiable(a.to(dtype), b.to(dtype), h0.to(dtype))
    a, b = a.to(dtype).clone(), b.to(dtype).clone()  # in place on copies: a third less memory traffic
    b[:, 0].addcmul_(a[:, 0], h0.to(dtype))
    k = 1
    while k < T:
        b[:, k:].addcmul_(a[:, k:], b[:, :-k].clone())  # the clone: the two sides overlap
        a[:, k:].mul_(a[:, :-k].clone())
        k *= 2
    return b, b[:, -1]


def _scan_differentiable(a: Tensor, b: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """`scan` out of place, so that autograd can run through it (training)."""
    b = torch.cat([b[:, :1] + a[:, :1] * h0[:, None], b[:, 1:]], dim=1)
    k = 1
    while k < a.shape[1]:
        b = torch.cat([b[:, :k], b[:, k:] + a[:, k:] * b[:, :-k]], dim=1)
        a = torch.cat([a[:, :k], a[:, k:] * a[:, :-k]], dim=1)
        k *= 2
    return b, b[:, -1]


def scan_reference(a: Tensor, b: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """`scan` as a token loop (the reference it is tested against)."""
    a, b = torch.broadcast_tensors(a, b)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), h0.dtype)
    h = h0.to(dtype)
    out = []
    for t in range(a.shape[1]):
        h = a[:, t].to(dtype) * h + b[:, t].to(dtype)
        out.append(h)
    return (torch.stack(out, 1) if out else b.new_zeros(b.shape, dtype=dtype)), h
