"""The decoding step's attention for one token per row (megalodon/decode.py's `StaticDecoder`, overview in
decode_step): the per-head RMSNorm of wz's output, the q/k affine, the rotary rotation at each row's slot and the
writes of the new key and silu(value) into the chunk caches; softmax attention of one query per row over its chunk up
to its own slot, times silu(r). Each a plain-PyTorch reference (the unfused step's) beside its Triton kernels, with
the same arguments and results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor

from .common import cdiv, check_input, interpreting, jit, next_pow2, tl

# ------------------------------------------------------------------------------------- the slots


@dataclass
class Slots:
    """Where each row's token goes in its chunk: slot `fill[b]` (keys already cached), rotary angle `fill[b]`; and
    what the references derive from it, computed once a step for every layer."""

    fill: Tensor  # [B] int64
    rope: Tensor  # [C, d/2] complex (accumulation dtype): e^(i position frequency) for every position of a chunk
    heads: int
    slot_ids: Tensor  # [C]: 0 .. C-1

    @cached_property
    def masked(self) -> Tensor:
        """[B, 1, 1, C]: the slots past each row's own key."""
        return (self.slot_ids > self.fill[:, None]).view(self.fill.shape[0], 1, 1, -1)

    @cached_property
    def phase(self) -> Tensor:
        """[B, 1, 1, d/2] complex: each row's rotary phases."""
        return self.rope[self.fill].view(self.fill.shape[0], 1, 1, -1)

    @cached_property
    def index(self) -> Tensor:
        """[B H]: the token's row in caches viewed as [B H C, d]."""
        B, H, C = self.fill.shape[0], self.heads, self.slot_ids.shape[0]
        rows = torch.arange(B * H, device=self.fill.device).view(B, H) * C
        return (rows + self.fill[:, None]).view(-1)

    @cached_property
    def rope_pairs(self) -> Tensor:
        """The rotary table as (cos, sin) pairs [C, d/2, 2] (the kernels')."""
        return torch.view_as_real(self.rope)


# ----------------------------------------------------------------------------------- reference


