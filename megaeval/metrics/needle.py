"""Needle metrics, as their sources score one answer: RULER's string_match_all and string_match_part, and the
passkey's first integer."""

from __future__ import annotations

import re

from ..errors import fail

_CONTROL = re.compile(r"[\x00-\x1f]")
_INTEGER = re.compile(r"\d+")


def postprocess(prediction: str) -> str:
    """RULER's cleaning of a prediction: stripped, control characters turned into newlines, stripped again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, answers: list[str]) -> float:
    """RULER's string_match_all for one prediction: the share of the answers found in it, case-insensitively."""
    text = prediction.lower()
    return sum(1.0 for a in answers if a.lower() in text) / len(answers)


def string_match_part(prediction: str, answers: list[str]) -> float:
    """RULER's string_match_part for one prediction (its QA metric): 1 when any answer is found in it,
    case-insensitively (lm-evaluation-harness's port scores the share found instead)."""
    text = prediction.lower()
    return max(1.0 if a.lower() in text else 0.0 for a in answers)


def first_integer_match(prediction: str, answers: list[str]) -> float:
    """The passkey test's score: 1 when the first integer in the prediction equals the key, else 0."""
    found = _INTEGER.search(prediction)
    return float(found is not None and int(found.group()) == int(answers[0]))


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part,
           "first_integer_match": first_integer_match}  # fmt: skip


def needle_score(metric: str, prediction: str, answers: list[str]) -> float:
    """One prediction scored by the task's metric (RULER's predictions are cleaned first, as RULER does)."""
    if metric not in METRICS:
        raise fail(f"unknown needle metric {metric!r} in a task file", f"use one of {', '.join(METRICS)}")
    if metric.startswith("string_match"):
        prediction = postprocess(prediction)
    return METRICS[metric](prediction, answers)
