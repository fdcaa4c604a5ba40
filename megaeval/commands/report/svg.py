"""Small SVG pictures drawn from report numbers for the HTML page (`report --format html`): line charts on a log2
x axis and heatmaps. Readable without colour: each series has its own marker shape and dash, and is labelled at its
last point; heatmap cells carry their value as text."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from ...tables import format_length

# Colour-blind-safe palette (Okabe-Ito) with a marker shape and a dash per series.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("circle", "square", "triangle", "diamond", "cross", "circle", "square", "triangle")
DASHES = ("", "6 3", "2 3", "8 3 2 3", "1 2", "4 4", "10 2", "3 6")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 700, 340, 64, 200, 28, 52


def _marker(kind: str, x: float, y: float, colour: str) -> str:
    if kind == "square":
        return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>'
    if kind == "triangle":
        points = f"{x:.1f},{y - 5:.1f} {x - 5:.1f},{y + 4:.1f} {x + 5:.1f},{y + 4:.1f}"
        return f'<polygon points="{points}" fill="{colour}"/>'
    if kind == "diamond":
        return (f'<polygon points="{x:.1f},{y - 5:.1f} {x + 5:.1f},{y:.1f} {x:.1f},{y + 5:.1f} {x - 5:.1f},{y:.1f}" '
                f'fill="{colour}"/>')  # fmt: skip
    if kind == "cross":
        return (f'<path d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},{y + 4:.1f}L{x + 4:.1f},'
                f'{y - 4:.1f}" stroke="{colour}" stroke-width="2"/>')  # fmt: skip
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>'


def line_chart(series: list[tuple[str, list[tuple[int, float | None]]]], title: str, y_label: str,
               x_label: str = "context length (tokens)") -> str:  # fmt: skip
    """An SVG line chart: x on a log2 axis (lengths), one line per (label, points); None values are skipped."""
    points = [(x, y) for _, pts in series for x, y in pts if y is not None and math.isfinite(y)]
    if not points:
        return f'<p class="note">{escape(title)}: nothing to draw</p>'
    xs = sorted({x for x, _ in points})
    lo_y, hi_y = min(y for _, y in points), max(y for _, y in points)
    pad = (hi_y - lo_y) * 0.08 or abs(hi_y) * 0.05 or 1.0
    lo_y, hi_y = lo_y - pad, hi_y + pad
    lx, hx = math.log2(xs[0]), math.log2(xs[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (plot_w / 2 if hx == lx else (math.log2(x) - lx) / (hx - lx) * plot_w)

    def py(y: float) -> float:
        return TOP + (hi_y - y) / (hi_y - lo_y) * plot_h

    out = [f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text x="{WIDTH / 2:.0f}" y="16" text-anchor="middle" class="title">{escape(title)}</text>',
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']  # fmt: skip
    for x in xs:
        out.append(
            f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#eee"/>'
            f'<text x="{px(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{format_length(x)}</text>'
        )
    for k in range(5):
        y = lo_y + (hi_y - lo_y) * k / 4
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.4g}</text>')  # fmt: skip
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle">{escape(x_label)}</text>'
               f'<text transform="translate(14 {TOP + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle">'
               f"{escape(y_label)}</text>")  # fmt: skip
    for i, (label, pts) in enumerate(series):
        colour, marker, dash = COLOURS[i % len(COLOURS)], MARKERS[i % len(MARKERS)], DASHES[i % len(DASHES)]
        shown = [(px(x), py(y), x, y) for x, y in pts if y is not None and math.isfinite(y)]
        if not shown:
            continue
        path = " ".join(f"{'M' if j == 0 else 'L'}{a:.1f},{b:.1f}" for j, (a, b, _, _) in enumerate(shown))
        out.append(f'<g class="series" data-label="{escape(label)}"><path d="{path}" fill="none" stroke="{colour}" '
                   f'stroke-width="2" stroke-dasharray="{dash}"/>')  # fmt: skip
        for a, b, x, y in shown:
            out.append(f'<g class="point" data-x="{x}" data-y="{y!r}">{_marker(marker, a, b, colour)}'
                       f"<title>{escape(label)}: {format_length(x)} → {y:.6g}</title></g>")  # fmt: skip
        a, b, _, _ = shown[-1]
        out.append(f'<text x="{LEFT + plot_w + 8}" y="{b + 4:.1f}" fill="{colour}">{_marker_glyph(marker)} '
                   f"{escape(label[:28])}</text></g>")  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _marker_glyph(kind: str) -> str:
    return {"circle": "●", "square": "■", "triangle": "▲", "diamond": "◆", "cross": "✕"}[kind]


def heatmap(
    rows: list[str], columns: list[str], values: dict[tuple[str, str], float | None], title: str,
    label: Callable[[float], str] = "{:.2f}".format,
) -> str:  # fmt: skip
    """An SVG grid (rows × columns) shaded by value in [0, 1], each cell labelled with its value (`label`)."""
    cell_w, cell_h, left, top = 64, 26, 70, 40
    width, height = left + cell_w * len(columns) + 10, top + cell_h * len(rows) + 10
    out = [f'<svg class="heatmap" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text x="4" y="16" class="title">{escape(title)}</text>']  # fmt: skip
    for j, col in enumerate(columns):
        out.append(
            f'<text x="{left + j * cell_w + cell_w / 2:.0f}" y="{top - 6}" text-anchor="middle">{escape(col)}</text>'
        )
    for i, row in enumerate(rows):
        y = top + i * cell_h
        out.append(f'<text x="{left - 6}" y="{y + 17}" text-anchor="end">{escape(row)}</text>')
        for j, col in enumerate(columns):
            value = values.get((row, col))
            x = left + j * cell_w
            shade = "#ddd" if value is None else _shade(value)
            ink = "#000" if value is None or value > 0.45 else "#fff"
            text = "" if value is None else label(value)
            out.append(f'<g class="cell" data-row="{escape(row)}" data-col="{escape(col)}">'
                       f'<rect x="{x}" y="{y}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{shade}"/>'
                       f'<text x="{x + cell_w / 2 - 1:.0f}" y="{y + 17}" text-anchor="middle" fill="{ink}">{text}'
                       "</text></g>")  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _shade(value: float) -> str:
    """Dark blue (0) to pale yellow (1): lightness carries the value, so grey print reads it too."""
    v = min(max(value, 0.0), 1.0)
    low, high = (8, 29, 88), (255, 255, 204)
    r, g, b = (round(a + (c - a) * v) for a, c in zip(low, high, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def radar_chart(
    axes: list[str], series: list[tuple[str, dict[str, float | None]]], title: str, top: float = 10.0
) -> str:  # fmt: skip
    """An SVG radar chart (MT-Bench's picture): one spoke per axis from 0 at the centre to `top` at the rim, and per
    (label, values) a closed line through its values, with its own colour, dash and marker; a missing value sits at
    the centre and is not marked."""
    if len(axes) < 3 or not series:
        return f'<p class="note">{escape(title)}: a radar chart needs three categories or more</p>'
    size, radius = 520, 170
    cx, cy = size / 2 - 60, size / 2 + 10

    def at(k: int, value: float) -> tuple[float, float]:
        angle = math.pi / 2 - 2 * math.pi * k / len(axes)
        r = radius * min(max(value, 0.0), top) / top
        return cx + r * math.cos(angle), cy - r * math.sin(angle)

    out = [f'<svg class="chart radar" role="img" viewBox="0 0 {size} {size}" width="{size}" height="{size}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text x="{size / 2:.0f}" y="16" text-anchor="middle" class="title">{escape(title)}</text>']  # fmt: skip
    for ring in (0.25, 0.5, 0.75, 1.0):
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(k, ring * top) for k in range(len(axes))))
        out.append(f'<polygon points="{points}" fill="none" stroke="#ddd"/>')
        x, y = at(0, ring * top)
        out.append(f'<text x="{x + 4:.1f}" y="{y + 4:.1f}" class="tick">{ring * top:g}</text>')
    for k, axis in enumerate(axes):
        x, y = at(k, top)
        lx, ly = at(k, top * 1.12)
        anchor = "middle" if abs(lx - cx) < 10 else "start" if lx > cx else "end"
        out.append(f'<line x1="{cx:.1f}" y1="{cy:.1f}" x2="{x:.1f}" y2="{y:.1f}" stroke="#ccc"/>')
        out.append(f'<text x="{lx:.1f}" y="{ly + 4:.1f}" text-anchor="{anchor}">{escape(axis)}</text>')
    for i, (label, values) in enumerate(series):
        colour, dash = COLOURS[i % len(COLOURS)], DASHES[i % len(DASHES)]
        points = [at(k, values.get(a) or 0.0) for k, a in enumerate(axes)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        style = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<g class="series" data-label="{escape(label)}"><polygon points="{path}" fill="{colour}" '
                   f'fill-opacity="0.08" stroke="{colour}" stroke-width="2"{style}/>')  # fmt: skip
        out += [_marker(MARKERS[i % len(MARKERS)], x, y, colour) for (x, y), a in zip(points, axes, strict=True)
                if values.get(a) is not None]  # fmt: skip
        out.append("</g>")
        ly = 40 + 18 * i
        out.append(f'<line x1="{size - 150}" y1="{ly}" x2="{size - 126}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="2"{style}/>{_marker(MARKERS[i % len(MARKERS)], size - 138, ly, colour)}'
                   f'<text x="{size - 120}" y="{ly + 4}">{escape(label)}</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)
