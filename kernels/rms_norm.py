"""RMSNorm over the last dimension, x / rms(x), times (weight + 1) when affine, computed in float32 (float64 for
float64 models): MEGALODON's norm of the CEMA output and its per-head norm of the shared q/k projection."""

from __future__ import annotations

import torch
from torch import Tensor

from .common import acc_dtype, check_input, interpreting, jit, next_pow2, tl

# ----------------------------------------------------------------------------------- reference


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """x / rms(x), times (weight + 1) when affine."""
    acc = acc_dtype(x.dtype)
    y = x.to(acc) * torch.rsqrt(x.to(acc).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.to(acc) + 1.0)
    return y.to(x.dtype)


# -------------------------------------------------------------------------------------- Triton


@jit
def _rms_norm_kernel(
    x_ptr, y_ptr, w_ptr, N, eps, sx,
    AFFINE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program: one row of N, read twice (sum of squares, then scale) in float32, written once."""
    row = tl.program_id(0).to(tl.int64)  # row offsets can pass 2**31 elements
    x_row = x_ptr + row * sx
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        total += x * x
    scale = 1.0 / tl.sqrt(tl.sum(total, axis=0) / N + eps)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = cols < N
        y = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) * scale
        if AFFINE:
            y = y * (tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + 1.0)
        tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm by the Triton kernel; same arguments and results as `rms_norm`."""
    check_input("x", x)
    N = x.shape[-1]
    rows = x.reshape(-1, N)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = min(next_pow2(N), 16 if interpreting() else 4096)  # the interpreter: several blocks a row
        _rms_norm_kernel[(rows.shape[0],)](
            rows, y, rows if weight is None else weight, N, eps, rows.stride(0),
            AFFINE=weight is not None, BLOCK_N=block, num_warps=4 if N <= 1024 else 8,
        )  # fmt: skip
    return y.view(x.shape)
