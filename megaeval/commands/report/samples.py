"""Samples files for the HTML page's sample browser: each matched to the report of the run that wrote it (by its
sha256, which the report records), each line put in one shape (run, task, id, length, depth, score, right or wrong,
prompt head and tail, prediction, references), fields cut short so that the page stays a few MB."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ...runs.report import TASK_SUMMARIES
from ...text import iter_jsonl

FIELD_CHARS = 400  # a prediction's, or the references', characters kept (prompt ends are already 300 each)
ID_CHARS = 120  # an id's characters kept (a longer one keeps its start and a hash of the whole: ids stay distinct)
PAGE_BYTES = 5_000_000  # a page's size: past it, text fields are cut shorter, then samples left out
MIN_CHARS = 40  # ... text fields never below this
TEXTS = ("prompt_head", "prompt_tail", "prediction", "references", "detail")
FIELDS = ("run", "task", "id", "length", "depth", "score", "correct", *TEXTS)  # a sample's place in the page's rows
WROTE = "pass the --samples file a run wrote"


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a samples file (JSON objects, UTF-8), or a one-line refusal naming the file and line."""
    records = []
    for number, record in iter_jsonl(path, "samples file", WROTE):
        if not isinstance(record, dict):
            raise fail(f"samples file {path} line {number} is not a JSON object", WROTE)
        records.append(record)
    return records


def owner(path: str | Path, reports: list[dict[str, Any]], report_paths: list[str | Path]) -> int:
    """The index of the report whose run wrote samples file `path`: the report whose `data.samples_sha256` is the
    file's sha256, or (a report written before megaeval recorded it) the report naming it in settings.samples (the
    same file or, moved together, the same name beside it). Any other file is refused."""
    path = Path(path)
    try:
        digest = file_sha256(path) if path.is_file() else None
    except OSError as e:
        raise fail(
            f"cannot read samples file {path}: {e.strerror or e}", "check the path and its permissions"
        ) from None
    by_name = None
    for i, (report, where) in enumerate(zip(reports, report_paths, strict=True)):
        recorded = report.get("data", {}).get("samples_sha256")
        if recorded is not None and recorded == digest:
            return i
        named = report.get("settings", {}).get("samples")
        if isinstance(named, str) and named and by_name is None:
            if _same(Path(named), path) or _same(Path(where).parent / Path(named).name, path):
                by_name = i
    if by_name is not None:
        if reports[by_name].get("data", {}).get("samples_sha256") is None:
            return by_name
        raise fail(f"samples file {path} is not the one the run of {report_paths[by_name]} wrote (its sha256 differs "
                   "from the report's data.samples_sha256: another run's, or edited)",
                   "pass the samples file that run wrote, or leave it out")  # fmt: skip
    raise fail(f"samples file {path} belongs to none of the given reports (each report records its samples file's "
               "sha256 in data.samples_sha256, and its name in settings.samples)",
               "pass the report of the run that wrote it, or leave the file out")  # fmt: skip


