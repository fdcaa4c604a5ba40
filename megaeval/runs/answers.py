"""Greedy answers to one unit's prompts with what answering them cost, and those costs folded into a report's
per-length rows (RULER's and BABILong's instances: measured in the report, never in the samples)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..distributed import group_max
from ..scoring.decoding import Decoding, Generation
from ..scoring.generate import generate_branches
from .memory import PeakMemory

MEMORY = "peak_memory_bytes"  # per instance: the peak while its batch was read and answered
STATE = "state_bytes"  # per instance: the largest model state after a prompt of its batch (a KV cache, its shard)
SECONDS = "seconds"  # per instance: its share of its batch's time
MEASURED = (MEMORY, STATE, SECONDS)  # in the report's per-length rows (with tokens_per_second), not in samples


def answer_measured(
    run: Any, prompts: list[np.ndarray], max_new_tokens: int, shared: bool, rows: int, meter: PeakMemory,
    decoding: Decoding | None = None,
) -> tuple[list[Generation], dict[str, Any]]:  # fmt: skip
    """Greedy answers (or as `decoding` says) to `prompts` (read as `generate_branches` reads them, `rows` decoded
    together) and each one's measurements: the batch's peak memory and largest state (the most over a chunk-parallel
    group), its time per prompt."""
    sizes: list[int] = []
    meter.reset()
    start = time.perf_counter()
    answers, _ = generate_branches(run.lm, prompts, run.lm.init_state(1), max_new_tokens, [], shared,
                                   lambda state: sizes.append(state.nbytes()), rows, decoding)  # fmt: skip
    seconds = (time.perf_counter() - start) / len(prompts)
    chunk = run.ctx.chunk
    return answers, {MEMORY: group_max(chunk, meter.peak()), STATE: group_max(chunk, max(sizes)), SECONDS: seconds}


def fold_lengths(rows: list[dict[str, Any]], records: list[dict[str, Any]], method: str) -> None:
    """Each length's row gets its instances' peak memory and largest state, how memory was measured, and the prompt
    tokens read per second."""
    for row in rows:
        mine = [r for r in records if r["length"] == row["length"]]
        row.update({key: max((r[key] for r in mine), default=None) for key in (MEMORY, STATE)},
                   peak_memory_method=method)  # fmt: skip
        seconds = sum(r[SECONDS] for r in mine)
        row["tokens_per_second"] = sum(r["prompt_tokens"] for r in mine) / seconds if seconds > 0 else None


def without_measurements(record: dict[str, Any]) -> dict[str, Any]:
    """A record as its samples line: the measurements left to the report."""
    return {k: v for k, v in record.items() if k not in MEASURED}
