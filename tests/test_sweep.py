"""`ppl-sweep`: lengths, the shared-prefix schedule, exactness, resume, reports and errors."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from megaeval import MegaevalError, load_model
from megaeval.cli import app
from megaeval.commands.ppl_sweep import SweepSettings, run_ppl_sweep
from megaeval.scoring.sweep_plan import bucket_edges, parse_lengths, plan_passes, resolve_tokens
from megaeval.streams import BooksStream
from megaeval_testing import AUSTEN, small_args

runner = CliRunner()


# ------------------------------------------------------------------------------------ lengths


def test_parse_lengths():
    assert parse_lengths("4K,8K,2M") == [4096, 8192, 2097152]
    assert parse_lengths("3000, 1k ,16") == [16, 1024, 3000]
    assert parse_lengths("4K,8K,16K,32K,64K,128K,256K,512K,1M,2M")[-1] == 2 * 1024 * 1024


@pytest.mark.parametrize("bad", ["", "4K,4096", "0", "-8", "4Q", "1.5K", "K", "4K,,x"])
def test_bad_lengths_are_refused(bad):
    with pytest.raises(MegaevalError, match="context length|bad length|duplicate"):
        parse_lengths(bad)


def test_resolve_tokens():
    assert resolve_tokens([4, 8, 16], None, 100) == 96  # largest multiple of 16 <= 99 targets
    assert resolve_tokens([6, 8], None, 100) == 96  # lcm 24
    assert resolve_tokens([4, 8], 32, 100) == 32
    with pytest.raises(MegaevalError, match="fewer than the longest length"):
        resolve_tokens([4, 64], None, 64)
    with pytest.raises(MegaevalError, match="not a multiple of every length"):
        resolve_tokens([4, 8], 36, 100)
    with pytest.raises(MegaevalError, match="needs 97 stream tokens"):
        resolve_tokens([4, 8], 96, 96)


# ----------------------------------------------------------------------------------- schedule


def served_pairs(runs):
    return sorted((length, r.start) for r in runs for length in r.serves)


@pytest.mark.parametrize("lengths", [[4, 8, 16, 32], [3, 6, 9, 18], [4, 6, 12], [5, 7]])
def test_every_segment_is_served_exactly_once(lengths):
    n = math.lcm(*lengths) * 3
    expected = sorted((length, s) for length in lengths for s in range(0, n, length))
    assert served_pairs(plan_passes(lengths, n, "shared")) == expected
    assert served_pairs(plan_passes(lengths, n, "naive")) == expected
    for run in plan_passes(lengths, n, "shared"):  # a run only serves segments that are its prefix
        assert all(run.start % length == 0 and length <= run.length for length in run.serves)


def test_shared_prefix_processes_five_and_a_half_n_for_ten_doubling_lengths():
    lengths = [4 << i for i in range(10)]  # 4 .. 2048, the shape of 4K .. 2M
    n = 2048 * 4
    assert sum(r.length for r in plan_passes(lengths, n, "naive")) == 10 * n
    assert sum(r.length for r in plan_passes(lengths, n, "shared")) == 5.5 * n


def test_bucket_edges():
    assert bucket_edges(8) == [0, 1, 2, 4, 8]
    assert bucket_edges(12) == [0, 1, 2, 4, 8, 12]
    assert bucket_edges(1) == [0, 1]


# ------------------------------------------------------------------------------- exact numbers


def independent_nll(lm, stream_dir, length, n_tokens):
    """Each segment in one forward call, log-softmax gathered by hand: no sweep code involved."""
    tokens = torch.from_numpy(np.fromfile(stream_dir / "tokens.bin", dtype=np.uint16).astype(np.int64))
    total = 0.0
    for start in range(0, n_tokens, length):
        logits, _ = lm.forward(tokens[None, start : start + length], lm.init_state(1))
        targets = tokens[start + 1 : start + length + 1]
        total += float(-torch.log_softmax(logits[0].double(), -1).gather(-1, targets[:, None]).sum())
    return total


def sweep(stream, model, tmp_path, name="r.json", **kwargs):
    settings = SweepSettings(stream=str(stream), model=str(model), out=str(tmp_path / name), **kwargs)
    return run_ppl_sweep(settings, progress=False)


@pytest.fixture
def setup64(make_checkpoint, make_stream):
    return make_checkpoint(small_args(num_layers=1)), make_stream()


def test_sweep_matches_an_independent_per_segment_computation(setup64, tmp_path):
    ckpt, stream = setup64
    report = sweep(stream, ckpt, tmp_path, lengths="8,32,96", dtype="float64", batch_size=3)
    lm = load_model(str(ckpt), dtype="float64")
    n = report["data"]["tokens_scored"]
    assert n == (len(BooksStream(stream)) - 1) // 96 * 96
    for row in report["results"]["lengths"]:
        expected = independent_nll(lm, stream, row["context_length"], n)
        assert row["nll_sum"] == pytest.approx(expected, rel=1e-6)
        assert row["ppl"] == pytest.approx(math.exp(expected / n), rel=1e-6)
        assert row["segments"] == n // row["context_length"] and row["tokens"] == n


@pytest.mark.slow  # long (both schedules over a whole sweep): run with -m slow
def test_shared_and_naive_schedules_agree(setup64, tmp_path):
    ckpt, stream = setup64
    shared = sweep(stream, ckpt, tmp_path, "a.json", lengths="4,8,16,32", dtype="float64", batch_size=2)
    naive = sweep(stream, ckpt, tmp_path, "b.json", lengths="4,8,16,32", dtype="float64", schedule="naive")
    n = shared["data"]["tokens_scored"]
    assert shared["results"]["tokens_processed"] == n + 3 * n // 2 and naive["results"]["tokens_processed"] == 4 * n
    assert shared["results"]["tokens_scored"] == naive["results"]["tokens_scored"] == 4 * n
    for a, b in zip(shared["results"]["lengths"], naive["results"]["lengths"], strict=True):
        assert a["nll_sum"] == pytest.approx(b["nll_sum"], rel=1e-12)
    for a, b in zip(shared["results"]["position_curve"], naive["results"]["position_curve"], strict=True):
        for x, y in zip(a["buckets"], b["buckets"], strict=True):
            assert x["mean_nll"] == pytest.approx(y["mean_nll"], rel=1e-12)


def test_position_curve_and_text_metrics_are_consistent(setup64, tmp_path):
    ckpt, stream = setup64
    report = sweep(stream, ckpt, tmp_path, lengths="16,64")
    n = report["data"]["tokens_scored"]
    span = report["data"]["span"]
    for row, curve in zip(report["results"]["lengths"], report["results"]["position_curve"], strict=True):
        segments = n // row["context_length"]
        total = sum(b["mean_nll"] * (b["end"] - b["start"]) * segments for b in curve["buckets"])
        assert total == pytest.approx(row["nll_sum"], rel=1e-9)
        assert row["bits_per_byte"] == pytest.approx(row["nll_sum"] / math.log(2) / span["bytes"])
        assert row["word_ppl"] == pytest.approx(math.exp(row["nll_sum"] / span["words"]))
    settings = report["settings"]
    assert settings["lengths"] == [16, 64] and settings["batch_size"] == 1 and settings["norm_stats"] == "cumulative"
    assert report["schema_version"] == 1 and report["command"] == "ppl-sweep"
    assert report["model"]["weights_sha256"] and report["data"]["manifest_sha256"]
    assert set(report["environment"]) >= {"megaeval", "torch", "triton", "python", "device", "dtype", "date"}


def test_text_span_counts_whole_books_exactly_and_decodes_cut_ones(make_stream, sp_model):
    texts = ["Anne was  good.\nVery good!", "Captain Wentworth came. He stayed a while.", "The end, at last."]
    stream = BooksStream(make_stream(texts))
    from megaeval.tokenizers import SentencePieceTokenizer

    tok = SentencePieceTokenizer(sp_model)
    whole = stream.text_span(0, len(stream), tok)
    assert whole.bytes == sum(len(t.encode()) for t in texts) and whole.words == sum(len(t.split()) for t in texts)
    assert (whole.exact_books, whole.partial_books) == (3, 0)
    second = stream.manifest["books"][1]
    cut = stream.text_span(0, second["offset"] + 1 + 3, tok)  # book 0, and 3 tokens of book 1
    covered = tok.decode([int(t) for t in stream.tokens[second["offset"] + 1 : second["offset"] + 4]])
    assert cut.bytes == len(texts[0].encode()) + len(covered.encode())
    assert cut.words == len(texts[0].split()) + len(covered.split())


# ------------------------------------------------------------------------------------- MFU


@pytest.fixture
def megalodon_flops(monkeypatch):
    """MegalodonLM.flops_per_token: ModelArgs.flops_per_token (patched in while adapter.py lacks it)."""
    from megaeval.models.megalodon import MegalodonLM

    if "flops_per_token" not in MegalodonLM.__dict__:
        monkeypatch.setattr(MegalodonLM, "flops_per_token", lambda self, n: self.args.flops_per_token(n))


def test_model_flops_per_length_and_no_mfu_on_a_cpu(setup64, tmp_path, megalodon_flops):
    ckpt, stream = setup64
    report = sweep(stream, ckpt, tmp_path, lengths="4,8,32")
    args = load_model(str(ckpt)).args
    assert report["settings"]["peak_tflops"] == "auto"
    res = report["results"]
    assert res["peak_tflops"] is None and res["peak_tflops_source"] is None and res["peak_tflops_detail"] is None
    for row in res["lengths"]:  # chunk 8: a 4-token segment attends over 4 tokens, longer ones over whole chunks
        assert row["model_flops_per_token"] == args.flops_per_token(row["context_length"])
        assert row["achieved_tflops"] is None and row["mfu"] is None
    assert res["lengths"][0]["model_flops_per_token"] < res["lengths"][1]["model_flops_per_token"]
    assert res["lengths"][1]["model_flops_per_token"] == res["lengths"][2]["model_flops_per_token"]


def test_a_given_peak_gives_mfu_even_on_a_cpu(setup64, tmp_path, megalodon_flops):
    ckpt, stream = setup64
    report = sweep(stream, ckpt, tmp_path, lengths="8,16", peak_tflops="0.001")
    res = report["results"]
    assert (res["peak_tflops"], res["peak_tflops_source"]) == (0.001, "flag")
    for row in res["lengths"]:
        achieved = row["model_flops_per_token"] * row["tokens_per_second"] / 1e12
        assert row["achieved_tflops"] == pytest.approx(achieved, rel=1e-3)  # tokens/s is rounded in the report
        assert row["mfu"] == pytest.approx(row["achieved_tflops"] / 0.001, rel=1e-12)
    table = runner.invoke(app, ["report", str(tmp_path / "r.json"), "--metric", "mfu"])
    assert table.exit_code == 0, table.output


def test_a_bad_peak_flag_is_refused_before_any_work(setup64, tmp_path):
    ckpt, stream = setup64
    with pytest.raises(MegaevalError, match="bad --peak-tflops 'fast'"):
        sweep(stream, ckpt, tmp_path, lengths="8", peak_tflops="fast")
    assert not (tmp_path / "r.json.partial.jsonl").exists()


# ----------------------------------------------------------------------------------- resume


def test_resume_after_an_interruption_gives_identical_results(setup64, tmp_path):
    ckpt, stream = setup64
    whole = sweep(stream, ckpt, tmp_path, "whole.json", lengths="8,16,32", batch_size=2)

    def interrupt_after_three(done):
        if done == 3:
            raise KeyboardInterrupt

    settings = SweepSettings(stream=str(stream), model=str(ckpt), lengths="8,16,32", batch_size=2,
                             out=str(tmp_path / "cut.json"))  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        run_ppl_sweep(settings, progress=False, on_unit=interrupt_after_three)
    partial = tmp_path / "cut.json.partial.jsonl"
    assert len(partial.read_text().splitlines()) == 1 + 3 and not (tmp_path / "cut.json").exists()
    with pytest.raises(MegaevalError, match="pass --resume"):
        run_ppl_sweep(settings, progress=False)
    with pytest.raises(MegaevalError, match=r"differs from the interrupted one .*settings.batch_size: 2 then, 3 now"):
        run_ppl_sweep(SweepSettings(**{**settings.__dict__, "batch_size": 3, "resume": True}), progress=False)
    resumed = run_ppl_sweep(SweepSettings(**{**settings.__dict__, "resume": True}), progress=False)
    assert not partial.exists()
    for a, b in zip(whole["results"]["lengths"], resumed["results"]["lengths"], strict=True):
        assert a["nll_sum"] == b["nll_sum"] and a["ppl"] == b["ppl"]
    assert whole["results"]["position_curve"] == resumed["results"]["position_curve"]


# ----------------------------------------------------------------------------------- errors


def test_stream_too_short_suggests_tokens_or_lengths(setup64, tmp_path):
    ckpt, stream = setup64
    with pytest.raises(MegaevalError, match=r"fewer than the longest length.*shorter --lengths"):
        sweep(stream, ckpt, tmp_path, lengths="8,1M")


def test_tokenizer_mismatch_is_refused(make_checkpoint, tmp_path):
    from megaeval_testing import write_stream

    other = write_stream(tmp_path / "s", ["Some text. " * 300], load_model(None).tokenizer.path)  # 4096-piece tokenizer
    with pytest.raises(MegaevalError, match=r"tokenizer mismatch.*prep-books --model"):
        sweep(other, make_checkpoint(), tmp_path, lengths="8")


def test_unwritable_out_fails_before_any_work(setup64, tmp_path):
    ckpt, stream = setup64
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MegaevalError, match="cannot write --out"):
        sweep(stream, ckpt, tmp_path, name="file/report.json", lengths="8")
    with pytest.raises(MegaevalError, match="is a directory, not a file"):
        run_ppl_sweep(SweepSettings(stream=str(stream), model=str(ckpt), out=str(tmp_path)), progress=False)


def test_nan_in_the_model_names_the_segment_and_position(make_checkpoint, make_stream, tmp_path):
    ckpt = make_checkpoint(small_args(num_layers=1))
    stream = make_stream()
    tokens = np.fromfile(stream / "tokens.bin", dtype=np.uint16)
    victim = int(tokens[37])
    first = int(np.flatnonzero(tokens == victim)[0])
    state = torch.load(ckpt / "consolidated.pth", weights_only=True)
    state["embed.weight"][victim] = float("nan")
    torch.save(state, ckpt / "consolidated.pth")
    segment = first // 64 * 64
    # the NaN input at `first` spoils the NLL of the target at `first` (predicted from it)
    message = (
        rf"stream position {first + 1:,}: segment of length 64 starting at {segment:,}, position {first - segment}"
    )
    with pytest.raises(MegaevalError, match=message):
        sweep(stream, ckpt, tmp_path, lengths="64")
    assert not (tmp_path / "r.json").exists()


# -------------------------------------------------------------------------------------- CLI


def test_cli_sweep_and_report(setup64, tmp_path):
    ckpt, stream = setup64
    out_a, out_b = tmp_path / "a.json", tmp_path / "b.json"
    args = ["ppl-sweep", "--stream", str(stream), "--model", str(ckpt), "--lengths", "8,16", "--no-progress"]
    result = runner.invoke(app, [*args, "--out", str(out_a)])
    assert result.exit_code == 0, result.output
    assert "ppl" in result.stdout and "16" in result.stdout
    result = runner.invoke(app, [*args, "--norm-stats", "official-window", "--out", str(out_b)])
    assert result.exit_code == 0, result.output
    a, b = json.loads(out_a.read_text()), json.loads(out_b.read_text())
    csv = runner.invoke(app, ["report", str(out_a), str(out_b), "--format", "csv"])
    assert csv.exit_code == 0, csv.output
    lines = csv.stdout.strip().splitlines()
    assert lines[0] == f"context,{ckpt.name},{ckpt.name} (official-window)"
    assert lines[1].split(",")[1] == f"{a['results']['lengths'][0]['ppl']:.3f}"
    assert lines[2].split(",")[2] == f"{b['results']['lengths'][1]['ppl']:.3f}"
    md = runner.invoke(app, ["report", str(out_a), "--format", "markdown", "--metric", "bits_per_byte"])
    assert md.exit_code == 0 and "| context |" in md.stdout
    bad = runner.invoke(app, ["report", str(tmp_path / "missing.json")])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: report not found")


def test_cli_bad_lengths_exit_with_one_line(setup64):
    ckpt, stream = setup64
    result = runner.invoke(app, ["ppl-sweep", "--stream", str(stream), "--model", str(ckpt), "--lengths", "4K,oops"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "bad length 'oops'" in result.stderr


def test_real_austen_stream_fixture_is_present():
    assert (AUSTEN / "persuasion.txt").stat().st_size > 400_000
    assert os.access(AUSTEN, os.R_OK)


def test_prep_books_then_sweep_from_the_command_line(make_checkpoint, sp_model, tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    for name in ("emma", "persuasion", "northangerabbey"):
        (books / f"{name}.txt").write_text((AUSTEN / f"{name}.txt").read_text(encoding="utf-8")[:2500])
    stream = tmp_path / "stream"
    prep = runner.invoke(app, ["prep-books", str(books), "--tokenizer", str(sp_model), "--out", str(stream),
                               "--seed", "3", "--workers", "1", "--no-progress"])  # fmt: skip
    assert prep.exit_code == 0, prep.output
    assert "from 3 books" in prep.stdout and BooksStream(stream).manifest["seed"] == 3
    again = runner.invoke(app, ["prep-books", str(books), "--tokenizer", str(sp_model), "--out", str(stream)])
    assert again.exit_code == 2 and "--force" in again.stderr
    both = runner.invoke(app, ["prep-books", str(books), "--tokenizer", str(sp_model), "--model", "x", "--out", "y"])
    assert both.exit_code == 2 and "either --tokenizer or --model" in both.stderr
    out = tmp_path / "r.json"
    sweep = runner.invoke(app, ["ppl-sweep", "--stream", str(stream), "--model", str(make_checkpoint()),
                                "--lengths", "16,32", "--out", str(out), "--no-progress"])  # fmt: skip
    assert sweep.exit_code == 0, sweep.output
    assert json.loads(out.read_text())["data"]["books"] == 3


def test_reports_are_written_with_ordinary_permissions(tmp_path):
    import stat

    from megaeval.files import write_json_atomic

    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind
