"""Retrieval pictures. Needle: the familiar heatmap (depth on y, length on a log2 x axis, accuracy as colour), one
panel per report and task; with several reports, accuracy against length too, one line per report. RULER: the
13-task average against length, one line (and marker shape) per report, with the effective-length threshold."""

from __future__ import annotations

from typing import Any

from ...tables import format_length


def needle_figure(plt: Any, reports: list[dict], labels: list[str]) -> Any:
    """The figure: a heatmap per (report, task), then an accuracy-vs-length panel when there are several reports."""
    panels = [(report, label, task) for report, label in zip(reports, labels, strict=True)
              for task in report["results"] if task not in ("average", "average_of")]  # fmt: skip
    lines = len(reports) > 1
    count = len(panels) + lines
    columns = min(count, 3)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.6 * columns, 4.4 * rows), squeeze=False, layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax, (report, label, task) in zip(flat, panels, strict=False):
        fig.colorbar(_heatmap(ax, report["results"][task], f"{label}: {task}"), ax=ax, label="accuracy")
    if lines:
        _length_lines(flat[len(panels)], panels)
    for ax in flat[count:]:
        ax.set_visible(False)
    fig.suptitle("Needle in a haystack: accuracy by context length and needle depth", fontsize=12)
    return fig


def _heatmap(ax: Any, result: dict[str, Any], title: str) -> Any:
    import numpy as np

    lengths = [row["length"] for row in result["lengths"]]
    depths = sorted({c["depth"] for c in result["cells"]})
    grid = np.full((len(depths), len(lengths)), np.nan)
    for cell in result["cells"]:
        grid[depths.index(cell["depth"]), lengths.index(cell["length"])] = cell["accuracy"]
    # each cell spans half-way to its neighbours, lengths on a log2 axis and depths on a linear one
    x, y = np.log2(lengths), np.asarray(depths, dtype=float)
    image = ax.pcolormesh(_edges(x, 1.0), _edges(y, 10.0), grid, cmap="RdYlGn", vmin=0.0, vmax=1.0)
    ax.invert_yaxis()  # depth 0 (the start of the haystack) on top, as the heatmaps in papers draw it
    ax.set_xticks(x)
    ax.set_xticklabels([format_length(n) for n in lengths], rotation=45 if len(lengths) > 6 else 0)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{d}%" for d in depths])
    ax.set_xlabel("context length (tokens, log2 axis)")
    ax.set_ylabel("needle depth (% of the haystack)")
    ax.set_title(f"{title} (mean {result['accuracy']:.2f})", fontsize=10)
    return image


def _edges(centres: Any, alone: float) -> Any:
    """Cell edges half-way between centres (a lone centre spans `alone`)."""
    import numpy as np

    if len(centres) == 1:
        return np.asarray([centres[0] - alone / 2, centres[0] + alone / 2])
    middle = (centres[1:] + centres[:-1]) / 2
    return np.concatenate([[2 * centres[0] - middle[0]], middle, [2 * centres[-1] - middle[-1]]])


def _length_lines(ax: Any, panels: list[tuple[dict, str, str]]) -> None:
    ticks: set[int] = set()
    for report, label, task in panels:
        rows = report["results"][task]["lengths"]
        ticks.update(r["length"] for r in rows)
        ax.plot([r["length"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=f"{label}: {task}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([format_length(t) for t in sorted(ticks)])
    ax.minorticks_off()
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accuracy (mean over depths)")
    ax.set_title("Accuracy vs context length", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


MARKERS = "osD^vP*Xh<>p"  # a shape per report: lines stay apart without colour


def ruler_figure(plt: Any, reports: list[dict], labels: list[str]) -> Any:
    """RULER's average by length (log2 axis), one line per report, and the threshold as a dashed line."""
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    ticks: set[int] = set()
    for k, (report, label) in enumerate(zip(reports, labels, strict=True)):
        results = report["results"]
        rows = results["lengths"]
        ticks.update(r["length"] for r in rows)
        effective = results["effective_length"]
        shown = f"{label} (effective {format_length(effective) if effective else 'none'})"
        ax.plot([r["length"] for r in rows], [r["average"] for r in rows], marker=MARKERS[k % len(MARKERS)],
                label=shown)  # fmt: skip
    thresholds = sorted({r["results"]["threshold"] for r in reports})
    for threshold in thresholds:
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"threshold {threshold:g}", (0.01, threshold), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8, color="grey")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([format_length(t) for t in sorted(ticks)], rotation=45 if len(ticks) > 6 else 0)
    ax.minorticks_off()
    ax.set_ylim(-2, 102)
    ax.set_xlabel("sequence length (tokens, generation included)")
    ax.set_ylabel("average score over tasks")
    tasks = sorted({len(r["results"]["tasks"]) for r in reports})
    ax.set_title(f"RULER: average of {'/'.join(map(str, tasks))} tasks by length", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def babilong_figure(plt: Any, reports: list[dict], labels: list[str]) -> Any:
    """BABILong's published heatmap, one panel per report: tasks (and the qa1-qa5 average) by length, accuracy in
    each cell, red through yellow to green from 0 to 100 (collect_results' colours)."""
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("ryg", ["red", "yellow", "green"], N=256)
    fig, axes = plt.subplots(1, len(reports), figsize=(5 * len(reports), 3.5), squeeze=False, layout="constrained")
    for ax, report, label in zip(axes[0], reports, labels, strict=True):
        res = report["results"]
        lengths = [row["length"] for row in res["lengths"]]
        names = [*res["tasks"], "average"]
        grid = [[res["tasks"][t][n]["accuracy"] for n in lengths] for t in res["tasks"]]
        grid.append([float("nan") if row["average"] is None else row["average"] for row in res["lengths"]])
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=100, aspect="auto")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if value == value:  # not NaN
                    ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(lengths)), lengths)
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel("Context size")
        ax.set_ylabel("Tasks")
        ax.set_title(label, fontsize=11)
    return fig
