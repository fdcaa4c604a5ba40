"""Task definitions, stored as one small YAML file per task under suites/<suite>/ (megaeval.suites)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..errors import fail


def list_tasks(suite: str) -> list[str]:
    """Names of the tasks of a suite, sorted."""
    folder = resources.files("megaeval.suites").joinpath(suite)
    return sorted(
        p.name.removesuffix(".yaml")
        for p in folder.iterdir()
        if p.name.endswith(".yaml") and not p.name.startswith("_")
    )  # _NAME.yaml: what several tasks include


def load_spec(suite: str, task: str) -> dict[str, Any]:
    """The definition of one task of a suite (`include: FILE` first merges in a file of the same suite that
    several tasks share; the task's own keys win)."""
    known = list_tasks(suite)
    if task not in known:
        raise fail(f"unknown {suite} task {task!r}", f"choose from: {', '.join(known)}")
    spec = _read_yaml(suite, f"{task}.yaml")
    if "include" in spec:
        spec = {**_read_yaml(suite, spec.pop("include")), **spec}
    spec.setdefault("task", task)
    return spec


def _read_yaml(suite: str, name: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(resources.files("megaeval.suites").joinpath(suite, name).read_text(encoding="utf-8"))


def parse_tasks(text: str, suite: str) -> list[str]:
    """'all' or a comma-separated list of task names, validated and in the given order."""
    known = list_tasks(suite)
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
