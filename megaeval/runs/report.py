"""JSON reports: the schema (docs/reports.md), building one with every setting and the environment, reading one."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..errors import MegaevalError, fail
from ..text import is_number, read_json

SCHEMA_VERSION = 1


def git_revision() -> str | None:
    """The megaeval source checkout's commit (with '+dirty' when modified), if it is a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device | str, dtype: torch.dtype | str) -> dict[str, Any]:
    """Versions, device and date of a run."""
    from .. import __version__

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # triton is optional off Linux, and may fail to import without a GPU driver
        triton_version = None
    device = torch.device(device)
    return {
        "megaeval": __version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "git_revision": git_revision(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def build_report(
    command: str, settings: dict[str, Any], model: dict[str, Any], data: dict[str, Any], results: dict[str, Any],
    env: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The report: schema_version, command, settings, model, data, environment, results."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "settings": settings,
        "model": model,
        "data": data,
        "environment": env,
        "results": results,
    }


def model_facts(lm: Any) -> dict[str, Any]:
    """The report's `model` section: the spec, the effective options (defaults included), what the model
    says of itself, and the checksum of its weights."""
    return {"spec": lm.spec, "options": lm.options(), **lm.describe(), "weights_sha256": lm.weights_sha256()}


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a report (UTF-8 JSON, through megaeval.text), checking that it is one this version understands and that
    every field `report`, its HTML page and `plot` read is well formed: one line naming the field otherwise."""
    path = Path(path)
    fix = "pass the report.json files written by --out"
    try:
        os.stat(path)
    except FileNotFoundError:
        raise fail(f"report not found: {path}", fix) from None
    except OSError:
        pass  # read_json names the reason
    report = read_json(path, "report", fix)
    if not isinstance(report, dict) or "schema_version" not in report or "results" not in report:
        raise fail(f"{path} is not a megaeval report", "pass files written by megaeval --out")
    version = report["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise fail(f"{path}: schema_version must be the integer {SCHEMA_VERSION}, got {version!r:.40}",
                   "pass an unedited report written by megaeval --out")  # fmt: skip
    if version != SCHEMA_VERSION:
        raise fail(f"{path} has schema_version {version}; this megaeval reads {SCHEMA_VERSION}",
                   "re-run the evaluation with this megaeval version")  # fmt: skip
    if report.get("command") not in COMMANDS:
        raise fail(f"{path}: command is {report.get('command')!r:.40}, not one of {', '.join(COMMANDS)}",
                   "pass an unedited report written by megaeval --out")  # fmt: skip
    for key in ("model", "settings", "data", "environment"):
        if not isinstance(report.get(key, {}), dict):
            raise fail(f"{path}: {key} is {report[key]!r:.40}, not an object",
                       "pass an unedited report written by megaeval --out")  # fmt: skip
    _check_sections(report, path)
    _check_results(report, path)
    return report


def _check_sections(report: dict[str, Any], path: Path) -> None:
    """The fields outside `results` that `report` and the page read: the date, the samples file's name and sha256."""
    fix = "pass an unedited report written by megaeval --out"
    checks = (("environment", "date", str, "a date"), ("settings", "samples", str, "a file name"),
              ("data", "samples_sha256", str, "a sha256"), ("data", "tokens_scored", int, "a count"))  # fmt: skip
    for section, key, kind, what in checks:
        value = report.get(section, {}).get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise fail(f"{path}: {section}.{key} is {value!r:.40}, not {what}", fix)
    digest = report.get("data", {}).get("samples_sha256")
    if digest is not None and re.fullmatch(r"[0-9a-f]{64}", digest) is None:
        raise fail(f"{path}: data.samples_sha256 is {digest!r:.40}, not a sha256", fix)


COMMANDS = ("ppl-sweep", "scrolls", "academic", "needle", "ruler", "longppl", "babilong", "longbench", "mtbench",
            "mrcr", "graphwalks")  # fmt: skip
TASK_SUMMARIES = ("average", "average_of")  # results keys of a task report that are not tasks


def _check_tasks(results: dict[str, Any], broken: str, fix: str) -> None:
    averaged = results.get("average_of", {})
    if not isinstance(averaged, dict) or any(task not in results for task in averaged):
        raise fail(f"{broken}: results.average_of names tasks that results lacks (or is not an object)", fix)
    for task, res in results.items():
        if task in TASK_SUMMARIES:
            continue
        if not isinstance(res, dict):
            raise fail(f"{broken}: results.{task} is {res!r:.40}, not an object", fix)
        n = res.get("n")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise fail(f"{broken}: results.{task}.n is {n!r:.40}, not a count", fix)
        metric = res.get("metric")
        if not isinstance(metric, str) or metric not in res:
            raise fail(f"{broken}: results.{task}.metric is {metric!r:.40}, not the name of one of its scores", fix)
        for key, value in res.items():  # the headline metric and every standard error: a number or null
            if (key == metric or key.endswith("_stderr")) and value is not None and not is_number(value):
                raise fail(f"{broken}: results.{task}.{key} is {value!r:.40}, not a number", fix)
    average = results.get("average")
    if average is not None and not is_number(average):
        raise fail(f"{broken}: results.average is {average!r:.40}, not a number", fix)


def _check_needle(results: dict[str, Any], path: Path, fix: str) -> None:
    """A needle report's grids, as `report` and `plot` read them: at least one task; per task its lengths once each,
    its cells once per (length, depth) and only at those lengths; lengths positive integers, depths 0..100."""
    tasks = [task for task in results if task not in TASK_SUMMARIES]
    if not tasks:
        raise fail(f"{path} is a needle report with no tasks in its results", fix)
    for task in tasks:
        res = results[task]
        if not is_number(res.get("accuracy")):
            raise fail(f"{path}: results.{task}.accuracy is {res.get('accuracy')!r:.40}, not a number", fix)
        lengths = _needle_rows(res, task, "lengths", ("length",), path, fix)
        for length, _ in _needle_rows(res, task, "cells", ("length", "depth"), path, fix):
            if (length,) not in lengths:
                raise fail(f"{path}: results.{task}.cells has length {length}, which results.{task}.lengths lacks",
                           fix)  # fmt: skip


def _needle_rows(res: dict[str, Any], task: str, key: str, place: tuple[str, ...], path: Path, fix: str) -> set:
    """The places (length, or length and depth) of a needle task's rows, checked: each once, each with an accuracy."""
    rows = res.get(key)
    fields = (*place, "accuracy")
    listed = isinstance(rows, list) and len(rows) > 0
    if not listed or not all(isinstance(r, dict) and all(is_number(r.get(f)) for f in fields) for r in rows):
        raise fail(f"{path} is not a complete megaeval report: results.{task}.{key} is missing or malformed", fix)
    seen: set[tuple] = set()
    for r in rows:
        where = tuple(r[f] for f in place)
        named = ", ".join(f"{f} {r[f]}" for f in place)
        if where in seen:
            raise fail(f"{path}: results.{task}.{key} holds {named} twice", fix)
        if not (isinstance(r["length"], int) and r["length"] > 0) or not 0 <= r.get("depth", 0) <= 100:
            raise fail(f"{path}: results.{task}.{key} holds {named}: lengths are positive integers, depths 0..100",
                       fix)  # fmt: skip
        seen.add(where)
    return seen


def _check_ruler(results: dict[str, Any], path: Path, fix: str) -> None:
    """A RULER report's tables, as `report` reads them: tasks with a score per length (each length once), the
    per-length averages, the averages, wAvg and the effective length."""
    broken = f"{path} is not a complete megaeval report"
    tasks = results.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        raise fail(f"{broken}: results.tasks is missing or empty", fix)
    for task, res in tasks.items():
        rows = res.get("lengths") if isinstance(res, dict) else None
        if (
            not isinstance(rows, list)
            or not rows
            or not all(isinstance(r, dict) and is_number(r.get("length")) and is_number(r.get("score")) for r in rows)
        ):
            raise fail(f"{broken}: results.tasks.{task}.lengths is missing or malformed", fix)
        if len({r["length"] for r in rows}) != len(rows):
            raise fail(f"{path}: results.tasks.{task}.lengths holds a length twice", fix)
        _check_lengths(rows, f"results.tasks.{task}.lengths", path, fix)
    rows = results.get("lengths")
    if (
        not isinstance(rows, list)
        or not rows
        or not all(isinstance(r, dict) and is_number(r.get("length")) and is_number(r.get("average")) for r in rows)
    ):
        raise fail(f"{broken}: results.lengths is missing or malformed", fix)
    _check_lengths(rows, "results.lengths", path, fix)
    for key in ("average", "wavg_inc", "wavg_dec", "threshold"):
        if not is_number(results.get(key)):
            raise fail(f"{broken}: results.{key} is {results.get(key)!r:.40}, not a number", fix)
    effective = results.get("effective_length")
    if effective is not None and not (is_number(effective) and isinstance(effective, int) and effective > 0):
        raise fail(f"{broken}: results.effective_length is {effective!r:.40}, not a length", fix)


def _check_lengths(rows: list[dict[str, Any]], where: str, path: Path, fix: str) -> None:
    for r in rows:
        if not isinstance(r["length"], int) or r["length"] < 1:
            raise fail(f"{path}: {where} holds length {r['length']!r:.40}, not a positive whole number", fix)


def _check_longppl(results: dict[str, Any], path: Path, fix: str) -> None:
    """A longppl report's table, as `report` reads it: documents with an id and their numbers, and the pooled ones."""
    broken = f"{path} is not a complete megaeval report"
    docs = results.get("documents")
    if not isinstance(docs, list) or not docs or not all(isinstance(d, dict) and isinstance(d.get("id"), str)
                                                        for d in docs):  # fmt: skip
        raise fail(f"{broken}: results.documents is missing or malformed", fix)
    for where, row in [("results", results), *((f"results.documents[{i}]", d) for i, d in enumerate(docs))]:
        for key in ("longppl", "ppl", "n_key_tokens", "n_tokens"):
            value = row.get(key)
            if not (is_number(value) or (value is None and key == "longppl")):
                raise fail(f"{broken}: {where}.{key} is {value!r:.40}, not a number", fix)


def _check_babilong(results: dict[str, Any], path: Path, fix: str) -> None:
    """A babilong report's table, as `report` reads it: per task an accuracy at every length, per length the
    average (or null) and the averaged tasks."""
    broken = f"{path} is not a complete megaeval report"
    rows = results.get("lengths")
    if (
        not isinstance(rows, list)
        or not rows
        or not all(
            isinstance(r, dict)
            and isinstance(r.get("length"), str)
            and (r.get("average") is None or is_number(r["average"]))
            for r in rows
        )
    ):
        raise fail(f"{broken}: results.lengths is missing or malformed", fix)
    tasks = results.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        raise fail(f"{broken}: results.tasks is missing or empty", fix)
    for task, cells in tasks.items():
        accuracies = [cells.get(r["length"]) if isinstance(cells, dict) else None for r in rows]
        if not all(isinstance(a, dict) and is_number(a.get("accuracy")) for a in accuracies):
            raise fail(f"{broken}: results.tasks.{task} lacks an accuracy at one of the lengths", fix)
        for length, cell in cells.items():
            if not isinstance(cell, dict) or not is_number(cell.get("accuracy")):
                raise fail(f"{broken}: results.tasks.{task}.{length} has no accuracy", fix)
    averaged = results.get("average_of")
    if not isinstance(averaged, list) or not averaged or not all(isinstance(t, str) for t in averaged):
        raise fail(f"{broken}: results.average_of is missing or malformed", fix)


def _check_longbench(results: dict[str, Any], path: Path, fix: str) -> None:
    """A longbench report's tables, read as `report` reads them (tasks.longbench.tables: one description)."""
    from ..tasks.longbench.tables import longbench_parts  # imports nothing of runs/: no circle

    _read_as_tables(longbench_parts, results, path)


def _check_mtbench(results: dict[str, Any], path: Path, fix: str) -> None:
    """An mtbench report's tables, read as `report` reads them (tasks.mtbench.tables: one description)."""
    from ..tasks.mtbench.tables import mtbench_parts  # imports nothing of runs/: no circle

    _read_as_tables(mtbench_parts, results, path)


def _read_as_tables(parts: Any, results: dict[str, Any], path: Path) -> None:
    try:
        parts(results)
    except MegaevalError as e:
        raise MegaevalError(f"{path} is not a complete megaeval report: {e}") from None  # e names the fix


def _check_results(report: dict[str, Any], path: Path) -> None:
    broken = f"{path} is not a complete megaeval report"
    fix = "pass an unedited report written by megaeval --out"
    results = report["results"]
    if not isinstance(results, dict):
        raise fail(f"{broken}: results is a {type(results).__name__}, not an object", fix)
    if report.get("command") == "ruler":
        _check_ruler(results, path, fix)
        return
    if report.get("command") == "longppl":
        _check_longppl(results, path, fix)
        return
    if report.get("command") == "babilong":
        _check_babilong(results, path, fix)
        return
    if report.get("command") == "longbench":
        _check_longbench(results, path, fix)
        return
    if report.get("command") == "mtbench":
        _check_mtbench(results, path, fix)
        return
    if report.get("command") in ("mrcr", "graphwalks"):
        from ..tasks.mrcr.tables import graphwalks_parts, mrcr_parts  # imports nothing of runs/: no circle

        _read_as_tables(mrcr_parts if report["command"] == "mrcr" else graphwalks_parts, results, path)
        return
    if report.get("command") != "ppl-sweep":
        _check_tasks(results, broken, fix)
        if report.get("command") == "needle":
            _check_needle(results, path, fix)
        return
    _check_sweep(results, broken, fix)


SWEEP_NUMBERS = ("ppl", "nll_sum", "longppl", "n_key_tokens", "bits_per_byte", "word_ppl", "tokens_per_second",
                 "peak_memory_bytes", "model_flops_per_token", "achieved_tflops", "mfu")  # fmt: skip


def _check_sweep(results: dict[str, Any], broken: str, fix: str) -> None:
    """A ppl-sweep report's rows (each context length once, its numbers numbers or null) and position curves
    (buckets [start, end) with 0 <= start < end)."""
    rows = results.get("lengths")
    if not isinstance(rows, list) or not rows:
        raise fail(f"{broken}: results.lengths is missing or empty", fix)
    seen = set()
    for i, row in enumerate(rows):
        length = row.get("context_length") if isinstance(row, dict) else None
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise fail(f"{broken}: results.lengths[{i}].context_length is {length!r}, not a positive integer", fix)
        if length in seen:
            raise fail(f"{broken}: results.lengths holds context_length {length} twice", fix)
        seen.add(length)
        for key in ("ppl", "nll_sum"):
            if key not in row:
                raise fail(f"{broken}: results.lengths[{i}] has no {key}", fix)
        for key in SWEEP_NUMBERS:
            value = row.get(key)
            if value is not None and not is_number(value):
                raise fail(f"{broken}: results.lengths[{i}].{key} is {value!r:.40}, not a number", fix)
    curves = results.get("position_curve", [])
    if not isinstance(curves, list):
        raise fail(f"{broken}: results.position_curve is malformed", fix)
    for i, curve in enumerate(curves):
        length = curve.get("context_length") if isinstance(curve, dict) else None
        buckets = curve.get("buckets") if isinstance(curve, dict) else None
        if not isinstance(length, int) or isinstance(length, bool) or length < 1 or not isinstance(buckets, list):
            raise fail(f"{broken}: results.position_curve[{i}] is malformed", fix)
        for j, b in enumerate(buckets):
            start, end = (b.get("start"), b.get("end")) if isinstance(b, dict) else (None, None)
            whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end))
            mean = b.get("mean_nll") if isinstance(b, dict) else None
            if not whole or not 0 <= start < end or (mean is not None and not is_number(mean)):
                raise fail(f"{broken}: results.position_curve[{i}].buckets[{j}] is not a bucket [start, end) with "
                           "0 <= start < end and a mean_nll", fix)  # fmt: skip
