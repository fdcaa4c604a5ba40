"""RFA (random feature attention) language model in plain PyTorch, with its state carried from call to call.

Per layer and head the state is the running sums S [R, d] and z [R] of the linear attention (R = 2F
features for the gaussian map, F for arccos), kept in float64; plus the number of tokens consumed.
Its size does not depend on how many tokens came before.

Attention over a call is computed in chunks of `chunk` tokens aligned to absolute positions: within a
chunk, a causal masked quadratic form (with cumulative log-gates, as differences of float64 cumulative
sums, for the gated model); across chunks, the carried state. No Python loop over tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...kernels.common import acc_dtype
from ..base import one_or_per_row, per_row, repeated_rows
from .config import RFAConfig

NORM_FLOOR = 1e-6  # ||q|| and ||k|| are clamped here before normalising
PE_BASE = 10000.0


# ----------------------------------------------------------------------------------------- state


@dataclass
class RFALayerState:
    """One layer's running sums: S [B, H, R, d] and z [B, H, R], float64."""

    s: Tensor
    z: Tensor

    def clone(self) -> RFALayerState:
        return RFALayerState(self.s.clone(), self.z.clone())

    def repeat(self, n: int) -> RFALayerState:
        return RFALayerState(self.s.repeat_interleave(n, 0), self.z.repeat_interleave(n, 0))


