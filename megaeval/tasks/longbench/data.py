"""LongBench's records, checked once when read:

- v1 and LongBench-E: DIR/data/<task>.jsonl and DIR/data/<task>_e.jsonl (the official data.zip unpacked;
  DIR/<task>.jsonl too), or `hub:THUDM/LongBench` through `datasets` (from its cache offline). Fields: input,
  context, answers, length, dataset, language, all_classes, _id.
- v2: data.json (a JSON list; or JSONL), or `hub:THUDM/LongBench-v2`. Fields: _id, domain, sub_domain,
  difficulty, length, question, choice_A .. choice_D, answer, context.

A record that lacks a field the protocol reads, or holds the wrong kind of value, is refused in one line naming the
file, the record and the field; a file of the other version's records is named as such."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ...text import iter_jsonl, read_json

HUB = "hub:"
V1_HUB, V2_HUB = "THUDM/LongBench", "THUDM/LongBench-v2"
V1_TEXT = ("input", "context")
V2_TEXT = ("_id", "question", "choice_A", "choice_B", "choice_C", "choice_D", "context")
V2_LABELS = {"difficulty": ("easy", "hard"), "length": ("short", "medium", "long"), "answer": ("A", "B", "C", "D")}


def v1_path(data: str, task: str, longbench_e: bool) -> Path:
    """The file of a v1 task (its LongBench-E file with `longbench_e`) in a --data folder."""
    name = f"{task}_e.jsonl" if longbench_e else f"{task}.jsonl"
    root = Path(data)
    if not root.is_dir():
        raise fail(f"--data {data}: no such folder", "pass the folder of LongBench's data/<task>.jsonl files")
    for path in (root / "data" / name, root / name):
        if path.is_file():
            return path
    have = sorted(p.stem for p in [*root.glob("*.jsonl"), *root.glob("data/*.jsonl")])
    raise fail(f"--data {data} holds no {name} (it holds: {', '.join(have[:12]) or 'no .jsonl files'})",
               "pass the folder of LongBench's unpacked data.zip, or ask for --tasks it holds")  # fmt: skip


def read_v1(data: str, task: str, longbench_e: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A v1 task's records, checked, and where they come from (path and sha256, or the hub's fingerprint)."""
    if data.startswith(HUB):
        name = data.removeprefix(HUB) or V1_HUB
        rows = _hub(name, f"{task}_e" if longbench_e else task, "test")
        source: dict[str, Any] = {"hub": name, "fingerprint": rows._fingerprint}
        where = f"{name} {task}"
        records = [(i + 1, dict(r)) for i, r in enumerate(rows)]
    else:
        path = v1_path(data, task, longbench_e)
        source, where = {"path": str(path), "sha256": file_sha256(path)}, str(path)
        records = list(iter_jsonl(path, "LongBench file", "pass LongBench's files as released"))
    if not records:
        raise fail(f"{where} holds no records", "pass LongBench's files as released")
    return [check_v1(r, f"{where} line {n}") for n, r in records], source


def check_v1(record: Any, where: str) -> dict[str, Any]:
    """A v1 record, or one line naming the field it lacks or holds wrong."""
    if not isinstance(record, dict):
        raise fail(f"{where} is a {type(record).__name__}, not a LongBench record", "pass LongBench's files")
    if "answers" not in record and "choice_A" in record:
        raise fail(f"{where} is a LongBench v2 record (question, choice_A .. choice_D)", "pass it with --version 2")
    for name in V1_TEXT:
        if not isinstance(record.get(name), str):
            raise fail(f"{where}: `{name}` is {_what(record, name)}; a LongBench v1 record holds it as text",
                       "pass LongBench's files as released")  # fmt: skip
    answers = record.get("answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise fail(f"{where}: `answers` is {_what(record, 'answers')}; it must be a non-empty list of texts",
                   "pass LongBench's files as released")  # fmt: skip
    classes = record.get("all_classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise fail(f"{where}: `all_classes` must be null or a list of texts", "pass LongBench's files as released")
    length = record.get("length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise fail(f"{where}: `length` is {_what(record, 'length')}; it must be a whole number (words or characters)",
                   "pass LongBench's files as released")  # fmt: skip
    return record


def read_v2(data: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """LongBench v2's items, checked, and where they come from."""
    if data.startswith(HUB):
        name = data.removeprefix(HUB) or V2_HUB
        rows = _hub(name, None, "train")
        source: dict[str, Any] = {"hub": name, "fingerprint": rows._fingerprint}
        items = [(f"{name} item {i + 1}", dict(r)) for i, r in enumerate(rows)]
    else:
        path = Path(data)
        if path.is_dir():
            path = path / "data.json"
        if not path.is_file():
            raise fail(f"--data {data}: no such file", "pass LongBench v2's data.json")
        source = {"path": str(path), "sha256": file_sha256(path)}
        if path.suffix == ".jsonl":
            items = [(f"{path} line {n}", r) for n, r in iter_jsonl(path, "LongBench v2 file")]
        else:
            rows = read_json(path, "LongBench v2 file", "pass LongBench v2's data.json as released")
            if not isinstance(rows, list):
                raise fail(f"{path} holds a {type(rows).__name__}, not a list of items",
                           "pass LongBench v2's data.json")  # fmt: skip
            items = [(f"{path} item {i + 1}", r) for i, r in enumerate(rows)]
    if not items:
        raise fail(f"{data} holds no items", "pass LongBench v2's data.json")
    checked = [check_v2(r, where) for where, r in items]
    seen: set[str] = set()
    for item in checked:
        if item["_id"] in seen:
            raise fail(f"{data}: the _id {item['_id']!r} is given twice", "pass each item once")
        seen.add(item["_id"])
    return checked, source


def check_v2(item: Any, where: str) -> dict[str, Any]:
    """A v2 item, or one line naming the field it lacks or holds wrong."""
    if not isinstance(item, dict):
        raise fail(f"{where} is a {type(item).__name__}, not a LongBench v2 item", "pass LongBench v2's data.json")
    if "answers" in item and "choice_A" not in item:
        raise fail(f"{where} is a LongBench v1 record (input, context, answers)", "pass it with --version 1")
    for name in V2_TEXT:
        if not isinstance(item.get(name), str):
            raise fail(f"{where}: `{name}` is {_what(item, name)}; a LongBench v2 item holds it as text",
                       "pass LongBench v2's data.json as released")  # fmt: skip
    for name, allowed in V2_LABELS.items():
        if item.get(name) not in allowed:
            raise fail(f"{where}: `{name}` is {_what(item, name)}; it must be one of {', '.join(allowed)}",
                       "pass LongBench v2's data.json as released")  # fmt: skip
    return item


def _what(record: dict[str, Any], name: str) -> str:
    return "missing" if name not in record else f"{type(record[name]).__name__} {str(record[name])[:40]!r}"


def _hub(name: str, config: str | None, split: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split) if config else datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, no such config
        raise fail(f"cannot load {name} {config or ''} from the hub: {' '.join(str(e).split())[:160]}",
                   "without network, pass --data with LongBench's files") from None  # fmt: skip
