"""MEGALODON's shared query/key: the z projection normalised per head (RMSNorm without affine), then scaled and
shifted twice, once into the queries and once into the keys: q = z_n (gamma_0 + 1) / sqrt(d_head) + beta_0,
k = z_n (gamma_1 + 1) / sqrt(d_head) + beta_1."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .common import cdiv, check_input, interpreting, jit, next_pow2, tl
from .rms_norm import rms_norm

# ----------------------------------------------------------------------------------- reference


def shared_qk(z: Tensor, gamma: Tensor, beta: Tensor, heads: int, eps: float) -> tuple[Tensor, Tensor]:
    """q and k [B, T, heads, Z / heads] of z [B, T, Z]; gamma, beta [2, Z]: (queries, keys). Each step is
    rounded to z's dtype, as PyTorch computes it op by op."""
    B, T, Z = z.shape
    z = rms_norm(z.view(B, T, heads, -1), None, eps).view(B, T, 1, Z)
    q, k = (z * ((gamma + 1.0) / math.sqrt(Z // heads)) + beta).unbind(2)
    return q.view(B, T, heads, -1), k.view(B, T, heads, -1)


# -------------------------------------------------------------------------------------- Triton


@jit
def _shared_qk_kernel(
    z_ptr, q_ptr, k_ptr, gamma_ptr, beta_ptr, M, H, DH, eps, inv_sqrt_dh, sz,
    BLOCK_M: tl.constexpr, BLOCK_DH: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M rows (tokens) of one head; the head's RMSNorm and both affine maps in float32, each
    result rounded once. q and k are contiguous [M, H * DH]."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    j = tl.arange(0, BLOCK_DH)
    j_mask = j < DH
    mask = (rows < M)[:, None] & j_mask[None, :]
    col = h * DH + j
    z = tl.load(z_ptr + rows[:, None] * sz + col[None, :], mask=mask, other=0.0).to(tl.float32)
    zn = z / tl.sqrt(tl.sum(z * z, axis=1) / DH + eps)[:, None]
    Z = H * DH
    for which in tl.static_range(2):  # 0: queries, 1: keys
        g = tl.load(gamma_ptr + which * Z + col, mask=j_mask, other=0.0).to(tl.float32)
        b = tl.load(beta_ptr + which * Z + col, mask=j_mask, other=0.0).to(tl.float32)
        out = zn * ((g + 1.0) * inv_sqrt_dh)[None, :] + b[None, :]
        dst = q_ptr if which == 0 else k_ptr
        tl.store(dst + rows[:, None] * Z + col[None, :], out.to(dst.dtype.element_ty), mask=mask)


def shared_qk_triton(z: Tensor, gamma: Tensor, beta: Tensor, heads: int, eps: float) -> tuple[Tensor, Tensor]:
    """`shared_qk` by the Triton kernel (each result rounded once, so within a rounding of the reference)."""
    check_input("z", z)
    B, T, Z = z.shape
    rows = z.reshape(-1, Z)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    q, k = (torch.empty(B, T, heads, Z // heads, dtype=z.dtype, device=z.device) for _ in range(2))
    M, dh = rows.shape[0], Z // heads
    block_m = 16 if interpreting() else 32
    if M:
        _shared_qk_kernel[(cdiv(M, block_m), heads)](
            rows, q, k, gamma.contiguous(), beta.contiguous(), M, heads, dh, eps, 1.0 / math.sqrt(dh), rows.stride(0),
            BLOCK_M=block_m, BLOCK_DH=next_pow2(dh), num_warps=4,
        )  # fmt: skip
    return q, k
