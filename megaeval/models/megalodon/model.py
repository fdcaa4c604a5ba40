"""MEGALODON inference in readable PyTorch, with its state carried from call to call.

The semantics are those of the official implementation (XuezheMax/megalodon) and the module and
parameter names match its consolidated checkpoints, so an official state dict loads directly.
Every operation works on a whole call of T tokens at once (no Python loop over tokens); the state
makes any split of a sequence into calls equal to one call over the whole sequence.

Per layer the state is: the TimestepNorm statistics (count, per-group mean and variance, kept in
float64), the CEMA hidden state (complex), and the keys/values of the current partial attention
chunk. Attention never crosses a chunk boundary, so nothing else needs to be remembered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelArgs


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 models, float32 otherwise (as the official kernels)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """Complex dtype paired with a real model dtype."""
    return torch.complex128 if dtype == torch.float64 else torch.complex64


# ----------------------------------------------------------------------------------------- state


@dataclass
class NormState:
    """TimestepNorm statistics over every timestep so far: count and per-group mean/variance."""

    count: int
    mean: Tensor  # [B, G] float64
    var: Tensor  # [B, G] float64

    def clone(self) -> NormState:
        return NormState(self.count, self.mean.clone(), self.var.clone())


@dataclass
class LayerState:
    """What one MEGALODON layer carries across calls."""

    norm: NormState
    cema: Tensor  # [B, D, N] complex hidden state of the CEMA
    k: Tensor  # [B, n, H, dz] rotated keys of the current partial chunk, n < chunk_size
    v: Tensor  # [B, n, H, dv] values of the current partial chunk

    def clone(self) -> LayerState:
        return LayerState(self.norm.clone(), self.cema.clone(), self.k.clone(), self.v.clone())


@dataclass
class MegalodonState:
    """The whole model's state: per-layer states, the final norm's statistics, tokens consumed."""

    layers: list[LayerState]
    final_norm: NormState
    position: int
    history: Tensor | None = None  # last tokens, kept only by the official-window norm mode

    def clone(self) -> MegalodonState:
        """A deep copy (e.g. to reuse a few-shot prefix for many continuations)."""
        history = None if self.history is None else self.history.clone()
        return MegalodonState([s.clone() for s in self.layers], self.final_norm.clone(), self.position, history)

    def tensors(self) -> list[Tensor]:
        """Every tensor held by the state."""
        out = [self.final_norm.mean, self.final_norm.var]
        for s in self.layers:
            out += [s.norm.mean, s.norm.var, s.cema, s.k, s.v]
        return out + ([] if self.history is None else [self.history])

    def nbytes(self) -> int:
        """Bytes held by the state's tensors (the integer counters are not counted)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


# ------------------------------------------------------------------------------ TimestepNorm


def cumulative_moments(step_mean: Tensor, step_var: Tensor, state: NormState) -> tuple[Tensor, Tensor, NormState]:
    """Running mean/variance after each timestep, each timestep one equally weighted group sample.

    step_mean, step_var: [B, T, G] float64 moments of each timestep's group. Returns the pooled
    mean and (population) variance over the carried statistics and timesteps 1..t, for every t.
    Sums are taken around the carried mean so that float64 keeps them exact over long streams.
    """
    T = step_mean.shape[1]
    n = state.count + torch.arange(1, T + 1, dtype=torch.float64, device=step_mean.device)[:, None]
    d = step_mean - state.mean[:, None]
    s1 = d.cumsum(1)
    s2 = (step_var + d * d).cumsum(1)
    mean = state.mean[:, None] + s1 / n
    var = ((state.count * state.var[:, None] + s2) / n - (s1 / n) ** 2).clamp_min(0)
    return mean, var, NormState(state.count + T, mean[:, -1], var[:, -1])


