"""A judge's reply read as FastChat's llm_judge reads it (fastchat/llm_judge/common.py, 0e6d3e4): a rating from the
first "[[x]]" (else the first "[x]") as a Python literal, -1 when there is none; a pairwise verdict from "[[A]]",
"[[B]]" or "[[C]]" (a tie), else "error"; two ratings from "[[x, y]]" (else "[x, y]"), a tie within TIE_DELTA."""

from __future__ import annotations

import ast
import re

ONE = re.compile(r"\[\[(\d+\.?\d*)\]\]")
ONE_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")
TWO = re.compile(r"\[\[(\d+\.?\d*),\s?(\d+\.?\d*)\]\]")
TWO_BACKUP = re.compile(r"\[(\d+\.?\d*),\s?(\d+\.?\d*)\]")
NO_RATING = -1  # FastChat's rating of a reply it cannot read: left out of every mean
TIE_DELTA = 0.1  # two ratings this close are a tie


def rating(reply: str) -> float | int:
    """The rating of a single-answer judgment ("[[rating]]"), or -1."""
    match = ONE.search(reply) or ONE_BACKUP.search(reply)
    if not match:
        return NO_RATING
    try:
        return ast.literal_eval(match.groups()[0])
    except (ValueError, SyntaxError):
        return NO_RATING


def verdict(reply: str, output_format: str = "[[A]]") -> str:
    """The winner of a pairwise judgment: "A", "B", "tie" or "error" (two ratings: the higher one's side, "tie"
    when they are within TIE_DELTA)."""
    if output_format == "[[A]]":
        for mark, winner in (("[[A]]", "A"), ("[[B]]", "B"), ("[[C]]", "tie")):
            if mark in reply:
                return winner
        return "error"
    match = TWO.search(reply) or TWO_BACKUP.search(reply)
    if not match:
        return "error"
    try:
        a, b = (ast.literal_eval(g.strip()) for g in match.groups())
    except (ValueError, SyntaxError):
        return "error"
    return "tie" if abs(a - b) <= TIE_DELTA else "A" if a > b else "B"
