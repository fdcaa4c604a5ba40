"""Text files in and out through one place: strict UTF-8, no lone surrogates (JSON's `\\ud800` escapes, which no
UTF-8 writer can write back), and every refusal naming the file and the line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import MegaevalError, fail

CONVERT = "convert the file to UTF-8 text"


def read_text(path: str | Path, what: str = "", fix: str = "check the path and its permissions") -> str:
    """The UTF-8 text of a file; a missing, unreadable or non-UTF-8 file is one line naming it (and `what` it is)."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise fail(f"{name}: no such file", fix) from None
    except IsADirectoryError:
        raise fail(f"{name} is a folder, not a file", fix) from None
    except OSError as e:
        raise fail(f"cannot read {name}: {e.strerror or e}", fix) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise fail(f"{name} line {line} is not UTF-8 text ({e.reason} at byte {e.start})", CONVERT) from None


def check_text(value: Any, where: str) -> Any:
    """`value` itself, after checking that every string in it (keys included, however deep) is writable UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_string(item, where)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    _check_string(key, where)
                stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return value


def _check_string(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        raise fail(f"{where} holds a lone surrogate (U+{code:04X}), which is not text",
                   "write the character itself, or a complete \\ud8xx\\udcxx pair") from None  # fmt: skip


def parse_json(text: str, where: str, fix: str = "fix the file") -> Any:
    """One JSON value from `text` (read from `where`: "FILE" or "FILE line N"), its strings checked."""
    return check_text(_loads(text, where, fix), where)


def read_json(path: str | Path, what: str = "", fix: str = "fix the file") -> Any:
    """The JSON value a UTF-8 file holds, or one line naming the file (and the line, for a lone surrogate)."""
    text = read_text(path, what, fix)
    name = f"{what} {path}" if what else str(path)
    value = _loads(text, name, fix)
    try:
        return check_text(value, name)
    except MegaevalError:
        raise fail(f"{name} line {_surrogate_line(text)} holds a lone surrogate escape (\\udXXX), which is not text",
                   "write the character itself, or a complete surrogate pair") from None  # fmt: skip


def _loads(text: str, where: str, fix: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise fail(f"{where} is nested too deeply to be data", fix) from None
    except ValueError as e:
        raise fail(f"{where} is not valid JSON ({e})", fix) from None


def _surrogate_line(text: str) -> int:
    """The line of the first lone surrogate escape in JSON text (1 when it cannot be placed)."""
    pair = r"\\u[dD][89abAB][0-9a-fA-F]{2}(?P<low>\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    for m in re.finditer(pair, text):
        if m.group(0)[3].lower() in "cdef" or not m.group("low"):
            return text.count("\n", 0, m.start()) + 1
    return 1


def iter_jsonl(path: str | Path, what: str = "", fix: str = "fix or remove that line") -> Iterator[tuple[int, Any]]:
    """(line number, JSON value) for each non-blank line of a UTF-8 JSONL file, read a line at a time."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise fail(f"{name}: no such file", "check the path") from None
    except IsADirectoryError:
        raise fail(f"{name} is a folder, not a file", "check the path") from None
    except OSError as e:
        raise fail(f"cannot read {name}: {e.strerror or e}", "check the path and its permissions") from None
    with f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise fail(f"{name} line {number} is not UTF-8 text ({e.reason})", CONVERT) from None
            if line.strip():
                yield number, parse_json(line, f"{name} line {number}", fix)
