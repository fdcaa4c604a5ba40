"""LongBench prompts as THUDM/LongBench builds them (2e00731): v1's `prompt.format(**record)` and its middle
truncation (LongBench/pred.py `get_pred`), v2's placeholders and its middle truncation (pred.py `query_llm`).

The two truncations differ, as the official ones do: v1 keeps `int(max/2)` tokens at each end and decodes the two
halves apart (their texts joined), v2 keeps `max//2` first and `-max//2` last (one more when max is odd) and decodes
them as one list. Both count the prompt's tokens with the tokenizer's special tokens (a transformers tokenizer's
default encoding) and decode without them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...tokenizers import encode_offsets

V2_FIELDS = (("$Q$", "question"), ("$C_A$", "choice_A"), ("$C_B$", "choice_B"), ("$C_C$", "choice_C"),
             ("$C_D$", "choice_D"))  # fmt: skip


def v1_prompt(template: str, record: dict[str, Any]) -> str:
    """A v1 record's prompt: the task's template filled with the record's fields (`str.format`)."""
    return template.format(**record)


def v2_prompt(template: str, item: dict[str, Any], context: str, cot: str | None = None) -> str:
    """A v2 item's prompt: `$DOC$`, then `$Q$`, `$C_A$` .. `$C_D$` (each stripped), then `$COT$`, replaced in that
    order, each in the text the previous replacements left (a placeholder inside the context is filled too, as the
    official chain of `str.replace` fills it)."""
    text = template.replace("$DOC$", context.strip())
    for placeholder, name in V2_FIELDS:
        text = text.replace(placeholder, item[name].strip())
    return text if cot is None else text.replace("$COT$", cot)


def special_ids(tokenizer: Any, text: str) -> np.ndarray:
    """The tokens of `text` with the tokenizer's special tokens (BOS where it adds one): what the official code
    counts."""
    return np.asarray(encode_offsets(tokenizer, text, specials=True)[0], dtype=np.int64)


def truncate_v1(tokenizer: Any, prompt: str, max_tokens: int | None) -> tuple[str, int]:
    """`prompt` over `max_tokens` tokens cut in its middle as LongBench/pred.py cuts it, and the tokens dropped."""
    if max_tokens is None:
        return prompt, 0
    ids = special_ids(tokenizer, prompt)
    if len(ids) <= max_tokens:
        return prompt, 0
    half = int(max_tokens / 2)
    head, tail = ids[:half].tolist(), ids[-half:].tolist()  # as the official slices: a limit under 2 keeps it all
    return tokenizer.decode(head) + tokenizer.decode(tail), len(ids) - len(head) - len(tail)


def truncate_v2(tokenizer: Any, prompt: str, max_tokens: int | None) -> tuple[str, int]:
    """`prompt` over `max_tokens` tokens cut in its middle as LongBench v2's pred.py cuts it, and the tokens
    dropped."""
    if max_tokens is None:
        return prompt, 0
    ids = special_ids(tokenizer, prompt)
    if len(ids) <= max_tokens:
        return prompt, 0
    kept = np.concatenate([ids[: max_tokens // 2], ids[-max_tokens // 2 :]])
    return tokenizer.decode(kept.tolist()), len(ids) - len(kept)
