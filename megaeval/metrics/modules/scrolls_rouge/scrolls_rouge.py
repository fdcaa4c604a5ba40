"""SCROLLS ROUGE-1/2/L and their geometric mean (QMSum) as a local `evaluate` metric.

Load it offline with `evaluate.load(megaeval.metrics.scrolls.evaluate_module_path("scrolls_rouge"))`. It wraps
`megaeval.metrics.scrolls.summary_scores`, so both always give the same numbers.
"""

import datasets
import evaluate

from megaeval.metrics.scrolls import summary_scores

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

_CITATION = """\
@inproceedings{shaham-etal-2022-scrolls,
    title = "{SCROLLS}: Standardized {C}ompa{R}ison Over Long Language Sequences",
    author = "Shaham, Uri and Segal, Elad and Ivgi, Maor and Efrat, Avia and Yoran, Ori and Haviv, Adi and
      Gupta, Ankit and Xiong, Wenhan and Geva, Mor and Berant, Jonathan and Levy, Omer",
    booktitle = "Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing",
    year = "2022",
    url = "https://aclanthology.org/2022.emnlp-main.823",
}
"""


class ScrollsRouge(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions: list[str], references: list[list[str]]) -> dict:
        return summary_scores(predictions, references)
