"""SCROLLS metrics, computed as the official scorer computes them.

The official scorer is `metrics/scrolls.py` of the Hugging Face dataset `tau/scrolls` (used by the evaluator in
github.com/tau-nlp/scrolls), with its helpers `f1.py`, `exact_match.py` (the SQuAD v1.1 functions) and `rouge.py`
(Google's `rouge_score`). These functions follow it:

- F1 and exact match: SQuAD normalisation, the best score over an example's references, the mean over examples × 100.
  A prediction or reference that normalises to nothing scores F1 0, even against another empty one.
- ROUGE-1/2/L: the F-measure of `rouge_score` without stemming; for each type separately, the best score over an
  example's references, then the mean over examples × 100. `geometric_rouge` is the cube root of the product of
  the three means: the SCROLLS score of the summarisation tasks.

Values are not rounded; the official scorer rounds what it prints to 4 decimals.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rouge_score import rouge_scorer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
METRICS = ("f1", "geometric_rouge")
"""The headline metrics a SCROLLS task can name (its suites/scrolls/<task>.yaml `metric`)."""

EVALUATE_MODULES = ("scrolls_f1", "scrolls_rouge")
CITATION = """\
@inproceedings{shaham-etal-2022-scrolls,
    title = "{SCROLLS}: Standardized {C}ompa{R}ison Over Long Language Sequences",
    author = "Shaham, Uri and Segal, Elad and Ivgi, Maor and Efrat, Avia and Yoran, Ori and Haviv, Adi and
      Gupta, Ankit and Xiong, Wenhan and Geva, Mor and Berant, Jonathan and Levy, Omer",
    booktitle = "Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing",
    year = "2022",
    url = "https://aclanthology.org/2022.emnlp-main.823",
}
"""


def metric_info(description: str, inputs_description: str):
    """The `evaluate.MetricInfo` of a SCROLLS metric module: strings in, lists of references."""
    import datasets
    import evaluate

    features = datasets.Features(
        {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
    )
    return evaluate.MetricInfo(
        description=description, citation=CITATION, inputs_description=inputs_description, features=features
    )


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower-case, remove punctuation, then articles, then collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _check_references(references: Sequence[str]) -> None:
    # The official scorer takes max() over the references and fails on an empty list; say why instead.
    if isinstance(references, str):
        raise TypeError("references must be a list of strings, not a string")
    if len(references) == 0:
        raise ValueError("every example needs at least one reference; got an empty list")


def _token_f1(prediction_tokens: list[str], reference_tokens: list[str]) -> float:
    common = Counter(prediction_tokens) & Counter(reference_tokens)
    num_same = sum(common.values())
    # As in the official code: no common token is 0, which covers an empty prediction or reference (even both).
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, references: Sequence[str]) -> float:
    """Token-overlap F1 of the normalised strings, 0..1, the best over the references."""
    _check_references(references)
    prediction_tokens = normalize_answer(prediction).split()
    return max(_token_f1(prediction_tokens, normalize_answer(reference).split()) for reference in references)


def exact_match(prediction: str, references: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals some normalised reference, else 0.0."""
    _check_references(references)
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(reference) for reference in references))


@cache
def _rouge_scorer() -> rouge_scorer.RougeScorer:
    # imported here: rouge_score brings nltk and scipy (1.5 s), which a run without ROUGE, or one that stops on
    # bad input, never needs
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)


def rouge(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1/2/L F-measures, 0..1, each the best over the references on its own."""
    _check_references(references)
    # The official scorer first puts each sentence on its own line (nltk.sent_tokenize). Only rougeLsum reads
    # lines; rouge_score's tokenizer turns every non-alphanumeric character into a space, so ROUGE-1/2/L are the
    # same without it, and no punkt data is needed.
    scores = [_rouge_scorer().score(reference, prediction) for reference in references]  # (target, prediction)
    return {key: max(score[key].fmeasure for score in scores) for key in ROUGE_TYPES}


def _percent_mean(values: Iterable[float], n: int) -> float:
    # The official f1/exact-match code sums in a plain loop, then takes 100 * total / n; keep that order
    # (sum() compensates rounding on Python >= 3.12) so the numbers agree to the last bit.
    total = 0.0
    for value in values:
        total += value
    return 100.0 * total / n


def _pairs(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> list[tuple[str, Sequence[str]]]:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    if len(predictions) == 0:
        raise ValueError("no predictions to score")
    return list(zip(predictions, references, strict=True))


def qa_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict:
    """Corpus F1 and exact match, × 100, as for NarrativeQA and Qasper."""
    pairs = _pairs(predictions, references)
    n = len(pairs)
    return {
        "f1": _percent_mean((f1(p, r) for p, r in pairs), n),
        "exact_match": _percent_mean((exact_match(p, r) for p, r in pairs), n),
        "n": n,
    }


def summary_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict:
    """Corpus ROUGE-1/2/L, their geometric mean and exact match, × 100, as for QMSum."""
    pairs = _pairs(predictions, references)
    n = len(pairs)
    per_example = [rouge(p, r) for p, r in pairs]
    # The official ROUGE path scales each example by 100 first, then takes sum() / n.
    scores = {key: sum(100 * example[key] for example in per_example) / n for key in ROUGE_TYPES}
    scores["geometric_rouge"] = (scores["rouge1"] * scores["rouge2"] * scores["rougeL"]) ** (1.0 / 3.0)
    scores["exact_match"] = _percent_mean((exact_match(p, r) for p, r in pairs), n)
    scores["n"] = n
    return scores


def _check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"unknown SCROLLS metric {metric!r}; expected one of {', '.join(METRICS)}")
    return metric


def scrolls_scores(metric: str, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict:
    """The corpus scores (× 100) of a task whose headline is `metric`, and the number of examples `n`."""
    if _check_metric(metric) == "f1":
        return qa_scores(predictions, references)
    return summary_scores(predictions, references)


def example_scores(metric: str, prediction: str, references: Sequence[str]) -> dict[str, float]:
    """The scores of one example (× 100) of a task whose headline is `metric`, for a samples file."""
    if _check_metric(metric) == "f1":
        return {"f1": 100 * f1(prediction, references), "exact_match": 100 * exact_match(prediction, references)}
    scores = {key: 100 * value for key, value in rouge(prediction, references).items()}
    scores["exact_match"] = 100 * exact_match(prediction, references)
    return scores


def evaluate_module_path(name: str) -> str:
    """The directory of a local `evaluate` metric module ("scrolls_f1" or "scrolls_rouge"), for evaluate.load."""
    if name not in EVALUATE_MODULES:
        raise ValueError(f"unknown metric module {name!r}; expected one of {', '.join(EVALUATE_MODULES)}")
    return str(Path(__file__).resolve().parent / "modules" / name)
