"""`megaeval report`: several reports side by side, a row per context length (ppl-sweep) or per task."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import fail
from ...runs.report import TASK_SUMMARIES, load_report
from ...tables import format_length, format_value, render_table, report_label, unique_labels
from ...tasks.longbench.tables import longbench_parts
from ...tasks.mrcr.tables import graphwalks_parts, mrcr_parts, side_by_side
from ...tasks.mtbench.tables import mtbench_parts

SWEEP_METRICS = ("ppl", "longppl", "n_key_tokens", "bits_per_byte", "word_ppl", "nll_sum", "tokens_per_second",
                 "peak_memory_bytes", "model_flops_per_token", "achieved_tflops", "mfu")  # fmt: skip


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


LONGPPL_METRICS = ("longppl", "ppl", "n_key_tokens", "n_tokens")


def longppl_rows(reports: list[dict[str, Any]], metric: str = "longppl") -> tuple[list[str], list[list[str]]]:
    """Side-by-side longppl table: one row per document (by id, in first-seen order) and the pooled row."""
    if metric not in LONGPPL_METRICS:
        raise fail(f"unknown metric {metric!r} for longppl reports", f"use one of: {', '.join(LONGPPL_METRICS)}")
    ids, tables = documents(reports)
    rows = [[i] + [_cell(table.get(i, {}).get(metric)) for table in tables] for i in ids]
    rows.append(["all (pooled)"] + [_cell(r["results"].get(metric)) for r in reports])
    return ["document"], rows


def documents(reports: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, dict[str, Any]]]]:
    """LongPPL documents in first-seen order, and each report's documents by that name: an id that a report holds
    twice (older reports: the same file given twice) stays two rows, the second named `id #2`, never merged."""
    tables = []
    for r in reports:
        table: dict[str, dict[str, Any]] = {}
        for d in r["results"]["documents"]:
            name, n = d["id"], 1
            while name in table:
                n += 1
                name = f"{d['id']} #{n}"
            table[name] = d
        tables.append(table)
    return list(dict.fromkeys(i for table in tables for i in table)), tables


def _cell(value: Any) -> str:
    return "" if value is None else format_value(value)


def task_rows(reports: list[dict[str, Any]], metric: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Side-by-side scrolls/academic table: one row per task (its headline metric unless `metric`)."""
    tasks: list[str] = []
    for r in reports:
        tasks += [t for t, v in r["results"].items() if t not in TASK_SUMMARIES and t not in tasks]
    if metric is not None:
        known = sorted({k for r in reports for v in r["results"].values() if isinstance(v, dict) for k in v
                        if isinstance(v[k], (int, float)) and not isinstance(v[k], bool) and k != "n"})  # fmt: skip
        if metric not in known:
            raise fail(f"no task in these reports has a metric {metric!r}", f"use one of: {', '.join(known)}")
    rows = []
    for task in tasks:
        cells = [task]
        for r in reports:
            res = r["results"].get(task)
            key = metric or (res or {}).get("metric", "acc")
            value = None if not isinstance(res, dict) else res.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise fail(f"results.{task}.{key} of the {r['command']} report of {report_label(r, '?')} is "
                           f"{value!r:.40}, not a number", "pass an unedited report, or another --metric")  # fmt: skip
            cells.append("" if value is None else format_value(value))
        rows.append(cells)
    if metric is None and any(isinstance(r["results"].get("average"), (int, float)) for r in reports):
        averages = [r["results"].get("average") for r in reports]
        rows.append(["average"] + ["" if a is None else format_value(a) for a in averages])
    return ["task"], rows


def needle_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """Needle reports: for each report and task, accuracy with a row per depth and a column per length, and a last
    row of each length's mean. As csv, one table whose rows name their report and task (columns: every length)."""
    grids = []
    for report, label in zip(reports, labels, strict=True):
        for task, res in report["results"].items():
            if task in TASK_SUMMARIES:
                continue
            lengths = [row["length"] for row in res["lengths"]]
            depths = sorted({c["depth"] for c in res["cells"]})
            grid = {(c["length"], c["depth"]): c["accuracy"] for c in res["cells"]}
            grid.update({(row["length"], "mean"): row["accuracy"] for row in res["lengths"]})
            grids.append((label, task, res, lengths, [*depths, "mean"], grid))
    if fmt == "csv":
        lengths = sorted({n for *_, grid_lengths, _, _ in grids for n in grid_lengths})
        rows = [[label, task, _depth(d)] + [_accuracy(grid.get((n, d))) for n in lengths]
                for label, task, _, _, depths, grid in grids for d in depths]  # fmt: skip
        return render_table(["model", "task", "depth"] + [format_length(n) for n in lengths], rows, fmt)
    out = []
    for label, task, res, lengths, depths, grid in grids:
        rows = [[_depth(d)] + [_accuracy(grid.get((n, d))) for n in lengths] for d in depths]
        title = f"{label}: {task} accuracy by needle depth and length (overall {_accuracy(res['accuracy'])})"
        out.append(f"{title}\n{render_table(['depth'] + [format_length(n) for n in lengths], rows, fmt)}")
    return "".join(out)