def qk_step(
    z: Tensor, v: Tensor, scale: Tensor, offset: Tensor, eps: float, slots: Slots, k_cache: Tensor, v_cache: Tensor,
    z_bias: Tensor | None = None, v_bias: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The query [B, H, dz] (accumulation dtype) from wz's output z [B, Z]: per-head RMSNorm (no affine), z scale +
    offset (scale, offset [2, Z]: the query's, the key's), rotated at the row's slot. The key, so made, and silu(v)
    (v [B, E]: wv's output) are written into the caches [B, H, C, d] at each row's slot. z_bias, v_bias: the
    projections' biases, when z and v come without them (a linear layer's bias at batch 1 is a kernel of its own)."""
    B, H = z.shape[0], slots.heads
    z = z if z_bias is None else z + z_bias
    v = v if v_bias is None else v + v_bias
    z = F.rms_norm(z.view(B, H, -1).to(scale.dtype), (z.shape[-1] // H,), None, eps).view(B, 1, -1)
    qk = torch.addcmul(offset, z, scale)  # [B, 2, Z]: the query, the key
    pairs = torch.view_as_complex(qk.view(B, 2, H, -1, 2))  # rotary embedding as complex products
    q, k = torch.view_as_real(pairs * slots.phase).view(B, 2, H, -1).unbind(1)
    k_cache.view(-1, k_cache.shape[-1]).index_copy_(0, slots.index, k.reshape(B * H, -1).to(k_cache.dtype))
    v_cache.view(-1, v_cache.shape[-1]).index_copy_(0, slots.index, F.silu(v).view(B * H, -1))
    return q


def attend_step(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, r: Tensor, slots: Slots, r_bias: Tensor | None = None
) -> Tensor:
    """Softmax attention (scale 1) of each row's query q [B, H, dz] over its cached keys up to its own slot, times
    silu(r) (r [B, E]: wr's output, plus r_bias): [B, E] in the caches' value dtype. Scores and softmax in q's
    dtype."""
    B = q.shape[0]
    r = r if r_bias is None else r + r_bias
    scores = torch.matmul(q.unsqueeze(2), k_cache.to(q.dtype).transpose(-1, -2)).masked_fill_(slots.masked, -math.inf)
    attn = torch.matmul(torch.softmax(scores, dim=-1).to(v_cache.dtype), v_cache)  # [B, H, 1, dv]
    return attn.view(B, -1) * F.silu(r)


# -------------------------------------------------------------------------------------- Triton


@jit
def _qk_kernel(
    z_ptr, v_ptr, zb_ptr, vb_ptr, scale_ptr, offset_ptr, rope_ptr, fill_ptr, q_ptr, kc_ptr, vc_ptr,
    H, C, DZ, DV, eps,
    Z_BIAS: tl.constexpr, V_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One program: row b, head h. The head's z as (even, odd) pairs, normalised by its rms; the query and key
    (affine terms of rows 0 and 1 of scale and offset) rotated by the row's slot's phases; the query stored, the
    key and silu(v) written to the caches at the slot."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    P = DZ // 2
    i = tl.arange(0, BLOCK_P)
    mask = i < P
    col = h * DZ + 2 * i
    z_row = z_ptr + b * H * DZ + col
    z0 = tl.load(z_row, mask=mask, other=0.0).to(tl.float32)
    z1 = tl.load(z_row + 1, mask=mask, other=0.0).to(tl.float32)
    if Z_BIAS:  # the projection's bias, rounded in as the reference adds it
        z0 = (z0 + tl.load(zb_ptr + col, mask=mask, other=0.0).to(tl.float32)).to(z_ptr.dtype.element_ty)
        z1 = (z1 + tl.load(zb_ptr + col + 1, mask=mask, other=0.0).to(tl.float32)).to(z_ptr.dtype.element_ty)
        z0 = z0.to(tl.float32)
        z1 = z1.to(tl.float32)
    rs = 1.0 / tl.sqrt((tl.sum(z0 * z0, axis=0) + tl.sum(z1 * z1, axis=0)) / DZ + eps)
    z0 = z0 * rs
    z1 = z1 * rs
    fill = tl.load(fill_ptr + b)
    cos = tl.load(rope_ptr + (fill * P + i) * 2, mask=mask, other=0.0)
    sin = tl.load(rope_ptr + (fill * P + i) * 2 + 1, mask=mask, other=0.0)
    head = b * H + h
    slot = head * C + fill
    for which in tl.static_range(2):  # the query, then the key
        a0 = tl.load(offset_ptr + which * H * DZ + col, mask=mask, other=0.0) + z0 * tl.load(
            scale_ptr + which * H * DZ + col, mask=mask, other=0.0
        )
        a1 = tl.load(offset_ptr + which * H * DZ + col + 1, mask=mask, other=0.0) + z1 * tl.load(
            scale_ptr + which * H * DZ + col + 1, mask=mask, other=0.0
        )
        r0 = a0 * cos - a1 * sin
        r1 = a0 * sin + a1 * cos
        if which == 0:
            tl.store(q_ptr + head * DZ + 2 * i, r0, mask=mask)
            tl.store(q_ptr + head * DZ + 2 * i + 1, r1, mask=mask)
        else:
            tl.store(kc_ptr + slot * DZ + 2 * i, r0.to(kc_ptr.dtype.element_ty), mask=mask)
            tl.store(kc_ptr + slot * DZ + 2 * i + 1, r1.to(kc_ptr.dtype.element_ty), mask=mask)
    v_row = v_ptr + b * H * DV + h * DV
    for j0 in range(0, DV, BLOCK_V):
        j = j0 + tl.arange(0, BLOCK_V)
        jm = j < DV
        v = tl.load(v_row + j, mask=jm, other=0.0).to(tl.float32)
        if V_BIAS:
            v = (v + tl.load(vb_ptr + h * DV + j, mask=jm, other=0.0).to(tl.float32)).to(v_ptr.dtype.element_ty)
            v = v.to(tl.float32)
        tl.store(vc_ptr + slot * DV + j, (v / (1.0 + tl.exp(-v))).to(vc_ptr.dtype.element_ty), mask=jm)


def qk_step_triton(
    z: Tensor, v: Tensor, scale: Tensor, offset: Tensor, eps: float, slots: Slots, k_cache: Tensor, v_cache: Tensor,
    z_bias: Tensor | None = None, v_bias: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """`qk_step` by one Triton kernel; same arguments and results (the key rounded once to the cache's dtype)."""
    check_input("z", z)
    B, H, C, DZ = k_cache.shape
    DV = v_cache.shape[-1]
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and scale.is_contiguous() and offset.is_contiguous()):
        raise ValueError("qk_step_triton takes contiguous caches and affine terms")
    if DZ % 2 or scale.dtype != torch.float32:
        raise ValueError("qk_step_triton takes an even query/key head width and float32 affine terms")
    q = torch.empty(B, H, DZ, dtype=torch.float32, device=z.device)
    if B:
        _qk_kernel[(B, H)](
            z.contiguous(), v.contiguous(), z if z_bias is None else z_bias, v if v_bias is None else v_bias,
            scale, offset, slots.rope_pairs, slots.fill, q, k_cache, v_cache, H, C, DZ, DV, eps,
            Z_BIAS=z_bias is not None, V_BIAS=v_bias is not None, BLOCK_P=next_pow2(DZ // 2),
            BLOCK_V=min(next_pow2(DV), 8 if interpreting() else 1024), num_warps=4,
        )  # fmt: skip
    return q


@jit
def _attend_kernel(
    q_ptr, kc_ptr, vc_ptr, fill_ptr, o_ptr, m_ptr, l_ptr,
    H, C, DZ, DV, S,
    BLOCK_K: tl.constexpr, BLOCK_Z: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One program: row b, head h, the BLOCK_K cache slots of split s; nothing when they all lie past the row's own
    key. Stores the split's max score, its sum of exponentials and its unnormalised value sum [DV] (float32)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    fill = tl.load(fill_ptr + b)
    start = s * BLOCK_K
    if start <= fill:
        head = b * H + h
        slots = start + tl.arange(0, BLOCK_K)
        seen = slots <= fill
        scores = tl.zeros([BLOCK_K], dtype=tl.float32)
        for z0 in range(0, DZ, BLOCK_Z):
            zi = z0 + tl.arange(0, BLOCK_Z)
            zm = zi < DZ
            q = tl.load(q_ptr + head * DZ + zi, mask=zm, other=0.0)
            k = tl.load(kc_ptr + (head * C + slots)[:, None] * DZ + zi[None, :], mask=seen[:, None] & zm[None, :],
                        other=0.0).to(tl.float32)  # fmt: skip
            scores += tl.sum(k * q[None, :], axis=1)
        scores = tl.where(seen, scores, -float("inf"))
        m = tl.max(scores, axis=0)
        p = tl.where(seen, tl.exp(scores - m), 0.0)
        part = head * S + s
        tl.store(m_ptr + part, m)
        tl.store(l_ptr + part, tl.sum(p, axis=0))
        for v0 in range(0, DV, BLOCK_V):
            vi = v0 + tl.arange(0, BLOCK_V)
            vm = vi < DV
            v = tl.load(vc_ptr + (head * C + slots)[:, None] * DV + vi[None, :], mask=seen[:, None] & vm[None, :],
                        other=0.0).to(tl.float32)  # fmt: skip
            tl.store(o_ptr + part * DV + vi, tl.sum(p[:, None] * v, axis=0), mask=vm)


@jit
def _attend_combine_kernel(
    o_ptr, m_ptr, l_ptr, r_ptr, rb_ptr, fill_ptr, out_ptr,
    H, DV, S,
    R_BIAS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One program: row b, head h, BLOCK_V value dimensions. The splits up to the row's own key merged (softmax
    over all of them), rounded to the model dtype, times silu(r) rounded likewise; stored in the model dtype."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    head = b * H + h
    used = tl.load(fill_ptr + b) // BLOCK_K + 1
    si = tl.arange(0, BLOCK_S)
    sm = si < used
    m = tl.load(m_ptr + head * S + si, mask=sm, other=-float("inf"))
    w = tl.where(sm, tl.exp(m - tl.max(m, axis=0)), 0.0)
    total = tl.sum(w * tl.load(l_ptr + head * S + si, mask=sm, other=0.0), axis=0)
    vi = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    vm = vi < DV
    o = tl.load(o_ptr + (head * S + si)[:, None] * DV + vi[None, :], mask=sm[:, None] & vm[None, :], other=0.0)
    attn = (tl.sum(w[:, None] * o, axis=0) / total).to(out_ptr.dtype.element_ty).to(tl.float32)
    r = tl.load(r_ptr + head * DV + vi, mask=vm, other=0.0).to(tl.float32)
    if R_BIAS:
        r = (r + tl.load(rb_ptr + h * DV + vi, mask=vm, other=0.0).to(tl.float32)).to(r_ptr.dtype.element_ty)
        r = r.to(tl.float32)
    gate = (r / (1.0 + tl.exp(-r))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + head * DV + vi, (attn * gate).to(out_ptr.dtype.element_ty), mask=vm)


def _attend_blocks(C: int, DZ: int, DV: int) -> tuple[int, int, int]:
    """(BLOCK_K, BLOCK_Z, BLOCK_V): cache slots a split, and tiles of the key and value widths (small under the
    interpreter, so that tests cross splits and tiles)."""
    if interpreting():
        return min(next_pow2(C), 4), min(next_pow2(DZ), 4), min(next_pow2(DV), 8)
    return min(next_pow2(C), 32), min(next_pow2(DZ), 64), min(next_pow2(DV), 128)


def _combine_block(S: int, DV: int) -> int:
    """Value dimensions a merging program takes: about 4K elements of its [splits, BLOCK_V] tile."""
    if interpreting():
        return min(next_pow2(DV), 8)
    return min(next_pow2(DV), max(16, 4096 // next_pow2(S)))


def attend_step_triton(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, r: Tensor, slots: Slots, r_bias: Tensor | None = None
) -> Tensor:
    """`attend_step` by two Triton kernels (split over the cache's slots, then merged); same arguments and results
    (probabilities kept in float32)."""
    check_input("r", r)
    B, H, C, DZ = k_cache.shape
    DV = v_cache.shape[-1]
    block_k, block_z, block_v = _attend_blocks(C, DZ, DV)
    S = cdiv(C, block_k)
    dev = q.device
    o = torch.empty(B, H, S, DV, dtype=torch.float32, device=dev)
    m = torch.empty(B, H, S, dtype=torch.float32, device=dev)
    total = torch.empty_like(m)
    out = torch.empty(B, H * DV, dtype=v_cache.dtype, device=dev)
    if B:
        _attend_kernel[(B, H, S)](
            q.contiguous(), k_cache, v_cache, slots.fill, o, m, total, H, C, DZ, DV, S,
            BLOCK_K=block_k, BLOCK_Z=block_z, BLOCK_V=block_v, num_warps=4,
        )  # fmt: skip
        block = _combine_block(S, DV)
        _attend_combine_kernel[(B, H, cdiv(DV, block))](
            o, m, total, r.contiguous(), r if r_bias is None else r_bias, slots.fill, out, H, DV, S,
            R_BIAS=r_bias is not None, BLOCK_K=block_k, BLOCK_S=next_pow2(S), BLOCK_V=block, num_warps=4,
        )  # fmt: skip
    return out
