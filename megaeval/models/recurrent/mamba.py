"""Mamba-1 (and FalconMamba) in plain PyTorch, with its state carried exactly from call to call.

Per layer the state is the convolution's last `conv_kernel - 1` inputs [B, E, k-1] and the SSM state h [B, E, N]
(E = expand * hidden, N = state_size), h in float32 at least (float64 for float64 models). The selective scan
h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t runs chunk by chunk (`scan.scan` inside a chunk: no loop over tokens), so
its [B, chunk, E, N] tensors exist for one chunk at a time; y_t = C_t . h_t + D x_t, gated by silu(z_t).
Parameter names are transformers' (MambaForCausalLM), so its checkpoints load as they are. FalconMamba adds
weightless RMS norms on dt, B and C inside the mixer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import fail
from ...kernels.common import acc_dtype
from ..fields import flag, positive_float, positive_int
from .layers import PositionFreeRows, causal_conv, output_logits
from .scan import scan, scan_reference

Scan = Callable[..., tuple[Tensor, Tensor]]  # (a, b, h0, overwrite=...) -> (every h_t, the last)


@dataclass(frozen=True)
class MambaConfig:
    """The fields of a transformers Mamba / FalconMamba config.json that the forward pass reads."""

    vocab_size: int
    hidden_size: int
    state_size: int
    num_hidden_layers: int
    expand: int
    conv_kernel: int
    time_step_rank: int
    layer_norm_epsilon: float
    use_bias: bool
    use_conv_bias: bool
    residual_in_fp32: bool
    tie_word_embeddings: bool
    bc_dt_norm: bool  # FalconMamba: weightless RMS norms on dt, B and C
    mixer_rms_eps: float

    @property
    def intermediate_size(self) -> int:
        """E = expand * hidden_size."""
        return int(self.expand * self.hidden_size)

    def to_dict(self) -> dict[str, Any]:
        """The fields, as reports record them."""
        return asdict(self)

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> MambaConfig:
        """Read and check a transformers config.json (model_type mamba or falcon_mamba); absent keys take
        transformers' defaults."""
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise fail(f"{source}: hidden_act {act!r} is not supported", "Mamba checkpoints use silu")
        hidden = positive_int(raw, "hidden_size", source, 768)
        rank = raw.get("time_step_rank", "auto")
        rank = math.ceil(hidden / 16) if rank == "auto" else rank
        return cls(
            vocab_size=positive_int(raw, "vocab_size", source, 50280),
            hidden_size=hidden,
            state_size=positive_int(raw, "state_size", source, 16),
            num_hidden_layers=positive_int(raw, "num_hidden_layers", source, 32),
            expand=positive_int(raw, "expand", source, 2),
            conv_kernel=positive_int(raw, "conv_kernel", source, 4),
            time_step_rank=positive_int({"time_step_rank": rank}, "time_step_rank", source),
            layer_norm_epsilon=positive_float(raw, "layer_norm_epsilon", source, 1e-5),
            use_bias=flag(raw, "use_bias", source, False),
            use_conv_bias=flag(raw, "use_conv_bias", source, True),
            residual_in_fp32=flag(raw, "residual_in_fp32", source, True),
            tie_word_embeddings=flag(raw, "tie_word_embeddings", source, True),
            bc_dt_norm=raw.get("model_type") == "falcon_mamba",
            mixer_rms_eps=positive_float(raw, "mixer_rms_eps", source, 1e-6),
        )


# ----------------------------------------------------------------------------------------- state


@dataclass
class MambaLayerState:
    """One layer: the conv's last k-1 inputs [B, E, k-1] (model dtype) and the SSM state [B, E, N] (float32+)."""

    conv: Tensor
    ssm: Tensor

    def clone(self) -> MambaLayerState:
        return MambaLayerState(self.conv.clone(), self.ssm.clone())

    def repeat(self, n: int) -> MambaLayerState:
        return MambaLayerState(self.conv.repeat_interleave(n, 0), self.ssm.repeat_interleave(n, 0))


@dataclass
class MambaState(PositionFreeRows):
    """Every layer's conv and SSM state, and the number of tokens consumed."""

    layers: list[MambaLayerState]
    position: int = 0

    @property
    def batch_size(self) -> int:
        return self.layers[0].ssm.shape[0]

    def clone(self) -> MambaState:
        """A deep copy sharing no tensor."""
        return MambaState([s.clone() for s in self.layers], self.position)

    def repeat(self, n: int) -> MambaState:
        """A state for B * n sequences, row i * n + j a copy of row i (this one is left as it was)."""
        return MambaState([s.repeat(n) for s in self.layers], self.position)

    def nbytes(self) -> int:
        """Bytes of the conv and SSM tensors (constant in tokens consumed)."""
        return sum(t.numel() * t.element_size() for s in self.layers for t in (s.conv, s.ssm))