def ruler_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """RULER reports: for each, its scores (x 100) with a row per task and a column per length, the average row,
    and the summary (average, wAvg inc and dec, effective length). As csv, one table whose rows name their report."""
    out, csv_rows = [], []
    all_lengths = sorted({row["length"] for r in reports for row in r["results"]["lengths"]})
    for report, label in zip(reports, labels, strict=True):
        res = report["results"]
        lengths = [row["length"] for row in res["lengths"]]
        grid = {(task, r["length"]): r["score"] for task, t in res["tasks"].items() for r in t["lengths"]}
        grid.update({("average", row["length"]): row["average"] for row in res["lengths"]})
        names = [*res["tasks"], "average"]
        rows = [[name] + [_score(grid.get((name, n))) for n in lengths] for name in names]
        csv_rows += [[label, name] + [_score(grid.get((name, n))) for n in all_lengths] for name in names]
        effective = res["effective_length"]
        reach = format_length(effective) if effective else f"< {format_length(lengths[0])}"
        title = (f"{label}: RULER, average {_score(res['average'])}, wAvg inc {_score(res['wavg_inc'])}, dec "
                 f"{_score(res['wavg_dec'])}, effective length {reach} (above {res['threshold']})")  # fmt: skip
        out.append(f"{title}\n{render_table(['task'] + [format_length(n) for n in lengths], rows, fmt)}")
    if fmt == "csv":
        return render_table(["model", "task"] + [format_length(n) for n in all_lengths], csv_rows, fmt)
    return "".join(out)


def babilong_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """BABILong reports: for each, accuracy (x 100) with a row per task and a column per length, and the qa1-qa5
    average row (blank where one of the five is missing). As csv, one table whose rows name their report."""
    out, csv_rows = [], []
    all_lengths = list(dict.fromkeys(row["length"] for r in reports for row in r["results"]["lengths"]))
    for report, label in zip(reports, labels, strict=True):
        res = report["results"]
        lengths = [row["length"] for row in res["lengths"]]
        grid = {(t, n): cell["accuracy"] for t, cells in res["tasks"].items() for n, cell in cells.items()}
        grid.update({("average", row["length"]): row["average"] for row in res["lengths"]})
        names = [*res["tasks"], "average"]
        rows = [[name] + [_percent(grid.get((name, n))) for n in lengths] for name in names]
        csv_rows += [[label, name] + [_percent(grid.get((name, n))) for n in all_lengths] for name in names]
        title = (
            f"{label}: BABILong accuracy by task and length (average: {res['average_of'][0]}-{res['average_of'][-1]})"
        )
        out.append(f"{title}\n{render_table(['task', *lengths], rows, fmt)}")
    if fmt == "csv":
        return render_table(["model", "task", *all_lengths], csv_rows, fmt)
    return "".join(out)


def longbench_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """LongBench reports, each as the official tables: v1 a row per task (eval.py's score, the prompts cut) and the
    leaderboard's categories by language; LongBench-E a row per task by length bucket; v2 result.py's figures. As
    csv, one table whose rows name their report and table."""
    out, csv_rows = [], []
    for report, label in zip(reports, labels, strict=True):
        for title, header, rows in longbench_parts(report["results"]):
            csv_rows += [[label, title, *header[1:]], *([label, title, *row] for row in rows)]
            out.append(f"{label}: {title}\n{render_table(header, rows, fmt)}")
    if fmt == "csv":
        return render_table(["model", "table", "row", "values"], [r[:3] + [" ".join(r[3:])] for r in csv_rows], fmt)
    return "".join(out)


