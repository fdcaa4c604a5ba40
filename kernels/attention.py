"""Chunk-local causal attention with RoPE, continuing the partial chunk held in a K/V cache.

Softmax attention with scale 1; a query sees the keys of its own chunk up to itself and never
crosses a chunk boundary; rotary positions restart at 0 in every chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

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
    rotate_fn: Callable[[Tensor, Tensor, Tensor, int, float], tuple[Tensor, Tensor]] = rotate,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Causal attention that never crosses a chunk boundary, continuing a partial chunk.

    q, k: [B, T, H, dz] before rotation; v: [B, T, H, dv]; the caches hold the rotated keys and
    values of the current partial chunk. Rotary positions restart at 0 in every chunk. Returns the
    output [B, T, H, dv] and the caches for the chunk that is partial after this call. `attend_fn`
    computes each piece and `rotate_fn` the rotation (`attend` and `rotate`, or `fused_attend` and
    `rotate_triton` on the fast path).
    """
    B, T, H, _ = q.shape
    c = k_cache.shape[1]
    q, k = rotate_fn(q, k, k_cache, chunk, rope_base)
    keys, values = (k, v) if c == 0 else (torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1))

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
    if not kept:  # new empty caches: a view would keep the whole call's keys and values alive
        return out, keys.new_empty(B, 0, *keys.shape[2:]), values.new_empty(B, 0, *values.shape[2:])
    return out, keys[:, c + T - kept :], values[:, c + T - kept :]


# ------------------------------------------------------ fast path: PyTorch's fused SDPA, Triton rotary


def fused_attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """`attend` through PyTorch's fused attention kernels (flash, cuDNN, memory-efficient), which take one head
    width for queries, keys and values: value heads wider than the query/key heads (MEGALODON-7B: 256 and 2048)
    are cut into slices of the query/key width, each read as a head of its own with its query and key repeated.
    Queries of a partial chunk align to the bottom right (`causal_lower_right`)."""
    B, Tq, H, dz = q.shape
    Tk, dv = k.shape[1], v.shape[-1]
    split = dv // dz if dv > dz and dv % dz == 0 else 1
    if split > 1:  # [B, T, H * split, dz] in memory: the kernels then write the output [B, T, H * split, dv / split]
        q, k = q.repeat_interleave(split, 2), k.repeat_interleave(split, 2)
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)
    vh = v.reshape(B, Tk, H * split, dv // split).transpose(1, 2)
    if Tq == Tk:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=1.0)
    else:
        from torch.nn.attention.bias import causal_lower_right  # here: importing it loads torch._dynamo (~1 s)

        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(Tq, Tk), scale=1.0)
    return out.transpose(1, 2).reshape(B, Tq, H, dv)


@functools.lru_cache(maxsize=32)
def rope_table(
    chunk: int, d: int, base: float, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """cos and sin [chunk, d / 2] (`dtype`) of every position in a chunk, as `apply_rope` computes them."""
    with torch.inference_mode(False):  # ordinary tensors: usable inside and outside inference mode
        inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
        angle = torch.arange(chunk, dtype=torch.float64, device=device)[:, None] * inv_freq
        return angle.cos().to(dtype), angle.sin().to(dtype)


@jit
def _rope_kernel(
    x_ptr, out_ptr, cos_ptr, sin_ptr, start, T, H, HALF, CHUNK, sxb, sxt, sxh,
    BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_T timesteps of one (batch, head); pairs (x[2i], x[2i+1]) rotated by the angle of their
    position in the chunk, (start + t) mod CHUNK, in float32. Rows are read and written whole (pairs split and
    joined in registers). Writes a contiguous [B, T, H, 2 HALF]."""
    b = (tl.program_id(1) // H).to(tl.int64)  # batch offsets can pass 2**31 elements
    h = tl.program_id(1) % H
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_HALF)
    e = tl.arange(0, 2 * BLOCK_HALF)
    t_mask = t < T
    row_mask = t_mask[:, None] & (e < 2 * HALF)[None, :]
    pair_mask = t_mask[:, None] & (j < HALF)[None, :]
    x = tl.load(x_ptr + b * sxb + h * sxh + t[:, None] * sxt + e[None, :], mask=row_mask, other=0.0)
    x0, x1 = tl.split(tl.reshape(x.to(tl.float32), [BLOCK_T, BLOCK_HALF, 2]))
    pos = (start + t) % CHUNK
    cos = tl.load(cos_ptr + pos[:, None] * HALF + j[None, :], mask=pair_mask, other=0.0)
    sin = tl.load(sin_ptr + pos[:, None] * HALF + j[None, :], mask=pair_mask, other=0.0)
    y = tl.reshape(tl.join(x0 * cos - x1 * sin, x0 * sin + x1 * cos), [BLOCK_T, 2 * BLOCK_HALF])
    out = out_ptr + ((b * T + t[:, None]) * H + h) * (2 * HALF) + e[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=row_mask)


def rotate_triton(q: Tensor, k: Tensor, k_cache: Tensor, chunk: int, rope_base: float) -> tuple[Tensor, Tensor]:
    """`rotate` by the Triton kernel, from a table of the chunk's angles (`rope_table`)."""
    check_input("q", q)
    B, T, H, d = q.shape
    cos, sin = rope_table(chunk, d, float(rope_base), q.device)
    block_t = 16 if interpreting() else 32
    out = []
    for x in (q, k):
        x = x if x.stride(-1) == 1 else x.contiguous()
        y = torch.empty(B, T, H, d, dtype=x.dtype, device=x.device)
        if x.numel():
            _rope_kernel[(cdiv(T, block_t), B * H)](
                x, y, cos, sin, k_cache.shape[1], T, H, d // 2, chunk, x.stride(0), x.stride(1), x.stride(2),
                BLOCK_T=block_t, BLOCK_HALF=next_pow2(d // 2), num_warps=4,
            )  # fmt: skip
        out.append(y)
    return out[0], out[1]


def chunked_attention_fused(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, chunk: int, rope_base: float
) -> tuple[Tensor, Tensor, Tensor]:
    """`chunked_attention` with every piece computed by PyTorch's fused kernels (`fused_attend`) and the rotation by
    the Triton kernel (`rotate_triton`)."""
    return chunked_attention(q, k, v, k_cache, v_cache, chunk, rope_base, fused_attend, rotate_triton)
