"""MRCR's grade equals the openai/mrcr dataset card's `grade()` on hand-made responses: the card's snippet is written
out below as the reference (its five lines), and megaeval's grade must give the same number on every case."""

from __future__ import annotations

from difflib import SequenceMatcher

import pytest

from megaeval.metrics.mrcr import grade


def card_grade(response, answer, random_string_to_prepend) -> float:
    """The openai/mrcr card's snippet, as published."""
    if not response.startswith(random_string_to_prepend):
        return 0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(SequenceMatcher(None, response, answer).ratio())


PREFIX = "aYooSG8CQg"
ANSWER = PREFIX + "Tapirs wander by the river,\nquiet in the morning light."
CASES = {
    "identical": ANSWER,
    "prefix missing": ANSWER.removeprefix(PREFIX),
    "prefix after a leading space": " " + ANSWER,
    "prefix after a newline": "\n" + ANSWER,
    "empty": "",
    "prefix only": PREFIX,
    "partial": PREFIX + "Tapirs wander by the river,",
    "trailing newline": ANSWER + "\n",
    "another poem": PREFIX + "Rocks are grey and old.",
    "prefix twice": PREFIX + ANSWER,
    "prefix in other case": PREFIX.lower() + ANSWER.removeprefix(PREFIX),
}


@pytest.mark.parametrize("name", list(CASES))
def test_grade_equals_the_cards_snippet(name):
    response = CASES[name]
    assert grade(response, ANSWER, PREFIX) == card_grade(response, ANSWER, PREFIX)


def test_the_cases_cover_zero_one_and_between():
    scores = {name: grade(r, ANSWER, PREFIX) for name, r in CASES.items()}
    assert scores["identical"] == 1.0
    assert scores["prefix missing"] == scores["prefix after a leading space"] == scores["empty"] == 0.0
    assert 0 < scores["partial"] < 1 and 0 < scores["trailing newline"] < 1


def test_strip_reads_a_response_with_surrounding_whitespace_and_nothing_else():
    assert grade(" " + ANSWER + "\n", ANSWER, PREFIX, strip=True) == 1.0
    assert grade(" " + ANSWER, ANSWER, PREFIX) == 0.0
    for name, response in CASES.items():
        if response == response.strip():
            assert grade(response, ANSWER, PREFIX, strip=True) == card_grade(response, ANSWER, PREFIX), name


@pytest.mark.integration  # openbench 0.5.3's own scorer code (make setup-all installs it, --no-deps)
def test_grade_equals_openbenchs_mrcr_scorer():
    """openbench's `_sequence_ratio` (openbench/scorers/mrcr.py, the function its mrcr_scorer grades with), taken
    from the installed package's source and run as written; its module imports inspect_ai, which openbench's
    scorer wrapper needs and this function does not, so only the function is executed."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("openbench")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("could not import openbench (pip install --no-deps openbench==0.5.3)")
    source = (Path(spec.submodule_search_locations[0]) / "scorers" / "mrcr.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_sequence_ratio"]
    namespace: dict = {"SequenceMatcher": SequenceMatcher}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "openbench/scorers/mrcr.py", "exec"), namespace)
    theirs = namespace["_sequence_ratio"]
    for name, response in CASES.items():
        assert grade(response, ANSWER, PREFIX) == theirs(response=response, answer=ANSWER,
                                                         random_string_to_prepend=PREFIX), name  # fmt: skip
