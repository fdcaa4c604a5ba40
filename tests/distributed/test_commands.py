"""The commands on many ranks, through the real command line: torchrun (and hand-launched ranks) on CPU/gloo.

Every rank runs one thread, like the single process it is compared with, so the arithmetic is the same:
data parallel must give the single process's report bit for bit, chunk parallel within 1e-12 (float64).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megaeval_testing import REPO

SAMPLES = REPO / "data_prep" / "samples"
TIMING = {"seconds", "tokens_per_second", "prompt_tokens_per_second", "generated_tokens_per_second",
          "peak_memory_bytes", "achieved_tflops", "mfu", "peak_tflops", "date"}  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def megaeval(*args: str, ranks: int = 1, timeout: float = 120) -> subprocess.CompletedProcess:
    prefix = TORCHRUN if ranks == 2 else [sys.executable]
    return subprocess.run([*prefix, "-m", "megaeval", *args, "--no-progress"], capture_output=True, text=True,
                          env=ENV, timeout=timeout)  # fmt: skip


def numbers(report: Path) -> dict:
    """A report's results without timings (which legitimately differ between runs)."""

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k not in TIMING}
        return [strip(v) for v in o] if isinstance(o, list) else o

    return strip(json.loads(report.read_text())["results"])


@pytest.fixture(scope="module")
def sweep_inputs(tmp_path_factory):
    from megaeval.data_prep.tokenizer import train_sentencepiece
    from megaeval.models.megalodon import save_checkpoint
    from megaeval_testing import AUSTEN, random_model, small_args, write_stream

    folder = tmp_path_factory.mktemp("dist")
    text = folder / "excerpt.txt"
    text.write_text((AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    sp = train_sentencepiece([text], folder / "sp.model", vocab_size=512)
    ckpt = save_checkpoint(random_model(small_args(num_layers=3)), folder / "ckpt", sp)
    books = [(AUSTEN / f"{b}.txt").read_text(encoding="utf-8")[:6000] for b in ("emma", "persuasion")]
    return ckpt, write_stream(folder / "stream", books, sp)


def sweep_args(ckpt: Path, stream: Path, out: Path, *extra: str) -> list[str]:
    """A sweep's command line; an option named in `extra` replaces the default's (an option is given once)."""
    base = {"--lengths": "16,64,128", "--tokens": "1024", "--batch-size": "2", "--dtype": "float64", "--out": str(out)}
    options = [x for k, v in base.items() if k not in extra for x in (k, v)]
    return ["ppl-sweep", "--model", str(ckpt), "--stream", str(stream), *options, *extra]


def test_ppl_sweep_data_parallel_is_bit_identical(sweep_inputs, tmp_path):
    ckpt, stream = sweep_inputs
    one = megaeval(*sweep_args(ckpt, stream, tmp_path / "one.json"))
    assert one.returncode == 0, one.stderr
    two = megaeval(*sweep_args(ckpt, stream, tmp_path / "two.json"), ranks=2)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("report:") == 1  # rank 0 alone reports
    assert numbers(tmp_path / "two.json") == numbers(tmp_path / "one.json")
    env = json.loads((tmp_path / "two.json").read_text())["environment"]
    assert (env["world_size"], env["backend"], env["data_parallel"]) == (2, "gloo", 2)


@pytest.mark.slow  # two ranks sharing a sequence: tests/distributed/test_ranks.py checks the model's side by default
def test_ppl_sweep_chunk_parallel_within_1e12(sweep_inputs, tmp_path):
    ckpt, stream = sweep_inputs
    one = megaeval(*sweep_args(ckpt, stream, tmp_path / "one.json"))
    assert one.returncode == 0, one.stderr
    cp = megaeval(*sweep_args(ckpt, stream, tmp_path / "cp.json", "--chunk-parallel", "2"), ranks=2)
    assert cp.returncode == 0, cp.stderr
    report = json.loads((tmp_path / "cp.json").read_text())
    assert report["settings"]["chunk_parallel"] == 2 and report["environment"]["chunk_parallel"] == 2
    reference = json.loads((tmp_path / "one.json").read_text())["results"]["lengths"]
    for a, b in zip(reference, report["results"]["lengths"], strict=True):
        assert abs(b["nll_sum"] - a["nll_sum"]) <= 1e-12 * abs(a["nll_sum"])


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_scrolls_and_academic_on_two_ranks_equal_one_process(sweep_inputs, tmp_path):
    from megaeval_testing.hostile import short_qmsum_rows, write_jsonl

    model = ["--model", str(sweep_inputs[0]), "--dtype", "float64"]
    for split, n in (("validation", 12), ("train", 2)):  # 12 questions: 5 on one meeting, 7 on the next
        write_jsonl(tmp_path / "sdata" / "qmsum" / f"{split}.jsonl", short_qmsum_rows(split, n, chars=3000))
    # each meeting is one unit: a rank reads each of its documents once, and the ranks' counts are unequal
    scrolls = ["scrolls", *model, "--tasks", "qmsum", "--data-dir", str(tmp_path / "sdata"), "--limit", "12",
               "--max-new-tokens", "4", "--batch-size", "2"]  # fmt: skip
    # MMLU: two questions per subject share a 5-shot block, which ranks split between them
    academic = ["academic", *model, "--data-dir", str(SAMPLES), "--tasks", "arc_easy,mmlu,winogrande,nq_open",
                "--limit", "2"]  # fmt: skip
    for name, args in (("scrolls", scrolls), ("academic", academic)):
        for ranks in (1, 2):
            out = tmp_path / f"{name}{ranks}"
            result = megaeval(*args, "--out", f"{out}.json", "--samples", f"{out}.jsonl", ranks=ranks)
            assert result.returncode == 0, result.stderr
        assert numbers(tmp_path / f"{name}2.json") == numbers(tmp_path / f"{name}1.json"), name
        assert (tmp_path / f"{name}2.jsonl").read_text() == (tmp_path / f"{name}1.jsonl").read_text(), name
    # chunk parallel: each QMSum prompt read by both ranks in slices, the answer decoded from the full state
    out = tmp_path / "scrolls_cp"
    result = megaeval(*scrolls, "--chunk-parallel", "2", "--out", f"{out}.json", "--samples", f"{out}.jsonl", ranks=2)
    assert result.returncode == 0, result.stderr
    assert numbers(out.with_suffix(".json")) == numbers(tmp_path / "scrolls1.json")
    assert out.with_suffix(".jsonl").read_text() == (tmp_path / "scrolls1.jsonl").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(args_of_rank, timeout: float = 60) -> list[tuple[int, str, float]]:
    """Start ranks by hand (the torchrun environment, without torchrun's supervision); (exit code, stderr,
    seconds) per rank."""
    port = free_port()
    began = time.monotonic()
    procs = []
    for rank in (0, 1):
        env = {**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-m", "megaeval", *args_of_rank(rank), "--no-progress"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))  # fmt: skip
    results = []
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        results.append((p.returncode, err, time.monotonic() - began))
    return results


def test_a_failure_on_one_rank_ends_every_rank_promptly_with_one_line(sweep_inputs, tmp_path):
    ckpt, stream = sweep_inputs
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "consolidated.pth").write_bytes(b"")  # only rank 1 loads this one

    def args(rank: int) -> list[str]:
        model = broken if rank == 1 else ckpt
        return [*sweep_args(model, stream, tmp_path / "r.json"), "--dist-timeout", "60"]

    for rank, (code, err, seconds) in enumerate(launch_ranks(args)):
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1, err
        named = "error: rank 1: " if rank == 1 else "error: rank 0: stopped by rank 1: "  # each rank names itself
        assert lines[0].startswith(named) and "consolidated.pth" in lines[0], lines[0]
        assert seconds < 30  # not the 60 s collective timeout
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_a_bad_flag_stops_both_ranks_under_torchrun(sweep_inputs, tmp_path):
    ckpt, stream = sweep_inputs
    began = time.monotonic()
    result = megaeval(*sweep_args(ckpt, stream, tmp_path / "r.json", "--chunk-parallel", "3"), ranks=2)
    assert result.returncode != 0 and time.monotonic() - began < 60
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and all("--chunk-parallel 3 does not divide the 2 ranks" in e for e in errors)
    assert sorted(e.split(":")[1] for e in errors) == [" rank 0", " rank 1"], errors  # whole lines, each named
    misspelt = megaeval(*sweep_args(ckpt, stream, tmp_path / "r.json", "--lenghts", "16"), ranks=2)
    errors = [line for line in misspelt.stderr.splitlines() if line.startswith("error: ")]
    assert sorted(errors) == [f"error: rank {r}: No such option: --lenghts (Possible options: --lengths); see "
                              "`megaeval ppl-sweep --help`" for r in (0, 1)], misspelt.stderr  # fmt: skip


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_resume_after_killing_two_ranks_on_any_world_size(sweep_inputs, tmp_path):
    ckpt, stream = sweep_inputs
    args = sweep_args(ckpt, stream, tmp_path / "r.json", "--lengths", "16,32", "--batch-size", "1")
    assert megaeval(*sweep_args(ckpt, stream, tmp_path / "ref.json", "--lengths", "16,32", "--batch-size", "1"))\
        .returncode == 0  # fmt: skip
    journal = tmp_path / "r.json.partial.jsonl"
    proc = subprocess.Popen([*TORCHRUN, "-m", "megaeval", *args, "--no-progress"], env=ENV, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (journal.exists() and len(journal.read_text().splitlines()) > 8):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    done = len(journal.read_text().splitlines()) - 1
    assert 0 < done < 96 and not (tmp_path / "r.json").exists()  # killed mid-way: 96 batches in all
    resumed = megaeval(*args, "--resume")  # one process picks up what two ranks left
    assert resumed.returncode == 0, resumed.stderr
    assert numbers(tmp_path / "r.json") == numbers(tmp_path / "ref.json") and not journal.exists()


NEEDLE = ["needle", "--task", "passkey,niah_multikey_2", "--lengths", "256,512", "--depths", "0,60,100",
          "--samples-per-cell", "2", "--max-new-tokens", "5", "--dtype", "float64"]  # fmt: skip


@pytest.mark.slow  # two ranks dealing units: ppl-sweep and ruler cover Run.map's dealing and gathering by default
def test_needle_on_two_ranks_equals_one_process(sweep_inputs, tmp_path):
    args = [*NEEDLE, "--model", str(sweep_inputs[0])]
    one = megaeval(*args, "--out", str(tmp_path / "one.json"), "--samples", str(tmp_path / "one.jsonl"))
    assert one.returncode == 0, one.stderr
    two = megaeval(*args, "--out", str(tmp_path / "two.json"), "--samples", str(tmp_path / "two.jsonl"), ranks=2)
    assert two.returncode == 0, two.stderr
    assert numbers(tmp_path / "two.json") == numbers(tmp_path / "one.json")
    assert (tmp_path / "two.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_needle_sharing_each_prompt_over_two_ranks_equals_one_process(sweep_inputs, tmp_path):
    args = [*NEEDLE, "--model", str(sweep_inputs[0])]
    one = megaeval(*args, "--out", str(tmp_path / "one.json"), "--samples", str(tmp_path / "one.jsonl"))
    assert one.returncode == 0, one.stderr
    cp = megaeval(*args, "--chunk-parallel", "2", "--out", str(tmp_path / "cp.json"), "--samples",
                  str(tmp_path / "cp.jsonl"), ranks=2)  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "cp.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()  # the same greedy answers
    assert numbers(tmp_path / "cp.json") == numbers(tmp_path / "one.json")


def test_ruler_on_two_ranks_one_at_a_time_equals_one_process_in_batches(sweep_inputs, tmp_path):
    ckpt, _ = sweep_inputs
    args = ["ruler", "--model", str(ckpt), "--tasks", "niah_single_1,fwe", "--lengths", "1K", "--num-samples",
            "2", "--dtype", "float64"]  # fmt: skip
    one = megaeval(*args, "--batch-size", "2", "--out", str(tmp_path / "one.json"), "--samples",
                   str(tmp_path / "one.jsonl"))  # fmt: skip
    assert one.returncode == 0, one.stderr
    two = megaeval(*args, "--batch-size", "1", "--out", str(tmp_path / "two.json"), "--samples",
                   str(tmp_path / "two.jsonl"), ranks=2)  # fmt: skip
    assert two.returncode == 0, two.stderr
    assert numbers(tmp_path / "two.json") == numbers(tmp_path / "one.json")
    assert (tmp_path / "two.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_ruler_sharing_each_prompt_over_two_ranks_equals_one_process(sweep_inputs, tmp_path):
    ckpt, _ = sweep_inputs
    args = ["ruler", "--model", str(ckpt), "--tasks", "niah_single_1,fwe", "--lengths", "1K", "--num-samples",
            "2", "--dtype", "float64"]  # fmt: skip
    one = megaeval(*args, "--out", str(tmp_path / "one.json"), "--samples", str(tmp_path / "one.jsonl"))
    assert one.returncode == 0, one.stderr
    cp = megaeval(*args, "--chunk-parallel", "2", "--out", str(tmp_path / "cp.json"), "--samples",
                  str(tmp_path / "cp.jsonl"), ranks=2)  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "cp.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()  # the same greedy answers


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_needle_transformer_sharing_each_prompt_over_two_ranks_equals_one_process(tmp_path):
    args = ["needle", "--model", "embedded:transformer-tiny", "--task", "passkey", "--lengths", "256,512",
            "--depths", "0,100", "--max-new-tokens", "4", "--dtype", "float64"]  # fmt: skip
    one = megaeval(*args, "--out", str(tmp_path / "one.json"), "--samples", str(tmp_path / "one.jsonl"))
    assert one.returncode == 0, one.stderr
    cp = megaeval(*args, "--chunk-parallel", "2", "--out", str(tmp_path / "cp.json"), "--samples",
                  str(tmp_path / "cp.jsonl"), ranks=2)  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "cp.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    one_lengths, cp_lengths = numbers(tmp_path / "one.json")["passkey"]["lengths"], numbers(tmp_path / "cp.json")[
        "passkey"]["lengths"]  # fmt: skip
    for a, b in zip(one_lengths, cp_lengths, strict=True):
        assert b["state_bytes"] < a["state_bytes"]  # each rank holds a slice of the KV cache
        assert {k: v for k, v in a.items() if k != "state_bytes"} == {k: v for k, v in b.items() if k != "state_bytes"}


def _longppl_args(tmp_path: Path) -> list[str]:
    from megaeval_testing import AUSTEN

    data = tmp_path / "docs.jsonl"
    texts = [(AUSTEN / f"{b}.txt").read_text(encoding="utf-8")[40_000:42_500] for b in ("emma", "persuasion", "emma")]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:2]) + json.dumps({"text": texts[2][:1500]}))
    args = ["longppl", "--model", "embedded:mamba2-tiny", "--evaluator", "embedded:megalodon-tiny", "--data",
            str(data), "--trunc-len", "128", "--sliding-window", "64", "--alpha", "0.5", "--beta", "-4",
            "--dtype", "float64"]  # fmt: skip
    return args


def _longppl_runs(args: list[str], tmp_path: Path, runs: tuple) -> dict:
    done = {}
    for name, ranks, extra in runs:
        outs = ["--out", str(tmp_path / f"{name}.json"), "--samples", str(tmp_path / f"{name}.jsonl"),
                "--save-key-tokens", str(tmp_path / f"{name}-keys.json")]  # fmt: skip
        done[name] = megaeval(*args, *outs, *extra, ranks=ranks)
        assert done[name].returncode == 0, done[name].stderr
    return done


@pytest.mark.slow  # two ranks dealing units: ppl-sweep and ruler cover Run.map's dealing and gathering by default
def test_longppl_on_two_ranks_equals_one_process(tmp_path):
    args = _longppl_args(tmp_path)
    runs = _longppl_runs(args, tmp_path, (("one", 1, ()), ("two", 2, ())))
    assert runs["two"].stdout.count("report:") == 1
    assert numbers(tmp_path / "two.json") == numbers(tmp_path / "one.json")
    assert (tmp_path / "two.jsonl").read_text() == (tmp_path / "one.jsonl").read_text()
    keys = [json.loads((tmp_path / f"{n}-keys.json").read_text()) for n in ("one", "two")]
    assert keys[0]["documents"] == keys[1]["documents"] and sum(len(d["spans"]) for d in keys[0]["documents"]) > 3


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_longppl_sharing_each_document_over_two_ranks_equals_one_process(tmp_path):
    """--chunk-parallel 2: the model (Mamba-2) and the evaluator (MEGALODON) each read every document over two ranks."""
    _longppl_runs(_longppl_args(tmp_path), tmp_path, (("one", 1, ()), ("cp", 2, ("--chunk-parallel", "2"))))
    keys = [json.loads((tmp_path / f"{n}-keys.json").read_text())["documents"] for n in ("one", "cp")]
    assert keys[0] == keys[1]
    one, cp = (json.loads((tmp_path / f"{n}.json").read_text())["results"] for n in ("one", "cp"))
    for a, b in zip(one["documents"], cp["documents"], strict=True):
        assert a["n_key_tokens"] == b["n_key_tokens"]
        assert b["longppl"] == pytest.approx(a["longppl"], rel=1e-10) and b["ppl"] == pytest.approx(a["ppl"], rel=1e-10)


@pytest.mark.slow  # two ranks dealing units: ppl-sweep and ruler cover Run.map's dealing and gathering by default
def test_babilong_on_two_ranks_equals_one_process(sweep_inputs, tmp_path):
    """Instances dealt to two ranks give one process's report, samples and official prediction files."""
    args = ["babilong", "--model", str(sweep_inputs[0]), "--data", str(REPO / "tests" / "fixtures" / "babilong" /
            "frozen"), "--tasks", "qa1,qa4", "--lengths", "0k,1k", "--dtype", "float64"]  # fmt: skip
    runs = {}
    for name, ranks in (("one", 1), ("two", 2)):
        done = megaeval(*args, "--out", str(tmp_path / f"{name}.json"), "--samples", str(tmp_path / f"{name}.jsonl"),
                        "--write-predictions", str(tmp_path / name), ranks=ranks)  # fmt: skip
        assert done.returncode == 0, done.stderr
        runs[name] = (numbers(tmp_path / f"{name}.json"), (tmp_path / f"{name}.jsonl").read_text(),
                      {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()})  # fmt: skip
    assert runs["one"] == runs["two"] and len(runs["one"][2]) == 8


@pytest.mark.slow  # two ranks dealing units: ppl-sweep and ruler cover Run.map's dealing and gathering by default
def test_longbench_v2_sampled_on_two_ranks_equals_one_process(sweep_inputs, tmp_path):
    """LongBench v2 items dealt to two ranks, each drawn from its own seed: one process's report and samples."""
    args = ["longbench", "--version", "2", "--model", str(sweep_inputs[0]), "--data",
            str(REPO / "tests" / "fixtures" / "longbench" / "v2" / "data.json"), "--num-samples", "3",
            "--temperature", "1", "--dtype", "float64"]  # fmt: skip
    runs = {}
    for name, ranks in (("one", 1), ("two", 2)):
        done = megaeval(*args, "--out", str(tmp_path / f"{name}.json"), "--samples", str(tmp_path / f"{name}.jsonl"),
                        ranks=ranks)  # fmt: skip
        assert done.returncode == 0, done.stderr
        runs[name] = (numbers(tmp_path / f"{name}.json"), (tmp_path / f"{name}.jsonl").read_text())
    assert runs["one"] == runs["two"] and runs["one"][1].count("\n") == 3
