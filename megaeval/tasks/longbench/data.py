"""LongBench's records, checked once when read:

- v1 and LongBench-E: DIR/data/<task>.jsonl and DIR/data/<task>_e.jsonl (the official data.zip unpacked;
  DIR/<task>.jsonl too), or `hub:THUDM/LongBench` through `datasets` (from its cache offline). Fields: input,
  context, answers, length, dataset, language, all_classes, _id.
- v2: data.json (a JSON list; or JSONL), or `hub:THUDM/LongBench-v2`. Fields: _id, domain, sub_domain,
  difficulty, length, question, choice_A .. choice_D, answer, context.

The official prediction files (pred.py's lines, which `--predictions` scores) are records too, checked by the same
rules: a v1 line (pred, answers, all_classes, length) and a v2 line (the item's fields, judge, pred).

A record that lacks a field the protocol reads, or holds the wrong kind of value, or that its task's metric could
not score (a classification record without class names, a retrieval answer naming no paragraph), is refused in one
line naming the file, the record and the field; a file of the other version's records is named as such."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import dataset_files_sha256, file_sha256
from ...metrics.longbench import unscorable
from ...text import iter_jsonl, read_json

HUB = "hub:"
V1_HUB, V2_HUB = "THUDM/LongBench", "THUDM/LongBench-v2"
V2_TEXT = ("_id", "domain", "sub_domain", "question", "choice_A", "choice_B", "choice_C", "choice_D", "context")
RELEASED, PREDICTED = "pass LongBench's files as released", "pass the files pred.py wrote"

Check = tuple[Callable[[Any], bool], str]  # (whether a value is right, what it must be)
TEXT: Check = (lambda v: isinstance(v, str), "text")
ANSWERS: Check = (lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(a, str) for a in v),
                  "a non-empty list of texts")  # fmt: skip
CLASSES: Check = (lambda v: v is None or (isinstance(v, list) and all(isinstance(c, str) for c in v)),
                  "null or a list of texts")  # fmt: skip
LENGTH: Check = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                 "a whole number of at least 0 (words; characters in Chinese)")  # fmt: skip
BOOLEAN: Check = (lambda v: isinstance(v, bool), "true or false")
LETTER: Check = (lambda v: v is None or (isinstance(v, str) and v in "ABCD" and len(v) == 1), "null or A, B, C or D")


def one_of(*allowed: str) -> Check:
    """The check of a label: one of `allowed`, exactly."""
    return (lambda v: isinstance(v, str) and v in allowed, f"one of {', '.join(allowed)}")


@dataclass(frozen=True)
class RecordType:
    """One kind of LongBench line: what each field must hold, which fields may be missing, and the fix to name."""

    name: str
    version: int
    fields: dict[str, Check]
    fix: str
    optional: tuple[str, ...] = ()


V2_LABELS = {"difficulty": one_of("easy", "hard"), "length": one_of("short", "medium", "long")}
V1_RECORD = RecordType("LongBench v1 record", 1, {"input": TEXT, "context": TEXT, "answers": ANSWERS,
                       "all_classes": CLASSES, "length": LENGTH}, RELEASED, ("all_classes",))  # fmt: skip
V1_PREDICTION = RecordType("LongBench v1 prediction", 1, {"pred": TEXT, "answers": ANSWERS, "all_classes": CLASSES,
                           "length": LENGTH}, PREDICTED, ("length",))  # fmt: skip
V2_ITEM = RecordType("LongBench v2 item", 2, {**dict.fromkeys(V2_TEXT, TEXT), **V2_LABELS, "answer": one_of(*"ABCD")},
                     "pass LongBench v2's data.json as released")  # fmt: skip
V2_PREDICTION = RecordType("LongBench v2 prediction", 2, {"_id": TEXT, "domain": TEXT, "judge": BOOLEAN,
                           "pred": LETTER, **V2_LABELS}, "pass the file v2's pred.py wrote", ("domain",))  # fmt: skip


def check_record(record: Any, where: str, kind: RecordType) -> dict[str, Any]:
    """`record` if it holds every field of `kind` as it must, or one line naming the field."""
    if not isinstance(record, dict):
        raise fail(f"{where} is a {type(record).__name__}, not a {kind.name}", kind.fix)
    other = other_version(record, kind)
    if other is not None:
        raise fail(f"{where} is {other}", f"pass it with --version {3 - kind.version}")
    for name, (right, what) in kind.fields.items():
        if name in kind.optional and name not in record:
            continue
        if name not in record or not right(record[name]):
            raise fail(f"{where}: `{name}` is {_what(record, name)}; it must be {what}", kind.fix)
    return record


def other_version(record: dict[str, Any], kind: RecordType) -> str | None:
    """What the other version's record `record` is (None when it is not one)."""
    v2 = "choice_A" in record or "judge" in record
    if kind.version == 2 and "answers" in record and not v2:
        return "a LongBench v1 record (input, context, answers)" if "pred" not in record else \
            "a LongBench v1 prediction (pred, answers)"  # fmt: skip
    if kind.version == 1 and "answers" not in record and v2:
        return "a LongBench v2 record (question, choice_A .. choice_D)" if "judge" not in record else \
            "a LongBench v2 prediction (judge, pred)"  # fmt: skip
    return None


