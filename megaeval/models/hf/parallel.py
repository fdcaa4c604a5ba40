"""Sequence parallel for Hugging Face causal LMs (`--chunk-parallel P` with the hf family): the P ranks of
a chunk-parallel group share one sequence, each holding a contiguous slice of it and that slice of every
layer's KV cache, and attention is exact.

How it plugs into transformers (no model code forked): megaeval registers an attention function
(`transformers.AttentionInterface.register("megaeval_sequence_parallel", ...)`) and, for the duration of
each sequence-parallel model call, sets the model's ``config._attn_implementation`` to it (ordinary
`lm.score` calls on the same model keep the implementation it was loaded with). The model is called with
the global ``position_ids`` of the rank's tokens and a sharded cache (`ShardCache`: each layer's
``Cache.update`` returns this rank's keys and values); the registered function gets the layer's queries
and this rank's K/V and combines partial results from every rank. Since that name has no mask function,
transformers builds no [T, T] mask; causality and sliding windows are applied from global positions.
Any model whose attention layers go through transformers' attention interface and cache works: Llama,
Mistral (sliding window), Qwen2, GPT-NeoX, GPT-2 are tested. A model is checked once before use: causal,
hookable (every attention layer must reach the registered function and the cache), and a probe of a
few tokens must reproduce the model's own logits; anything else is refused with one line.

Design: ring of K/V blocks with a log-sum-exp merge (chosen), not the all-to-all head split. The cache
must be split by sequence position, the way users think of a context that outgrows a device, and must
stay split for decoding: with a ring, each rank attends its own queries to its own shard, then to the
K/V blocks handed round the ring (a block travels only as far as a later rank needs it: with a fresh
sequence, block k goes to ranks k+1 .. P-1), merging the partial softmax states exactly (max, sum,
weighted values). Decoding and other short calls (fewer than P x REPLICATE_BELOW tokens) are
replicated instead: every rank runs the few new tokens, scores them against its own shard, and one
all-gather of the partial states merges them, so only queries and [B, H, T, d + 2] partials travel,
never the cache. The new tokens' K/V go to the rank holding the fewest keys (the last such rank), which
after an even prefill alternates like round-robin and keeps the shards within one call of equal.
The all-to-all head split (DeepSpeed Ulysses, arXiv 2309.14509; compared with the ring in "USP: A Unified
Sequence Parallelism Approach for Long Context Generative AI", arXiv 2405.07719) would send each rank
the whole sequence for H/P heads and back, twice per layer: it moves activations rather than K/V (less
traffic when K/V heads are few), but needs P to divide the number of K/V heads (2 for many GQA models),
and with a cache kept per head group every decoding step needs the all-to-all again; kept as a note.
Load balance: with contiguous slices, rank k attends to k + 1 blocks, so attention (not the MLPs or
projections, which split evenly) is imbalanced; a zigzag layout would balance it but breaks the
contiguous slices and the per-rank logits of a slice.

Memory per rank: its slice's activations, its shard of the KV cache (~1/P of one process's; see
`ShardedState.nbytes`), one received K/V block at a time, and [B, H, TILE, TILE] score tiles.
Numbers equal one process's up to rounding (float64: ~1e-15 relative on logits). A rotary scaling that
depends on the longest position seen in a call ("dynamic" RoPE) would differ between slices; such
configs are not special-cased.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer

from ...distributed.exchange import Exchange
from ...errors import MegaevalError, fail
from ...kernels.nll import IGNORE_INDEX
from ..group import GroupLM
from .adapter import STEP_TOKENS, HFCausalLM
from .attention import ACTIVE, NAME, Call, sequence_parallel_attention
from .kv_cache import cache_argument
from .model import cache_tensors, repeated_cache

REPLICATE_BELOW = 32  # calls of fewer than P x this many tokens (decoding) are replicated, not sliced
PROBE_TOKENS = (5, 3)  # the probe's two calls: a prefill and a continuation on its cache


class ShardLayer(DynamicLayer):
    """One layer's keys and values held by this rank; a call's new ones are kept only where the call says."""

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor, *args: Any) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys, self.values = key_states[..., :0, :].clone(), value_states[..., :0, :].clone()
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Keep the new keys and values when this rank stores them; return everything this rank holds."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        call = ACTIVE.get()
        if call is None or call.store:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each row `repeats` times (an empty shard too: its batch size must follow the state's)."""
        if self.is_initialized:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)