# ------------------------------------------------------------------------------------- modules


def rms_norm(x: Tensor, eps: float, weight: Tensor | None = None) -> Tensor:
    """x / rms(x) over the last dim, computed in float32 at least, returned in x's dtype (times `weight`)."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    out = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return out if weight is None else weight * out


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (transformers' MambaRMSNorm)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.eps, self.weight)


class MambaMixer(nn.Module):
    """The selective SSM block: in_proj -> causal depthwise conv -> silu -> selective scan -> gate -> out_proj."""

    def __init__(self, c: MambaConfig):
        super().__init__()
        E, N = c.intermediate_size, c.state_size
        self.config = c
        self.conv_dim, self.ssm_shape = E, (E, N)
        self.in_proj = nn.Linear(c.hidden_size, 2 * E, bias=c.use_bias)
        self.conv1d = nn.Conv1d(E, E, c.conv_kernel, groups=E, bias=c.use_conv_bias, padding=c.conv_kernel - 1)
        self.x_proj = nn.Linear(E, c.time_step_rank + 2 * N, bias=False)
        self.dt_proj = nn.Linear(c.time_step_rank, E, bias=True)
        self.A_log = nn.Parameter(torch.zeros(E, N))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, c.hidden_size, bias=c.use_bias)

    def selective(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(dt [B, T, E] after softplus, B [B, T, N], C [B, T, N]) of the conv output u."""
        c = self.config
        dt, b, cc = self.x_proj(u).split([c.time_step_rank, c.state_size, c.state_size], dim=-1)
        if c.bc_dt_norm:
            dt, b, cc = (rms_norm(t, c.mixer_rms_eps) for t in (dt, b, cc))
        dt = dt @ self.dt_proj.weight.t()
        sd = acc_dtype(u.dtype)
        return F.softplus(dt.to(sd) + self.dt_proj.bias.to(sd)), b.to(sd), cc.to(sd)

    def ssm(self, u: Tensor, h0: Tensor, chunk: int, scan_fn: Scan = scan, parts: Any = None) -> tuple[Tensor, Tensor]:
        """y_t = C_t . h_t over u [B, T, E] from h0 [B, E, N], chunk by chunk (the D term not included): (y [B, T, E]
        in the state dtype, h after the last token). `parts`: `selective(u)`, when already computed."""
        dt, b, cc = parts or self.selective(u)
        sd = h0.dtype
        A = -torch.exp(self.A_log.to(sd))
        ys = []
        h = h0
        for s in range(0, u.shape[1], chunk):
            e = min(u.shape[1], s + chunk)
            a_t = torch.exp(dt[:, s:e, :, None] * A)  # [B, L, E, N]
            b_t = (dt[:, s:e] * u[:, s:e].to(sd))[..., None] * b[:, s:e, None, :]
            hs, h = scan_fn(a_t, b_t, h, overwrite=True)  # a_t, b_t: this chunk's scratch
            ys.append(torch.einsum("blen,bln->ble", hs, cc[:, s:e]))
        return (torch.cat(ys, dim=1) if ys else u.new_zeros(u.shape, dtype=sd)), h

    def carried(self, parts: Any, h_in: Tensor, chunk: int) -> Tensor:
        """What a state h_in [B, E, N] entering the call adds to y: C_t . (prod_{s<=t} a_s * h_in), chunk by chunk."""
        dt, _, cc = parts
        A = -torch.exp(self.A_log.to(h_in.dtype))
        out, run = [], torch.zeros_like(h_in)
        for s in range(0, dt.shape[1], chunk):
            cum = run[:, None] + torch.cumsum(dt[:, s : s + chunk, :, None] * A, 1)  # log decay since the call start
            out.append(torch.einsum("blen,bln->ble", torch.exp(cum) * h_in[:, None], cc[:, s : s + chunk]))
            run = cum[:, -1]
        return torch.cat(out, 1) if out else dt.new_zeros(dt.shape)

    def forward(
        self, x: Tensor, st: MambaLayerState, chunk: int, scan_fn: Scan | None = None, hooks: Any = None
    ) -> tuple[Tensor, Any]:
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        if hooks is None:
            u, conv = causal_conv(xs, st.conv, self.conv1d)
            y, h = self.ssm(u, st.ssm, chunk, scan_fn or scan)
        else:  # one rank's slice of a call: the conv and SSM states entering it come from the ranks before
            conv_in, conv = hooks.conv(xs, st.conv)
            u, _ = causal_conv(xs, conv_in, self.conv1d)
            parts = self.selective(u)
            A = -torch.exp(self.A_log.to(st.ssm.dtype))
            y, h = hooks.ssm(
                lambda h0: self.ssm(u, h0, chunk, scan, parts), (parts[0][..., None] * A).sum(1),
                lambda h_in: self.carried(parts, h_in, chunk), st.ssm,
            )  # fmt: skip
        sd = y.dtype
        y = y + u.to(sd) * self.D.to(sd)
        y = (y * F.silu(z.to(sd))).to(x.dtype)
        return self.out_proj(y), MambaLayerState(conv, h)


