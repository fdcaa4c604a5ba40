"""LongPPL's key-token file (its documents are read by `tasks.data.read_documents`, as `prep-books` reads books).

The key-token file holds each document's key-token character spans as an evaluator found them, with the evaluator's
identity and the settings, so that a large evaluator runs once (`longppl --save-key-tokens`) and its spans are reused
(`longppl --key-tokens`, `ppl-sweep --key-tokens`). Documents are matched by the sha256 of their UTF-8 text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ...metrics.longppl import DEFAULT_SETTINGS, KeySettings
from ...runs.settings import ignored_flag
from ...text import is_number, read_json
from ..data import Document

KEY_FILE_KIND = "megaeval-longppl-key-tokens"
KEY_FILE_SCHEMA = 1
SETTING_NAMES = tuple(DEFAULT_SETTINGS)  # trunc_len, sliding_window, alpha, beta
SHA256 = re.compile(r"[0-9a-f]{64}")
REMAKE = "make it again with `megaeval longppl --evaluator E --data D --save-key-tokens F`"


# flag -> the key-token modes it applies to, for the KEYS flags `longppl` and `ppl-sweep` share (a command adds its
# own rows): one table, checked once by `check_key_modes` before any work
KEY_MODES: dict[str, tuple[str, ...]] = {
    "evaluator_args": ("--evaluator",),
    **dict.fromkeys(SETTING_NAMES, ("--evaluator", "--key-tokens")),  # with a file: checked equal to the file's
}


def key_mode(settings: Any) -> str | None:
    """The mode: "--evaluator" (an evaluator finds key tokens), "--key-tokens" (a file holds them), None (none)."""
    return "--evaluator" if settings.evaluator is not None else "--key-tokens" if settings.key_tokens else None


def check_key_modes(settings: Any, table: dict[str, tuple[str, ...]]) -> None:
    """Refuse a flag set (to other than its default) in a key-token mode it does not apply to: it would be ignored."""
    mode = key_mode(settings)
    ignored = ignored_flag(settings, table, mode)
    if ignored is not None:
        name, modes = ignored
        flag = "--" + name.replace("_", "-")
        where = f"with {mode}" if mode else f"without {' or '.join(modes)}"
        also = " (the file's key tokens are read, no evaluator runs)" if mode == "--key-tokens" else ""
        raise fail(f"{flag} does not apply {where}{also}: it would be ignored",
                   f"use {flag} with {' or '.join(modes)}, or leave it out")  # fmt: skip


def key_file(
    evaluator: dict[str, Any], settings: dict[str, Any], documents: list[Document], spans: list[list[tuple[int, int]]],
    evaluator_tokens: list[int], evaluator_keys: list[int],
) -> dict[str, Any]:  # fmt: skip
    """The key-token file's content for `documents`, in order."""
    return {
        "schema_version": KEY_FILE_SCHEMA, "kind": KEY_FILE_KIND, "evaluator": evaluator,
        "settings": {k: settings[k] for k in SETTING_NAMES},
        "documents": [{"id": d.id, "sha256": d.sha256, "chars": len(d.text), "evaluator_tokens": n,
                       "evaluator_key_tokens": k, "spans": [list(s) for s in doc_spans]}
                      for d, doc_spans, n, k in zip(documents, spans, evaluator_tokens, evaluator_keys, strict=True)],
    }  # fmt: skip


def key_identity(evaluator: dict[str, Any], settings: dict[str, Any], key_tokens: str | None) -> dict[str, Any]:
    """What identifies a run's key tokens in its resume fingerprint: the evaluator's weights, the settings, the file."""
    return {"evaluator_weights_sha256": evaluator.get("weights_sha256"), "key_settings": settings,
            "key_tokens_sha256": file_sha256(key_tokens) if key_tokens else None}  # fmt: skip


def read_key_file(path: str | Path) -> dict[str, Any]:
    """A key-token file, every field checked (one line naming the file and the first bad field); what `key_file`
    writes reads back."""
    path = Path(path)
    if not path.exists():
        raise fail(f"key-token file not found: {path}", REMAKE)
    data = read_json(path, "key-token file", REMAKE)
    if not isinstance(data, dict) or data.get("kind") != KEY_FILE_KIND:
        raise fail(f"{path} is not a megaeval key-token file (no kind {KEY_FILE_KIND!r})", REMAKE)
    if data.get("schema_version") != KEY_FILE_SCHEMA:
        raise fail(f"{path} has schema_version {data.get('schema_version')!r}, this megaeval reads "
                   f"{KEY_FILE_SCHEMA}", REMAKE)  # fmt: skip
    settings = data.get("settings")
    if not isinstance(settings, dict):
        raise fail(f"key-token file {path}: settings must be an object holding {', '.join(SETTING_NAMES)}", REMAKE)
    for name in SETTING_NAMES:
        value = settings.get(name)
        whole = name in ("trunc_len", "sliding_window")
        good = _count(value) and value >= 1 if whole else is_number(value)
        if not good:
            kind = "a whole number of tokens of at least 1" if whole else "a finite number"
            raise fail(f"key-token file {path}: settings.{name} must be {kind}, got {_shown(value)}", REMAKE)
    if not isinstance(data.get("evaluator"), dict) or not isinstance(data.get("documents"), list):
        raise fail(f"{path} has no evaluator or documents list", REMAKE)
    spans_of: dict[str, tuple[int, list]] = {}
    for number, doc in enumerate(data["documents"]):
        where = f"key-token file {path} documents[{number}]"
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            raise fail(f"{where} has no id", REMAKE)
        if not isinstance(doc.get("sha256"), str) or not SHA256.fullmatch(doc["sha256"]):
            raise fail(f"{where}.sha256 must be the 64 hex digits of the document's sha256", REMAKE)
        for name in ("chars", "evaluator_tokens", "evaluator_key_tokens"):
            if (name == "chars" or name in doc) and not _count(doc.get(name)):
                raise fail(f"{where}.{name} must be a whole number, got {_shown(doc.get(name))}", REMAKE)
        doc["spans"] = _spans(doc.get("spans"), doc["chars"], f"{where}.spans")
        earlier = spans_of.setdefault(doc["sha256"], (number, doc["spans"]))
        if earlier[1] != doc["spans"]:
            raise fail(f"{where} has the text of documents[{earlier[0]}] but other spans", REMAKE)
    return data


