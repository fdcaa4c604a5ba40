"""SCROLLS tasks prepared before any model loads: choices checked, examples read and limited, exemplars drawn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import fail
from ..data import load_split
from ..specs import data_choices, load_spec
from .docs import Example, check_template, group_examples, pick_exemplars


@dataclass
class ScrollsTask:
    """A SCROLLS task prepared before any model loads: its examples, exemplars and choices."""

    name: str
    chosen: dict[str, Any]
    examples: list[Example]  # the first --limit of the evaluated split
    questions: list[str]  # every question of the split (a fixed-context model's prefix reserves room for the longest)
    exemplars: list[Example]


def scrolls_task_choices(settings: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The effective choices of one SCROLLS task (`settings.per_task.<task>` in the report): the task file's
    defaults unless a flag overrides them. Refuses a bad template, shot count, length or stop string."""
    task = spec["task"]
    chosen = {
        **data_choices(spec, settings.shots, settings.split),
        "template": settings.template or spec["template"],
        "max_new_tokens": spec["max_new_tokens"] if settings.max_new_tokens is None else settings.max_new_tokens,
        "stop": spec["stop"] if settings.stop is None else settings.stop,
        "metric": spec["metric"],
    }
    check_template(chosen["template"], "--template" if settings.template else f"the {task} task file's template")
    for key, least in (("shots", 0), ("max_new_tokens", 1)):  # a flag, or else the task file, gave the value
        if chosen[key] < least:
            flag = "--" + key.replace("_", "-")
            where = flag if getattr(settings, key) is not None else f"the {task} task file's {key}"
            raise fail(f"{where} must be at least {least}, got {chosen[key]}", f"pass {flag} {least} or more")
    if "" in chosen["stop"]:  # it would match at once (or, dropped, leave answers unstopped): refuse, don't guess
        where = "--stop ''" if settings.stop is not None else f"the {task} task file's stop list holds ''"
        raise fail(f"{where}: an empty stop string cannot mark where an answer ends",
                   "pass a non-empty stop string (escapes such as \\n work), or leave --stop out for the task's "
                   "default (newline)")  # fmt: skip
    return chosen


def prepare_scrolls_task(settings: Any, task: str, data: dict[str, Any], exemplars: bool = True) -> ScrollsTask:
    """Check one task's choices, read its split (the first --limit examples) and, when `exemplars`, draw its
    exemplars from the few-shot split; `data` gets where each split came from."""
    spec = load_spec("scrolls", task)
    chosen = scrolls_task_choices(settings, spec)
    rows, data[task] = load_split(task, chosen["split"], settings.data_dir, chosen["hub"])
    grouped = group_examples(rows, data[task].get("path", task))
    examples = grouped[: settings.limit]
    if not examples:
        raise fail(f"{task}: the {chosen['split']} split is empty", "check --data-dir and --split")
    drawn: list[Example] = []
    if exemplars:
        pool: list[Example] = []
        if chosen["shots"]:
            rows, data[f"{task}:shots"] = load_split(task, chosen["shot_split"], settings.data_dir, chosen["hub"])
            pool = group_examples(rows, data[f"{task}:shots"].get("path", task))
        drawn = pick_exemplars(pool, chosen["shots"], settings.seed, task)
    return ScrollsTask(task, chosen, examples, [ex.question for ex in grouped], drawn)
