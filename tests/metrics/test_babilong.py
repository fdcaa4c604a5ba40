"""BABILong's scoring against BABILong's own `compare_answers` (run on a table of hand-made answers covering every
rule: tests/fixtures/babilong/reference/scores.json, made by data_prep/babilong_reference.py) and hand-computed
values of the table's cells and averages."""

from __future__ import annotations

import json

import pytest

from megaeval.metrics.babilong import accuracy, average, compare_answers, preprocess_output
from megaeval.tasks.babilong.spec import load_babilong_task
from megaeval_testing import REPO

CASES = json.loads((REPO / "tests" / "fixtures" / "babilong" / "reference" / "scores.json").read_text())


@pytest.mark.parametrize(("task", "target", "output", "question", "expected"), CASES)
def test_compare_answers_equals_babilongs(task, target, output, question, expected):
    assert compare_answers(target, output, question, load_babilong_task(task)["labels"]) is expected


def test_the_table_covers_every_rule_both_ways():
    verdicts = {(task, output): right for task, _, output, _, right in CASES}
    assert verdicts["qa1", "hallway, then the kitchen"] is False  # two labels in the first sentence
    assert verdicts["qa1", "Hallway. Then the kitchen."] is True  # only the first sentence counts
    assert verdicts["qa3", "Before the kitchen the apple was in the bathroom."] is True  # not the question's label
    assert verdicts["qa8", "milk, apple"] is True and verdicts["qa8", "apple"] is False  # every item, any order
    assert verdicts["qa8", "apple, milk and football"] is False  # and nothing else
    assert verdicts["qa19", "n,w"] is True and verdicts["qa19", "s,e s,w"] is False
    assert verdicts["qa1", ""] is False and verdicts["qa1", "None"] is False
    assert sum(right for *_, right in CASES) not in (0, len(CASES))


def test_preprocess_output_keeps_the_first_sentence_before_any_tag():
    assert preprocess_output("Kitchen. Garden.") == "kitchen"
    assert preprocess_output("garden <context> kitchen") == "garden "
    assert preprocess_output("garden <example> kitchen") == "garden "
    # lower-cased first, so BABILong's cut at "Question" never applies
    assert preprocess_output("garden Question: kitchen") == "garden question: kitchen"


def test_cells_and_the_average_as_collect_results_forms_them():
    assert accuracy(58, 100) == 58.0 and accuracy(1, 3) == pytest.approx(100 / 3) and accuracy(0, 0) == 0.0
    assert average([10.0, 20.0, 30.0, 40.0, 50.0]) == 30.0
    assert average([10.0, None, 30.0, 40.0, 50.0]) is None  # a missing task: no average
    assert average([10.0, 20.0]) is None  # fewer than five
