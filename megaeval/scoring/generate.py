"""Prefill and greedy decoding through the StreamingLM contract, carrying the state token by token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models.base import State, StreamingLM
from .finite import require_finite


def prefill(lm: StreamingLM, ids: list[int], state: State) -> tuple[torch.Tensor, State]:
    """Feed `ids` (at least one) into `state`; return the last position's logits [V] and the new state.

    One call of `forward_last`: the output layer runs for the last position only, so a whole book can be
    read without materialising [T, V] logits.
    """
    tokens = torch.tensor([ids], dtype=torch.long, device=lm.device)
    logits, state = lm.forward_last(tokens, state, 1)
    return require_finite(logits[0, -1], "the logits after the prompt"), state


@dataclass
class Generation:
    """A greedy continuation: its text (cut before any stop string), tokens and why it ended."""

    text: str
    tokens: list[int]
    stop_reason: str  # "eos", "stop" or "length"


def greedy_generate(
    lm: StreamingLM, logits: torch.Tensor, state: State, max_new_tokens: int, stop: list[str] | None = None
) -> Generation:
    """Greedy decoding from the logits of the last prompt token, one token per call on the carried state.

    Stops at EOS, at the first occurrence of any `stop` string in the decoded text (the text is cut
    there), or after `max_new_tokens` tokens.
    """
    stop = [s for s in (stop or []) if s]
    tokens: list[int] = []
    text = ""
    while len(tokens) < max_new_tokens:
        token = int(torch.argmax(logits))
        if token == lm.tokenizer.eos_id:
            return Generation(text, tokens, "eos")
        tokens.append(token)
        text = lm.tokenizer.decode(tokens)
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            return Generation(text[:cut], tokens, "stop")
        if len(tokens) == max_new_tokens:
            break
        step, state = lm.forward(torch.tensor([[token]], device=lm.device), state)
        logits = require_finite(step[0, -1], "the logits of a generated token")
    return Generation(text, tokens, "length")


READ_TOKENS = 2048  # tokens per call while reading a long prompt: activations stay the same size at any length


def read(
    lm: StreamingLM, ids: Sequence[int] | np.ndarray, state: State, logits: bool = True
) -> tuple[torch.Tensor | None, State]:
    """Feed `ids` into `state` in calls of at most READ_TOKENS tokens; with `logits`, return the last position's
    logits [V] (the output layer runs there only), so memory stays flat however long the prompt."""
    ids = np.asarray(ids, dtype=np.int64)
    end = len(ids) - 1 if logits else len(ids)
    for start in range(0, end, READ_TOKENS):
        piece = torch.from_numpy(ids[start : min(start + READ_TOKENS, end)]).to(lm.device)[None]
        state = lm.advance(piece, state)
    if not logits:
        return None, state
    out, state = lm.forward_last(torch.from_numpy(ids[-1:]).to(lm.device)[None], state, 1)
    return require_finite(out[0, -1], "the logits after the prompt"), state


def generate_branches(
    lm: StreamingLM, prompts: Sequence[np.ndarray], state: State, max_new_tokens: int, stop: list[str] | None = None,
    shared: bool = True, after_prompt: Callable[[State], None] | None = None,
) -> tuple[list[Generation], int]:  # fmt: skip
    """Greedy answers to prompts that continue `state` (which is not changed), and the tokens the model read.

    With `shared`, a prompt's start shared with the next prompt is read once: a trunk state reads up to there,
    and each prompt branches from a copy of it (prompts that share long starts, in order: a haystack with its
    needle further and further in). Otherwise every prompt is read whole from a copy of `state`.
    `after_prompt` sees each prompt's state once it is read.
    """
    answers: list[Generation] = []
    trunk, at, read_count = state.clone(), 0, 0
    trunk_ids = np.zeros(0, dtype=np.int64)  # what the trunk has read
    for i, ids in enumerate(prompts):
        if shared:
            nxt = prompts[i + 1] if i + 1 < len(prompts) else ids
            common = min(_common_prefix(ids, nxt), len(ids) - 1)
            if common < at or _common_prefix(ids, trunk_ids) < at:
                trunk, at = state.clone(), 0  # the trunk read tokens this prompt does not start with: start over
            _, trunk = read(lm, ids[at:common], trunk, logits=False)
            read_count += common - at
            at, trunk_ids = common, ids[:common]
            branch = trunk.clone() if i + 1 < len(prompts) else trunk
            logits, branch = read(lm, ids[common:], branch)
            read_count += len(ids) - common
        else:
            logits, branch = read(lm, ids, state.clone())
            read_count += len(ids)
        if after_prompt is not None:
            after_prompt(branch)
        answers.append(greedy_generate(lm, logits, branch, max_new_tokens, stop))
    return answers, read_count


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n
