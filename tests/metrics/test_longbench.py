"""LongBench's scoring against the official scorer's own outputs (tests/fixtures/longbench/official_scores.json, made
by data_prep/longbench/official_scores.py from THUDM/LongBench's metrics.py, eval.py, result.py and pred.py), the
README leaderboard's category figures, and values worked out by hand."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from megaeval.errors import MegaevalError
from megaeval.metrics import longbench as lb
from megaeval.tasks.longbench.spec import load_longbench_task
from megaeval.tasks.specs import list_tasks

FIXTURE = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "longbench" / "official_scores.json").read_text("utf-8")
)
CASES = FIXTURE["cases"]
METRIC = {task: load_longbench_task(task)["metric"] for task in list_tasks("longbench")}  # the task files' metrics


def build(text: str | dict) -> str:
    """A fixture text, a long one rebuilt from its recipe (the tokens repeated, joined by sep)."""
    if isinstance(text, str):
        return text
    return text["sep"].join(tok for tok, n in text["parts"] for tok in [tok] * n)


def item(case: dict) -> float:
    task = case["task"]
    return lb.score_prediction(
        METRIC[task],
        build(case["prediction"]),
        [build(a) for a in case["answers"]],
        FIXTURE["all_classes"].get(task),
        load_longbench_task(task)["first_line"],
    )


def by_task() -> dict[str, list[dict]]:
    out = defaultdict(list)
    for case in CASES:  # in the order the prediction files list them
        out[case["task"]].append(case)
    return out


def test_the_fixture_is_the_pinned_official_code():
    assert FIXTURE["commit"] == "2e00731f8d0bff23dc4325161044d0ed8af94c1e"
    assert FIXTURE["python"].startswith("3.11.")
    assert {c["task"] for c in CASES} == set(METRIC)  # every v1 task, so every metric
    assert {0.0} < {c["item"] for c in CASES}  # not all zero


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['task']}" for i, c in enumerate(CASES)])
def test_each_metric_and_item_equals_the_official(case):
    task, prediction = case["task"], build(case["prediction"])
    metric = lb.METRICS[METRIC[task]]
    classes = FIXTURE["all_classes"].get(task)
    got = [metric(prediction, build(answer), classes) for answer in case["answers"]]
    assert got == case["per_answer"]  # exact: the same arithmetic in the same order
    assert item(case) == case["item"]


def test_rouge_on_random_texts_equals_the_official():
    """Four-word vocabulary: LCS ties at every step, so the back-trace's tie rule decides the union; the longer
    one-sentence pairs take the numpy table, the short ones the plain one."""
    for prediction, reference, expected in FIXTURE["rouge_pairs"]:
        assert lb.rouge(prediction, reference, None) == expected, (prediction, reference)


def test_the_numpy_lcs_table_equals_the_textbook_one():
    rng = random.Random(5)
    for _ in range(30):
        a, b = ([rng.randrange(3) for _ in range(rng.randint(1, 12))] for _ in range(2))
        table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                table[i][j] = table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(table[i - 1][j], table[i][j - 1])
        keep = rng.randrange(len(b) + 1)
        got = lb._lcs_table(np.array(a), np.array(b), keep)
        assert got.tolist() == [row[keep:] for row in table]


def test_the_recursion_threshold_is_the_measured_one():
    assert (lb.ROUGE_MAX_TRACE, lb.ROUGE_ZH_MAX_TRACE) == (990, 989)
    words = " ".join(["w"] * 990)
    assert lb.rouge(words, words, None) == pytest.approx(1.0) and lb.rouge(words + " w", words + " w", None) == 0.0
    short = " ".join(["w"] * 989)
    assert lb.rouge_zh(short, short, None) == pytest.approx(1.0) and lb.rouge_zh(words, words, None) == 0.0


@pytest.mark.parametrize("case", FIXTURE["raises"], ids=lambda c: c["task"])
def test_retrieval_of_a_reference_naming_no_paragraph_fails(case):
    assert case["error"] == "IndexError"  # what the official does
    with pytest.raises(MegaevalError, match=case["answers"][0]):
        item(case)


def test_eval_py_task_scores_and_length_buckets():
    """eval.py and eval.py --e, run as scripts on every case written as prediction files."""
    tasks = by_task()
    assert set(FIXTURE["eval_v1"]) == set(FIXTURE["eval_e"]) == set(tasks)
    for task, cases in tasks.items():
        scores = [item(c) for c in cases]
        assert lb.task_score(scores) == FIXTURE["eval_v1"][task], task
        assert lb.length_buckets(scores, [c["length"] for c in cases]) == FIXTURE["eval_e"][task], task
    assert any(None in buckets.values() for buckets in FIXTURE["eval_e"].values())  # an empty bucket (NaN there)
    for single in FIXTURE["eval_single"]:  # each long case alone: where recursion fails in `python eval.py`
        assert lb.task_score([item(CASES[single["case"]])]) == single["score"]


@pytest.mark.parametrize("compensated", [False, True])
def test_v2_result_py_figures(compensated):
    expected = FIXTURE["v2"]["compensated" if compensated else "plain"]
    files = FIXTURE["v2"]["files"]
    assert len(expected) == len(files) == 3
    for name, records in files.items():
        assert lb.v2_figures(records, compensated=compensated) == expected[name.rsplit(".", 1)[0]], name


@pytest.mark.parametrize(("response", "expected"), FIXTURE["extract"])
def test_v2_extract_answer(response, expected):
    assert lb.extract_answer(response) == expected


def test_chinese_normalisation_deletes_the_officials_characters():
    assert lb.ZH_PUNCT == set(FIXTURE["zh_removed"])
    # full-width letters lower-case to full-width ones; 《 is not in the official's list, 》 is
    assert lb.normalize_zh(" 北京，ＡＢＣ《报告》\u3000 ") == "北京ａｂｃ《报告"


# Per-dataset scores of the LongBench README (in GROUP order), and its English and Chinese category tables (Avg,
# then the six categories): the tables were made from unrounded scores, so they agree to 0.1.
README_ORDER = [t for tasks in lb.GROUPS.values() for t in tasks]
README = {
    "GPT-3.5-Turbo-16k": (
        "23.6 43.3 52.3 61.2 51.6 37.7 26.9 28.7 29.5 23.4 26.7 16.0 68.0 91.4 41.7 29.2 54.7 53.6 4.5 71.0 77.5",
        "44.0 39.8 38.7 26.5 67.1 54.1 37.8",
        "44.5 61.2 28.7 16.0 29.2 54.1 77.5",
    ),
    "Llama2-7B-chat-4k": (
        "18.7 19.2 36.8 11.9 25.4 32.8 9.4 5.2 27.3 20.8 25.8 0.2 61.5 77.8 40.7 19.8 52.4 43.8 2.1 9.8 0.5",
        "31.0 24.9 22.6 24.7 60.0 48.1 5.9",
        "14.3 11.9 5.2 0.2 19.8 48.1 0.5",
    ),
    "XGen-7B-8k": (
        "18.0 18.1 37.7 14.8 29.7 21.1 10.3 11.0 27.3 20.5 26.2 2.2 65.5 77.8 25.3 20.5 38.6 38.6 2.1 8.5 3.5",
        "28.3 24.6 20.4 24.7 56.2 38.6 5.3",
        "15.1 14.8 11.0 2.2 20.5 38.6 3.5",
    ),
    "ChatGLM3-6B-32k": (
        "26.0 43.3 51.7 62.3 54.4 44.9 40.4 44.78 36.8 23.9 27.9 17.8 79.0 87.1 38.2 42.0 57.66 54.76 2.0 99.0 94.0",
        "48.5 40.3 46.6 29.5 68.1 56.2 50.5",
        "52.8 62.3 44.8 17.8 42.0 56.2 94.0",
    ),
}


@pytest.mark.parametrize("model", README)
def test_leaderboard_reproduces_the_readme_categories(model):
    per_task, english, chinese = README[model]
    board = lb.leaderboard(dict(zip(README_ORDER, map(float, per_task.split()), strict=True)))
    for language, row in (("English", english), ("Chinese", chinese)):
        assert list(board[language]) == ["Avg", *lb.GROUPS]
        for key, value in zip(board[language], map(float, row.split()), strict=True):
            assert abs(board[language][key] - value) <= 0.1 + 1e-9, (language, key)


def test_leaderboard_by_hand():
    board = lb.leaderboard({"narrativeqa": 30.0, "qasper": 40.0, "multifieldqa_zh": 70.0, "lcc": 50.0})
    assert board["English"]["Single-Doc QA"] == 35.0 and board["Chinese"]["Single-Doc QA"] == 70.0
    assert board["English"]["Code Completion"] == board["Chinese"]["Code Completion"] == 50.0  # code counts for both
    assert board["English"]["Summarization"] is None and board["English"]["Avg"] == 42.5  # mean of 35 and 50
    assert board["Chinese"]["Avg"] == 60.0
    assert lb.leaderboard({})["Chinese"]["Avg"] is None


def test_leaderboard_missing_names_what_each_category_lacks():
    every = [t for tasks in lb.GROUPS.values() for t in tasks]
    assert lb.leaderboard_missing(every) == {"English": {}, "Chinese": {}}
    missing = lb.leaderboard_missing(["narrativeqa", "qasper", "multifieldqa_en", "lcc"])
    assert "Single-Doc QA" not in missing["English"] and missing["English"]["Code Completion"] == ["repobench-p"]
    assert missing["Chinese"]["Single-Doc QA"] == ["multifieldqa_zh"]  # lcc alone in the Chinese row: incomplete
    assert missing["Chinese"]["Synthetic Tasks"] == ["passage_retrieval_zh"]


def test_hand_computed_values():
    # "the cat sat" -> "cat sat"; "a cat sat down" -> "cat sat down": 2 common, P = 2/2, R = 2/3,
    # F1 = 2 * 1 * (2/3) / (1 + 2/3) = (4/3) / (5/3) = 0.8
    assert lb.qa_f1("the cat sat", "a cat sat down", None) == pytest.approx(0.8)
    # ROUGE-L on word sets: reference {a, c} (m = 2), prediction {a, b, c} (n = 3), LCS "a c": R = 1, P = 2/3,
    # F = 2 * (2/3 * 1) / (2/3 + 1 + 1e-8)
    assert lb.rouge("a b c", "a c", None) == pytest.approx(2 * (2 / 3) / (5 / 3 + 1e-8), abs=1e-15)
    assert lb.rouge("a a a", "a", None) == pytest.approx(1.0)  # sets: repeats count once
    assert lb.rouge("", "a", None) == 0.0 and lb.rouge("...", "a", None) == 0.0
    # "abcd" vs "abce": 3 matching of 8 characters, ratio 2 * 3 / 8 = 0.75
    assert lb.code_sim("# note\nabcd", "abce", None) == 0.75 and lb.fuzz_ratio(None, "x") == 0
    # matches Location, Location of a city; the first is dropped (part of the reference): 1 / 1
    assert lb.classification("Location of a city", "Location of a city", ["Location", "Location of a city"]) == 1.0
    # three matches; "中国" is dropped and "足球" (shifted into its place) is never looked at: 1 / 2
    assert lb.classification("中国足球", "中国足球", ["中国", "足球", "中国足球"]) == 0.5
    assert lb.count("4, 4 and 5", "4", None) == 2 / 3 and lb.retrieval("Paragraph 2", "Paragraph 2", None) == 1.0
    assert lb.score_prediction("qa_f1", "\n\nParis\nRome", ["Paris", "Rome"], None, first_line=True) == 1.0
    assert lb.score_prediction("qa_f1", "Rome", [], None, first_line=False) == 0.0


def test_task_score_and_buckets_by_hand():
    assert lb.task_score([1.0, 0.5, 0.0]) == 50.0 and lb.task_score([1 / 3]) == 33.33
    assert lb.length_buckets([1.0, 0.0, 0.5], [3999, 4000, 8000]) == {"0-4k": 100.0, "4-8k": 0.0, "8k+": 50.0}
    assert lb.length_buckets([1.0], [100]) == {"0-4k": 100.0, "4-8k": None, "8k+": None}
    with pytest.raises(MegaevalError):
        lb.task_score([])


def test_v2_figures_by_hand():
    records = [{"judge": True, "pred": "A", "difficulty": "easy", "length": "short"},
               {"judge": False, "pred": None, "difficulty": "hard", "length": "long"},
               {"judge": False, "pred": "B", "difficulty": "Easy", "length": "Short"}]  # fmt: skip
    plain = lb.v2_figures(records)
    assert plain == {"overall": 33.3, "easy": 100.0, "hard": 0.0, "short": 100.0, "medium": None, "long": 0.0}
    # compensated: the None answer counts 0.25: overall 1.25 / 3, hard 0.25 / 2, long 0.25 / 2
    assert lb.v2_figures(records, compensated=True) == plain | {"overall": 41.7, "hard": 12.5, "long": 12.5}
    assert all(v is None for v in lb.v2_figures([]).values())


def test_jieba_loads_quietly(capfd, tmp_path):
    """jieba logs "Building prefix dict ..." to stderr whenever a dictionary loads: silenced once megaeval loads it."""
    jieba = lb._jieba()
    (tmp_path / "dict.txt").write_text("北京 3 ns\n", encoding="utf-8")
    tokenizer = jieba.Tokenizer(str(tmp_path / "dict.txt"))
    tokenizer.tmp_dir = str(tmp_path)  # its cache file goes here, not to /tmp
    tokenizer.initialize()  # a fresh (tiny) dictionary load, logging through the same logger
    # jieba's words 北京 / 是 / 首都 against 北京: P = 1/3, R = 1, F1 = 2 * (1/3) / (4/3) = 0.5
    assert lb.qa_f1_zh("北京是首都", "北京", None) == 0.5
    assert capfd.readouterr().err == ""
