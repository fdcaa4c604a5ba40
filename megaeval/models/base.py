"""The StreamingLM contract shared by every model family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from ..kernels.nll import IGNORE_INDEX

READ_TOKENS = 2048  # tokens per call while a long prompt is read (`StreamingLM.read_call_tokens`'s default)


class Tokenizer(Protocol):
    """What megaeval needs from a tokenizer. `adds_bos` (optional): whether the model's own convention starts a
    text with BOS (what `--bos auto` follows; a tokenizer without it is taken to add BOS when it has one)."""

    vocab_size: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class State(Protocol):
    """What a StreamingLM carries between calls; every family's state offers these (tests/models/test_state.py).

    `clone()`: a deep copy, sharing no tensor with this state (snapshot a few-shot prefix once, reuse it for
    every example). `repeat(n)`: a new state for B * n sequences, row i * n + j a copy of row i (every choice
    of a question continues the question's state in one batched call); this state is left as it was.
    `nbytes()`: the bytes of the tensors it holds (counters and positions not counted; nor the spare room of buffers
    that grow in place, as the hf family's KV cache keeps), as reports show them.

    Rows at different positions (optional, see `can_stack`): `type(state).stack([s1, s2, ...])` is one batch of
    the rows of several states, each row keeping its own tokens and position, and `state.select(rows)` keeps some
    rows (finished generations dropped); a model call on such a batch gives each row what it would get alone.
    """

    def clone(self) -> State: ...

    def repeat(self, n: int) -> State: ...

    def nbytes(self) -> int: ...


class Decoder(Protocol):
    """Greedy decoding steps for a fixed number of rows (slots), each row's state held inside (`StreamingLM.decoder`):
    `load(state, rows)` puts the rows of a state into those slots, `step(tokens)` feeds one token to every slot and
    returns the logits [batch_size, V], `state(rows)` gives slots back as a state of the family."""

    batch_size: int

    def load(self, state: State, rows: Sequence[int] | None = None) -> None: ...

    def state(self, rows: Sequence[int] | None = None) -> State: ...

    def step(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor: ...


def can_stack(state: State) -> bool:
    """Whether a family's states can be stacked into one batch of rows at different positions."""
    able = callable(getattr(type(state), "stack", None)) and callable(getattr(state, "select", None))
    return able and getattr(state, "rows_stackable", True)  # a state may say its rows cannot join a batch


def rows_share_calls(state: State) -> bool:
    """Whether stacked rows at different positions run a call of several tokens together (else row by row, as a
    family whose positions go in per row only one token at a time does: its state says `rows_share_calls = False`)."""
    return can_stack(state) and getattr(state, "rows_share_calls", True)


def one_or_per_row(values: list[int]) -> int | list[int]:
    """A per-row number (a position, a count) as stacked states keep it: one int when every row has it, else the
    list, one per row."""
    return values[0] if len(set(values)) == 1 else values


def per_row(value: int | list[int], rows: int) -> list[int]:
    """Each of `rows` rows' number, from one int or a list of one per row."""
    return list(value) if isinstance(value, list) else [value] * rows


def repeated_rows(value: int | list[int], n: int) -> int | list[int]:
    """A per-row number after `repeat(n)`: row i * n + j has row i's."""
    return [v for v in value for _ in range(n)] if isinstance(value, list) else value


def stack_states(states: list[State]) -> State:
    """One batch of the rows of `states`, in order (states that `can_stack`)."""
    return states[0] if len(states) == 1 else type(states[0]).stack(states)


class StreamingLM(ABC):
    """A language model that consumes tokens in calls of any size, carrying a state between calls.

    Feeding a sequence in one call or split into any sequence of calls gives the same outputs.
    `forward` and `score` return the new state and may update the one passed in; to reuse a state
    (a few-shot prefix, say), pass `state.clone()`. State-carrying models (max_context None) keep
    a state whose size does not grow with the number of tokens consumed. States satisfy `State`.

    Rows of a batch never affect each other, so rows of different lengths can share a call padded on the
    right: padded positions change nothing before them.
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
    def init_state(self, batch_size: int) -> State:
        """A fresh state for `batch_size` independent sequences."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Logits [B, T, V] (float32, float64 for float64 models) for tokens [B, T], and the new state."""

    @abstractmethod
    def score(self, inputs: torch.Tensor, targets: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Per-token NLL [B, T] of `targets` given `inputs` (target -100 scores 0), and the new state."""

    def forward_last(self, tokens: torch.Tensor, state: State, last: int) -> tuple[torch.Tensor, State]:
        """`forward`, returning the logits of the last `last` positions only ([B, last, V]); families override it
        to run the output layer only there (a question's last token, the positions of its choices)."""
        tokens = torch.as_tensor(tokens)
        keep = min(max(last, 0), tokens.shape[1])
        if keep < tokens.shape[1]:  # read the rest as `advance` does: at most a chunk of logits alive
            state = self.advance(tokens[:, : tokens.shape[1] - keep], state)
        if keep == 0:
            dtype = torch.promote_types(self.dtype, torch.float32)
            return torch.zeros(tokens.shape[0], 0, self.tokenizer.vocab_size, dtype=dtype, device=self.device), state
        return self.forward(tokens[:, tokens.shape[1] - keep :], state)

    def advance(self, tokens: torch.Tensor, state: State) -> State:
        """The state after reading tokens [B, T], when no logits are needed (a prompt, a shared context).

        The same state `forward` would return; families override it to skip the output layer."""
        _, state = self.score(tokens, torch.full_like(torch.as_tensor(tokens), IGNORE_INDEX), state)
        return state

    def read_call_tokens(self, length: int) -> int:
        """Tokens per call when a `length`-token prompt is read (`scoring.generate.read`): a bound on the activations
        alive at once; a family that plans its own prefill (`hf.prefill`) takes the prompt whole."""
        return READ_TOKENS

    def read_rows(self, rows: list[list[int]]) -> list[State]:
        """Fresh states after each of `rows` (non-empty token lists), as `advance` from `init_state(1)` gives them.

        Each row is read in a call of its own here; a family may read them all in one call."""
        return [self.advance(torch.tensor([row], dtype=torch.long, device=self.device), self.init_state(1))
                for row in rows]  # fmt: skip

    def decoder(self, batch_size: int) -> Decoder | None:
        """A decoder that steps `batch_size` rows one token at a time faster than `forward` (a CUDA graph), giving
        what `forward` gives, or None: greedy decoding then calls `forward`. None unless a family has one."""
        return None

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

    def flops_per_token(self, context_length: int) -> float | None:
        """Matmul FLOPs per token of a fresh-state forward pass over `context_length` tokens (2 per multiply-add,
        output layer at every position, masked attention positions not counted), or None when the family does
        not know it: the model FLOPs of `ppl-sweep`'s MFU. A call of over max_context tokens is not asked for."""
        return None
