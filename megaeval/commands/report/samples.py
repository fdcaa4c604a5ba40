"""Samples files for the HTML page's sample browser: each matched to the report it belongs to, each line put in one
shape (run, task, id, length, depth, score, right or wrong, prompt head and tail, prediction, references), fields cut
short so that a large samples file stays a page of a few MB."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ...errors import fail
from ...runs.report import TASK_SUMMARIES

FIELD_CHARS = 400  # a prediction's, or the references', characters kept (prompt ends are already 300 each)
PAGE_BUDGET = 4_000_000  # bytes of sample data a page holds, about: past it every text field is cut shorter
MIN_CHARS = 40  # ... but never below this
TEXTS = ("prompt_head", "prompt_tail", "prediction", "references", "detail")


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a samples file (JSON objects), or a one-line refusal."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise fail(f"samples file not found: {path}", "pass the --samples file a run wrote") from None
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"cannot read samples file {path} ({e})", "pass the --samples file a run wrote") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise fail(f"{path} line {number} is not JSON ({e})", "pass the --samples file a run wrote") from None
        if not isinstance(record, dict):
            raise fail(f"{path} line {number} is not a JSON object", "pass the --samples file a run wrote")
        records.append(record)
    return records


def owner(path: str | Path, reports: list[dict[str, Any]], report_paths: list[str | Path]) -> int:
    """The index of the report whose run wrote samples file `path` (the report names it in settings.samples, the
    same file or, moved together, the same name beside it); a file no report names is refused."""
    path = Path(path)
    for i, (report, where) in enumerate(zip(reports, report_paths, strict=True)):
        named = report.get("settings", {}).get("samples")
        if not named:
            continue
        named = Path(named)
        if _same(named, path) or _same(Path(where).parent / named.name, path):
            return i
    raise fail(f"samples file {path} belongs to none of the given reports (each report names its samples file in "
               "settings.samples)", "pass the report of the run that wrote it, or leave the file out")  # fmt: skip


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def browser_rows(records: list[dict[str, Any]], report: dict[str, Any], run: str, path: Path) -> list[dict[str, Any]]:
    """One samples file's lines in the browser's shape; a line whose task the report does not hold is refused."""
    kind = report["command"]
    tasks = _tasks(report)
    rows = []
    for number, r in enumerate(records, 1):
        task = r.get("task", "documents" if kind == "longppl" else None)
        if tasks is not None and task not in tasks:
            raise fail(f"{path} line {number} is a sample of task {task!r}, which its report "
                       f"({report['model'].get('spec')}) did not run", "pass the samples file of that run")  # fmt: skip
        score = _score(kind, r, report, task)
        rows.append({
            "run": run, "task": task, "id": str(r.get("id", r.get("doc_id", number - 1))),
            "length": r.get("length"), "depth": r.get("depth"), "score": score,
            "correct": None if score is None or kind == "longppl" else bool(score >= 1 - 1e-9),
            "prompt_head": _cut(r.get("prompt_head")), "prompt_tail": _cut(r.get("prompt_tail")),
            "prediction": _cut(_text(r.get("prediction"))), "references": _cut(_references(kind, r)),
            "detail": _detail(kind, r),
        })  # fmt: skip
    return rows


def _tasks(report: dict[str, Any]) -> set[str] | None:
    res = report["results"]
    if report["command"] in ("ruler", "babilong"):
        return set(res["tasks"])
    if report["command"] in ("scrolls", "academic", "needle"):
        return {t for t in res if t not in TASK_SUMMARIES}
    return None


def _score(kind: str, r: dict[str, Any], report: dict[str, Any], task: str | None) -> float | None:
    """The sample's score on its task's headline metric, as a fraction (full credit: 1)."""
    if kind == "longppl":
        return r.get("longppl")
    if kind in ("needle", "ruler", "babilong"):
        return r.get("score")
    metric = (report["results"].get(task) or {}).get("metric")
    if kind == "scrolls":  # its samples hold scores x 100
        scores = r.get("scores") or {}
        if metric == "geometric_rouge" and all(k in scores for k in ("rouge1", "rouge2", "rougeL")):
            return math.prod(scores[k] / 100 for k in ("rouge1", "rouge2", "rougeL")) ** (1 / 3)
        return None if scores.get(metric) is None else scores[metric] / 100
    return r.get(metric)  # academic: acc, acc_norm or exact_match


def _references(kind: str, r: dict[str, Any]) -> str:
    if kind == "needle":
        return " | ".join(map(str, r.get("answer") or []))
    if kind == "ruler":
        return " | ".join(map(str, r.get("outputs") or []))
    if kind == "babilong":
        return str(r.get("target") or "")
    if kind == "academic" and "target" in r:
        return f"choice {r['target']}"
    return " | ".join(map(str, r.get("references") or []))


def _detail(kind: str, r: dict[str, Any]) -> str:
    keys = {"longppl": ("n_key_tokens", "ppl", "n_tokens"), "academic": ("loglikelihoods",),
            "scrolls": ("prompt_tokens", "truncated_tokens", "stop_reason"),
            "needle": ("prompt_tokens", "stop_reason"), "ruler": ("prompt_tokens", "stop_reason"),
            "babilong": ("question", "prompt_tokens", "stop_reason")}[kind]  # fmt: skip
    return ", ".join(f"{k} {_text(r[k])}" for k in keys if r.get(k) is not None)[:FIELD_CHARS]


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return "" if value is None else str(value)


def _cut(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= FIELD_CHARS else text[: FIELD_CHARS - 1] + "…"


def fit_page(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, every text field cut to one length (a prompt's tail keeping its end) when all of them together would
    pass PAGE_BUDGET: a samples file of any size stays a page of a few MB, every sample still in it."""
    size = sum(len(json.dumps(r, ensure_ascii=False)) for r in rows)
    if size <= PAGE_BUDGET:
        return rows
    fixed = size - sum(len(r[k]) for r in rows for k in TEXTS)
    keep = max(MIN_CHARS, (PAGE_BUDGET - fixed) // (len(rows) * len(TEXTS)))
    for r in rows:
        for k in TEXTS:
            if len(r[k]) > keep:
                r[k] = "…" + r[k][-(keep - 1) :] if k == "prompt_tail" else r[k][: keep - 1] + "…"
    return rows
