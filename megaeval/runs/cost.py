"""The cost line a long evaluation prints before its work starts: what is still to run, the prompt tokens in it, and
the time reading them takes at the rate the model reads a prompt now (or, for a served model, the requests and
tokens to send)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..console import note_line
from ..tables import format_duration, format_length

# (left, total, prompt tokens, new tokens at most or None) of the units the journal does not hold yet
Left = Callable[[Any], tuple[int, int, int, int | None]]


def announce_cost(run: Any, noun: str, left: Left, rate_tokens: int, *, about: bool = False, slower: str = "") -> None:
    """With the progress bar, one line on stderr: `left(journal)`'s counts of `noun` (instances, records), and the
    time reading their prompt tokens takes at the answerer's read rate for a `rate_tokens`-token prompt, timed now
    (every rank reads, so that ranks sharing one model under --chunk-parallel stay in step)."""
    if not run.progress:
        return
    rate = run.answerer.read_rate(rate_tokens)
    if not run.ctx.is_main or run.journal is None:
        return
    todo, total, tokens, new = left(run.journal)
    head = f"{run.command}: {todo:,} of {total:,} {noun} to run, {'about ' if about else ''}{tokens:,} prompt tokens"
    more = f" (and up to {new:,} to generate)" if new is not None else ""
    if rate is None:
        note_line(f"{head} to send{more}: one request each to {run.lm.spec}, {run.answerer.concurrency} in flight")
        return
    seconds = tokens / rate / run.ctx.num_groups
    note_line(f"{head} to read{more}: reading takes about {format_duration(seconds)} at {rate:,.0f} tokens/s per "
              f"model copy (a {format_length(rate_tokens)} read, timed now{slower})")  # fmt: skip