def check_scorable(record: dict[str, Any], where: str, metric: str, fix: str) -> None:
    """Refuse a v1 record (or prediction) that its task's metric could not score, naming the field."""
    problem = unscorable(metric, record["answers"], record.get("all_classes"))
    if problem is not None:
        raise fail(f"{where}: {problem}", fix)


def v1_path(data: str, task: str, longbench_e: bool) -> Path:
    """The file of a v1 task (its LongBench-E file with `longbench_e`) in a --data folder."""
    name = f"{task}_e.jsonl" if longbench_e else f"{task}.jsonl"
    root = v1_folder(data, "--data")
    for path in (root / "data" / name, root / name):
        if path.is_file():
            return path
    have = sorted(p.stem for p in [*root.glob("*.jsonl"), *root.glob("data/*.jsonl")])
    raise fail(f"--data {data} holds no {name} (it holds: {', '.join(have[:12]) or 'no .jsonl files'})",
               "pass the folder of LongBench's unpacked data.zip, or ask for --tasks it holds (--tasks present: "
               "every task it holds)")  # fmt: skip


def v1_folder(given: str, flag: str) -> Path:
    """A v1 folder (--data, or --predictions), or one line naming what it is instead (v2's file by its fields)."""
    root = Path(given)
    if root.is_dir():
        return root
    what = "LongBench's data/<task>.jsonl files" if flag == "--data" else "pred.py's <task>.jsonl files"
    if root.is_file():
        if looks_v2(root):
            kind = "LongBench v2's data.json" if flag == "--data" else "a LongBench v2 prediction file"
            raise fail(f"{flag} {given} is {kind} (its records hold choice_A .. choice_D)",
                       f"pass it with --version 2; --version 1 reads a folder of {what}")  # fmt: skip
        raise fail(f"{flag} {given} is a file; LongBench v1 reads a folder", f"pass the folder of {what}")
    raise fail(f"{flag} {given}: no such folder", f"pass the folder of {what}")


def v2_file(given: str, flag: str) -> Path:
    """v2's one file (--data: data.json, or a folder holding it; --predictions), or one line naming what it is
    instead (a v1 folder by its <task>.jsonl files)."""
    path = Path(given)
    if path.is_dir() and flag == "--data" and (path / "data.json").is_file():
        return path / "data.json"
    if path.is_file():
        return path
    if path.is_dir():
        tasks = sorted(p.stem for p in [*path.glob("*.jsonl"), *path.glob("data/*.jsonl")])
        what = "data.json" if flag == "--data" else "the .jsonl file v2's pred.py wrote"
        if tasks:
            kind = "LongBench v1's folder" if flag == "--data" else "a folder of LongBench v1 prediction files"
            raise fail(f"{flag} {given} is {kind} ({', '.join(tasks[:6])}{', ...' if len(tasks) > 6 else ''})",
                       f"pass it with --version 1; --version 2 reads {what}")  # fmt: skip
        raise fail(f"{flag} {given} is a folder without data.json", f"pass LongBench v2's {what}")
    raise fail(f"{flag} {given}: no such file", "pass LongBench v2's data.json" if flag == "--data" else
               "pass the .jsonl file v2's pred.py wrote")  # fmt: skip


def looks_v2(path: Path) -> bool:
    """Whether a file's first records are LongBench v2's (read from its first 64 KiB: v2's fields come before the
    context, v1's answers after it)."""
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return b'"choice_A"' in head or b'"judge"' in head


