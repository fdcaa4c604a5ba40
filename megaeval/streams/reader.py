"""Reading a books stream made by `megaeval prep-books`: tokens.bin (memory-mapped) + manifest.json, verified."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import fail
from ..files import cached_file_sha256
from ..models.base import Tokenizer
from .format import LITTLE_ENDIAN, MANIFEST_FILE, validate_manifest


@dataclass
class TextSpan:
    """How much text a span of target tokens covers (for bits per byte and word perplexity)."""

    bytes: int
    words: int
    exact_books: int  # books wholly inside the span: counts from their original text
    partial_books: int  # books cut by the span's ends: counts from decoding the covered tokens


class BooksStream:
    """A tokenized books stream: `tokens` is a read-only memory map of `total_tokens` ids.

    Opening one validates the manifest and checks tokens.bin against its recorded sha256 (hashed
    once per file version, see `cached_file_sha256`), so no number is ever computed from edited tokens.
    """

    def __init__(self, path: str | Path, verify: bool = True):
        self.path = Path(path)
        manifest_path = self.path / MANIFEST_FILE
        if not self.path.is_dir():
            what = "is a file, not a stream folder" if self.path.exists() else "not found"
            raise fail(f"stream directory {self.path} {what}", "build one with `megaeval prep-books ... --out DIR`")
        if not manifest_path.is_file():
            raise fail(
                f"{self.path} has no {MANIFEST_FILE}", "it is not a complete stream; re-run `megaeval prep-books`"
            )
        raw = manifest_path.read_bytes()
        try:
            manifest = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise fail(f"{manifest_path} is not valid JSON ({e})", "re-run `megaeval prep-books`") from None
        self.manifest: dict[str, Any] = validate_manifest(manifest, manifest_path)
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        self.tokens_path = self.path / self.manifest["tokens_file"]
        dtype = np.dtype(LITTLE_ENDIAN[self.manifest["dtype"]])
        expected = self.manifest["total_tokens"] * dtype.itemsize
        if not self.tokens_path.is_file() or self.tokens_path.stat().st_size != expected:
            size = f"{self.tokens_path.stat().st_size} bytes" if self.tokens_path.is_file() else "missing"
            raise fail(
                f"{self.tokens_path} should hold {expected} bytes ({len(self)} tokens) but is {size}",
                "the stream is incomplete or corrupt; re-run `megaeval prep-books`",
            )
        self.tokens_sha256 = self.manifest["tokens_sha256"]
        if verify:
            try:
                actual = cached_file_sha256(self.tokens_path)
            except OSError as e:
                raise fail(
                    f"cannot read {self.tokens_path}: {e.strerror or e}", "check the file's permissions"
                ) from None
            if actual != self.tokens_sha256:
                raise fail(
                    f"{self.tokens_path} does not match its manifest (sha256 {actual[:12]}, manifest says "
                    f"{self.tokens_sha256[:12]}): the tokens were changed after prep-books",
                    "re-run `megaeval prep-books` to rebuild the stream",
                )
        self.tokens = np.memmap(self.tokens_path, dtype=dtype, mode="r") if expected else np.zeros(0, dtype)

    def __len__(self) -> int:
        return int(self.manifest["total_tokens"])

    @property
    def tokenizer_info(self) -> dict[str, Any]:
        return self.manifest["tokenizer"]

    def check_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Refuse a model whose tokenizer differs from the one the stream was made with."""
        mine = self.tokenizer_info
        theirs = tokenizer.describe()
        if mine.get("sha256") != theirs.get("sha256") or mine.get("vocab_size") != theirs.get("vocab_size"):
            raise fail(
                f"tokenizer mismatch: the stream {self.path} was tokenized with {mine.get('path')} "
                f"(sha256 {str(mine.get('sha256'))[:12]}, vocab {mine.get('vocab_size')}) but the model uses "
                f"{theirs.get('path')} (sha256 {str(theirs.get('sha256'))[:12]}, vocab {theirs.get('vocab_size')})",
                "re-run `megaeval prep-books --model MODEL` to tokenize the books with the model's tokenizer",
            )

    def text_span(self, start: int, end: int, tokenizer: Tokenizer) -> TextSpan:
        """Bytes and words of the text that stream positions [start, end) spell.

        A book wholly inside the span counts its original text (UTF-8 bytes, whitespace-separated
        words). A book the span cuts counts the text decoded from its covered tokens. BOS and EOS
        count nothing.
        """
        bos, eos = int(self.manifest["bos"]), int(self.manifest["eos"])
        total = TextSpan(0, 0, 0, 0)
        for book in self.manifest["books"]:
            first = book["offset"] + bos  # first text token
            last = first + book["tokens"]  # one past the last text token
            if last + eos <= start or book["offset"] >= end:
                continue
            lo, hi = max(first, start), min(last, end)
            if lo <= first and hi >= last:
                total.bytes += book["bytes"]
                total.words += book["words"]
                total.exact_books += 1
            elif hi > lo:
                text = tokenizer.decode([int(t) for t in self.tokens[lo:hi]])
                total.bytes += len(text.encode("utf-8"))
                total.words += len(text.split())
                total.partial_books += 1
        return total

    def book_texts(self) -> dict[str, str]:
        """Each book's text by its sha256, read again from the sources prep-books read (where the paths recorded in
        the manifest still lead); a source that cannot be read, or a book not found there, is refused."""
        from ..data_prep.book_sources import open_source, read_book
        from ..errors import MegaevalError

        wanted = {book["sha256"] for book in self.manifest["books"]}
        texts: dict[str, str] = {}
        field = self.manifest.get("text_field") or "text"
        for index, src in enumerate(self.manifest["sources"]):
            try:
                for _, _, path, text in open_source(src["path"], field).tasks(index, field):
                    text = read_book(Path(path))[1] if path is not None else text
                    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
                    if sha in wanted:
                        texts[sha] = text
            except MegaevalError as e:
                problem = str(e).split("; ")[0]
                raise fail(
                    f"cannot read the books of {self.path} again from its source {src['path']} ({problem})",
                    "run from the folder prep-books ran in, so that the source's path leads to it",
                ) from None
        for book in self.manifest["books"]:
            if book["sha256"] not in texts:
                raise fail(f"book {book['id']} of {self.path} is not in its source any more ({book['sha256'][:12]})",
                           "re-run `megaeval prep-books` on the sources as they are now")  # fmt: skip
        return texts

    def describe(self) -> dict[str, Any]:
        """Facts recorded in reports."""
        m = self.manifest
        return {
            "stream": str(self.path),
            "manifest_sha256": self.manifest_sha256,
            "tokens_sha256": self.tokens_sha256,
            "total_tokens": len(self),
            "books": len(m["books"]),
            "seed": m.get("seed"),
            "bos": m.get("bos"),
            "eos": m.get("eos"),
            "tokenizer_sha256": m["tokenizer"].get("sha256"),
        }
