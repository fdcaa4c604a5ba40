"""BABILong's instances ({input, question, target}) per task and length, from the layouts a user has:

- the generator's (data/create_tasks.py, and `--write-data`): DIR/qaN/<length>.json, a JSON list (or .jsonl);
- the hub repository's files: DIR[/data]/<length>/qaN[-*].parquet (or .json/.jsonl), one config per folder;
- a `datasets` save_to_disk folder per config: DIR/<length>/ (dataset_dict.json, one split per task);
- `hub:NAME` (RMT-team/babilong, RMT-team/babilong-1k-samples) through `datasets`, from its cache offline.

Parquet files are read a row group at a time, so a 10M set's instances (40 MB of text each) never sit in memory
together."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import dataset_files_sha256, file_sha256, write_output
from ...text import ParquetRows, read_json
from ..data import read_rows
from .spec import length_tokens

FIELDS = ("input", "question", "target")
HUB = "hub:"
# An instance's input may hold at most this many characters per token of its set's length (BABILong's sampler reads
# at most 10 characters per token it wants; English prose in GPT-2 tokens averages under 5), the 0k set (a story's
# facts alone, no background) counted as ZERO_K_TOKENS: an instance past that belongs to a longer set.
CHARS_PER_TOKEN = 10
ZERO_K_TOKENS = 4000


class Instances:
    """One (task, length)'s instances, read when first asked for (and dropped again by `release`); `source` says
    where they come from (path and sha256, or the hub's name and fingerprint)."""

    def __init__(self, load: Callable[[], Any] | None, parquet: Path | None, source: dict[str, Any], where: str,
                 length: str | None = None, spec: dict[str, Any] | None = None):  # fmt: skip
        self._load, self._parquet, self.source, self.where = load, parquet, source, where
        self.length, self.spec = length, spec
        self._rows: Any = None

    def _ready(self) -> None:
        if self._rows is not None:
            return
        if self._parquet is None:
            self._rows = self._load()
            return
        self._rows = ParquetRows(self._parquet, list(FIELDS), fix="download the set again")
        missing = [f for f in FIELDS if f not in self._rows.names]
        if missing:
            raise fail(f"{self._parquet} has no `{missing[0]}` column",
                       "pass BABILong's sets (records of input, question, target)")  # fmt: skip

    def __len__(self) -> int:
        self._ready()
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, str]:
        self._ready()
        where = f"{self.where} instance {index}"
        row = self._rows[index]
        record = checked(row, where) if self.spec is None else check_instance(row, self.spec, where)
        if self.length is not None:
            check_size(record, self.length, where)
        return record

    def check_all(self) -> None:
        """Check every instance before any work (each read once, nothing kept); of a parquet file only the
        questions and targets, a few rows at a time (its inputs, 40 MB each at 10M, are checked when read)."""
        if self._parquet is None:
            for index in range(len(self)):
                self[index]
            self.release()
            return
        self._ready()
        for index, row in enumerate(ParquetRows(self._parquet, ["question", "target"], fix="download the set again")):
            where = f"{self.where} instance {index}"
            record = checked({**row, "input": ""}, where)
            if self.spec is not None:
                check_target(record["target"], record["question"], self.spec, where)

    def release(self) -> None:
        """Drop what was read (it is read again when asked for)."""
        self._rows = None


def checked(row: Any, where: str) -> dict[str, str]:
    """An instance with its three texts, or one line naming what is wrong."""
    if not isinstance(row, dict):
        raise fail(f"{where} is {row!r:.40}, not a record", "pass BABILong's sets (records of input, question, target)")
    for field in FIELDS:
        if not isinstance(row.get(field), str):
            got = "missing" if field not in row else f"{row[field]!r:.40}, not a text"
            raise fail(f"{where}: `{field}` is {got}", "pass BABILong's sets (records of input, question, target)")
    return {field: row[field] for field in FIELDS}


