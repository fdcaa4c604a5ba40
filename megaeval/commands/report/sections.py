"""The HTML page's section for each report kind (`report --format html`), registered in `report.kinds.KINDS`
beside the kind's terminal table: runs side by side, numbers as the reports hold them, pictures as SVG."""

from __future__ import annotations

from html import escape
from typing import Any

from ...runs.report import TASK_SUMMARIES
from ...tables import format_length, format_value
from .kinds import documents, graphwalks_parts, longbench_parts, mrcr_parts, mtbench_parts
from .svg import heatmap, line_chart, radar_chart


def table(header: list[str], rows: list[list[str]], classes: list[list[str]] | None = None, name: str = "") -> str:
    """An HTML table (cells already escaped), with an optional class per body cell."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        marks = classes[i] if classes else [""] * len(row)
        cells = "".join(f'<td class="{m}">{c}</td>' if m else f"<td>{c}</td>" for m, c in zip(marks, row, strict=True))
        body.append(f"<tr>{cells}</tr>")
    return f'<table class="numbers" data-table="{escape(name)}"><thead><tr>{head}</tr></thead><tbody>' \
           f'{"".join(body)}</tbody></table>'  # fmt: skip


def _value(value: Any) -> str:
    return "" if value is None else escape(format_value(value))


def sweep_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """Perplexity: the table by context length (ppl, and LongPPL when measured), the Figure 5 curve and the
    position curve at each run's longest length."""
    keyed = any(row.get("longppl") is not None for r in reports for row in r["results"]["lengths"])
    by_length = [{row["context_length"]: row for row in r["results"]["lengths"]} for r in reports]
    lengths = sorted({n for t in by_length for n in t})
    metrics = ["ppl", *(["longppl"] if keyed else []), "bits_per_byte"]
    header = ["context"] + [f"{escape(label)}<br><small>{m}</small>" for m in metrics for label in labels]
    rows = [[format_length(n)] + [_value(t.get(n, {}).get(m)) for m in metrics for t in by_length] for n in lengths]
    parts = [table(header, rows, name="ppl-sweep")]
    curves = [(label, [(row["context_length"], row.get("ppl")) for row in r["results"]["lengths"]])
              for r, label in zip(reports, labels, strict=True)]  # fmt: skip
    parts.append(line_chart(curves, "Perplexity by context length", "perplexity (token level)"))
    if keyed:
        keys = [(label, [(row["context_length"], row.get("longppl")) for row in r["results"]["lengths"]])
                for r, label in zip(reports, labels, strict=True)]  # fmt: skip
        parts.append(line_chart(keys, "LongPPL (key tokens) by context length", "LongPPL"))
    position = []
    for r, label in zip(reports, labels, strict=True):
        curves_of = r["results"].get("position_curve") or []
        if curves_of:
            longest = max(curves_of, key=lambda c: c["context_length"])
            position.append((f"{label} (L={format_length(longest['context_length'])})",
                             [(b["end"], b["mean_nll"]) for b in longest["buckets"]]))  # fmt: skip
    if position:
        parts.append(line_chart(position, "NLL by position within the segment", "mean NLL (nats)",
                                "tokens of context seen (upper edge of each log2 bucket)"))  # fmt: skip
    return "".join(parts)


def task_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """SCROLLS and academic: a row per task, its headline metric ± stderr per run; a cell whose value differs from
    the first run's by more than their combined standard errors (or at all, without them) is highlighted."""
    tasks = list(dict.fromkeys(t for r in reports for t in r["results"] if t not in TASK_SUMMARIES))
    rows, classes = [], []
    for task in tasks:
        results = [r["results"].get(task) if isinstance(r["results"].get(task), dict) else None for r in reports]
        metric = next((res["metric"] for res in results if res and "metric" in res), "acc")
        first = results[0] or {}
        row, marks = [f"{escape(task)} <small>{escape(metric)}</small>"], [""]
        for res in results:
            value, err = (res or {}).get(metric), (res or {}).get(f"{metric}_stderr")
            row.append("" if value is None else _value(value) + (f" ± {err:.4f}" if err is not None else ""))
            marks.append("differs" if _differs(first, res or {}, metric) else "")
        rows.append(row)
        classes.append(marks)
    averages = [r["results"].get("average") for r in reports]
    if any(isinstance(a, (int, float)) for a in averages):
        rows.append(["average"] + [_value(a) for a in averages])
        classes.append([""] * (len(reports) + 1))
    return table(["task", *map(escape, labels)], rows, classes, name="tasks")


def _differs(first: dict[str, Any], other: dict[str, Any], metric: str) -> bool:
    a, b = first.get(metric), other.get(metric)
    if a is None or b is None or other is first:
        return False
    spread = (first.get(f"{metric}_stderr") or 0.0) + (other.get(f"{metric}_stderr") or 0.0)
    return abs(a - b) > spread if spread else a != b


def needle_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """Needle: one heatmap per task and run (accuracy by depth and length) and the accuracy table."""
    parts = []
    for report, label in zip(reports, labels, strict=True):
        for task, res in report["results"].items():
            if task in TASK_SUMMARIES:
                continue
            lengths = [format_length(row["length"]) for row in res["lengths"]]
            depths = sorted({c["depth"] for c in res["cells"]})
            values = {(f"{c['depth']}%", format_length(c["length"])): c["accuracy"] for c in res["cells"]}
            title = f"{label}: {task}, accuracy {res['accuracy']:.2f}"
            parts.append(heatmap([f"{d}%" for d in depths], lengths, values, title))
    return "".join(parts)


