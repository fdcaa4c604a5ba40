"""A transformers tokenizer behind megaeval's Tokenizer protocol, and whether it adds BOS by itself."""

from __future__ import annotations

import hashlib
import json
from typing import Any


class HFTokenizer:
    """A transformers tokenizer seen through megaeval's Tokenizer protocol (no special tokens added)."""

    def __init__(self, tok: Any, source: str):
        self.tok = tok
        self.tok.model_max_length = 1 << 62  # megaeval handles lengths; silence "sequence too long"
        self.source = source
        self.vocab_size = len(tok)
        self.bos_id = tok.bos_token_id
        self.eos_id = tok.eos_token_id
        self._sha256: str | None = None
        self.adds_bos = adds_bos_by_default(tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS."""
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @property
    def sha256(self) -> str:
        """Checksum of the tokenizer's content (same for a directory and a GGUF copy of it)."""
        if self._sha256 is None:
            backend = getattr(self.tok, "backend_tokenizer", None)
            content = backend.to_str() if backend is not None else json.dumps(self.tok.get_vocab(), sort_keys=True)
            specials = json.dumps(self.tok.special_tokens_map, sort_keys=True, default=str)
            self._sha256 = hashlib.sha256((content + specials).encode()).hexdigest()
        return self._sha256

    def describe(self) -> dict[str, Any]:
        return {
            "kind": f"transformers:{type(self.tok).__name__}",
            "path": self.source,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "adds_bos": self.adds_bos,
        }


def adds_bos_by_default(tok: Any) -> bool:
    """Whether encoding a text with the tokenizer's special tokens (its default) puts BOS first: what
    transformers users, and lm-evaluation-harness's HFLM without add_bos_token, feed the model."""
    bos = tok.bos_token_id
    if bos is None:
        return False
    probe = "Hello world"
    with_specials = tok(probe)["input_ids"]
    plain = tok(probe, add_special_tokens=False)["input_ids"]
    return with_specials[:1] == [bos] and plain[:1] != [bos]


__all__ = ["HFTokenizer", "adds_bos_by_default"]
