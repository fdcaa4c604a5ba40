"""A report's results read field by field, each checked as it is read: the one way the suites' table readers
(LongBench's, MT-Bench's) turn a hand-edited or damaged report into one line naming the field, never a traceback.
It imports nothing of runs/, so runs/report.py can check a report through the same readers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import fail
from ..text import is_number

FIX = "pass an unedited report written by megaeval --out"
Part = tuple[str, list[str], list[list[str]]]  # a table: its title, header and rows, as the renderers draw it
Check = tuple[Callable[[Any], bool], str]

NUMBER: Check = (is_number, "a number")
NUMBER_OR_NULL: Check = (lambda v: v is None or is_number(v), "a number or null")
COUNT: Check = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a count")
TEXT: Check = (lambda v: isinstance(v, str), "a text")
BOOLEAN: Check = (lambda v: isinstance(v, bool), "true or false")
OBJECT: Check = (lambda v: isinstance(v, dict) and len(v) > 0, "a non-empty object")


def field(obj: dict[str, Any], key: str, where: str, check: Check) -> Any:
    """`obj[key]` if it passes `check`, or one line naming `where.key` and what it must be."""
    right, what = check
    if key not in obj or not right(obj[key]):
        shown = "missing" if key not in obj else f"{obj[key]!r:.40}"
        raise fail(f"{where}.{key} is {shown}, not {what}", FIX)
    return obj[key]


def exactly(obj: dict[str, Any], keys: tuple[str, ...], where: str, check: Check) -> dict[str, Any]:
    """`obj` holding exactly `keys`, each passing `check` (a key it lacks or one more is named)."""
    extra = next((k for k in obj if k not in keys), None)
    if extra is not None:
        raise fail(f"{where} holds {extra!r:.40}, not only {', '.join(keys)}", FIX)
    return {k: field(obj, k, where, check) for k in keys}
