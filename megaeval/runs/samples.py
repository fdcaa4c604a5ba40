"""What a samples file keeps of a prompt: its first and last HEAD characters (a 100K-token prompt stays a line)."""

from __future__ import annotations

from typing import Any

HEAD = 300  # characters of a prompt's start and end kept in the samples file
EDGE_TOKENS = 160  # tokens decoded at each end of a prompt known only by its ids (enough for HEAD characters)


def prompt_ends(text: str) -> dict[str, str]:
    """`prompt_head` and `prompt_tail` of a prompt's text."""
    return {"prompt_head": text[:HEAD], "prompt_tail": text[-HEAD:]}


def decoded_ends(tokenizer: Any, ids: list[int]) -> dict[str, str]:
    """`prompt_head` and `prompt_tail` of a prompt known by its token ids: each end decoded alone (a long prompt is
    never decoded whole; special tokens such as BOS decode to nothing)."""
    ids = [int(i) for i in ids]
    if len(ids) <= 2 * EDGE_TOKENS:
        return prompt_ends(tokenizer.decode(ids))
    return {"prompt_head": tokenizer.decode(ids[:EDGE_TOKENS])[:HEAD],
            "prompt_tail": tokenizer.decode(ids[-EDGE_TOKENS:])[-HEAD:]}  # fmt: skip
