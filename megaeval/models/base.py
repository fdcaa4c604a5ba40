"""The StreamingLM contract shared by every model family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol

import torch


class Tokenizer(Protocol):
    """What megaeval needs from a tokenizer."""

    vocab_size: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def describe(self) -> dict[str, Any]: ...


class StreamingLM(ABC):
    """A language model that consumes tokens in calls of any size, carrying a state between calls.

    Feeding a sequence in one call or split into any sequence of calls gives the same outputs.
    `forward` and `score` return the new state and may update the one passed in; to reuse a state
    (a few-shot prefix, say), pass `state.clone()`. State-carrying models (max_context None) keep
    a state whose size does not grow with the number of tokens consumed.
    """

    family: str
    path: Path | None  # the checkpoint it was loaded from (None: built in memory)
    tokenizer: Tokenizer
    max_context: int | None  # None: unlimited (state-carrying models)
    device: torch.device
    dtype: torch.dtype

    @property
    def spec(self) -> str:
        """The model spec that loads this model again: FAMILY:PATH."""
        return f"{self.family}:{self.path}"

    @abstractmethod
    def init_state(self, batch_size: int) -> Any:
        """A fresh state for `batch_size` independent sequences."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Logits [B, T, V] (float32, float64 for float64 models) for tokens [B, T], and the new state."""

    @abstractmethod
    def score(self, inputs: torch.Tensor, targets: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Per-token NLL [B, T] of `targets` given `inputs` (target -100 scores 0), and the new state."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Facts about the loaded model for `megaeval info` and reports."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The effective load options (every option of the family, defaults included), as recorded in reports."""

    @abstractmethod
    def info_rows(self) -> list[tuple[str, str]]:
        """(label, value) rows that describe the model to a person (`megaeval info`)."""

    def weights_sha256(self) -> str | None:
        """Checksum of the weights as stored (identifies the model in reports), or None if unknown."""
        return None
