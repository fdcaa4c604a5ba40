"""Reading a checkpoint config's fields, checked: every refusal is one line naming the file, the field as the file
writes it (a dotted key such as `ssm_cfg.headdim` reaches into a nested object) and the rule it breaks."""

from __future__ import annotations

import math
from typing import Any

from ..errors import fail

ABSENT = object()


def field(raw: dict[str, Any], key: str, default: Any = ABSENT) -> Any:
    """raw[key], a dotted key reaching into nested objects; `default` when the key, or an object on its way, is
    absent (a null object on the way counts as absent; a null value is returned, for the rule to name it)."""
    *parents, last = key.split(".")
    for name in parents:
        raw = raw.get(name)
        if not isinstance(raw, dict):
            return default
    return raw.get(last, default)


def _refuse(source: str, key: str, value: Any, rule: str) -> Exception:
    if value is ABSENT:
        return fail(f"{source}: {key} is missing", f"write {key}: {rule}")
    return fail(f"{source}: {key} must be {rule}, got {value!r}")


def positive_int(raw: dict[str, Any], key: str, source: str, default: Any = ABSENT) -> int:
    """raw[key] (or `default` when absent), checked to be a positive integer."""
    value = field(raw, key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _refuse(source, key, value, "a positive integer")
    return value


def positive_float(
    raw: dict[str, Any], key: str, source: str, default: Any = ABSENT, at_most: float = math.inf
) -> float:
    """raw[key] (or `default`), checked to be a finite number above 0 (and at most `at_most`, when finite)."""
    value = field(raw, key, default)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and 0 < value <= at_most and value < math.inf):  # NaN fails the comparisons too
        rule = "a positive number" if at_most == math.inf else f"a number above 0 and at most {at_most:g}"
        raise _refuse(source, key, value, rule)
    return float(value)


def flag(raw: dict[str, Any], key: str, source: str, default: Any = ABSENT) -> bool:
    """raw[key] (or `default`), checked to be true or false."""
    value = field(raw, key, default)
    if not isinstance(value, bool):
        raise _refuse(source, key, value, "true or false")
    return value


def filled(raw: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """raw with each key of `defaults` set to its default where absent or null: the fields transformers derives
    (from hidden_size, say) only when not given; any value given, 0 included, is kept and checked."""
    return {**raw, **{k: v for k, v in defaults.items() if raw.get(k) is None}}
