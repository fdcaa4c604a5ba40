"""`megaeval report --format html`: one self-contained page for a set of runs. Sections by report kind (each kind's
renderer in report.sections, named by `report.kinds.KINDS`), provenance at a glance, and a sample browser over the
runs' samples files. No network, no server: the style and script (report/static/), the data and the SVG pictures
are inline."""

from __future__ import annotations

import json
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import check_outputs, check_writable, write_output
from ...runs.report import load_report
from ...tables import report_label, unique_labels
from . import sections as html_sections
from .kinds import KINDS
from .samples import FIELDS, PAGE_BYTES, browser_rows, fit_page, owners, packed, read_samples, script_json

PROVENANCE = ("spec", "weights_sha256", "family", "dtype", "device")
OUTPUT_FLAGS = ("out", "samples", "resume", "dist_timeout", "save_key_tokens", "write_data")


def write_html(paths: list[str | Path], samples: list[str | Path], out: str | Path) -> Path:
    """Write the page for `paths` (reports) and `samples` (their samples files) to `out`."""
    if not paths:
        raise fail("no reports given", "pass one or more report.json files")
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise fail(f"--out {out} must end in .html", "pass --out runs.html")
    check_outputs({"--out": out}, [*paths, *samples])
    check_writable(out)
    reports = [load_report(p) for p in paths]
    labels = unique_labels([report_label(r, p) for r, p in zip(reports, paths, strict=True)])
    rows = []
    for path, i in zip(samples, owners(samples, reports, paths), strict=True):
        rows += browser_rows(read_samples(path), reports[i], labels[i], Path(path))
    budget = PAGE_BYTES - len(render_page(reports, labels, rows[:1]).encode()) - 1000  # the page around the samples
    page = render_page(reports, labels, *fit_page(rows, budget))
    write_output(out, lambda f: f.write(page.encode("utf-8")))
    return out


def render_page(reports: list[dict[str, Any]], labels: list[str], samples: list[dict[str, Any]],
                omitted: int = 0) -> str:  # fmt: skip
    """The whole page as text (`omitted`: samples left out to keep it small, which it says)."""
    kinds = list(dict.fromkeys(r["command"] for r in reports))
    sections = []
    for kind in kinds:
        chosen = [i for i, r in enumerate(reports) if r["command"] == kind]
        render = getattr(html_sections, KINDS[kind].html)
        mine, named = [reports[i] for i in chosen], [labels[i] for i in chosen]
        sections.append(f'<section data-kind="{escape(kind)}"><h2>{escape(KINDS[kind].title)} '
                        f"<small>({escape(kind)})</small></h2>{provenance(mine, named)}{render(mine, named)}"
                        "</section>")  # fmt: skip
    if samples:
        sections.append('<section id="samples"><h2>Samples</h2><div id="filters"></div>'
                        '<p id="sample-count"></p><div id="sample-list"></div>'
                        '<button id="sample-more" hidden>show more</button></section>')  # fmt: skip
    data = script_json({"runs": labels, "fields": FIELDS, "samples": [packed(s, labels) for s in samples],
                        "omitted": omitted})  # fmt: skip
    dates = sorted(r.get("environment", {}).get("date") or "" for r in reports)
    shown = f"{len(samples)} sample(s)" + (f" ({omitted} more left out)" if omitted else "")
    subtitle = f"{len(reports)} report(s), {shown}; runs dated {dates[0][:10]} to {dates[-1][:10]}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><title>megaeval runs</title>'
        f"<style>{_asset('page.css')}</style></head><body><header><h1>megaeval runs</h1>"
        f"<p>{escape(subtitle)}</p></header><main>{''.join(sections)}</main>"
        f'<script type="application/json" id="samples-data">{data}</script>'
        f"<script>{_asset('page.js')}</script></body></html>\n"
    )


def _asset(name: str) -> str:
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def provenance(reports: list[dict[str, Any]], labels: list[str]) -> str:
    """Per run: the model, its checksum, versions, date and revision; then the settings that differ between runs."""
    rows = []
    for report, label in zip(reports, labels, strict=True):
        model, env = report.get("model", {}), report.get("environment", {})
        facts = [f"{k} <code>{escape(str(model.get(k))[:64])}</code>" for k in PROVENANCE if model.get(k) is not None]
        facts += [
            f"megaeval {escape(str(env.get('megaeval')))}, torch {escape(str(env.get('torch')))}",
            f"{escape(str(env.get('date')))}",
            f"git <code>{escape(str(env.get('git_revision')))[:20]}</code>",
        ]
        rows.append(f"<dt>{escape(label)}</dt><dd>{' · '.join(facts)}</dd>")
    differing = []
    keys = sorted({k for r in reports for k in r.get("settings", {}) if k not in OUTPUT_FLAGS})
    for key in keys:
        values = [json.dumps(r.get("settings", {}).get(key), sort_keys=True) for r in reports]
        if len(set(values)) > 1:
            shown = "; ".join(
                f"{escape(label)}: <code>{escape(v[:80])}</code>" for label, v in zip(labels, values, strict=True)
            )
            differing.append(f"<dt>{escape(key)}</dt><dd>{shown}</dd>")
    part = f'<dl class="provenance">{"".join(rows)}</dl>'
    if differing:
        part += f'<h3>Settings that differ</h3><dl class="provenance differing">{"".join(differing)}</dl>'
    return part