def owners(paths: list[str | Path], reports: list[dict[str, Any]], report_paths: list[str | Path]) -> list[int]:
    """`owner` of each samples file; two files of one report (a file given twice, or a copy of it) are refused."""
    found: dict[int, Path] = {}
    out = []
    for path in paths:
        i = owner(path, reports, report_paths)
        if i in found:
            raise fail(f"samples files {found[i]} and {path} both belong to report {report_paths[i]} (the same file "
                       "twice, or a copy)", "pass each run's samples file once")  # fmt: skip
        found[i] = Path(path)
        out.append(i)
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def browser_rows(records: list[dict[str, Any]], report: dict[str, Any], run: str, path: Path) -> list[dict[str, Any]]:
    """One samples file's lines in the browser's shape; a line whose task the report does not hold is refused, and
    lines of one id are kept apart (`id #2`), never merged."""
    kind = report["command"]
    tasks = _tasks(report)
    rows, seen = [], set()
    for number, r in enumerate(records, 1):
        where = f"samples file {path} line {number}"
        task = r.get("task", "documents" if kind == "longppl" else None)
        if kind in GROUPED:  # MRCR's lines by needle count, Graphwalks' by problem type
            task = _grouped(kind, r)
        if not isinstance(task, str) or (tasks is not None and task not in tasks):
            raise fail(f"{where} is a sample of task {task!r:.60}, which its report "
                       f"({report['model'].get('spec')}) did not run", WROTE)  # fmt: skip
        metric = (report["results"].get(task) or {}).get("metric") if kind in ("scrolls", "academic") else None
        score = _score(kind, r, metric, where)
        sample_id = _id(r.get("id", r.get("doc_id", number - 1)))
        shown, n = sample_id, 1
        while (task, shown) in seen:
            n += 1
            shown = f"{sample_id} #{n}"
        seen.add((task, shown))
        rows.append({
            "run": run, "task": task, "id": shown, "length": _place(r.get("length", r.get(LENGTH_KEYS.get(kind, "")))),
            "depth": _place(r.get("depth")),
            "score": score, "correct": None if score is None or kind == "longppl" else bool(score >= 1 - 1e-9),
            "prompt_head": _cut(_text(_ends(kind, r)[0])), "prompt_tail": _cut(_text(_ends(kind, r)[1])),
            "prediction": _cut(_prediction(kind, r, metric)), "references": _cut(_references(kind, r)),
            "detail": _detail(kind, r),
        })  # fmt: skip
    return rows


def _ends(kind: str, r: dict[str, Any]) -> tuple[Any, Any]:
    """What the page shows as a prompt's head and tail: an MT-Bench sample's first and last question turns."""
    if kind == "mtbench" and isinstance(r.get("questions"), list) and r["questions"]:
        return r["questions"][0], r["questions"][-1] if len(r["questions"]) > 1 else None
    return r.get("prompt_head"), r.get("prompt_tail")


def _id(value: Any) -> str:
    """A sample's id as the page shows it: a long one keeps its start and a hash of the whole (two stay two)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= ID_CHARS:
        return text
    return text[: ID_CHARS - 17] + "…" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _place(value: Any) -> Any:
    """A length or depth as the page shows it (a number or a short text)."""
    if value is None or isinstance(value, str) or (isinstance(value, (int, float)) and math.isfinite(value)):
        return value if not isinstance(value, str) else _cut(value)
    return _cut(_text(value))


GROUPED = ("mrcr", "graphwalks")
LENGTH_KEYS = {"mrcr": "bin", "graphwalks": "bucket"}  # what these kinds' lines name their length by


def _grouped(kind: str, r: dict[str, Any]) -> Any:
    """The group an MRCR or Graphwalks line belongs to, as its report's tables name it."""
    if kind == "mrcr":
        return f"{r['needles']} needles" if isinstance(r.get("needles"), int) else None
    return r.get("problem_type")


def _tasks(report: dict[str, Any]) -> set[str] | None:
    res = report["results"]
    if report["command"] == "mrcr":
        return {f"{n} needles" for n in res["needles"]}
    if report["command"] == "graphwalks":
        return set(res["problem_types"])
    if report["command"] in ("ruler", "babilong") or (report["command"] == "longbench" and res.get("version") == 1):
        return set(res["tasks"])
    if report["command"] in ("scrolls", "academic", "needle"):
        return {t for t in res if t not in TASK_SUMMARIES}
    return None


