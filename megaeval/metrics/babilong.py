"""BABILong's scoring, as booydar/babilong scores one answer (babilong/metrics.py at 7a6efee: `preprocess_output`,
`compare_answers`) and forms its table (babilong/collect_results.py: accuracy x 100, the qa1-qa5 average).

An answer is right when, in its first sentence, the target is the only one of the task's labels that the question
does not already mention; a target listing several labels (qa8's "apple,football") needs every one of them and
no other. Labels are found as substrings, case-insensitively.
"""

from __future__ import annotations

from collections.abc import Iterable


def preprocess_output(output: str) -> str:
    """The part of an answer that is scored: lower-cased, up to its first full stop, before any `<context>`,
    `<example>` or `Question` the model went on to write (the last never matches once lower-cased: kept as is)."""
    output = output.lower().split(".")[0]
    return output.split("<context>")[0].split("<example>")[0].split("Question")[0]


def compare_answers(target: str, output: str, question: str, labels: Iterable[str]) -> bool:
    """Whether `output` answers with `target`: BABILong's rule (module docstring)."""
    output = preprocess_output(output)
    target = target.lower()
    labels = {label.lower() for label in labels}
    in_question = {label for label in labels if label in question.lower()}
    found = {label for label in labels if label in output} - in_question
    if "," in target and len(target) > 3:  # several labels (qa8's lists)
        parts = target.split(",")
        return all(part in found for part in parts) and len(found) == len(parts)
    return target in found and len(found) == 1


def accuracy(correct: int, total: int) -> float:
    """collect_results' cell: 100 x the share answered right (0 for no answers)."""
    return 100 * correct / total if total > 0 else 0.0


def average(cells: list[float | None], min_tasks: int = 5) -> float | None:
    """collect_results' average row (`get_col_mean`): the mean of a length's cells over the averaged tasks, or None
    when one of them is missing or fewer than `min_tasks` are there."""
    if len(cells) < min_tasks or any(c is None for c in cells):
        return None
    return sum(cells) / len(cells)