def ruler_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """RULER: per run, its scores by task and length, the averages and the effective length."""
    parts = []
    for report, label in zip(reports, labels, strict=True):
        res = report["results"]
        lengths = [row["length"] for row in res["lengths"]]
        grid = {(t, r["length"]): r["score"] for t, v in res["tasks"].items() for r in v["lengths"]}
        rows = [[escape(t)] + [_value(grid.get((t, n))) for n in lengths] for t in res["tasks"]]
        rows.append(["average"] + [_value(row["average"]) for row in res["lengths"]])
        effective = format_length(res["effective_length"]) if res.get("effective_length") else "below the first"
        parts.append(f"<h3>{escape(label)}: average {_value(res['average'])}, wAvg inc {_value(res['wavg_inc'])}, "
                     f"dec {_value(res['wavg_dec'])}, effective length {effective}</h3>")  # fmt: skip
        parts.append(table(["task", *(format_length(n) for n in lengths)], rows, name=f"ruler-{label}"))
    return "".join(parts)


def babilong_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """BABILong: per run, the published heatmap (accuracy by task and length, the qa1-qa5 average below)."""
    parts = []
    for report, label in zip(reports, labels, strict=True):
        res = report["results"]
        lengths = [row["length"] for row in res["lengths"]]
        values = {(t, n): cell["accuracy"] / 100 for t, cells in res["tasks"].items() for n, cell in cells.items()}
        values.update({("average", row["length"]): None if row["average"] is None else row["average"] / 100
                       for row in res["lengths"]})  # fmt: skip
        title = f"{label}: BABILong accuracy by task and length"
        parts.append(heatmap([*res["tasks"], "average"], lengths, values, title, lambda v: f"{100 * v:.0f}"))
    return "".join(parts)


def longbench_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """LongBench: per run, its official tables (v1's scores and leaderboard, LongBench-E's buckets, v2's figures)."""
    return "".join(_tables(longbench_parts(report["results"]), label, "longbench")
                   for report, label in zip(reports, labels, strict=True))  # fmt: skip


def _tables(parts: list[tuple[str, list[str], list[list[str]]]], label: str, kind: str) -> str:
    """A run's (title, header, rows) tables, each under its heading."""
    out = []
    for k, (title, header, rows) in enumerate(parts):
        out.append(f"<h3>{escape(label)}: {escape(title)}</h3>")
        out.append(table([escape(h) for h in header], [[escape(c) for c in row] for row in rows],
                         name=f"{kind}-{label}-{k}"))  # fmt: skip
    return "".join(out)


def mtbench_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """MT-Bench: per run, show_result.py's table, the category means and their radar chart (every model judged)."""
    from ...tasks.mtbench.tables import mtbench_models

    parts = []
    for report, label in zip(reports, labels, strict=True):
        parts.append(_tables(mtbench_parts(report["results"]), label, "mtbench"))
        models = mtbench_models(report["results"])
        axes = list(dict.fromkeys(c for r in models.values() for c in (r["categories"] or {})))
        series = [(m, r["categories"]) for m, r in models.items() if r["categories"]]
        if series:
            parts.append(radar_chart(axes, series, f"{label}: MT-Bench by category (0-10)"))
    return "".join(parts)


def mrcr_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """OpenAI MRCR: per run, its tables and the model cards' curve, the mean grade against the bin's upper edge (o200k
    tokens), one line per needle count (records outside the card's bins are in the tables, not on the curve)."""
    from ...tasks.mrcr.results import BINS, LONGER, bin_high
    from ...tasks.mrcr.tables import grouped_scores

    parts = []
    for report, label in zip(reports, labels, strict=True):
        parts.append(_tables(mrcr_parts(report["results"]), label, "mrcr"))
        rows, _ = grouped_scores(report["results"], "needles", "bins")
        drawn = (*BINS, *LONGER)
        series = [(f"{n} needles", [(bin_high(b), cell["mean"]) for b, cell in r["cells"].items() if b in drawn])
                  for n, r in rows.items()]  # fmt: skip
        parts.append(line_chart(series, f"{label}: MRCR mean grade by length", "mean grade",
                                "prompt + answer (o200k_base tokens, bin upper edge)"))  # fmt: skip
    return "".join(parts)


def graphwalks_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """Graphwalks: per run, its tables and the mean F1 against the prompt_chars bucket, one line per problem type."""
    from ...tasks.graphwalks.results import bucket_chars
    from ...tasks.mrcr.tables import grouped_scores

    parts = []
    for report, label in zip(reports, labels, strict=True):
        parts.append(_tables(graphwalks_parts(report["results"]), label, "graphwalks"))
        rows, _ = grouped_scores(report["results"], "problem_types", "buckets")
        series = [(kind, [(bucket_chars(b), cell["mean"]) for b, cell in r["cells"].items()]) for kind, r in
                  rows.items()]  # fmt: skip
        parts.append(line_chart(series, f"{label}: Graphwalks mean F1 by length", "mean F1",
                                "prompt characters (bucket upper edge)"))  # fmt: skip
    return "".join(parts)


def longppl_section(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """LongPPL: a row per document, LongPPL and perplexity per run, and the pooled row."""
    ids, tables = documents(reports)
    header = ["document"] + [f"{escape(label)}<br><small>{m}</small>" for label in labels for m in ("longppl", "ppl")]
    rows = [[escape(i)] + [_value(t.get(i, {}).get(m)) for t in tables for m in ("longppl", "ppl")] for i in ids]
    rows.append(["all (pooled)"] + [_value(r["results"].get(m)) for r in reports for m in ("longppl", "ppl")])
    return table(header, rows, name="longppl")
