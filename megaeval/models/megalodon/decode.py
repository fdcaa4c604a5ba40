"""MEGALODON greedy decoding, one token per row per step, in buffers that never change: on CUDA one graph replay.

`Megalodon.forward` runs a decoding step eagerly, and its shapes change every token (the chunk's K/V cache grows,
the norm counts are Python ints), so a step pays Python and launch overhead over some 60 kernels a layer.
`StaticDecoder` holds a fixed number of rows (slots) in static buffers: per layer the TimestepNorm statistics
(counts, mean and variance in float64), the CEMA state and a whole chunk of keys and values, each row's fill a
tensor; the final norm's statistics; the input tokens and the output logits. A step reads and writes only those,
with no host synchronisation, so on CUDA it is captured once in a CUDA graph and each step is one replay.

A step computes what `Megalodon._forward_rows` computes (one token per row, each row at its own position). It runs
the model's own projections (weights of its linear layers) and output layer; the work between them is
`megaeval.kernels.decode_step`'s: TimestepNorm and CEMA for one timestep (`kernels.timestep_norm.cumulative_moments`
and `kernels.cema.cema` at T = 1), the q/k path with the cache writes, and attention over a chunk-sized cache whose
slots past the row's fill are masked (`kernels.attention.rows_attention`). At batch 1 a 7B step is bound by reading
the weights and every small kernel adds to it, so the step is written in few kernels. Unfused (`fused=False`), the
step runs decode_step's PyTorch references: statistics updated in place, rotary phases and masks computed once a
step for every layer, in bfloat16 the elementwise work between two projections in float32 (rounded to the model
dtype where a projection reads it), some 50 kernels a layer. Fused (the default where the Triton kernels run: on
CUDA, or in Triton's CPU interpreter), the same work runs in decode_step's Triton kernels, 15 kernels a layer
(8 of them the projections), with the chunk's keys cached in the model dtype (unfused: the accumulation dtype).
float32 and float64 steps equal the eager ones to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import fail
from ...kernels import decode_step
from ...kernels.attention import rope_table
from ...kernels.common import acc_dtype
from ...kernels.decode_step import Cema, Norm, Slots
from ..base import one_or_per_row
from .model import MegaBlock, Megalodon, TimestepNorm, complex_dtype
from .state import LayerState, MegalodonState, NormState

WARMUP_STEPS = 3  # eager steps on a side stream before capture (cuBLAS workspaces, lazy initialisation)


@dataclass
class _Layer:
    """One layer's state buffers and the constants its step uses."""

    norm: Norm  # TimestepNorm statistics (float64, updated in place) and affine terms (float64)
    cema: Cema  # CEMA state [B, D, N] (complex) and coefficients, the RMSNorm weight, in the accumulation dtype
    k: Tensor  # [B, H, chunk, dz] rotated keys: unfused in the accumulation dtype, fused in the model dtype
    v: Tensor  # [B, H, chunk, dv] values
    qk_scale: Tensor  # [2, Z]: (gamma + 1) / sqrt(dz) as the model computes it, in the accumulation dtype
    qk_offset: Tensor  # [2, Z]: beta, in the accumulation dtype