def present_tasks(data: str, tasks: list[str], longbench_e: bool) -> list[str]:
    """The v1 tasks of `tasks` whose file the --data folder holds (`--tasks present`), in that order."""
    if data.startswith(HUB):
        raise fail("--tasks present names the tasks a --data folder holds, and hub: is not a folder",
                   "name the tasks (--tasks qasper,trec), or all")  # fmt: skip
    root = v1_folder(data, "--data")
    suffix = "_e.jsonl" if longbench_e else ".jsonl"
    present = [t for t in tasks if (root / "data" / f"{t}{suffix}").is_file() or (root / f"{t}{suffix}").is_file()]
    if not present:
        raise fail(f"--data {data} holds no LongBench{'-E' if longbench_e else ''} task file (<task>{suffix})",
                   "pass the folder of LongBench's unpacked data.zip")  # fmt: skip
    return present


def read_v1(
    data: str, task: str, longbench_e: bool, metric: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """A v1 task's records, checked (for the task's `metric` too, when given), and where they come from (path and
    sha256, or the hub's fingerprint)."""
    if data.startswith(HUB):
        name = data.removeprefix(HUB) or V1_HUB
        rows = _hub(name, f"{task}_e" if longbench_e else task, "test")
        source: dict[str, Any] = {"hub": name, "fingerprint": rows._fingerprint, "sha256": dataset_files_sha256(rows)}
        where = f"{name} {task}"
        records = [(i + 1, dict(r)) for i, r in enumerate(rows)]
    else:
        path = v1_path(data, task, longbench_e)
        source, where = {"path": str(path), "sha256": file_sha256(path)}, str(path)
        records = list(iter_jsonl(path, "LongBench file", RELEASED))
    if not records:
        raise fail(f"{where} holds no records", RELEASED)
    return [check_v1(r, f"{where} line {n}", metric) for n, r in records], source


def check_v1(record: Any, where: str, metric: str | None = None) -> dict[str, Any]:
    """A v1 record (that `metric` can score, when given), or one line naming the field it lacks or holds wrong."""
    check_record(record, where, V1_RECORD)
    if metric is not None:
        check_scorable(record, where, metric, RELEASED)
    return record


def check_v1_prediction(row: Any, where: str, metric: str, longbench_e: bool) -> dict[str, Any]:
    """A line of pred.py's v1 files, by the rules of a v1 record: `length` too with LongBench-E (its buckets)."""
    check_record(row, where, V1_PREDICTION)
    if longbench_e and "length" not in row:
        raise fail(f"{where}: `length` is missing; LongBench-E's buckets need it", "pass pred_e/ files, or drop --e")
    check_scorable(row, where, metric, PREDICTED)
    return row


def read_v2(data: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """LongBench v2's items, checked, and where they come from."""
    if data.startswith(HUB):
        name = data.removeprefix(HUB) or V2_HUB
        rows = _hub(name, None, "train")
        source: dict[str, Any] = {"hub": name, "fingerprint": rows._fingerprint, "sha256": dataset_files_sha256(rows)}
        items = [(f"{name} item {i + 1}", dict(r)) for i, r in enumerate(rows)]
    else:
        path = v2_file(data, "--data")
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
    return check_v2_all(items, V2_ITEM), source


def check_v2(item: Any, where: str) -> dict[str, Any]:
    """A v2 item, or one line naming the field it lacks or holds wrong."""
    return check_record(item, where, V2_ITEM)


def check_v2_all(items: list[tuple[str, Any]], kind: RecordType) -> list[dict[str, Any]]:
    """v2 items or prediction lines ((where, record) pairs), each checked, each _id once."""
    seen: dict[str, str] = {}
    for where, item in items:
        check_record(item, where, kind)
        if item["_id"] in seen:
            raise fail(f"{where}: the _id {item['_id']!r:.60} was given before ({seen[item['_id']]})",
                       "pass each item once")  # fmt: skip
        seen[item["_id"]] = where
    return [item for _, item in items]


def _what(record: dict[str, Any], name: str) -> str:
    return "missing" if name not in record else f"{type(record[name]).__name__} {str(record[name])[:40]!r}"


def _hub(name: str, config: str | None, split: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split) if config else datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, no such config
        raise fail(f"cannot load {name} {config or ''} from the hub: {' '.join(str(e).split())[:160]}",
                   "without network, pass --data with LongBench's files") from None  # fmt: skip
