"""Sources of books for `prepare_books`: folders of .txt/.txt.gz files, .jsonl/.parquet files, datasets.

`open_source` resolves one SRC argument (its kind, checksum and how to enumerate its books) without
tokenizing anything; every problem with a source is a one-line MegaevalError naming the file and row.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megaeval.errors import fail
from megaeval.files import file_sha256
from megaeval.text import CONVERT, ParquetRows, parse_json

BOOK_SUFFIXES = (".txt", ".txt.gz")
HUB_NAME = re.compile(r"\w[\w.-]*(/\w[\w.-]*)?")


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


def folder_books(src: str, path: Path) -> list[tuple[str, Path]]:
    """The .txt/.txt.gz books under a folder (at any depth) as (path relative to it, file), sorted; a broken link
    or a folder without books is refused."""
    named = [p for p in path.rglob("*") if p.name.lower().endswith(BOOK_SUFFIXES)]
    for p in named:
        if p.is_symlink() and not p.exists():  # dangling, or a loop: never dropped without a word
            raise fail(f"{p} is a broken symbolic link (its target is missing, or it loops)",
                       "fix or remove the link")  # fmt: skip
    found = (p for p in named if p.is_file())
    files = sorted((p.relative_to(path).as_posix(), p) for p in found)
    if not files:
        raise fail(f"no .txt or .txt.gz files under {src}", "pass a folder with one book per .txt file, or a file")
    return files


def read_book(path: Path) -> tuple[bytes, str]:
    """A book file's bytes as stored and its text (gzip undone, UTF-8 checked), or one line saying why not."""
    try:
        raw = path.read_bytes()
        data = gzip.decompress(raw) if path.name.lower().endswith(".gz") else raw
    except (OSError, EOFError, zlib.error) as e:
        raise fail(f"cannot read {path} ({e})", "check the file") from None
    try:
        return raw, data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fail(f"{path} is not valid UTF-8 (byte {e.start})", "convert it to UTF-8") from None


def _open_folder(src: str, path: Path) -> Source:
    files = folder_books(src, path)
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
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise fail(f"{where} is not UTF-8 text ({e.reason})", CONVERT) from None
                record = parse_json(text, where, "write one JSON object per line")  # lone surrogates refused too
                if not isinstance(record, dict) or text_field not in record:
                    fields = ", ".join(record) if isinstance(record, dict) else "not a JSON object"
                    raise fail(
                        f"{where} has no {text_field!r} field (it has: {fields})",
                        "pass --text-field with the field that holds the text",
                    )
                yield where, record[text_field]

    return Source(src, "jsonl", path.name, count, rows=rows, sha256=file_sha256(path))


def _open_parquet(src: str, path: Path, text_field: str) -> Source:
    table = ParquetRows(path, [text_field], fix="check the file")  # a damaged page or non-UTF-8 text: file and row
    if text_field not in table.columns:
        raise fail(
            f"{src} has no {text_field!r} column (it has: {', '.join(table.names)})",
            "pass --text-field with the column that holds the text",
        )

    def rows() -> Iterator[tuple[str, Any]]:
        for row, record in enumerate(table):
            yield f"{src} row {row}", record[text_field]

    return Source(src, "parquet", path.name, len(table), rows=rows, sha256=file_sha256(path))


def _open_saved_dataset(src: str, path: Path, text_field: str) -> Source:
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises many types for damaged folders
        raise fail(f"cannot load dataset {src} ({_first_line(e)})", "pass a folder written by save_to_disk") from None
    sha = tree_sha256([(p.name, file_sha256(p)) for p in sorted(path.glob("*.arrow"))])
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


def tree_sha256(pairs: list[tuple[str, str]]) -> str:
    """Checksum of a set of files: sha256 of their `sha256sum`-style lines, "<sha256>  <relative path>\\n"."""
    return hashlib.sha256("".join(f"{sha}  {rel}\n" for rel, sha in sorted(pairs)).encode()).hexdigest()