def check_instance(row: Any, spec: dict[str, Any], where: str) -> dict[str, str]:
    """An instance (or a prediction file's row: the same check) whose question is a text and whose target is one of
    the task's labels (qa8's lists: each item one), or one line naming what is wrong."""
    record = checked(row, where)
    check_target(record["target"], record["question"], spec, where)
    return record


def check_target(target: str, question: str, spec: dict[str, Any], where: str) -> None:
    """Refuse an empty question, and a target that is empty or none of the task's labels (an empty target is in
    every answer; a target no label names can never be found right)."""
    fix = f"pass {spec['task']}'s own instances (its labels: {', '.join(spec['labels'])})"
    if not question.strip():
        raise fail(f"{where}: the question is empty", fix)
    if not target.strip():
        raise fail(f"{where}: the target is empty", fix)
    lowered = target.lower()
    labels = {label.lower() for label in spec["labels"]}
    parts = lowered.split(",") if "," in lowered and len(lowered) > 3 else [lowered]  # as compare_answers splits
    if not all(part in labels for part in parts):
        raise fail(f"{where}: the target {target!r:.40} is none of {spec['task']}'s labels", fix)


def check_size(record: dict[str, str], length: str, where: str) -> None:
    """Refuse an instance far longer than its set's length can hold (one of a longer set, filed under this one)."""
    tokens = length_tokens(length) or ZERO_K_TOKENS
    limit, size = CHARS_PER_TOKEN * tokens, len(record["input"])
    if size > limit:
        what = "a story's facts alone" if not length_tokens(length) else f"{length}'s {tokens:,} tokens"
        raise fail(f"{where}: its input is {size:,} characters, {size / limit:,.0f} times what a {length} instance "
                   f"can hold (at most {limit:,}: {CHARS_PER_TOKEN} per token of {what}); it belongs to a longer set",
                   "put each instance under the length it was made for")  # fmt: skip


def read_instances(data: str, task: str, length: str, spec: dict[str, Any] | None = None) -> Instances:
    """The instances of `task` at `length` in `data` (a folder in one of the layouts, or hub:NAME), each checked
    when read (against `spec`'s labels when given, and against the length); a set found in two layouts is
    refused."""
    if data.startswith(HUB):
        instances = _hub(data.removeprefix(HUB), task, length)
    else:
        instances = _local(data, task, length)
    instances.length, instances.spec = length, spec
    return instances


def _local(data: str, task: str, length: str) -> Instances:
    root = Path(data)
    if not root.is_dir():
        raise fail(f"--data {data}: no such folder", "pass a folder of BABILong's sets, or hub:RMT-team/babilong")
    found = [c for base in (root, root / "data") for c in _candidates(base, task, length)]
    if len(found) > 1:
        raise fail(f"--data {data} holds {task} at {length} twice: {found[0]} and {found[1]}",
                   "keep one of them (they would be read as one set, the other ignored)")  # fmt: skip
    if not found:
        raise fail(f"--data {data} holds no {task} at {length}; it holds {holdings(root)}",
                   "ask for --tasks and --lengths the folder has, or pass the folder of that set")  # fmt: skip
    path = found[0]
    if path.name == "dataset_dict.json":
        return _saved(path.parent, task, data)
    if path.suffix == ".parquet":
        return Instances(None, path, _file_source(path), str(path))
    return Instances(lambda: _rows(path), None, _file_source(path), str(path))


