"""Graphwalks' score of one response: the set F1 of the nodes its last line's `Final Answer: [...]` lists against
the gold nodes. Two graders, one per published rule (`--grader`):

- `lm-eval` (the default): lm-evaluation-harness 0.4.13's tasks/graphwalks `f1` (utils.py `extract_answer_list`,
  `process_results`): the last line after trailing newlines are dropped, `Final Answer:\\s*\\[(.*)\\]`'s group
  split at commas, each item stripped of spaces and quotes; F1 0 when nothing overlaps or the line is missing.
- `lm-eval-flexible`: lm-eval's `flexible_f1` (`extract_answer_list_flexible`): the last line anywhere in the
  response that holds `Final Answer:\\s*\\[(.*)\\]`, read as above.
- `card`: the openai/graphwalks dataset card's two snippets to the letter: `get_list` reads `response.split("\\n")[-1]`
  (a trailing newline leaves an empty last line), splits `re.search(r"Final Answer: ?\\[.*\\]", line).group(0)
  .strip("[]")` at commas (so the first item keeps `Final Answer: [` and never matches a node), and the F1 line ends
  `else 1` (no overlap scores 1). A response whose last line has no `Final Answer:` (get_list's error flag) scores 0.
  Kept to reproduce numbers computed by the card's code; docs/mrcr.md says why it is not the default.
"""

from __future__ import annotations

import re

GRADERS = ("lm-eval", "lm-eval-flexible", "card")


def card_list(response: str) -> tuple[list[str], bool]:
    """The card's `get_list`: the nodes of the last line, and whether it failed (no `Final Answer:` list)."""
    line = response.split("\n")[-1]
    if "Final Answer:" not in line:
        return [], True
    part = re.search(r"Final Answer: ?\[.*\]", line)
    if not part:
        return [], True
    return [item.strip() for item in part.group(0).strip("[]").split(",") if item.strip()], False


def lm_eval_list(response: str) -> tuple[list[str], bool]:
    """lm-eval 0.4.13's `extract_answer_list` (strict: the last line only)."""
    line = response.rstrip("\n").split("\n")[-1]
    if "Final Answer:" not in line:
        return [], True
    found = re.search(r"Final Answer:\s*\[(.*)\]", line)
    if not found:
        return [], True
    inside = found.group(1)
    if not inside.strip():
        return [], False
    return [item.strip().strip("'\"") for item in inside.split(",") if item.strip()], False


def lm_eval_flexible_list(response: str) -> tuple[list[str], bool]:
    """lm-eval 0.4.13's `extract_answer_list_flexible`: the last line holding a `Final Answer: [...]`, anywhere."""
    for line in reversed(response.rstrip("\n").split("\n")):
        found = re.search(r"Final Answer:\s*\[(.*)\]", line)
        if found:
            inside = found.group(1)
            if not inside.strip():
                return [], False
            return [item.strip().strip("'\"") for item in inside.split(",") if item.strip()], False
    return [], True


def set_f1(predicted: list[str], gold: list[str], none_overlapping: float = 0.0) -> float:
    """F1 of the predicted node set against the gold set; `none_overlapping` where recall + precision is 0."""
    sampled, truth = set(predicted), set(gold)
    overlap = len(sampled & truth)
    recall = overlap / len(truth) if truth else 0.0
    precision = overlap / len(sampled) if sampled else 0.0
    return 2 * recall * precision / (recall + precision) if recall + precision > 0 else none_overlapping


def graphwalks_score(response: str, gold: list[str], grader: str = "lm-eval") -> tuple[float, list[str], bool]:
    """(score, the nodes read, whether the answer line was missing or malformed) under `grader`."""
    if grader == "card":
        nodes, failed = card_list(response)
        return (0.0 if failed else set_f1(nodes, gold, 1.0)), nodes, failed
    nodes, failed = (lm_eval_flexible_list if grader == "lm-eval-flexible" else lm_eval_list)(response)
    return set_f1(nodes, gold), nodes, failed
