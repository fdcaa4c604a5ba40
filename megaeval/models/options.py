"""Parsing model options (`--model-args key=value,...`) into typed values, strictly."""

from __future__ import annotations

import inspect
from collections.abc import Callable
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
        key = key.strip()
        if key in options:
            raise fail(f"--model-args gives {key} twice", f"give {key}= once")
        if key in RUN_FLAGS:
            raise fail(f"--model-args {key}= is not a model option", f"use --{key} {value.strip()}")
        options[key] = _parse_value(value.strip())
    return options


RUN_FLAGS = ("dtype", "device")  # how to load any model: flags of their own, never --model-args


def check_option_types(family: str, load: Callable[..., Any], options: dict[str, Any]) -> None:
    """Refuse an option whose value is not of the type the family's `load` declares (int, float or str; yes/no
    options are read by `as_bool`): `max_context=1.5` is not silently 1, nor `max_context=abc` a crash."""
    declared = {p.name: str(p.annotation) for p in inspect.signature(load).parameters.values()}
    for key, value in options.items():
        kind = declared.get(key, "").split("|")[0].strip()
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise fail(f"option {key}={value!r} of {family} models must be a whole number", f"write {key}=N")
        if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise fail(f"option {key}={value!r} of {family} models must be a number", f"write {key}=X")
        if kind == "str" and not isinstance(value, str) and value is not None:
            raise fail(f"option {key}={value!r} of {family} models must be text",
                       f"write {key}=NAME (a path such as ./{value} for a file named so)")  # fmt: skip
        if kind == "str" and isinstance(value, str) and not value.strip():  # `tokenizer=` would mean the cwd
            raise fail(f"option {key}= of {family} models is empty", f"write {key}=VALUE or leave {key} out")


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
