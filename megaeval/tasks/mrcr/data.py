"""OpenAI MRCR's records as the hub lays them out, read from a local folder, checked field by field.

Layouts (openai/mrcr): the current one, `{2,4,8}needle/{n}needle_{k}.parquet` (since the 2025-12-05 bug-fix
release, whose replaced rows carry `date_added`), and the first release's `{2,4,8}needle.parquet` at the top; or one
.parquet/.jsonl file of records. Fields the card's snippet reads: `prompt` (a JSON list of chat messages), `answer`,
`random_string_to_prepend`; and `n_needles` for the per-needle tables. A record's id is `<file>#<row>` (its file
relative to --data), the key a --predictions file is matched by.

Only what the tables need is held per record; a record's messages are read again from its file when it runs (one
file at a time), so 2,400 records of up to 1M tokens never sit in memory together.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ..data import read_rows

FIELDS = ("prompt", "answer", "random_string_to_prepend", "n_needles")
FIX = "pass openai/mrcr's files as published (fields prompt, answer, random_string_to_prepend, n_needles)"
NEEDLE_DIR = re.compile(r"(\d+)needle")


@dataclass(frozen=True)
class Record:
    """One MRCR record as the run and the tables use it (the messages are read again when it runs)."""

    id: str
    path: str  # its file
    row: int
    needles: int
    answer: str
    random_string: str
    prompt_tokens: int  # o200k_base tokens of the messages' contents (the card's n_tokens)
    answer_tokens: int  # o200k_base tokens of the answer
    messages_count: int


def data_files(data: str | Path) -> tuple[Path, list[Path], str]:
    """The record files under --data (a folder in either layout, or one file): (root, files, layout name)."""
    root = Path(data)
    if root.is_file():
        return root.parent, [root], "file"
    if not root.is_dir():
        raise fail(f"--data {data}: no such file or folder", "pass a folder of openai/mrcr's files")
    current = sorted(p for p in root.glob("*needle/*.parquet") if NEEDLE_DIR.fullmatch(p.parent.name))
    older = sorted(p for p in root.glob("*needle.parquet") if NEEDLE_DIR.fullmatch(p.stem))
    if current and older:
        raise fail(f"--data {data} holds both layouts ({current[0].relative_to(root)} and {older[0].name})",
                   "keep one release's files in the folder")  # fmt: skip
    if not current and not older:
        raise fail(f"--data {data} holds no MRCR files (neither {{2,4,8}}needle/*.parquet nor {{2,4,8}}needle.parquet)",
                   "pass the folder openai/mrcr's files were downloaded to")  # fmt: skip
    return root, current or older, "current" if current else "first release"


def messages_of(row: dict[str, Any], where: str) -> list[dict[str, str]]:
    """A record's `prompt` parsed: a JSON list of {role, content} messages, each content a text."""
    try:
        messages = json.loads(row["prompt"]) if isinstance(row["prompt"], str) else None
    except ValueError as e:
        raise fail(f"{where}: prompt is not JSON ({e})", FIX) from None
    if not isinstance(messages, list) or not messages:
        raise fail(f"{where}: prompt is {type(messages).__name__ if messages is not None else 'not a JSON text'}, "
                   "not a JSON list of chat messages", FIX)  # fmt: skip
    for k, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise fail(f"{where}: prompt message {k} is not a {{role, content}} object with text content", FIX)
    return messages


def check_row(row: Any, where: str) -> None:
    """Refuse a row lacking a field the run reads, or with one of the wrong type, in one line."""
    if not isinstance(row, dict):
        raise fail(f"{where} is a {type(row).__name__}, not a record", FIX)
    for name in FIELDS:
        if name not in row or row[name] is None:
            raise fail(f"{where} has no {name}", FIX)
    for name in ("answer", "random_string_to_prepend"):
        if not isinstance(row[name], str):
            raise fail(f"{where}: {name} is {type(row[name]).__name__}, not a text", FIX)
    if isinstance(row["n_needles"], bool) or not isinstance(row["n_needles"], int) or row["n_needles"] < 1:
        raise fail(f"{where}: n_needles is {row['n_needles']!r:.20}, not a count", FIX)


@lru_cache(maxsize=1)
def _rows(path: str) -> list[Any]:
    return read_rows(path)


def read_records(data: str | Path, encoding: Any, needles: list[int] | None = None,
                 limit: int | None = None) -> tuple[list[Record], dict[str, Any]]:  # fmt: skip
    """Every record under --data (those of `needles`, the first `limit` of each needle count), checked and counted
    in o200k_base (`encoding`); and where they came from (files, sha256, layout)."""
    root, files, layout = data_files(data)
    records: list[Record] = []
    taken: dict[int, int] = {}
    for path in files:
        name = path.relative_to(root).as_posix()
        for i, row in enumerate(_rows(str(path))):
            where = f"{name} row {i}"
            check_row(row, where)
            n = row["n_needles"]
            if needles is not None and n not in needles or limit is not None and taken.get(n, 0) >= limit:
                continue
            messages = messages_of(row, where)
            taken[n] = taken.get(n, 0) + 1
            records.append(Record(f"{name}#{i}", str(path), i, n, row["answer"], row["random_string_to_prepend"],
                                  sum(encoding.count(m["content"]) for m in messages), encoding.count(row["answer"]),
                                  len(messages)))  # fmt: skip
    if not records:
        raise fail(f"--data {data} holds no record of the needle counts asked for", "check --needles")
    source = {"data": str(data), "layout": layout,
              "files": {p.relative_to(root).as_posix(): file_sha256(p) for p in files}}  # fmt: skip
    return records, source


def record_messages(record: Record) -> list[dict[str, str]]:
    """A record's messages, read again from its file (the last file read is kept)."""
    return messages_of(_rows(record.path)[record.row], record.id)
