"""Mamba-2 in plain PyTorch: Mamba's model (mamba.py) with the SSD mixer, its state carried exactly.

Per layer the state is the conv's last `conv_kernel - 1` inputs over the x, B, C channels [B, E + 2GN, k-1] and the
SSM state h [B, H, P, N] (H heads of P channels, N state size, G groups sharing B and C), h in float32 at least.
Each head has a scalar decay a_t = exp(dt_t A_h), so a chunk of L tokens is one masked quadratic form (the SSD
"attention" C_t . B_s prod a over (s, t], its log-decays as differences of cumulative sums, -inf above the
diagonal) plus the carried state read through C_t and the decay since the chunk start; the state then moves to the
chunk end in one product. No loop over tokens; [B, L, L, H] per chunk. `ssd_reference` is the token loop.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import fail
from ..fields import flag, positive_float, positive_int
from .config import step_limit
from .layers import causal_conv
from .mamba import MambaLayerState, MambaModel


@dataclass(frozen=True)
class Mamba2Config:
    """The fields of a transformers Mamba-2 config.json that the forward pass reads."""

    vocab_size: int
    hidden_size: int
    state_size: int
    num_hidden_layers: int
    expand: int
    conv_kernel: int
    num_heads: int
    head_dim: int
    n_groups: int
    layer_norm_epsilon: float
    use_bias: bool
    use_conv_bias: bool
    residual_in_fp32: bool
    tie_word_embeddings: bool
    time_step_limit: tuple[float, float]

    @property
    def intermediate_size(self) -> int:
        """E = expand * hidden_size = num_heads * head_dim."""
        return int(self.expand * self.hidden_size)

    def to_dict(self) -> dict[str, Any]:
        """The fields, as reports record them (JSON has no infinity: an unbounded limit is null)."""
        return {**asdict(self), "time_step_limit": [v if math.isfinite(v) else None for v in self.time_step_limit]}

    @classmethod
    def from_hf(cls, raw: dict[str, Any], source: str = "config.json") -> Mamba2Config:
        """Read and check a transformers config.json (model_type mamba2); absent keys take transformers' defaults."""
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise fail(f"{source}: hidden_act {act!r} is not supported", "Mamba-2 checkpoints use silu")
        c = cls(
            vocab_size=positive_int(raw, "vocab_size", source, 32768),
            hidden_size=positive_int(raw, "hidden_size", source, 4096),
            state_size=positive_int(raw, "state_size", source, 128),
            num_hidden_layers=positive_int(raw, "num_hidden_layers", source, 64),
            expand=positive_int(raw, "expand", source, 2),
            conv_kernel=positive_int(raw, "conv_kernel", source, 4),
            num_heads=positive_int(raw, "num_heads", source, 128),
            head_dim=positive_int(raw, "head_dim", source, 64),
            n_groups=positive_int(raw, "n_groups", source, 8),
            layer_norm_epsilon=positive_float(raw, "layer_norm_epsilon", source, 1e-5),
            use_bias=flag(raw, "use_bias", source, False),
            use_conv_bias=flag(raw, "use_conv_bias", source, True),
            residual_in_fp32=flag(raw, "residual_in_fp32", source, True),
            tie_word_embeddings=flag(raw, "tie_word_embeddings", source, False),
            time_step_limit=step_limit(raw, "time_step_limit", source),
        )
        if c.num_heads * c.head_dim != c.intermediate_size:
            raise fail(f"{source}: num_heads * head_dim ({c.num_heads} * {c.head_dim}) must equal expand * "
                       f"hidden_size ({c.intermediate_size})")  # fmt: skip
        if c.num_heads % c.n_groups or c.intermediate_size % c.n_groups:
            raise fail(f"{source}: num_heads {c.num_heads} is not divisible by n_groups {c.n_groups}")
        return c


