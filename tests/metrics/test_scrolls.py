"""The SCROLLS metrics against hand-computed values and the official scorer's documented example."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaeval.metrics.scrolls import (
    METRICS,
    evaluate_module_path,
    exact_match,
    example_scores,
    f1,
    normalize_answer,
    rouge,
    scrolls_scores,
)

# The example in the docstring of the official metric (tau/scrolls, metrics/scrolls.py), verbatim.
OFFICIAL_PREDICTIONS = ["exact match example", "hello there", "general kenobi"]
OFFICIAL_REFERENCES = [["exact match example"], ["hello", "hi there"], ["commander kenobi"]]


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The cat.", "cat"),
        ("  A  Tale of Two\tCities!! ", "tale of two cities"),
        ("theater another", "theater another"),  # articles only as whole words
        ("Don't", "dont"),
        ("an-the", "anthe"),  # punctuation goes first, so no article is left to remove
        ("The!", ""),
    ],
)
def test_normalize_answer(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


def test_f1_and_exact_match_ignore_case_punctuation_and_articles() -> None:
    assert f1("The cat.", ["cat"]) == 1.0
    assert exact_match("The cat.", ["cat"]) == 1.0
    assert f1("A CAT!", ["the cat"]) == 1.0


def test_f1_partial_overlap() -> None:
    # prediction tokens: quick brown fox jumped (4); reference tokens: quick red fox (3); common: quick, fox (2).
    # precision 2/4, recall 2/3, F1 = 2 * 1/2 * 2/3 / (1/2 + 2/3) = (2/3) / (7/6) = 4/7.
    assert f1("The quick brown fox jumped", ["a quick red fox"]) == pytest.approx(4 / 7)
    assert exact_match("The quick brown fox jumped", ["a quick red fox"]) == 0.0


def test_f1_counts_tokens_as_a_multiset() -> None:
    # "cat cat dog" vs "cat": one "cat" in common; precision 1/3, recall 1/1, F1 = 2 * 1/3 / (4/3) = 1/2.
    assert f1("cat cat dog", ["cat"]) == pytest.approx(1 / 2)


def test_best_over_several_references() -> None:
    # "hello there" vs "hello": P 1/2, R 1 -> 2/3; vs "hi there": P 1/2, R 1/2 -> 1/2; the best is 2/3.
    assert f1("hello there", ["hello", "hi there"]) == pytest.approx(2 / 3)
    assert f1("hello there", ["hi there", "hello"]) == pytest.approx(2 / 3)
    assert exact_match("hello there", ["nope", "Hello, there!"]) == 1.0


def test_empty_prediction_and_empty_reference() -> None:
    assert f1("", ["cat"]) == 0.0
    assert exact_match("", ["cat"]) == 0.0
    assert f1("cat", [""]) == 0.0
    # The official F1 returns 0 whenever no token is shared, even for two empty strings, while exact match
    # compares the normalised strings, which are then equal.
    assert f1("", [""]) == 0.0
    assert exact_match("", [""]) == 1.0
    assert f1("The!", ["a"]) == 0.0
    assert exact_match("The!", ["a"]) == 1.0
    assert rouge("", ["cat"]) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}


@pytest.mark.parametrize("metric", [f1, exact_match, rouge])
def test_empty_reference_list_is_an_error(metric) -> None:
    # The official scorer fails here too (max() of an empty list); we say why.
    with pytest.raises(ValueError, match="at least one reference"):
        metric("cat", [])
    with pytest.raises(TypeError, match="list of strings"):
        metric("cat", "cat")
    with pytest.raises(ValueError, match="at least one reference"):
        scrolls_scores("f1", ["cat"], [[]])


def test_rouge_hand_computed() -> None:
    # rouge_score lower-cases and drops punctuation but keeps articles: [the, cat] vs [cat] -> P 1/2, R 1 -> 2/3.
    assert rouge("The cat.", ["cat"])["rouge1"] == pytest.approx(2 / 3)
    # No stemming: "cats running" shares no token with "cat runs" (a Porter stemmer would make them equal).
    assert rouge("cats running", ["cat runs"]) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}


def test_rouge_takes_the_best_reference_for_each_type_separately() -> None:
    # prediction [cat sat mat]
    # A = "cat sat": rouge1 P 2/3 R 1 -> 0.8; rouge2 {cat sat} of {cat sat, sat mat}: P 1/2 R 1 -> 2/3;
    #                rougeL LCS 2 -> 0.8
    # B = "mat sat cat": rouge1 P 1 R 1 -> 1.0; rouge2 no shared bigram -> 0; rougeL LCS 1 -> 1/3
    # rouge1 is won by B, rouge2 and rougeL by A.
    scores = rouge("cat sat mat", ["cat sat", "mat sat cat"])
    assert scores == pytest.approx({"rouge1": 1.0, "rouge2": 2 / 3, "rougeL": 0.8})
    assert rouge("cat sat mat", ["mat sat cat", "cat sat"]) == scores


def test_rouge_ignores_sentence_newlines() -> None:
    # The official scorer puts each sentence on its own line before ROUGE; only rougeLsum reads lines.
    one_line = rouge("The cat sat. It was happy!", ["A cat sat down. It purred."])
    assert rouge("The cat sat.\nIt was happy!", ["A cat sat down.\nIt purred."]) == one_line


def test_geometric_rouge_is_the_cube_root_of_the_product_of_the_means() -> None:
    predictions = ["cat sat mat", "the dog barked"]
    references = [["cat sat", "mat sat cat"], ["a dog barked loudly"]]
    scores = scrolls_scores("geometric_rouge", predictions, references)
    # Example 1: 100 / 66.67 / 80 (above). Example 2: [the dog barked] vs [a dog barked loudly]:
    # rouge1 2 shared: P 2/3 R 2/4 -> 4/7; rouge2 {dog barked}: P 1/2 R 1/3 -> 2/5; rougeL LCS 2 -> 4/7.
    r1 = (100 + 100 * 4 / 7) / 2
    r2 = (100 * 2 / 3 + 100 * 2 / 5) / 2
    rl = (80 + 100 * 4 / 7) / 2
    assert (scores["rouge1"], scores["rouge2"], scores["rougeL"]) == pytest.approx((r1, r2, rl))
    assert scores["geometric_rouge"] == pytest.approx((r1 * r2 * rl) ** (1 / 3))
    assert scores["exact_match"] == 0.0
    assert scores["n"] == 2


def test_official_example() -> None:
    qa = scrolls_scores("f1", OFFICIAL_PREDICTIONS, OFFICIAL_REFERENCES)
    assert round(qa["f1"], 4) == 72.2222
    assert round(qa["exact_match"], 4) == 33.3333  # the documented contract_nli/quality exact match
    summary = scrolls_scores("geometric_rouge", OFFICIAL_PREDICTIONS, OFFICIAL_REFERENCES)
    assert [round(summary[key], 4) for key in ("rouge1", "rouge2", "rougeL")] == [72.2222, 33.3333, 72.2222]
    assert round(summary["geometric_rouge"], 4) == 55.8136


def test_scrolls_scores_keys_and_the_task_files_headline_metrics() -> None:
    from megaeval.tasks.specs import load_spec

    # the SCROLLS leaderboard's headline per task, stated once, in each task's YAML file
    headlines = {task: load_spec("scrolls", task)["metric"] for task in ("narrative_qa", "qasper", "qmsum")}
    assert headlines == {"narrative_qa": "f1", "qasper": "f1", "qmsum": "geometric_rouge"}
    assert set(headlines.values()) == set(METRICS)
    scores = scrolls_scores("f1", OFFICIAL_PREDICTIONS, OFFICIAL_REFERENCES)
    assert list(scores) == ["f1", "exact_match", "n"] and scores["n"] == 3
    scores = scrolls_scores("geometric_rouge", OFFICIAL_PREDICTIONS, OFFICIAL_REFERENCES)
    assert list(scores) == ["rouge1", "rouge2", "rougeL", "geometric_rouge", "exact_match", "n"]


def test_scrolls_scores_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown SCROLLS metric"):
        scrolls_scores("bleu", ["a"], [["a"]])
    with pytest.raises(ValueError, match="2 predictions but 1 reference lists"):
        scrolls_scores("f1", ["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="no predictions"):
        scrolls_scores("geometric_rouge", [], [])


def test_example_scores_average_to_the_corpus_scores() -> None:
    for metric in METRICS:
        per_example = [
            example_scores(metric, p, r) for p, r in zip(OFFICIAL_PREDICTIONS, OFFICIAL_REFERENCES, strict=True)
        ]
        corpus = scrolls_scores(metric, OFFICIAL_PREDICTIONS, OFFICIAL_REFERENCES)
        assert set(per_example[0]) == set(corpus) - {"n", "geometric_rouge"}
        for key in per_example[0]:
            assert sum(example[key] for example in per_example) / 3 == pytest.approx(corpus[key])
    assert example_scores("f1", "hello there", ["hello", "hi there"]) == pytest.approx(
        {"f1": 200 / 3, "exact_match": 0.0}
    )


@given(st.text(max_size=30), st.text(max_size=30))
def test_f1_is_symmetric_and_bounded(a: str, b: str) -> None:
    assert 0.0 <= f1(a, [b]) <= 1.0
    assert f1(a, [b]) == pytest.approx(f1(b, [a]))
    if normalize_answer(a):
        assert f1(a, [a]) == 1.0 and exact_match(a, [a]) == 1.0


@pytest.mark.parametrize(("name", "headline"), [("scrolls_f1", "f1"), ("scrolls_rouge", "geometric_rouge")])
def test_evaluate_modules_load_offline_and_match(name: str, headline: str, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import evaluate

    path = evaluate_module_path(name)
    assert os.path.isfile(os.path.join(path, f"{name}.py"))
    metric = evaluate.load(path, cache_dir=str(tmp_path))
    predictions = [*OFFICIAL_PREDICTIONS, ""]
    references = [*OFFICIAL_REFERENCES, ["an empty prediction", "scores zero"]]
    assert metric.compute(predictions=predictions, references=references) == scrolls_scores(
        headline, predictions, references
    )


def test_evaluate_module_path_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown metric module"):
        evaluate_module_path("rouge")
