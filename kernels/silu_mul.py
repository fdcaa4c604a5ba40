"""a * silu(b) in one pass: MEGALODON's output gate (attention times silu of the reset projection) and its SwiGLU
feed-forward (silu of one projection times the other)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .common import cdiv, check_input, interpreting, jit, tl

# ----------------------------------------------------------------------------------- reference


def silu_mul(a: Tensor, b: Tensor) -> Tensor:
    """a * silu(b), each step rounded to the inputs' dtype, as two PyTorch ops compute it."""
    return a * F.silu(b)


# -------------------------------------------------------------------------------------- Triton


@jit
def _silu_mul_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """One program: BLOCK elements, computed in float32 and rounded once."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    a = tl.load(a_ptr + i, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + i, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, (a * b / (1.0 + tl.exp(-b))).to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(a: Tensor, b: Tensor) -> Tensor:
    """a * silu(b) by the Triton kernel for tensors of one shape and dtype; rounded once, so within a rounding of
    `silu_mul`."""
    check_input("a", a)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"silu_mul_triton takes two tensors of one shape and dtype, got {a.shape} {b.shape}")
    a, b = a.contiguous(), b.contiguous()
    y = torch.empty_like(a)
    block = 64 if interpreting() else 2048
    if a.numel():
        _silu_mul_kernel[(cdiv(a.numel(), block),)](a, b, y, a.numel(), BLOCK=block, num_warps=8)
    return y
