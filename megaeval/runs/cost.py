"""The cost line a long evaluation prints before its work starts: what is still to run, the prompt tokens in it, and
the time reading them and generating the answers' budget takes (or, for a served model, the requests and tokens to
send).

The time comes from a short probe timed now (a read of at most PROBE_TOKENS tokens, then a few new tokens: a second
or two), scaled to each prompt's length by the model's FLOPs per token where the family knows them (an attention
model reads a 32K prompt slower per token than a 512-token one, a state-carrying model at the same rate), so the line
costs little of the run it estimates. Generation is the answers' budget at the probe's time per new token and row,
its rows decoded together as the command decodes them, scaled alike to the prompts' mean length: an upper bound, as
answers stop early.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..console import note_line
from ..tables import format_duration, format_length

# (left, total, each unit's prompt tokens, new tokens at most or None) of the units the journal does not hold yet
Left = Callable[[Any], tuple[int, int, Sequence[int], int | None]]
PROBE_TOKENS = 512


def announce_cost(run: Any, noun: str, left: Left, rate_tokens: int, *, about: bool = False, rows: int = 1) -> None:
    """With the progress bar, one line on stderr: `left(journal)`'s counts of `noun` (instances, records), and the
    time their prompts and their answers' budget take at the rates a probe of at most `rate_tokens` tokens (the
    shortest prompt length, or less) finds now, its new tokens decoded `rows` together as the command will decode
    them (every rank probes, so that ranks sharing one model under --chunk-parallel stay in step)."""
    if not run.progress:
        return
    probe = max(1, min(rate_tokens, PROBE_TOKENS))
    rates = run.answerer.read_rate(probe, rows)
    if not run.ctx.is_main or run.journal is None:
        return
    todo, total, prompts, new = left(run.journal)
    tokens = sum(prompts)
    head = f"{run.command}: {todo:,} of {total:,} {noun} to run, {'about ' if about else ''}{tokens:,} prompt tokens"
    more = f" (and up to {new:,} to generate)" if new is not None else ""
    if rates is None:
        note_line(f"{head} to send{more}: one request each to {run.lm.spec}, {run.answerer.concurrency} in flight")
        return
    rate, step = rates
    copies = run.ctx.num_groups
    reading = reading_seconds(run.lm, probe, rate, prompts) / copies
    timed = f"a {format_length(probe)}-token read at {rate:,.0f} tokens/s"
    if new is None:
        note_line(f"{head} to read: about {format_duration(reading)} per model copy ({timed}, timed now)")
        return
    mean = round(tokens / max(len(prompts), 1))
    together = f" a row, {rows} rows together" if rows > 1 else ""
    generating = new * step * decode_scale(run.lm, probe, mean) / copies
    note_line(f"{head} to read{more}: about {format_duration(reading + generating)} per model copy, "
              f"{format_duration(reading)} reading and up to {format_duration(generating)} generating ({timed} "
              f"and {step * 1000:,.0f} ms a new token{together}, timed now)")  # fmt: skip


def reading_seconds(lm: Any, probe: int, rate: float, prompts: Sequence[int]) -> float:
    """Seconds to read prompts of these lengths, at `rate` tokens/s for a `probe`-token prompt and each prompt's
    FLOPs per token against the probe's (`flops_per_token`; the probe's rate where the family does not know them)."""
    base = _flops(lm, probe)
    seconds = 0.0
    for n in prompts:
        per_token = _flops(lm, n)
        seconds += n / rate * (per_token / base if base and per_token else 1.0)
    return seconds


def decode_scale(lm: Any, probe: int, length: int) -> float:
    """How much longer a new token takes after `length` tokens than after `probe`: the FLOPs the next position adds
    (n+1 positions' FLOPs less n's), 1 where the family does not know them."""

    def step(n: int) -> float | None:
        if lm.max_context is not None:
            n = min(n, lm.max_context - 1)
        now, after = _flops(lm, n), _flops(lm, n + 1)
        return (n + 1) * after - n * now if now and after else None

    base, at = step(probe), step(max(length, probe))
    return at / base if base and at else 1.0


def _flops(lm: Any, n: int) -> float | None:
    if lm.max_context is not None:
        n = min(n, lm.max_context)
    return lm.flops_per_token(max(n, 1))
