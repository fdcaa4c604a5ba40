"""Per-token negative log-likelihood straight from final hidden states: output projection,
log-softmax over the vocabulary and gather of the target, with -100 targets scoring 0."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import fail
from .common import check_input, interpreting, jit, next_pow2, tl

IGNORE_INDEX = -100

# ----------------------------------------------------------------------------------- reference


def nll_from_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """NLL of targets [...] under logits [..., V]; IGNORE_INDEX scores 0."""
    flat = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    return flat.view(targets.shape)


def linear_nll(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Reference: logits = hidden [..., D] @ weight [V, D].T in the model dtype, as float32 (float64
    for float64 models), then their NLL [...]. Holds all [..., V] logits."""
    logits = F.linear(hidden, weight).to(torch.promote_types(hidden.dtype, torch.float32))
    return nll_from_logits(logits, targets)


# -------------------------------------------------------------------------------------- Triton

LOGITS_PER_PIECE = 1 << 25  # logits (rows x vocabulary) of one piece: 64 MiB in bfloat16 at any length


@jit
def _lse_nll_kernel(
    logits_ptr, t_ptr, nll_ptr, V, stride_row,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One program: one row of logits. Online log-sum-exp over the vocabulary in float32, one running
    maximum and sum per lane, minus the target's logit; IGNORE_INDEX scores 0."""
    row = tl.program_id(0).to(tl.int64)  # row offsets can pass 2**31 elements
    base = logits_ptr + row * stride_row
    m = tl.full([BLOCK_V], -1.0e30, dtype=tl.float32)  # finite: lanes that never see a logit stay NaN-free
    s = tl.zeros([BLOCK_V], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(s * tl.exp(m - top), axis=0))
    target = tl.load(t_ptr + row)
    ignored = target == -100  # IGNORE_INDEX (a kernel reads no Python globals)
    t_logit = tl.load(base + tl.where(ignored, 0, target)).to(tl.float32)
    tl.store(nll_ptr + row, tl.where(ignored, 0.0, lse - t_logit))


def _block_v(V: int) -> int:
    """Vocabulary lanes per program: small under the interpreter, so that tests loop over several blocks."""
    return 64 if interpreting() else min(2048, next_pow2(V))


def rows_per_piece(V: int) -> int:
    """Rows projected at once: LOGITS_PER_PIECE logits, in whole tiles of 128 rows (at least one row)."""
    rows = LOGITS_PER_PIECE // V
    return max(1, rows // 128 * 128 if rows >= 128 else rows)


def lse_nll_triton(logits: Tensor, targets: Tensor) -> Tensor:
    """NLL [M] of targets [M] under logits [M, V] (any float dtype, read as float32) by the Triton kernel."""
    M, V = logits.shape
    nll = torch.empty(M, dtype=torch.float32, device=logits.device)
    if M:
        logits = logits if logits.stride(-1) == 1 else logits.contiguous()
        _lse_nll_kernel[(M,)](logits, targets, nll, V, logits.stride(0), BLOCK_V=_block_v(V), num_warps=8)
    return nll


def linear_nll_triton(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Projection + NLL without [T, V] logits: cuBLAS (torch.matmul) projects LOGITS_PER_PIECE logits at a time in
    the model dtype, as the reference does, and the Triton kernel reduces each piece to its NLL. Same arguments
    and results as `linear_nll`."""
    check_input("hidden", hidden)
    V, D = weight.shape
    h = hidden.reshape(-1, D)
    t = targets.reshape(-1)
    out_dtype = torch.promote_types(hidden.dtype, torch.float32)
    bad = ((t < 0) & (t != IGNORE_INDEX)) | (t >= V)
    if bool(bad.any()):
        raise fail(f"targets must lie in [0, {V}) or be {IGNORE_INDEX}, got {int(t[bad][0])}")
    t = t.contiguous()
    rows = rows_per_piece(V)
    nll = torch.empty(t.shape[0], dtype=torch.float32, device=hidden.device)
    for a in range(0, t.shape[0], rows):
        b = min(a + rows, t.shape[0])
        nll[a:b] = lse_nll_triton(F.linear(h[a:b], weight), t[a:b])
    return nll.view(targets.shape).to(out_dtype)
