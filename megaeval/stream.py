"""Reading a books stream made by `megaeval prep-books`: tokens.bin (memory-mapped) + manifest.json."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import fail
from .models.base import Tokenizer

SCHEMA_VERSION = 1


@dataclass
class TextSpan:
    """How much text a span of target tokens covers (for bits per byte and word perplexity)."""

    bytes: int
    words: int
    exact_books: int  # books wholly inside the span: counts from their original text
    partial_books: int  # books cut by the span's ends: counts from decoding the covered tokens


class BooksStream:
    """A tokenized books stream: `tokens` is a read-only memory map of `total_tokens` ids."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        manifest_path = self.path / "manifest.json"
        if not self.path.is_dir():
            raise fail(f"stream directory not found: {self.path}", "build one with `megaeval prep-books ... --out DIR`")
        if not manifest_path.is_file():
            raise fail(f"{self.path} has no manifest.json", "it is not a complete stream; re-run `megaeval prep-books`")
        raw = manifest_path.read_bytes()
        try:
            self.manifest: dict[str, Any] = json.loads(raw)
        except ValueError as e:
            raise fail(f"{manifest_path} is not valid JSON ({e})", "re-run `megaeval prep-books`") from None
        if self.manifest.get("kind") != "megaeval-books-stream":
            raise fail(f"{manifest_path} is not a megaeval books-stream manifest")
        if self.manifest.get("schema_version") != SCHEMA_VERSION:
            raise fail(
                f"{manifest_path} has schema_version {self.manifest.get('schema_version')}, expected {SCHEMA_VERSION}",
                "re-run `megaeval prep-books` with this megaeval version",
            )
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        tokens_path = self.path / self.manifest["tokens_file"]
        dtype = np.dtype(self.manifest["dtype"])
        expected = self.manifest["total_tokens"] * dtype.itemsize
        if not tokens_path.is_file() or tokens_path.stat().st_size != expected:
            size = tokens_path.stat().st_size if tokens_path.is_file() else "missing"
            raise fail(
                f"{tokens_path} should hold {expected} bytes ({self.manifest['total_tokens']} tokens) but is {size}",
                "the stream is incomplete or corrupt; re-run `megaeval prep-books`",
            )
        self.tokens = np.memmap(tokens_path, dtype=dtype, mode="r")

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

    def describe(self) -> dict[str, Any]:
        """Facts recorded in reports."""
        m = self.manifest
        return {
            "stream": str(self.path),
            "manifest_sha256": self.manifest_sha256,
            "tokens_sha256": m.get("tokens_sha256"),
            "total_tokens": len(self),
            "books": len(m["books"]),
            "seed": m.get("seed"),
            "bos": m.get("bos"),
            "eos": m.get("eos"),
            "tokenizer_sha256": m["tokenizer"].get("sha256"),
        }
