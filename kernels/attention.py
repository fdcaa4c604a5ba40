"""Chunk-local causal attention with RoPE, continuing the partial chunk held in a K/V cache.

Softmax attention with scale 1; a query sees the keys of its own chunk up to itself and never
crosses a chunk boundary; rotary positions restart at 0 in every chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from .common import acc_dtype, cdiv, check_input, interpreting, jit, next_pow2, tl

# ----------------------------------------------------------------------------------- reference


def apply_rope(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary embedding on adjacent pairs (x[2i], x[2i+1]). x: [B, T, H, d], positions: [T] (or [B, T]: each row
    its own)."""
    d = x.shape[-1]
    acc = acc_dtype(x.dtype)
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angle = positions.to(torch.float64)[..., None] * inv_freq  # [T, d/2] or [B, T, d/2]
    cos, sin = angle.cos().to(acc)[..., None, :], angle.sin().to(acc)[..., None, :]
    x0, x1 = x.to(acc).unflatten(-1, (d // 2, 2)).unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2).to(x.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Softmax attention with scale 1; query i sees keys j <= i + (len(k) - len(q)). [B, L, H, d]."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
    else:
        offset = Tk - Tq
        mask = torch.arange(Tk, device=q.device)[None, :] <= torch.arange(Tq, device=q.device)[:, None] + offset
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    return out.transpose(1, 2)


def rows_attention(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, fill: Tensor, chunk: int, rope_base: float
) -> tuple[Tensor, Tensor, Tensor]:
    """`chunked_attention` for one token per row, each row at its own place in its chunk: row b's cache holds
    `fill[b]` keys and values (the caches are padded on the right to the longest). Returns the output [B, 1, H, dv]
    and the padded caches after the token (a row whose chunk it completes holds none)."""
    B = q.shape[0]
    positions = fill.to(q.device)[:, None]  # [B, 1]: rotary positions restart at 0 in every chunk
    q, k = apply_rope(q, positions, rope_base), apply_rope(k, positions, rope_base)
    c = k_cache.shape[1]
    keys, values = torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1)
    slots = torch.arange(c + 1, device=q.device)[None]
    seen = (slots < positions) | (slots == c)  # the row's cached keys, and its own
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=seen[:, None, None, :], scale=1.0).transpose(1, 2)  # fmt: skip
    rows = torch.arange(B, device=q.device)
    keys[rows, fill.to(q.device)], values[rows, fill.to(q.device)] = k[:, 0], v[:, 0]  # the token joins its chunk
    after = (fill + 1) % chunk
    width = int(after.max()) if B else 0
    return out, keys[:, :width], values[:, :width]


def rotate(q: Tensor, k: Tensor, k_cache: Tensor, chunk: int, rope_base: float) -> tuple[Tensor, Tensor]:
    """q and k rotated at their positions in the chunk, which continues the cached partial chunk."""
    positions = (k_cache.shape[1] + torch.arange(q.shape[1], device=q.device)) % chunk
    return apply_rope(q, positions, rope_base), apply_rope(k, positions, rope_base)


