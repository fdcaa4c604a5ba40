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
    assert bad.exit_code == 2 and "plot draws ppl-sweep, needle, ruler or babilong reports" in bad.stderr


def test_longppl_is_drawn_from_the_reports_key_token_numbers(tmp_path, monkeypatch):
    from megaeval.commands.report import plot

    a = fake_report(tmp_path / "a.json", "mega", [30.0, 25.0, 21.0])
    report = json.loads((tmp_path / "a.json").read_text())
    for row, value in zip(report["results"]["lengths"], [9.0, 6.5, 4.25], strict=True):
        row.update(longppl=value, n_key_tokens=12, key_nll_sum=12 * math.log(value))
    (tmp_path / "a.json").write_text(json.dumps(report))
    drawn = []
    monkeypatch.setattr(plot, "_save", lambda plt, fig, out: drawn.append(fig) or out)
    plot.plot_reports([a], tmp_path / "l.png", metric="longppl")
    line = drawn[0].axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [256, 512, 1024] and list(line.get_ydata()) == [9.0, 6.5, 4.25]
    assert "LongPPL" in drawn[0].axes[0].get_ylabel()
    plain = fake_report(tmp_path / "b.json", "llama", [28.0])
    bad = runner.invoke(app, ["plot", plain, "--metric", "longppl", "--out", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and "has no LongPPL; run ppl-sweep with --key-tokens F or --evaluator E" in bad.stderr
    table = runner.invoke(app, ["report", a, "--metric", "longppl", "--format", "csv"])
    assert table.exit_code == 0 and table.stdout.splitlines()[1:] == ["256,9.0000", "512,6.5000", "1K,4.2500"]
