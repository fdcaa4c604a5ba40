"""Task definitions, stored as one small YAML file per task under suites/<suite>/ (megaeval.suites), plus the
user's own task files from `--include-path` folders (as lm-evaluation-harness's --include_path).

Every task file is read here: a file that is not YAML, not a mapping, or includes a file that is missing is refused
in one line naming the file; what each field must hold is the suite's to check (e.g. `needle.spec`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import fail

TaskFiles = dict[str, Any]  # task name -> its file (a Path, or an importlib resource)


def task_files(suite: str, include_paths: tuple[str, ...] | list[str] = ()) -> TaskFiles:
    """Every task of a suite by name: the shipped ones, then those of each --include-path folder (a name given twice
    is refused). Files named _NAME.yaml are not tasks: they hold what several tasks include."""
    found: TaskFiles = {}
    for p in resources.files("megaeval.suites").joinpath(suite).iterdir():
        if p.name.endswith(".yaml") and not p.name.startswith("_"):
            found[p.name.removesuffix(".yaml")] = p
    for folder in map(Path, include_paths):
        if not folder.is_dir():
            raise fail(f"--include-path {folder}: no such folder", f"pass a folder of {suite} task .yaml files")
        mine = sorted(p for p in folder.iterdir() if p.name.endswith(".yaml") and not p.name.startswith("_"))
        if not mine:
            raise fail(f"--include-path {folder} holds no .yaml task files", f"pass a folder of {suite} task files")
        for p in mine:
            name = p.name.removesuffix(".yaml")
            if name in found:
                raise fail(f"--include-path: the task {name!r} of {p} is also defined by {found[name]}",
                           "rename one of them (a task name must be unique)")  # fmt: skip
            found[name] = p
    return dict(sorted(found.items()))


def list_tasks(suite: str, include_paths: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Names of the tasks of a suite (and of the --include-path folders), sorted."""
    return list(task_files(suite, include_paths))


def load_spec(
    suite: str, task: str, include_paths: tuple[str, ...] | list[str] = (),
    check: Callable[[dict[str, Any], str], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The definition of one task of a suite (`include: FILE` first merges in a file that several tasks share, from
    the task file's folder or else the suite's; the task's own keys win), checked by `check(spec, file)` if given."""
    files = task_files(suite, include_paths)
    if task not in files:
        raise fail(f"unknown {suite} task {task!r}", f"choose from: {', '.join(files)}")
    path = files[task]
    spec = read_yaml(path)
    seen = [path.name]
    while "include" in spec:
        name = spec.pop("include")
        shared = _included(suite, path, name)
        if shared.name in seen:
            raise fail(f"task file {path}: `include: {name}` includes itself again", "remove the loop")
        seen.append(shared.name)
        spec = {**read_yaml(shared), **spec}
    spec.setdefault("task", task)
    if check is not None:
        check(spec, str(path))
    return spec


def check_fields(
    spec: dict[str, Any], fields: tuple[str, ...], what: str, bad: Callable[[str, str], Exception]
) -> None:  # fmt: skip
    """Refuse a task definition with a field that is not one of `fields` (a typo, say), or without one of them."""
    unknown = sorted(set(spec) - set(fields))
    if unknown:
        raise bad(unknown[0], f"is not a field of {what} (fields: {', '.join(fields)})")
    missing = [f for f in fields if f not in spec]
    if missing:
        raise bad(missing[0], "is missing")


def spec_sha256(suite: str, task: str, include_paths: tuple[str, ...] | list[str] = ()) -> str:
    """Checksum of a task's definition as loaded (its file and what it includes, merged): what a report records."""
    import json

    text = json.dumps(load_spec(suite, task, include_paths), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _included(suite: str, task_file: Any, name: Any) -> Any:
    """The file an `include:` names: beside the task file, else among the suite's shared files."""
    if not isinstance(name, str) or not name.endswith(".yaml") or "/" in name or "\\" in name:
        raise fail(f"task file {task_file}: `include: {name!r}` must name a .yaml file (no folders)",
                   "write e.g. include: _ruler_niah.yaml")  # fmt: skip
    for candidate in (task_file.parent / name if isinstance(task_file, Path) else None,
                      resources.files("megaeval.suites").joinpath(suite, name)):  # fmt: skip
        if candidate is not None and candidate.is_file():
            return candidate
    raise fail(f"task file {task_file}: `include: {name}` names a file that does not exist",
               f"put {name} beside it, or include one of the suite's shared files")  # fmt: skip


def read_yaml(path: Any) -> dict[str, Any]:
    """A task file as a mapping, or a one-line refusal naming the file."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"cannot read task file {path} ({getattr(e, 'strerror', None) or e})", "check the file") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise fail(f"task file {path} is not valid YAML{where} ({problem})", "fix its syntax") from None
    if not isinstance(spec, dict) or not all(isinstance(k, str) for k in spec):
        raise fail(f"task file {path} is not a mapping of field names to values", "write `field: value` lines")
    return spec


def parse_tasks(text: str, suite: str, include_paths: tuple[str, ...] | list[str] = ()) -> list[str]:
    """'all' or a comma-separated list of task names, validated and in the given order."""
    known = list_tasks(suite, include_paths)
    if text.strip() == "all":
        return known
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in known]
    if not tasks or unknown:
        raise fail(
            f"unknown {suite} task(s) {', '.join(unknown) or repr(text)}", f"choose from: all, {', '.join(known)}"
        )
    return tasks


def data_choices(spec: dict[str, Any], shots: int | None, split: str | None = None) -> dict[str, Any]:
    """The per-task choices every suite records first: where the data comes from and how many shots (None: the
    task file's own split and shots)."""
    return {
        "hub": spec["hub"],
        "split": split or spec["split"],
        "shot_split": spec["shot_split"],
        "shots": spec["shots"] if shots is None else shots,
    }
