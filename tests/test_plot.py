"""`megaeval plot` draws real pictures from ppl-sweep reports."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from megaeval.cli import app

pytest.importorskip("matplotlib")
runner = CliRunner()


def fake_report(path, name: str, ppls: list[float]) -> str:
    lengths = [256 << i for i in range(len(ppls))]
    report = {
        "schema_version": 1, "command": "ppl-sweep", "settings": {"norm_stats": "cumulative"},
        "model": {"spec": f"megalodon:/ckpt/{name}"}, "data": {"tokens_scored": 4096},
        "results": {
            "lengths": [{"context_length": n, "ppl": p, "nll_sum": 4096 * math.log(p)}
                        for n, p in zip(lengths, ppls, strict=True)],
            "position_curve": [{"context_length": n, "buckets": [{"start": 0, "end": 1, "mean_nll": 6.0},
                                                                  {"start": 1, "end": n, "mean_nll": 5.0}]}
                               for n in lengths],
        },
    }  # fmt: skip
    path.write_text(json.dumps(report))
    return str(path)


def test_png_and_svg_are_written(tmp_path):
    a = fake_report(tmp_path / "a.json", "mega", [30.0, 25.0, 21.0, 19.5])
    b = fake_report(tmp_path / "b.json", "llama", [28.0, 26.0, 30.0])
    png, svg = tmp_path / "ppl.png", tmp_path / "ppl.svg"
    result = runner.invoke(app, ["plot", a, b, "--out", str(png), "--position-curve"])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert runner.invoke(app, ["plot", a, "--out", str(svg)]).exit_code == 0
    text = svg.read_text()
    assert "<svg" in text and "mega" in text and "context length" in text


def test_plot_errors(tmp_path):
    a = fake_report(tmp_path / "a.json", "mega", [30.0])
    bad = runner.invoke(app, ["plot", a, "--out", str(tmp_path / "x.gif")])
    assert bad.exit_code == 2 and "must end in .png, .svg or .pdf" in bad.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema_version": 1, "command": "scrolls", "results": {}}))
    bad = runner.invoke(app, ["plot", str(other), "--out", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and "plot draws ppl-sweep, needle or ruler reports" in bad.stderr