def _number(value: Any, where: str, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(f"{where}: {key} is {value!r:.40}, not a number", WROTE)
    return value


def _score(kind: str, r: dict[str, Any], metric: str | None, where: str) -> float | None:
    """The sample's score on its task's headline metric, as a fraction (full credit: 1)."""
    if kind == "longppl":
        return _number(r.get("longppl"), where, "longppl")
    if kind in ("needle", "ruler", "babilong", "longbench", *GROUPED):
        return _number(r.get("score"), where, "score")
    if kind == "mtbench":  # the mean of its turns' ratings (1-10; -1 or null: none), as a fraction
        scores = r.get("scores") if isinstance(r.get("scores"), list) else []
        rated = [_number(v, where, "scores[]") for v in scores if v is not None and v != -1]
        return sum(rated) / len(rated) / 10 if rated else None
    if kind == "scrolls":  # its samples hold scores x 100
        scores = r.get("scores") or {}
        if not isinstance(scores, dict):
            raise fail(f"{where}: scores is {scores!r:.40}, not an object", WROTE)
        if metric == "geometric_rouge" and all(k in scores for k in ("rouge1", "rouge2", "rougeL")):
            parts = [_number(scores[k], where, f"scores.{k}") for k in ("rouge1", "rouge2", "rougeL")]
            return None if None in parts or min(parts) < 0 else math.prod(p / 100 for p in parts) ** (1 / 3)
        value = _number(scores.get(metric), where, f"scores.{metric}")
        return None if value is None else value / 100
    return _number(r.get(metric), where, str(metric))  # academic: acc, acc_norm or exact_match


def _prediction(kind: str, r: dict[str, Any], metric: str | None) -> str:
    """What the model answered. An academic multiple-choice sample: the choice each metric made, the headline
    metric's first (acc and acc_norm may pick different choices)."""
    if kind == "mtbench":
        return _joined(r.get("answers"))
    if kind in GROUPED:
        return _text(r.get("response"))
    target, prediction = r.get("target"), r.get("prediction")
    if kind != "academic" or not isinstance(prediction, int) or isinstance(prediction, bool) or "target" not in r:
        return _text(prediction)
    made = {"acc": f"choice {prediction}"}
    if r.get("acc_norm") is not None:
        norm = r.get("prediction_norm")
        right = isinstance(r["acc_norm"], (int, float)) and r["acc_norm"] >= 1
        made["acc_norm"] = (f"choice {_text(norm)}" if norm is not None else f"choice {_text(target)}" if right
                            else f"a choice other than {_text(target)}")  # fmt: skip
    return "; ".join(f"{m}: {made[m]}" for m in sorted(made, key=lambda m: m != metric))


def _references(kind: str, r: dict[str, Any]) -> str:
    if kind == "needle":
        return _joined(r.get("answer"))
    if kind == "ruler":
        return _joined(r.get("outputs"))
    if kind == "babilong":
        return _text(r.get("target"))
    if kind == "longbench":
        return _joined(r.get("answers")) if "answers" in r else _text(r.get("answer"))
    if kind == "academic" and "target" in r:
        return f"choice {_text(r['target'])}"
    if kind == "mtbench":
        return _joined(r.get("judgments"))
    if kind == "mrcr":
        return _text(r.get("answer"))
    if kind == "graphwalks":
        return _joined(r.get("gold"))
    return _joined(r.get("references"))


def _joined(values: Any) -> str:
    return " | ".join(map(_text, values)) if isinstance(values, list) else _text(values)


def _detail(kind: str, r: dict[str, Any]) -> str:
    keys = {"longppl": ("n_key_tokens", "ppl", "n_tokens"), "academic": ("loglikelihoods",),
            "scrolls": ("prompt_tokens", "truncated_tokens", "stop_reason"),
            "needle": ("prompt_tokens", "stop_reason"), "ruler": ("prompt_tokens", "stop_reason"),
            "babilong": ("question", "prompt_tokens", "stop_reason"),
            "longbench": ("pred", "prompt_tokens", "tokens_dropped", "stop_reason"),
            "mtbench": ("model", "scores"),
            "mrcr": ("random_string_to_prepend", "prefix_found", "o200k_prompt_tokens", "prompt_tokens", "stop_reason"),
            "graphwalks": ("nodes", "failed", "prompt_chars", "prompt_tokens", "stop_reason")}[kind]  # fmt: skip
    return _cut(", ".join(f"{k} {_text(r[k])}" for k in keys if r.get(k) is not None))


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_text(v) for v in value[:FIELD_CHARS]) + "]"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)[: FIELD_CHARS + 1]
    return "" if value is None else str(value)


