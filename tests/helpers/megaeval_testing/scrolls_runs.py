"""Running `scrolls` while recording what it reads: the prefix each task reads once, and each example's prompt."""

from __future__ import annotations

from typing import Any


def run_recording(monkeypatch: Any, settings: Any) -> tuple[dict, dict]:
    """Run scrolls, recording the prefix each task reads (`seen["prefix"]`), the tokenizer, and every example's
    prompt tokens with the length of the state it starts from (`seen["prompt"]`: (ids, length or None))."""
    from megaeval.commands import scrolls as scrolls_command
    from megaeval.commands.scrolls import run_scrolls
    from megaeval.tasks.scrolls import evaluate as scrolls_evaluate

    seen: dict = {"prefix": [], "prompt": []}
    read, fill = scrolls_command.read_prefix, scrolls_evaluate.prefill

    def read_prefix(lm, ids):
        seen["prefix"].append(list(ids))
        seen["tokenizer"] = lm.tokenizer
        return read(lm, ids)

    def prefill(lm, ids, state):
        seen["prompt"].append((list(ids), state.length if hasattr(state, "length") else None))
        return fill(lm, ids, state)

    monkeypatch.setattr(scrolls_command, "read_prefix", read_prefix)
    monkeypatch.setattr(scrolls_evaluate, "prefill", prefill)
    return run_scrolls(settings, progress=False), seen
