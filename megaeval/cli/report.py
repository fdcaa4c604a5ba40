"""`megaeval report` and `megaeval plot`'s command lines."""

from __future__ import annotations

from typing import Annotated

import typer

from ..console import echo
from .options import command


@command()
def report(
    reports: Annotated[list[str], typer.Argument(help="Report JSON files.")],
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv, or html (one page, --out).")] = "table",
    metric: Annotated[
        str | None,
        typer.Option(
            help="ppl-sweep: ppl (default), bits_per_byte, word_ppl, ...; other reports: a result key "
            "such as exact_match (default: each task's headline metric)."
        ),
    ] = None,
    samples: Annotated[
        list[str] | None, typer.Option(help="html: the runs' --samples files, for the sample browser (repeatable).")
    ] = None,
    out: Annotated[str | None, typer.Option(help="html: the page to write, e.g. reports/runs.html.")] = None,
) -> None:
    """Reports side by side: a row per context length (ppl-sweep) or per task, a column per report; with
    --format html, one self-contained page of every kind with plots and a sample browser."""
    from ..commands.report.kinds import check_flags, compare

    check_flags(fmt, {"--metric": metric is not None, "--samples": bool(samples), "--out": out is not None})
    if fmt == "html":
        from ..commands.report.page import write_html

        echo(f"page: {write_html(reports, samples or [], out)}")
        return
    echo(compare(reports, fmt=fmt, metric=metric), end="")


@command()
def plot(
    reports: Annotated[list[str], typer.Argument(help="ppl-sweep or needle report JSON files.")],
    out: Annotated[str, typer.Option(help="Picture file: .png, .svg or .pdf.")],
    position_curve: Annotated[bool, typer.Option(help="Add the per-position NLL curve panel.")] = False,
    metric: Annotated[str, typer.Option(help="ppl-sweep: ppl, or longppl (a sweep with key tokens).")] = "ppl",
) -> None:
    """Perplexity against context length (log2 axis), one line per report; needle reports: heatmaps of accuracy
    by depth and length, and (several reports) accuracy against length."""
    from ..commands.report.plot import plot_reports

    echo(f"plot: {plot_reports(reports, out, position_curve=position_curve, metric=metric)}")
