"""Per-token negative log-likelihood straight from final hidden states: output projection,
log-softmax over the vocabulary and gather of the target, with -100 targets scoring 0."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import fail
from .common import cdiv, check_input, interpreting, jit, tl

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


@jit
def _linear_nll_kernel(
    h_ptr, w_ptr, t_ptr, part_ptr,
    M, V, D, V_PER_SPLIT, shm, swv,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M tokens against one split of the vocabulary, in [BLOCK_M, BLOCK_V] tiles of
    float32 logits. Writes the split's log-sum-exp and target logit (0 when the target is elsewhere)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    r_mask = rows < M
    target = tl.load(t_ptr + rows, mask=r_mask, other=-100)
    v_start = split * V_PER_SPLIT
    v_end = tl.minimum(v_start + V_PER_SPLIT, V)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    t_logit = tl.zeros([BLOCK_M], dtype=tl.float32)
    for v0 in range(v_start, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        c_mask = cols < v_end
        logits = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_mask = ks < D
            h = tl.load(h_ptr + rows[:, None] * shm + ks[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0)
            w_t = tl.load(w_ptr + cols[None, :] * swv + ks[:, None], mask=k_mask[:, None] & c_mask[None, :], other=0.0)
            if DOT_FP32:
                h = h.to(tl.float32)
                w_t = w_t.to(tl.float32)
            logits = tl.dot(h, w_t, logits, input_precision=PRECISION)
        logits = tl.where(c_mask[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), axis=1)
        m_i = m_new
        t_logit += tl.sum(tl.where(cols[None, :] == target[:, None], logits, 0.0), axis=1)
    tl.store(part_ptr + split * M + rows, m_i + tl.log(l_i), mask=r_mask)
    tl.store(part_ptr + (tl.num_programs(1) + split) * M + rows, t_logit, mask=r_mask)


def _config(M: int, V: int) -> tuple[dict[str, int], int]:
    """Tile sizes chosen by hand, and how many vocabulary splits keep a GPU busy when M is small."""
    if interpreting():  # small tiles and several splits, so that tests take every path a GPU takes
        cfg = dict(BLOCK_M=64, BLOCK_V=128, BLOCK_K=8, num_warps=4, num_stages=1)
        return cfg, min(4, cdiv(V, cfg["BLOCK_V"]))
    cfg = dict(BLOCK_M=64, BLOCK_V=128, BLOCK_K=64, num_warps=8, num_stages=3)  # sm_90: no register spills
    programs_per_split = cdiv(M, cfg["BLOCK_M"])
    splits = max(1, min(cdiv(512, programs_per_split), cdiv(V, cfg["BLOCK_V"])))
    return cfg, splits


def linear_nll_triton(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Fused projection + NLL by the Triton kernel, never holding [T, V] logits; same as `linear_nll`
    except that the logits stay float32 (the reference rounds them to the model dtype first)."""
    check_input("hidden", hidden)
    V, D = weight.shape
    h = hidden.reshape(-1, D)
    h = h if h.stride(-1) == 1 else h.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    t = targets.reshape(-1)
    M = h.shape[0]
    out_dtype = torch.promote_types(hidden.dtype, torch.float32)
    if M == 0:
        return torch.zeros(targets.shape, dtype=out_dtype, device=hidden.device)
    bad = ((t < 0) & (t != IGNORE_INDEX)) | (t >= V)
    if bool(bad.any()):
        raise fail(f"targets must lie in [0, {V}) or be {IGNORE_INDEX}, got {int(t[bad][0])}")
    cfg, splits = _config(M, V)
    per_split = cdiv(cdiv(V, splits), cfg["BLOCK_V"]) * cfg["BLOCK_V"]
    splits = cdiv(V, per_split)
    part = torch.empty(2, splits, M, dtype=torch.float32, device=hidden.device)
    _linear_nll_kernel[(cdiv(M, cfg["BLOCK_M"]), splits)](
        h, w, t, part, M, V, D, per_split, h.stride(0), w.stride(0),
        DOT_FP32=interpreting(), PRECISION="ieee" if h.dtype == torch.float32 else "tf32", **cfg,
    )  # fmt: skip
    nll = torch.logsumexp(part[0], dim=0) - part[1].sum(0)
    return torch.where(t == IGNORE_INDEX, 0.0, nll).view(targets.shape).to(out_dtype)