def chunked_attention(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, chunk: int, rope_base: float,
    attend_fn: Callable[[Tensor, Tensor, Tensor], Tensor] = attend,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Causal attention that never crosses a chunk boundary, continuing a partial chunk.

    q, k: [B, T, H, dz] before rotation; v: [B, T, H, dv]; the caches hold the rotated keys and
    values of the current partial chunk. Rotary positions restart at 0 in every chunk. Returns the
    output [B, T, H, dv] and the caches for the chunk that is partial after this call. `attend_fn`
    computes each piece (`attend`, or `fused_attend` on the fast path).
    """
    B, T, H, _ = q.shape
    c = k_cache.shape[1]
    q, k = rotate(q, k, k_cache, chunk, rope_base)
    keys, values = torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1)  # start on a boundary

    head = min(T, chunk - c)  # queries that finish the current chunk
    parts = [attend_fn(q[:, :head], keys[:, : c + head], values[:, : c + head])] if head else []
    n_full = (T - head) // chunk
    if n_full:  # whole chunks, batched together
        s, e = head, head + n_full * chunk

        def by_chunk(t: Tensor) -> Tensor:
            return t.reshape(B * n_full, chunk, *t.shape[2:])

        out = attend_fn(by_chunk(q[:, s:e]), by_chunk(keys[:, c + s : c + e]), by_chunk(values[:, c + s : c + e]))
        parts.append(out.reshape(B, n_full * chunk, H, -1))
    tail = T - head - n_full * chunk  # queries of a new partial chunk
    if tail:
        parts.append(attend_fn(q[:, T - tail :], keys[:, c + T - tail :], values[:, c + T - tail :]))

    kept = (c + T) % chunk
    out = torch.cat(parts, dim=1) if parts else v.new_empty(B, 0, H, v.shape[-1])
    return out, keys[:, c + T - kept :], values[:, c + T - kept :]


# ------------------------------------------------------------------------- PyTorch's fused SDPA


def fused_attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """`attend` through PyTorch's fused attention kernels (flash, cuDNN, memory-efficient), which take one head
    width for queries, keys and values: value heads wider than the query/key heads (MEGALODON-7B: 256 and 2048)
    are cut into slices of the query/key width, each read as a head of its own with its query and key repeated.
    Queries of a partial chunk align to the bottom right (`causal_lower_right`)."""
    B, Tq, H, dz = q.shape
    Tk, dv = k.shape[1], v.shape[-1]
    split = dv // dz if dv > dz and dv % dz == 0 else 1
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)
    if split > 1:
        qh, kh = qh.repeat_interleave(split, 1), kh.repeat_interleave(split, 1)
    vh = v.reshape(B, Tk, H * split, dv // split).transpose(1, 2)
    if Tq == Tk:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=1.0)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(Tq, Tk), scale=1.0)
    return out.transpose(1, 2).reshape(B, Tq, H, dv)


def chunked_attention_fused(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, chunk: int, rope_base: float
) -> tuple[Tensor, Tensor, Tensor]:
    """`chunked_attention` with every piece computed by PyTorch's fused kernels (`fused_attend`)."""
    return chunked_attention(q, k, v, k_cache, v_cache, chunk, rope_base, fused_attend)


# -------------------------------------------------------------------------------------- Triton


@jit
def _chunk_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr,
    cached, T, CHUNK, H, DZ, DV,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sob, sot, soh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DZ: tl.constexpr, BLOCK_DV: tl.constexpr,
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M queries of one (batch, head), BLOCK_DV of the value dims; online softmax.

    Keys are indexed from the start of the cached partial chunk (a chunk boundary), so query i sits
    at key index cached + i and sees keys [chunk start, cached + i]. A query block that straddles a
    chunk boundary starts at the earlier chunk and masks per row.
    """
    pid_m = tl.program_id(0)
    b = (tl.program_id(1) // H).to(tl.int64)  # batch offsets can pass 2**31 elements
    h = tl.program_id(1) % H
    q_ptr += b * sqb + h * sqh
    k_ptr += b * skb + h * skh
    v_ptr += b * svb + h * svh
    o_ptr += b * sob + h * soh
    i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row = cached + i  # key index of the query's own position
    first_key = (row // CHUNK) * CHUNK
    i_mask = i < T
    dz = tl.arange(0, BLOCK_DZ)
    dz_mask = dz < DZ
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dv_mask = dv < DV
    q = tl.load(q_ptr + i[:, None] * sqt + dz[None, :], mask=i_mask[:, None] & dz_mask[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    n_keys = cached + T
    lo = ((cached + pid_m * BLOCK_M) // CHUNK) * CHUNK
    hi = tl.minimum(cached + pid_m * BLOCK_M + BLOCK_M, n_keys)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: rows with no key yet stay NaN-free
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        j_mask = j < n_keys
        k_offsets = j[None, :] * skt + dz[:, None]
        v_offsets = j[:, None] * svt + dv[None, :]
        k_t = tl.load(k_ptr + k_offsets, mask=dz_mask[:, None] & j_mask[None, :], other=0.0)  # [DZ, N]
        v = tl.load(v_ptr + v_offsets, mask=j_mask[:, None] & dv_mask[None, :], other=0.0)  # [N, DV]
        if DOT_FP32:
            k_t = k_t.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k_t, input_precision=PRECISION) * 1.4426950408889634  # log2(e): exp2 below
        allowed = (j[None, :] >= first_key[:, None]) & (j[None, :] <= row[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o = o_ptr + i[:, None] * sot + dv[None, :]
    tl.store(o, out.to(o_ptr.dtype.element_ty), mask=i_mask[:, None] & dv_mask[None, :])


def _config(dz: int, dv: int) -> dict[str, int]:
    """Tile sizes, chosen by hand (a single config: autotuning over several needs a GPU)."""
    block_dz = next_pow2(dz)
    if interpreting():  # small blocks, value dims split in two, so that tests take every path a GPU takes
        block_dv = max(4, next_pow2(dv) // 2)
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_DZ=block_dz, BLOCK_DV=block_dv, num_warps=4, num_stages=1)
    # Each value block recomputes q k^T, so wide value heads (7B: dz 256, dv 2048) take wide value blocks.
    large = block_dz > 64
    return dict(
        BLOCK_M=64, BLOCK_N=32 if large else 64, BLOCK_DZ=block_dz, BLOCK_DV=min(next_pow2(dv), 256 if large else 128),
        num_warps=8 if large else 4, num_stages=2,
    )  # fmt: skip


def _unit_last_stride(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def chunked_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, chunk: int, rope_base: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Chunk-local attention by the Triton kernel; same arguments and results as `chunked_attention`."""
    check_input("q", q)
    B, T, H, dz = q.shape
    dv = v.shape[-1]
    c = k_cache.shape[1]
    if T == 0:
        return v.new_empty(B, 0, H, dv), k_cache, v_cache
    q, k = rotate(q, k, k_cache, chunk, rope_base)
    keys, values = torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1)
    q, values = _unit_last_stride(q), _unit_last_stride(values)
    out = torch.empty(B, T, H, dv, dtype=v.dtype, device=v.device)
    cfg = _config(dz, dv)
    grid = (cdiv(T, cfg["BLOCK_M"]), B * H, cdiv(dv, cfg["BLOCK_DV"]))
    _chunk_attention_kernel[grid](
        q, keys, values, out, c, T, chunk, H, dz, dv,
        *q.stride()[:3], *keys.stride()[:3], *values.stride()[:3], *out.stride()[:3],
        DOT_FP32=interpreting(),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **cfg,
    )  # fmt: skip
    kept = (c + T) % chunk
    return out, keys[:, c + T - kept :], values[:, c + T - kept :]