class StaticDecoder:
    """A MEGALODON's greedy decoding steps for `batch_size` rows (slots), each row's state in static buffers.

    `load(state, rows)` puts the rows of a state into slots, `step(tokens)` feeds one token to every slot and
    returns its logits, `state(rows)` gives slots back as a MegalodonState. With `graph` (CUDA only) the step is
    captured once in a CUDA graph; otherwise it runs eagerly. `fused`: the step's work between the projections in
    `kernels.decode_step`'s Triton kernels (True), or in its PyTorch references (False); default (None): fused where
    those kernels run (`decode_step.runs_on`). The model's weights must not change afterwards."""

    def __init__(self, model: Megalodon, batch_size: int, graph: bool = False, fused: bool | None = None):
        a = model.args
        ref = model.embed.weight
        self.model, self.batch_size, self.chunk = model, batch_size, a.chunk_size
        self.dtype, self.acc, self.device = ref.dtype, acc_dtype(ref.dtype), ref.device
        runs = decode_step.runs_on(ref.device, ref.dtype)
        if fused and not runs:
            raise fail(f"the fused decoding step's Triton kernels do not run a {ref.dtype} model on {ref.device}",
                       "use fused=False (or leave it to the default)")  # fmt: skip
        self.fused = runs if fused is None else fused
        self.ops = decode_step.TRITON if self.fused else decode_step.TORCH
        self.k_dtype = self.dtype if self.fused else self.acc  # unfused: scores of float32 keys, as before
        self.heads, self.vocab_size = a.num_heads, a.vocab_size
        B, C, dev = batch_size, a.chunk_size, ref.device
        with torch.inference_mode():
            self.tokens = torch.zeros(B, dtype=torch.long, device=dev)
            self.logits = torch.zeros(B, a.out_size, dtype=torch.promote_types(self.dtype, torch.float32), device=dev)
            self.fill = torch.zeros(B, dtype=torch.long, device=dev)  # keys each row's chunk holds
            self.counts = torch.zeros(a.num_layers + 1, B, 1, dtype=torch.float64, device=dev)  # layers, final norm
            self.layers = [self._layer_buffers(block) for block in model.layers]
            self.final = self._norm_buffers(model.output.final_norm)
            self.slot_ids = torch.arange(C, device=dev)
            # e^(i * position * frequency) for every position in a chunk: `apply_rope`'s angles, as pairs rotate
            cos, sin = rope_table(C, a.z_head_dim, model.layers[0].mega.rope_base, dev, self.acc)
            self.rope = torch.complex(cos, sin)
        self.positions = [0] * B  # on the host: a step never reads them back
        self.fills = [0] * B
        self._graph: torch.cuda.CUDAGraph | None = None
        self.load(model.init_state(B))
        if graph:
            self._capture()

    def _norm_buffers(self, norm: TimestepNorm) -> Norm:
        B, dev = self.batch_size, self.device
        G = norm.num_groups
        zeros = torch.zeros(B, G, dtype=torch.float64, device=dev)
        return Norm(zeros, zeros.clone(), norm.weight.double() + 1.0, norm.bias.double(), norm.eps)

    def _layer_buffers(self, block: MegaBlock) -> _Layer:
        mega, a = block.mega, self.model.args
        B, H, C, dev = self.batch_size, a.num_heads, a.chunk_size, self.device
        p, log_q, gamma = mega.cema.coefficients()
        cplx = complex_dtype(self.dtype)
        cema = Cema(
            h=torch.zeros(B, a.model_dim, a.cema_ndim, dtype=cplx, device=dev),
            p=p.to(self.acc).contiguous(),
            q=torch.exp(log_q).to(cplx).contiguous(),
            gamma=gamma.to(cplx).contiguous(),
            omega=mega.cema.omega.reshape(-1).to(self.acc).contiguous(),
            rms_weight=None if mega.rmsnorm.weight is None else mega.rmsnorm.weight.to(self.acc) + 1.0,
            rms_eps=mega.rmsnorm.eps,
        )
        return _Layer(
            norm=self._norm_buffers(mega.timenorm), cema=cema,
            k=torch.zeros(B, H, C, a.z_head_dim, dtype=self.k_dtype, device=dev),
            v=torch.zeros(B, H, C, a.v_head_dim, dtype=self.dtype, device=dev),
            qk_scale=((mega.gamma + 1.0) / math.sqrt(mega.gamma.shape[1] // H)).to(self.acc).contiguous(),
            qk_offset=mega.beta.to(self.acc).contiguous(),
        )  # fmt: skip

    @staticmethod
    def nbytes(model: Megalodon, batch_size: int) -> int:
        """Bytes of the state buffers a decoder of `batch_size` rows holds for `model` (about; keys counted in the
        accumulation dtype, the unfused step's, at most the fused one's)."""
        a, dtype = model.args, model.embed.weight.dtype
        dtypes = (dtype, acc_dtype(dtype), complex_dtype(dtype))
        size, acc, cplx = (torch.empty(0, dtype=t).element_size() for t in dtypes)
        per_layer = a.model_dim * a.cema_ndim * cplx + a.chunk_size * (a.z_dim * acc + a.value_dim * size)
        return batch_size * (a.num_layers * per_layer + (a.num_layers + 1) * 16 * a.norm_num_groups + 4 * a.out_size)

    # ------------------------------------------------------------------------------- state in and out

    @torch.inference_mode()
    def load(self, state: MegalodonState, rows: Sequence[int] | None = None) -> None:
        """Put the rows of `state` (plain or stacked) into slots `rows` (default: all, in order); other slots keep
        theirs. `state` is left as it was."""
        rows = list(range(self.batch_size)) if rows is None else list(rows)
        if state.history is not None:
            raise ValueError("a state of the official-window norm mode decodes eagerly, not in a StaticDecoder")
        if len(state.positions()) != len(rows) or len(state.layers) != len(self.layers):
            raise ValueError(f"a state of {len(state.positions())} rows and {len(state.layers)} layers does not fit "
                             f"slots {rows} of a {len(self.layers)}-layer decoder")  # fmt: skip
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        for i, (buf, s) in enumerate(zip(self.layers, state.layers, strict=True)):
            self._load_norm(i, buf.norm, s.norm, index)
            buf.cema.h[index] = s.cema.to(buf.cema.h.dtype)
            width = s.k.shape[1]
            for cache, part in ((buf.k, s.k), (buf.v, s.v)):
                cache[index] = 0  # slots past a row's fill are masked; zeros keep them finite
                if width:
                    cache[index, :, :width] = part.transpose(1, 2).to(cache.dtype)
        self._load_norm(len(self.layers), self.final, state.final_norm, index)
        fills = state.row_fills()
        self.fill[index] = torch.tensor(fills, dtype=torch.long, device=self.device)
        for r, position, fill in zip(rows, state.positions(), fills, strict=True):
            self.positions[r], self.fills[r] = position, fill

    def _load_norm(self, i: int, buf: Norm, norm: NormState, index: Tensor) -> None:
        self.counts[i, index, 0] = torch.tensor(norm.counts(), dtype=torch.float64, device=self.device)
        buf.mean[index] = norm.mean.to(torch.float64)
        buf.var[index] = norm.var.to(torch.float64)

    @torch.inference_mode()
    def state(self, rows: Sequence[int] | None = None) -> MegalodonState:
        """The state of slots `rows` (default: all) as a MegalodonState, sharing no tensor with the buffers: rows
        at different positions come out stacked, as `MegalodonState.stack` makes them."""
        rows = list(range(self.batch_size)) if rows is None else list(rows)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        positions, fills = [self.positions[r] for r in rows], [self.fills[r] for r in rows]
        width = max(fills, default=0)
        counts = self.counts[:, index, 0].tolist()

        def norm(i: int, buf: Norm) -> NormState:
            return NormState(one_or_per_row([int(c) for c in counts[i]]), buf.mean[index], buf.var[index])

        layers = []
        for i, buf in enumerate(self.layers):
            k, v = (cache[index, :, :width].transpose(1, 2).to(self.dtype) for cache in (buf.k, buf.v))
            layers.append(LayerState(norm(i, buf.norm), buf.cema.h[index], k, v))
        alike = len(set(positions)) == 1
        final = norm(len(self.layers), self.final)
        return MegalodonState(layers, final, one_or_per_row(positions), None, None if alike else fills)

    # ------------------------------------------------------------------------------- the step

    @torch.inference_mode()
    def step(self, tokens: Sequence[int] | Tensor) -> Tensor:
        """Logits [B, out_size] (float32; float64 for float64 models) after one more token in every slot (tokens
        [B]); every slot's state moves on by that token."""
        if not isinstance(tokens, Tensor):
            tokens = list(tokens)
            if any(t < 0 or t >= self.vocab_size for t in tokens):
                raise fail(f"token ids must lie in [0, {self.vocab_size}), got {tokens}",
                           "encode with this model's tokenizer")  # fmt: skip
            tokens = torch.tensor(tokens, dtype=torch.long)
        if tokens.numel() != self.batch_size:
            raise ValueError(f"a step takes one token per slot ({self.batch_size}), got {tokens.numel()}")
        self.tokens.copy_(tokens.reshape(-1))
        if self._graph is not None:
            self._graph.replay()
        else:
            self._compute()
        self.positions = [p + 1 for p in self.positions]
        self.fills = [(f + 1) % self.chunk for f in self.fills]
        return self.logits.clone()

    def _capture(self) -> None:
        """Capture `_compute` in a CUDA graph, after warm-up steps on a side stream (the state is then reset)."""
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                self._compute()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            self._compute()
        self._graph = graph
        self.load(self.model.init_state(self.batch_size))

    def _compute(self) -> None:
        """One token for every slot, from the static buffers into them: what the CUDA graph holds."""
        self.counts.add_(1)  # counts[i] now includes this token: n
        inv_n = self.counts.reciprocal()
        carried = (self.counts - 1) * inv_n  # c / n: weight of the statistics carried in
        slots = Slots(self.fill, self.rope, self.heads, self.slot_ids)
        x = self.model.embed(self.tokens)
        if self.model.emb_scale is not None:
            x = x * self.model.emb_scale
        ffn = alpha = None  # the previous layer's FFN output and scale: its residual is added by the next norm
        for i, (block, buf) in enumerate(zip(self.model.layers, self.layers, strict=True)):
            x, ffn = self._layer(block, buf, x, ffn, alpha, inv_n[i], carried[i], slots)
            alpha = block.nffn.alpha
        _, hidden = self.ops.norm(x, ffn, alpha, inv_n[-1], carried[-1], self.final)
        weight = self.model.output.output.weight  # `Megalodon.logits`, its result written into self.logits
        if self.logits.dtype == hidden.dtype:
            torch.mm(hidden, weight.t(), out=self.logits)
        else:
            self.logits.copy_(torch.mm(hidden, weight.t()))
        self.fill.add_(1).remainder_(self.chunk)

    def _linear(self, layer: torch.nn.Linear, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """A projection: unfused the layer itself, (layer(x), None); fused (x W^T, bias), the bias left to the
        kernel that reads the product (at batch 1 a linear layer with a bias is two kernels, a copy and a GEMV)."""
        if not self.fused:
            return layer(x), None
        return torch.mm(x, layer.weight.t()), layer.bias

    def _layer(self, block: MegaBlock, buf: _Layer, x: Tensor, ffn: Tensor | None, alpha: Tensor | None,
               inv_n: Tensor, carried: Tensor, slots: Slots) -> tuple[Tensor, Tensor]:  # fmt: skip
        """`MegaBlock` for one token per row (x [B, D], with `ffn` the previous layer's input and FFN output, which
        `ops.norm_cema` adds): `MovingAverageGatedAttention.gated_attention` with the cache a whole chunk, then the
        FFN but its residual. Returns the layer's input and its FFN output."""
        mega, nffn, ops, linear = block.mega, block.nffn, self.ops, self._linear
        x, y, mx = ops.norm_cema(x, ffn, alpha, inv_n, carried, buf.norm, buf.cema)
        (z, z_bias), (v, v_bias), (r, r_bias) = linear(mega.wz, mx), linear(mega.wv, y), linear(mega.wr, mx)
        q = ops.qk(z, v, buf.qk_scale, buf.qk_offset, mega.eps, slots, buf.k, buf.v, z_bias, v_bias)
        gated = ops.attend(q, buf.k, buf.v, r, slots, r_bias)  # attention times silu(wr(mx))
        h, h_bias = linear(mega.wh1, mx)
        h.addmm_(gated, mega.wh2.weight.t())  # wh1(mx) + wh2(attn * silu(r))
        normed = ops.residual_layer_norm(x, h, nffn.norm.weight, nffn.norm.bias, nffn.norm.eps, h_bias)
        silu_mul = ops.silu_mul if self.fused else nffn.ops.silu_mul  # unfused: the model's own, as its forward
        hidden = F.silu(nffn.fc1(normed)) if nffn.fc3 is None else silu_mul(nffn.fc3(normed), nffn.fc1(normed))
        return x, nffn.fc2(hidden)
