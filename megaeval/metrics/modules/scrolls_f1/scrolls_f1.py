"""SCROLLS F1 and exact match (NarrativeQA, Qasper) as a local `evaluate` metric.

Load it offline with `evaluate.load(megaeval.metrics.scrolls.evaluate_module_path("scrolls_f1"))`. It wraps
`megaeval.metrics.scrolls.qa_scores`, so both always give the same numbers.
"""

import evaluate

from megaeval.metrics.scrolls import metric_info, qa_scores

_DESCRIPTION = "SCROLLS token-overlap F1 and exact match, the best over each example's references, mean x 100."

_KWARGS_DESCRIPTION = """
Args:
    predictions: one string per example.
    references: one list of reference strings per example (at least one).
Returns:
    {"f1": float, "exact_match": float, "n": int}: means over the examples, on a 0..100 scale.
"""


class ScrollsF1(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION)

    def _compute(self, predictions: list[str], references: list[list[str]]) -> dict:
        return qa_scores(predictions, references)
