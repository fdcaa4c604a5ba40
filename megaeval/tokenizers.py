"""SentencePiece tokenizer with the official MEGALODON special-token rules, and the checks every model's tokenizer
passes when it is loaded (whatever its family)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .errors import fail
from .files import file_sha256

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
MIN_VOCAB = 16  # a text model's tokenizer has hundreds of entries; what transformers builds from no files has 2
# The files a transformers tokenizer is read from; a folder with none of them holds no tokenizer (custom ones,
# tiktoken's say, come with a tokenizer_config.json naming their class)
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
    "sentencepiece.bpe.model", "tekken.json",
)  # fmt: skip


def byte_to_char(text: str) -> np.ndarray:
    """For each UTF-8 byte offset 0..len(bytes) of `text`, the number of characters that start before it (the
    character offset of a byte offset on a character boundary)."""
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    starts = (data & 0xC0) != 0x80
    return np.concatenate([[0], np.cumsum(starts)])


def encode_offsets(tokenizer: Any, text: str, specials: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """`tokenizer.encode_offsets`, or a one-line refusal for a tokenizer that cannot map tokens to characters."""
    method = getattr(tokenizer, "encode_offsets", None)
    if method is None:
        kind = tokenizer.describe().get("kind", type(tokenizer).__name__)
        raise fail(f"the {kind} tokenizer cannot give character offsets, which LongPPL's key tokens need",
                   "use a model with a sentencepiece or transformers tokenizer")  # fmt: skip
    return method(text, specials)


def check_tokenizer_files(folder: Path, fix: str) -> None:
    """Refuse a folder that holds none of the files a transformers tokenizer is read from: transformers would
    build an empty tokenizer from the model's config.json alone, without a word."""
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        expected = ", ".join(name for name in TOKENIZER_FILES if name != "tokenizer_config.json")
        raise fail(f"{folder} holds no tokenizer files (expected one of {expected})", fix)


def check_tokenizer(tok: Any, fix: str) -> None:
    """Refuse a tokenizer that cannot be a text model's: a vocabulary of a few entries, or ordinary text encoded to
    no tokens at all (a tokenizer built without its vocabulary). One call per load, on a short sentence."""

    def where() -> str:
        return f"the tokenizer at {tok.describe().get('path')}"

    if tok.vocab_size < MIN_VOCAB:
        raise fail(f"{where()} has only {tok.vocab_size} entries, too few for a text model's vocabulary", fix)
    try:
        ids = tok.encode(PROBE_TEXT)
    except Exception as e:  # a broken tokenizer raises anything
        reason = " ".join(str(e).split())[:100] or type(e).__name__
        raise fail(f"{where()} cannot encode text ({reason})", fix) from None
    if len(ids) == 0:
        raise fail(f"{where()} encodes ordinary text ({PROBE_TEXT!r}) to no tokens", fix)


def tokenizer_option(value: str | Path, family: str, folder: bool) -> Path:
    """The path a `tokenizer=` model option names, checked: not empty, there, and a folder of transformers
    tokenizer files (`folder`) or a sentencepiece .model file, as the family takes it."""
    text = str(value).strip()
    kind = "a folder of transformers tokenizer files" if folder else "a sentencepiece .model file"
    if not text:
        raise fail("option tokenizer= is empty", f"write tokenizer=PATH ({kind}) or leave the option out")
    path = Path(text).expanduser()
    if not path.exists():
        raise fail(f"tokenizer not found at {path}", f"pass --model-args tokenizer=PATH ({kind})")
    if folder and not path.is_dir():
        raise fail(f"tokenizer={path} is a file, but {family} models take {kind}", f"pass tokenizer={path.parent}")
    if not folder and path.is_dir():
        inside = path / "tokenizer.model"
        fix = f"pass tokenizer={inside}" if inside.is_file() else "pass tokenizer=PATH of the .model file"
        raise fail(f"tokenizer={path} is a folder, but {family} models take {kind}", fix)
    return path


class SentencePieceTokenizer:
    """A sentencepiece model plus `additional_vocab_size` placeholder ids after its own vocabulary.

    As in the official loader, BOS/EOS come from the sentencepiece model when it defines them (or when
    there is no additional vocabulary); otherwise they take the first additional ids, BOS then EOS.
    """

    adds_bos = True  # Llama 2's convention (and MEGALODON's): every text starts with BOS (`--bos auto`)

    def __init__(self, path: str | Path, additional_vocab_size: int = 0):
        import sentencepiece as spm

        self.path = Path(path)
        if self.path.is_dir():
            raise fail(f"tokenizer {self.path} is a folder, not a sentencepiece .model file",
                       "pass the path of the .model file itself")  # fmt: skip
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

    def encode_offsets(self, text: str, specials: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` and each token's (start, end) character span in it, sentencepiece's own surfaces (a
        byte-fallback piece that starts a character is empty; the one that ends it holds it). `specials`: BOS first
        when the tokenizer adds one (span (0, 0)), as a transformers tokenizer's default encoding does."""
        try:
            proto = self.sp.encode(text, return_type="proto")
        except TypeError:  # sentencepiece before 0.2.1 names it out_type="immutable_proto"
            proto = self.sp.encode(text, out_type="immutable_proto")
        char_at = byte_to_char(text)
        ids = [p.id for p in proto.pieces]
        offsets = [(int(char_at[p.begin]), int(char_at[p.end])) for p in proto.pieces]
        if specials and self.adds_bos and self.bos_id >= 0:
            return [self.bos_id, *ids], [(0, 0), *offsets]
        return ids, offsets

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
