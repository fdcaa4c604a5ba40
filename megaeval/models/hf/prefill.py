"""How a transformers model reads tokens whose logits are not all needed (a prompt): the prefill rule.

Rules: `one-call`, every token in one model call, which on a fresh state of unpadded rows is the attention
implementation's causal fast path (sdpa with is_causal, flash attention where loaded: no mask tensor); `steps-N`,
calls of N tokens, each attending to the cache so far through an explicit mask. `auto` (the `prefill` model option's
default) picks, per prompt, the rule measured fastest for its device, dtype and length (MEASURED, from
`bench/prefill_rules.py`; bench/RESULTS.md holds the table). Every rule gives the same logits up to rounding
(tests/models/hf/test_prefill.py, float64).

A call that continues a cache (a question after a shared document) or reads left-padded rows needs that mask:
[rows, 1, new tokens, cached + new tokens] booleans. Such calls are cut so that the mask stays within
MASK_ELEMENTS; a prompt that needed a cut of a `one-call` rule falls back to steps and the count says so.
Logits wanted at many positions (scoring) come STEP_TOKENS positions per call whatever the rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ...errors import fail

STEP_TOKENS = 512  # tokens per call when logits are wanted at every position: bounds the [B, step, V] logits
MASK_ELEMENTS = 1 << 28  # the most mask entries one call may build (256 MiB of booleans)
DEFAULT = "auto"

# Measured on one CPU thread (bench/prefill_rules.py, bench/RESULTS.md, 2026-11-29): for each (device type, dtype),
# (up to this many tokens, the fastest rule) in order; the last entry covers every longer prompt. Where nothing was
# measured (a GPU), one call: the causal fast path of the attention implementation.
MEASURED: dict[tuple[str, torch.dtype], list[tuple[int, str]]] = {}
UNMEASURED = "one-call"

_forced: list[str] = []


def parse(rule: str) -> str:
    """A `prefill` option's value checked: auto, one-call or steps-N (N a positive number of tokens)."""
    text = str(rule).strip().lower()
    if text in ("auto", "one-call"):
        return text
    if text.startswith("steps-") and text[6:].isdigit() and int(text[6:]) > 0:
        return f"steps-{int(text[6:])}"
    raise fail(f"bad prefill rule {rule!r}", "write prefill=auto, prefill=one-call or prefill=steps-N (e.g. steps-512)")


@contextmanager
def forced(rule: str) -> Iterator[None]:
    """Every read inside uses `rule` whatever a model's option says (benchmarks and tests compare rules)."""
    _forced.append(parse(rule))
    try:
        yield
    finally:
        _forced.pop()


def measured_rule(device: torch.device, dtype: torch.dtype, tokens: int) -> str:
    """The rule measured fastest for a fresh read of `tokens` tokens on this device type and dtype."""
    for up_to, rule in MEASURED.get((device.type, dtype), []):
        if tokens <= up_to:
            return rule
    table = MEASURED.get((device.type, dtype))
    return table[-1][1] if table else UNMEASURED


class Prefill:
    """A model's prefill rule, and a count of the reads each rule made and the tokens they read (the report's
    `model.prefill`)."""

    def __init__(self, option: str = DEFAULT):
        self.option = parse(option)
        self.used: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()  # tokens read (rows × tokens, padding included), by rule

    def plan(
        self, tokens: int, cached: int, rows: int, padded: bool, device: torch.device, dtype: torch.dtype
    ) -> list[int]:  # fmt: skip
        """The sizes of the calls that read `tokens` tokens (no logits needed but the last) onto `cached` tokens of
        `rows` rows, as the rule says; counted in `used` and `tokens` when more than one token a row."""
        rule = _forced[-1] if _forced else self.option
        if rule == "auto":
            rule = measured_rule(device, dtype, cached + tokens)
        step = tokens if rule == "one-call" else int(rule.split("-")[1])
        masked = cached > 0 or padded  # a call that needs the explicit mask
        if masked:
            room = MASK_ELEMENTS // max(rows * (cached + tokens), 1)
            if step > room:
                step = max(room, 1)
                rule = f"{rule} (mask cut to steps-{step})" if rule == "one-call" else rule
        if tokens > 1:  # a read; one token a row is a decoding step
            self.used[rule] += 1
            self.tokens[rule] += tokens * rows
        sizes, left = [], tokens
        while left > 0:
            sizes.append(min(step, left))
            left -= sizes[-1]
        return sizes

    def describe(self) -> dict[str, object]:
        """The option, and how many reads each rule made and the tokens they read (this process)."""
        return {"rule": self.option, "reads": dict(sorted(self.used.items())),
                "tokens": dict(sorted(self.tokens.items()))}  # fmt: skip