def ssd_chunk(x: Tensor, log_a: Tensor, b: Tensor, c: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk of h_t = exp(log_a_t) h_{t-1} + x_t b_t^T, y_t = h_t c_t, per head, in closed form.

    x [B, L, H, P] (already times dt), log_a [B, L, H] (<= 0), b and c [B, L, H, N], h0 [B, H, P, N]:
    (y [B, L, H, P], h after the chunk)."""
    cum = log_a.cumsum(1)  # [B, L, H]: log of the decay from the chunk start through t
    L = x.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    seg = (cum[:, :, None, :] - cum[:, None, :, :]).masked_fill(~causal[None, :, :, None], -math.inf)
    scores = torch.einsum("blhn,bshn->blsh", c, b) * seg.exp()  # [B, L(t), L(s), H]
    y = torch.einsum("blsh,bshp->blhp", scores, x)
    y = y + torch.einsum("blhn,bhpn->blhp", c, h0) * cum.exp()[..., None]
    to_end = (cum[:, -1:] - cum).exp()  # decay from each s to the chunk end
    h = h0 * cum[:, -1].exp()[:, :, None, None] + torch.einsum("bshn,bshp->bhpn", b * to_end[..., None], x)
    return y, h


def ssd_reference(x: Tensor, log_a: Tensor, b: Tensor, c: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """`ssd_chunk` as a token loop (the tests' reference)."""
    h, ys = h0, []
    for t in range(x.shape[1]):
        h = log_a[:, t].exp()[:, :, None, None] * h + x[:, t, :, :, None] * b[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, c[:, t]))
    return torch.stack(ys, 1), h


def gated_rms_norm(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float) -> Tensor:
    """RMS norm of y * silu(z) within each of `groups` groups of channels, computed in float32 at least."""
    wide = torch.promote_types(y.dtype, torch.float32)
    g = (y.to(wide) * F.silu(z.to(wide))).unflatten(-1, (groups, -1))
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return weight * g.flatten(-2).to(y.dtype)


class GatedRMSNorm(nn.Module):
    """Holds the gated norm's weight under transformers' name (mixer.norm.weight)."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class Mamba2Mixer(nn.Module):
    """in_proj -> (gate z, conv over x|B|C, dt) -> silu -> SSD per head -> + D x -> gated RMS norm -> out_proj."""

    def __init__(self, c: Mamba2Config):
        super().__init__()
        E, H, G, N = c.intermediate_size, c.num_heads, c.n_groups, c.state_size
        self.config = c
        self.conv_dim, self.ssm_shape = E + 2 * G * N, (H, c.head_dim, N)
        self.in_proj = nn.Linear(c.hidden_size, E + self.conv_dim + H, bias=c.use_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, c.conv_kernel, groups=self.conv_dim,
                                bias=c.use_conv_bias, padding=c.conv_kernel - 1)  # fmt: skip
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.A_log = nn.Parameter(torch.zeros(H))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = GatedRMSNorm(E)
        self.out_proj = nn.Linear(E, c.hidden_size, bias=c.use_bias)

    def forward(
        self, hidden: Tensor, st: MambaLayerState, chunk: int, ssd: Any = None, hooks: Any = None
    ) -> tuple[Tensor, Any]:
        c = self.config
        E, H, G, N, P = c.intermediate_size, c.num_heads, c.n_groups, c.state_size, c.head_dim
        Bsz, T, _ = hidden.shape
        z, xbc, dt = self.in_proj(hidden).split([E, self.conv_dim, H], dim=-1)
        conv_in, conv = (st.conv, None) if hooks is None else hooks.conv(xbc, st.conv)
        xbc, conv_local = causal_conv(xbc, conv_in, self.conv1d)
        conv = conv_local if conv is None else conv
        sd = st.ssm.dtype
        x, b, cc = xbc.to(sd).split([E, G * N, G * N], dim=-1)
        x = x.view(Bsz, T, H, P)
        b = b.view(Bsz, T, G, N).repeat_interleave(H // G, dim=2)
        cc = cc.view(Bsz, T, G, N).repeat_interleave(H // G, dim=2)
        dt = F.softplus(dt.to(sd) + self.dt_bias.to(sd)).clamp(*c.time_step_limit)
        log_a = dt * -torch.exp(self.A_log.to(sd))
        xdt = x * dt[..., None]
        step, size = (ssd_chunk, chunk) if ssd is None else (ssd, max(T, 1))  # the reference: one token loop

        def run(h: Tensor) -> tuple[Tensor, Tensor]:
            ys = []
            for s in range(0, T, size):
                y, h = step(xdt[:, s : s + size], log_a[:, s : s + size], b[:, s : s + size], cc[:, s : s + size], h)
                ys.append(y)
            return (torch.cat(ys, 1) if ys else x.new_zeros(x.shape)), h

        def carried(h_in: Tensor) -> Tensor:  # what a state entering the call adds: C_t . (decay since start * h_in)
            return torch.einsum("blhn,bhpn->blhp", cc, h_in) * log_a.cumsum(1).exp()[..., None]

        if hooks is None:
            y, h = run(st.ssm)
        else:  # one rank's slice of a call: the SSM state entering it comes from the ranks before
            y, h = hooks.ssm(run, log_a.sum(1)[:, :, None, None], carried, st.ssm)
        y = y + x * self.D.to(sd)[:, None]
        y = gated_rms_norm(y.reshape(Bsz, T, E), z, self.norm.weight, G, c.layer_norm_epsilon)
        return self.out_proj(y.to(hidden.dtype)), MambaLayerState(conv, h)


class Mamba2Model(MambaModel):
    """A Mamba-2 causal LM with transformers' parameter names (Mamba2ForCausalLM); state in, state out."""

    MIXER = Mamba2Mixer

    def forward_reference(self, tokens: Tensor, state: Any) -> tuple[Tensor, Any]:
        """`forward` with the SSD as a plain token loop (the tests' reference for the chunked form)."""
        return self.forward(tokens, state, scan_fn=ssd_reference)
