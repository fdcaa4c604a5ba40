"""How each next token of a continuation is chosen (greedy, or drawn at a temperature from a row's own seeded
generator), and when a continuation ends: the one rule every decoding loop in `scoring.generate` applies."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import fail
from ..models.base import StreamingLM


@dataclass
class Generation:
    """A continuation: its text (cut before any stop string), tokens and why it ended; from a server, `served` holds
    what the server said of it (finish_reason, usage counts, latency) and `tokens` is empty: `n_tokens` counts."""

    text: str
    tokens: list[int]
    stop_reason: str  # "eos", "stop" (a stop string), "stop_id" (one of `Decoding.stop_ids`) or "length"
    served: dict | None = None

    @property
    def n_tokens(self) -> int:
        """How many tokens were generated (a server's completion_tokens)."""
        return len(self.tokens) if self.served is None else int(self.served.get("completion_tokens") or 0)


# Sampling divides float32 logits by the temperature: below float32's smallest normal number the temperature itself is
# not held (1e-46 is 0 in float32), so that is the smallest temperature a run can sample at.
MIN_TEMPERATURE = float(torch.finfo(torch.float32).tiny)


def unit_seed(seed: int, *key: Any) -> int:
    """A sampled answer's seed, its own for each unit (`key`: a question id and turn, a record id): from --seed and
    the key alone, so that reruns, resumes, ranks and any batching draw the same tokens."""
    digest = hashlib.sha256(json.dumps([seed, *key]).encode()).hexdigest()
    return int(digest[:15], 16)


def check_temperature(temperature: float, flag: str = "temperature") -> float:
    """A sampling temperature checked before any work: 0 (greedy), or a finite number float32 sampling can divide by
    (at least MIN_TEMPERATURE)."""
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise fail(f"bad {flag} {temperature!r}", "pass 0 (greedy) or a positive finite temperature")
    if 0 < temperature < MIN_TEMPERATURE:
        raise fail(f"{flag} {temperature:g} is below {MIN_TEMPERATURE:.4g}, the smallest temperature float32 sampling "
                   "can divide by", f"pass 0 for greedy decoding, or at least {MIN_TEMPERATURE:.4g}")  # fmt: skip
    return temperature


@dataclass(frozen=True)
class Decoding:
    """How a continuation's tokens are chosen, beyond greedy decoding to EOS, stop strings or the length limit.

    `temperature` 0 takes the argmax (greedy, the default); above 0, row i's tokens are drawn from
    softmax(logits / temperature) in float32 by a CPU `torch.Generator` of its own seeded with `seeds[i]` (one seed
    per prompt, in the order the rows are given), so a row's tokens depend on its own logits and seed only, not on
    the batch. A token in `stop_ids` ends the continuation as EOS does (transformers' `generate(eos_token_id=[eos,
    id])`), but is kept in its tokens and text; stop reason "stop_id". Before `min_new_tokens` tokens, EOS and the
    stop ids cannot be chosen (their logits are -inf, as transformers' MinLengthLogitsProcessor sets them)."""

    temperature: float = 0.0
    seeds: tuple[int, ...] | None = None
    stop_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0

    def __post_init__(self) -> None:
        check_temperature(self.temperature)
        if self.temperature > 0 and self.seeds is None:
            raise fail(f"sampling at temperature {self.temperature} without seeds", "pass one seed per prompt")
        if self.min_new_tokens < 0:
            raise fail(f"bad min_new_tokens {self.min_new_tokens}", "pass 0 or a positive number of tokens")

    def generator(self, index: int) -> torch.Generator | None:
        """Row `index`'s own random numbers (None when greedy): a CPU generator seeded with its seed."""
        if self.temperature == 0:
            return None
        assert self.seeds is not None
        if index >= len(self.seeds):
            raise fail(f"no sampling seed for prompt {index + 1} ({len(self.seeds)} seeds)", "pass one per prompt")
        return torch.Generator().manual_seed(self.seeds[index])


GREEDY = Decoding()


@dataclass
class Row:
    """A continuation being decoded: where its answer goes, how its tokens are chosen, its tokens so far and their
    text."""

    index: int
    tokens: list[int]
    decoding: Decoding = GREEDY
    text: str = ""
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.generator = self.decoding.generator(self.index)

    def choose(self, lm: StreamingLM, logits: torch.Tensor) -> int:
        """The row's next token from its logits [V]: the argmax, or a draw from its own generator."""
        decoding = self.decoding
        if len(self.tokens) < decoding.min_new_tokens:
            barred = [t for t in (lm.tokenizer.eos_id, *decoding.stop_ids) if t is not None and t >= 0]
            logits = logits.clone()
            logits[barred] = -torch.inf
        if decoding.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits.detach().to("cpu", torch.float32)
        scaled = logits / decoding.temperature
        if torch.isposinf(scaled).any():  # a tiny temperature overflows: the same distribution, the largest logit 0
            scaled = (logits - logits.max()) / decoding.temperature
        probs = torch.softmax(scaled, -1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def next_step(lm: StreamingLM, row: Row, token: int, max_new_tokens: int, stop: list[str]) -> Generation | None:
    """One chosen token for a row, the one rule of every decoding loop here: the row's Generation if it ends here."""
    if max_new_tokens < 1:
        return Generation("", [], "length")
    if token == lm.tokenizer.eos_id:
        return Generation(row.text, row.tokens, "eos")
    row.tokens.append(token)
    row.text = lm.tokenizer.decode(row.tokens)
    cut = min((i for i in (row.text.find(s) for s in stop) if i >= 0), default=-1)
    if cut >= 0:
        return Generation(row.text[:cut], row.tokens, "stop")
    if token in row.decoding.stop_ids:  # after the stop strings: a stop string in its text cuts the text there
        return Generation(row.text, row.tokens, "stop_id")
    if len(row.tokens) == max_new_tokens:
        return Generation(row.text, row.tokens, "length")
    return None
