"""What a LongBench v1 task file (suites/longbench/<task>.yaml, or a user's from --include-path) must hold, checked
once when it is read, and LongBench v2's prompt templates (suites/longbench/_v2.yaml)."""

from __future__ import annotations

import string
from functools import cache
from importlib import resources
from typing import Any

from ...errors import fail
from ...metrics.longbench import METRICS
from ..specs import check_fields, load_spec, read_yaml

FIELDS = ("task", "prompt", "max_new_tokens", "metric", "language", "chat", "first_line", "stop_at_newline",
          "longbench_e")  # fmt: skip
RECORD_FIELDS = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")
LANGUAGES = ("en", "zh", "code")
V2_TEMPLATES = ("0shot", "0shot_cot", "0shot_cot_ans", "0shot_no_context")


def load_longbench_task(name: str, include_paths: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """A LongBench v1 task's definition (suites/longbench/NAME.yaml, or NAME.yaml of an --include-path folder),
    checked."""
    return load_spec("longbench", name, include_paths, check_longbench_spec)


def check_longbench_spec(spec: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming the file and the field, a LongBench task definition that could not run right."""

    def bad(field: str, rule: str) -> Exception:
        return fail(f"longbench task file {where}: `{field}` {rule}", "fix the task file (see suites/longbench/)")

    check_fields(spec, FIELDS, "a longbench task", bad)
    if not isinstance(spec["task"], str) or not spec["task"].strip():
        raise bad("task", "must be a non-empty name")
    if not isinstance(spec["prompt"], str):
        raise bad("prompt", "must be a text")
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(spec["prompt"]) if name is not None}
    except ValueError as e:
        raise bad("prompt", f"is not a valid template ({e}; write a literal brace as {{{{ or }}}})") from None
    unknown = sorted(n for n in names if n.split(".")[0].split("[")[0] not in RECORD_FIELDS)
    if unknown:
        raise bad("prompt", f"has the placeholder {{{unknown[0]}}}, which is not a record field "
                            f"({', '.join(RECORD_FIELDS)})")  # fmt: skip
    budget = spec["max_new_tokens"]
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise bad("max_new_tokens", f"is {budget!r}; it must be a whole number of at least 1")
    if spec["metric"] not in METRICS:
        raise bad("metric", f"is {spec['metric']!r}; it must be one of {', '.join(METRICS)}")
    if spec["language"] not in LANGUAGES:
        raise bad("language", f"is {spec['language']!r}; it must be one of {', '.join(LANGUAGES)}")
    for field in ("chat", "first_line", "stop_at_newline", "longbench_e"):
        if not isinstance(spec[field], bool):
            raise bad(field, f"is {spec[field]!r}; it must be true or false")


@cache
def v2_templates() -> dict[str, str]:
    """LongBench v2's four prompt templates by name (0shot, 0shot_cot, 0shot_cot_ans, 0shot_no_context)."""
    spec = read_yaml(resources.files("megaeval.suites").joinpath("longbench", "_v2.yaml"))
    missing = [n for n in V2_TEMPLATES if not isinstance(spec.get(n), str)]
    if missing:
        raise fail(f"suites/longbench/_v2.yaml lacks the template {missing[0]}", "reinstall megaeval")
    return {n: spec[n] for n in V2_TEMPLATES}
