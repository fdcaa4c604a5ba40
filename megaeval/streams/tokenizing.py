"""Tokenizing books for a books stream: each book read, checked, counted and encoded, in a worker pool.

`tokenized` yields every book of the sources in canonical order; the writer (`streams.writer`) lays them out.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data_prep.book_sources import Source, read_book
from ..errors import fail
from ..tokenizers import SentencePieceTokenizer
from .format import LITTLE_ENDIAN

if TYPE_CHECKING:
    from ..models.base import Tokenizer

# Every code point for which str.isspace() is true lies at or below U+3000; the last entry is False.
_IS_SPACE = np.array([chr(c).isspace() for c in range(0x3002)])


@dataclass
class Book:
    """One tokenized book, as a worker returns it (`ids` is None for an empty book)."""

    id: str
    source: int
    sha256: str | None
    file_sha256: str | None
    bytes: int
    words: int
    ids: np.ndarray | None


def count_words(text: str) -> int:
    """len(text.split()), without building the list of words (which costs a quarter of the encoding time)."""
    if text.isascii():
        codes = np.frombuffer(text.encode("ascii"), np.uint8)
    else:
        codes = np.minimum(np.frombuffer(text.encode("utf-32-le"), np.uint32), len(_IS_SPACE) - 1)
    space = _IS_SPACE[codes]
    starts = np.count_nonzero(space[:-1] & ~space[1:])  # a word starts after each space it follows
    return int(starts) + int(len(space) > 0 and not space[0])


def load_books_tokenizer(spec: dict) -> Tokenizer:
    """The tokenizer of a spec: {"tokenizer": PATH} (sentencepiece) or {"model": SPEC, "model_args": {...}}."""
    if ("tokenizer" in spec) == ("model" in spec):
        raise fail(f"bad tokenizer spec {spec!r}", 'pass either {"tokenizer": PATH} or {"model": SPEC}')
    if "tokenizer" in spec:
        return SentencePieceTokenizer(spec["tokenizer"])
    from megaeval.models import load_tokenizer

    return load_tokenizer(spec["model"], **(spec.get("model_args") or {}))


# Worker side. Module-level functions and an initializer, so the pool also works with "spawn".
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_spec: dict, dtype: str, parent: int | None = None) -> None:
    """Pool initializer: each worker builds its own tokenizer and dies quietly with its parent.

    Ctrl-C and SIGTERM are left to the parent, which stops the pool. A parent killed outright (SIGKILL) takes its
    workers with it (Linux), and a worker whose result pipe has lost its reader dies of SIGPIPE
    instead of printing a BrokenPipeError traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # how the pool stops its workers (the parent's handler is inherited)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _die_with_parent(parent)
    _WORKER["encode"] = array_encoder(load_books_tokenizer(tokenizer_spec), dtype)


def _die_with_parent(parent: int | None) -> None:
    if parent is None:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux only)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def array_encoder(tokenizer: Tokenizer, dtype: str) -> Callable[[str], np.ndarray]:
    """A function from text to its token ids (no BOS/EOS) as a little-endian numpy array of `dtype`."""
    little_endian = LITTLE_ENDIAN[dtype]
    encode_array = getattr(tokenizer, "encode_array", None)
    if encode_array is not None:  # no Python int per token: about 30% faster
        return lambda text: encode_array(text).astype(little_endian)
    return lambda text: np.array(tokenizer.encode(text), little_endian)


def _process_book(task: tuple[str, int, str | None, str | None]) -> Book:
    """Read (file-per-book sources), check, hash, count and tokenize one book."""
    book_id, source, path, text = task
    file_sha = None
    if path is not None:
        raw, text = read_book(Path(path))
        file_sha = hashlib.sha256(raw).hexdigest()
        data = text.encode("utf-8")
    else:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise fail(f"book {book_id} has a lone surrogate, not valid Unicode", "fix the source text") from None
    if not text or text.isspace():  # (text.strip() would copy the whole book)
        return Book(book_id, source, None, file_sha, len(data), 0, None)
    ids = _WORKER["encode"](text)
    return Book(book_id, source, hashlib.sha256(data).hexdigest(), file_sha, len(data), count_words(text), ids)


# Main side.


@contextmanager
def tokenized(
    sources: list[Source], tokenizer_spec: dict, tokenizer: Tokenizer, dtype: str, text_field: str, workers: int
) -> Iterator[Iterator[Book]]:
    """Every book of `sources` through `_process_book`, in canonical order; in a pool unless 1 worker suffices."""
    tasks = (task for i, source in enumerate(sources) for task in source.tasks(i, text_field))
    total = sum(source.count for source in sources)
    if min(workers, total) <= 1:
        _WORKER["encode"] = array_encoder(tokenizer, dtype)
        try:
            yield map(_process_book, tasks)
        finally:
            _WORKER.clear()
        return
    chunksize = max(1, min(64, total // (workers * 32)))  # rows may be tiny: send them in batches
    context = multiprocessing.get_context()
    parent = None if context.get_start_method() == "forkserver" else os.getpid()  # whose death ends the workers
    with context.Pool(min(workers, total), _init_worker, (tokenizer_spec, dtype, parent)) as pool:
        yield pool.imap(_process_book, tasks, chunksize)  # leaving the block terminates the pool
