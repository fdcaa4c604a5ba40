"""RFA behind the StreamingLM contract: loading an rfa checkpoint, streaming forward/score, facts.

Numbers do not depend on how a sequence is split into calls: the compute chunks are aligned to
absolute positions and the only thing carried is the per-layer (S, z) sums, in float64.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import fail
from ...files import cached_file_sha256, human_bytes
from ...kernels.nll import nll_from_logits
from ...tokenizers import SentencePieceTokenizer
from ..chunked import ChunkedStreamingLM
from ..weights import empty_model, refuse_integer_weights
from .checkpoint import (
    CheckpointInfo,
    check_state_dict,
    is_rfa_dir,
    load_weights,
    read_info,
    save_checkpoint,
    stored_dtype,
)
from .config import RFAConfig
from .model import RFAModel, RFAState

CHUNK = 64  # tokens per compute chunk (intra-chunk quadratic form, carried sums across chunks)

__all__ = ["RFALM", "load", "load_tokenizer", "is_rfa_dir", "save_checkpoint", "CHUNK"]


class RFALM(ChunkedStreamingLM):
    """An RFA checkpoint as a StreamingLM with unlimited context and a constant-size state."""

    family = "rfa"
    max_context = None

    def __init__(
        self,
        model: RFAModel,
        tokenizer: SentencePieceTokenizer,
        info: CheckpointInfo | None = None,
        stored: str | None = None,
        chunk_size: int = CHUNK,
        tokenizer_option: str | None = None,
    ):
        self.model = model.eval().requires_grad_(False)
        self.config: RFAConfig = model.config
        self.tokenizer = tokenizer
        self.info = info
        self.path = None if info is None else info.path
        self.tokenizer_option = tokenizer_option
        self.stored_dtype = stored
        self.chunk_size = chunk_size
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype
        self._weights_sha256: str | None = None

    # ------------------------------------------------------------------------------- contract

    def init_state(self, batch_size: int) -> RFAState:
        """A fresh state for `batch_size` sequences."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise fail(f"batch_size must be a positive integer, got {batch_size!r}")
        return self.model.init_state(batch_size)

    # ------------------------------------------------------------------------------- internals

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    out_size = vocab_size

    @property
    def score_chunk(self) -> int:
        return self.chunk_size

    def _batch_of(self, state: RFAState) -> int:
        return state.batch_size

    def _chunk_nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nll_from_logits(self.model.logits(hidden), targets)

    def _step(self, tokens: torch.Tensor, state: RFAState) -> tuple[torch.Tensor, RFAState]:
        return self.model(tokens, state, chunk=self.chunk_size)

    # ------------------------------------------------------------------------------- facts

    def state_bytes(self, batch_size: int = 1) -> int:
        """Size of a state: per layer and head, S [R, d] and z [R] in float64 (constant in tokens consumed)."""
        c = self.config
        return batch_size * c.num_layers * c.num_heads * c.feature_dim * (c.head_dim + 1) * 8

    def weights_sha256(self) -> str | None:
        """sha256 of model.safetensors."""
        if self.info is None:
            return None
        if self._weights_sha256 is None:
            self._weights_sha256 = cached_file_sha256(self.info.weights_path)
        return self._weights_sha256

    def parameter_count(self) -> int:
        """Learned parameters (a tied embedding counts once; the fixed random matrices are not counted)."""
        return sum(p.numel() for p in self.model.parameters())

    def options(self) -> dict[str, Any]:
        """Effective load options, defaults included."""
        return {"tokenizer": self.tokenizer_option}

    def describe(self) -> dict[str, Any]:
        """Facts for `megaeval info` and reports."""
        return {
            "family": self.family,
            "path": None if self.info is None else str(self.info.path),
            "config": self.config.to_dict(),
            "parameters": self.parameter_count(),
            "chunk_size": self.chunk_size,
            "max_context": self.max_context,
            "state_bytes_per_sequence": self.state_bytes(1),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "stored_dtype": self.stored_dtype,
            "model_parallel_size": None,
            "tokenizer": self.tokenizer.describe(),
        }

    def info_rows(self) -> list[tuple[str, str]]:
        """Human-readable rows for the `megaeval info` table."""
        c, f = self.config, self.describe()
        features = f"{c.num_features} per head (phi has {c.feature_dim})"
        tok = f["tokenizer"]
        return [
            ("path", str(f["path"])),
            ("architecture", f"RFA (random feature attention), {c.num_layers} layers, learned sigma"),
            ("parameters", f"{f['parameters']:,}"),
            ("layers × model_dim / heads", f"{c.num_layers} × {c.model_dim} / {c.num_heads} (head dim {c.head_dim})"),
            ("ffn_hidden_dim", f"{c.ffn_hidden_dim} (gelu)"),
            ("random features", features),
            ("feature map", c.feature_map),
            ("gated", "yes" if c.gated else "no"),
            ("max context", "unlimited (state carried)"),
            ("state per sequence", f"{human_bytes(f['state_bytes_per_sequence'])} (constant)"),
            ("compute chunk", f"{self.chunk_size:,} tokens"),
            ("dtype", f"{f['dtype']} on {f['device']} (stored {f['stored_dtype']})"),
            ("tokenizer", f"{tok['path']} (sha256 {tok['sha256'][:12]})"),
            ("vocabulary", f"{c.vocab_size:,}" + (" (tied embeddings)" if c.tie_embeddings else "")),
        ]


def _checked_tokenizer(info: CheckpointInfo) -> SentencePieceTokenizer:
    tok = SentencePieceTokenizer(info.tokenizer_path)
    if tok.vocab_size != info.config.vocab_size:
        raise fail(
            f"tokenizer {info.tokenizer_path} has {tok.vocab_size} pieces but config.json says vocab_size "
            f"{info.config.vocab_size}",
            "pass --model-args tokenizer=PATH with the tokenizer this model was trained with",
        )
    return tok


def load_tokenizer(path: str | Path, *, tokenizer: str | None = None, **_model_options: Any) -> SentencePieceTokenizer:
    """The tokenizer of an rfa checkpoint, checked against its config, without loading weights."""
    return _checked_tokenizer(read_info(path, tokenizer=tokenizer))


def load(path: str | Path, device: torch.device, dtype: torch.dtype, *, tokenizer: str | None = None) -> RFALM:
    """Load an rfa checkpoint directory (config.json, model.safetensors, tokenizer)."""
    info = read_info(path, tokenizer=tokenizer)
    tok = _checked_tokenizer(info)
    model = empty_model(lambda: RFAModel(info.config))
    meta = model.state_dict()
    expected = {k: v.shape for k, v in meta.items()}
    state = load_weights(info)
    refuse_integer_weights(state, info.weights_path, {k for k, v in meta.items() if v.is_floating_point()})
    check_state_dict(state, expected, str(info.weights_path))
    stored = stored_dtype(state)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return RFALM(model, tok, info, stored, tokenizer_option=tokenizer)
