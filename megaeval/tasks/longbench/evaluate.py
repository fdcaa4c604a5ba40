"""From a LongBench prompt to the token ids a model reads (`fit_prompt`: the official middle truncation at the run's
limit, then the encoding), the samsum stop token, each v2 query's seed and the cost line's token estimates.

The limit: --max-prompt-tokens when given (the official rule, like for like); otherwise none for a
state-carrying model (it reads the whole prompt) and, for a fixed-context model, the most that leaves room for the
answer: max_context minus the generation budget minus the tokens the chat template and BOS add. The official
scripts pass a per-model maximum that their authors set below each model's context (3,500 for a 4K Llama 2) for the
same reason. A prompt whose cut text re-encodes past the room is cut at the largest limit that fits (default), or
refused in one line (an explicit --max-prompt-tokens)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import fail
from ...models.base import StreamingLM
from ...scoring.requests import Encoder

Truncate = Callable[[Any, str, int | None], tuple[str, int]]


@dataclass
class Prompt:
    """A prompt as the model reads it: ids, the text after truncation (and chat), tokens dropped, the limit used, and
    the task text after truncation alone (what a chat API's user turn holds)."""

    ids: np.ndarray
    text: str
    dropped: int
    limit: int | None
    cut: str = ""


def fit_prompt(
    lm: StreamingLM, encode: Encoder, prompt: str, budget: int, explicit: int | None, truncate: Truncate, where: str
) -> Prompt:  # fmt: skip
    """`prompt` cut in its middle (`truncate`) to the run's limit and encoded, fitting a fixed context with `budget`
    new tokens; `explicit` is --max-prompt-tokens (None: the default limit)."""

    def attempt(limit: int | None) -> tuple[Prompt, int]:
        text, dropped = truncate(lm.tokenizer, prompt, limit)
        ids, whole, _ = encode(text, "")
        over = 0 if lm.max_context is None else len(ids) + budget - lm.max_context
        return Prompt(ids, whole, dropped, limit, text), over

    if explicit is not None or lm.max_context is None:
        fitted, over = attempt(explicit)
        if over > 0:
            raise fail(f"{where}: the prompt is {len(fitted.ids):,} tokens after --max-prompt-tokens {explicit:,}, "
                       f"and with {budget} new tokens it passes {lm.spec}'s max_context {lm.max_context:,}",
                       f"pass --max-prompt-tokens {max(explicit - over, 2):,} or less, or leave it out (the default "
                       "fits the context)")  # fmt: skip
        return fitted
    overhead = len(encode("", "")[0])
    top = lm.max_context - budget - overhead
    if top < 2:
        raise fail(f"{where}: max_context {lm.max_context:,} leaves no room for a prompt, {overhead} template "
                   f"tokens and {budget} new ones", "use a model with a longer context")  # fmt: skip
    fitted, over = attempt(top)
    if over <= 0:
        return fitted
    # the cut text re-encodes longer than it was cut to (a character split between tokens decodes to U+FFFD, whose
    # bytes are several tokens): the largest limit whose prompt fits
    low, high, best = 2, top - 1, None
    while low <= high:
        middle = (low + high) // 2
        candidate, over = attempt(middle)
        if over <= 0:
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    if best is None:
        raise fail(f"{where}: no middle cut of the prompt fits max_context {lm.max_context:,} with {budget} new "
                   "tokens (the tokenizer re-encodes the cut text longer)",
                   "leave this task out (--tasks)")  # fmt: skip
    return best


def token_estimates(lm: StreamingLM, sample: str, sizes: list[int], limit: int | None) -> list[int]:
    """About how many tokens prompts of `sizes` characters are (at the tokens per character of the first 20,000
    characters of `sample`, at most `limit`): the progress bar's and the cost line's measure, never a number of the
    report. Encoding every prompt up front would take minutes on LongBench v2's 2M-word contexts."""
    head = sample[:20_000]
    per_char = len(lm.tokenizer.encode(head)) / max(len(head), 1)
    return [max(1, min(round(size * per_char), limit or size + 1)) for size in sizes]


def newline_id(lm: StreamingLM) -> int:
    """The token LongBench's samsum run also stops at: the last token of "\\n" encoded without special tokens."""
    ids = lm.tokenizer.encode("\n")
    if not ids:
        raise fail(f"{lm.spec}'s tokenizer encodes a newline as no token; samsum stops at one",
                   "leave samsum out (--tasks), or use a tokenizer that encodes newlines")  # fmt: skip
    return int(ids[-1])


def item_seed(seed: int, item_id: str, query: str) -> int:
    """The sampling seed of one query of one item: from --seed, the item's _id and which query (answer, reasoning),
    so an item draws the same tokens at any batch size, rank or order."""
    digest = hashlib.sha256(f"{seed}\0{item_id}\0{query}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
