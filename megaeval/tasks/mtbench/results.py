"""MT-Bench's scores as FastChat's show_result.py --mode single computes them: per model, the mean rating of its
first turns, of its second turns, and of all its ratings together ("Average": every rated turn, not the mean of the
two turn means), ratings of -1 (none could be read) left out; plus per category the mean of all its rated turns,
which MT-Bench's radar chart draws. Models are listed best first, as show_result.py sorts them."""

from __future__ import annotations

from typing import Any

from .data import Judgment, Question, key

UNRATED = -1  # FastChat's score of a judgment without a rating


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mtbench_results(judgments: list[Judgment], questions: list[Question] | None) -> dict[str, Any]:
    """Per model: turn_1, turn_2 and overall means, how many turns were rated and unrated, and the category means
    (None where `questions`, which give the categories, lack a judged question)."""
    categories = {key(q.question_id): q.category for q in questions} if questions is not None else {}
    known = questions is not None and all(key(j.question_id) in categories for j in judgments)
    models: dict[str, Any] = {}
    for model in dict.fromkeys(j.model for j in judgments):
        mine = [j for j in judgments if j.model == model]
        rated = [j for j in mine if j.score != UNRATED]
        row = {"turn_1": _mean([j.score for j in rated if j.turn == 1]),
               "turn_2": _mean([j.score for j in rated if j.turn == 2]),
               "overall": _mean([j.score for j in rated]),
               "rated": {"turn_1": sum(j.turn == 1 for j in rated), "turn_2": sum(j.turn == 2 for j in rated)},
               "unrated": len(mine) - len(rated), "categories": None}  # fmt: skip
        if known:
            names = dict.fromkeys(categories[key(j.question_id)] for j in mine)
            row["categories"] = {c: _mean([j.score for j in rated if categories[key(j.question_id)] == c])
                                 for c in names}  # fmt: skip
        models[model] = row
    order = sorted(models, key=lambda m: -(models[m]["overall"] if models[m]["overall"] is not None else -1e300))
    return {"models": {m: models[m] for m in order}, "categories_known": known}
