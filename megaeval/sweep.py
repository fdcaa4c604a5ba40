"""`megaeval ppl-sweep`: perplexity of a books stream at many context lengths.

Every context length L scores the same N targets, stream positions 1..N: segment k of length L has
inputs stream[kL : kL+L] and targets stream[kL+1 : kL+L+1], each read from a fresh state.

Shared-prefix schedule: a segment of length L that starts at s is the prefix of the segment of any
longer length L' that also starts at s (s a multiple of both). So each start s is run once, at the
longest length that has a segment there, and the shorter lengths read their NLLs off that run's
first L positions. For nested lengths 4K..2M this reads ~5.5 N tokens instead of 10 N.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import fail
from .files import check_outputs, check_writable, write_json_atomic
from .memory import PeakMemory
from .models import StreamingLM, load_model, model_options, parse_spec
from .report import build_report, environment, model_facts, numeric_settings
from .streams import BooksStream
from .windows import parse_window_policy, score_windows, windows

DEFAULT_LENGTHS = "4K,8K,16K,32K,64K,128K,256K,512K,1M,2M"
SCHEDULES = ("shared", "naive")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_count(text: str | int, what: str = "length") -> int:
    """'4K' -> 4096, '2M' -> 2097152, '3000' -> 3000 (K = 1024, M = 1048576)."""
    raw = str(text).strip()
    unit = UNITS.get(raw[-1:].upper(), 1)
    number = raw[:-1] if unit > 1 else raw
    if not number.isdigit():
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
class Run:
    """One fresh-state pass over stream[start : start + length], serving several context lengths."""

    length: int
    start: int
    serves: tuple[int, ...]  # context lengths whose segment at `start` is this pass's prefix


def plan_runs(lengths: list[int], n_tokens: int, schedule: str = "shared") -> list[Run]:
    """Every (length, segment) is served exactly once; shortest runs first."""
    runs = []
    for length in lengths:
        for start in range(0, n_tokens, length):
            if schedule == "naive":
                runs.append(Run(length, start, (length,)))
            elif not any(longer > length and start % longer == 0 for longer in lengths):
                runs.append(Run(length, start, tuple(x for x in lengths if x <= length and start % x == 0)))
    return runs


def bucket_edges(length: int) -> list[int]:
    """Log2 position buckets within a segment: [0,1), [1,2), [2,4), ... up to the length."""
    edges = [0]
    while edges[-1] < length:
        edges.append(min(length, max(1, 2 * edges[-1])))
    return edges


@dataclass
class Totals:
    """What one context length has accumulated so far."""

    nll_sum: float = 0.0
    segments: int = 0
    curve_sum: list[float] = field(default_factory=list)
    seconds: float = 0.0
    processed: int = 0
    peak_memory: int = 0


@dataclass
class SweepSettings:
    """Every flag of `megaeval ppl-sweep`, defaults included (all recorded in the report)."""

    stream: str
    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    lengths: str = DEFAULT_LENGTHS
    tokens: str | None = None
    batch_size: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    norm_stats: str | None = None
    kernels: str | None = None
    window_policy: str = "error"
    schedule: str = "shared"
    out: str = "reports/ppl_sweep.json"
    resume: bool = False


def _load(settings: SweepSettings) -> tuple[StreamingLM, dict[str, Any]]:
    options = model_options(settings.model, settings.model_args, norm_stats=settings.norm_stats,
                            kernels=settings.kernels)  # fmt: skip
    return load_model(settings.model, device=settings.device, dtype=settings.dtype, **options), options


def run_ppl_sweep(
    settings: SweepSettings, progress: bool = True, on_batch: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Run (or resume) a sweep and write its report to `settings.out`; return the report."""
    if settings.schedule not in SCHEDULES:
        raise fail(f"unknown schedule {settings.schedule!r}", "use shared or naive")
    if settings.batch_size < 1:
        raise fail(f"--batch-size must be at least 1, got {settings.batch_size}")
    lengths = parse_lengths(settings.lengths)
    requested = None if settings.tokens is None else parse_count(settings.tokens, "--tokens")
    out = Path(settings.out)
    partial = out.with_name(out.name + ".partial")
    check_outputs({"--out": out, "the resume file": partial}, [settings.stream, parse_spec(settings.model)[1]])
    check_writable(out)
    if partial.exists() and not settings.resume:
        raise fail(f"an interrupted run left {partial}", "pass --resume to continue it, or delete that file")

    stream = BooksStream(settings.stream)
    lm, options = _load(settings)
    stream.check_tokenizer(lm.tokenizer)
    parse_window_policy(settings.window_policy)
    if lm.max_context is not None:
        windows(max(lengths), lm.max_context, settings.window_policy)  # refuses early under "error"
    n_tokens = resolve_tokens(lengths, requested, len(stream))
    runs = plan_runs(lengths, n_tokens, settings.schedule)
    batches = [runs[i : i + settings.batch_size] for i in range(0, len(runs), settings.batch_size)]
    batches = _split_by_length(batches)
    facts = model_facts(lm, settings.model, options)
    fingerprint = {
        "settings": numeric_settings(settings),
        "weights_sha256": facts["weights_sha256"],
        "manifest_sha256": stream.manifest_sha256,
        "tokens_sha256": stream.tokens_sha256,
        "tokens": n_tokens,
        "batches": len(batches),
    }
    totals, done = _resume_or_start(partial, fingerprint, lengths, settings.resume)

    meter = PeakMemory(lm.device)
    planned = sum(r.length for r in runs)
    bar = _progress_bar(progress, planned, sum(r.length for b in batches[:done] for r in b))
    current_length = None
    with bar:
        for index in range(done, len(batches)):
            batch = batches[index]
            length = batch[0].length
            if length != current_length:
                meter.reset()
                current_length = length
            began = time.perf_counter()
            nll = _score(lm, stream, batch, settings.window_policy)
            seconds = time.perf_counter() - began
            _accumulate(totals, batch, nll, seconds, meter.peak())
            write_json_atomic(partial, {"fingerprint": fingerprint, "done": index + 1,
                                        "totals": {str(k): asdict(v) for k, v in totals.items()}})  # fmt: skip
            bar.advance(0, length * len(batch))
            bar.update(0, description=f"length {length:,}")
            if on_batch is not None:
                on_batch(index)

    span = stream.text_span(1, n_tokens + 1, lm.tokenizer)
    results = _results(lengths, n_tokens, totals, runs, span, settings.schedule, meter.method)
    report = build_report(
        "ppl-sweep",
        settings={**asdict(settings), "lengths": lengths, "tokens": n_tokens, "norm_stats": _norm_stats(lm)},
        model=facts,
        data={**stream.describe(), "tokens_scored": n_tokens, "span": asdict(span)},
        results=results,
        env=environment(lm.device, lm.dtype),
    )
    write_json_atomic(out, report)
    partial.unlink(missing_ok=True)
    return report


def _norm_stats(lm: StreamingLM) -> str | None:
    return getattr(lm, "norm_stats", None)


def _split_by_length(batches: list[list[Run]]) -> list[list[Run]]:
    """A batch holds runs of one length only."""
    out = []
    for batch in batches:
        groups: dict[int, list[Run]] = {}
        for run in batch:
            groups.setdefault(run.length, []).append(run)
        out.extend(groups.values())
    return out


def _resume_or_start(partial: Path, fingerprint: dict, lengths: list[int], resume: bool) -> tuple[dict, int]:
    totals = {length: Totals(curve_sum=[0.0] * (len(bucket_edges(length)) - 1)) for length in lengths}
    if not (resume and partial.exists()):
        return totals, 0
    import json

    try:
        saved = json.loads(partial.read_text())
    except ValueError:
        raise fail(f"{partial} is corrupt", "delete it and start over") from None
    if saved.get("fingerprint") != fingerprint:
        differ = _differences(saved.get("fingerprint", {}), fingerprint)
        raise fail(f"cannot resume {partial}: the settings differ from the interrupted run ({differ})",
                   "rerun with the original settings, or delete that file to start over")  # fmt: skip
    for key, value in saved["totals"].items():
        totals[int(key)] = Totals(**value)
    return totals, int(saved["done"])


def _differences(old: dict, new: dict, prefix: str = "") -> str:
    items = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = _differences(a, b, f"{prefix}{key}.")
            if inner:
                items.append(inner)
        elif a != b:
            items.append(f"{prefix}{key}: {a!r} then, {b!r} now")
    return "; ".join(items)


