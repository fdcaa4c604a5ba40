"""Kill -9 and resume, black box: an interrupted run, resumed, reports exactly what an uninterrupted run reports.

For ppl-sweep, scrolls, academic, needle, ruler and babilong (a tiny random MEGALODON, small data):
- the same command run twice from scratch gives the same numbers and the same samples file;
- a run killed with SIGKILL at a seeded random point of its progress (read from its resume journal
  `OUT.partial.jsonl`: a fingerprint line, then one line per finished unit), then rerun with --resume
  until it completes, gives the same results and the same samples file, line for
  line (nothing lost, nothing duplicated), and leaves no resume file behind.

Reports are compared on `results`, `model`, `data` and `settings`, after removing what legitimately
differs between runs: the keys in TIMING_KEYS wherever they occur (wall-clock seconds, speed, MFU, peak
memory, date), the `settings` entries that name outputs or say whether the run resumed (out,
samples, resume), and the whole `environment` section (date, git revision of a working tree that
others may be editing).

The default run has one fast SIGKILL test per command; `-m slow` adds the commands as the issue
states them (all the stream, the bundled QMSum samples) with several kills in a row.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from megaeval.models.megalodon import save_checkpoint
from megaeval_testing import TIMING_KEYS, random_model, small_args, write_stream
from megaeval_testing import hostile as H

SEED = int(os.environ.get("MEGAEVAL_TEST_KILL_SEED", "20240417"))
RUN_SETTINGS = {"out", "samples", "resume"}


@dataclass(frozen=True)
class Job:
    """One command under test."""

    name: str
    argv: str  # formatted with ckpt, stream, sdata, samples_dir, out, samples


FAST = {
    "ppl-sweep": Job(
        "ppl-sweep",
        "ppl-sweep --model {ckpt} --stream {stream} --lengths 16,32 --tokens 512 "
        "--batch-size 1 --no-progress --out {out}",
    ),
    "scrolls": Job(
        "scrolls",
        "scrolls --model {ckpt} --data-dir {sdata} --tasks qmsum --limit 7 --max-new-tokens 4 "
        "--no-progress --out {out} --samples {samples}",
    ),
    "academic": Job(
        "academic",
        "academic --model {ckpt} --data-dir {samples_dir} --tasks arc_easy,boolq --limit 3 "
        "--no-progress --out {out} --samples {samples}",
    ),
    "needle": Job(
        "needle",
        "needle --model {ckpt} --task passkey,niah_single_2 --lengths 512,1K --depths 0,50,100 --samples-per-cell 1 "
        "--max-new-tokens 4 --no-progress --out {out} --samples {samples}",
    ),
    "ruler": Job(
        "ruler",
        "ruler --model {ckpt} --tasks niah_single_1,fwe --lengths 1K,2K --num-samples 2 --batch-size 2 "
        "--no-progress --out {out} --samples {samples}",
    ),
    "babilong": Job(
        "babilong",
        "babilong --model {ckpt} --data {bdata} --tasks qa1,qa4 --lengths 0k,1k --batch-size 2 --no-progress "
        "--out {out} --samples {samples}",
    ),
}
# The interrupt test's sweep: 128 units of ~25 ms, so that a signal sent once the first has finished lands among them
# even when the machine is busy (the fast sweep's 32 units can all finish first, and the run then ends normally).
INTERRUPTED = Job(
    "ppl-sweep",
    "ppl-sweep --model {ckpt} --stream {stream} --lengths 16,32 --tokens 2048 --batch-size 1 --no-progress --out {out}",
)
FULL = {  # as issue #15 states them: the whole stream, the bundled QMSum samples (6: questions on two meetings,
    # two units: a unit is a document and its questions)
    "ppl-sweep": Job(
        "ppl-sweep",
        "ppl-sweep --model {ckpt} --stream {stream} --lengths 16,32 --batch-size 1 --no-progress --out {out}",
    ),
    "scrolls": Job(
        "scrolls",
        "scrolls --model {ckpt} --data-dir {samples_dir}/scrolls --tasks qmsum --limit 6 "
        "--max-new-tokens 4 --no-progress --out {out} --samples {samples}",
    ),
    "academic": FAST["academic"],
    "needle": FAST["needle"],
    "ruler": FAST["ruler"],
    "babilong": FAST["babilong"],
}


@dataclass
class Outcome:
    """What a completed run left: its report, its samples lines (None without --samples), the folder's files."""

    report: dict
    samples: list[str] | None
    files: list[str]
    units: int = -1  # the most progress units seen while it ran (its resume file's count)


