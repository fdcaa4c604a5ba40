"""LongPPL's key-token file (its documents are read by `tasks.data.read_documents`, as `prep-books` reads books).

The key-token file holds each document's key-token character spans as an evaluator found them, with the evaluator's
identity and the settings, so that a large evaluator runs once (`longppl --save-key-tokens`) and its spans are reused
(`longppl --key-tokens`, `ppl-sweep --key-tokens`). Documents are matched by the sha256 of their UTF-8 text.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ...metrics.longppl import DEFAULT_SETTINGS, KeySettings
from ..data import Document

KEY_FILE_KIND = "megaeval-longppl-key-tokens"
KEY_FILE_SCHEMA = 1
SETTING_NAMES = tuple(DEFAULT_SETTINGS)  # trunc_len, sliding_window, alpha, beta
REMAKE = "make it again with `megaeval longppl --evaluator E --data D --save-key-tokens F`"


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
    """A key-token file, every field checked (one line naming the first problem)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise fail(f"key-token file not found: {path}", REMAKE) from None
    except (OSError, ValueError) as e:
        raise fail(f"cannot read key-token file {path} ({' '.join(str(e).split())[:100]})", REMAKE) from None
    if not isinstance(data, dict) or data.get("kind") != KEY_FILE_KIND:
        raise fail(f"{path} is not a megaeval key-token file (no kind {KEY_FILE_KIND!r})", REMAKE)
    if data.get("schema_version") != KEY_FILE_SCHEMA:
        raise fail(f"{path} has schema_version {data.get('schema_version')!r}, this megaeval reads "
                   f"{KEY_FILE_SCHEMA}", REMAKE)  # fmt: skip
    settings = data.get("settings")
    if not isinstance(settings, dict) or any(not _number(settings.get(k)) for k in SETTING_NAMES):
        raise fail(f"{path}: settings must hold {', '.join(SETTING_NAMES)} as numbers", REMAKE)
    if not isinstance(data.get("evaluator"), dict) or not isinstance(data.get("documents"), list):
        raise fail(f"{path} has no evaluator or documents list", REMAKE)
    for number, doc in enumerate(data["documents"]):
        where = f"{path} document {number}"
        if not isinstance(doc, dict) or not isinstance(doc.get("sha256"), str) or not isinstance(doc.get("id"), str):
            raise fail(f"{where} has no id or sha256", REMAKE)
        spans = doc.get("spans")
        if not isinstance(spans, list) or not all(_span(s) for s in spans):
            raise fail(f"{where} ({doc['id']}): spans must be a list of [start, end] character offsets", REMAKE)
        ends = [e for _, e in spans]
        if any(n[0] < p[0] for p, n in zip(spans, spans[1:], strict=False)) or any(s > e for s, e in spans):
            raise fail(f"{where} ({doc['id']}): spans are not in order", REMAKE)
        doc["spans"] = [(int(s), int(e)) for s, e in spans]
        if ends and isinstance(doc.get("chars"), int) and max(ends) > doc["chars"]:
            raise fail(f"{where} ({doc['id']}): a span ends past the document's {doc['chars']} characters", REMAKE)
    return data


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _span(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value)


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
        if name in ("alpha", "beta") and not _number(out[name]):
            raise fail(f"{flag} must be a finite number, got {out[name]}", f"pass {flag} {default:g}")
        if name in ("trunc_len", "sliding_window") and not (float(out[name]).is_integer() and out[name] >= 1):
            raise fail(f"{flag} must be a positive number of tokens, got {out[name]}", f"pass {flag} {default}")
    return KeySettings(int(out["trunc_len"]), int(out["sliding_window"]), float(out["alpha"]), float(out["beta"]))
