"""RWKV-4 in plain PyTorch, with its state carried exactly from call to call.

Per layer the state is the time-mix and channel-mix shifted tokens (the last input of each, [B, D]) and the WKV
state: numerator and denominator [B, C] scaled by exp(-max) with the max [B, C] kept beside them (the stable form),
in float32 at least. WKV over a chunk of L tokens without a loop over tokens: for each output position t every
term (the carried state decayed t steps, each earlier token j of the chunk with log-weight (t-1-j) w + k_j, the
token itself with u + k_t) is weighed after subtracting the largest log-weight of its (t, channel), an [B, L, L, C]
masked form per chunk; the state then moves to the chunk end the same way. `wkv_reference` is the token loop.
In inference mode transformers halves the hidden state every `rescale_every` layers and divides those layers'
output weights by the same powers of two (fp16 headroom); megaeval does the same, so numbers agree to rounding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import fail
from ...kernels.common import acc_dtype
from ..fields import filled, flag, positive_float, positive_int
from .layers import PositionFreeRows, output_logits

EMPTY_MAX = -1e38  # the max of a state holding nothing (transformers' convention; exp(-1e38 - x) is 0)


@dataclass(frozen=True)
class RwkvConfig:
    """The fields of a transformers RWKV config.json that the forward pass reads."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    attention_hidden_size: int
    intermediate_size: int
    layer_norm_epsilon: float
    rescale_every: int
    tie_word_embeddings: bool

    def to_dict(self) -> dict[str, Any]:
        """The fields, as reports record them."""
        return asdict(self)

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> RwkvConfig:
        """Read and check a transformers config.json (model_type rwkv); absent keys take transformers' defaults."""
        hidden = positive_int(raw, "hidden_size", source, 4096)
        sizes = filled(raw, {"attention_hidden_size": hidden, "intermediate_size": 4 * hidden})
        rescale = raw.get("rescale_every", 6)
        if not isinstance(rescale, int) or isinstance(rescale, bool):
            raise fail(f"{source}: rescale_every must be an integer, got {rescale!r}")
        return cls(
            vocab_size=positive_int(raw, "vocab_size", source, 50277),
            hidden_size=hidden,
            num_hidden_layers=positive_int(raw, "num_hidden_layers", source, 32),
            attention_hidden_size=positive_int(sizes, "attention_hidden_size", source),
            intermediate_size=positive_int(sizes, "intermediate_size", source),
            layer_norm_epsilon=positive_float(raw, "layer_norm_epsilon", source, 1e-5),
            rescale_every=rescale,
            tie_word_embeddings=flag(raw, "tie_word_embeddings", source, False),
        )


# ----------------------------------------------------------------------------------------- state


@dataclass
class RwkvLayerState:
    """One layer: shifted tokens [B, D] (model dtype) and the WKV numerator, denominator and max [B, C]."""

    att_shift: Tensor
    ffn_shift: Tensor
    num: Tensor
    den: Tensor
    max: Tensor

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.att_shift, self.ffn_shift, self.num, self.den, self.max)

    def clone(self) -> RwkvLayerState:
        return RwkvLayerState(*(t.clone() for t in self.tensors()))

    def repeat(self, n: int) -> RwkvLayerState:
        return RwkvLayerState(*(t.repeat_interleave(n, 0) for t in self.tensors()))


@dataclass
class RwkvState(PositionFreeRows):
    """Every layer's state, and the number of tokens consumed."""

    layers: list[RwkvLayerState]
    position: int = 0

    @property
    def batch_size(self) -> int:
        return self.layers[0].num.shape[0]

    def clone(self) -> RwkvState:
        """A deep copy sharing no tensor."""
        return RwkvState([s.clone() for s in self.layers], self.position)

    def repeat(self, n: int) -> RwkvState:
        """A state for B * n sequences, row i * n + j a copy of row i (this one is left as it was)."""
        return RwkvState([s.repeat(n) for s in self.layers], self.position)

    def nbytes(self) -> int:
        """Bytes of every tensor held (constant in tokens consumed)."""
        return sum(t.numel() * t.element_size() for s in self.layers for t in s.tensors())


# ------------------------------------------------------------------------------------------- WKV


