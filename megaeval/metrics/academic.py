"""Metrics of the academic suite, computed as lm-evaluation-harness computes them.

Sources (lm-evaluation-harness 0.4.13):

- `lm_eval/api/task.py` (multiple_choice `process_results`): `acc` is argmax of the summed log-likelihoods;
  `acc_norm` is argmax of each log-likelihood divided by the character length of its choice text (the choice
  without the target delimiter). numpy's argmax takes the first of equal scores, as `max_index` does here.
- `lm_eval/api/metrics.py`: `exact_match_hf_evaluate` removes each `regexes_to_ignore` pattern (before any
  lower-casing), then lower-cases, then deletes ASCII punctuation; nothing else (no whitespace collapsing).
  With several references (a list target) a prediction scores 1 if it equals any of them.
- `lm_eval/api/metrics.py`: `mean_stderr` = sample standard deviation (n - 1) / sqrt(n); a group weighted by
  size (MMLU) takes the size-weighted mean of its subtasks and `pooled_sample_stderr`.

All values are fractions in [0, 1], as the harness reports them.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence

_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)


def max_index(values: Sequence[float]) -> int:
    """Index of the largest value, the first on ties (numpy.argmax)."""
    best = 0
    for i, value in enumerate(values):
        if value > values[best]:
            best = i
    return best


def choice_predictions(loglikelihoods: Sequence[float], choices: Sequence[str]) -> tuple[int, int]:
    """(argmax of the log-likelihoods, argmax of log-likelihood / character length of the choice)."""
    if len(loglikelihoods) != len(choices) or not choices:
        raise ValueError(f"{len(loglikelihoods)} log-likelihoods for {len(choices)} choices")
    normalized = [ll / len(choice) if choice else -math.inf for ll, choice in zip(loglikelihoods, choices, strict=True)]
    return max_index(loglikelihoods), max_index(normalized)


def normalize_exact_match(
    text: str, regexes_to_ignore: Sequence[str] = (), ignore_case: bool = False, ignore_punctuation: bool = False
) -> str:
    """The harness's exact_match preprocessing: drop regex matches, then lower-case, then drop punctuation."""
    for pattern in regexes_to_ignore:
        text = re.sub(pattern, "", text)
    if ignore_case:
        text = text.lower()
    if ignore_punctuation:
        text = text.translate(_PUNCTUATION_TABLE)
    return text


def exact_match(
    prediction: str,
    references: Sequence[str],
    regexes_to_ignore: Sequence[str] = (),
    ignore_case: bool = False,
    ignore_punctuation: bool = False,
) -> float:
    """1.0 if the normalised prediction equals any normalised reference, else 0.0."""
    if isinstance(references, str) or not references:
        raise ValueError("references must be a non-empty list of strings")
    options = dict(regexes_to_ignore=regexes_to_ignore, ignore_case=ignore_case, ignore_punctuation=ignore_punctuation)
    normalized = normalize_exact_match(prediction, **options)
    return float(any(normalized == normalize_exact_match(ref, **options) for ref in references))


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean (of at least one value)."""
    return sum(values) / len(values)


def mean_stderr(values: Sequence[float]) -> float | None:
    """Standard error of the mean: sample standard deviation (n - 1) / sqrt(n); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mu = mean(values)
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1)) / math.sqrt(n)


def group_scores(groups: dict[str, Sequence[float]]) -> dict[str, float | int | None]:
    """Per-example scores grouped (e.g. by MMLU subject) -> size-weighted mean, macro mean and pooled stderr.

    The weighted mean equals the mean over all examples (the harness's `weight_by_size: True`); the macro mean
    weights every non-empty group equally. The stderr is the harness's `pooled_sample_stderr`: the pooled
    variance sum((n_i - 1) s_i^2) / (N - k), divided by N, square-rooted.
    """
    groups = {name: list(values) for name, values in groups.items() if len(values)}
    if not groups:
        raise ValueError("no scores to aggregate")
    total = sum(len(v) for v in groups.values())
    weighted = sum(sum(v) for v in groups.values()) / total
    macro = mean([mean(v) for v in groups.values()])
    squares = sum(sum((x - mean(v)) ** 2 for x in v) for v in groups.values())  # sum of (n_i - 1) s_i^2
    dof = total - len(groups)
    stderr = math.sqrt(squares / dof / total) if dof > 0 else None
    return {"weighted": weighted, "macro": macro, "stderr": stderr, "n": total, "groups": len(groups)}
