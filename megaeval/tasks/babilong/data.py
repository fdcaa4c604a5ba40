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
from ...files import file_sha256, write_output
from ...text import read_json
from ..data import read_rows

FIELDS = ("input", "question", "target")
HUB = "hub:"


class Instances:
    """One (task, length)'s instances, read when first asked for (and dropped again by `release`); `source` says
    where they come from (path and sha256, or the hub's name and fingerprint)."""

    def __init__(self, load: Callable[[], Any] | None, parquet: Path | None, source: dict[str, Any], where: str):
        self._load, self._parquet, self.source, self.where = load, parquet, source, where
        self._rows: Any = None
        self._group: tuple[int, list[dict]] | None = None
        self._starts: list[int] | None = None

    def _ready(self) -> None:
        if self._parquet is not None and self._starts is None:
            import pyarrow.parquet as pq

            try:
                self._file = pq.ParquetFile(self._parquet)
            except Exception as e:  # pyarrow's errors for a corrupt file
                raise fail(f"{self._parquet} is not a readable parquet file ({' '.join(str(e).split())[:120]})",
                           "download the set again") from None  # fmt: skip
            sizes = [self._file.metadata.row_group(g).num_rows for g in range(self._file.num_row_groups)]
            self._starts = [sum(sizes[:g]) for g in range(len(sizes) + 1)]
        elif self._parquet is None and self._rows is None:
            self._rows = self._load()

    def __len__(self) -> int:
        self._ready()
        return len(self._rows) if self._parquet is None else self._starts[-1]

    def __getitem__(self, index: int) -> dict[str, str]:
        self._ready()
        if self._parquet is None:
            row = self._rows[index]
        else:
            group = next(g for g in range(len(self._starts) - 1) if self._starts[g] <= index < self._starts[g + 1])
            if self._group is None or self._group[0] != group:
                self._group = None
                self._group = (group, self._file.read_row_group(group, columns=list(FIELDS)).to_pylist())
            row = self._group[1][index - self._starts[group]]
        return checked(row, f"{self.where} instance {index}")

    def release(self) -> None:
        """Drop what was read (it is read again when asked for)."""
        self._rows = self._group = None


def checked(row: Any, where: str) -> dict[str, str]:
    """An instance with its three texts, or one line naming what is wrong."""
    if not isinstance(row, dict):
        raise fail(f"{where} is {row!r:.40}, not a record", "pass BABILong's sets (records of input, question, target)")
    for field in FIELDS:
        if not isinstance(row.get(field), str):
            got = "missing" if field not in row else f"{row[field]!r:.40}, not a text"
            raise fail(f"{where}: `{field}` is {got}", "pass BABILong's sets (records of input, question, target)")
    return {field: row[field] for field in FIELDS}


def read_instances(data: str, task: str, length: str) -> Instances:
    """The instances of `task` at `length` in `data` (a folder in one of the layouts, or hub:NAME)."""
    if data.startswith(HUB):
        return _hub(data.removeprefix(HUB), task, length)
    root = Path(data)
    if not root.is_dir():
        raise fail(f"--data {data}: no such folder", "pass a folder of BABILong's sets, or hub:RMT-team/babilong")
    for base in (root, root / "data"):
        for path in (base / task / f"{length}.json", base / task / f"{length}.jsonl"):
            if path.is_file():
                return Instances(lambda path=path: _rows(path), None, _file_source(path), str(path))
        config = base / length
        if (config / "dataset_dict.json").is_file():
            return _saved(config, task, data)
        found = sorted(config.glob(f"{task}.*")) + sorted(config.glob(f"{task}-*.parquet"))
        found = [p for p in found if p.suffix in (".json", ".jsonl", ".parquet")]
        if len(found) > 1 and all(p.suffix == ".parquet" for p in found):
            raise fail(f"--data {data}: {task} at {length} is split over {len(found)} parquet files",
                       "join them into one file, or load the set with hub:NAME")  # fmt: skip
        if found:
            path = found[0]
            if path.suffix == ".parquet":
                return Instances(None, path, _file_source(path), str(path))
            return Instances(lambda path=path: _rows(path), None, _file_source(path), str(path))
    raise fail(f"--data {data} holds no {task} at {length}; it holds {holdings(root)}",
               "ask for --tasks and --lengths the folder has, or pass the folder of that set")  # fmt: skip


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
    return Instances(lambda: split, None, {"path": str(config), "fingerprint": split._fingerprint}, f"{config}/{task}")


def _hub(name: str, task: str, length: str) -> Instances:
    import datasets

    try:
        split = datasets.load_dataset(name, length, split=task)
    except Exception as e:  # offline, no such config or split
        reason = " ".join(str(e).split())[:160]
        raise fail(f"cannot load {name} ({length}, {task}) from the hub: {reason}",
                   "without network, pass --data DIR with the set's files") from None  # fmt: skip
    return Instances(lambda: split, None, {"hub": name, "config": length, "fingerprint": split._fingerprint},
                     f"{name} {length}/{task}")  # fmt: skip