def _candidates(base: Path, task: str, length: str) -> list[Path]:
    """Every file under `base` that holds `task` at `length`, in any layout (a save_to_disk folder by its
    dataset_dict.json, when it lists the task's split)."""
    found = [p for p in (base / task / f"{length}.json", base / task / f"{length}.jsonl") if p.is_file()]
    config = base / length
    saved = config / "dataset_dict.json"
    if saved.is_file() and task in (_splits(saved) or [task]):  # an unreadable one: refused when read
        found.append(saved)
    files = sorted(config.glob(f"{task}.*")) + sorted(config.glob(f"{task}-*.parquet"))
    files = [p for p in files if p.suffix in (".json", ".jsonl", ".parquet") and p.is_file()]
    if len(files) > 1 and all(p.suffix == ".parquet" for p in files):
        raise fail(f"--data {base}: {task} at {length} is split over {len(files)} parquet files",
                   "join them into one file, or load the set with hub:NAME")  # fmt: skip
    return found + files


def _splits(path: Path) -> list[str] | None:
    try:
        splits = json.loads(path.read_text(encoding="utf-8")).get("splits")
    except (OSError, ValueError, AttributeError):
        return None
    return splits if isinstance(splits, list) else None


def holdings(root: Path) -> str:
    """What a data folder holds, as `qa1: 0k, 1k; qa2: 0k` (for the one-line error)."""
    found: dict[str, set[str]] = {}
    for base in (root, root / "data"):
        for path in base.glob("qa*/*.json*"):
            found.setdefault(path.parent.name, set()).add(path.name.split(".")[0])
        for path in base.glob("*/qa*"):
            if path.parent.name != "data" and (path.is_dir() or path.suffix in (".json", ".jsonl", ".parquet")):
                found.setdefault(path.name.split("-")[0].split(".")[0], set()).add(path.parent.name)
    if not found:
        return "no BABILong layout (DIR/qaN/<length>.json, DIR/<length>/qaN.parquet or save_to_disk folders)"
    return "; ".join(f"{t}: {', '.join(sorted(ls))}" for t, ls in sorted(found.items(), key=lambda kv: kv[0]))


def write_instances(folder: str | Path, task: str, length: str, records: list[dict[str, str]]) -> Path:
    """Write one task's instances at one length as create_tasks writes them (FOLDER/qaN/<length>.json: a JSON list,
    json.dump's defaults), atomically."""
    path = Path(folder) / task / f"{length}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(records)
    write_output(path, lambda f: f.write(text.encode("utf-8")), "--write-data")
    return path


def _rows(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return read_rows(path)
    rows = read_json(path, fix="pass BABILong's sets as written (a JSON list of records)")
    if not isinstance(rows, list):
        raise fail(f"{path} holds a {type(rows).__name__}, not a list of instances", "pass BABILong's sets as written")
    return rows


def _file_source(path: Path) -> dict[str, Any]:
    return {"path": str(path), "sha256": file_sha256(path)}


def _saved(config: Path, task: str, data: str) -> Instances:
    import datasets

    try:
        saved = datasets.load_from_disk(str(config))
    except Exception as e:  # datasets' errors for a broken folder
        raise fail(f"{config} is not a readable save_to_disk folder ({' '.join(str(e).split())[:120]})",
                   "save it again with datasets' save_to_disk") from None  # fmt: skip
    if task not in saved:
        raise fail(f"--data {data}: {config} holds no split {task} (it holds {', '.join(saved)})",
                   "ask for --tasks the folder has")  # fmt: skip
    split = saved[task]
    source = {"path": str(config), "fingerprint": split._fingerprint, "sha256": dataset_files_sha256(split)}
    return Instances(lambda: split, None, source, f"{config}/{task}")


def _hub(name: str, task: str, length: str) -> Instances:
    import datasets

    try:
        split = datasets.load_dataset(name, length, split=task)
    except Exception as e:  # offline, no such config or split
        reason = " ".join(str(e).split())[:160]
        raise fail(f"cannot load {name} ({length}, {task}) from the hub: {reason}",
                   "without network, pass --data DIR with the set's files") from None  # fmt: skip
    source = {"hub": name, "config": length, "fingerprint": split._fingerprint, "sha256": dataset_files_sha256(split)}
    return Instances(lambda: split, None, source, f"{name} {length}/{task}")