def _score(lm: StreamingLM, stream: BooksStream, batch: list[Run], policy: str) -> np.ndarray:
    """Fresh-state NLLs [len(batch), length] of the batch's runs, checked for NaN/inf."""
    length = batch[0].length
    window = np.stack([np.asarray(stream.tokens[r.start : r.start + length + 1], dtype=np.int64) for r in batch])
    window = torch.from_numpy(window).to(lm.device)
    if lm.max_context is not None and length > lm.max_context:
        nll = score_windows(lm, window[:, :-1], window[:, 1:], policy, lm.max_context)
    else:
        nll, _ = lm.score(window[:, :-1], window[:, 1:], lm.init_state(len(batch)))
    nll = nll.double().cpu().numpy()
    bad = ~np.isfinite(nll)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        run = batch[row]
        pos = _first_non_finite(lm, window[row : row + 1])
        raise fail(
            f"the model produced a non-finite NLL ({nll[row, pos]}) for stream position {run.start + pos + 1:,}: "
            f"segment of length {length:,} starting at {run.start:,}, position {pos:,} within it",
            "check the checkpoint's weights, or use a wider --dtype such as float32",
        )
    return nll


def _first_non_finite(lm: StreamingLM, window: torch.Tensor) -> int:
    """The first target whose NLL is not finite when read causally.

    FFT convolutions spread a NaN to every position of a call, so the position is found by binary
    search over prefixes: the shortest prefix whose NLLs are not all finite ends at the culprit.
    """

    def spoiled(m: int) -> bool:
        nll, _ = lm.score(window[:, :m], window[:, 1 : m + 1], lm.init_state(1))
        return not bool(torch.isfinite(nll).all())

    lo, hi = 1, window.shape[1] - 1  # spoiled(hi) holds
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if spoiled(mid) else (mid + 1, hi)
    return lo - 1


def _accumulate(totals: dict[int, Totals], batch: list[Run], nll: np.ndarray, seconds: float, peak: int) -> None:
    length = batch[0].length
    owner = totals[length]
    owner.seconds += seconds
    owner.processed += length * len(batch)
    owner.peak_memory = max(owner.peak_memory, peak)
    for run, row in zip(batch, nll, strict=True):
        for served in run.serves:
            t = totals[served]
            edges = bucket_edges(served)
            bucket_sums = np.add.reduceat(row[:served], edges[:-1])
            t.nll_sum += float(bucket_sums.sum())
            t.segments += 1
            t.curve_sum = [a + float(b) for a, b in zip(t.curve_sum, bucket_sums, strict=True)]


def _results(lengths, n_tokens, totals, runs, span, schedule, memory_method) -> dict[str, Any]:
    rows, curves = [], []
    for length in lengths:
        t = totals[length]
        if t.segments != n_tokens // length:
            raise AssertionError(f"length {length}: {t.segments} segments scored, expected {n_tokens // length}")
        mean = t.nll_sum / n_tokens
        rows.append({
            "context_length": length,
            "segments": t.segments,
            "tokens": n_tokens,
            "nll_sum": t.nll_sum,
            "mean_nll": mean,
            "ppl": math.exp(mean),
            "bits_per_byte": t.nll_sum / (math.log(2) * span.bytes) if span.bytes else None,
            "word_ppl": math.exp(t.nll_sum / span.words) if span.words else None,
            "seconds": round(t.seconds, 3),
            "tokens_processed": t.processed,
            "tokens_per_second": round(t.processed / t.seconds, 1) if t.seconds > 0 else None,
            "peak_memory_bytes": t.peak_memory,
        })  # fmt: skip
        edges = bucket_edges(length)
        segments = n_tokens // length
        buckets = [
            {"start": a, "end": b, "mean_nll": s / (segments * (b - a))}
            for a, b, s in zip(edges[:-1], edges[1:], t.curve_sum, strict=True)
        ]
        curves.append({"context_length": length, "buckets": buckets})
    return {
        "schedule": "shared-prefix" if schedule == "shared" else "naive",
        "tokens_scored": n_tokens * len(lengths),
        "tokens_processed": sum(r.length for r in runs),
        "targets": {"first_position": 1, "last_position": n_tokens},
        "peak_memory_method": memory_method,
        "lengths": rows,
        "position_curve": curves,
    }


def _progress_bar(enabled: bool, total: int, completed: int):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    class TokensPerSecond(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed or 0:,.0f} tok/s")

    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} tokens"),
        TokensPerSecond(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not enabled,
    )  # fmt: skip
    bar.add_task("ppl-sweep", total=total, completed=completed)
    return bar
