"""Tables for people: numbers formatted, reports labelled, rendered as a terminal table, markdown or csv."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from .errors import fail


def format_length(n: int) -> str:
    """4096 -> '4K', 2097152 -> '2M', 3000 -> '3000'."""
    for suffix, unit in (("M", 1 << 20), ("K", 1 << 10)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def format_duration(seconds: float) -> str:
    """42 -> '42 s', 754 -> '12.6 min', 9000 -> '2.5 h', 300000 -> '3.5 days'."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def format_value(value: float) -> str:
    """A number with 4 significant-ish digits; large integers as integers."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value)}"
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"


def render_table(header: list[str], rows: list[list[str]], fmt: str, title: str | None = None) -> str:
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
        from rich.text import Text

        # every name and value as literal text: a model `mamba[v1]` or a task `[red]x` is printed as it is written
        table = Table(title=None if title is None else Text(title))
        for i, h in enumerate(header):
            table.add_column(Text(h), justify="left" if i == 0 else "right")
        for r in rows:
            table.add_row(*(Text(c) for c in r))
        # Wide enough never to wrap a cell: a table must read the same in any terminal and any checkout path.
        width = max(80, sum(max(len(h), *(len(r[i]) for r in rows), 0) + 3 for i, h in enumerate(header)) + 1)
        console = Console(file=io.StringIO(), width=width, force_terminal=False)
        console.print(table)
        return console.file.getvalue()
    raise fail(f"unknown format {fmt!r}", "use table, markdown or csv")


def report_label(report: dict[str, Any], path: str | Path) -> str:
    """A short column label: the model's name, plus any non-default evaluation choice."""
    spec = str(report.get("model", {}).get("spec") or path)
    name = Path(spec.split(":", 1)[-1]).name or spec
    extras = []
    settings = report.get("settings", {})
    if settings.get("norm_stats") not in (None, "cumulative"):
        extras.append(str(settings["norm_stats"]))
    if settings.get("window_policy") not in (None, "error"):
        extras.append(str(settings["window_policy"]))
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


def render_rows(title: str, rows: list[tuple[str, str]]) -> str:
    """(label, value) rows as a boxed two-column table, as wide as its content whatever the terminal."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title), show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(no_wrap=True)
    for key, value in rows:
        table.add_row(Text(key), Text(value))
    width = max(len(k) for k, _ in rows) + max(len(v) for _, v in rows) + 7
    console = Console(file=io.StringIO(), width=max(width, len(title)), force_terminal=False)
    console.print(table)
    return console.file.getvalue()