class ShardCache(Cache):
    """A transformers Cache holding this rank's shard of every layer's keys and values; `get_seq_length()`
    is the sequence's global length (`seen`), which models use for positions."""

    def __init__(self):
        super().__init__(layer_class_to_replicate=ShardLayer)
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens of the whole sequence before the current call (on every rank alike)."""
        return self.seen


@dataclass
class ShardedState:
    """One rank's part of a sequence-parallel state: its KV shard, the sequence's length, and which positions
    every rank of the group holds (`ranges[i]`: ascending [start, end) ranges; the same on every rank)."""

    cache: Any
    length: int
    batch_size: int
    ranges: list[list[tuple[int, int]]] = field(default_factory=list)

    def clone(self) -> ShardedState:
        return ShardedState(copy.deepcopy(self.cache), self.length, self.batch_size, [list(r) for r in self.ranges])

    def repeat(self, n: int) -> ShardedState:
        """A state for batch_size * n sequences, each row's shard repeated n times (this one is left as it was)."""
        if n == 1:
            return self.clone()
        ranges = [list(r) for r in self.ranges]
        return ShardedState(repeated_cache(self.cache, n), self.length, self.batch_size * n, ranges)

    def nbytes(self) -> int:
        """Bytes of this rank's keys and values (about 1/P of one process's cache)."""
        return sum(t.numel() * t.element_size() for t in cache_tensors(self.cache))

    def held(self, rank: int) -> int:
        """Number of positions group rank `rank` holds."""
        return sum(e - s for s, e in self.ranges[rank])

    def hold(self, rank: int, start: int, end: int) -> None:
        """Record that `rank` keeps positions [start, end)."""
        spans = self.ranges[rank]
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        elif end > start:
            spans.append((start, end))

    def positions(self, rank: int) -> Tensor:
        """Global positions (CPU int64, ascending) of the keys `rank` holds."""
        parts = [torch.arange(s, e) for s, e in self.ranges[rank]]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def slice_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of `parts` contiguous slices of `length` tokens, the first ones one longer when uneven."""
    q, r = divmod(length, parts)
    out, end = [], 0
    for i in range(parts):
        start, end = end, end + q + (i < r)
        out.append((start, end))
    return out


def _backbone(model: Any, tokens: Tensor, positions: Tensor, cache: Any, call: Call) -> Tensor:
    """Hidden states of `tokens` at global `positions`, through the registered attention (one model call)."""
    config, before = model.config, model.config._attn_implementation
    token = ACTIVE.set(call)
    config._attn_implementation = NAME
    try:
        out = model.base_model(input_ids=tokens, position_ids=positions[None].to(tokens.device), use_cache=True,
                               **{cache_argument(model.base_model): cache})  # fmt: skip
    finally:
        config._attn_implementation = before
        ACTIVE.reset(token)
    return out.last_hidden_state


def _head(model: Any, hidden: Tensor) -> Tensor:
    logits = model.get_output_embeddings()(hidden)
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _unhookable(name: str) -> MegaevalError:
    return fail(f"{name} computes attention outside transformers' attention interface, so --chunk-parallel "
                "cannot shard its KV cache", "use --chunk-parallel 1")  # fmt: skip


def check_supported(lm: Any) -> None:
    """Refuse, with one line, a model sequence parallel cannot run exactly; checked once per model."""
    if getattr(lm, "_sequence_parallel_checked", False):
        return
    if not isinstance(lm, HFCausalLM):
        raise fail(f"sequence parallel runs hf models only, not {getattr(lm, 'family', type(lm).__name__)}")
    model = lm.model
    name, cfg = type(model).__name__, model.config
    bidirectional = [m for m in model.modules() if getattr(m, "is_causal", None) is False]
    if getattr(cfg, "is_encoder_decoder", False) or getattr(cfg, "is_causal", True) is False or bidirectional:
        raise fail(f"{name} is not a causal language model (its attention sees later tokens)",
                   "--chunk-parallel runs causal models only; use --chunk-parallel 1")  # fmt: skip
    can_set = getattr(type(model), "_can_set_attn_implementation", lambda: True)
    base, head = model.base_model, model.get_output_embeddings()
    signature = inspect.signature(base.forward).parameters if base is not model else {}
    if not can_set() or head is None or "position_ids" not in signature:
        raise _unhookable(name)
    AttentionInterface.register(NAME, sequence_parallel_attention)
    _probe(lm, name)
    lm._sequence_parallel_checked = True


@torch.inference_mode()
def _probe(lm: Any, name: str) -> None:
    """One process, a few tokens in two calls: the hooked model must reach the registered attention and the
    sharded cache in every attention layer and reproduce the model's own logits."""
    model = lm.model
    n = sum(PROBE_TOKENS)
    tokens = ((torch.arange(n) * 7 + 3) % model.config.vocab_size)[None].to(lm.device)
    try:
        reference = model(input_ids=tokens).logits.to(torch.promote_types(lm.dtype, torch.float32))
        cache, parts, start, layers = ShardCache(), [], 0, []
        for count in PROBE_TOKENS:
            positions = torch.arange(start + count)
            call = Call(0, [positions[start:]], [positions], replicated=False, store=True)
            hidden = _backbone(model, tokens[:, start : start + count], positions[start:], cache, call)
            parts.append(_head(model, hidden))
            cache.seen = start = start + count
            layers.append(call.layers)
    except Exception as e:  # noqa: BLE001  (a MegaevalError says why; anything else: the model does not fit)
        if isinstance(e, MegaevalError):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise fail(f"{name} cannot run sequence parallel ({type(e).__name__}: {first[:160]})",
                   "use --chunk-parallel 1") from None  # fmt: skip
    stored = [getattr(layer, "keys", None) for layer in cache.layers]
    if not layers[0] or len(set(layers)) != 1 or len(stored) != layers[0] or any(
        k is None or k.shape[-2] != n for k in stored
    ):  # fmt: skip
        raise _unhookable(name)
    tol = {torch.float64: 1e-8, torch.float32: 1e-4}.get(lm.dtype, 3e-2) * max(1.0, float(reference.abs().max()))
    if float((torch.cat(parts, 1) - reference).abs().max()) > tol:
        raise fail(f"{name}'s attention or output head does more than causal softmax attention and a linear head "
                   "(an attention bias such as ALiBi, or a logit transform), which sequence parallel does not "
                   "reproduce", "use --chunk-parallel 1")  # fmt: skip


