"""Running `scrolls` while recording what it reads: the prefix each task reads once, and each example's prompt."""

from __future__ import annotations

from typing import Any


def run_recording(monkeypatch: Any, settings: Any) -> tuple[dict, dict]:
    """Run scrolls, recording the prefix each task reads (`seen["prefix"]`), the tokenizer, and every example's
    prompt tokens with the length of the state it starts from (`seen["prompt"]`: (ids, length or None))."""
    from megaeval.commands.scrolls import run_scrolls
    from megaeval.scoring import answering

    seen: dict = {"prefix": [], "prompt": []}
    read, prompts_read = answering.read_prefix, answering.read_prompts

    def read_prefix(lm, ids):
        seen["prefix"].append(list(ids))
        seen["tokenizer"] = lm.tokenizer
        return read(lm, ids)

    def read_prompts(lm, prompts, state, *args):
        start = state.length if hasattr(state, "length") else None
        seen["prompt"] += [(list(ids), start) for ids in prompts]
        return prompts_read(lm, prompts, state, *args)

    monkeypatch.setattr(answering, "read_prefix", read_prefix)
    monkeypatch.setattr(answering, "read_prompts", read_prompts)
    return run_scrolls(settings, progress=False), seen
