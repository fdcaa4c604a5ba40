"""Recurrent models behind the StreamingLM contract: loading a checkpoint of any supported architecture (routed by
`model_type`), streaming forward/score with the state carried exactly, and the facts `info` and reports show.

Numbers do not depend on how a sequence is split into calls: `ChunkedStreamingLM` walks every call in steps
aligned to absolute multiples of SCORE_CHUNK, and each architecture's chunks (CHUNK tokens) tile those steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import fail
from ...files import human_bytes
from ...kernels.nll import nll_from_logits
from ...tokenizers import tokenizer_option
from ..chunked import ChunkedStreamingLM
from ..hf.adapter import HFTokenizer
from ..hf.checkpoint import read_tokenizer, transformers_module
from ..weights import empty_model
from . import checkpoint
from .config import Architecture, architecture_of, hf_config

CHUNK = 16  # tokens per scan chunk inside a layer: a few passes over [B, chunk, E, N] per chunk (16 is fastest on CPU)
# Mamba-1: the blocked scan (`scan.scan`) does O(chunk) work in few ops, so longer chunks mean fewer ops (64 was
# fastest on CPU; its [B, chunk, E, N] tensors are what a chunk holds)
CHUNKS = {"mamba": 64}
SCORE_CHUNK = 64  # positions of logits alive at once while scoring; a multiple of every chunk


class RecurrentLM(ChunkedStreamingLM):
    """A Mamba, Mamba-2, RWKV-4 or RecurrentGemma checkpoint: unlimited context, a state of constant size."""

    family = "recurrent"
    max_context = None
    score_chunk = SCORE_CHUNK

    def __init__(self, model: torch.nn.Module, tokenizer: HFTokenizer, architecture: Architecture,
                 path: Path | None = None, layout: str = "hf", stored: str | None = None,
                 tokenizer_option: str | None = None):  # fmt: skip
        self.model = model.eval().requires_grad_(False)
        self.config = model.config
        self.architecture = architecture
        self.tokenizer = tokenizer
        self.path = path
        self.layout = layout
        self.stored_dtype = stored
        self.tokenizer_option = tokenizer_option
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self._weights_sha256: str | None = None

    def init_state(self, batch_size: int) -> Any:
        """A fresh state for `batch_size` sequences."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise fail(f"batch_size must be a positive integer, got {batch_size!r}")
        return self.model.init_state(batch_size)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def out_size(self) -> int:
        return self.config.vocab_size

    def _batch_of(self, state: Any) -> int:
        return state.batch_size

    def _chunk_nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nll_from_logits(self.model.logits(hidden), targets)

    def _step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        return self.model(tokens, state)

    # ------------------------------------------------------------------------------- facts

    def state_bytes(self, batch_size: int = 1) -> int:
        """Bytes of the most a state holds (constant in tokens consumed; RecurrentGemma's window full)."""
        return self.model.init_state(batch_size).nbytes()

    def weights_sha256(self) -> str | None:
        """sha256 of the weight file, or of the weight files' checksums in name order."""
        if self.path is None:
            return None
        if self._weights_sha256 is None:
            self._weights_sha256 = checkpoint.weights_sha256(self.path)
        return self._weights_sha256

    def parameter_count(self) -> int:
        """Parameters (a tied output layer counts once)."""
        return sum(p.numel() for p in self.model.parameters())

    def options(self) -> dict[str, Any]:
        """Effective load options, defaults included."""
        return {"tokenizer": self.tokenizer_option}

    def describe(self) -> dict[str, Any]:
        """Facts for `megaeval info` and reports."""
        return {
            "family": self.family,
            "path": None if self.path is None else str(self.path),
            "architecture": self.architecture.name,
            "layout": self.layout,
            "config": self.config.to_dict(),
            "parameters": self.parameter_count(),
            "chunk_size": self.model.chunk,
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
        f, c, tok = self.describe(), self.config, self.tokenizer.describe()
        layers = getattr(c, "num_hidden_layers", "?")
        hidden = getattr(c, "hidden_size", "?")
        layout = "transformers" if self.layout == "hf" else "mamba_ssm (original)"
        return [
            ("path", str(f["path"])),
            ("architecture", f"{self.architecture.name} ({layout} layout), run by megaeval's own streaming code"),
            ("parameters", f"{f['parameters']:,}"),
            ("layers × hidden", f"{layers} × {hidden}"),
            ("max context", "unlimited (state carried exactly)"),
            ("state per sequence", f"{human_bytes(f['state_bytes_per_sequence'])} (constant)"),
            ("scan chunk", f"{self.model.chunk} tokens"),
            ("dtype", f"{f['dtype']} on {f['device']} (stored {f['stored_dtype']}; states float32 or wider)"),
            ("tokenizer", str(tok["path"])),
            ("vocabulary", f"{tok['vocab_size']:,} tokens, {c.vocab_size:,} embedding rows"
                           + (" (tied)" if getattr(c, "tie_word_embeddings", False) else "")),
        ]  # fmt: skip


def load_tokenizer(path: str | Path, *, tokenizer: str | None = None, **_model_options: Any) -> HFTokenizer:
    """The transformers tokenizer beside the checkpoint (or in `tokenizer`, a directory), offline."""
    return _tokenizer(Path(path), hf_config(Path(path))[1], tokenizer)


def _tokenizer(path: Path, layout: str, tokenizer: str | None) -> HFTokenizer:
    transformers_module()
    where = tokenizer_option(tokenizer, "recurrent", folder=True) if tokenizer is not None else path
    if layout == "mamba_ssm" and tokenizer is None:
        raise fail(f"{path} is a mamba_ssm checkpoint, which ships no tokenizer",
                   "pass --model-args tokenizer=DIR (state-spaces models use gpt-neox-20b's)")  # fmt: skip
    fix = "pass --model-args tokenizer=DIR, a folder with the tokenizer the model was trained with"
    return HFTokenizer(read_tokenizer(where, None, False, fix), str(where))


def load(path: str | Path, device: torch.device, dtype: torch.dtype, *, tokenizer: str | None = None) -> RecurrentLM:
    """Load a recurrent checkpoint (transformers or mamba_ssm layout) into megaeval's own model code."""
    path = Path(path)
    raw, layout = hf_config(path)
    architecture = architecture_of(raw, str(path / "config.json"))
    config_class, model_class = architecture.classes()
    config = config_class.from_hf(raw, str(path / "config.json"))
    tok = _tokenizer(path, layout, tokenizer)  # config.json read once
    if tok.vocab_size > config.vocab_size:
        raise fail(f"{path}: the tokenizer has {tok.vocab_size} tokens but the model only {config.vocab_size}",
                   "pass the tokenizer this model was trained with (--model-args tokenizer=DIR)")  # fmt: skip
    model = empty_model(lambda: model_class(config, chunk=CHUNKS.get(architecture.module, CHUNK)))
    stored = checkpoint.load_weights(model, path, layout, dtype, device)
    return RecurrentLM(model, tok, architecture, path, layout, stored, tokenizer)
