"""Needle results: each task's length x depth grid of accuracy (with peak memory), per-length and overall averages."""

from __future__ import annotations

from statistics import mean
from typing import Any

from ...runs.answers import most


def needle_results(records: list[dict], specs: dict[str, dict], lengths: list[int], depths: list[int]) -> dict:
    """Per task: `cells` [{length, depth, n, accuracy, peak_memory_bytes}], `lengths` [{length, n, accuracy, ...}],
    `accuracy` over every prompt, and what was read; `average`: the mean of the tasks' accuracies.

    A prompt's score is in [0, 1] (RULER's string_match_all: the share of its values found; passkey: 0 or 1), and
    accuracy is the mean score (RULER prints it x100)."""
    results: dict[str, Any] = {}
    for task, spec in specs.items():
        units = [r for r in records if r["task"] == task]
        rows = [p for r in units for p in r["prompts"]]
        peak = {n: most(r["peak_memory_bytes"] for r in units if r["length"] == n) for n in lengths}
        cells = []
        for n in lengths:
            for d in depths:
                scores = [p["score"] for p in rows if p["length"] == n and p["depth"] == d]
                cells.append({"length": n, "depth": d, "n": len(scores), "accuracy": mean(scores),
                              "peak_memory_bytes": peak[n]})  # fmt: skip
        by_length = []
        for n in lengths:
            mine = [r for r in units if r["length"] == n]
            by_length.append({
                "length": n, "n": sum(len(r["prompts"]) for r in mine),
                "accuracy": mean(p["score"] for r in mine for p in r["prompts"]),
                "mean_prompt_tokens": mean(p["prompt_tokens"] for r in mine for p in r["prompts"]),
                "tokens_read": sum(r["tokens_read"] for r in mine),
                "tokens_naive": sum(r["tokens_naive"] for r in mine),
                "peak_memory_bytes": peak[n], "state_bytes": most(r["state_bytes"] for r in mine),
            })  # fmt: skip
        results[task] = {
            "n": len(rows), "metric": "accuracy", "accuracy": mean(p["score"] for p in rows),
            "score": spec["metric"], "cells": cells, "lengths": by_length,
            "tokens_read": sum(r["tokens_read"] for r in units), "tokens_naive": sum(r["tokens_naive"] for r in units),
            "peak_memory_bytes": most(peak.values()),
        }  # fmt: skip
    results["average"] = mean(results[t]["accuracy"] for t in specs)
    results["average_of"] = {t: "accuracy" for t in specs}
    return results