def wkv_chunk(w: Tensor, u: Tensor, k: Tensor, v: Tensor, num: Tensor, den: Tensor, mx: Tensor):
    """WKV over one chunk: w (< 0, per-token log decay) and u [C], k and v [B, L, C], state num, den, mx [B, C]
    (the true sums are num * exp(mx), den * exp(mx)). Returns (wkv [B, L, C], num, den, mx after the chunk)."""
    B, L, C = k.shape
    t = torch.arange(L, device=k.device, dtype=k.dtype)
    earlier = (t[:, None] - 1 - t[None, :])[None, :, :, None] * w + k[:, None, :, :]  # [B, L(t), L(j), C]
    earlier = earlier.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=k.device).tril(-1)[None, :, :, None],
                                  -math.inf)  # fmt: skip
    carried = t[None, :, None] * w + mx[:, None, :]  # [B, L, C]: the state decayed t steps
    current = u + k  # [B, L, C]
    top = torch.maximum(torch.maximum(carried, current), earlier.amax(2))
    e_j, e_s, e_t = (earlier - top[:, :, None]).exp(), (carried - top).exp(), (current - top).exp()
    numer = e_s * num[:, None] + torch.einsum("btjc,bjc->btc", e_j, v) + e_t * v
    denom = e_s * den[:, None] + e_j.sum(2) + e_t
    out = numer / denom
    into = (L - 1 - t)[None, :, None] * w + k  # [B, L, C]: log-weight of token j in the state after the chunk
    kept = L * w + mx
    new_max = torch.maximum(kept, into.amax(1))
    e_k, e_i = (kept - new_max).exp(), (into - new_max[:, None]).exp()
    return out, e_k * num + (e_i * v).sum(1), e_k * den + e_i.sum(1), new_max


def wkv_reference(w: Tensor, u: Tensor, k: Tensor, v: Tensor, num: Tensor, den: Tensor, mx: Tensor):
    """`wkv_chunk` as the token loop of the stable form."""
    outs = []
    for t in range(k.shape[1]):
        kt, vt = k[:, t], v[:, t]
        top = torch.maximum(mx, u + kt)
        a, b = (mx - top).exp(), (u + kt - top).exp()
        outs.append((a * num + b * vt) / (a * den + b))
        top = torch.maximum(mx + w, kt)
        a, b = (mx + w - top).exp(), (kt - top).exp()
        num, den, mx = a * num + b * vt, a * den + b, top
    return torch.stack(outs, 1), num, den, mx


# ------------------------------------------------------------------------------------- modules


def shifted(x: Tensor, last: Tensor) -> Tensor:
    """x [B, T, D] moved one step later, `last` [B, D] (the previous call's last token) in front."""
    return torch.cat([last[:, None].to(x.dtype), x[:, :-1]], dim=1)


class RwkvSelfAttention(nn.Module):
    """Time mixing: token-shift mixes, key/value/receptance, WKV, gated output."""

    def __init__(self, c: RwkvConfig):
        super().__init__()
        D, C = c.hidden_size, c.attention_hidden_size
        self.time_decay = nn.Parameter(torch.zeros(C))
        self.time_first = nn.Parameter(torch.zeros(C))
        self.time_mix_key = nn.Parameter(torch.zeros(1, 1, D))
        self.time_mix_value = nn.Parameter(torch.zeros(1, 1, D))
        self.time_mix_receptance = nn.Parameter(torch.zeros(1, 1, D))
        self.key = nn.Linear(D, C, bias=False)
        self.value = nn.Linear(D, C, bias=False)
        self.receptance = nn.Linear(D, C, bias=False)
        self.output = nn.Linear(C, D, bias=False)

    def forward(self, x: Tensor, st: RwkvLayerState, chunk: int, wkv: Any) -> tuple[Tensor, tuple[Tensor, ...]]:
        prev = shifted(x, st.att_shift)

        def mix(m: Tensor) -> Tensor:
            return x * m + prev * (1 - m)

        k, v = self.key(mix(self.time_mix_key)), self.value(mix(self.time_mix_value))
        r = torch.sigmoid(self.receptance(mix(self.time_mix_receptance)))
        sd = st.num.dtype
        w, u = -torch.exp(self.time_decay.to(sd)), self.time_first.to(sd)
        k, v = k.to(sd), v.to(sd)
        num, den, mx, outs = st.num, st.den, st.max, []
        size = chunk if wkv is None else max(x.shape[1], 1)
        for s in range(0, x.shape[1], size):
            out, num, den, mx = (wkv or wkv_chunk)(w, u, k[:, s : s + size], v[:, s : s + size], num, den, mx)
            outs.append(out)
        out = torch.cat(outs, 1).to(x.dtype) if outs else x.new_zeros(*x.shape[:2], k.shape[-1])
        return self.output(r * out), (x[:, -1], num, den, mx)


