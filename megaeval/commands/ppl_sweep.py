"""`megaeval ppl-sweep`: perplexity of a books stream at many context lengths (plan: `scoring.sweep_plan`)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from ..distributed import group_max
from ..errors import fail
from ..files import human_bytes
from ..models import StreamingLM, naming, parse_spec
from ..runs import Run, RunSettings, open_run
from ..runs.memory import PeakMemory
from ..runs.run import check_run_outputs
from ..runs.utilisation import Peak, device_peak, parse_peak, utilisation
from ..scoring.finite import NON_FINITE_FIX
from ..scoring.stream_keys import segment_keys
from ..scoring.sweep_plan import (  # fmt: skip
    DEFAULT_LENGTHS,
    Pass,
    batches_of,
    bucket_edges,
    parse_count,
    parse_lengths,
    plan_passes,
    resolve_tokens,
)
from ..scoring.windows import parse_window_policy, score_windows, windows
from ..serving.spec import refuse_served
from ..streams import BooksStream, TextSpan
from ..tables import format_length, format_value, render_table
from ..tasks.longppl.data import KEY_MODES, check_key_modes
from .ppl_sweep_keys import KeyedSweep


@dataclass(kw_only=True)
class SweepSettings(RunSettings):
    """Every flag of `megaeval ppl-sweep`, defaults included (all recorded in the report)."""

    stream: str
    lengths: str = DEFAULT_LENGTHS
    tokens: str | None = None
    batch_size: int = 1
    norm_stats: str | None = None
    window_policy: str = "error"
    schedule: str = "shared"
    peak_tflops: str = "auto"  # MFU's denominator: auto, measure or TFLOP/s per device (runs.utilisation)
    key_tokens: str | None = None  # LongPPL per length: key-token spans from a file (longppl --save-key-tokens) ...
    evaluator: str | None = None  # ... or from an evaluator run on each book before the sweep
    evaluator_args: dict[str, Any] = field(default_factory=dict)
    trunc_len: int | None = None  # None: the key-token file's, else the reference's (metrics.longppl)
    sliding_window: int | None = None
    alpha: float | None = None
    beta: float | None = None
    out: str = "reports/ppl_sweep.json"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.key_tokens is not None and self.evaluator is not None:
            raise fail("pass one of --evaluator E (find key tokens) and --key-tokens F (read them), not both",
                       "a file from `longppl --save-key-tokens` needs no evaluator")  # fmt: skip
        check_key_modes(self, KEY_MODES)
        parse_peak(self.peak_tflops)

    def family_flags(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "norm_stats": self.norm_stats}


def run_ppl_sweep(settings: SweepSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Run (or resume) a sweep and write its report to `settings.out`; return the report (None on ranks > 0).

    Under torchrun every rank runs this; batches are dealt out by index and folded on rank 0 in batch
    order, so the report equals one process's. With chunk_parallel P, groups of P ranks share each
    batch, every rank reading a contiguous slice of it (MEGALODON: chunk-aligned, carrying its state; hf:
    sequence parallel, each rank keeping its slice of the KV cache; `models.chunk_parallel_lm`).
    """
    refuse_served(settings.model, "ppl-sweep", "carries the model's state chunk by chunk and scores every token")
    refuse_served(settings.evaluator, "--evaluator", "scores every token of a document to find its key tokens")
    with naming("--evaluator", settings.evaluator):
        evaluator = parse_spec(settings.evaluator)[1] if settings.evaluator else None
    check_run_outputs(settings, [settings.stream, parse_spec(settings.model)[1], evaluator, settings.key_tokens])
    lengths = parse_lengths(settings.lengths)
    requested = None if settings.tokens is None else parse_count(settings.tokens, "--tokens")
    parse_window_policy(settings.window_policy)
    plan_passes(lengths, max(lengths), settings.schedule)  # checks the schedule and the batch size early
    batches_of([], settings.batch_size)
    parse_peak(settings.peak_tflops)
    stream = BooksStream(settings.stream)
    n_tokens = resolve_tokens(lengths, requested, len(stream))
    keyed = KeyedSweep.open(settings, stream)

    def check(lm: StreamingLM) -> dict[str, Any]:
        stream.check_tokenizer(lm.tokenizer)
        if lm.max_context is not None:
            windows(max(lengths), lm.max_context, settings.window_policy)  # refuses early under "error"
        return keyed.prepare(lm) if keyed is not None else {}

    fingerprint = {"manifest_sha256": stream.manifest_sha256, "tokens_sha256": stream.tokens_sha256, "tokens": n_tokens}
    with open_run("ppl-sweep", settings, reads=[settings.stream], fingerprint=fingerprint, check=check,
                  progress=progress, on_unit=on_unit) as run:  # fmt: skip
        return _sweep(run, settings, stream, lengths, n_tokens, keyed)