class SequenceParallelLM(GroupLM):
    """An hf StreamingLM spread over the `chunk.size` ranks of a chunk-parallel group (ChunkGroup).

    Every call is collective over the group: every rank passes the same tokens and its own part of the
    state, and gets the full result (logits [B, T, V] from `forward`, NLL [B, T] from `score`). A call of at
    least P x REPLICATE_BELOW tokens is sliced (rank k runs the k-th contiguous slice and keeps its K/V);
    a shorter one (decoding) runs on every rank and its K/V go to one rank. So `megaeval.scoring.generate`
    (prefill, greedy_generate) runs on it unchanged, on every rank of the group.
    """

    lm: HFCausalLM

    def __init__(self, lm: HFCausalLM, chunk: Any):
        check_supported(lm)
        super().__init__(lm, chunk)
        self.exchange = Exchange(chunk) if chunk.size > 1 else None

    def init_state(self, batch_size: int) -> ShardedState:
        return ShardedState(ShardCache(), 0, batch_size, [[] for _ in range(self.chunk.size)])

    # ------------------------------------------------------------------------------------ calls

    def _hidden(self, tokens: Tensor, state: ShardedState) -> tuple[Tensor, tuple[int, int], bool]:
        """Run the model on this rank's part of the call: (hidden states, its [a, b) within the call, replicated)."""
        T, P, r = tokens.shape[1], self.chunk.size, self.chunk.rank
        start = state.length
        replicated = P > 1 and T < P * REPLICATE_BELOW
        if replicated:
            owner = min(range(P), key=lambda i: (state.held(i), -i))  # fewest keys, the last such rank
            state.hold(owner, start, start + T)
            qpos = [torch.arange(start, start + T)] * P
            mine, store = (0, T), owner == r
        else:
            bounds = slice_bounds(T, P)
            for i, (a, b) in enumerate(bounds):
                state.hold(i, start + a, start + b)
            qpos = [torch.arange(start + a, start + b) for a, b in bounds]
            mine, store = bounds[r], True
        call = Call(r, qpos, [state.positions(i) for i in range(P)], replicated, store, self.exchange)
        hidden = _backbone(self.lm.model, tokens[:, mine[0] : mine[1]], qpos[r], state.cache, call)
        state.length += T
        state.cache.seen = state.length
        return hidden, mine, replicated

    def _gather(self, part: Tensor, length: int) -> Tensor:
        """The full [B, length, ...] from every rank's slice [B, n_k, ...] (slice_bounds order)."""
        if self.exchange is None:
            return part
        bounds = slice_bounds(length, self.chunk.size)
        longest = max(b - a for a, b in bounds)
        padded = part.new_zeros(part.shape[0], longest, *part.shape[2:])
        padded[:, : part.shape[1]] = part
        pieces = self.exchange.all_gather(padded)
        return torch.cat([p[:, : b - a] for p, (a, b) in zip(pieces, bounds, strict=True)], dim=1)

    def _begin(self, tokens: Any, targets: Any, state: ShardedState) -> Tensor:
        """Every rank must be given the same call, and the tokens must fit the model and the state."""
        tokens = torch.as_tensor(tokens, device=self.device)
        if self.exchange is not None:
            self.exchange.agree(tokens, targets, state.length)
        return self.lm.check_tokens(tokens, state)

    def _empty(self, tokens: Tensor) -> Tensor:
        dtype = torch.promote_types(self.dtype, torch.float32)
        return torch.zeros(tokens.shape[0], 0, self.lm.model.config.vocab_size, dtype=dtype, device=self.device)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, state: ShardedState) -> tuple[Tensor, ShardedState]:
        """Logits [B, T, V] on every rank of the group (a sliced call gathers every rank's slice)."""
        return self.forward_last(tokens, state, torch.as_tensor(tokens).shape[-1])

    @torch.inference_mode()
    def forward_last(self, tokens: Tensor, state: ShardedState, last: int) -> tuple[Tensor, ShardedState]:
        """Logits [B, last, V] of the call's last `last` positions on every rank; the output layer runs only
        there, on the rank whose slice holds each position."""
        tokens = self._begin(tokens, None, state)
        T = tokens.shape[1]
        first = T - min(max(last, 0), T)
        if T == 0 or first == T:
            if T:
                self._hidden(tokens, state)
            return self._empty(tokens), state
        hidden, (a, b), replicated = self._hidden(tokens, state)
        if replicated:
            return _head(self.lm.model, hidden[:, first:]), state
        if first == 0:
            return self._gather(_head(self.lm.model, hidden), T), state
        lo = max(a, first)  # this rank's part of the wanted positions: [lo, b)
        part = _head(self.lm.model, hidden[:, lo - a :]) if lo < b else None
        mine = torch.zeros(tokens.shape[0], T - first, self.lm.model.config.vocab_size, device=self.device,
                           dtype=torch.promote_types(self.dtype, torch.float32))  # fmt: skip
        if part is not None:
            mine[:, lo - first : b - first] = part
        pieces = self.exchange.all_gather(mine)
        owners = [max(0, min(e, T) - max(s, first)) for s, e in slice_bounds(T, self.chunk.size)]
        return torch.cat([p[:, sum(owners[:i]) : sum(owners[: i + 1])] for i, p in enumerate(pieces)], 1), state

    @torch.inference_mode()
    def advance(self, tokens: Tensor, state: ShardedState) -> ShardedState:
        """The state after `tokens` (each rank's KV shard extended), computing no logits."""
        return self.forward_last(tokens, state, 0)[1]

    @torch.inference_mode()
    def score(self, inputs: Tensor, targets: Tensor, state: ShardedState) -> tuple[Tensor, ShardedState]:
        """NLL [B, T] of `targets` on every rank; each rank holds at most STEP_TOKENS positions of logits."""
        targets = torch.as_tensor(targets, device=self.device)
        inputs = self._begin(inputs, targets, state)
        if targets.shape != inputs.shape:
            raise fail(f"targets shape {list(targets.shape)} differs from inputs shape {list(inputs.shape)}")
        B, T = inputs.shape
        dtype = torch.promote_types(self.dtype, torch.float32)
        if T == 0:
            return torch.zeros(B, 0, dtype=dtype, device=self.device), state
        hidden, (a, b), replicated = self._hidden(inputs, state)
        mine = targets[:, a:b].long()
        nll = torch.zeros(B, b - a, dtype=dtype, device=self.device)
        for s in range(0, b - a, STEP_TOKENS):
            e = min(b - a, s + STEP_TOKENS)
            logits = _head(self.lm.model, hidden[:, s:e])
            nll[:, s:e] = F.cross_entropy(
                logits.flatten(0, 1), mine[:, s:e].flatten(), ignore_index=IGNORE_INDEX, reduction="none"
            ).view(B, -1)
        return (nll if replicated else self._gather(nll, T)), state


def score_sequence_parallel(
    lm: Any, inputs: Tensor, targets: Tensor, chunk: Any, state: ShardedState | None = None, *,
    keep_state: bool = False,
) -> tuple[Tensor, ShardedState | None]:  # fmt: skip
    """NLL [B, T] of `targets` given `inputs` for an hf model, computed by the `chunk.size` ranks of a
    chunk-parallel group (the hf counterpart of megalodon's score_chunk_parallel, same contract).

    Collective over the group: every rank passes the same inputs and targets and its part of the starting
    state (None: a fresh one; a state comes from `SequenceParallelLM(lm, chunk).init_state` or an earlier
    call with `keep_state`). Returns on every rank the full NLL (equal to `lm.score` up to rounding) and,
    with `keep_state`, this rank's part of the state after the segment (else None). Bad input and
    unsupported models fail on every rank alike.
    """
    return SequenceParallelLM(lm, chunk).score_segment(inputs, targets, state, keep_state=keep_state)
