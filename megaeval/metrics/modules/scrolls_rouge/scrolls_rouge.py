"""SCROLLS ROUGE-1/2/L and their geometric mean (QMSum) as a local `evaluate` metric.

Load it offline with `evaluate.load(megaeval.metrics.scrolls.evaluate_module_path("scrolls_rouge"))`. It wraps
`megaeval.metrics.scrolls.summary_scores`, so both always give the same numbers.
"""

import evaluate

from megaeval.metrics.scrolls import metric_info, summary_scores

_DESCRIPTION = (
    "SCROLLS ROUGE-1/2/L F-measures (rouge_score, no stemming), each the best over an example's references, "
    "mean x 100; geometric_rouge is the cube root of their product."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions: one string per example.
    references: one list of reference strings per example (at least one).
Returns:
    {"rouge1", "rouge2", "rougeL", "geometric_rouge", "exact_match": float, "n": int}: on a 0..100 scale.
"""


class ScrollsRouge(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION)

    def _compute(self, predictions: list[str], references: list[list[str]]) -> dict:
        return summary_scores(predictions, references)