def mtbench_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """MT-Bench reports, each as show_result.py's table (a row per model judged) and the category means; as csv,
    one table whose rows name their report and table."""
    out, csv_rows = [], []
    for report, label in zip(reports, labels, strict=True):
        for title, header, rows in mtbench_parts(report["results"]):
            csv_rows += [[label, title, *header], *([label, title, *row] for row in rows)]
            out.append(f"{label}: {title}\n{render_table(header, rows, fmt)}")
    if fmt == "csv":
        return render_table(["report", "table", "row", "values"], [r[:3] + [" ".join(r[3:])] for r in csv_rows], fmt)
    return "".join(out)


def parts_tables(parts_of: Callable[[Any], list[Any]], reports: list[dict[str, Any]], labels: list[str],
                 fmt: str = "table") -> str:  # fmt: skip
    """Reports whose results read as (title, header, rows) tables, each table under its report's label; as csv, one
    table whose rows name their report and table."""
    out, csv_rows = [], []
    for report, label in zip(reports, labels, strict=True):
        for title, header, rows in parts_of(report["results"]):
            csv_rows += [[label, title, *header], *([label, title, *row] for row in rows)]
            out.append(f"{label}: {title}\n{render_table(header, rows, fmt)}")
    if fmt == "csv":
        return render_table(["report", "table", "row", "values"], [r[:3] + [" ".join(r[3:])] for r in csv_rows], fmt)
    return "".join(out)


def mrcr_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """MRCR reports: several side by side (the mean grade per bin, a column each), then each one's mean grade per
    needle count and bin (the card's bins) and the records per cell."""
    from ...tasks.mrcr.results import ORDER, bin_high

    def order(name: str) -> tuple[int, int]:
        return (ORDER.index(name), 0) if name in ORDER else (len(ORDER), bin_high(name))

    return _compared(reports, labels, fmt, "bins", "MRCR: mean grade by o200k_base bin", order) + parts_tables(
        mrcr_parts, reports, labels, fmt)  # fmt: skip


def graphwalks_tables(reports: list[dict[str, Any]], labels: list[str], fmt: str = "table") -> str:
    """Graphwalks reports: several side by side (the mean F1 per prompt_chars bucket, a column each), then each
    one's mean F1 per problem type and bucket and the records per cell."""
    from ...tasks.graphwalks.results import bucket_chars

    return _compared(reports, labels, fmt, "buckets", "Graphwalks: mean F1 by prompt length", bucket_chars) + (
        parts_tables(graphwalks_parts, reports, labels, fmt))  # fmt: skip


def _compared(reports: list[dict[str, Any]], labels: list[str], fmt: str, columns: str, title: str,
              order: Callable[[str], Any]) -> str:  # fmt: skip
    """The runs side by side, when there are several (a csv holds each report's own tables only)."""
    if len(reports) < 2 or fmt == "csv":
        return ""
    name, header, rows = side_by_side([r["results"] for r in reports], labels, columns, title, order)
    return f"{name}\n{render_table(header, rows, fmt)}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _depth(depth: int | str) -> str:
    return depth if isinstance(depth, str) else f"{depth}%"


