"""SentencePiece tokenizer with the official MEGALODON special-token rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import fail
from .files import file_sha256


class SentencePieceTokenizer:
    """A sentencepiece model plus `additional_vocab_size` placeholder ids after its own vocabulary.

    As in the official loader, BOS/EOS come from the sentencepiece model when it defines them (or when
    there is no additional vocabulary); otherwise they take the first additional ids, BOS then EOS.
    """

    adds_bos = True  # Llama 2's convention (and MEGALODON's): every text starts with BOS (`--bos auto`)

    def __init__(self, path: str | Path, additional_vocab_size: int = 0):
        import sentencepiece as spm

        self.path = Path(path)
        if not self.path.is_file():
            raise fail(f"tokenizer file not found: {self.path}", "pass tokenizer=PATH to point at the .model file")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except Exception as e:  # sentencepiece raises bare RuntimeError/OSError on bad files
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0].replace(str(self.path), "the file")
            raise fail(
                f"cannot read sentencepiece model {self.path} ({reason})",
                "pass a sentencepiece .model file (the tokenizer the model was trained with)",
            ) from None
        self.sp_vocab_size = self.sp.get_piece_size()
        self.additional_vocab_size = int(additional_vocab_size)
        self.vocab_size = self.sp_vocab_size + self.additional_vocab_size
        used = 0
        ids = {}
        for name, sp_id in (("bos", self.sp.bos_id()), ("eos", self.sp.eos_id())):
            if sp_id != -1 or self.additional_vocab_size == 0:
                ids[name] = sp_id
            else:
                ids[name] = self.sp_vocab_size + used
                used += 1
        self.bos_id: int = ids["bos"]
        self.eos_id: int = ids["eos"]
        self._sha256: str | None = None

    @property
    def sha256(self) -> str:
        """Checksum of the tokenizer file (identifies the tokenizer in manifests and reports)."""
        if self._sha256 is None:
            self._sha256 = file_sha256(self.path)
        return self._sha256

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS."""
        return self.sp.encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        """Token ids of `text` as an int32 array, without building a Python int per token."""
        if hasattr(self.sp, "encode_as_numpy"):
            return np.asarray(self.sp.encode_as_numpy(text), dtype=np.int32)
        return np.asarray(self.sp.encode(text), dtype=np.int32)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; placeholder ids past the sentencepiece vocabulary decode to nothing."""
        return self.sp.decode([i for i in ids if 0 <= i < self.sp_vocab_size])

    def describe(self) -> dict:
        """Facts recorded in reports."""
        return {
            "kind": "sentencepiece",
            "path": str(self.path),
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "additional_vocab_size": self.additional_vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }
