"""Planning a perplexity sweep: lengths, the number of targets, and the shared-prefix schedule.

Every context length L scores the same N targets, stream positions 1..N: segment k of length L has
inputs stream[kL : kL+L] and targets stream[kL+1 : kL+L+1], each read from a fresh state.

Shared-prefix schedule: a segment of length L that starts at s is the prefix of the segment of any
longer length L' that also starts at s (s a multiple of both). So each start s is run once, as a
pass at the longest length that has a segment there, and the shorter lengths read their NLLs off
that pass's first L positions. For nested lengths 4K..2M this reads ~5.5 N tokens instead of 10 N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import fail

DEFAULT_LENGTHS = "4K,8K,16K,32K,64K,128K,256K,512K,1M,2M"
SCHEDULES = ("shared", "naive")
UNITS = {"K": 1 << 10, "M": 1 << 20}


def parse_count(text: str | int, what: str = "length") -> int:
    """'4K' -> 4096, '2M' -> 2097152, '3000' -> 3000 (K = 1024, M = 1048576)."""
    raw = str(text).strip()
    unit = UNITS.get(raw[-1:].upper(), 1)
    number = raw[:-1] if unit > 1 else raw
    if not (number.isascii() and number.isdigit()):
        raise fail(f"bad {what} {raw!r}", "write a positive integer, optionally with K (1024) or M (1048576), e.g. 4K")
    value = int(number) * unit
    if value <= 0:
        raise fail(f"bad {what} {raw!r}: must be positive")
    return value


def parse_lengths(text: str | list[int]) -> list[int]:
    """Comma-separated context lengths, sorted ascending, without duplicates."""
    items = text if isinstance(text, list) else [t for t in str(text).split(",") if t.strip()]
    if not items:
        raise fail("no context lengths given", f"pass --lengths such as {DEFAULT_LENGTHS}")
    lengths = [parse_count(t) for t in items]
    if len(set(lengths)) != len(lengths):
        raise fail(f"duplicate context lengths in {text!r}")
    return sorted(lengths)


def resolve_tokens(lengths: list[int], requested: int | None, stream_tokens: int) -> int:
    """N: the requested number of targets, or the largest multiple of every length that fits."""
    step = math.lcm(*lengths)
    available = stream_tokens - 1  # targets are positions 1..N
    if requested is None:
        if available < step:
            longest = "the longest length" if step == max(lengths) else f"lcm of the lengths ({step})"
            raise fail(
                f"the stream has {stream_tokens:,} tokens, fewer than {longest} + 1 = {step + 1:,}",
                "use shorter --lengths, or a longer stream (prep-books with more books)",
            )
        return available // step * step
    if requested % step:
        raise fail(
            f"--tokens {requested} is not a multiple of every length (lcm {step})", "every length must score all N"
        )
    if requested > available:
        raise fail(f"--tokens {requested:,} needs {requested + 1:,} stream tokens but the stream has {stream_tokens:,}")
    return requested


@dataclass(frozen=True)
class Pass:
    """One fresh-state pass over stream[start : start + length], serving several context lengths."""

    length: int
    start: int
    serves: tuple[int, ...]  # context lengths whose segment at `start` is this pass's prefix


def plan_passes(lengths: list[int], n_tokens: int, schedule: str = "shared") -> list[Pass]:
    """Every (length, segment) is served exactly once; shortest passes first."""
    if schedule not in SCHEDULES:
        raise fail(f"unknown schedule {schedule!r}", "use shared or naive")
    passes = []
    for length in lengths:
        for start in range(0, n_tokens, length):
            if schedule == "naive":
                passes.append(Pass(length, start, (length,)))
            elif not any(longer > length and start % longer == 0 for longer in lengths):
                passes.append(Pass(length, start, tuple(x for x in lengths if x <= length and start % x == 0)))
    return passes


def bucket_edges(length: int) -> list[int]:
    """Log2 position buckets within a segment: [0,1), [1,2), [2,4), ... up to the length."""
    edges = [0]
    while edges[-1] < length:
        edges.append(min(length, max(1, 2 * edges[-1])))
    return edges


def batches_of(passes: list[Pass], batch_size: int) -> list[list[Pass]]:
    """Consecutive passes in batches of at most `batch_size`, a batch holding one length only."""
    if batch_size < 1:
        raise fail(f"--batch-size must be at least 1, got {batch_size}")
    out: list[list[Pass]] = []
    for i in range(0, len(passes), batch_size):
        groups: dict[int, list[Pass]] = {}
        for p in passes[i : i + batch_size]:
            groups.setdefault(p.length, []).append(p)
        out.extend(groups.values())
    return out