def _sweep(
    run: Run, settings: SweepSettings, stream: BooksStream, lengths: list[int], n_tokens: int, keyed: KeyedSweep | None
) -> Any:
    lm = run.lm
    passes = plan_passes(lengths, n_tokens, settings.schedule)
    batches = batches_of(passes, settings.batch_size)
    meter = PeakMemory(lm.device)
    measuring = {"length": None}

    def compute(index: int) -> dict[str, Any]:
        batch = batches[index]
        if batch[0].length != measuring["length"]:
            meter.reset()
            measuring["length"] = batch[0].length
        began = time.perf_counter()
        nll = score_batch(lm, stream, batch, settings.window_policy)
        seconds = time.perf_counter() - began
        peak = group_max(run.ctx.chunk, meter.peak())  # a chunk-parallel group: the largest peak of its ranks
        served = [[[length, np.add.reduceat(row[:length], bucket_edges(length)[:-1]).tolist()] for length in p.serves]
                  for p, row in zip(batch, nll, strict=True)]  # fmt: skip
        record = {"length": batch[0].length, "passes": len(batch), "served": served, "seconds": seconds,
                  "peak_memory": peak}  # fmt: skip
        if keyed is not None:  # per pass, per length it serves: [key-token NLL sum, key tokens]
            record["keys"] = [[segment_keys(keyed.positions, row, p.start, length) for length in p.serves]
                              for p, row in zip(batch, nll, strict=True)]  # fmt: skip
        return record

    records = run.map(range(len(batches)), key=lambda i: i, compute=compute, unit_name="tokens",
                      weight=lambda i: batches[i][0].length * len(batches[i]),
                      describe=lambda i: f"length {batches[i][0].length:,}")  # fmt: skip
    if records is None:
        return None  # not rank 0
    span = stream.text_span(1, n_tokens + 1, lm.tokenizer)
    flops = {length: segment_flops_per_token(lm, length, settings.window_policy) for length in lengths}
    peak = device_peak(settings.peak_tflops, lm.device, lm.dtype)
    results = sweep_results(lengths, n_tokens, records, passes, span, settings.schedule, meter.method,
                            run.ctx.num_groups, flops=flops, peak=peak, devices=run.ctx.world_size)  # fmt: skip
    recorded = {
        **asdict(settings),
        "lengths": lengths,
        "tokens": n_tokens,
        "norm_stats": lm.options().get("norm_stats"),
        **(keyed.settings() if keyed is not None else {}),
    }
    data = {**stream.describe(), "tokens_scored": n_tokens, "span": asdict(span),
            **({"key_tokens": keyed.describe()} if keyed is not None else {})}  # fmt: skip
    return run.finish(recorded, data, results)


