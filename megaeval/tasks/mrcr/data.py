"""MRCR's records as their releases lay them out, read from a local folder, checked field by field.

OpenAI MRCR (openai/mrcr): the current layout, `{2,4,8}needle/{n}needle_{k}.parquet` (since the 2025-12-05 bug-fix
release, whose replaced rows carry `date_added`), and the first release's `{2,4,8}needle.parquet` at the top; or one
.parquet/.jsonl file of records. Fields the card's snippet reads: `prompt` (a JSON list of chat messages), `answer`,
`random_string_to_prepend`; and `n_needles` for the per-needle tables.

GDM MRCR v2 (google-deepmind/eval_hub, eval_hub/mrcr_v2 at 67b7fd2): the CSV files its download.sh fetches,
`mrcr_v2p1_{n}needle_{group}_dynamic_fewshot_text_style_fast.csv`, the group `in_(lo,hi)` (records of lo to hi
tokens of Gemini's unreleased tokenizer: the file is the bin) or `upto_128K` (every length to 128K together); each
row `queries` (the whole chat flattened into one text, sent as one user turn), `answer` (the 12-character random
string, then the text), `context_len` (Gemini tokens) and `answer_token_count`, among others.

A record's id is `<file>#<row>` (its file relative to --data), the key a --predictions file is matched by.

Only what the tables need is held per record; a record's messages are read again from its file when it runs (one
file at a time), so 2,400 records of up to 1M tokens never sit in memory together.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import cache_dir, file_sha256
from ..data import read_rows
from .results import v2_bin

FIELDS = ("prompt", "answer", "random_string_to_prepend", "n_needles")
V2_FIELDS = ("queries", "answer")
V2_FILE = re.compile(r"mrcr_v2p1_(\d+)needle_(upto_128K|in_\((\d+),(\d+)\))_.*\.csv")
V2_FIX = "pass GDM's MRCR v2 CSV files as download.sh fetches them (columns queries, answer)"
OPENAI, GDM_V2 = "openai", "gdm-v2"
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
    prompt_tokens: int  # o200k_base tokens of the messages' contents (the card's n_tokens); v2: context_len
    answer_tokens: int  # o200k_base tokens of the answer; v2: answer_token_count
    messages_count: int
    release: str = OPENAI  # whose record: OPENAI (graded by the card's grade()) or GDM_V2 (by mrcr_v2_metric)
    bin: str | None = None  # GDM v2: the bin its file is (None: binned by its o200k_base count)


def data_files(data: str | Path) -> tuple[Path, list[Path], str]:
    """The record files under --data (a folder in either layout, or one file): (root, files, layout name)."""
    if str(data).startswith("hub:"):
        raise fail(f"--data {data}: megaeval reads MRCR's files from a folder, not from the hub",
                   "download them first: huggingface-cli download openai/mrcr --repo-type dataset --local-dir mrcr "
                   "(GDM MRCR v2: its download.sh), then pass --data mrcr")  # fmt: skip
    root = Path(data)
    if root.is_file():
        return root.parent, [root], "gdm v2" if V2_FILE.fullmatch(root.name) else "file"
    if not root.is_dir():
        raise fail(f"--data {data}: no such file or folder", "pass a folder of openai/mrcr's files")
    current = sorted(p for p in root.glob("*needle/*.parquet") if NEEDLE_DIR.fullmatch(p.parent.name))
    older = sorted(p for p in root.glob("*needle.parquet") if NEEDLE_DIR.fullmatch(p.stem))
    gdm = sorted(p for p in root.glob("mrcr_v2p1_*.csv") if V2_FILE.fullmatch(p.name))
    held = [(name, files) for name, files in (("current", current), ("first release", older), ("gdm v2", gdm)) if files]
    if len(held) > 1:
        raise fail(f"--data {data} holds files of two releases ({held[0][1][0].relative_to(root)} and "
                   f"{held[1][1][0].relative_to(root)})", "keep one release's files in the folder")  # fmt: skip
    if not held:
        raise fail(f"--data {data} holds no MRCR files (neither {{2,4,8}}needle/*.parquet, {{2,4,8}}needle.parquet nor "
                   "GDM's mrcr_v2p1_*.csv)", "pass the folder the files were downloaded to")  # fmt: skip
    return root, held[0][1], held[0][0]


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
    if V2_FILE.fullmatch(Path(path).name):
        return _csv_rows(Path(path))
    return read_rows(path)


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    """A GDM v2 CSV file's rows, every cell a text ("" for an empty one); pandas' parser, since a row of 8M tokens
    passes the csv module's field limit."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except Exception as e:  # pandas' parser errors, undecodable bytes
        raise fail(f"{path} is not a readable CSV file ({' '.join(str(e).split())[:120]})", V2_FIX) from None
    return frame.to_dict("records")


def v2_record(row: Any, name: str, i: int, path: Path, encoding: Any) -> Record:
    """A GDM v2 row checked: `queries` and `answer` texts, the answer longer than its 12-character random string;
    its needle count and bin from the file's name."""
    where = f"{name} row {i}"
    if not isinstance(row, dict):
        raise fail(f"{where} is a {type(row).__name__}, not a record", V2_FIX)
    for field in V2_FIELDS:
        if not isinstance(row.get(field), str) or not row[field]:
            raise fail(f"{where} has no {field}", V2_FIX)
    if len(row["answer"].strip()) < 12:
        raise fail(f"{where}: answer is {row['answer']!r:.30}, shorter than its 12-character random string", V2_FIX)
    found = V2_FILE.fullmatch(path.name)
    needles = int(found.group(1))
    group = "upto_128K" if found.group(2) == "upto_128K" else (int(found.group(3)), int(found.group(4)))

    def count(field: str, text: str) -> int:
        value = str(row.get(field, "")).strip()
        return int(value) if value.isdigit() else encoding.count(text)

    return Record(f"{name}#{i}", str(path), i, needles, row["answer"], row["answer"].strip()[:12],
                  count("context_len", row["queries"]), count("answer_token_count", row["answer"]), 1, GDM_V2,
                  v2_bin(group))  # fmt: skip


def read_records(data: str | Path, encoding: Any, needles: list[int] | None = None,
                 limit: int | None = None) -> tuple[list[Record], dict[str, Any]]:  # fmt: skip
    """Every record under --data (those of `needles`, the first `limit` of each needle count), checked and counted
    in o200k_base (`encoding`); and where they came from (files, sha256, layout)."""
    root, files, layout = data_files(data)
    records: list[Record] = []
    taken: dict[int, int] = {}
    digests = {path: file_sha256(path) for path in files}
    for path in files:
        name = path.relative_to(root).as_posix()
        counts = Counts(digests[path], encoding)
        for i, row in enumerate(_rows(str(path))):
            if layout == "gdm v2":
                record = v2_record(row, name, i, path, encoding)
                if (needles is None or record.needles in needles) and (limit is None or taken.get(record.needles, 0)
                                                                        < limit):  # fmt: skip
                    taken[record.needles] = taken.get(record.needles, 0) + 1
                    records.append(record)
                continue
            where = f"{name} row {i}"
            check_row(row, where)
            n = row["n_needles"]
            if needles is not None and n not in needles or limit is not None and taken.get(n, 0) >= limit:
                continue
            messages = messages_of(row, where)
            taken[n] = taken.get(n, 0) + 1
            prompt_tokens, answer_tokens = counts.of(i, messages, row["answer"])
            records.append(Record(f"{name}#{i}", str(path), i, n, row["answer"], row["random_string_to_prepend"],
                                  prompt_tokens, answer_tokens, len(messages)))  # fmt: skip
        counts.save()
    if not records:
        raise fail(f"--data {data} holds no record of the needle counts asked for", "check --needles")
    source = {"data": str(data), "layout": layout,
              "files": {p.relative_to(root).as_posix(): digests[p] for p in files}}  # fmt: skip
    return records, source


class Counts:
    """One file's o200k_base counts (the card's n_tokens of the messages, and the answer's), per row: counted once
    and kept in megaeval's cache by the file's sha256 (counting the whole release takes many minutes; a rerun, a
    resume or another rank reads them back). The counts follow from the file's bytes alone (o200k_base is fixed)."""

    def __init__(self, digest: str, encoding: Any):
        self.encoding, self.path = encoding, cache_dir() / "mrcr_o200k" / f"{digest}.json"
        try:
            self.known = {int(k): tuple(v) for k, v in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            self.known = {}
        self.added = False

    def of(self, row: int, messages: list[dict[str, str]], answer: str) -> tuple[int, int]:
        if row not in self.known:
            self.known[row] = (sum(self.encoding.count(m["content"]) for m in messages), self.encoding.count(answer))
            self.added = True
        prompt, answer_tokens = self.known[row]
        return int(prompt), int(answer_tokens)

    def save(self) -> None:
        if not self.added:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({str(k): list(v) for k, v in sorted(self.known.items())}))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only home only costs counting again next time


def record_messages(record: Record) -> list[dict[str, str]]:
    """A record's messages, read again from its file (the last file read is kept); a GDM v2 record's flattened chat
    is one user turn, as its run_evaluation.py sends it."""
    row = _rows(record.path)[record.row]
    if record.release == GDM_V2:
        return [{"role": "user", "content": row["queries"]}]
    return messages_of(row, record.id)
