"""An output path that is an input (or another output) is refused before any work; nothing is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from megaeval import MegaevalError
from megaeval.cli import app
from megaeval.files import check_outputs

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data_prep" / "samples"
runner = CliRunner()


def test_check_outputs_refuses_inputs_links_and_repeated_outputs(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(data / "a.jsonl")
    (tmp_path / "hard.jsonl").hardlink_to(data / "a.jsonl")
    for alias in (data / "a.jsonl", tmp_path / "link.jsonl", tmp_path / "hard.jsonl", data / ".." / "data" / "a.jsonl"):
        with pytest.raises(MegaevalError, match="is an input of this run"):
            check_outputs({"--out": alias}, [data])
    with pytest.raises(MegaevalError, match="--out and --samples are the same file"):
        check_outputs({"--out": tmp_path / "r.json", "--samples": tmp_path / "r.json"}, [])
    check_outputs({"--out": tmp_path / "r.json", "--samples": None}, [data])  # distinct: fine


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


@pytest.mark.parametrize("target", ["manifest.json", "tokens.bin"])
def test_ppl_sweep_out_onto_the_stream(make_stream, make_checkpoint, target):
    stream, model = make_stream(), make_checkpoint()
    before = snapshot(stream)
    refused(["ppl-sweep", "--stream", str(stream), "--model", str(model), "--lengths", "16", "--tokens", "32",
             "--out", str(stream / target)], "is an input of this run")  # fmt: skip
    assert snapshot(stream) == before


def test_ppl_sweep_out_onto_the_model(make_stream, make_checkpoint):
    stream, model = make_stream(), make_checkpoint()
    before = snapshot(model)
    refused(["ppl-sweep", "--stream", str(stream), "--model", str(model), "--lengths", "16", "--tokens", "32",
             "--out", str(model / "consolidated.pth")], "is an input of this run")  # fmt: skip
    assert snapshot(model) == before


@pytest.fixture
def scrolls_data(tmp_path) -> Path:
    data = tmp_path / "scrolls"
    shutil.copytree(SAMPLES / "scrolls" / "qmsum", data / "qmsum")
    return data


def test_scrolls_predictions_equal_to_out(scrolls_data, tmp_path):
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text('{"task": "qmsum", "id": "x", "prediction": "y"}\n')
    before = predictions.read_bytes()
    refused(["scrolls", "--tasks", "qmsum", "--data-dir", str(scrolls_data), "--predictions", str(predictions),
             "--out", str(predictions)], "is an input of this run")  # fmt: skip
    assert predictions.read_bytes() == before


def test_scrolls_samples_onto_the_data(scrolls_data, tmp_path):
    before = snapshot(scrolls_data)
    refused(["scrolls", "--tasks", "qmsum", "--data-dir", str(scrolls_data), "--limit", "1",
             "--samples", str(scrolls_data / "qmsum" / "validation.jsonl"), "--out", str(tmp_path / "r.json")],
            "is an input of this run")  # fmt: skip
    assert snapshot(scrolls_data) == before


def test_academic_out_onto_the_data_and_samples_onto_out(tmp_path):
    data = tmp_path / "academic"
    shutil.copytree(SAMPLES / "boolq", data / "boolq")
    before = snapshot(data)
    refused(["academic", "--tasks", "boolq", "--data-dir", str(data), "--limit", "1",
             "--out", str(data / "boolq" / "validation.jsonl")], "is an input of this run")  # fmt: skip
    old = tmp_path / "r.json"
    old.write_text("old report\n")
    refused(["academic", "--tasks", "boolq", "--data-dir", str(data), "--limit", "1",
             "--out", str(old), "--samples", str(old)], "are the same file")  # fmt: skip
    assert snapshot(data) == before and old.read_text() == "old report\n"