@dataclass
class RFAState:
    """Per-layer running sums and the number of tokens consumed (the position of the next token); a batch stacked
    from states of different lengths holds one position per row."""

    layers: list[RFALayerState]
    position: int | list[int]
    rows_share_calls: ClassVar[bool] = False  # stacked rows at different positions read more than a token row by row

    @property
    def batch_size(self) -> int:
        return self.layers[0].z.shape[0]

    def clone(self) -> RFAState:
        """A deep copy (e.g. to reuse a few-shot prefix for many continuations)."""
        return RFAState([s.clone() for s in self.layers], self.position)

    def repeat(self, n: int) -> RFAState:
        """A state for B * n sequences: row i * n + j is a copy of row i (this state is left as it was)."""
        return RFAState([s.repeat(n) for s in self.layers], repeated_rows(self.position, n))

    @staticmethod
    def stack(states: list[RFAState]) -> RFAState:
        """One batch of the rows of `states`, in order, each row keeping its own position."""
        positions = [p for s in states for p in s.positions()]
        layers = [RFALayerState(torch.cat([s.layers[i].s for s in states]), torch.cat([s.layers[i].z for s in states]))
                  for i in range(len(states[0].layers))]  # fmt: skip
        return RFAState(layers, one_or_per_row(positions))

    def select(self, rows: list[int]) -> RFAState:
        """A state of the given rows only, in that order (this one is left as it was)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.layers[0].z.device)
        layers = [RFALayerState(s.s.index_select(0, index), s.z.index_select(0, index)) for s in self.layers]
        every = self.positions()
        return RFAState(layers, one_or_per_row([every[r] for r in rows]))

    def positions(self) -> list[int]:
        """Each row's position."""
        return per_row(self.position, self.batch_size)

    def tensors(self) -> list[Tensor]:
        """Every tensor held by the state."""
        return [t for s in self.layers for t in (s.s, s.z)]

    def nbytes(self) -> int:
        """Bytes held by the state's tensors (the position counter is not counted)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


# ------------------------------------------------------------------------------------- pieces


def sinusoidal(start: int, length: int, dim: int, device: torch.device | None = None) -> Tensor:
    """PE[pos, 2j] = sin(pos / 10000^(2j/D)), PE[pos, 2j+1] = cos(...), for pos in [start, start+length): float64."""
    pos = torch.arange(start, start + length, dtype=torch.float64, device=device)
    two_j = torch.arange(0, dim, 2, dtype=torch.float64, device=device)
    angle = pos[:, None] / PE_BASE ** (two_j / dim)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)[:, :dim]


def feature_map(x: Tensor, w: Tensor, kind: str) -> Tensor:
    """phi of unit vectors x [B, T, H, d] under W [H, F, d]: [B, H, T, R]."""
    proj = torch.einsum("bthd,hfd->bhtf", x, w)
    scale = math.sqrt(1.0 / w.shape[1])
    if kind == "gaussian":
        return torch.cat([proj.sin(), proj.cos()], dim=-1) * scale
    return F.relu(proj) * scale


def rfa_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    log_g: Tensor | None,
    log_1mg: Tensor | None,
    s: Tensor,
    z: Tensor,
    *,
    chunk: int,
    floor: float,
    offset: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Chunked causal RFA. phi_q, phi_k [B, H, T, R] and v [B, H, T, d] (compute dtype); log_g and
    log_1mg [B, H, T] float64 (log g_t and log(1 - g_t); None when ungated); s [B, H, R, d] and
    z [B, H, R] float64 before the call; `offset`: absolute position of the first token (chunks
    are aligned to multiples of `chunk`). Returns out [B, H, T, d] float64 and the new s, z."""
    B, H, T, R = phi_q.shape
    d = v.shape[-1]
    if T == 0:
        return s.new_zeros(B, H, 0, d), s, z
    C = chunk
    lead = offset % C
    N = -(-(lead + T) // C)
    tail = N * C - lead - T

    def blocks(x: Tensor) -> Tensor:  # zero padding: padded keys add nothing, padded gates keep the state
        pad = (lead, tail) if x.dim() == 3 else (0, 0, lead, tail)
        return F.pad(x, pad).view(B, H, N, C, *x.shape[3:])

    q, k, vv = blocks(phi_q), blocks(phi_k), blocks(v)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    scores = q @ k.transpose(-1, -2)  # [B, H, N, C(t), C(s)]
    if log_g is not None:
        cum = blocks(log_g).cumsum(-1)  # log of the product of gates from the chunk start to t, float64
        w_in = blocks(log_1mg)
        within = torch.where(causal, cum[..., :, None] - cum[..., None, :] + w_in[..., None, :], -math.inf)
        scores = scores * within.exp().to(scores.dtype)
        q_w = q.double() * cum.exp()[..., None]  # reads the state from before the chunk
        k_w = k.double() * (cum[..., -1:] - cum + w_in).exp()[..., None]  # writes the state at the chunk end
        carry = cum[..., -1].exp()  # [B, H, N]
    else:
        scores = scores.masked_fill(~causal, 0.0)
        q_w, k_w, carry = q.double(), k.double(), None
    num = (scores @ vv).double()  # [B, H, N, C, d]
    den = scores.sum(-1).double()  # [B, H, N, C]
    vd = vv.double()
    for n in range(N):  # inter-chunk: read the carried state, then fold this chunk into it
        num[:, :, n] += q_w[:, :, n] @ s
        den[:, :, n] += (q_w[:, :, n] @ z[..., None]).squeeze(-1)
        add_s = k_w[:, :, n].transpose(-1, -2) @ vd[:, :, n]
        add_z = k_w[:, :, n].sum(-2)
        if carry is None:
            s, z = s + add_s, z + add_z
        else:
            s = carry[:, :, n, None, None] * s + add_s
            z = carry[:, :, n, None] * z + add_z
    out = num / den.clamp_min(floor)[..., None]
    return out.view(B, H, N * C, d)[:, :, lead : lead + T], s, z


# ------------------------------------------------------------------------------------ modules


class RandomFeatureAttention(nn.Module):
    """Multi-head RFA: normalised q, k through random features, optionally gated, over carried sums."""

    def __init__(self, c: RFAConfig):
        super().__init__()
        D, H = c.model_dim, c.num_heads
        self.config = c
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.register_buffer("random_matrices", torch.zeros(H, c.num_features, c.head_dim))  # fixed epsilon
        self.sigma = nn.Parameter(torch.ones(H, c.head_dim))
        self.gate = nn.Linear(D, H) if c.gated else None

    def features(self, x: Tensor) -> Tensor:
        """phi(x / ||x||) per head: [B, T, D] -> [B, H, T, R] in the compute dtype."""
        c = self.config
        acc = acc_dtype(x.dtype)
        x = x.view(*x.shape[:2], c.num_heads, c.head_dim).to(acc)
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(NORM_FLOOR)
        w = (self.random_matrices * self.sigma[:, None, :]).to(acc)
        return feature_map(x, w, c.feature_map)

    def forward(self, a: Tensor, state: RFALayerState, offset: int, chunk: int) -> tuple[Tensor, RFALayerState]:
        B, T, D = a.shape
        c = self.config
        acc = acc_dtype(a.dtype)
        v = self.v_proj(a).view(B, T, c.num_heads, c.head_dim).transpose(1, 2).to(acc)
        log_g = log_1mg = None
        if self.gate is not None:
            u = self.gate(a).double().transpose(1, 2)  # [B, H, T]
            log_g, log_1mg = F.logsigmoid(u), F.logsigmoid(-u)
        out, s, z = rfa_attention(
            self.features(self.q_proj(a)),
            self.features(self.k_proj(a)),
            v,
            log_g,
            log_1mg,
            state.s,
            state.z,
            chunk=chunk,
            floor=c.denominator_floor,
            offset=offset,
        )
        out = out.transpose(1, 2).reshape(B, T, D).to(a.dtype)
        return self.o_proj(out), RFALayerState(s, z)


class FeedForward(nn.Module):
    def __init__(self, c: RFAConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.model_dim, c.ffn_hidden_dim)
        self.fc2 = nn.Linear(c.ffn_hidden_dim, c.model_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) gelu


class RFABlock(nn.Module):
    """x + o_proj(RFA(LN(x))), then x + FFN(LN(x))."""

    def __init__(self, c: RFAConfig):
        super().__init__()
        self.attn_norm = nn.LayerNorm(c.model_dim, eps=c.norm_eps)
        self.attn = RandomFeatureAttention(c)
        self.ffn_norm = nn.LayerNorm(c.model_dim, eps=c.norm_eps)
        self.ffn = FeedForward(c)

    def forward(self, x: Tensor, state: RFALayerState, offset: int, chunk: int) -> tuple[Tensor, RFALayerState]:
        h, state = self.attn(self.attn_norm(x), state, offset, chunk)
        x = x + h
        return x + self.ffn(self.ffn_norm(x)), state


class RFAModel(nn.Module):
    """The RFA language model (inference, plus an initialiser for fresh models)."""

    def __init__(self, config: RFAConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.model_dim)
        self.layers = nn.ModuleList(RFABlock(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.model_dim, eps=config.norm_eps)
        self.output = None if config.tie_embeddings else nn.Linear(config.model_dim, config.vocab_size, bias=False)

    @property
    def output_weight(self) -> Tensor:
        return self.embed.weight if self.output is None else self.output.weight

    def init_state(self, batch_size: int) -> RFAState:
        """Zero sums for `batch_size` sequences at position 0."""
        c, dev = self.config, self.embed.weight.device
        shape = (batch_size, c.num_heads, c.feature_dim)
        layers = [
            RFALayerState(
                torch.zeros(*shape, c.head_dim, dtype=torch.float64, device=dev),
                torch.zeros(shape, dtype=torch.float64, device=dev),
            )
            for _ in self.layers
        ]
        return RFAState(layers, position=0)

    def forward(self, tokens: Tensor, state: RFAState, chunk: int = 64) -> tuple[Tensor, RFAState]:
        """Final-norm hidden states [B, T, D] for tokens [B, T], and the state after them."""
        D, pos, T = self.config.model_dim, state.position, tokens.shape[1]
        x = self.embed(tokens) * math.sqrt(D)
        if isinstance(pos, list):  # rows at their own positions, one token each (a chunk of one needs no alignment)
            if T != 1:
                raise ValueError("rows at different positions take one token per call")
            x = x + torch.cat([sinusoidal(p, 1, D, x.device) for p in pos])[:, None].to(x.dtype)
        else:
            x = x + sinusoidal(pos, T, D, x.device).to(x.dtype)
        layers = []
        for block, layer_state in zip(self.layers, state.layers, strict=True):
            x, layer_state = block(x, layer_state, pos if isinstance(pos, int) else 0, chunk)
            layers.append(layer_state)
        after = pos + T if isinstance(pos, int) else [p + T for p in pos]
        return self.final_norm(x), RFAState(layers, after)

    def logits(self, hidden: Tensor) -> Tensor:
        """Output logits, in float32 (float64 for float64 models)."""
        return F.linear(hidden, self.output_weight).to(torch.promote_types(hidden.dtype, torch.float32))

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> RFAModel:
        """Gaussian init (std 1/sqrt(fan-in)), standard-normal random matrices, unit sigma, norms at (1, 0)."""
        g = torch.Generator().manual_seed(seed)
        c = self.config
        for name, p in list(self.named_parameters()) + list(self.named_buffers()):
            if name.endswith("random_matrices"):
                value = torch.randn(p.shape, generator=g)
            elif name.endswith("sigma") or name.endswith("norm.weight"):
                value = torch.ones(p.shape)
            elif name.endswith("gate.bias"):
                value = torch.full(p.shape, 1.0)  # start remembering: g = sigmoid(1) ~ 0.73
            elif name.endswith("bias"):
                value = torch.zeros(p.shape)
            else:  # embeddings and projections: [out, in]
                value = torch.randn(p.shape, generator=g) / math.sqrt(c.model_dim if p.dim() < 2 else p.shape[1])
            p.copy_(value.to(p.dtype))
        return self
