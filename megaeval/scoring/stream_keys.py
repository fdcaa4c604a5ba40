"""LongPPL in the sweep: each book's key-token spans (from a key-token file, or an evaluator run on the book) laid on a
books stream as the model's key target positions, and what a scored segment holds of them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import fail
from ..metrics.longppl import KeySettings
from ..models.base import StreamingLM
from ..streams import BooksStream
from ..tokenizers import encode_offsets
from .key_tokens import check_evaluator_fits, key_spans, model_key_positions


def evaluator_spans(
    stream: BooksStream, texts: dict[str, str], evaluator: StreamingLM, key: KeySettings, batch_size: int
) -> dict[str, list[tuple[int, int]]]:
    """Each book's key-token spans by its sha256, found by `evaluator` reading the whole book as one document."""
    spans = {}
    for book in stream.manifest["books"]:
        ids, offsets = encode_offsets(evaluator.tokenizer, texts[book["sha256"]], specials=True)
        check_evaluator_fits(evaluator, len(ids), key, f"book {book['id']}")
        spans[book["sha256"]], _ = key_spans(evaluator, ids, offsets, key, batch_size, f"book {book['id']}")
    return spans


def file_spans(stream: BooksStream, held: dict[str, Any], path: str) -> dict[str, list[tuple[int, int]]]:
    """Each book's spans from a key-token file; a book the file does not hold is refused."""
    by_sha = {doc["sha256"]: doc["spans"] for doc in held["documents"]}
    for book in stream.manifest["books"]:
        if book["sha256"] not in by_sha:
            raise fail(f"key-token file {path} holds no spans for book {book['id']} of {stream.path}",
                       "make it with `megaeval longppl --data SRC --save-key-tokens F` over the sources the stream "
                       "was made from")  # fmt: skip
    return {book["sha256"]: by_sha[book["sha256"]] for book in stream.manifest["books"]}


def stream_key_positions(
    stream: BooksStream, texts: dict[str, str], tokenizer: Any, spans: dict[str, list[tuple[int, int]]]
) -> np.ndarray:
    """The stream positions (sorted) of the model's key tokens: in each book, its tokens wholly inside a span (the
    book's first token excepted, as in `longppl`), each book encoded again with offsets and checked against the
    stream's own tokens."""
    bos = int(stream.manifest["bos"])
    found = []
    for book in stream.manifest["books"]:
        ids, offsets = encode_offsets(tokenizer, texts[book["sha256"]])
        first = book["offset"] + bos
        if not np.array_equal(np.asarray(ids), np.asarray(stream.tokens[first : first + book["tokens"]])):
            raise fail(f"book {book['id']} encodes to other tokens than {stream.path} holds for it",
                       "re-run `megaeval prep-books` with this model's tokenizer")  # fmt: skip
        found.append(model_key_positions(offsets, spans[book["sha256"]]) + first)
    return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


def segment_keys(keys: np.ndarray, nll: np.ndarray, start: int, length: int) -> list[float]:
    """[sum of NLL, count] of the key tokens among the targets of the segment at stream `start` scored `length`
    deep: `nll[j]` is the loss of stream position start + 1 + j."""
    lo, hi = np.searchsorted(keys, [start + 1, start + length + 1])
    picked = keys[lo:hi] - start - 1
    return [float(np.sum(nll[picked])), int(hi - lo)]
