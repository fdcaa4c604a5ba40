"""Graphwalks' graders on hand-made responses: `card` equals the openai/graphwalks card's two snippets (written out
below as the reference), and `lm-eval` and `lm-eval-flexible` equal lm-evaluation-harness 0.4.13's graphwalks `f1`
and `flexible_f1` (its own process_results, run: integration)."""

from __future__ import annotations

import re

import pytest

from megaeval.metrics.graphwalks import graphwalks_score

GOLD = ["a1b2c3d4", "e5f6a7b8", "0badc0de"]
CASES = {
    "exact": "Final Answer: [a1b2c3d4, e5f6a7b8, 0badc0de]",
    "reasoning then answer": "BFS from x: level 1 ...\nFinal Answer: [0badc0de, a1b2c3d4, e5f6a7b8]",
    "partial": "Final Answer: [a1b2c3d4, ffffffff]",
    "single right node": "Final Answer: [e5f6a7b8]",
    "wrong nodes": "Final Answer: [ffffffff]",
    "empty list": "Final Answer: []",
    "no answer line": "The nodes are a1b2c3d4 and e5f6a7b8.",
    "answer not on the last line": "Final Answer: [a1b2c3d4]\nI hope this helps.",
    "trailing newline": "Final Answer: [a1b2c3d4, e5f6a7b8, 0badc0de]\n",
    "quoted nodes": "Final Answer: ['a1b2c3d4', \"e5f6a7b8\"]",
    "no space after colon": "Final Answer:[a1b2c3d4, e5f6a7b8]",
    "two spaces after colon": "Final Answer:  [a1b2c3d4, e5f6a7b8]",
    "duplicates": "Final Answer: [a1b2c3d4, a1b2c3d4, e5f6a7b8]",
    "empty response": "",
}


def card_get_list(response: str) -> tuple[list[str], bool]:
    """The card's `get_list` (a method there; `self` dropped)."""
    line = response.split("\n")[-1]
    if "Final Answer:" not in line:
        return [], True
    list_part = re.search(r"Final Answer: ?\[.*\]", line)
    if list_part:
        result_list = list_part.group(0).strip("[]").split(",")
        result_list = [item.strip() for item in result_list if item.strip()]
        return result_list, False
    else:
        return [], True


def card_score(response: str, gold: list[str]) -> float:
    """The card's grading lines around get_list; its error flag scores 0."""
    sampled, error = card_get_list(response)
    if error:
        return 0.0
    sampled_set, truth_set = set(sampled), set(gold)
    n_overlap, n_sampled, n_golden = len(sampled_set & truth_set), len(sampled_set), len(truth_set)
    recall = n_overlap / n_golden if n_golden > 0 else 0
    precision = n_overlap / n_sampled if n_sampled > 0 else 0
    f1 = 2 * (recall * precision) / (recall + precision) if recall + precision > 0 else 1
    return f1


@pytest.mark.parametrize("name", list(CASES))
def test_card_grader_equals_the_cards_snippets(name):
    assert graphwalks_score(CASES[name], GOLD, "card")[0] == card_score(CASES[name], GOLD)


def test_the_two_graders_differ_where_the_card_slips():
    """The card's list keeps `Final Answer: [` on its first item, and no overlap scores 1 there."""
    assert graphwalks_score(CASES["single right node"], GOLD, "card")[0] == 1.0  # the slips cancel
    assert graphwalks_score(CASES["wrong nodes"], GOLD, "card")[0] == 1.0
    assert graphwalks_score(CASES["wrong nodes"], GOLD, "lm-eval")[0] == 0.0
    assert graphwalks_score(CASES["exact"], GOLD, "lm-eval")[0] == 1.0
    assert graphwalks_score(CASES["exact"], GOLD, "card")[0] == pytest.approx(2 / 3)  # 2 of 3 read right
    assert graphwalks_score(CASES["no answer line"], GOLD, "lm-eval") == (0.0, [], True)
    # flexible: an answer line followed by more text still counts
    assert graphwalks_score(CASES["answer not on the last line"], GOLD, "lm-eval")[0] == 0.0
    assert graphwalks_score(CASES["answer not on the last line"], GOLD, "lm-eval-flexible")[0] == 0.5


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
def test_lm_eval_grader_equals_lm_evaluation_harness(name):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks.graphwalks.utils import process_results

    expected = process_results({"answer_nodes": GOLD}, [CASES[name]])
    assert graphwalks_score(CASES[name], GOLD, "lm-eval")[0] == expected["f1"]
    assert graphwalks_score(CASES[name], GOLD, "lm-eval-flexible")[0] == expected["flexible_f1"]
