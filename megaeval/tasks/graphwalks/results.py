"""Graphwalks' means: per problem type and per prompt_chars bucket, and overall. The card defines no buckets (OpenAI's
GPT-4.1 post reports its two files, up to 128K and 256K-1M tokens); megaeval's buckets are powers of two of the
record's `prompt_chars`, `(lo, hi]` characters, labelled by their upper edge (`512K` holds 262,145-524,288 chars)."""

from __future__ import annotations

from typing import Any

from ..mrcr.results import mean


def bucket_of(chars: int) -> str:
    """The power-of-two bucket of `chars` characters, by its upper edge."""
    high = 1024
    while high < chars:
        high *= 2
    return f"{high // 1048576}M" if high >= 1048576 else f"{high // 1024}K"


def bucket_chars(name: str) -> int:
    return int(name[:-1]) * (1048576 if name.endswith("M") else 1024)


def graphwalks_results(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """From one row per record (problem_type, bucket, score, failed): the means per type and bucket, per bucket and
    overall, and how many answers had no `Final Answer:` line."""
    kinds = sorted({r["problem_type"] for r in rows})
    buckets = sorted({r["bucket"] for r in rows}, key=bucket_chars)
    table = {}
    for kind in kinds:
        cells = {}
        for b in buckets:
            scores = [r["score"] for r in rows if r["problem_type"] == kind and r["bucket"] == b]
            if scores:
                cells[b] = {"mean": mean(scores), "n": len(scores)}
        mine = [r["score"] for r in rows if r["problem_type"] == kind]
        table[kind] = {"buckets": cells, "mean": mean(mine), "n": len(mine)}
    by_bucket = {b: {"mean": mean(s), "n": len(s)} for b in buckets
                 if (s := [r["score"] for r in rows if r["bucket"] == b])}  # fmt: skip
    every = [r["score"] for r in rows]
    return {"problem_types": table, "buckets": by_bucket, "mean": mean(every), "n": len(every),
            "answer_missing": sum(1 for r in rows if r["failed"])}  # fmt: skip
