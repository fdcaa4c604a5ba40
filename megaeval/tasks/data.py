"""Evaluation data: a split of a task from local files (`--data-dir DIR/<task>/<split>.*`) or the hub, and documents
read as `prep-books` reads books (LongPPL's documents, BABILong's background books)."""

from __future__ import annotations

import csv
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data_prep.book_sources import open_source, read_book
from ..errors import fail
from ..files import dataset_files_sha256, file_sha256
from ..text import check_text, iter_jsonl, read_parquet, read_text

SUFFIXES = (".jsonl", ".parquet", ".csv")


def read_rows(path: str | Path) -> list[Any]:
    """Rows of a .jsonl, .parquet or .csv file (a .jsonl row is whatever JSON value its line holds); text is read
    through `megaeval.text` (strict UTF-8, no lone surrogates, errors naming the file and line)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise fail(f"unknown data file type: {path}", f"use one of {', '.join(SUFFIXES)}")
    if path.suffix == ".jsonl":
        return [row for _, row in iter_jsonl(path)]
    if path.suffix == ".csv":
        return check_text(list(csv.DictReader(io.StringIO(read_text(path), newline=""))), str(path))
    return read_parquet(path, fix="re-export the data")


def shipped_books() -> Path:
    """The public-domain books megaeval ships (Jane Austen's six novels): needle's haystack and BABILong's background
    by default."""
    from importlib import resources

    return Path(str(resources.files("megaeval.data_prep").joinpath("corpora", "austen")))


def data_folders(data_dir: str | Path | None) -> list[Path]:
    """The local data an evaluation must never overwrite: the whole --data-dir (every task, every split)."""
    return [] if data_dir is None else [Path(data_dir)]


def local_split(data_dir: str | Path, task: str, split: str) -> Path:
    """The file holding `split` of `task` under `data_dir`."""
    folder = Path(data_dir) / task
    for suffix in SUFFIXES:
        if (folder / f"{split}{suffix}").is_file():
            return folder / f"{split}{suffix}"
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    raise fail(
        f"no {split} data for {task} under {data_dir}: expected {folder}/{split}.jsonl (or .parquet, .csv)"
        + (f"; found {', '.join(present)}" if present else ""),
        "pass --data-dir DIR laid out as DIR/<task>/<split>.jsonl",
    )


def load_split(task: str, split: str, data_dir: str | Path | None, hub: dict[str, Any]) -> tuple[list[dict], dict]:
    """Rows of a task's split and where they came from ({"path", "sha256"} or {"hub", "config", ...})."""
    if data_dir is not None:
        path = local_split(data_dir, task, split)
        return read_rows(path), {"path": str(path), "sha256": file_sha256(path)}
    import datasets

    name, config, revision = hub["name"], hub.get("config"), hub.get("revision")
    try:
        rows = datasets.load_dataset(name, config, split=split, revision=revision)
    except Exception as e:  # offline, missing split, moved dataset, ...
        reason = " ".join(str(e).split())[:160]
        raise fail(
            f"cannot load {name} ({config or 'default'}, {split}) from the hub: {reason}",
            f"without network, pass --data-dir DIR with DIR/{task}/{split}.jsonl",
        ) from None
    source = {"hub": name, "config": config, "revision": revision, "fingerprint": rows._fingerprint,
              "sha256": dataset_files_sha256(rows)}  # fmt: skip
    return list(rows), source


@dataclass
class Document:
    """One document: its id (file path or source row), text and the sha256 of its UTF-8 bytes."""

    id: str
    text: str
    sha256: str


def text_sha256(text: str) -> str:
    """The checksum documents (and a books stream's books) are matched by."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_documents(
    sources: list[str], text_field: str = "text", flag: str = "--data"
) -> tuple[list[Document], list[dict[str, Any]]]:
    """The documents of `sources` in order (folders of .txt, .jsonl/.parquet rows, saved datasets, `hub:NAME[:SPLIT]`)
    and what each source was (path, kind, checksum); an empty document, and a file read twice (the same source given
    twice, or a folder and a file in it), are refused. Ids are unique in the run: where two sources give one id (two
    folders of one name, say), those sources' ids start with the path as given instead of its name."""
    if not sources:
        raise fail(f"no {flag} given", f"pass {flag} with a folder of .txt files, a .jsonl/.parquet file or hub:NAME")
    documents, described, groups = [], [], []
    read_by: dict[str, str] = {}  # each file (or dataset) read, resolved -> the source that reads it
    for index, src in enumerate(sources):
        source = open_source(src.removeprefix("hub:"), text_field)
        for item in _inputs(src, source):
            if item in read_by:
                again = "is given twice" if read_by[item] == src else f"reads {item}, as {flag} {read_by[item]} does"
                raise fail(f"{flag} {src} {again}: its documents would count twice", "pass each source once")
            read_by[item] = src
        docs = []
        for book_id, _, path, text in source.tasks(index, text_field):
            if path is not None:
                _, text = read_book(Path(path))
            if not text or text.isspace():
                raise fail(f"document {book_id} of {src} is empty", "remove it from the data: it has no tokens")
            check_text(text, f"document {book_id} of {src}")
            docs.append(Document(book_id, text, text_sha256(text)))
        groups.append((src, source, docs))
        documents += docs
        described.append({"path": src, "kind": source.kind, "documents": source.count,
                          "sha256": source.sha256 or _files_checksum(source)})  # fmt: skip
    _unique_ids(groups, flag)
    return documents, described


def _inputs(src: str, source: Any) -> list[str]:
    """What a source reads, resolved: its files, or the file or folder of a row source (a hub name as given)."""
    if source.files is not None:
        return [os.path.realpath(p) for _, p in source.files]
    return [os.path.realpath(Path(src).expanduser()) if source.kind != "hub" else src]


def _unique_ids(groups: list[tuple[str, Any, list[Document]]], flag: str) -> None:
    """Give the documents of sources whose ids collide ids starting with the source's path as given."""
    seen: dict[str, int] = {}
    for _, _, docs in groups:
        for doc in docs:
            seen[doc.id] = seen.get(doc.id, 0) + 1
    for src, source, docs in groups:
        if any(seen[d.id] > 1 for d in docs):
            for doc in docs:
                doc.id = src.rstrip("/") + doc.id[len(source.name) :]
    ids = [d.id for _, _, docs in groups for d in docs]
    if len(set(ids)) < len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise fail(f"two documents of {flag} have the id {twice}", "pass sources with distinct paths")


def _files_checksum(source: Any) -> str:
    return hashlib.sha256("".join(f"{file_sha256(p)}  {i}\n" for i, p in source.files).encode()).hexdigest()
