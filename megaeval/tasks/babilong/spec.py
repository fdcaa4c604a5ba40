"""What a BABILong task file (suites/babilong/qaN.yaml, or a user's from --include-path) must hold, checked once when
it is read, and the lengths of the published sets (their config names: 0k, 1k, ... 1M, 10M)."""

from __future__ import annotations

import re
import string
from typing import Any

from ...errors import fail
from ..specs import check_fields, load_spec

FIELDS = ("task", "babi_file", "labels", "instruction", "examples", "post_prompt", "template", "max_new_tokens",
          "prompt_reserve", "facts_per_token", "min_sentence_tokens")  # fmt: skip
PLACEHOLDERS = {"instruction", "examples", "post_prompt", "context", "question"}
# The published configs, in order (RMT-team/babilong: 0k-1M, 10M; babilong-1k-samples: 0k-128k).
LENGTHS = ("0k", "1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1M", "2M", "10M")
_LENGTH = re.compile(r"(\d+)([kKmM])")


def load_babilong_task(name: str, include_paths: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """A BABILong task's definition (suites/babilong/NAME.yaml, or NAME.yaml of an --include-path folder), checked."""
    return load_spec("babilong", name, include_paths, check_babilong_spec)


def check_babilong_spec(spec: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming the file and the field, a BABILong task definition that could not run right."""

    def bad(field: str, rule: str) -> Exception:
        return fail(f"babilong task file {where}: `{field}` {rule}", "fix the task file (see suites/babilong/)")

    check_fields(spec, FIELDS, "a babilong task", bad)
    for field in ("task", "babi_file"):
        if not isinstance(spec[field], str) or not spec[field].strip():
            raise bad(field, "must be a non-empty name")
    labels = spec["labels"]
    if not (isinstance(labels, list) and labels and all(isinstance(x, str) and x for x in labels)):
        raise bad("labels", "must be a non-empty list of answer labels (texts)")
    for field in ("instruction", "examples", "post_prompt"):
        if not isinstance(spec[field], str):
            raise bad(field, "must be a text (it may be empty)")
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(spec["template"]) if name is not None]
    except (ValueError, AttributeError) as e:
        raise bad("template", f"is not a valid template ({e}; write a literal brace as {{{{ or }}}})") from None
    unknown = sorted(set(names) - PLACEHOLDERS)
    if unknown:
        raise bad("template", f"has the unknown placeholder {{{unknown[0]}}} (it may hold "
                              f"{', '.join('{' + n + '}' for n in sorted(PLACEHOLDERS))})")  # fmt: skip
    for name in ("context", "question"):
        if names.count(name) != 1:
            raise bad("template", f"must hold {{{name}}} exactly once")
    for field, low in (("max_new_tokens", 1), ("prompt_reserve", 0), ("facts_per_token", 1),
                       ("min_sentence_tokens", 0)):  # fmt: skip
        value = spec[field]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise bad(field, f"is {value!r}; it must be a whole number of at least {low}")


def parse_lengths(text: str | list[str]) -> list[str]:
    """Comma-separated lengths as the sets name their configs (0k, 1k, ..., 1M, 10M), in the given order, each once;
    `1K` reads as 1k and `1m` as 1M."""
    items = text if isinstance(text, list) else [t.strip() for t in str(text).split(",") if t.strip()]
    names = []
    for item in items:
        found = _LENGTH.fullmatch(str(item).strip())
        if not found:
            raise fail(f"bad --lengths entry {item!r}: BABILong lengths are config names such as 0k, 4k, 128k, 1M",
                       f"use some of {', '.join(LENGTHS)}")  # fmt: skip
        name = found.group(1) + ("k" if found.group(2) in "kK" else "M")
        if name not in names:
            names.append(name)
    if not names:
        raise fail("--lengths is empty", f"use some of {', '.join(LENGTHS)}")
    return names


def length_tokens(name: str) -> int:
    """The tokens a length name stands for, as the generator counts them (create_tasks: 1k = 1000, 1M = 1,000,000)."""
    found = _LENGTH.fullmatch(name)
    return int(found.group(1)) * (1000 if found.group(2) in "kK" else 1_000_000)