def _spans(spans: Any, chars: int, where: str) -> list[tuple[int, int]]:
    """A document's [start, end] character spans: whole numbers, 0 <= start <= end <= chars, starts in order."""
    if not isinstance(spans, list):
        raise fail(f"{where} must be a list of [start, end] character offsets, got {_shown(spans)}", REMAKE)
    out = []
    for k, span in enumerate(spans):
        if not (isinstance(span, list) and len(span) == 2 and all(_count(v) for v in span)):
            raise fail(f"{where}[{k}] must be [start, end], two whole numbers, got {_shown(span)}", REMAKE)
        start, end = span
        if start > end:
            raise fail(f"{where}[{k}] starts after it ends ({start} > {end})", REMAKE)
        if end > chars:
            raise fail(f"{where}[{k}] ends at {end}, past the document's {chars} characters", REMAKE)
        if out and start < out[-1][0]:
            raise fail(f"{where}[{k}] starts before the span before it: spans are not in order", REMAKE)
        out.append((start, end))
    return out


def check_chars(held: dict[str, Any], text: str, path: str | Path, number: int) -> None:
    """Refuse a key-token file entry whose `chars` is not its document's length (its spans were checked against it)."""
    if held["chars"] != len(text):
        raise fail(f"key-token file {path} documents[{number}].chars is {held['chars']}, but its document "
                   f"({held['id']}) has {len(text)} characters", REMAKE)  # fmt: skip


def _count(value: Any) -> bool:
    """A whole number >= 0 as JSON holds one (True is an int in Python, and not a count)."""
    return type(value) is int and value >= 0


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:60]


def spans_for(data: dict[str, Any], path: str | Path, documents: list[Document]) -> list[list[tuple[int, int]]]:
    """Each document's spans from a key-token file made for exactly these documents, in this order; anything else
    is refused, naming the first document that differs."""
    held = data["documents"]
    if len(held) != len(documents):
        raise fail(f"key-token file {path} holds {len(held)} documents but --data has {len(documents)}",
                   f"pass the data it was made for, or {REMAKE}")  # fmt: skip
    for number, (doc, mine) in enumerate(zip(documents, held, strict=True)):
        if doc.sha256 != mine["sha256"]:
            raise fail(f"key-token file {path} was made for other data: document {number} ({doc.id}) has sha256 "
                       f"{doc.sha256[:12]}, the file's ({mine['id']}) {mine['sha256'][:12]}",
                       f"pass the data it was made for, or {REMAKE}")  # fmt: skip
        check_chars(mine, doc.text, path, number)
    return [mine["spans"] for mine in held]


def key_settings(given: Any, held: dict[str, Any] | None, path: str | None) -> KeySettings:
    """The key settings a run uses, from the flags on `given` (None: not given): a key-token file's own (a flag
    given with another value is refused), else the flags, else the reference's defaults."""
    out = {}
    for name in SETTING_NAMES:
        value, flag = getattr(given, name), "--" + name.replace("_", "-")
        if held is not None:
            if value is not None and float(value) != float(held["settings"][name]):
                raise fail(f"{flag} {value} differs from the {held['settings'][name]} key-token file {path} was made "
                           f"with", f"leave {flag} out (the file's value is used), or {REMAKE}")  # fmt: skip
            value = held["settings"][name]
        default = DEFAULT_SETTINGS[name]
        out[name] = default if value is None else value
        if name in ("alpha", "beta") and not is_number(out[name]):
            raise fail(f"{flag} must be a finite number, got {out[name]}", f"pass {flag} {default:g}")
        if name in ("trunc_len", "sliding_window") and not (float(out[name]).is_integer() and out[name] >= 1):
            raise fail(f"{flag} must be a positive number of tokens, got {out[name]}", f"pass {flag} {default}")
    return KeySettings(int(out["trunc_len"]), int(out["sliding_window"]), float(out["alpha"]), float(out["beta"]))
