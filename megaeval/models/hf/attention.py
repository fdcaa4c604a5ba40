"""Exact causal attention over a KV cache sharded by sequence position: the function registered with
transformers' AttentionInterface, blockwise online softmax, the K/V ring and the log-sum-exp merge.

Every key and query carries its global position, so causality (key <= query) and sliding windows
(key > query - window) are masks on positions, whatever rank or call a key came from. A rank's partial
result is kept as running (max m, sum l, weighted values o) of the online softmax; partial results over
disjoint sets of keys merge exactly: m = max m_i, l = sum l_i e^(m_i - m), o = sum o_i e^(m_i - m), and
the output is o / l. Scores are computed in float32 (float64 for float64 models), as SDPA does.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...distributed.exchange import Exchange
from ...errors import fail

NAME = "megaeval_sequence_parallel"  # the registered attention implementation
TILE = 1024  # queries and keys per explicit block of scores: bounds the [B, H, TILE, TILE] temporaries
# Blocks of keys visible to every query, and causal blocks of identical positions, go through PyTorch's fused
# attention with its log-sum-exp (fused_kernel, fused_attention), as large as the positions allow; the rest
# (sliding-window edges, soft caps, shifted positions, float64 on GPUs) explicitly, in TILE x TILE blocks.
FUSED = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
SDPA_KERNELS = {1: "flash", 2: "efficient", 3: "cudnn"}  # torch.nn.attention.SDPBackend values (0: math)


def fused_kernel(q: Tensor, k: Tensor, v: Tensor, causal: bool, softcap: float | None) -> str | None:
    """The PyTorch fused attention kernel, one that returns its log-sum-exp, for q [B, H, t, d] over k, v
    [B, Hkv, n, d]: on CPU "cpu" (its flash attention); on CUDA the kernel SDPA itself would run ("flash",
    "cudnn", "efficient"), or, for grouped-query heads where SDPA would fall back to math (float32), the
    efficient kernel on repeated key heads when SDPA runs it for one query head per key head. None (the
    explicit path): soft caps, float64 on CUDA, head dims not a multiple of 8 on CUDA, other devices."""
    if softcap is not None:
        return None
    if q.device.type == "cpu":
        return "cpu" if FUSED else None
    if q.device.type != "cuda" or q.shape[-1] % 8:
        return None
    choice = torch.ops.aten._fused_sdp_choice
    kernel = SDPA_KERNELS.get(int(choice(q, k, v, None, 0.0, causal, enable_gqa=True)))
    if kernel is None and k.shape[1] != q.shape[1] and int(choice(q, q, q, None, 0.0, False)) == 2:
        kernel = "efficient"
    return kernel


def fused_attention(kernel: str, q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool) -> tuple[Tensor, Tensor]:
    """Softmax attention of q [B, H, t, d] over k, v [B, Hkv, n, d] (query head h reads key head h // (H / Hkv)),
    all of one dtype, by `kernel` (fused_kernel's): (output [B, H, t, d] in that dtype, log-sum-exp of the
    scaled scores [B, H, t] in float32 or wider). `causal` masks by index (t == n: the same positions)."""
    B, H, t, d = q.shape
    Hkv, ops = k.shape[1], torch.ops.aten
    G = H // Hkv
    if kernel in ("flash", "cudnn"):  # grouped-query heads as SDPA passes them; [B, T, H, d] layouts pass as they are
        if kernel == "flash":
            out, lse = ops._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
        else:
            out, lse = ops._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
        return out, lse.reshape(B, H, t)
    if causal and G > 1:  # each query head against its key head's keys (causal masks by index)
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    else:  # a key head's G query heads read as one longer run of queries
        q = q.reshape(B, Hkv, G * t, d)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if kernel == "efficient":  # its log-sum-exp is padded along the queries
        out, lse = ops._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)[:2]
        lse = lse[..., : q.shape[2]]
    else:
        out, lse = ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out.reshape(B, H, t, d), lse.reshape(B, H, t)


def _same_run(qpos: Tensor, kpos: Tensor) -> bool:
    """True when queries and keys have the same contiguous positions (then causal by index is causal by position)."""
    n = len(qpos)
    if not n or len(kpos) != n:
        return False
    lo, hi = int(qpos[0]), int(qpos[-1])
    return hi - lo + 1 == n and (int(kpos[0]), int(kpos[-1])) == (lo, hi)


@dataclass
class Call:
    """What the attention layers of one model call need to know: who holds which queries and keys.

    `qpos[i]` / `kpos[i]`: global positions (CPU int64, ascending) of group rank i's queries in this call
    and of the keys its cache holds once this call's keys are stored. Replicated calls give every rank
    the same queries; sliced calls give each rank its own slice. `exchange` is None in one process.
    """

    rank: int
    qpos: list[Tensor]
    kpos: list[Tensor]
    replicated: bool
    store: bool  # this rank keeps this call's new keys and values
    exchange: Exchange | None = None
    layers: int = 0  # attention calls seen so far (one per attention layer)

    def needs(self, origin: int, rank: int, window: int | None) -> bool:
        """True when some query of `rank` may attend some key held by `origin`."""
        q, k = self.qpos[rank], self.kpos[origin]
        if not len(q) or not len(k) or int(k[0]) > int(q[-1]):
            return False
        return window is None or int(k[-1]) > int(q[0]) - window

    def forwarded(self, origin: int, holder: int, window: int | None) -> bool:
        """True when the K/V block of `origin`, now at `holder`, is needed further round the ring."""
        P = len(self.kpos)
        step = (holder - origin) % P
        return any(self.needs(origin, (origin + s) % P, window) for s in range(step + 1, P))


ACTIVE: ContextVar[Call | None] = ContextVar("megaeval_sequence_parallel_call", default=None)


class OnlineSoftmax:
    """Causal attention of queries q [B, H, T, d] over key blocks given one after another.

    The running state (o, m, l) is created at the first key block; when that block went through one fused
    call for all queries, the state is the kernel's output itself: o normalized, m its log-sum-exp, l = 1
    (kept as None), so a one-block call returns the fused kernel's output without further passes."""

    def __init__(
        self, q: Tensor, qpos: Tensor, kv_heads: int, scale: float, window: int | None, softcap: float | None
    ):  # fmt: skip
        B, H, T, d = q.shape
        self.dtype = torch.promote_types(q.dtype, torch.float32)
        self.out_dtype, self.shape = q.dtype, (B, H, T, d)
        self.qpos, self.scale, self.window, self.softcap = qpos, scale, window, softcap
        # CUDA kernels read the queries' own dtype; on CPU (kernel and explicit) and in explicit tiles: scores' dtype
        self.q = q.to(q.dtype if q.is_cuda else self.dtype).reshape(B, kv_heads, H // kv_heads, T, d)
        self.o: Tensor | None = None  # running sum of e^(score - m) v, [B, Hkv, G, T, d]
        self.m: Tensor | None = None  # running max (or log-sum-exp), [B, Hkv, G, T]
        self.l: Tensor | None = None  # running sum of e^(score - m); None: all ones (o normalized)

    def add(self, k: Tensor, v: Tensor, kpos: Tensor) -> None:
        """Attend to keys k and values v [B, Hkv, n, d] at positions kpos [n] (ascending)."""
        if len(kpos):
            self._block(k, v, kpos, 0, self.shape[2], 0, len(kpos))

    def _block(self, k: Tensor, v: Tensor, kpos: Tensor, a: int, b: int, c: int, e: int) -> None:
        """Queries a..b against keys c..e: the keys masked for every query dropped, then in one or two fused
        calls where the positions allow (keys visible to every query; the same positions, causal), else split
        into TILE x TILE blocks, each fused where it can be and explicit otherwise."""
        w, kp = self.window, kpos[c:e]
        q_lo, q_hi = int(self.qpos[a]), int(self.qpos[b - 1])
        c, e = (c + int(torch.searchsorted(kp, q_lo - w, right=True)) if w is not None else c,
                c + int(torch.searchsorted(kp, q_hi, right=True)))  # fmt: skip
        if c >= e:
            return  # every key is masked for every query
        k_lo, k_hi = int(kpos[c]), int(kpos[e - 1])
        partial = k_hi > q_lo or (w is not None and k_lo <= q_hi - w)
        if not partial:  # every key visible to every query
            if self._fused(k, v, a, b, [(c, e, False)]):
                return
        elif w is None:  # keys before the first query are visible to every query; the rest may be the diagonal
            mid = c + int(torch.searchsorted(kpos[c:e], q_lo))
            if _same_run(self.qpos[a:b], kpos[mid:e]) and self._fused(k, v, a, b, [(c, mid, False), (mid, e, True)]):
                return
        if b - a > TILE or e - c > TILE:
            for c2 in range(c, e, TILE):
                for a2 in range(a, b, TILE):
                    self._block(k, v, kpos, a2, min(b, a2 + TILE), c2, min(e, c2 + TILE))
            return
        kt = k[:, :, None, c:e].to(self.dtype).transpose(-1, -2)
        s = torch.matmul(self.q[..., a:b, :].to(self.dtype), kt).mul_(self.scale)  # [B, Hkv, G, tq, tk]
        if self.softcap is not None:
            s = s.div_(self.softcap).tanh_().mul_(self.softcap)
        if partial:
            qp, kp = self.qpos[a:b].to(s.device)[:, None], kpos[c:e].to(s.device)[None, :]
            allowed = kp <= qp if w is None else (kp <= qp) & (kp > qp - w)
            s.masked_fill_(~allowed, float("-inf"))
        self._update(a, b, s, v[:, :, None, c:e].to(self.dtype))

    def _fused(self, k: Tensor, v: Tensor, a: int, b: int, keys: list[tuple[int, int, bool]]) -> bool:
        """Queries a..b against each key range (c, e, causal) of `keys` through PyTorch's fused attention, folded
        in exactly by its log-sum-exp; False, with nothing done, when some range has no fused kernel."""
        B, H, _, d = self.shape
        Hkv, G, t = self.q.shape[1], self.q.shape[2], b - a
        q = self.q[..., a:b, :].reshape(B, H, t, d)
        parts = [(k[:, :, c:e].to(q.dtype), v[:, :, c:e].to(q.dtype), causal) for c, e, causal in keys if e > c]
        kernels = [fused_kernel(q, kc, vc, causal, self.softcap) for kc, vc, causal in parts]
        if None in kernels:
            return False
        for kernel, (kc, vc, causal) in zip(kernels, parts, strict=True):
            out, lse = fused_attention(kernel, q, kc, vc, self.scale, causal)
            self._fold(a, b, out.reshape(B, Hkv, G, t, d), lse.reshape(B, Hkv, G, t))
        return True

    def _fold(self, a: int, b: int, out: Tensor, lse: Tensor) -> None:
        """Fold the normalized output out [B, Hkv, G, t, d] of queries a..b over some keys, with its log-sum-exp
        lse (finite: every query saw a key), into the running state."""
        lse = lse.to(self.dtype)
        if self.o is None and (a, b) == (0, self.shape[2]):  # the first keys of every query: a normalized state
            self.o, self.m = out, lse
            return
        self._state()
        m_old = self.m[..., a:b]
        m_new = torch.maximum(m_old, lse)
        old, new = torch.exp(m_old - m_new), torch.exp(lse - m_new)
        self.l[..., a:b].mul_(old).add_(new)
        self.o[..., a:b, :].mul_(old[..., None]).add_(out * new[..., None])
        self.m[..., a:b] = m_new

    def _state(self) -> None:
        """Make (o, m, l) explicit, in the score dtype: empty (no keys yet), or from a normalized state (l = 1)."""
        if self.o is None:
            self.o = torch.zeros_like(self.q, dtype=self.dtype)
            self.m = self.o.new_full(self.o.shape[:-1], float("-inf"))
            self.l = torch.zeros_like(self.m)
        elif self.l is None:
            self.o, self.l = self.o.to(self.dtype), torch.ones_like(self.m)

    def _update(self, a: int, b: int, s: Tensor, vt: Tensor) -> None:
        """Fold one tile of scores s [B, Hkv, G, tq, tk] (consumed) and its values into queries a..b."""
        self._state()
        m_old = self.m[..., a:b]
        m_new = torch.maximum(m_old, s.amax(-1))
        safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows that see no key yet
        p = s.sub_(safe[..., None]).exp_()
        scale = torch.exp(m_old - safe)
        self.l[..., a:b].mul_(scale).add_(p.sum(-1))
        self.o[..., a:b, :].mul_(scale[..., None]).add_(p @ vt)
        self.m[..., a:b] = m_new

    def packed(self) -> Tensor:
        """(o, m, l) in one tensor [B, Hkv, G, T, d + 2], for the exchange."""
        self._state()
        return torch.cat([self.o, self.m[..., None], self.l[..., None]], -1)

    def merge(self, parts: list[Tensor]) -> None:
        """Replace the running state by the exact merge of `parts` (packed states over disjoint key sets)."""
        ms = torch.stack([p[..., -2] for p in parts])
        m = ms.amax(0)
        safe = m.masked_fill(m == float("-inf"), 0.0)
        self.o, self.l, self.m = torch.zeros_like(parts[0][..., :-2]), torch.zeros_like(m), m
        for p, m_i in zip(parts, ms, strict=True):
            w = torch.exp(m_i - safe)
            self.o = self.o + p[..., :-2] * w[..., None]
            self.l = self.l + p[..., -1] * w

    def result(self) -> Tensor:
        """The attention output [B, T, H, d] in the queries' dtype (what attention functions return)."""
        B, H, T, d = self.shape
        if self.o is None:
            self._state()  # no keys: 0 / 0, as softmax over no keys
        out = (self.o if self.l is None else self.o / self.l[..., None]).reshape(B, H, T, d)
        return out.transpose(1, 2).to(self.out_dtype).contiguous()


def _ring(acc: OnlineSoftmax, key: Tensor, value: Tensor, call: Call, window: int | None) -> None:
    """Sliced call: the K/V blocks travel round the ring (rank i sends to i + 1), each rank attending its
    own queries to every block it needs; a block goes only as far as some rank still needs it. Receiving
    the next block overlaps with attending to the current one."""
    ex = call.exchange
    P, r = ex.size, call.rank
    held: tuple[Tensor, Tensor] | None = (key, value)
    for step in range(P):
        origin = (r - step) % P
        requests, incoming = [], None
        if step < P - 1:
            if held is not None and call.forwarded(origin, r, window):
                requests += [ex.send(t, (r + 1) % P) for t in held]
            source = (r - step - 1) % P
            if call.forwarded(source, (r - 1) % P, window):
                shape = (*key.shape[:2], len(call.kpos[source]), key.shape[-1])
                incoming = tuple(torch.empty(shape, dtype=key.dtype, device=ex.device) for _ in range(2))
                requests += [ex.receive(t, (r - 1) % P) for t in incoming]
        if held is not None and call.needs(origin, r, window):
            acc.add(held[0].to(key.device), held[1].to(key.device), call.kpos[origin])
        for req, _ in requests:
            req.wait()
        held = incoming


def sequence_parallel_attention(
    module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
    scaling: float | None = None, dropout: float = 0.0, **kwargs: Any,
) -> tuple[Tensor, None]:  # fmt: skip
    """The attention function megaeval registers: query [B, H, Tq, d] of this rank's tokens against the keys
    and values of this rank's shard [B, Hkv, n, d] (returned by the sharded cache) and, through the
    exchange, against every other rank's; returns ([B, Tq, H, d], None) like transformers' own functions."""
    call = ACTIVE.get()
    if call is None:
        raise fail(f"the attention implementation {NAME!r} runs only inside megaeval's sequence-parallel calls")
    call.layers += 1
    name = type(module).__name__
    if getattr(module, "is_causal", True) is False:
        raise fail(f"{name} is not causal attention", "sequence parallel runs causal language models only")
    if attention_mask is not None:
        raise fail(f"{name} adds a mask or bias to its attention scores, which sequence parallel cannot split")
    if kwargs.get("s_aux") is not None or dropout:
        raise fail(f"{name} uses attention sinks or dropout, which sequence parallel does not implement")
    window = kwargs.get("sliding_window")
    if key.shape[-2] != len(call.kpos[call.rank]):
        raise fail(f"{name}: the KV cache holds {key.shape[-2]} keys where {len(call.kpos[call.rank])} were expected",
                   "the model must update its cache once per layer through transformers' Cache.update")  # fmt: skip
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    acc = OnlineSoftmax(query, call.qpos[call.rank], key.shape[1], scale, window, kwargs.get("softcap"))
    if call.exchange is None:
        acc.add(key, value, call.kpos[call.rank])
    elif call.replicated:  # every rank: the same queries against its own shard, then the exact merge
        acc.add(key, value, call.kpos[call.rank])
        acc.merge(call.exchange.all_gather(acc.packed()))
    else:
        _ring(acc, key, value, call, window)
    return acc.result(), None
