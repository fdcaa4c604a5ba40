"""How an MRCR record's messages reach the model: through its chat template exactly as given (no system turn added:
the card sends `messages` as they are), or, for a model without one (`--render plain`, or `auto` on a base model),
as a plain transcript: each message as `Role: content` (`User`, `Assistant`, `System`), joined by a blank line,
then `Assistant:` for the model to continue. The transcript is megaeval's own convention for base models (the card
has none); the report records which rendering ran."""

from __future__ import annotations

RENDERS = ("auto", "template", "plain")


def plain_transcript(messages: list[dict[str, str]]) -> str:
    """The messages as a base model reads them (module docstring)."""
    turns = [f"{m['role'][:1].upper()}{m['role'][1:]}: {m['content']}" for m in messages]
    return "\n\n".join([*turns, "Assistant:"])
