"""MEGALODON inference in readable PyTorch, with its state carried from call to call.

The semantics are those of the official implementation (XuezheMax/megalodon) and the module and
parameter names match its consolidated checkpoints, so an official state dict loads directly.
Every operation works on a whole call of T tokens at once (no Python loop over tokens); the state
makes any split of a sequence into calls equal to one call over the whole sequence.

The state (state.py) is per layer: the TimestepNorm statistics, the CEMA hidden state and the keys/values
of the current partial attention chunk. `Megalodon.forward` is the one block loop: chunk parallel runs it
too, passing hooks that say where the call stands in its sequence (state.LocalSlice, parallel.GroupSlice).

The four hot operations (TimestepNorm, CEMA, chunk-local attention, output projection + NLL) are
computed by `self.ops`: the plain-PyTorch references in megaeval.kernels unless `use_kernels` picks
the Triton kernels there.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...kernels.attention import rows_attention
from ...kernels.dispatch import TORCH, Ops
from ...kernels.nll import nll_from_logits
from ...kernels.timestep_norm import timestep_norm as timestep_norm_ref
from .config import ModelArgs
from .state import LOCAL, LayerState, LocalSlice, MegalodonState, NormState, joined


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """Complex dtype paired with a real model dtype."""
    return torch.complex128 if dtype == torch.float64 else torch.complex64


# ------------------------------------------------------------------------------ TimestepNorm


class TimestepNorm(nn.Module):
    """Group norm whose statistics are cumulative over time: the mean and variance of each group
    over every timestep so far, the current one included (megaeval.kernels.timestep_norm)."""

    ops: Ops = TORCH

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
        if isinstance(state.count, list):  # rows at their own counts (a stacked state): the reference takes them
            count = torch.tensor(state.count, dtype=torch.float64, device=x.device)[:, None, None]
            y, mean, var = timestep_norm_ref(x, self.weight, self.bias, count, state.mean, state.var, self.eps)
            return y, NormState([c + x.shape[1] for c in state.count], mean, var)
        y, mean, var = self.ops.timestep_norm(x, self.weight, self.bias, state.count, state.mean, state.var, self.eps)
        return y, NormState(state.count + x.shape[1], mean, var)


# -------------------------------------------------------------------------------------- CEMA


def _version(t: Tensor) -> int:
    """In-place changes seen by t so far (0 for tensors made in inference mode, which count none and can change
    only inside it)."""
    return 0 if t.is_inference() else t._version


class MultiHeadComplexEMA(nn.Module):
    """Complex exponential moving average: per dimension d and component n,
    h_t = p x_t + q h_{t-1},  y_t = Re(sum_n gamma_n h_t,n) + omega x_t,
    with p = sigmoid(alpha), q = (1 - sigmoid(alpha) sigmoid(delta)) exp(i n theta_d) (megaeval.kernels.cema)."""

    ops: Ops = TORCH

    def __init__(self, dim: int, ndim: int):
        super().__init__()
        self.ndim = ndim
        self.alpha = nn.Parameter(torch.zeros(dim, ndim, 1))
        self.delta = nn.Parameter(torch.zeros(dim, ndim, 1))
        self.theta = nn.Parameter(torch.zeros(dim, 1, 1))
        self.gamma = nn.Parameter(torch.zeros(dim, ndim, 2))  # complex, as (real, imag)
        self.omega = nn.Parameter(torch.zeros(dim, 1))
        self._coefficients: tuple[tuple, tuple, tuple[Tensor, Tensor, Tensor]] | None = None

    def coefficients(self) -> tuple[Tensor, Tensor, Tensor]:
        """p [D, N] (real), log q [D, N] and gamma [D, N] (complex), all in float64; computed once for given
        parameters (the same tensors call after call, which the kernels' constants are kept by), again after
        any change to them or with gradients on."""
        params = (self.alpha, self.delta, self.theta, self.gamma)
        key = tuple((id(t), _version(t), t.data_ptr(), t.dtype, t.device) for t in params)
        if self._coefficients is not None and self._coefficients[0] == key and not torch.is_grad_enabled():
            return self._coefficients[2]
        N = self.ndim
        alpha = torch.sigmoid(self.alpha.double()).squeeze(-1)
        delta = torch.sigmoid(self.delta.double()).squeeze(-1)
        base_angle = torch.sigmoid(self.theta.double()).view(-1, 1) * (2 * math.pi / N)
        harmonics = torch.arange(1, N + 1, dtype=torch.float64, device=alpha.device)
        log_q = torch.complex(torch.log1p(-alpha * delta), base_angle * harmonics)
        gamma = torch.view_as_complex(self.gamma.double().contiguous()) * math.sqrt(1.0 / N)
        if torch.is_grad_enabled():
            return alpha, log_q, gamma
        with torch.inference_mode(False):  # ordinary tensors, usable inside and outside inference mode
            self._coefficients = (key, params, (alpha.clone(), log_q.clone(), gamma.clone()))  # params: ids stay theirs
        return self._coefficients[2]

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """x: [B, T, D], h: [B, D, N] complex carried state. Returns y [B, T, D] and the new state."""
        p, log_q, gamma = self.coefficients()
        return self.ops.cema(x, h, p, log_q, gamma, self.omega)


# ------------------------------------------------------------------------------------ norms


class RMSNorm(nn.Module):
    """x / rms(x), times (weight + 1) when affine (megaeval.kernels.rms_norm)."""

    ops: Ops = TORCH

    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        weight = None if self.weight is None else self.weight + 1.0
        return F.layer_norm(x, x.shape[-1:], weight, self.bias, self.eps)


# ------------------------------------------------------------------------------------ blocks


class MovingAverageGatedAttention(nn.Module):
    """TimestepNorm -> CEMA -> gated chunk-local attention (megaeval.kernels.attention), with a residual connection."""

    ops: Ops = TORCH

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

    def forward(self, x: Tensor, state: LayerState, part: LocalSlice = LOCAL) -> tuple[list[Tensor], LayerState]:
        """x + h for each piece of `part` (x [B, T, D]), and the layer's state after the call. Every piece goes
        through TimestepNorm and CEMA first, from the statistics and CEMA state `part` says enter the call, then
        through gated attention, its CEMA output completed by what `part` says the state entering adds."""
        pieces = part.pieces(x.shape[1])
        norm, h = part.norm_before(x, state.norm), part.cema_start(state.cema)
        normed, mixed = [], []
        for a, b in pieces:
            y, norm = self.timenorm(x[:, a:b], norm)
            c, h = self.cema(y, h)
            normed.append(y)
            mixed.append(c)
        carry, h = part.cema_carry(self.cema, state.cema, h)
        k, v = part.kv_start(state.k, state.v)
        out = []
        for i, (a, b) in enumerate(pieces):
            c = mixed[i] if carry is None else carry(a, b, mixed[i])
            y, k, v = self.gated_attention(x[:, a:b], normed[i], c, k, v)
            out.append(y)
            normed[i] = mixed[i] = None  # one piece's activations alive at a time, besides the three of the call
        return out, LayerState(part.norm_after(state.norm, norm), h, k, v)

    def gated_attention(
        self, x: Tensor, out_tsn: Tensor, out_cema: Tensor, k_cache: Tensor, v_cache: Tensor, fill: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The layer after its TimestepNorm (out_tsn) and CEMA (out_cema): gated chunk-local attention plus
        the residual x. Returns the output and the K/V caches of the chunk left partial. `fill`: stacked rows,
        one token each, row b's cache holding fill[b] keys (`kernels.attention.rows_attention`)."""
        B, T, _ = x.shape
        H = self.num_heads
        mx = self.rmsnorm(out_cema)

        q, k = self.ops.shared_qk(self.wz(mx), self.gamma, self.beta, H, self.eps)  # per-head norm, two affine maps
        v = F.silu(self.wv(out_tsn))

        q, k, v = q.view(B, T, H, -1), k.view(B, T, H, -1), v.view(B, T, H, -1)
        if fill is None:
            attn, k_cache, v_cache = self.ops.chunked_attention(q, k, v, k_cache, v_cache, self.chunk_size,
                                                                self.rope_base)  # fmt: skip
        else:
            attn, k_cache, v_cache = rows_attention(q, k, v, k_cache, v_cache, fill, self.chunk_size, self.rope_base)
        h_out = self.wh1(mx) + self.wh2(self.ops.silu_mul(attn.reshape(B, T, -1), self.wr(mx)))  # gate: silu(r)
        return x + h_out, k_cache, v_cache


class NormalizedFeedForwardNetwork(nn.Module):
    """LayerNorm -> (SwiGLU or SiLU) FFN, optionally rescaled per dimension, plus a given residual."""

    ops: Ops = TORCH

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.norm = LayerNorm(a.model_dim, a.norm_eps, affine=a.norm_affine)
        self.fc1 = nn.Linear(a.model_dim, a.ffn_hidden_dim, bias=False)
        self.fc2 = nn.Linear(a.ffn_hidden_dim, a.model_dim, bias=False)
        self.fc3 = nn.Linear(a.model_dim, a.ffn_hidden_dim, bias=False) if a.swiglu else None
        self.alpha = nn.Parameter(torch.ones(a.model_dim)) if a.rescale_nffn else None

    def forward(self, y: Tensor, residual: Tensor) -> Tensor:
        x = self.norm(y)
        hidden = F.silu(self.fc1(x)) if self.fc3 is None else self.ops.silu_mul(self.fc3(x), self.fc1(x))
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

    def forward(self, x: Tensor, state: LayerState, part: LocalSlice = LOCAL) -> tuple[Tensor, LayerState]:
        ys, state = self.mega(x, state, part)
        out = []
        for i, (a, b) in enumerate(part.pieces(x.shape[1])):
            out.append(self.nffn(ys[i], x[:, a:b]))
            ys[i] = None
        return joined(out, x), state


class OutputLayer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.final_norm = TimestepNorm(a.model_dim, a.norm_num_groups, a.norm_eps)
        self.output = nn.Linear(a.model_dim, a.out_size, bias=False)


class Megalodon(nn.Module):
    """The MEGALODON language model (inference only)."""

    ops: Ops = TORCH

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

    def forward(self, tokens: Tensor, state: MegalodonState, part: LocalSlice = LOCAL) -> tuple[Tensor, MegalodonState]:
        """Final-norm hidden states [B, T, D] for tokens [B, T], and the state after them. `part`: where the call
        stands in its sequence (LOCAL: all of it, in this process; chunk parallel passes a rank's slice)."""
        if isinstance(state.position, list):
            return self._forward_rows(tokens, state)
        x = self.embed(tokens)
        if self.emb_scale is not None:
            x = x * self.emb_scale
        layers = []
        for block, layer_state in zip(self.layers, state.layers, strict=True):
            x, layer_state = block(x, layer_state, part)
            layers.append(layer_state)
        norm, hidden = part.norm_before(x, state.final_norm), []
        for a, b in part.pieces(x.shape[1]):
            y, norm = self.output.final_norm(x[:, a:b], norm)
            hidden.append(y)
        final_norm = part.norm_after(state.final_norm, norm)
        after = replace(state, layers=layers, final_norm=final_norm, position=state.position + tokens.shape[1])
        return joined(hidden, x), part.state_after(state, after)

    def _forward_rows(self, tokens: Tensor, state: MegalodonState) -> tuple[Tensor, MegalodonState]:
        """`forward` of one token per row on rows at their own positions (a stacked state): the same layers, each
        row's norm counts and partial chunk its own."""
        if tokens.shape[1] != 1:
            raise ValueError("rows at different positions take one token per call")
        fill = torch.tensor(state.row_fills(), dtype=torch.long)
        x = self.embed(tokens)
        if self.emb_scale is not None:
            x = x * self.emb_scale
        layers = []
        for block, s in zip(self.layers, state.layers, strict=True):
            mega = block.mega
            y, norm = mega.timenorm(x, s.norm)
            c, h = mega.cema(y, s.cema)
            out, k, v = mega.gated_attention(x, y, c, s.k, s.v, fill)
            layers.append(LayerState(norm, h, k, v))
            x = block.nffn(out, x)
        hidden, final_norm = self.output.final_norm(x, state.final_norm)
        fills = [(f + 1) % self.args.chunk_size for f in state.row_fills()]
        return hidden, MegalodonState(layers, final_norm, [p + 1 for p in state.positions()], None, fills)

    def logits(self, hidden: Tensor) -> Tensor:
        """Output-layer logits, in float32 (float64 for float64 models)."""
        return self.output.output(hidden).to(torch.promote_types(hidden.dtype, torch.float32))

    def nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        """Per-token NLL [B, T] of targets (-100 scores 0) after final hidden states [B, T, D]."""
        if self.ops.backend == "torch":  # the reference: all [B, T, V] logits, then cross-entropy
            return nll_from_logits(self.logits(hidden), targets)
        return self.ops.linear_nll(hidden, self.output.output.weight, targets)

    def use_kernels(self, ops: Ops) -> Megalodon:
        """Compute TimestepNorm, CEMA, attention and the NLL with `ops` (megaeval.kernels.select)."""
        for module in self.modules():
            if isinstance(module, (Megalodon, TimestepNorm, MultiHeadComplexEMA, MovingAverageGatedAttention, RMSNorm,
                                   NormalizedFeedForwardNetwork)):  # fmt: skip
                module.ops = ops
        return self

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> Megalodon:
        """Initialise like the official code: Gaussian embeddings/outputs, He-normal projections,
        zero norm weights (scale 1) and biases, CEMA per its reset (alpha, delta ~ N(0, 0.2); theta
        from a geometric frequency ladder; gamma ~ N(0, 1) real; omega ~ TruncNormal(0, 0.25)).
        The numbers are drawn on the model's device (a CUDA model draws its own, without a trip through the CPU)."""
        device = self.embed.weight.device
        g = torch.Generator(device=device).manual_seed(seed)
        D = self.args.model_dim

        def normal_(t: Tensor, std: float) -> None:
            t.copy_(torch.randn(t.shape, generator=g, device=device) * std)

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
            freqs = torch.exp(-torch.arange(1, D + 1, dtype=torch.float64, device=device) * math.log(D) / D)
            freqs = freqs[torch.randperm(D, generator=g, device=device)]
            e.theta.copy_(torch.log(freqs / (1 - freqs)).view(D, 1, 1))
            normal_(e.gamma, 1.0)
            e.gamma[:, :, 1] = 0.0
            omega = torch.empty(D, 1, device=device)
            e.omega.copy_(torch.nn.init.trunc_normal_(omega, std=0.25, a=-1.0, b=1.0, generator=g))
        return self