class World:
    def __init__(self, root: Path, sp: Path, cli):
        self.root, self.cli = root, cli
        self.ckpt = save_checkpoint(random_model(small_args(), 0, torch.float32), root / "ckpt", sp)
        texts = [(H.AUSTEN / f"{b}.txt").read_text(encoding="utf-8")[:3000] for b in ("emma", "persuasion")]
        self.stream = write_stream(root / "stream", texts, sp)
        self.sdata = root / "scrolls"
        # a unit is a document's questions: 7 examples are two units (5 questions on one meeting, 2 on the next)
        H.write_jsonl(self.sdata / "qmsum" / "validation.jsonl", H.short_qmsum_rows("validation", 7))
        H.write_jsonl(self.sdata / "qmsum" / "train.jsonl", H.short_qmsum_rows("train", 2))
        self.samples_dir = H.SAMPLES
        self._references: dict[tuple[str, str], Outcome] = {}

    def argv(self, job: Job, folder: Path) -> list[str]:
        fields = {
            "ckpt": self.ckpt,
            "stream": self.stream,
            "sdata": self.sdata,
            "samples_dir": self.samples_dir,
            "bdata": H.REPO / "tests" / "fixtures" / "babilong" / "frozen",
            "out": folder / "report.json",
            "samples": folder / "samples.jsonl",
        }
        return [token.format_map(fields) for token in shlex.split(job.argv)]

    def run_to_end(self, job: Job, folder: Path, resume: bool = False) -> Outcome:
        """Run to completion; the outcome records the most progress units seen in its resume file."""
        folder.mkdir(parents=True, exist_ok=True)
        proc = self.cli.start(self.argv(job, folder) + ["--resume"] * resume, folder)
        seen = [-1]
        H.wait_for(lambda: seen.append(progress(folder / "report.json")) and False, proc, timeout=300, interval=0.001)
        result = proc.wait()
        assert result.returncode == 0, result.describe()
        return outcome(folder, max(seen))

    def reference(self, job: Job, kind: str) -> Outcome:
        """The uninterrupted run (once per module)."""
        key = (kind, job.name)
        if key not in self._references:
            self._references[key] = self.run_to_end(job, self.root / f"reference-{kind}-{job.name}")
        return self._references[key]


def outcome(folder: Path, units: int = -1) -> Outcome:
    samples = folder / "samples.jsonl"
    return Outcome(
        json.loads((folder / "report.json").read_text()),
        samples.read_text(encoding="utf-8").splitlines() if samples.exists() else None,
        sorted(p.name for p in folder.iterdir()),
        units,
    )


def strip(obj, removed: set[str]):
    """`obj` without TIMING_KEYS at any depth (their names are added to `removed`)."""
    if isinstance(obj, dict):
        removed.update(TIMING_KEYS & set(obj))
        return {k: strip(v, removed) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [strip(v, removed) for v in obj]
    return obj


def comparable(report: dict, removed: set[str] | None = None) -> dict:
    removed = set() if removed is None else removed
    settings = {k: v for k, v in report.get("settings", {}).items() if k not in RUN_SETTINGS}
    return strip(
        {"results": report["results"], "model": report.get("model"), "data": report.get("data"), "settings": settings},
        removed,
    )


def assert_same_run(got: Outcome, want: Outcome) -> None:
    assert comparable(got.report)["results"] == comparable(want.report)["results"], "results differ"
    assert comparable(got.report) == comparable(want.report), "model, data or settings differ"
    if want.samples is not None:
        assert got.samples is not None, "no samples file"
        ids = [json.loads(line).get("id", json.loads(line).get("doc_id")) for line in got.samples]
        keys = [(json.loads(line).get("task"), i) for line, i in zip(got.samples, ids, strict=True)]
        assert len(keys) == len(set(keys)), f"duplicated samples: {sorted(k for k in keys if keys.count(k) > 1)}"
        assert len(got.samples) == len(want.samples), f"{len(got.samples)} sample lines, expected {len(want.samples)}"
        assert got.samples == want.samples, "samples differ"


def resume_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.partial*"))


def progress(out: Path) -> int:
    """Units (batches, examples, documents) the run writing `out` has finished, read from its resume journal
    `OUT.partial.jsonl` (a fingerprint line, then a line per unit; a line still being written is not counted); -1
    while there is none."""
    try:  # bytes: a line being written may end inside a UTF-8 character
        data = out.with_name(out.name + ".partial.jsonl").read_bytes()
    except FileNotFoundError:
        return -1
    return max(data.count(b"\n") - 1, 0)


def kill_when(world: World, job: Job, folder: Path, at: int, resume: bool) -> int:
    """Start the job (with --resume when asked), SIGKILL it once `at` units are done; return the units done then."""
    out = folder / "report.json"
    proc = world.cli.start(world.argv(job, folder) + ["--resume"] * resume, folder)
    reached = H.wait_for(lambda: progress(out) >= at, proc, timeout=240, interval=0.001)
    proc.kill()
    result = proc.wait()
    done = progress(out)
    assert reached and result.returncode == -9, (
        f"the run was not killed mid-way (wanted {at} units done; {done} done)\n" + result.describe()
    )
    assert not (folder / "report.json").exists(), "a killed run wrote its report"
    return done


@pytest.fixture(scope="module")
def cli():
    runner = H.Megaeval()
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory, sp_model, cli) -> World:
    return World(tmp_path_factory.mktemp("kill-resume"), sp_model, cli)


