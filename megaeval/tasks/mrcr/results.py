"""MRCR's bins and means, as the openai/mrcr card defines them: a record falls in a bin by the o200k_base tokens of
its prompt (every message's content) plus its answer, the bins `[4096, 8192]`, `(8192, 16384]`, ...,
`(524288, 1048576]` (the first closed, the others open on the left); `--bin-by prompt` bins by the prompt's tokens
alone, the other convention in use. A record outside every bin is tabled as `<4K` or `>1M`, never dropped."""

from __future__ import annotations

from typing import Any

EDGES = (4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)
BIN_BY = ("prompt+answer", "prompt")


def _short(n: int) -> str:
    return f"{n // 1048576}M" if n >= 1048576 else f"{n // 1024}K"


BINS = tuple(f"{_short(lo)}-{_short(hi)}" for lo, hi in zip(EDGES, EDGES[1:], strict=False))
BELOW, ABOVE = "<4K", ">1M"
# GDM MRCR v2's files past the card's range, and its cumulative file (every length up to 128K together)
LONGER = ("1M-2M", "2M-4M", "4M-8M")
UPTO_128K = "up to 128K"
ORDER = (BELOW, *BINS, *LONGER, ABOVE, UPTO_128K)


def v2_bin(group: str | tuple[int, int]) -> str:
    """The bin a GDM v2 file is: `upto_128K`, or its (lo, hi) range named as the card's bins are."""
    return UPTO_128K if group == "upto_128K" else f"{_short(group[0])}-{_short(group[1])}"


def bin_of(tokens: int) -> str:
    """The card's bin of a record counted `tokens` o200k_base tokens."""
    if tokens < EDGES[0]:
        return BELOW
    for k, high in enumerate(EDGES[1:]):
        if tokens <= high:
            return BINS[k]
    return ABOVE


def bin_high(name: str) -> int:
    """A bin's upper edge in tokens (the x of the model cards' curves); `<4K` is 4096, `>1M` has none (a huge one),
    GDM v2's `up to 128K` is 131072."""
    if name == BELOW:
        return EDGES[0]
    if name == ABOVE:
        return 1 << 62
    if name == UPTO_128K:
        return 131072
    high = name.split("-")[-1]
    return int(high[:-1]) * (1048576 if high.endswith("M") else 1024)


def binned_tokens(record: Any, bin_by: str) -> int:
    return record.prompt_tokens + (record.answer_tokens if bin_by == "prompt+answer" else 0)


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mrcr_results(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """From one row per record (needles, bin, score): the mean per (needles, bin), per needle count and overall."""
    needles = sorted({r["needles"] for r in rows})
    bins = [b for b in ORDER if any(r["bin"] == b for r in rows)]
    bins += sorted({r["bin"] for r in rows} - set(bins), key=bin_high)  # a GDM v2 file of another range
    table = {}
    for n in needles:
        cells = {}
        for b in bins:
            scores = [r["score"] for r in rows if r["needles"] == n and r["bin"] == b]
            if scores:
                cells[b] = {"mean": mean(scores), "n": len(scores)}
        mine = [r["score"] for r in rows if r["needles"] == n]
        table[str(n)] = {"bins": cells, "mean": mean(mine), "n": len(mine)}
    every = [r["score"] for r in rows]
    by_bin = {b: {"mean": mean(s), "n": len(s)} for b in bins if (s := [r["score"] for r in rows if r["bin"] == b])}
    return {"needles": table, "bins": by_bin, "mean": mean(every), "n": len(every),
            "prefix_missing": sum(1 for r in rows if not r.get("prefix_found", True))}  # fmt: skip
