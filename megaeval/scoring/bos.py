"""The BOS policy (`--bos auto|always|never`, the harness's `bos=` model arg): checked once by `bos_policy`,
read for a model by `resolve_bos`."""

from __future__ import annotations

from ..errors import fail
from ..models.base import StreamingLM

BOS_POLICIES = ("auto", "always", "never")


def bos_policy(value: str | bool, what: str = "--bos") -> str:
    """A BOS policy checked: auto, always or never (True and False, the old flag's values: always, never).
    `what` names where the value came from in the error (the CLI flag, or the harness's model arg)."""
    if isinstance(value, bool):
        return "always" if value else "never"
    if value not in BOS_POLICIES:
        raise fail(f"unknown {what} {value!r}", f"use one of: {', '.join(BOS_POLICIES)}")
    return value


def resolve_bos(lm: StreamingLM, policy: str | bool) -> bool:
    """Whether contexts start with BOS under `policy` (auto, always, never; True/False mean always/never).

    auto follows the model's own convention: a transformers tokenizer's, i.e. BOS only if encoding a text
    with its special tokens adds one (what transformers users and lm-evaluation-harness's HFLM get by
    default); sentencepiece Llama-style families (MEGALODON, RFA) add BOS, as Llama 2 and the paper do.
    """
    policy = bos_policy(policy)
    has_bos = lm.tokenizer.bos_id is not None and lm.tokenizer.bos_id >= 0
    if policy == "never":
        return False
    if policy == "always":
        if not has_bos:
            raise fail("the model's tokenizer has no BOS token", "pass --bos never (or auto)")
        return True
    return has_bos and bool(getattr(lm.tokenizer, "adds_bos", True))