class RwkvFeedForward(nn.Module):
    """Channel mixing: token-shift mixes, squared-relu key, value, sigmoid receptance gate."""

    def __init__(self, c: RwkvConfig):
        super().__init__()
        D = c.hidden_size
        self.time_mix_key = nn.Parameter(torch.zeros(1, 1, D))
        self.time_mix_receptance = nn.Parameter(torch.zeros(1, 1, D))
        self.key = nn.Linear(D, c.intermediate_size, bias=False)
        self.receptance = nn.Linear(D, D, bias=False)
        self.value = nn.Linear(c.intermediate_size, D, bias=False)

    def forward(self, x: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
        prev = shifted(x, last)
        k = x * self.time_mix_key + prev * (1 - self.time_mix_key)
        r = x * self.time_mix_receptance + prev * (1 - self.time_mix_receptance)
        out = torch.sigmoid(self.receptance(r)) * self.value(torch.square(torch.relu(self.key(k))))
        return out, x[:, -1]


class RwkvBlock(nn.Module):
    """pre_ln (block 0 only), then residual time mixing and channel mixing, each after its LayerNorm."""

    def __init__(self, c: RwkvConfig, index: int):
        super().__init__()
        if index == 0:
            self.pre_ln = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)
        self.ln1 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)
        self.ln2 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_epsilon)
        self.attention = RwkvSelfAttention(c)
        self.feed_forward = RwkvFeedForward(c)
        self.index = index
        # inference-mode rescaling (see the module docstring): this block's outputs are divided by 2**scale
        self.scale = index // c.rescale_every if c.rescale_every > 0 else 0

    def forward(self, x: Tensor, st: RwkvLayerState, chunk: int, wkv: Any) -> tuple[Tensor, RwkvLayerState]:
        if self.index == 0:
            x = self.pre_ln(x)
        att, (att_shift, num, den, mx) = self.attention(self.ln1(x), st, chunk, wkv)
        x = x + att * 2.0**-self.scale
        ffn, ffn_shift = self.feed_forward(self.ln2(x), st.ffn_shift)
        x = x + ffn * 2.0**-self.scale
        return x, RwkvLayerState(att_shift, ffn_shift, num, den, mx)


class RwkvBackbone(nn.Module):
    """Embeddings, blocks, ln_out (transformers' `rwkv`)."""

    def __init__(self, c: RwkvConfig):
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = nn.ModuleList(RwkvBlock(c, i) for i in range(c.num_hidden_layers))
        self.ln_out = nn.LayerNorm(c.hidden_size)  # transformers' default eps, not layer_norm_epsilon


class RwkvModel(nn.Module):
    """An RWKV-4 causal LM with transformers' parameter names (RwkvForCausalLM); state in, state out."""

    TIED_KEYS = {"head.weight": "rwkv.embeddings.weight"}

    def __init__(self, config: RwkvConfig, chunk: int = 16):
        super().__init__()
        self.config, self.chunk = config, chunk
        self.rwkv = RwkvBackbone(config)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.head.weight = self.rwkv.embeddings.weight

    def init_state(self, batch_size: int) -> RwkvState:
        """A fresh state for `batch_size` sequences, on the model's device."""
        c, w = self.config, self.rwkv.embeddings.weight
        sd = acc_dtype(w.dtype)

        def layer() -> RwkvLayerState:
            zeros = w.new_zeros(batch_size, c.attention_hidden_size, dtype=sd)
            return RwkvLayerState(w.new_zeros(batch_size, c.hidden_size), w.new_zeros(batch_size, c.hidden_size),
                                  zeros, zeros.clone(), torch.full_like(zeros, EMPTY_MAX))  # fmt: skip

        return RwkvState([layer() for _ in range(c.num_hidden_layers)])

    def forward(self, tokens: Tensor, state: RwkvState, wkv: Any = None) -> tuple[Tensor, RwkvState]:
        """Final hidden states [B, T, D] (after ln_out) of tokens [B, T] after `state`, and the state after them."""
        c = self.config
        x = self.rwkv.embeddings(tokens)
        layers = []
        for i, (block, st) in enumerate(zip(self.rwkv.blocks, state.layers, strict=True)):
            x, st = block(x, st, self.chunk, wkv)
            layers.append(st)
            if c.rescale_every > 0 and (i + 1) % c.rescale_every == 0:
                x = x / 2
        return self.rwkv.ln_out(x), RwkvState(layers, state.position + tokens.shape[1])

    def forward_reference(self, tokens: Tensor, state: RwkvState) -> tuple[Tensor, RwkvState]:
        """`forward` with the WKV as the token loop (the tests' reference for the chunked form)."""
        return self.forward(tokens, state, wkv_reference)

    def logits(self, hidden: Tensor) -> Tensor:
        """Logits [B, T, V]: float32 (float64 for float64 models)."""
        return output_logits(hidden, self.head.weight)