class MambaBlock(nn.Module):
    """Pre-norm residual block around the mixer (the residual in float32 at least when residual_in_fp32)."""

    def __init__(self, c: Any, mixer: type[nn.Module]):
        super().__init__()
        self.norm = RMSNorm(c.hidden_size, c.layer_norm_epsilon)
        self.mixer = mixer(c)
        self.residual_in_fp32 = c.residual_in_fp32

    def forward(self, x: Tensor, st: MambaLayerState, chunk: int, scan_fn: Any, hooks: Any) -> tuple[Tensor, Any]:
        residual = x.to(torch.promote_types(x.dtype, torch.float32)) if self.residual_in_fp32 else x
        out, st = self.mixer(self.norm(x.to(self.norm.weight.dtype)), st, chunk, scan_fn, hooks)
        return residual + out, st


class Backbone(nn.Module):
    """Embedding, blocks and final norm (transformers' `backbone`)."""

    def __init__(self, c: Any, mixer: type[nn.Module]):
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(MambaBlock(c, mixer) for _ in range(c.num_hidden_layers))
        self.norm_f = RMSNorm(c.hidden_size, c.layer_norm_epsilon)


class MambaModel(nn.Module):
    """A Mamba / FalconMamba causal LM with transformers' parameter names; state in, state out. Mamba-2 is the
    same model with another mixer (mamba2.py)."""

    TIED_KEYS = {"lm_head.weight": "backbone.embeddings.weight"}
    MIXER: type[nn.Module] = MambaMixer

    def __init__(self, config: Any, chunk: int = 64):
        super().__init__()
        self.config, self.chunk = config, chunk
        self.backbone = Backbone(config, self.MIXER)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    def init_state(self, batch_size: int) -> MambaState:
        """A fresh state (zeros) for `batch_size` sequences, on the model's device."""
        c, w = self.config, self.backbone.embeddings.weight
        return MambaState([
            MambaLayerState(w.new_zeros(batch_size, block.mixer.conv_dim, c.conv_kernel - 1),
                            w.new_zeros(batch_size, *block.mixer.ssm_shape, dtype=acc_dtype(w.dtype)))
            for block in self.backbone.layers
        ])  # fmt: skip

    def forward(
        self, tokens: Tensor, state: MambaState, hooks: Any = None, scan_fn: Any = None
    ) -> tuple[Tensor, MambaState]:
        """Final hidden states [B, T, D] (after norm_f) of tokens [B, T] after `state`, and the state after them.

        `hooks`: one rank's slice of a longer call shared by a group (parallel.GroupSlice; None: all of it here);
        `scan_fn`: the mixer's scan in place of its chunked one (the tests' references)."""
        x = self.backbone.embeddings(tokens)
        layers = []
        for block, st in zip(self.backbone.layers, state.layers, strict=True):
            x, st = block(x, st, self.chunk, scan_fn, hooks)
            layers.append(st)
        length = tokens.shape[1] if hooks is None else hooks.length
        return self.backbone.norm_f(x), MambaState(layers, state.position + length)

    def forward_reference(self, tokens: Tensor, state: MambaState) -> tuple[Tensor, MambaState]:
        """`forward` with the scan as a plain token loop (the tests' reference for the chunked scan)."""
        return self.forward(tokens, state, scan_fn=scan_reference)

    def logits(self, hidden: Tensor) -> Tensor:
        """Logits [B, T, V] of final hidden states: float32 (float64 for float64 models)."""
        return output_logits(hidden, self.lm_head.weight)
