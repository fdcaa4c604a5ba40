"""Answers to one unit's prompts (through the run's answerer: the model in this process, or a server) with what
answering them cost, and those costs folded into a report's per-length rows (RULER's, BABILong's and LongBench's
instances: measured in the report, never in the samples)."""

from __future__ import annotations

import time
from typing import Any

from ..distributed import group_max
from ..scoring.answering import Query, Rule
from ..scoring.decoding import Generation
from .memory import PeakMemory

MEMORY = "peak_memory_bytes"  # per instance: the peak while its batch was read and answered
STATE = "state_bytes"  # per instance: the largest model state after a prompt of its batch (a KV cache, its shard)
SECONDS = "seconds"  # per instance: its share of its batch's time
PREFILL = "prefill_seconds"  # per instance: its share of the time its batch spent reading prompts (None: a server's)
DECODE = "decode_seconds"  # per instance: its share of the time its batch spent decoding answers (None: a server's)
GENERATED = "answer_tokens_share"  # per instance: its share of the tokens its batch generated (journal only)
MEASURED = (MEMORY, STATE, SECONDS, PREFILL, DECODE, GENERATED)  # in the report's rows (`rates`), not in samples


def answer_measured(
    run: Any, queries: list[Query], rule: Rule, shared: bool, rows: int, meter: PeakMemory, tree: bool = False
) -> tuple[list[Generation], dict[str, Any]]:  # fmt: skip
    """Answers to `queries` under `rule` (a model in this process reads them as `generate_branches` does, or with
    `shared` and `tree` as `branch_tree` does: every start they share read once, in the order of their tokens; `rows`
    decoded together) and each one's measurements: the batch's peak memory and largest state (the most over a
    chunk-parallel group; None for a served model, whose memory is the server's), its time per prompt."""
    sizes: list[int] = []
    meter.reset()
    start = time.perf_counter()
    note = lambda state: sizes.append(state.nbytes())  # noqa: E731
    if shared and tree:
        grouped = run.answerer.answer_groups(Query([], ""), [queries], rule, shared=True, rows=rows, after_prompt=note)
        answers = grouped.answers[0]
    else:
        answers, _ = run.answerer.answer(queries, rule, shared=shared, rows=rows, after_prompt=note)
    seconds = (time.perf_counter() - start) / len(queries)
    timing = run.answerer.timing  # (reading, decoding) seconds of the call; None: a server's
    split = {PREFILL: None, DECODE: None} if timing is None else {PREFILL: timing[0] / len(queries),
                                                                  DECODE: timing[1] / len(queries)}  # fmt: skip
    split[GENERATED] = sum(a.n_tokens for a in answers) / len(queries)
    if not sizes:  # no state was read here: the model ran elsewhere
        return answers, {MEMORY: None, STATE: None, SECONDS: seconds, **split}
    chunk = run.ctx.chunk
    return answers, {MEMORY: group_max(chunk, meter.peak()), STATE: group_max(chunk, max(sizes)), SECONDS: seconds,
                     **split}  # fmt: skip


def add_measured(first: dict[str, Any], then: dict[str, Any], share: float) -> dict[str, Any]:
    """An instance's measurements after a second pass (a chain of thought's answer step) that `share` of its batch
    took: the larger peak and state, times and tokens added (`then`'s per-instance values scaled by `share`)."""
    out = {key: most([first[key], then[key]]) for key in (MEMORY, STATE)}
    for key in (SECONDS, PREFILL, DECODE, GENERATED):
        out[key] = None if first[key] is None or then[key] is None else first[key] + then[key] * share
    return out


def most(values: Any) -> int | float | None:
    """The largest of measurements that may be missing (None: a served model's memory and state are the server's)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def fold_lengths(rows: list[dict[str, Any]], records: list[dict[str, Any]], method: str, key: str = "length") -> None:
    """Each length's row gets its instances' peak memory and largest state, how memory was measured, and the prompt
    tokens read per second; rows and records name their length by `key` (MRCR's and Graphwalks' bins: "bin",
    "bucket")."""
    for row in rows:
        mine = [r for r in records if r[key] == row[key]]
        row.update({key: most(r[key] for r in mine) for key in (MEMORY, STATE)}, peak_memory_method=method)
        row.update(rates(mine))


def rates(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """How fast records were read and answered: `tokens_per_second`, prompt tokens over the whole time (reading and
    answering); `prompt_tokens_per_second`, prompt tokens over the time spent reading them; and
    `generated_tokens_per_second`, answer tokens over the time spent decoding (None where not measured: a server's)."""

    def ratio(tokens: str, key: str) -> float | None:
        if any(r.get(key) is None for r in records):
            return None
        seconds = sum(r[key] for r in records)
        return sum(r[tokens] for r in records) / seconds if seconds > 0 else None

    return {"tokens_per_second": ratio("prompt_tokens", SECONDS),
            "prompt_tokens_per_second": ratio("prompt_tokens", PREFILL),
            "generated_tokens_per_second": ratio(GENERATED, DECODE)}  # fmt: skip


def without_measurements(record: dict[str, Any]) -> dict[str, Any]:
    """A record as its samples line: the measurements left to the report."""
    return {k: v for k, v in record.items() if k not in MEASURED}
