"""--chunk-parallel for Mamba and Mamba-2: two gloo ranks (one thread each) share every call; their NLL and the state
they end with equal one process to 1e-10 in float64, from a fresh state and after an unaligned prefix. RWKV-4 and
RecurrentGemma are refused in one line before any exchange."""

from __future__ import annotations

from pathlib import Path

import pytest

from megaeval import MegaevalError, load_model
from megaeval.distributed import ChunkGroup
from megaeval.models import chunk_parallel_lm
from megaeval_testing.distributed import run_ranks, values
from megaeval_testing.recurrent import chunk_parallel_scores, save_tiny

CASES = [(2, 300, 0), (1, 200, 37), (2, 40, 5)]  # (batch, tokens, prefix): whole chunks, unaligned, one slice empty


# One ChunkParallelLM for every architecture: the default run checks it on Mamba-2, -m slow on Mamba-1 too.
@pytest.mark.parametrize("kind", [pytest.param("mamba", marks=pytest.mark.slow), "mamba2"])
def test_two_ranks_equal_one_process(kind: str, tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / kind, kind)
    results = values(run_ranks(chunk_parallel_scores, 2, tmp_path / "ranks", timeout=120, checkpoint=str(folder),
                               cases=CASES))  # fmt: skip
    for per_rank in results:
        for case, r in zip(CASES, per_rank, strict=True):
            assert r["rel"] < 1e-10 and r["next"] < 1e-10, (case, r)


@pytest.mark.parametrize("kind", ["rwkv", "recurrent_gemma"])
def test_other_recurrent_architectures_are_refused(kind: str, tmp_path: Path) -> None:
    lm = load_model(save_tiny(tmp_path / kind, kind))
    with pytest.raises(MegaevalError, match="^--chunk-parallel runs Mamba, FalconMamba and Mamba-2 among recurrent"):
        chunk_parallel_lm(lm, ChunkGroup(2, 0, (0, 1)))