def _accuracy(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _sweep_table(reports: list[dict[str, Any]], labels: list[str], fmt: str, metric: str | None) -> str:
    header, rows = sweep_rows(reports, metric or "ppl")
    return render_table(header + labels, rows, fmt, title=f"{metric or 'ppl'} by context length")


def _longppl_table(reports: list[dict[str, Any]], labels: list[str], fmt: str, metric: str | None) -> str:
    header, rows = longppl_rows(reports, metric or "longppl")
    return render_table(header + labels, rows, fmt, title=f"longppl reports: {metric or 'longppl'} by document")


def _task_table(reports: list[dict[str, Any]], labels: list[str], fmt: str, metric: str | None) -> str:
    header, rows = task_rows(reports, metric)
    title = f"{reports[0]['command']}: {metric or 'headline metric'} by task"
    return render_table(header + labels, rows, fmt, title=title)


def _needle_table(reports: list[dict[str, Any]], labels: list[str], fmt: str, metric: str | None) -> str:
    return needle_tables(reports, labels, fmt) if metric is None else _task_table(reports, labels, fmt, metric)


@dataclass(frozen=True)
class ReportKind:
    """How one kind of report is shown: its title, its terminal table (`report`) and its HTML section
    (`report --format html`, in report.sections). A new report kind adds one entry here."""

    title: str
    table: Callable[[list[dict[str, Any]], list[str], str, str | None], str]
    html: str  # the name of its renderer in report.sections (imported only for HTML)
    metric: bool = True  # whether its table shows another metric with --metric


KINDS = {
    "ppl-sweep": ReportKind("Perplexity by context length", _sweep_table, "sweep_section"),
    "longppl": ReportKind("LongPPL", _longppl_table, "longppl_section"),
    "scrolls": ReportKind("SCROLLS", _task_table, "task_section"),
    "academic": ReportKind("Academic suite", _task_table, "task_section"),
    "needle": ReportKind("Needle in a haystack", _needle_table, "needle_section"),
    "ruler": ReportKind(
        "RULER", lambda reports, labels, fmt, _: ruler_tables(reports, labels, fmt), "ruler_section", metric=False
    ),  # fmt: skip
    "babilong": ReportKind(
        "BABILong", lambda reports, labels, fmt, _: babilong_tables(reports, labels, fmt), "babilong_section", False
    ),
    "longbench": ReportKind(
        "LongBench", lambda reports, labels, fmt, _: longbench_tables(reports, labels, fmt), "longbench_section", False
    ),
    "mtbench": ReportKind(
        "MT-Bench", lambda reports, labels, fmt, _: mtbench_tables(reports, labels, fmt), "mtbench_section", False
    ),
    "mrcr": ReportKind(
        "OpenAI MRCR", lambda reports, labels, fmt, _: mrcr_tables(reports, labels, fmt), "mrcr_section", False
    ),
    "graphwalks": ReportKind(
        "Graphwalks",
        lambda reports, labels, fmt, _: graphwalks_tables(reports, labels, fmt),
        "graphwalks_section",
        False,
    ),
}

FORMATS = ("table", "markdown", "csv", "html")
# The one rule table of `megaeval report`'s flags: the formats each applies to (anywhere else it would be ignored).
FLAGS = {"--metric": ("table", "markdown", "csv"), "--samples": ("html",), "--out": ("html",)}


def check_flags(fmt: str, given: dict[str, bool]) -> None:
    """Refuse an unknown --format, and a flag (`given`: flag -> whether it was given) that `fmt` would ignore."""
    if fmt not in FORMATS:
        raise fail(f"unknown --format {fmt!r}", f"use one of: {', '.join(FORMATS)}")
    for flag, formats in FLAGS.items():
        if given.get(flag) and fmt not in formats:
            raise fail(f"{flag} does not apply with --format {fmt} (it would be ignored)",
                       f"use {flag} with --format {' or '.join(formats)}, or leave it out")  # fmt: skip
    if fmt == "html" and not given.get("--out"):
        raise fail("--format html writes a page", "pass --out runs.html")


def compare(paths: list[str | Path], fmt: str = "table", metric: str | None = None) -> str:
    """`megaeval report`: the given reports side by side."""
    if not paths:
        raise fail("no reports given", "pass one or more report.json files")
    reports = [load_report(p) for p in paths]
    commands = {r.get("command") for r in reports}
    if len(commands) > 1:
        raise fail(f"cannot put {' and '.join(sorted(map(str, commands)))} reports in one table",
                   "pass one kind, or --format html for one page of every kind")  # fmt: skip
    kind = commands.pop()
    if metric is not None and not KINDS[kind].metric:
        raise fail(f"--metric does not apply to {kind} reports (their table shows every score; it would be ignored)",
                   "leave --metric out")  # fmt: skip
    labels = unique_labels([report_label(r, p) for r, p in zip(reports, paths, strict=True)])
    return KINDS[kind].table(reports, labels, fmt, metric)


def task_summary(report: dict[str, Any]) -> str:
    """Per-task results of a scrolls or academic report as a table (with coverage when only some were scored)."""
    header = ["task", "n", "metric", "score"]
    partial = [r["coverage"] for r in report["results"].values() if isinstance(r, dict) and "coverage" in r]
    covered = any(len(set(c.split("/"))) > 1 for c in partial)
    rows = []
    for task, r in report["results"].items():
        if isinstance(r, dict) and "n" in r:
            metric = r.get("metric", "acc")
            rows.append([task, str(r["n"]), metric, "" if r.get(metric) is None else f"{r[metric]:.4f}"]
                        + ([r.get("coverage", "")] if covered else []))  # fmt: skip
    title = f"{report['command']}: {report_label(report, 'predictions')}"
    return render_table(header + (["coverage"] if covered else []), rows, "table", title=title)
