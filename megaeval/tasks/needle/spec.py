"""What a needle task file (suites/needle/*.yaml, or a user's from --include-path) must hold, checked once when it is
read: every field present, of its type and range, every text with exactly the placeholders it is filled with.
A broken task file is one line naming the file, the field and the rule, never a traceback or a hang."""

from __future__ import annotations

import re
import string
from typing import Any

from ...errors import fail
from ...metrics.needle import METRICS
from ..specs import check_fields, load_spec

KINDS = ("passkey", "ruler_niah")
HAYSTACKS = ("noise", "essay", "needle")
NEEDLE_TYPES = ("numbers", "words", "uuids")
DEPTH_SLOTS = 40  # RULER's depths for needles not asked about (haystack.RULER_DEPTHS)

# field -> (placeholders it must hold, placeholders it may hold) for the texts filled by str.format
_FORMATTED = {
    "passkey": {"needle": ({"key"}, set())},
    "ruler_niah": {
        "needle": ({"key", "value"}, {"type_needle_v"}),
        "answer_prefix": (set(), {"type_needle_v", "query"}),
    },
}
# texts filled by plain replacement of {name}: (must hold, may hold)
_REPLACED = {"ruler_niah": {"template": ({"context"}, {"type_needle_v", "query"})}}
_TEXTS = {"passkey": ("instruction", "filler", "question"), "ruler_niah": ("noise",)}
_COUNTS = ("num_needle_k", "num_needle_v", "num_needle_q")
_COMMON = ("task", "kind", "metric", "max_new_tokens")
FIELDS = {
    "passkey": (*_COMMON, "instruction", "filler", "needle", "question", "key_range"),
    "ruler_niah": (*_COMMON, "template", "answer_prefix", "needle", "noise", "haystack", "type_needle_k",
                   "type_needle_v", *_COUNTS),
}  # fmt: skip


def load_needle_task(name: str, include_paths: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """A needle task's definition (suites/needle/NAME.yaml, or NAME.yaml of an --include-path folder), checked."""
    return load_spec("needle", name, include_paths, check_needle_spec)


def check_needle_spec(spec: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming the file and the field, a needle task definition that could not run right."""

    def bad(field: str, rule: str) -> Exception:
        return fail(f"needle task file {where}: `{field}` {rule}", "fix the task file (suites/needle/ has examples)")

    kind = spec.get("kind")
    if kind not in KINDS:
        raise bad("kind", f"is {kind!r}; it must be one of {', '.join(KINDS)}")
    check_fields(spec, FIELDS[kind], f"a {kind} task", bad)
    if not isinstance(spec["task"], str) or not spec["task"]:
        raise bad("task", "must be a non-empty name")
    if spec["metric"] not in tuple(METRICS):
        raise bad("metric", f"is {spec['metric']!r}; it must be one of {', '.join(METRICS)}")
    _positive_int(spec, "max_new_tokens", bad)
    for field in _TEXTS[kind]:
        _text(spec, field, bad)
    for field, (must, may) in _FORMATTED[kind].items():
        _placeholders(spec, field, must, may, bad, formatted=True)
    for field, (must, may) in _REPLACED.get(kind, {}).items():
        _placeholders(spec, field, must, may, bad, formatted=False)
    if kind == "passkey":
        _passkey(spec, bad)
    else:
        _ruler(spec, bad)


def _passkey(spec: dict[str, Any], bad) -> None:
    low_high = spec["key_range"]
    if not (isinstance(low_high, list) and len(low_high) == 2 and all(_is_int(v) for v in low_high)):
        raise bad("key_range", f"is {low_high!r}; it must be two integers [low, high]")
    if not 0 <= low_high[0] <= low_high[1]:
        raise bad("key_range", f"is {low_high!r}; it must have 0 <= low <= high")
    if spec["metric"] != "first_integer_match":
        raise bad("metric", "must be first_integer_match for a passkey task (its keys are integers)")


def _ruler(spec: dict[str, Any], bad) -> None:
    if spec["haystack"] not in HAYSTACKS:
        raise bad("haystack", f"is {spec['haystack']!r}; it must be one of {', '.join(HAYSTACKS)}")
    for field in ("type_needle_k", "type_needle_v"):
        if spec[field] not in NEEDLE_TYPES:
            raise bad(field, f"is {spec[field]!r}; it must be one of {', '.join(NEEDLE_TYPES)}")
    for field in _COUNTS:
        _positive_int(spec, field, bad)
    needles = max(spec["num_needle_k"], spec["num_needle_q"]) * spec["num_needle_v"]
    if needles - 1 > DEPTH_SLOTS:
        raise bad("num_needle_v", f"gives {needles} needles, more than RULER's {DEPTH_SLOTS} depths + 1 can hold")
    if spec["template"].count("{context}") != 1:
        raise bad("template", "must hold {context} exactly once")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(spec: dict[str, Any], field: str, bad) -> None:
    if not _is_int(spec[field]) or spec[field] < 1:
        raise bad(field, f"is {spec[field]!r}; it must be a whole number of at least 1")


def _text(spec: dict[str, Any], field: str, bad) -> None:
    if not isinstance(spec[field], str) or not spec[field].strip():
        raise bad(field, "must be a non-empty text")


def _placeholders(spec: dict[str, Any], field: str, must: set[str], may: set[str], bad, formatted: bool) -> None:
    """`field` is a text holding every placeholder of `must`, and none but those of `must` and `may`."""
    text = spec[field]
    if not isinstance(text, str) or (must and not text.strip()):
        raise bad(field, "must be a non-empty text")
    if formatted:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
        except ValueError as e:
            raise bad(field, f"is not a valid template ({e}; write a literal brace as {{{{ or }}}})") from None
    else:
        names = set(re.findall(r"\{([^{}]*)\}", text))
    allowed = must | may
    extra = sorted(names - allowed)
    if extra:
        holds = ", ".join("{" + n + "}" for n in sorted(allowed)) or "no placeholders"
        raise bad(field, f"has the unknown placeholder {{{extra[0]}}} (it may hold {holds})")
    lacking = sorted(must - names)
    if lacking:
        raise bad(field, f"lacks the placeholder {{{lacking[0]}}}")
