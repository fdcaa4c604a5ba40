"""`megaeval info` and the CLI's handling of bad input: one line, non-zero exit, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.models import DEFAULT_MODEL, parse_model_args
from megaeval_testing import VOCAB, small_args

runner = CliRunner()


def test_info_json_describes_the_checkpoint(make_checkpoint):
    args = small_args(num_layers=3)
    path = make_checkpoint(args)
    result = runner.invoke(app, ["info", str(path), "--json", "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["family"] == "megalodon" and facts["dtype"] == "bfloat16"
    assert facts["config"]["num_layers"] == 3 and facts["chunk_size"] == args.chunk_size
    assert facts["tokenizer"]["vocab_size"] == VOCAB
    # parameters counted from the architecture, independently of the model object
    D, Z, E, F, N, G, V = 16, 8, 24, 32, 4, 4, VOCAB
    timenorm, cema = 2 * D, 4 * D * N + 2 * D  # alpha, delta, gamma (complex) are D x N; theta, omega are D
    mega = timenorm + cema + D + (D * E + E) + (D * Z + Z) + (D * E + E) + (D * D + D) + E * D + 4 * Z
    nffn = 2 * D + 3 * D * F
    assert facts["parameters"] == V * D + 3 * (mega + nffn) + 2 * D + D * V
    # largest state: per layer 2 G float64 stats, D x N complex (bf16 -> complex64), 7 tokens of K and V in bf16
    per_layer_state = 2 * G * 8 + D * N * 8 + (args.chunk_size - 1) * (Z + E) * 2
    assert facts["state_bytes_per_sequence"] == 3 * per_layer_state + 2 * G * 8


def table_rows(stdout: str) -> dict[str, str]:
    """The (label, value) rows of a boxed two-column rich table, one line each (never wrapped)."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_info_table_for_the_default_model():
    result = runner.invoke(app, ["info"])
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert "megalodon model" in result.stdout and rows["path"] == str(DEFAULT_MODEL)
    assert rows["max context"] == "unlimited (state carried)" and rows["chunk size"] == "128"
    assert rows["layers × model_dim"] == "4 × 128" and rows["vocabulary"] == "4,096 (bos 1, eos 2)"


def test_info_table_never_wraps_a_long_path(make_checkpoint):
    path = make_checkpoint(name="a-checkpoint-folder-with-a-very-long-name-" + "x" * 150)
    result = runner.invoke(app, ["info", str(path)], terminal_width=60)
    assert result.exit_code == 0, result.output
    assert table_rows(result.stdout)["path"] == str(path)


def test_model_args_parsing():
    assert parse_model_args("norm_stats=official-window, tokenizer=/x/t.model,max_context=4096,trust=true") == {
        "norm_stats": "official-window",
        "tokenizer": "/x/t.model",
        "max_context": 4096,
        "trust": True,
    }
    assert parse_model_args("") == {}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["info", "/no/such/dir"], "error: model not found: /no/such/dir"),
        (["info", "llama:/x"], "error: unknown model family 'llama'"),
        (["info", "--model-args", "norm_stats"], "error: bad --model-args item 'norm_stats'"),
        (["info", "--model-args", "norm_stats=sometimes"], "error: unknown norm_stats 'sometimes'"),
        (["info", "--dtype", "fp8"], "error: unknown dtype 'fp8'"),
    ],
)
def test_cli_errors_are_one_line(argv, message):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert result.stdout == ""


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "megaeval", *argv], capture_output=True, text=True, env=env, timeout=120
    )


def test_real_process_reports_a_vocabulary_mismatch_without_traceback(make_checkpoint):
    path = make_checkpoint()
    cfg = json.loads((path / "config.json").read_text())
    cfg["model"]["vocab_size"] = 1000
    (path / "config.json").write_text(json.dumps(cfg))
    proc = run_cli("info", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().startswith("error: tokenizer vocabulary") and proc.stderr.count("\n") == 1


def test_real_process_refuses_a_malicious_pickle(make_checkpoint, tmp_path):
    path = make_checkpoint()
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    torch.save({"embed.weight": Payload()}, path / "consolidated.pth")
    proc = run_cli("info", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "refusing to load" in proc.stderr and not marker.exists()


@pytest.mark.parametrize(
    "rank, message, line",
    [
        (None, "rank 1: bad token id", "error: rank 1: bad token id"),  # one process: the message as it is
        ("1", "bad token id", "error: rank 1: bad token id"),
        ("1", "rank 1: bad token id", "error: rank 1: bad token id"),
        ("0", "rank 1: bad token id", "error: rank 0: stopped by rank 1: bad token id"),
        ("2", "rank 0: lost contact with rank 3", "error: rank 2: stopped by rank 0: lost contact with rank 3"),
    ],
)
def test_each_rank_names_itself_in_its_error_line(monkeypatch, capsys, rank, message, line):
    from megaeval.console import error_line, interrupted_line

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "4")
    error_line(message)
    interrupted_line()
    interrupted = "interrupted" if rank is None else f"rank {rank}: interrupted"
    assert capsys.readouterr().err.splitlines() == [line, interrupted]