class TimestepNorm(nn.Module):
    """Group norm whose statistics are cumulative over time: the mean and variance of each group
    over every timestep so far, the current one included."""

    def __init__(self, dim: int, num_groups: int, eps: float):
        super().__init__()
        self.num_groups, self.eps = num_groups, eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("prior_count", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("prior_mean", torch.zeros(num_groups))
        self.register_buffer("prior_logv", torch.zeros(num_groups))

    def init_state(self, batch_size: int) -> NormState:
        mean = self.prior_mean.to(torch.float64).expand(batch_size, -1).clone()
        var = self.prior_logv.to(torch.float64).exp().expand(batch_size, -1).clone()
        return NormState(int(self.prior_count), mean, var)

    def forward(self, x: Tensor, state: NormState) -> tuple[Tensor, NormState]:
        B, T, D = x.shape
        acc = acc_dtype(x.dtype)
        xg = x.view(B, T, self.num_groups, D // self.num_groups)
        step_var, step_mean = torch.var_mean(xg.double(), dim=-1, correction=0)  # exact for any input dtype
        mean, var, state = cumulative_moments(step_mean, step_var, state)
        rstd = torch.rsqrt(var + self.eps).to(acc)
        y = ((xg.to(acc) - mean.to(acc)[..., None]) * rstd[..., None]).view(B, T, D)
        y = y * (self.weight.to(acc) + 1.0) + self.bias.to(acc)
        return y.to(x.dtype), state


# -------------------------------------------------------------------------------------- CEMA


def complex_powers(log_q: Tensor, length: int, dtype: torch.dtype) -> Tensor:
    """q**t for t in [0, length) as [..., length] of `dtype`.

    Written q**(b*K + j) = (q**K)**b * q**j with both factors from float64 exponents, so the
    phase stays accurate for long calls even when the result is complex64.
    """
    K = math.isqrt(max(length - 1, 0)) + 1
    j = torch.arange(K, dtype=torch.float64, device=log_q.device)
    small = torch.exp(log_q[..., None] * j).to(dtype)
    large = torch.exp(log_q[..., None] * (j * K)).to(dtype)
    return (large[..., :, None] * small[..., None, :]).flatten(-2)[..., :length]


def causal_fft_conv(x: Tensor, kernel: Tensor) -> Tensor:
    """y[..., t] = sum_{s<=t} kernel[..., t-s] x[..., s], by FFT. x: [B, D, T], kernel: [D, T]."""
    T = x.shape[-1]
    n = 1 << (2 * T - 1).bit_length()
    y = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(kernel, n=n), n=n)
    return y[..., :T]


class MultiHeadComplexEMA(nn.Module):
    """Complex exponential moving average: per dimension d and component n,
    h_t = p x_t + q h_{t-1},  y_t = Re(sum_n gamma_n h_t,n) + omega x_t,
    with p = sigmoid(alpha), q = (1 - sigmoid(alpha) sigmoid(delta)) exp(i n theta_d)."""

    def __init__(self, dim: int, ndim: int):
        super().__init__()
        self.ndim = ndim
        self.alpha = nn.Parameter(torch.zeros(dim, ndim, 1))
        self.delta = nn.Parameter(torch.zeros(dim, ndim, 1))
        self.theta = nn.Parameter(torch.zeros(dim, 1, 1))
        self.gamma = nn.Parameter(torch.zeros(dim, ndim, 2))  # complex, as (real, imag)
        self.omega = nn.Parameter(torch.zeros(dim, 1))

    def coefficients(self) -> tuple[Tensor, Tensor, Tensor]:
        """p [D, N] (real), log q [D, N] and gamma [D, N] (complex), all in float64."""
        N = self.ndim
        alpha = torch.sigmoid(self.alpha.double()).squeeze(-1)
        delta = torch.sigmoid(self.delta.double()).squeeze(-1)
        base_angle = torch.sigmoid(self.theta.double()).view(-1, 1) * (2 * math.pi / N)
        harmonics = torch.arange(1, N + 1, dtype=torch.float64, device=alpha.device)
        log_q = torch.complex(torch.log1p(-alpha * delta), base_angle * harmonics)
        gamma = torch.view_as_complex(self.gamma.double().contiguous()) * math.sqrt(1.0 / N)
        return alpha, log_q, gamma

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x: [B, T, D], h: [B, D, N] complex carried state. Returns y [B, T, D] and the new state."""
        T = x.shape[1]
        cdt, rdt = h.dtype, acc_dtype(x.dtype)
        p, log_q, gamma = self.coefficients()
        q_pow = complex_powers(log_q, T + 1, cdt)  # [D, N, T+1]
        xt = x.to(rdt).transpose(1, 2)  # [B, D, T]
        kernel = ((p * gamma).to(cdt)[..., None] * q_pow[..., :T]).real.sum(1)  # [D, T]
        y = causal_fft_conv(xt, kernel)
        y = y + torch.einsum("bdn,dnt->bdt", h * gamma.to(cdt), q_pow[..., 1:]).real  # carried state
        y = y + self.omega.to(rdt) * xt
        reversed_pow = q_pow[..., :T].flip(-1)  # q**(T-1-s)
        injected = torch.complex(
            torch.einsum("bds,dns->bdn", xt, reversed_pow.real), torch.einsum("bds,dns->bdn", xt, reversed_pow.imag)
        )
        h = p.to(cdt) * injected + q_pow[..., T] * h
        return y.transpose(1, 2).to(x.dtype), h


# ------------------------------------------------------------------------- norms and rotary


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """x / rms(x), times (weight + 1) when affine."""
    acc = acc_dtype(x.dtype)
    y = x.to(acc) * torch.rsqrt(x.to(acc).pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.to(acc) + 1.0)
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        weight = None if self.weight is None else self.weight + 1.0
        return F.layer_norm(x, x.shape[-1:], weight, self.bias, self.eps)


def apply_rope(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary embedding on adjacent pairs (x[2i], x[2i+1]). x: [B, T, H, d], positions: [T]."""
    d = x.shape[-1]
    acc = acc_dtype(x.dtype)
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angle = positions.to(torch.float64)[:, None] * inv_freq  # [T, d/2]
    cos, sin = angle.cos().to(acc)[:, None, :], angle.sin().to(acc)[:, None, :]
    x0, x1 = x.to(acc).unflatten(-1, (d // 2, 2)).unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2).to(x.dtype)


# ---------------------------------------------------------------------------------- attention


def _attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
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


def chunked_attention(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, chunk: int, rope_base: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal attention that never crosses a chunk boundary, continuing a partial chunk.

    q, k: [B, T, H, dz] before rotation; v: [B, T, H, dv]; the caches hold the rotated keys and
    values of the current partial chunk. Rotary positions restart at 0 in every chunk. Returns the
    output [B, T, H, dv] and the caches for the chunk that is partial after this call.
    """
    B, T, H, _ = q.shape
    c = k_cache.shape[1]
    positions = (c + torch.arange(T, device=q.device)) % chunk
    q, k = apply_rope(q, positions, rope_base), apply_rope(k, positions, rope_base)
    keys, values = torch.cat([k_cache, k], dim=1), torch.cat([v_cache, v], dim=1)  # start on a boundary

    head = min(T, chunk - c)  # queries that finish the current chunk
    parts = [_attend(q[:, :head], keys[:, : c + head], values[:, : c + head])]
    n_full = (T - head) // chunk
    if n_full:  # whole chunks, batched together
        s, e = head, head + n_full * chunk

        def by_chunk(t: Tensor) -> Tensor:
            return t.reshape(B * n_full, chunk, *t.shape[2:])

        out = _attend(by_chunk(q[:, s:e]), by_chunk(keys[:, c + s : c + e]), by_chunk(values[:, c + s : c + e]))
        parts.append(out.reshape(B, n_full * chunk, H, -1))
    tail = T - head - n_full * chunk  # queries of a new partial chunk
    if tail:
        parts.append(_attend(q[:, T - tail :], keys[:, c + T - tail :], values[:, c + T - tail :]))

    kept = (c + T) % chunk
    return torch.cat(parts, dim=1), keys[:, c + T - kept :], values[:, c + T - kept :]


# ------------------------------------------------------------------------------------ blocks


class MovingAverageGatedAttention(nn.Module):
    """TimestepNorm -> CEMA -> gated chunk-local attention, with a residual connection."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        D, Z, E = a.model_dim, a.z_dim, a.value_dim
        self.num_heads, self.chunk_size, self.eps = a.num_heads, a.chunk_size, a.norm_eps
        self.rope_base = 10000.0 if a.rope_base is None else float(a.rope_base)
        self.timenorm = TimestepNorm(D, a.norm_num_groups, a.norm_eps)
        self.cema = MultiHeadComplexEMA(D, a.cema_ndim)
        self.rmsnorm = RMSNorm(D, a.norm_eps, affine=a.norm_affine)
        self.wv = nn.Linear(D, E)
        self.wz = nn.Linear(D, Z)
        self.wr = nn.Linear(D, E)
        self.wh1 = nn.Linear(D, D)
        self.wh2 = nn.Linear(E, D, bias=False)
        self.gamma = nn.Parameter(torch.zeros(2, Z))  # q and k scales (applied as gamma + 1)
        self.beta = nn.Parameter(torch.zeros(2, Z))  # q and k offsets

    def forward(self, x: Tensor, state: LayerState) -> tuple[Tensor, LayerState]:
        B, T, _ = x.shape
        H = self.num_heads
        out_tsn, norm = self.timenorm(x, state.norm)
        out_cema, h = self.cema(out_tsn, state.cema)
        mx = self.rmsnorm(out_cema)

        z = rms_norm(self.wz(mx).view(B, T, H, -1), None, self.eps).view(B, T, 1, -1)  # per-head, no affine
        z_head_dim = self.gamma.shape[1] // H
        q, k = (z * ((self.gamma + 1.0) / math.sqrt(z_head_dim)) + self.beta).unbind(2)
        v = F.silu(self.wv(out_tsn))
        r = F.silu(self.wr(mx))

        attn, k_cache, v_cache = chunked_attention(
            q.view(B, T, H, -1),
            k.view(B, T, H, -1),
            v.view(B, T, H, -1),
            state.k,
            state.v,
            self.chunk_size,
            self.rope_base,
        )
        h_out = self.wh1(mx) + self.wh2(attn.reshape(B, T, -1) * r)
        return x + h_out, LayerState(norm, h, k_cache, v_cache)


class NormalizedFeedForwardNetwork(nn.Module):
    """LayerNorm -> (SwiGLU or SiLU) FFN, optionally rescaled per dimension, plus a given residual."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.norm = LayerNorm(a.model_dim, a.norm_eps, affine=a.norm_affine)
        self.fc1 = nn.Linear(a.model_dim, a.ffn_hidden_dim, bias=False)
        self.fc2 = nn.Linear(a.ffn_hidden_dim, a.model_dim, bias=False)
        self.fc3 = nn.Linear(a.model_dim, a.ffn_hidden_dim, bias=False) if a.swiglu else None
        self.alpha = nn.Parameter(torch.ones(a.model_dim)) if a.rescale_nffn else None

    def forward(self, y: Tensor, residual: Tensor) -> Tensor:
        x = self.norm(y)
        hidden = F.silu(self.fc1(x))
        if self.fc3 is not None:
            hidden = hidden * self.fc3(x)
        out = self.fc2(hidden)
        if self.alpha is not None:
            out = self.alpha * out
        return out + residual


class MegaBlock(nn.Module):
    """One layer. Its FFN's residual is the block input: out = x + FFN(LN(x + h))."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.mega = MovingAverageGatedAttention(a)
        self.nffn = NormalizedFeedForwardNetwork(a)

    def forward(self, x: Tensor, state: LayerState) -> tuple[Tensor, LayerState]:
        y, state = self.mega(x, state)
        return self.nffn(y, x), state


class OutputLayer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.final_norm = TimestepNorm(a.model_dim, a.norm_num_groups, a.norm_eps)
        self.output = nn.Linear(a.model_dim, a.out_size, bias=False)


class Megalodon(nn.Module):
    """The MEGALODON language model (inference only)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.model_dim)
        self.layers = nn.ModuleList(MegaBlock(args) for _ in range(args.num_layers))
        self.output = OutputLayer(args)
        self.emb_scale = math.sqrt(args.model_dim) if args.scale_emb else None
        if args.share_emb:
            self.output.output.weight = self.embed.weight

    def init_state(self, batch_size: int) -> MegalodonState:
        """The state before any token: prior norm statistics, zero CEMA state, empty chunk."""
        a = self.args
        ref = self.embed.weight
        layers = [
            LayerState(
                norm=block.mega.timenorm.init_state(batch_size),
                cema=torch.zeros(
                    batch_size, a.model_dim, a.cema_ndim, dtype=complex_dtype(ref.dtype), device=ref.device
                ),
                k=ref.new_zeros(batch_size, 0, a.num_heads, a.z_head_dim),
                v=ref.new_zeros(batch_size, 0, a.num_heads, a.v_head_dim),
            )
            for block in self.layers
        ]
        return MegalodonState(layers, self.output.final_norm.init_state(batch_size), position=0)

    def forward(self, tokens: Tensor, state: MegalodonState) -> tuple[Tensor, MegalodonState]:
        """Final-norm hidden states [B, T, D] for tokens [B, T], and the state after them."""
        x = self.embed(tokens)
        if self.emb_scale is not None:
            x = x * self.emb_scale
        layer_states = []
        for block, layer_state in zip(self.layers, state.layers, strict=True):
            x, layer_state = block(x, layer_state)
            layer_states.append(layer_state)
        x, final_norm = self.output.final_norm(x, state.final_norm)
        return x, replace(state, layers=layer_states, final_norm=final_norm, position=state.position + tokens.shape[1])

    def logits(self, hidden: Tensor) -> Tensor:
        """Output-layer logits, in float32 (float64 for float64 models)."""
        return self.output.output(hidden).to(torch.promote_types(hidden.dtype, torch.float32))

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> Megalodon:
        """Initialise like the official code: Gaussian embeddings/outputs, He-normal projections,
        zero norm weights (scale 1) and biases, CEMA per its reset (alpha, delta ~ N(0, 0.2); theta
        from a geometric frequency ladder; gamma ~ N(0, 1) real; omega ~ TruncNormal(0, 0.25))."""
        g = torch.Generator().manual_seed(seed)
        D = self.args.model_dim

        def normal_(t: Tensor, std: float) -> None:
            t.copy_(torch.randn(t.shape, generator=g) * std)

        for name, p in self.named_parameters():
            if name.endswith(("norm.weight", "norm.bias", ".bias", "mega.gamma", "mega.beta")):
                p.zero_()
        normal_(self.embed.weight, D**-0.5)
        if not self.args.share_emb:
            normal_(self.output.output.weight, D**-0.5)
        for layer_id, block in enumerate(self.layers):
            m, f = block.mega, block.nffn
            for lin in (m.wv, m.wz, m.wr, m.wh1, m.wh2, f.fc1, f.fc2) + ((f.fc3,) if f.fc3 is not None else ()):
                normal_(lin.weight, math.sqrt(2.0 / lin.weight.shape[1]))
            if f.alpha is not None:
                f.alpha.fill_(0.1 * 0.5**layer_id)
            e = m.cema
            normal_(e.alpha, 0.2)
            normal_(e.delta, 0.2)
            freqs = torch.exp(-torch.arange(1, D + 1, dtype=torch.float64) * math.log(D) / D)
            freqs = freqs[torch.randperm(D, generator=g)]
            e.theta.copy_(torch.log(freqs / (1 - freqs)).view(D, 1, 1))
            normal_(e.gamma, 1.0)
            e.gamma[:, :, 1] = 0.0
            e.omega.copy_(torch.nn.init.trunc_normal_(torch.empty(D, 1), std=0.25, a=-1.0, b=1.0, generator=g))
        return self
