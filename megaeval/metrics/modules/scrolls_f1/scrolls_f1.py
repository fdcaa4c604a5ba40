"""SCROLLS F1 and exact match (NarrativeQA, Qasper) as a local `evaluate` metric.

Load it offline with `evaluate.load(megaeval.metrics.scrolls.evaluate_module_path("scrolls_f1"))`. It wraps
`megaeval.metrics.scrolls.qa_scores`, so both always give the same numbers.
"""

import datasets
import evaluate

from megaeval.metrics.scrolls import qa_scores

_DESCRIPTION = "SCROLLS token-overlap F1 and exact match, the best over each example's references, mean x 100."

_KWARGS_DESCRIPTION = """
Args:
    predictions: one string per example.
    references: one list of reference strings per example (at least one).
Returns:
    {"f1": float, "exact_match": float, "n": int}: means over the examples, on a 0..100 scale.
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


class ScrollsF1(evaluate.Metric):
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
        return qa_scores(predictions, references)
