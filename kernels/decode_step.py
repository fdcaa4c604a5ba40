"""MEGALODON's decoding step for one token per row in static buffers (megalodon/decode.py's `StaticDecoder`): the
work between the projections, as plain-PyTorch references (the unfused step runs them) and as Triton kernels (the
fused step), with the same arguments and results, gathered here in two sets (TORCH, TRITON); the operations are in
decode_norm and decode_attention.

    norm_cema_step       the layer's input (the previous layer's FFN residual added), its TimestepNorm for one
                         timestep (float64 statistics updated in place), CEMA for one timestep (float32 state updated
                         in place) and the RMSNorm of the CEMA output: y (for wv) and mx (for wz, wr, wh1)
    norm_step            the same without CEMA: the final norm
    qk_step              the per-head RMSNorm of wz's output, the q/k affine, the rotary rotation at each row's slot,
                         and the writes of the new key and silu(value) into the chunk caches at that slot
    attend_step          softmax attention of one query per row over the keys of its chunk up to its own slot, times
                         silu(r): the input of wh2
    residual_layer_norm  LayerNorm(x + h): the FFN's norm

Rows are at their own places in their chunks: `Slots.fill[b]` keys were cached before this token, which goes to slot
`fill[b]`. The kernels keep the references' precision choices (float64 norm statistics, float32 CEMA state and
attention scores, rounding to the model dtype where the references round), so they differ from them by rounding;
they take float32, bfloat16 or float16 models (the unfused step serves float64 ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import MegaevalError
from . import silu_mul
from .common import available, interpreting
from .decode_attention import Slots, attend_step, attend_step_triton, qk_step, qk_step_triton
from .decode_norm import (
    Cema,
    Norm,
    norm_cema_step,
    norm_cema_step_triton,
    norm_step,
    norm_step_triton,
    residual_layer_norm,
    residual_layer_norm_triton,
)

__all__ = ["TORCH", "TRITON", "Cema", "Norm", "Slots", "StepOps", "runs_on"]


def runs_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the Triton kernels here run a `dtype` model on `device`: float32, bfloat16 or float16, compiled on
    CUDA or interpreted on the CPU (TRITON_INTERPRET=1, for tests); not float64, not interpreted on CUDA tensors
    (which a CUDA graph cannot hold), not where Triton is missing or its mode changed since it was imported."""
    if not available() or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    try:
        interpreted = interpreting()
    except MegaevalError:
        return False
    kind = torch.device(device).type
    return interpreted if kind == "cpu" else kind == "cuda" and not interpreted


# ------------------------------------------------------------------------------------ the sets


@dataclass(frozen=True)
class StepOps:
    """The decoding step's operations from one backend: "torch" (the references) or "triton" (the kernels)."""

    backend: str
    norm: Callable[..., tuple[Tensor, Tensor]]
    norm_cema: Callable[..., tuple[Tensor, Tensor, Tensor]]
    qk: Callable[..., Tensor]
    attend: Callable[..., Tensor]
    residual_layer_norm: Callable[..., Tensor]
    silu_mul: Callable[[Tensor, Tensor], Tensor]


TORCH = StepOps("torch", norm_step, norm_cema_step, qk_step, attend_step, residual_layer_norm, silu_mul.silu_mul)
TRITON = StepOps(
    "triton", norm_step_triton, norm_cema_step_triton, qk_step_triton, attend_step_triton, residual_layer_norm_triton,
    silu_mul.silu_mul_triton,
)  # fmt: skip
