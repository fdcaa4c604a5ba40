"""One rule for every command's flags, through the real command line (`megaeval.cli.main`, in process): a shared
flag a mode would ignore is refused in one line, an option that takes one value is never given twice, and help off a
terminal is laid out at a readable width."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from megaeval.cli import app, main
from megaeval.cli import root as cli_root


def run_main(monkeypatch, capsys, argv: list[str]) -> tuple[int, list[str]]:
    """`megaeval ARGV` as the console script runs it: (exit code, stderr's non-blank lines)."""
    monkeypatch.setattr(sys, "argv", ["megaeval", *map(str, argv)])
    monkeypatch.setattr(cli_root, "interrupt_on_sigterm", lambda: None)  # pytest keeps its own SIGTERM handling
    with pytest.raises(SystemExit) as exited:
        main()
    return exited.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def assert_one_line(code: int, lines: list[str], message: str) -> None:
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert message in lines[0], lines[0]


PREPARE = ["babilong", "--prepare-only", "--write-data", "{tmp}/w", "--babi", "{tmp}"]
BABILONG_PREDICTIONS = ["babilong", "--predictions", "{tmp}", "--lengths", "0k"]
LONGBENCH_PREDICTIONS = ["longbench", "--version", "2", "--predictions", "{tmp}/p.jsonl"]
SCROLLS_PREDICTIONS = ["scrolls", "--predictions", "{tmp}/p.jsonl", "--data-dir", "{tmp}"]


@pytest.mark.parametrize(("mode", "flag", "message"), [
    (PREPARE, ["--device", "cuda"], "--device does not apply with --prepare-only (it would be ignored)"),
    (PREPARE, ["--dtype", "bfloat16"], "--dtype does not apply with --prepare-only"),
    (PREPARE, ["--bos", "never"], "--bos does not apply with --prepare-only"),
    (PREPARE, ["--model-args", "max_context=64"], "--model-args does not apply with --prepare-only"),
    (PREPARE, ["--resume"], "--resume does not apply with --prepare-only"),
    (PREPARE, ["--chunk-parallel", "2"], "--chunk-parallel does not apply with --prepare-only"),
    (PREPARE, ["--out", "{tmp}/r.json"],
     "--out does not apply with --prepare-only (it would be ignored); use --out with --data or --predictions"),
    (BABILONG_PREDICTIONS, ["--device", "cuda"], "--device does not apply with --predictions"),
    (BABILONG_PREDICTIONS, ["--resume"], "--resume does not apply with --predictions"),
    (BABILONG_PREDICTIONS, ["--chunk-parallel", "2"], "--chunk-parallel does not apply with --predictions"),
    (BABILONG_PREDICTIONS, ["--kernels", "torch"], "--kernels does not apply with --predictions"),
    (LONGBENCH_PREDICTIONS, ["--protocol", "loglik"], "--protocol does not apply with --predictions"),
    (LONGBENCH_PREDICTIONS, ["--no-context"], "--no-context does not apply with --predictions"),
    (LONGBENCH_PREDICTIONS, ["--dtype", "float16"], "--dtype does not apply with --predictions"),
    (LONGBENCH_PREDICTIONS, ["--bos", "always"], "--bos does not apply with --predictions"),
    (LONGBENCH_PREDICTIONS, ["--dist-timeout", "60"], "--dist-timeout does not apply with --predictions"),
    (SCROLLS_PREDICTIONS, ["--device", "cuda"], "without a model, so --device would be ignored"),
    (SCROLLS_PREDICTIONS, ["--resume"], "without a model, so --resume would be ignored"),
    (SCROLLS_PREDICTIONS, ["--shots", "1"], "without a model, so --shots would be ignored"),
])  # fmt: skip
def test_a_shared_flag_a_model_less_mode_would_ignore_is_refused(monkeypatch, capsys, tmp_path, mode, flag, message):
    argv = [a.format(tmp=tmp_path) for a in [*mode, *flag]]
    code, lines = run_main(monkeypatch, capsys, argv)
    assert_one_line(code, lines, message)
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["babilong", "--tasks", "qa1", "--tasks", "qa2"], "--tasks is given 2 times but takes one value, and only the "
     "last would count; pass it once (several as one comma-separated value: --tasks A,B)"),
    (["longbench", "--version", "1", "--version", "2"], "--version is given 2 times"),
    (["scrolls", "--progress", "--no-progress"], "--progress is given 2 times"),
    (["ppl-sweep", "--stream", "s", "--out", "a.json", "--out", "b.json"], "--out is given 2 times"),
    (["babilong", "--task", "qa1", "--tasks", "qa2", "--tasks", "qa3"], "--tasks is given 3 times"),
])  # fmt: skip
def test_an_option_of_one_value_given_twice_is_refused(monkeypatch, capsys, argv, message):
    code, lines = run_main(monkeypatch, capsys, argv)
    assert_one_line(code, lines, message)


def test_a_repeatable_option_stays_repeatable(monkeypatch, capsys, tmp_path):
    """--background (a list) given twice is read as two values: the refusal is the mode's, not a repeat's."""
    argv = ["babilong", "--data", tmp_path, "--background", "a", "--background", "b"]
    code, lines = run_main(monkeypatch, capsys, argv)
    assert_one_line(code, lines, "--background does not apply with --data")


@pytest.mark.parametrize("argv", [["--help"], ["longbench", "--help"], ["babilong", "--help"]])
def test_help_off_a_terminal_is_plain_text_at_a_readable_width(argv):
    result = CliRunner().invoke(app, argv)  # its output is not a terminal
    lines = result.output.splitlines()
    assert result.exit_code == 0 and max(map(len, lines)) <= cli_root.HELP_WIDTH
    assert not any("╭" in line or "│" in line for line in lines)  # no panels squeezing the text
    if argv != ["--help"]:  # each option's help starts on its own line, not in a narrow column
        assert any(line.split() == ["--dtype", "<str>", "float32,", "float64,", "bfloat16", "or", "float16.",
                                    "[default:", "float32]"] for line in lines)  # fmt: skip


@pytest.mark.parametrize(("tty", "columns", "width"), [(False, 80, 100), (True, 80, 80), (True, 160, None)])
def test_help_width_by_where_help_goes(monkeypatch, tty, columns, width):
    """Off a terminal: 100 columns; a narrow terminal: plain text at its width; a wide one: rich's panels (None)."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty, raising=False)
    monkeypatch.setattr(cli_root.shutil, "get_terminal_size", lambda: type("Size", (), {"columns": columns}))
    assert cli_root.help_width() == width


@pytest.mark.parametrize("temperature", ["1e-42", "1e-300"])
def test_a_temperature_sampling_cannot_survive_is_refused_before_any_work(monkeypatch, capsys, tmp_path, temperature):
    argv = ["longbench", "--version", "2", "--data", tmp_path / "data.json", "--temperature", temperature, "--out",
            tmp_path / "r.json"]  # fmt: skip
    code, lines = run_main(monkeypatch, capsys, argv)
    assert_one_line(code, lines, f"--temperature {temperature} is below 1.175e-38, the smallest temperature float32 "
                    "sampling can divide by; pass 0 for greedy decoding, or at least 1.175e-38")  # fmt: skip
    assert not (tmp_path / "r.json").exists()
