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
The all-to-all head split (DeepSpeed-Ulysses; the Unified View seed, section 10.4) would send each rank
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

from .attention import NAME, OnlineSoftmax, sequence_parallel_attention
from .lm import (
    REPLICATE_BELOW,
    SequenceParallelLM,
    ShardCache,
    ShardedState,
    check_supported,
    score_sequence_parallel,
)

__all__ = [
    "NAME",
    "REPLICATE_BELOW",
    "OnlineSoftmax",
    "SequenceParallelLM",
    "ShardCache",
    "ShardedState",
    "check_supported",
    "score_sequence_parallel",
    "sequence_parallel_attention",
]