def score_batch(lm: StreamingLM, stream: BooksStream, batch: list[Pass], policy: str) -> np.ndarray:
    """Fresh-state NLLs [len(batch), length] of the batch's passes, checked for NaN/inf (on a chunk-parallel
    model, every window of a window policy is one chunk-parallel pass)."""
    length = batch[0].length
    window = np.stack([np.asarray(stream.tokens[p.start : p.start + length + 1], dtype=np.int64) for p in batch])
    window = torch.from_numpy(window).to(lm.device)
    if lm.max_context is not None and length > lm.max_context:
        nll = score_windows(lm, window[:, :-1], window[:, 1:], policy, lm.max_context)
    else:
        nll, _ = lm.score(window[:, :-1], window[:, 1:], lm.init_state(len(batch)))
    nll = nll.double().cpu().numpy()
    bad = ~np.isfinite(nll)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        start = batch[row].start
        pos = first_non_finite(lm, window[row : row + 1])
        raise fail(
            f"the model produced a non-finite NLL ({nll[row, pos]}) for stream position {start + pos + 1:,}: "
            f"segment of length {length:,} starting at {start:,}, position {pos:,} within it",
            NON_FINITE_FIX,
        )
    return nll


def segment_flops_per_token(lm: StreamingLM, length: int, policy: str) -> float | None:
    """Model FLOPs per token of one segment of `length` tokens: one fresh pass, or beyond a fixed context the
    windows `policy` reads (tokens re-read by sliding windows included); None when the model does not know them."""
    spans = [(0, length, 0)] if lm.max_context is None else windows(length, lm.max_context, policy)
    total, known = 0.0, {}
    for start, end, _ in spans:
        if end - start not in known:
            known[end - start] = lm.flops_per_token(end - start)
        if known[end - start] is None:
            return None
        total += known[end - start] * (end - start)
    return total / length


def first_non_finite(lm: StreamingLM, window: torch.Tensor) -> int:
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


def exp_or_none(mean_nll: float) -> float | None:
    """A perplexity, or None past what a float holds (mean NLL over about 709.78 nats; mean_nll stays exact)."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return None


def sweep_results(
    lengths: list[int], n_tokens: int, records: list[dict[str, Any]], passes: list[Pass], span: TextSpan,
    schedule: str, memory_method: str, workers: int = 1, *, flops: dict[int, float | None] | None = None,
    peak: Peak | None = None, devices: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """Fold the batches' records, in batch order, into the per-length results and position curves.

    `workers` data-parallel groups ran batches at the same time: a length's time is its batches' compute
    time divided by them, so tokens_per_second is the whole job's rate. `flops`: model FLOPs per token by
    length; with `peak` (per device, `devices` of them in the job) they give achieved TFLOP/s and MFU.
    """
    flops, peak = flops or {}, peak or Peak(None, None, None)
    nll_sum = dict.fromkeys(lengths, 0.0)
    segments = dict.fromkeys(lengths, 0)
    curve = {length: [0.0] * (len(bucket_edges(length)) - 1) for length in lengths}
    seconds, processed = dict.fromkeys(lengths, 0.0), dict.fromkeys(lengths, 0)
    peak_bytes = dict.fromkeys(lengths, 0)
    keyed = any("keys" in r for r in records)
    key_sum, key_count = dict.fromkeys(lengths, 0.0), dict.fromkeys(lengths, 0)
    for r in records:
        for p_keys, served in zip(r["keys"], r["served"], strict=True) if keyed else ():
            for (length, _), (nll, count) in zip(served, p_keys, strict=True):
                key_sum[length] += nll
                key_count[length] += count
        seconds[r["length"]] += r["seconds"] / workers
        processed[r["length"]] += r["length"] * r["passes"]
        peak_bytes[r["length"]] = max(peak_bytes[r["length"]], r["peak_memory"])
        for served in r["served"]:
            for length, sums in served:
                nll_sum[length] += float(np.asarray(sums).sum())
                segments[length] += 1
                curve[length] = [a + b for a, b in zip(curve[length], sums, strict=True)]
    rows, curves = [], []
    for length in lengths:
        if segments[length] != n_tokens // length:
            raise AssertionError(f"length {length}: {segments[length]} segments scored, expected {n_tokens // length}")
        mean = nll_sum[length] / n_tokens
        rows.append({
            "context_length": length, "segments": segments[length], "tokens": n_tokens, "nll_sum": nll_sum[length],
            "mean_nll": mean, "ppl": exp_or_none(mean),
            "bits_per_byte": nll_sum[length] / (math.log(2) * span.bytes) if span.bytes else None,
            "word_ppl": exp_or_none(nll_sum[length] / span.words) if span.words else None,
            "seconds": round(seconds[length], 3), "tokens_processed": processed[length],
            "tokens_per_second": round(processed[length] / seconds[length], 1) if seconds[length] > 0 else None,
            "peak_memory_bytes": peak_bytes[length], "model_flops_per_token": flops.get(length),
            **utilisation(flops.get(length), processed[length], seconds[length], peak.tflops, devices),
        })  # fmt: skip
        if keyed:  # LongPPL over the key tokens among this length's targets (token-weighted, as `longppl` pools)
            rows[-1].update(
                n_key_tokens=key_count[length],
                key_nll_sum=key_sum[length],
                longppl=exp_or_none(key_sum[length] / key_count[length]) if key_count[length] else None,
            )
        edges = bucket_edges(length)
        buckets = [{"start": a, "end": b, "mean_nll": s / (segments[length] * (b - a))}
                   for a, b, s in zip(edges[:-1], edges[1:], curve[length], strict=True)]  # fmt: skip
        curves.append({"context_length": length, "buckets": buckets})
    return {
        "schedule": "shared-prefix" if schedule == "shared" else "naive",
        "tokens_scored": n_tokens * len(lengths),
        "tokens_processed": sum(p.length for p in passes),
        "targets": {"first_position": 1, "last_position": n_tokens},
        "peak_memory_method": memory_method,
        **peak.describe(),
        "lengths": rows,
        "position_curve": curves,
    }


def _longppl_cell(row: dict[str, Any]) -> str:
    if row.get("longppl") is None:
        return "no key tokens" if not row.get("n_key_tokens") else "overflow"
    return f"{format_value(row['longppl'])} ({row['n_key_tokens']:,})"


def sweep_summary(report: dict[str, Any]) -> str:
    """One ppl-sweep report as a table: a row per context length."""
    keyed = any("longppl" in r for r in report["results"]["lengths"])
    header = ["context", "segments", "ppl", *(["longppl"] if keyed else []), "bits/byte", "word ppl", "tok/s",
              "peak mem", "seconds"]  # fmt: skip
    with_mfu = any(r.get("mfu") is not None for r in report["results"]["lengths"])
    header += ["TFLOP/s", "MFU"] if with_mfu else []
    rows = []
    for r in report["results"]["lengths"]:
        rows.append([
            format_length(r["context_length"]), str(r["segments"]),
            "overflow" if r["ppl"] is None else format_value(r["ppl"]),
            *([_longppl_cell(r)] if keyed else []),
            "" if r["bits_per_byte"] is None else f"{r['bits_per_byte']:.4f}",
            "" if r["word_ppl"] is None else format_value(r["word_ppl"]),
            "" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:,.0f}",
            human_bytes(r["peak_memory_bytes"]), f"{r['seconds']:.1f}",
        ])  # fmt: skip
        if with_mfu:
            rows[-1] += ["" if r.get("mfu") is None else f"{r['achieved_tflops']:.1f}",
                         "" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"]  # fmt: skip
    res = report["results"]
    title = (
        f"{report['model'].get('family')} on {report['data']['tokens_scored']:,} tokens per length "
        f"({res['schedule']}: {res['tokens_processed']:,} processed for {res['tokens_scored']:,} scored)"
    )
    return render_table(header, rows, "table", title=title)
