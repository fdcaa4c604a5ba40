"""`megaeval plot`: perplexity against context length (and the per-position NLL curve) from reports; needle
heatmaps, RULER averages by length and BABILong heatmaps (plot_retrieval).

Needs the `plot` extra (matplotlib).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import check_outputs, check_writable, write_output
from ...runs.report import load_report
from ...tables import format_length, report_label, unique_labels


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise fail("megaeval plot needs matplotlib", "pip install 'megaeval[plot]'") from None
    return plt


PLOT_METRICS = {"ppl": "perplexity", "longppl": "LongPPL (key tokens)"}


def plot_reports(paths: list[str | Path], out: str | Path, position_curve: bool = False, metric: str = "ppl") -> Path:
    """Draw ppl (or LongPPL) vs context length (log2 axis), one line per report; optionally the position curves."""
    if metric not in PLOT_METRICS:
        raise fail(f"unknown --metric {metric!r}", f"use one of: {', '.join(PLOT_METRICS)}")
    if not paths:
        raise fail("no reports given", "pass one or more ppl-sweep report.json files")
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise fail(f"--out {out} must end in .png, .svg or .pdf")
    check_outputs({"--out": out}, paths)
    check_writable(out)
    reports = [load_report(p) for p in paths]
    labels = unique_labels([report_label(r, p) for r, p in zip(reports, paths, strict=True)])
    for kind in FIGURES:
        if any(r.get("command") == kind for r in reports):
            if metric != "ppl":
                raise fail(f"--metric {metric} draws ppl-sweep reports", f"drop --metric for {kind} reports")
            return _retrieval_plot(kind, paths, reports, labels, out, position_curve)
    for p, r in zip(paths, reports, strict=True):
        if r.get("command") != "ppl-sweep":
            raise fail(f"{p} is a {r.get('command')!r} report",
                       "plot draws ppl-sweep, needle, ruler or babilong reports")  # fmt: skip
        if position_curve and not r["results"].get("position_curve"):
            raise fail(f"{p} has no results.position_curve", "drop --position-curve, or plot ppl-sweep reports")
        if metric == "longppl" and not any(row.get("longppl") is not None for row in r["results"]["lengths"]):
            raise fail(f"{p} has no LongPPL", "run ppl-sweep with --key-tokens F or --evaluator E, or drop --metric")
    plt = _pyplot()
    panels = 2 if position_curve else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.6), squeeze=False)
    _ppl_panel(axes[0][0], reports, labels, metric)
    if position_curve:
        _position_panel(axes[0][1], reports, labels)
    data = reports[0].get("data") or {}
    what = "Perplexity" if metric == "ppl" else "LongPPL"
    fig.suptitle(f"{what} by context length — {data.get('tokens_scored', 0):,} tokens per length", fontsize=12)
    fig.tight_layout()
    return _save(plt, fig, out)


def _save(plt: Any, fig: Any, out: Path) -> Path:
    image = io.BytesIO()
    fig.savefig(image, dpi=130, format=out.suffix.lower()[1:])
    plt.close(fig)
    write_output(out, lambda f: f.write(image.getvalue()))
    return out


FIGURES = ("needle", "ruler", "babilong")  # report kinds drawn by plot_retrieval's `<kind>_figure`


def _retrieval_plot(
    kind: str, paths: list, reports: list[dict], labels: list[str], out: Path, position_curve: bool
) -> Path:
    from . import plot_retrieval

    for p, r in zip(paths, reports, strict=True):
        if r.get("command") != kind:
            raise fail(f"{p} is a {r.get('command')!r} report, and a {kind} report is among the others",
                       f"plot {kind} reports together, and other kinds apart")  # fmt: skip
    if position_curve:
        raise fail("--position-curve draws ppl-sweep reports", f"drop --position-curve for {kind} reports")
    plt = _pyplot()
    return _save(plt, getattr(plot_retrieval, f"{kind}_figure")(plt, reports, labels), out)


def _ppl_panel(ax: Any, reports: list[dict], labels: list[str], metric: str = "ppl") -> None:
    all_lengths: set[int] = set()
    for report, label in zip(reports, labels, strict=True):
        rows = report["results"]["lengths"]
        xs = [r["context_length"] for r in rows]
        all_lengths.update(xs)
        ax.plot(xs, [r.get(metric) for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted(all_lengths)
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_length(t) for t in ticks], rotation=45 if len(ticks) > 6 else 0)
    ax.minorticks_off()
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"{PLOT_METRICS[metric]} (token level)")
    ax.set_title(f"{PLOT_METRICS[metric][0].upper()}{PLOT_METRICS[metric][1:]} vs context length")
    ax.grid(True, alpha=0.3)
    ax.legend()


def _position_panel(ax: Any, reports: list[dict], labels: list[str]) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    for report, label in zip(reports, labels, strict=True):
        curve = max(report["results"]["position_curve"], key=lambda c: c["context_length"])
        xs = [b["end"] for b in curve["buckets"]]  # positions [start, end) have seen start+1 .. end tokens
        ax.plot(xs, [b["mean_nll"] for b in curve["buckets"]], marker=".",
                label=f"{label} (L={format_length(curve['context_length'])})")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_length(int(x)) if x >= 1 else ""))
    ax.set_xlabel("tokens of context seen (upper edge of each log2 bucket)")
    ax.set_ylabel("mean NLL (nats)")
    ax.set_title("NLL by position within the segment (longest context)")
    ax.grid(True, alpha=0.3)
    ax.legend()
