"""RecurrentGemma (Griffin) in plain PyTorch, with its state carried exactly from call to call.

Layers follow `block_types` (by default two recurrent blocks, then one local-attention block, repeated). A recurrent
layer carries its conv's last `conv1d_width - 1` inputs [B, W, k-1] and the RG-LRU state [B, W] (float32 at least);
its recurrence h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t * x_t) runs with `scan.scan` over the whole call, reset at
absolute position 0 as the architecture defines. An attention layer carries the keys and values (after rotary) of
the last `attention_window_size - 1` tokens: a query attends to itself and those before it, so the state stops
growing once the window is full (it is allocated full from the start: its size never changes). Rotary angles are
computed in float32 as transformers computes them (float64 for float64 models). Parameter names are transformers'
(RecurrentGemmaForCausalLM).

Rows at different positions (a state stacked from states of different lengths) carry one position per row: each
row's rotary angles, window mask and reset at position 0 follow its own position, and its window slots before its
first token stay masked (`ChunkedStreamingLM` steps such rows together one token at a time, longer calls row by row).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import fail
from ...kernels.common import acc_dtype
from ..fields import filled, flag, positive_float, positive_int
from .layers import causal_conv, output_logits
from .recurrent_gemma_state import AttentionLayerState, RecurrentGemmaState, RecurrentLayerState
from .scan import scan, scan_reference

QUERY_CHUNK = 256  # queries whose scores over the window are alive at once


@dataclass(frozen=True)
class RecurrentGemmaConfig:
    """The fields of a transformers RecurrentGemma config.json that the forward pass reads."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    lru_width: int
    attention_window_size: int
    conv1d_width: int
    logits_soft_cap: float
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    block_types: tuple[str, ...]
    attention_bias: bool
    tie_word_embeddings: bool

    @property
    def head_dim(self) -> int:
        """hidden_size / num_attention_heads (transformers derives it so, whatever config.json says)."""
        return self.hidden_size // self.num_attention_heads

    def layer_kinds(self) -> list[str]:
        """ "recurrent" or "attention" for each layer: block_types repeated."""
        return [self.block_types[i % len(self.block_types)] for i in range(self.num_hidden_layers)]

    def to_dict(self) -> dict[str, Any]:
        """The fields, as reports record them."""
        return {**asdict(self), "block_types": list(self.block_types)}

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> RecurrentGemmaConfig:
        """Read and check a transformers config.json (model_type recurrent_gemma); absent keys take its defaults."""
        act = raw.get("hidden_activation", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise fail(f"{source}: hidden_activation {act!r} is not supported", "RecurrentGemma uses gelu_pytorch_tanh")
        rope = raw.get("rope_parameters")
        if rope is not None and (not isinstance(rope, dict) or rope.get("rope_type", "default") != "default"):
            raise fail(f"{source}: only the default rotary embedding is supported, got rope_parameters {rope!r}")
        at = "" if rope is None else "rope_parameters."  # transformers before 5 wrote these two at the top level
        kinds = raw.get("block_types", ["recurrent", "recurrent", "attention"])
        if not isinstance(kinds, (list, tuple)) or not kinds or any(k not in ("recurrent", "attention") for k in kinds):
            raise fail(f"{source}: block_types must list 'recurrent' and 'attention', got {kinds!r}")
        hidden = positive_int(raw, "hidden_size", source, 2560)
        heads = positive_int(raw, "num_attention_heads", source, 10)
        derived = filled(raw, {"num_key_value_heads": heads, "lru_width": hidden})
        c = cls(
            vocab_size=positive_int(raw, "vocab_size", source, 256000),
            hidden_size=hidden,
            intermediate_size=positive_int(raw, "intermediate_size", source, 3 * 2560),
            num_hidden_layers=positive_int(raw, "num_hidden_layers", source, 26),
            num_attention_heads=heads,
            num_key_value_heads=positive_int(derived, "num_key_value_heads", source),
            lru_width=positive_int(derived, "lru_width", source),
            attention_window_size=positive_int(raw, "attention_window_size", source, 2048),
            conv1d_width=positive_int(raw, "conv1d_width", source, 4),
            logits_soft_cap=positive_float(raw, "logits_soft_cap", source, 30.0),
            rms_norm_eps=positive_float(raw, "rms_norm_eps", source, 1e-6),
            rope_theta=positive_float(raw, f"{at}rope_theta", source, 10000.0),
            partial_rotary_factor=positive_float(raw, f"{at}partial_rotary_factor", source, 0.5, at_most=1.0),
            block_types=tuple(kinds),
            attention_bias=flag(raw, "attention_bias", source, False),
            tie_word_embeddings=flag(raw, "tie_word_embeddings", source, True),
        )
        if hidden % heads or heads % c.num_key_value_heads or c.lru_width % heads:
            raise fail(f"{source}: hidden_size {hidden} and lru_width {c.lru_width} must divide into "
                       f"num_attention_heads {heads}, itself a multiple of num_key_value_heads "
                       f"{c.num_key_value_heads}")  # fmt: skip
        turned = int(c.head_dim * c.partial_rotary_factor)
        if turned % 2:
            raise fail(f"{source}: {at}partial_rotary_factor {c.partial_rotary_factor:g} rotates {turned} of a head's "
                       f"{c.head_dim} channels, an odd number (rotary channels go in pairs)",
                       f"set it so that {c.head_dim} * partial_rotary_factor is even")  # fmt: skip
        return c


# ------------------------------------------------------------------------------------- modules


class RMSNorm(nn.Module):
    """RMSNorm scaled by (1 + weight), computed in float32 at least."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        out = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.to(wide.dtype))).to(x.dtype)


class RGLRU(nn.Module):
    """The real-gated linear recurrent unit over block-diagonal heads."""

    def __init__(self, c: RecurrentGemmaConfig):
        super().__init__()
        H, bw = c.num_attention_heads, c.lru_width // c.num_attention_heads
        self.recurrent_param = nn.Parameter(torch.zeros(c.lru_width))
        self.input_gate_weight = nn.Parameter(torch.zeros(H, bw, bw))
        self.input_gate_bias = nn.Parameter(torch.zeros(H, bw))
        self.recurrent_gate_weight = nn.Parameter(torch.zeros(H, bw, bw))
        self.recurrent_gate_bias = nn.Parameter(torch.zeros(H, bw))

    def gate(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """sigmoid(x_h W_h + b_h) per head block of x [B, T, W]."""
        blocks = x.unflatten(-1, (weight.shape[0], -1))
        return torch.sigmoid(torch.einsum("bthi,hij->bthj", blocks, weight) + bias).flatten(-2)

    def forward(self, x: Tensor, h0: Tensor, position: int | Tensor, scan_fn: Any) -> tuple[Tensor, Tensor]:
        input_gate = self.gate(x, self.input_gate_weight, self.input_gate_bias)
        log_a = (
            -8.0 * self.gate(x, self.recurrent_gate_weight, self.recurrent_gate_bias) * F.softplus(self.recurrent_param)
        )
        a, multiplier = torch.exp(log_a), torch.sqrt(1 - torch.exp(2 * log_a))
        if not isinstance(position, int) or position == 0:
            # a sequence's first token (absolute position 0): no decay of the (empty) state, no input scaling
            first = (torch.arange(x.shape[1], device=x.device) + position == 0)[..., None]  # [B or 1, T, 1]
            a, multiplier = a.masked_fill(first, 0.0), multiplier.masked_fill(first, 1.0)
        b = (x * input_gate * multiplier.to(x.dtype)).to(h0.dtype)
        a = a.to(h0.dtype)
        hs, h = scan_fn(a, b, h0)  # [B, T, W] exist already: the O(T) scan over the whole call adds one more
        return hs.to(x.dtype), h


class RecurrentBlock(nn.Module):
    """y = gelu(linear_y(x)); x' = RG-LRU(conv(linear_x(x))); linear_out(x' * y)."""

    def __init__(self, c: RecurrentGemmaConfig):
        super().__init__()
        W = c.lru_width
        self.linear_y = nn.Linear(c.hidden_size, W)
        self.linear_x = nn.Linear(c.hidden_size, W)
        self.linear_out = nn.Linear(W, c.hidden_size)
        self.conv_1d = nn.Conv1d(W, W, kernel_size=c.conv1d_width, groups=W, padding=c.conv1d_width - 1)
        self.rg_lru = RGLRU(c)

    def forward(self, x: Tensor, st: RecurrentLayerState, position: int | Tensor, chunk: int, scan_fn: Any):
        y = F.gelu(self.linear_y(x), approximate="tanh")
        u, conv = causal_conv(self.linear_x(x), st.conv, self.conv_1d, silu=False)
        u, h = self.rg_lru(u, st.lru, position, scan_fn)
        return self.linear_out(u * y), RecurrentLayerState(conv, h)


def rotary(x: Tensor, positions: Tensor, c: RecurrentGemmaConfig) -> Tensor:
    """Rotary embedding of the first head_dim * partial_rotary_factor channels of x [B, H, T, d] at `positions`
    [B or 1, T] (angles in float32, as transformers computes them; float64 for float64 models)."""
    dim, wide = int(c.head_dim * c.partial_rotary_factor), acc_dtype(x.dtype)
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim))
    angles = positions.to(wide)[..., None] * inv_freq.to(wide)
    emb = torch.cat([angles, angles], -1)[:, None]  # [B or 1, 1, T, dim]: the same angles for every head
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot, rest = x[..., :dim], x[..., dim:]
    half = torch.cat([-rot[..., dim // 2 :], rot[..., : dim // 2]], -1)
    return torch.cat([rot * cos + half * sin, rest], -1)


class LocalAttention(nn.Module):
    """Multi-query attention over the last attention_window_size tokens (the query's own included)."""

    def __init__(self, c: RecurrentGemmaConfig):
        super().__init__()
        d, H, K = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        self.config = c
        self.q_proj = nn.Linear(c.hidden_size, H * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, K * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, K * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(H * d, c.hidden_size, bias=True)

    def forward(self, x: Tensor, st: AttentionLayerState, position: int | Tensor, chunk: int, scan_fn: Any):
        c = self.config
        B, T, _ = x.shape
        d, H, K, window = c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.attention_window_size
        positions = (torch.arange(T, device=x.device) + position).view(-1, T)  # [B or 1, T]
        q = rotary(self.q_proj(x).view(B, T, H, d).transpose(1, 2), positions, c)
        k = rotary(self.k_proj(x).view(B, T, K, d).transpose(1, 2), positions, c)
        v = self.v_proj(x).view(B, T, K, d).transpose(1, 2)
        keys, values = torch.cat([st.keys.to(k.dtype), k], 2), torch.cat([st.values.to(v.dtype), v], 2)
        held = window - 1  # slots of the state; key slot j holds absolute position position - held + j
        key_pos = (torch.arange(-held, T, device=x.device) + position).view(-1, held + T)  # [B or 1, held + T]
        outs = []
        for s in range(0, T, QUERY_CHUNK):
            e = min(T, s + QUERY_CHUNK)
            lo = s  # the first key any query of [s, e) can see: position s - held, slot s
            kk, vv = keys[:, :, lo : held + e], values[:, :, lo : held + e]
            qpos, kpos = positions[:, s:e, None], key_pos[:, None, lo : held + e]
            allowed = ((kpos <= qpos) & (kpos > qpos - window) & (kpos >= 0))[:, None]  # [B or 1, 1, q, k]
            kk, vv = kk.repeat_interleave(H // K, 1), vv.repeat_interleave(H // K, 1)
            scores = (q[:, :, s:e] @ kk.transpose(-1, -2)) * d**-0.5
            scores = scores.masked_fill(~allowed, -math.inf)
            weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
            outs.append(weights @ vv)
        out = torch.cat(outs, 2).transpose(1, 2).reshape(B, T, H * d)
        new = AttentionLayerState(keys[:, :, keys.shape[2] - held :], values[:, :, values.shape[2] - held :])
        return self.o_proj(out), new


class MLP(nn.Module):
    """down(gelu(gate(x)) * up(x)), the hidden width half of intermediate_size."""

    def __init__(self, c: RecurrentGemmaConfig):
        super().__init__()
        inner = c.intermediate_size // 2
        self.gate_proj = nn.Linear(c.hidden_size, inner)
        self.up_proj = nn.Linear(c.hidden_size, inner)
        self.down_proj = nn.Linear(inner, c.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class ResidualBlock(nn.Module):
    """x + temporal(norm(x)), then + mlp(norm(.))."""

    def __init__(self, c: RecurrentGemmaConfig, kind: str):
        super().__init__()
        self.temporal_pre_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.temporal_block = RecurrentBlock(c) if kind == "recurrent" else LocalAttention(c)
        self.channel_pre_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp_block = MLP(c)

    def forward(self, x: Tensor, st: Any, position: int | Tensor, chunk: int, scan_fn: Any) -> tuple[Tensor, Any]:
        out, st = self.temporal_block(self.temporal_pre_norm(x), st, position, chunk, scan_fn)
        x = x + out
        return x + self.mlp_block(self.channel_pre_norm(x)), st


class Backbone(nn.Module):
    """Embedding, residual blocks, final norm (transformers' `model`)."""

    def __init__(self, c: RecurrentGemmaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(ResidualBlock(c, kind) for kind in c.layer_kinds())
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class RecurrentGemmaModel(nn.Module):
    """A RecurrentGemma causal LM with transformers' parameter names; state in, state out."""

    TIED_KEYS = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: RecurrentGemmaConfig, chunk: int = 16):
        super().__init__()
        self.config, self.chunk = config, chunk
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # sqrt(hidden_size) rounded to bfloat16, as the checkpoints were trained with it
        self.normalizer = float(torch.tensor(config.hidden_size**0.5, dtype=torch.bfloat16, device="cpu"))

    def init_state(self, batch_size: int) -> RecurrentGemmaState:
        """A fresh state for `batch_size` sequences, on the model's device."""
        c, w = self.config, self.model.embed_tokens.weight
        held = c.attention_window_size - 1

        def layer(kind: str) -> RecurrentLayerState | AttentionLayerState:
            if kind == "recurrent":
                lru = w.new_zeros(batch_size, c.lru_width, dtype=acc_dtype(w.dtype))
                return RecurrentLayerState(w.new_zeros(batch_size, c.lru_width, c.conv1d_width - 1), lru)
            kv = w.new_zeros(batch_size, c.num_key_value_heads, held, c.head_dim)
            return AttentionLayerState(kv, kv.clone())

        return RecurrentGemmaState([layer(kind) for kind in c.layer_kinds()])

    def forward(self, tokens: Tensor, state: RecurrentGemmaState, scan_fn: Any = scan) -> tuple[Tensor, Any]:
        """Final hidden states [B, T, D] (after final_norm) of tokens [B, T] after `state`, and the state after
        (rows at different positions: each at its own)."""
        x = self.model.embed_tokens(tokens) * self.normalizer
        T, pos = tokens.shape[1], state.position
        if T == 0:  # rows at different positions take even an empty call here (see `_run_rows`)
            return self.model.final_norm(x), state
        # the position of the first token: one int, or each row's [B, 1] (copied to the device once per call)
        start = pos if isinstance(pos, int) else torch.tensor(pos, device=tokens.device)[:, None]
        layers = []
        for block, st in zip(self.model.layers, state.layers, strict=True):
            x, st = block(x, st, start, self.chunk, scan_fn)
            layers.append(st)
        after = pos + T if isinstance(pos, int) else [p + T for p in pos]
        return self.model.final_norm(x), RecurrentGemmaState(layers, after)

    def forward_reference(self, tokens: Tensor, state: RecurrentGemmaState) -> tuple[Tensor, Any]:
        """`forward` with the RG-LRU as a token loop (the tests' reference for the chunked scan)."""
        return self.forward(tokens, state, scan_reference)

    def logits(self, hidden: Tensor) -> Tensor:
        """Soft-capped logits [B, T, V]: float32 (float64 for float64 models)."""
        w, cap = self.lm_head.weight, self.config.logits_soft_cap
        logits = output_logits(hidden, w)
        return torch.tanh(logits / cap) * cap
