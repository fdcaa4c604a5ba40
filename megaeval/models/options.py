"""Parsing model options (`--model-args key=value,...`) into typed values, strictly."""

from __future__ import annotations

from typing import Any

from ..errors import fail

TRUE_WORDS = ("true", "1")
FALSE_WORDS = ("false", "0")


def parse_model_args(text: str | None) -> dict[str, Any]:
    """Parse 'k=v,k2=v2' into a dict; true/false become bools and numbers become numbers."""
    options: dict[str, Any] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise fail(f"bad --model-args item {item!r}", "write key=value pairs separated by commas")
        options[key.strip()] = _parse_value(value.strip())
    return options


def _parse_value(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def as_bool(name: str, value: Any) -> bool:
    """An option that must be a yes/no: True/False, 1/0 or the words true/false; anything else is an error.

    A consent flag such as trust_remote_code must never read "no" or "off" as yes.
    """
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if isinstance(value, (int, str)) and word in TRUE_WORDS:
        return True
    if isinstance(value, (int, str)) and word in FALSE_WORDS:
        return False
    raise fail(f"option {name}={value!r} is not true or false", f"write {name}=true or {name}=false")
