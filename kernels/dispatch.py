"""Which implementation runs MEGALODON's four hot operations: the PyTorch references or the fast path (the Triton
kernels, with chunk attention through PyTorch's fused attention kernels and the projection through cuBLAS)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import fail
from . import attention, cema, nll, rms_norm, shared_qk, silu_mul, timestep_norm
from .common import available, interpreting

KERNELS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class Ops:
    """TimestepNorm, CEMA, chunk-local attention and the projection + NLL, and the elementwise glue around them
    (RMSNorm, the SiLU gates, the shared query/key), all from one backend."""

    backend: str  # "torch" or "triton"
    timestep_norm: Callable[..., tuple[Tensor, Tensor, Tensor]]
    cema: Callable[..., tuple[Tensor, Tensor]]
    chunked_attention: Callable[..., tuple[Tensor, Tensor, Tensor]]
    linear_nll: Callable[[Tensor, Tensor, Tensor], Tensor]
    rms_norm: Callable[[Tensor, Tensor | None, float], Tensor]
    silu_mul: Callable[[Tensor, Tensor], Tensor]
    shared_qk: Callable[[Tensor, Tensor, Tensor, int, float], tuple[Tensor, Tensor]]


TORCH = Ops(
    "torch",
    timestep_norm.timestep_norm,
    cema.cema,
    attention.chunked_attention,
    nll.linear_nll,
    rms_norm.rms_norm,
    silu_mul.silu_mul,
    shared_qk.shared_qk,
)
TRITON = Ops(
    "triton",
    timestep_norm.timestep_norm_triton,
    cema.cema_triton,
    attention.chunked_attention_fused,
    nll.linear_nll_triton,
    rms_norm.rms_norm_triton,
    silu_mul.silu_mul_triton,
    shared_qk.shared_qk_triton,
)


def select(kernels: str, device: str | torch.device, dtype: torch.dtype | None = None) -> Ops:
    """The ops for `kernels` ("auto", "triton" or "torch") on `device` (and `dtype`, when known).

    "auto" is Triton on CUDA and PyTorch otherwise; float64 models always get PyTorch under "auto",
    since the kernels compute in float32. "triton" off CUDA runs only in Triton's CPU interpreter
    (TRITON_INTERPRET=1, for tests); otherwise it is an error, as is "triton" for float64.
    """
    if kernels not in KERNELS:
        raise fail(f"unknown kernels {kernels!r}", f"use one of: {', '.join(KERNELS)}")
    device = torch.device(device)
    if kernels == "torch":
        return TORCH
    if kernels == "auto":
        return TRITON if device.type == "cuda" and available() and dtype != torch.float64 else TORCH
    if not available():
        raise fail("kernels 'triton' needs Triton, which is not installed", "install triton, or use kernels 'auto'")
    if dtype == torch.float64:
        raise fail(
            "the Triton kernels compute in float32 and do not run float64 models", "use kernels 'auto' or 'torch'"
        )
    if device.type != "cuda" and not interpreting():
        raise fail(
            f"kernels 'triton' needs a CUDA device, not {device.type}",
            "use kernels 'auto' or 'torch' (or set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)",
        )
    return TRITON
