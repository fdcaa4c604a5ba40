"""MEGALODON behind the StreamingLM contract: loading, streaming forward/score, norm-statistics modes.

Norm-statistics modes (`norm_stats`):

* ``cumulative`` (default): the exact model. Every TimestepNorm uses the statistics of every token
  since the start of the sequence, however long it is.
* ``official-window``: what the official evaluation script (megalodon/inference.py) computes. It
  feeds 2 chunks per step; once a step ends at position e >= 8 chunks, and more tokens follow, it
  re-runs the model from scratch over tokens [e - 6 chunks, e) and replaces every TimestepNorm's
  statistics (all layers and the final norm) with those of that fresh pass, keeping the CEMA states
  and the attention cache. Norm statistics therefore cover at most the last 6-8 chunks. Refreshes
  happen at absolute positions that are multiples of 2 chunks, so any split into calls gives the
  same result. One difference remains: for a sequence of an odd number n >= 9 of full chunks plus a
  partial one, inference.py also refreshes at n chunks (its last step holds 1 chunk); megaeval
  does not, because a streaming model cannot know where the sequence will end.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...errors import fail
from ...files import cached_file_sha256, human_bytes
from ...kernels import select
from ...tokenizers import SentencePieceTokenizer
from ..chunked import ChunkedStreamingLM
from ..weights import empty_model
from . import checkpoint
from .config import ModelArgs
from .decode import StaticDecoder
from .model import Megalodon, MegalodonState, complex_dtype

NORM_STATS = ("cumulative", "official-window")
WINDOW_STEP_CHUNKS = 2  # inference.py: MAX_CHUNKS_PER_BATCH
WINDOW_START_CHUNKS = 8  # inference.py: TRUNCATE_CHUNKS
WINDOW_CHUNKS = WINDOW_START_CHUNKS - WINDOW_STEP_CHUNKS


class MegalodonLM(ChunkedStreamingLM):
    """A MEGALODON checkpoint as a StreamingLM with unlimited context."""

    family = "megalodon"
    max_context = None
    static_decode = "auto"  # decoder(): "auto" on CUDA (a CUDA graph), "on" anywhere (off CUDA an eager step), "off"

    def __init__(
        self,
        model: Megalodon,
        tokenizer: SentencePieceTokenizer,
        info: checkpoint.CheckpointInfo | None,
        norm_stats: str = "cumulative",
        kernels: str = "auto",
        tokenizer_option: str | None = None,
    ):
        if norm_stats not in NORM_STATS:
            raise fail(f"unknown norm_stats {norm_stats!r}", f"use one of: {', '.join(NORM_STATS)}")
        self.model = model.eval().requires_grad_(False)
        self.args: ModelArgs = model.args
        self.tokenizer = tokenizer
        self.info = info
        self.path = None if info is None else info.path
        self.tokenizer_option = tokenizer_option
        self.norm_stats = norm_stats
        self._weights_sha256: str | None = None
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype
        self.kernels = kernels  # requested: auto, triton or torch (megaeval.kernels.select)
        self.model.use_kernels(select(kernels, self.device, self.dtype))
        chunk = self.args.chunk_size
        self.window_step = WINDOW_STEP_CHUNKS * chunk if norm_stats == "official-window" else None
        self._decoder: StaticDecoder | None = None

    # ------------------------------------------------------------------------------- contract

    def init_state(self, batch_size: int) -> MegalodonState:
        """A fresh state for `batch_size` sequences."""
        state = self.model.init_state(batch_size)
        if self.norm_stats == "official-window":
            state.history = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)
        return state

    def decoder(self, batch_size: int) -> StaticDecoder | None:
        """A StaticDecoder of `batch_size` rows (kept for the next call of the same size), or None where decoding
        stays on `forward`: the official-window mode, off CUDA (unless static_decode is "on"), or too little free
        memory for its buffers (a whole chunk of keys and values per row and layer)."""
        if self.norm_stats != "cumulative" or self.static_decode == "off":
            return None
        on_cuda = self.device.type == "cuda"
        if not on_cuda and self.static_decode != "on":
            return None
        if self._decoder is None or self._decoder.batch_size != batch_size:
            self._decoder = None  # free the buffers of another size first
            need = StaticDecoder.nbytes(self.model, batch_size)
            if on_cuda and torch.cuda.mem_get_info(self.device)[0] < 1.25 * need:
                return None
            fused = False if self.kernels == "torch" else None  # kernels "torch": no Triton in the step either
            self._decoder = StaticDecoder(self.model, batch_size, graph=on_cuda, fused=fused)
        return self._decoder

    # ------------------------------------------------------------------------------- internals

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def out_size(self) -> int:
        return self.args.out_size

    @property
    def score_chunk(self) -> int:
        return self.args.chunk_size

    def _batch_of(self, state: MegalodonState) -> int:
        return state.final_norm.mean.shape[0]

    def _chunk_nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model.nll(hidden, targets)

    def _step(self, tokens: torch.Tensor, state: MegalodonState) -> tuple[torch.Tensor, MegalodonState]:
        """The model over one step's tokens (the official-window mode first refreshes the norm statistics when due,
        and keeps the last tokens)."""
        if self.norm_stats == "official-window":
            state = self._refresh_if_due(state)
        hidden, state = self.model(tokens, state)
        if state.history is not None:
            keep = WINDOW_CHUNKS * self.args.chunk_size
            state = replace(state, history=torch.cat([state.history, tokens], dim=1)[:, -keep:])
        return hidden, state

    def step(self, batch_size: int) -> int:
        """Tokens per row per internal step: whole chunks, about `step_tokens` for the whole batch (the
        official-window mode steps 2 chunks at a time, as inference.py does)."""
        return self.window_step or super().step(batch_size)

    def _refresh_if_due(self, state: MegalodonState) -> MegalodonState:
        """inference.py's truncation: replace norm statistics with a fresh pass over the last 6 chunks."""
        chunk = self.args.chunk_size
        pos = state.position
        if pos == 0 or pos % (WINDOW_STEP_CHUNKS * chunk) or pos < WINDOW_START_CHUNKS * chunk:
            return state
        _, fresh = self.model(state.history, self.model.init_state(state.history.shape[0]))
        layers = [replace(old, norm=new.norm) for old, new in zip(state.layers, fresh.layers, strict=True)]
        return replace(state, layers=layers, final_norm=fresh.final_norm)

    # ------------------------------------------------------------------------------- facts

    def state_bytes(self, batch_size: int = 1) -> int:
        """Largest size of a state: reached with a chunk that lacks one token (and full history)."""
        a = self.args
        real = torch.empty(0, dtype=self.dtype).element_size()
        cplx = torch.empty(0, dtype=complex_dtype(self.dtype)).element_size()
        norm = 2 * a.norm_num_groups * 8
        per_layer = norm + a.model_dim * a.cema_ndim * cplx + (a.chunk_size - 1) * (a.z_dim + a.value_dim) * real
        history = WINDOW_CHUNKS * a.chunk_size * 8 if self.norm_stats == "official-window" else 0
        return batch_size * (a.num_layers * per_layer + norm + history)

    def weights_sha256(self) -> str | None:
        """sha256 of the weight file, or of the shards' checksums in rank order."""
        if self.info is None:
            return None
        if self._weights_sha256 is None:
            digests = [cached_file_sha256(p) for p in self.info.weight_files]
            self._weights_sha256 = (
                digests[0] if len(digests) == 1 else hashlib.sha256(" ".join(digests).encode()).hexdigest()
            )
        return self._weights_sha256

    def flops_per_token(self, context_length: int) -> float | None:
        """Matmul FLOPs per token of a fresh pass of `context_length` tokens (ModelArgs.flops_per_token)."""
        return self.args.flops_per_token(context_length)

    def parameter_count(self) -> int:
        """Number of distinct parameters (a shared embedding counts once)."""
        return sum(p.numel() for p in self.model.parameters())

    def options(self) -> dict[str, Any]:
        """Effective load options, defaults included."""
        return {"norm_stats": self.norm_stats, "kernels": self.kernels, "tokenizer": self.tokenizer_option}

    def info_rows(self) -> list[tuple[str, str]]:
        """Rows of `megaeval info`'s table."""
        a, tok = self.args, self.tokenizer.describe()
        stored = "in memory" if self.info is None else (
            f"stored {self.info.stored_dtype}, model-parallel {self.info.model_parallel_size}")  # fmt: skip
        return [
            ("path", str(self.path)),
            ("parameters", f"{self.parameter_count():,}"),
            ("layers × model_dim", f"{a.num_layers} × {a.model_dim}"),
            ("z_dim / value_dim / heads", f"{a.z_dim} / {a.value_dim} / {a.num_heads}"),
            ("ffn_hidden_dim", f"{a.ffn_hidden_dim}" + (" (SwiGLU)" if a.swiglu else "")),
            ("cema_ndim / norm groups", f"{a.cema_ndim} / {a.norm_num_groups}"),
            ("chunk size", f"{a.chunk_size:,}"),
            ("max context", "unlimited (state carried)"),
            ("state per sequence", f"{human_bytes(self.state_bytes(1))} (at most)"),
            ("norm statistics", self.norm_stats),
            ("kernels", f"{self.model.ops.backend} (asked: {self.kernels})"),
            ("dtype", f"{str(self.dtype).removeprefix('torch.')} on {self.device} ({stored})"),
            ("tokenizer", str(tok["path"])),
            ("vocabulary", f"{tok['vocab_size']:,} (bos {tok['bos_id']}, eos {tok['eos_id']})"),
        ]

    def describe(self) -> dict[str, Any]:
        """Facts for `megaeval info` and reports."""
        return {
            "family": self.family,
            "path": None if self.info is None else str(self.info.path),
            "config": self.args.to_dict(),
            "parameters": self.parameter_count(),
            "chunk_size": self.args.chunk_size,
            "max_context": self.max_context,
            "state_bytes_per_sequence": self.state_bytes(1),
            "norm_stats": self.norm_stats,
            "kernels": {"requested": self.kernels, "backend": self.model.ops.backend},
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "stored_dtype": None if self.info is None else self.info.stored_dtype,
            "model_parallel_size": None if self.info is None else self.info.model_parallel_size,
            "tokenizer": self.tokenizer.describe(),
        }