@pytest.mark.slow  # determinism of whole runs; kill/resume tests compare with fresh runs too
@pytest.mark.parametrize("name", list(FAST))
def test_two_fresh_runs_agree(world: World, name: str, tmp_path: Path):
    job = FAST[name]
    ref = world.reference(job, "fast")
    removed: set[str] = set()
    comparable(ref.report, removed)
    assert_same_run(world.run_to_end(job, tmp_path / "again"), ref)
    assert removed <= TIMING_KEYS


# needle's units resume through the journal ruler's case checks; -m slow kills it too (and each FULL job repeatedly)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n == "needle" else []) for n in FAST])
def test_sigkill_then_resume_gives_the_uninterrupted_result(world: World, name: str, tmp_path: Path):
    job = FAST[name]
    ref = world.reference(job, "fast")
    total = ref.units
    assert total >= 2, f"the reference run showed {total} progress units in its resume file; too few to kill between"
    at = random.Random(f"{SEED}:{name}").randint(1, total - 1)
    kill_when(world, job, tmp_path, at, resume=False)
    assert resume_files(tmp_path), "the killed run left no resume file"
    got = world.run_to_end(job, tmp_path, resume=True)
    assert_same_run(got, ref)
    assert resume_files(tmp_path) == [], "the completed run left its resume file"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FULL))
def test_repeated_sigkills_then_resume_give_the_uninterrupted_result(world: World, name: str, tmp_path: Path):
    """Full-size commands: two fresh runs agree; then kills at increasing seeded points, each rerun with --resume."""
    job = FULL[name]
    ref = world.reference(job, "full")
    assert_same_run(world.run_to_end(job, tmp_path / "again"), ref)
    total = ref.units
    assert total >= 2, f"the reference run showed {total} progress units in its resume file; too few to kill between"
    rng = random.Random(f"{SEED}:{name}:full")
    folder = tmp_path / "killed"
    folder.mkdir()
    points = sorted(rng.sample(range(1, total), min(3, total - 1)))
    done, resume = -1, False
    for at in points:
        if at <= done:
            continue
        done = kill_when(world, job, folder, at, resume=resume)
        resume = True
    for _ in range(3):  # --resume until it completes
        result = world.cli.run(world.argv(job, folder) + ["--resume"], folder)
        if result.returncode == 0:
            break
    assert result.returncode == 0, result.describe()
    assert_same_run(outcome(folder), ref)
    assert resume_files(folder) == []


@pytest.mark.slow
def test_kill_before_any_progress_then_resume(world: World, tmp_path: Path):
    """Killed during start-up (a seeded delay shorter than the load), then resumed: same result."""
    job = FAST["academic"]
    ref = world.reference(job, "fast")
    proc = world.cli.start(world.argv(job, tmp_path), tmp_path)
    H.wait_for(lambda: False, proc, timeout=random.Random(SEED).uniform(0.05, 0.3))
    proc.kill()
    proc.wait()
    got = world.run_to_end(job, tmp_path, resume=True)  # --resume with nothing (or little) to resume
    assert_same_run(got, ref)


@pytest.mark.parametrize("sig", [pytest.param("SIGTERM", marks=pytest.mark.slow), "SIGINT"])  # one handler
def test_an_interrupt_after_some_units_says_what_resume_will_do(world: World, sig: str, tmp_path: Path):
    """SIGTERM or Ctrl-C once units have finished: exit code 130 and one line with how far the run got and what
    --resume does; resumed, the run gives the uninterrupted result."""
    job = INTERRUPTED
    ref = world.reference(job, "interrupted")
    out = tmp_path / "report.json"
    proc = world.cli.start(world.argv(job, tmp_path), tmp_path)
    assert H.wait_for(lambda: progress(out) >= 1, proc, timeout=240, interval=0.001), "no unit ever finished"
    os.kill(proc.pid, getattr(signal, sig))
    result = proc.wait()
    journal = out.with_name(out.name + ".partial.jsonl")
    line = (rf"interrupted after (\d+) of (\d+) units; run the same command with --resume to continue with the (\d+) "
            rf"left \(the finished ones are kept in {re.escape(str(journal))}\)")  # fmt: skip
    said = re.fullmatch(line, result.stderr.strip())
    assert result.returncode == 130 and said, result.describe()
    done, total, left = map(int, said.groups())
    assert done >= 1 and done + left == total and done <= progress(out) <= done + 1  # (a line cut mid-write)
    assert not out.exists()
    assert_same_run(world.run_to_end(job, tmp_path, resume=True), ref)
