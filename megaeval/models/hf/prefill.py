"""How a transformers model reads tokens whose logits are not all needed (a prompt): the prefill rule.

Rules: `one-call`, every token in one model call, which on a fresh state of unpadded rows is the attention
implementation's causal fast path (sdpa with is_causal, flash attention where loaded: no mask tensor); `steps-N`,
calls of N tokens, each attending to the cache so far through an explicit mask. `auto` (the `prefill` model option's
default) picks, per read, the rule measured fastest for its device, dtype and length for a fresh read (MEASURED,
from `bench/prefill_rules.py`; bench/RESULTS.md holds the table), and MASKED for a read that needs a mask. Every rule
gives the same logits up to rounding (tests/models/test_hf_prefill.py, float64).

One call holds the activations of every token at once: about (3 × MLP width + 4 × hidden size) values a token
(`activation_bytes`), beside the KV cache it fills; calls are cut so that they stay within CALL_BYTES (SmolLM2-135M
in float32: 28 KB a token, one call up to 77K tokens). A call that continues a cache (a question after a shared
document) or reads left-padded rows needs that mask: [rows, 1, new tokens, cached + new tokens] booleans, kept within
MASK_ELEMENTS. A `one-call` read cut by either bound falls back to steps and the count says so (`one-call (memory
cut to steps-N)`). Logits wanted at many positions (scoring) come STEP_TOKENS positions per call whatever the rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ...errors import fail

STEP_TOKENS = 512  # tokens per call when logits are wanted at every position: bounds the [B, step, V] logits
MASK_ELEMENTS = 1 << 28  # the most mask entries one call may build (256 MiB of booleans)
CALL_BYTES = 2 << 30  # the most activations one call may hold (`activation_bytes` a token, times tokens and rows)
DEFAULT = "auto"

# Measured on one CPU thread of this project's 2-core x86-64 machine (bench/prefill_rules.py, bench/RESULTS.md,
# 2026-11-29, SmolLM2-135M): for each (device type, dtype), (up to this many tokens, the fastest rule) in order.
# float32: one call 1.17x, 1.21x and 1.28x faster than 512-token steps at 4K, 8K and 16K; bfloat16 at 4K: 512-token
# steps 4 % faster than one call (its matmuls dominate). Past the lengths measured, and where nothing was measured (a
# GPU), one call: the attention implementation's causal fast path skips the masked half, so its lead grows with length.
MEASURED: dict[tuple[str, torch.dtype], list[tuple[int, str]]] = {
    ("cpu", torch.float32): [(16384, "one-call")],
    ("cpu", torch.bfloat16): [(4096, "steps-512")],
}
UNMEASURED = "one-call"
# A read onto a cache, or of padded rows, needs the mask, and sdpa's CPU kernels with a mask are slower on one long call
# than on 512-token ones: a 3,584-token read onto 512 cached tokens took 40.8 s in one call and 28.3 s in 512-token
# steps (float32, one thread; bench/prefill_rules.py --cached 512). `auto` steps such reads on every device.
MASKED = "steps-512"

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
    """The rule measured fastest for a read of `tokens` tokens on this device type and dtype (UNMEASURED past the
    lengths measured)."""
    for up_to, rule in MEASURED.get((device.type, dtype), []):
        if tokens <= up_to:
            return rule
    return UNMEASURED


class Prefill:
    """A model's prefill rule, and a count of the reads each rule made and the tokens they read (the report's
    `model.prefill`)."""

    def __init__(self, option: str = DEFAULT):
        self.option = parse(option)
        self.used: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()  # tokens read (rows × tokens, padding included), by rule

    def plan(
        self, tokens: int, cached: int, rows: int, padded: bool, device: torch.device, dtype: torch.dtype,
        token_bytes: int = 0,
    ) -> list[int]:  # fmt: skip
        """The sizes of the calls that read `tokens` tokens (no logits needed but the last) onto `cached` tokens of
        `rows` rows, as the rule says (`token_bytes`: activations a token, `activation_bytes`); counted in `used`
        and `tokens` when more than one token a row."""
        rule = _forced[-1] if _forced else self.option
        masked = cached > 0 or padded  # a call that needs the explicit mask
        if rule == "auto":
            rule = MASKED if masked else measured_rule(device, dtype, cached + tokens)
        step = tokens if rule == "one-call" else int(rule.split("-")[1])
        room = CALL_BYTES // max(rows * token_bytes, 1)
        if masked:
            room = min(room, MASK_ELEMENTS // max(rows * (cached + tokens), 1))
        if step > room:
            step = max(room, 1)
            rule = f"{rule} (memory cut to steps-{step})" if rule == "one-call" else rule
        if tokens > 1:  # a read; one token a row is a decoding step
            self.used[rule] += 1
            self.tokens[rule] += tokens * rows
        return pieces(tokens, step)

    def describe(self) -> dict[str, object]:
        """The option, and how many reads each rule made and the tokens they read (this process)."""
        return {"rule": self.option, "reads": dict(sorted(self.used.items())),
                "tokens": dict(sorted(self.tokens.items()))}  # fmt: skip


def pieces(tokens: int, step: int) -> list[int]:
    """The sizes of calls of `step` tokens (the last one shorter) that read `tokens` tokens."""
    return [min(step, tokens - at) for at in range(0, tokens, step)]


def activation_bytes(config: object, dtype: torch.dtype) -> int:
    """About the bytes of activations one token holds inside a call: the MLP's gate, up and product (3 × its width)
    and a few hidden-size tensors (attention's input, output and residual: 4 × the hidden size)."""
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 0
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return (3 * int(width) + 4 * int(hidden)) * torch.empty(0, dtype=dtype).element_size()