def _cut(text: str) -> str:
    return text if len(text) <= FIELD_CHARS else text[: FIELD_CHARS - 1] + "…"


def script_json(value: Any) -> str:
    """`value` as JSON that a <script> element holds as it is: every `<`, `>` and `&` escaped (so no `</script>`,
    `<!--` or `<script` inside a sample's text can end or change the element), and U+2028/U+2029 too."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escaped)
    return text


def packed(row: dict[str, Any], runs: list[str]) -> list[Any]:
    """A row as the page holds it: its FIELDS' values in order, the run as its index in `runs`."""
    return [runs.index(row["run"]), *(row[f] for f in FIELDS[1:])]


def _size(row: dict[str, Any]) -> int:
    return len(script_json([0, *(row[f] for f in FIELDS[1:])]).encode()) + 1


def _cut_to(row: dict[str, Any], keep: int) -> dict[str, Any]:
    row = dict(row)
    for k in TEXTS:
        if len(row[k]) > keep:
            row[k] = "…" + row[k][-(keep - 1) :] if k == "prompt_tail" else row[k][: keep - 1] + "…"
    return row


def _common_length(rows: list[dict[str, Any]], budget: int) -> int:
    """The longest length (MIN_CHARS..FIELD_CHARS) to cut every text field to for the rows to fit `budget`, by
    bisection on an estimate: each field's bytes per character as embedded (escapes, UTF-8) times its length."""
    fixed = sum(_size({**r, **dict.fromkeys(TEXTS, "")}) for r in rows)
    fields = [(len(r[k]), len(script_json(r[k]).encode()) / max(1, len(r[k]))) for r in rows for k in TEXTS]
    lo, hi = MIN_CHARS, FIELD_CHARS
    while lo < hi:
        keep = (lo + hi + 1) // 2
        if fixed + sum(min(n, keep) * ratio for n, ratio in fields) <= budget:
            lo = keep
        else:
            hi = keep - 1
    return lo


def fit_page(rows: list[dict[str, Any]], budget: int = PAGE_BYTES) -> tuple[list[dict[str, Any]], int]:
    """The rows within `budget` bytes as the page embeds them, and how many were left out. First every text
    field is cut to one length (a prompt's tail keeping its end), never below MIN_CHARS; if that is not enough, a
    fixed subset of each task's documents is kept (the same documents in every run), and the page says how many
    samples it leaves out."""
    if sum(map(_size, rows)) <= budget:
        return rows, 0
    keep = _common_length(rows, budget)
    rows = [_cut_to(r, keep) for r in rows]
    sizes = [_size(r) for r in rows]
    while sum(sizes) > budget and keep > MIN_CHARS:  # the estimate was short: a little shorter still
        keep = max(MIN_CHARS, keep * 9 // 10)
        rows = [_cut_to(r, keep) for r in rows]
        sizes = [_size(r) for r in rows]
    if sum(sizes) <= budget:
        return rows, 0
    order = {key: hashlib.blake2b(repr(key).encode(), digest_size=8).digest() for key in {(r["task"], r["id"])
                                                                                          for r in rows}}  # fmt: skip
    per_task = Counter(task for task, _ in order)
    fraction = budget / sum(sizes)
    while True:
        kept_ids: set[tuple[str, str]] = set()
        for task, count in per_task.items():
            ids = sorted((key for key in order if key[0] == task), key=order.__getitem__)
            kept_ids.update(ids[: max(1, int(count * fraction))])
        kept = [i for i, r in enumerate(rows) if (r["task"], r["id"]) in kept_ids]
        if sum(sizes[i] for i in kept) <= budget or fraction < 1e-6:
            return [rows[i] for i in kept], len(rows) - len(kept)
        fraction *= 0.9
