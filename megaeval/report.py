"""JSON reports: building them with every setting and the environment, writing them atomically,
and showing several side by side. The schema is documented in docs/reports.md."""

from __future__ import annotations

import csv
import io
import json
import platform
import subprocess
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .errors import fail

SCHEMA_VERSION = 1


def git_revision() -> str | None:
    """The megaeval source checkout's commit (with '+dirty' when modified), if it is a git checkout."""
    root = Path(__file__).resolve().parent.parent
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
    from . import __version__

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


def model_facts(lm: Any, spec: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The report's `model` section: the spec and options as given, what the model says of itself, and the
    checksum of its weights."""
    return {
        "spec": getattr(lm, "spec", spec),
        "options": options,
        **lm.describe(),
        "weights_sha256": lm.weights_sha256(),
    }


def numeric_settings(settings: Any) -> dict[str, Any]:
    """A run's settings without those that cannot change its numbers (where output goes, whether it resumes),
    for checking that a resumed run is the run that was interrupted."""
    return {k: v for k, v in asdict(settings).items() if k not in ("out", "samples", "resume")}


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a report, checking that it is one this version understands."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise fail(f"report not found: {path}") from None
    except ValueError as e:
        raise fail(f"{path} is not valid JSON ({e})") from None
    if not isinstance(report, dict) or "schema_version" not in report or "results" not in report:
        raise fail(f"{path} is not a megaeval report", "pass files written by megaeval --out")
    if report["schema_version"] != SCHEMA_VERSION:
        raise fail(f"{path} has schema_version {report['schema_version']}; this megaeval reads {SCHEMA_VERSION}")
    return report


def report_label(report: dict[str, Any], path: str | Path) -> str:
    """A short column label: the model's name, plus any non-default evaluation choice."""
    spec = str(report.get("model", {}).get("spec") or path)
    name = Path(spec.split(":", 1)[-1]).name or spec
    extras = []
    settings = report.get("settings", {})
    if settings.get("norm_stats") not in (None, "cumulative"):
        extras.append(settings["norm_stats"])
    if settings.get("window_policy") not in (None, "error"):
        extras.append(settings["window_policy"])
    return name + (f" ({', '.join(extras)})" if extras else "")


def unique_labels(labels: list[str]) -> list[str]:
    """Labels with repeats told apart: ['a', 'a'] -> ['a', 'a #2']."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


SWEEP_METRICS = ("ppl", "bits_per_byte", "word_ppl", "nll_sum", "tokens_per_second", "peak_memory_bytes")


def sweep_rows(reports: list[dict[str, Any]], metric: str = "ppl") -> tuple[list[str], list[list[str]]]:
    """Side-by-side ppl-sweep table: one row per context length, one column per report."""
    if metric not in SWEEP_METRICS:
        raise fail(f"unknown metric {metric!r}", f"use one of: {', '.join(SWEEP_METRICS)}")
    by_length = [{row["context_length"]: row for row in r["results"]["lengths"]} for r in reports]
    lengths = sorted({length for table in by_length for length in table})
    rows = []
    for length in lengths:
        cells = [format_length(length)]
        for table in by_length:
            value = table.get(length, {}).get(metric)
            cells.append("" if value is None else format_value(value))
        rows.append(cells)
    return ["context"], rows


def format_length(n: int) -> str:
    """4096 -> '4K', 2097152 -> '2M', 3000 -> '3000'."""
    for suffix, unit in (("M", 1 << 20), ("K", 1 << 10)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def format_value(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value)}"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"


def render(header: list[str], rows: list[list[str]], fmt: str, title: str | None = None) -> str:
    """A table as plain text (rich), markdown or csv."""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        return buf.getvalue()
    if fmt == "markdown":
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return ("" if title is None else f"**{title}**\n\n") + "\n".join(lines) + "\n"
    if fmt == "table":
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right")
        for r in rows:
            table.add_row(*r)
        console = Console(file=io.StringIO(), width=max(80, 14 * len(header)), force_terminal=False)
        console.print(table)
        return console.file.getvalue()
    raise fail(f"unknown format {fmt!r}", "use table, markdown or csv")


def task_rows(reports: list[dict[str, Any]], metric: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Side-by-side scrolls/academic table: one row per task (its headline metric unless `metric`)."""
    tasks: list[str] = []
    for r in reports:
        tasks += [t for t, v in r["results"].items() if isinstance(v, dict) and t not in tasks]
    rows = []
    for task in tasks:
        cells = [task]
        for r in reports:
            res = r["results"].get(task)
            key = metric or (res or {}).get("metric", "acc")
            value = None if not isinstance(res, dict) else res.get(key)
            cells.append("" if value is None else format_value(value))
        rows.append(cells)
    return ["task"], rows


def compare(paths: list[str | Path], fmt: str = "table", metric: str | None = None) -> str:
    """`megaeval report`: the given reports side by side."""
    if not paths:
        raise fail("no reports given", "pass one or more report.json files")
    reports = [load_report(p) for p in paths]
    commands = {r.get("command") for r in reports}
    if len(commands) > 1:
        raise fail(f"cannot put {' and '.join(sorted(map(str, commands)))} reports in one table", "pass one kind")
    if commands == {"ppl-sweep"}:
        header, rows = sweep_rows(reports, metric or "ppl")
        title = f"{metric or 'ppl'} by context length"
    else:
        header, rows = task_rows(reports, metric)
        title = f"{commands.pop()}: {metric or 'headline metric'} by task"
    header += unique_labels([report_label(r, p) for r, p in zip(reports, paths, strict=True)])
    return render(header, rows, fmt, title=title)