def load_tokenizer(path: str | Path, *, tokenizer: str | None = None, **_model_options: Any) -> SentencePieceTokenizer:
    """The tokenizer of a MEGALODON checkpoint, checked against its config, without loading weights."""
    return _checked_tokenizer(checkpoint.read_info(path, tokenizer=tokenizer))


def _checked_tokenizer(info: checkpoint.CheckpointInfo) -> SentencePieceTokenizer:
    tok = SentencePieceTokenizer(info.tokenizer_path, info.additional_vocab_size)
    if tok.vocab_size != info.args.vocab_size:
        raise fail(
            f"tokenizer vocabulary ({tok.sp_vocab_size} pieces + {tok.additional_vocab_size} additional = "
            f"{tok.vocab_size}) does not match model.vocab_size {info.args.vocab_size} in config.json",
            "pass --model-args tokenizer=PATH with the tokenizer this model was trained with",
        )
    return tok


def load(
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    *,
    norm_stats: str = "cumulative",
    tokenizer: str | None = None,
    kernels: str = "auto",
) -> MegalodonLM:
    """Load an official-layout MEGALODON checkpoint directory."""
    info = checkpoint.read_info(path, tokenizer=tokenizer)
    tok = _checked_tokenizer(info)
    model = empty_model(lambda: Megalodon(info.args))
    meta = model.state_dict()
    expected = {k: v.shape for k, v in meta.items()}
    state = checkpoint.load_state_dict(info, {k for k, v in meta.items() if v.is_floating_point()})
    checkpoint.check_state_dict(state, expected, info.args.share_emb)
    if info.args.share_emb and "output.output.weight" in state:
        if not torch.equal(state["output.output.weight"], state["embed.weight"]):
            raise fail(
                "config.json sets share_emb but output.output.weight differs from embed.weight",
                "check that config.json belongs to these weights",
            )
    state = {k: v for k, v in state.items() if k in expected}
    state = {k: (v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device)) for k, v in state.items()}
    if info.args.share_emb:
        state["output.output.weight"] = state["embed.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if info.args.share_emb:
        model.output.output.weight = model.embed.weight
    return MegalodonLM(model, tok, info, norm_stats=norm_stats, kernels=kernels, tokenizer_option=tokenizer)
