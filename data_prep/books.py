"""The books validation stream: books from folders, files or datasets, tokenized once into tokens.bin + manifest.json.

    manifest = prepare_books(["/data/pg19/test"], "streams/pg19", {"tokenizer": "/tok/tokenizer.model"})

Books are read in canonical order (sources as given, books within a source in a fixed order),
books under `min_tokens` are dropped, and the kept books are shuffled with `random.Random(seed)`.
tokens.bin holds, for each book in that order, [BOS] + text tokens + [EOS] as raw little-endian
uint16 (uint32 for vocabularies over 65,536). The manifest records every input's checksum and
every book's place in the stream, and is written last: its presence marks a complete stream.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing
import os
import random
import re
import signal
import tempfile
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from megaeval.errors import fail
from megaeval.files import file_sha256
from megaeval.streams.format import LITTLE_ENDIAN, MANIFEST_FILE, SCHEMA_VERSION, STREAM_KIND, TOKENS_FILE, token_dtype
from megaeval.tokenizers import SentencePieceTokenizer

if TYPE_CHECKING:
    from megaeval.models.base import Tokenizer

BOOK_SUFFIXES = (".txt", ".txt.gz")
HUB_NAME = re.compile(r"\w[\w.-]*(/\w[\w.-]*)?")
# Every code point for which str.isspace() is true lies at or below U+3000; the last entry is False.
_IS_SPACE = np.array([chr(c).isspace() for c in range(0x3002)])


@dataclass
class Source:
    """One SRC argument, resolved: its kind, checksum and how to enumerate its books (not read yet)."""

    path: str
    kind: str
    name: str  # the prefix of its book ids
    count: int  # books (files or rows) before skipping empty ones
    files: list[tuple[str, Path]] | None = None  # (book id, file) for file-per-book sources
    root: Path | None = None  # the folder, for folder sources
    rows: Callable[[], Iterator[tuple[str, Any]]] | None = None  # (where, field value) for row sources
    sha256: str | None = None  # row sources; file sources get theirs from the workers' file hashes

    def tasks(self, index: int, text_field: str) -> Iterator[tuple[str, int, str | None, str | None]]:
        """(book id, source index, file path or None, text or None) for each book, in canonical order."""
        if self.files is not None:
            for book_id, path in self.files:
                yield book_id, index, str(path), None
        else:
            for row, (where, value) in enumerate(self.rows()):
                yield f"{self.name}:{row}", index, None, _text_value(value, where, text_field)


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


def prepare_books(
    sources: list[str],
    out_dir: str | Path,
    tokenizer_spec: dict,
    seed: int = 0,
    min_tokens: int = 0,
    text_field: str = "text",
    bos: bool = True,
    eos: bool = True,
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
) -> dict:
    """Tokenize the books of `sources` into out_dir/tokens.bin and out_dir/manifest.json; return the manifest."""
    if not sources:
        raise fail("no sources given", "pass at least one folder, file or dataset")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers < 1:
        raise fail(f"workers must be at least 1, got {workers}")
    out = Path(out_dir)
    _check_out_dir(out, force)
    tokenizer = load_books_tokenizer(tokenizer_spec)
    dtype = token_dtype(tokenizer.vocab_size)
    opened = [open_source(str(src), text_field) for src in sources]
    head = np.array([tokenizer.bos_id] if bos else [], LITTLE_ENDIAN[dtype])
    tail = np.array([tokenizer.eos_id] if eos else [], LITTLE_ENDIAN[dtype])
    kept: list[dict] = []  # manifest entries, plus "start": the byte position of the book in the scratch file
    dropped: list[str] = []
    empty: list[str] = []
    file_hashes: dict[int, list[str]] = defaultdict(list)
    tmp = {name: out / f"{name}.tmp" for name in ("tokens.unshuffled", TOKENS_FILE, MANIFEST_FILE)}
    try:
        # Books arrive in canonical order; kept ones go to a scratch file until the shuffle is known.
        with (
            _tokenized(opened, tokenizer_spec, tokenizer, dtype, text_field, workers) as books,
            _progress_bar(progress, sum(source.count for source in opened)) as advance,
            open(tmp["tokens.unshuffled"], "wb") as scratch,
        ):
            for book in books:
                advance(0 if book.ids is None else len(book.ids))
                if book.file_sha256 is not None:
                    file_hashes[book.source].append(book.file_sha256)
                if book.ids is None:
                    empty.append(book.id)
                elif len(book.ids) < min_tokens:
                    dropped.append(book.id)
                else:
                    kept.append({
                        "id": book.id, "source": book.source, "sha256": book.sha256, "file_sha256": book.file_sha256,
                        "offset": None, "tokens": len(book.ids), "bytes": book.bytes, "words": book.words,
                        "start": scratch.tell(),
                    })  # fmt: skip
                    for part in (head, book.ids, tail):
                        scratch.write(part)
        if not kept:
            raise fail(
                f"no books to write ({len(empty)} empty, {len(dropped)} under {min_tokens} tokens)",
                "lower --min-tokens or check the sources",
            )
        random.Random(seed).shuffle(kept)
        total_tokens, tokens_sha256 = _write_shuffled(
            kept, tmp["tokens.unshuffled"], tmp[TOKENS_FILE], np.dtype(dtype).itemsize, len(head) + len(tail)
        )
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "kind": STREAM_KIND,
            "megaeval_version": _megaeval_version(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tokens_file": TOKENS_FILE,
            "dtype": dtype,
            "total_tokens": total_tokens,
            "tokens_sha256": tokens_sha256,
            "seed": seed,
            "min_tokens": min_tokens,
            "text_field": text_field,
            "bos": bool(bos),
            "eos": bool(eos),
            "tokenizer": tokenizer.describe(),
            "sources": _describe_sources(opened, kept, file_hashes),
            "books": [{key: value for key, value in book.items() if key != "start"} for book in kept],
            "dropped": dropped,
            "empty": empty,
            "total_bytes": sum(book["bytes"] for book in kept),
            "total_words": sum(book["words"] for book in kept),
        }
        _write_durably(tmp[MANIFEST_FILE], json.dumps(manifest, indent=1).encode())
        # An old manifest must never describe the new tokens.bin, even for an instant.
        (out / MANIFEST_FILE).unlink(missing_ok=True)
        os.replace(tmp[TOKENS_FILE], out / TOKENS_FILE)
        os.replace(tmp[MANIFEST_FILE], out / MANIFEST_FILE)
        return manifest
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)


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


def open_source(src: str, text_field: str = "text") -> Source:
    """Resolve one SRC argument (folder, file, save_to_disk folder or hub name) without tokenizing it."""
    path = Path(src).expanduser()
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
            raise fail(f"{src} holds several splits ({', '.join(splits)})", f"pass one of them: {path}/<split>")
        if (path / "state.json").is_file():
            return _open_saved_dataset(src, path, text_field)
        return _open_folder(src, path)
    if path.is_file():
        return _open_file(src, path, text_field)
    if path.exists():
        raise fail(f"{src} is neither a file nor a folder", "pass a folder, a file or a dataset")
    name = src.partition(":")[0]
    if not HUB_NAME.fullmatch(name) or name.lower().endswith((".txt", ".gz", ".jsonl", ".parquet")):
        raise fail(f"source not found: {src}", "check the path")
    return _open_hub(src, text_field)


def _open_folder(src: str, path: Path) -> Source:
    found = (p for p in path.rglob("*") if p.name.lower().endswith(BOOK_SUFFIXES) and p.is_file())
    files = sorted((p.relative_to(path).as_posix(), p) for p in found)
    if not files:
        raise fail(f"no .txt or .txt.gz files under {src}", "pass a folder with one book per .txt file, or a file")
    name = Path(os.path.abspath(path)).name
    return Source(src, "folder", name, len(files), files=[(f"{name}/{rel}", p) for rel, p in files], root=path)


def _open_file(src: str, path: Path, text_field: str) -> Source:
    lower = path.name.lower()
    if lower.endswith(BOOK_SUFFIXES):
        return Source(src, "txt.gz" if lower.endswith(".gz") else "txt", path.name, 1, files=[(path.name, path)])
    if lower.endswith((".jsonl", ".jsonl.gz")):
        return _open_jsonl(src, path, text_field)
    if lower.endswith(".parquet"):
        return _open_parquet(src, path, text_field)
    raise fail(
        f"unknown file type: {src}",
        "pass .txt, .txt.gz, .jsonl, .jsonl.gz or .parquet files, or a folder of .txt files",
    )


def _open_jsonl(src: str, path: Path, text_field: str) -> Source:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            count = sum(1 for line in f if line.strip())
    except (OSError, EOFError, zlib.error) as e:
        raise fail(f"cannot read {src}: {e}", "check the file") from None

    def rows() -> Iterator[tuple[str, Any]]:
        with opener(path, "rb") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{src} line {number}"
                try:
                    record = json.loads(line)
                except UnicodeDecodeError:
                    raise fail(f"{where} is not valid UTF-8", "convert the file to UTF-8") from None
                except ValueError as e:
                    raise fail(f"{where} is not valid JSON ({e})", "write one JSON object per line") from None
                if not isinstance(record, dict) or text_field not in record:
                    fields = ", ".join(record) if isinstance(record, dict) else "not a JSON object"
                    raise fail(
                        f"{where} has no {text_field!r} field (it has: {fields})",
                        "pass --text-field with the field that holds the text",
                    )
                yield where, record[text_field]

    return Source(src, "jsonl", path.name, count, rows=rows, sha256=file_sha256(path))


def _open_parquet(src: str, path: Path, text_field: str) -> Source:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for files it cannot parse
        raise fail(f"cannot read {src} as parquet ({_first_line(e)})", "check the file") from None
    columns = table.schema_arrow.names
    if text_field not in columns:
        raise fail(
            f"{src} has no {text_field!r} column (it has: {', '.join(columns)})",
            "pass --text-field with the column that holds the text",
        )

    def rows() -> Iterator[tuple[str, Any]]:
        values = (
            value for batch in table.iter_batches(64, columns=[text_field]) for value in batch.column(0).to_pylist()
        )
        for row, value in enumerate(values):
            yield f"{src} row {row}", value

    return Source(src, "parquet", path.name, table.metadata.num_rows, rows=rows, sha256=file_sha256(path))


def _open_saved_dataset(src: str, path: Path, text_field: str) -> Source:
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises many types for damaged folders
        raise fail(f"cannot load dataset {src} ({_first_line(e)})", "pass a folder written by save_to_disk") from None
    sha = _tree_sha256([(p.name, file_sha256(p)) for p in sorted(path.glob("*.arrow"))])
    name = Path(os.path.abspath(path)).name
    return _dataset_source(src, "datasets", name, dataset, text_field, sha)


def _open_hub(src: str, text_field: str) -> Source:
    import datasets
    import huggingface_hub

    name, _, split = src.partition(":")
    split = split or "validation"
    problem = f"{src} is neither a local path nor a dataset reachable on the hub"
    fix = "check the path, or the dataset name and the network (HF_HUB_OFFLINE=1 uses datasets cached locally)"
    # One quick request fails in a second where the loader would retry for half a minute.
    if not getattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False):
        try:
            huggingface_hub.HfApi().dataset_info(name, timeout=10)
        except Exception as e:  # connection errors, missing or private repositories, ...
            raise fail(f"{problem} ({type(e).__name__}: {_first_line(e)})", fix) from None
    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as e:
        raise fail(f"cannot load split {split!r} of hub dataset {name} ({_first_line(e)})", fix) from None
    sha = hashlib.sha256(dataset._fingerprint.encode()).hexdigest()
    return _dataset_source(src, "hub", name, dataset, text_field, sha)


def _dataset_source(src: str, kind: str, name: str, dataset: Any, text_field: str, sha: str) -> Source:
    if text_field not in dataset.column_names:
        raise fail(
            f"{src} has no {text_field!r} column (it has: {', '.join(dataset.column_names)})",
            "pass --text-field with the column that holds the text",
        )

    def rows() -> Iterator[tuple[str, Any]]:
        values = (value for batch in dataset.select_columns([text_field]).iter(64) for value in batch[text_field])
        for row, value in enumerate(values):
            yield f"{src} row {row}", value

    return Source(src, kind, name, len(dataset), rows=rows, sha256=sha)


def _text_value(value: Any, where: str, text_field: str) -> str:
    if value is None:
        return ""  # a null text is an empty book
    if not isinstance(value, str):
        raise fail(
            f"{where}: {text_field!r} is a {type(value).__name__}, not text", "pass --text-field with a text field"
        )
    return value


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _tree_sha256(pairs: list[tuple[str, str]]) -> str:
    """Checksum of a set of files: sha256 of their `sha256sum`-style lines, "<sha256>  <relative path>\\n"."""
    return hashlib.sha256("".join(f"{sha}  {rel}\n" for rel, sha in sorted(pairs)).encode()).hexdigest()


def _check_out_dir(out: Path, force: bool) -> None:
    if (out / MANIFEST_FILE).exists() and not force:
        raise fail(
            f"{out} already holds a books stream ({MANIFEST_FILE})", "pass --force to replace it, or another --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise fail(f"cannot write to output folder {out} ({e.strerror or e})", "pass a writable --out") from None


# Worker side. Module-level functions and an initializer, so the pool also works with "spawn".
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_spec: dict, dtype: str) -> None:
    """Pool initializer: each worker builds its own tokenizer; Ctrl-C is left to the parent, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER["encode"] = array_encoder(load_books_tokenizer(tokenizer_spec), dtype)


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
        try:
            raw = Path(path).read_bytes()
            data = gzip.decompress(raw) if path.lower().endswith(".gz") else raw
        except (OSError, EOFError, zlib.error) as e:
            raise fail(f"cannot read {path} ({e})", "check the file") from None
        file_sha = hashlib.sha256(raw).hexdigest()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise fail(f"{path} is not valid UTF-8 (byte {e.start})", "convert it to UTF-8") from None
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
def _tokenized(
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
    with multiprocessing.get_context().Pool(min(workers, total), _init_worker, (tokenizer_spec, dtype)) as pool:
        yield pool.imap(_process_book, tasks, chunksize)  # leaving the block terminates the pool


@contextmanager
def _progress_bar(enabled: bool, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr (books done, tokens/s); yields `advance(tokens)`, called once per book."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("prep-books"), BarColumn(), MofNCompleteColumn(), TextColumn("books  {task.fields[rate]}"))
    bar = Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)
    job = bar.add_task("books", total=total, rate="")
    start, tokens = time.perf_counter(), 0

    def advance(book_tokens: int) -> None:
        nonlocal tokens
        tokens += book_tokens
        bar.update(job, advance=1, rate=f"{tokens / (time.perf_counter() - start):,.0f} tokens/s")

    with bar:
        yield advance


def _write_shuffled(books: list[dict], scratch: Path, out: Path, itemsize: int, delimiters: int) -> tuple[int, str]:
    """Copy the books from `scratch` to `out` in list order, setting their offsets; return (tokens, sha256)."""
    digest, offset = hashlib.sha256(), 0
    with open(scratch, "rb") as src, open(out, "wb") as dst:
        for book in books:
            size = book["tokens"] + delimiters
            src.seek(book["start"])
            block = src.read(size * itemsize)
            dst.write(block)
            digest.update(block)
            book["offset"] = offset
            offset += size
        dst.flush()
        os.fsync(dst.fileno())
    return offset, digest.hexdigest()


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _describe_sources(sources: list[Source], kept: list[dict], file_hashes: dict[int, list[str]]) -> list[dict]:
    """The manifest's "sources": kind, checksum and counts over the kept books of each source."""
    described = []
    for i, source in enumerate(sources):
        sha = source.sha256
        if source.root is not None:
            sha = _tree_sha256(
                [
                    (p.relative_to(source.root).as_posix(), h)
                    for (_, p), h in zip(source.files, file_hashes[i], strict=True)
                ]
            )
        elif source.files is not None:
            sha = file_hashes[i][0]
        mine = [book for book in kept if book["source"] == i]
        described.append(
            {"path": source.path, "kind": source.kind, "sha256": sha, "books": len(mine)}
            | {key: sum(book[key] for book in mine) for key in ("tokens", "bytes", "words")}
        )
    return described


def _megaeval_version() -> str:
    import megaeval

    return megaeval.__version__
