"""MT-Bench's files read strictly (FastChat's shipped ones, and broken ones refused in one line), the judge matches
gen_judgment.py makes, and show_result.py's means against explicit loops and pandas' groupby (FastChat's own
script runs in test_fastchat_reference.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import pytest

from megaeval import MegaevalError
from megaeval.tasks.mtbench import data as mt
from megaeval.tasks.mtbench.data import Answers, Judgment, Question, builtin_data, load_answers, load_questions
from megaeval.tasks.mtbench.matches import make_matches
from megaeval.tasks.mtbench.results import mtbench_results
from megaeval.tasks.mtbench.tables import mtbench_parts

# FastChat's common.py temperature_config (published values, copied by hand)
FASTCHAT_TEMPERATURES = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0, "coding": 0.0,
                         "reasoning": 0.0, "stem": 0.1, "humanities": 0.1}  # fmt: skip


def test_fastchats_files_are_shipped_whole_and_read_as_they_are():
    data = builtin_data()
    for row in re.findall(r"\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{64})` \|", (data / "README.md").read_text()):
        assert hashlib.sha256((data / row[0]).read_bytes()).hexdigest() == row[1], row[0]
    questions = load_questions(data / "question.jsonl")
    assert len(questions) == 80 and all(len(q.turns) == 2 for q in questions)
    assert Counter(q.category for q in questions) == dict.fromkeys(FASTCHAT_TEMPERATURES, 10)
    assert {q.category: q.temperature for q in questions} == FASTCHAT_TEMPERATURES
    assert Question(1, "poetry", ("q",)).temperature == 0.7  # a category FastChat does not list
    reference = load_answers(data / "reference_answer" / "gpt-4.jsonl", "reference answer file")
    needs = [q for q in questions if q.category in ("math", "reasoning", "coding")]
    assert len(needs) == 30 and all(len(reference.turns[json.dumps(q.question_id)]) == 2 for q in needs)


def write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


Q = {"question_id": 1, "category": "writing", "turns": ["a", "b"]}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1]], r"line 1 is not a JSON object"),
        ([{**Q, "question_id": True}], r"line 1: question_id is True, not an integer or a text"),
        ([{**Q, "category": ""}], r"line 1: category missing or not text"),
        ([{k: v for k, v in Q.items() if k != "turns"}], r"line 1: turns missing or not a list of texts"),
        ([{**Q, "turns": ["a", 2]}], r"line 1: turns missing or not a list of texts"),
        ([Q, Q], r"line 2: question_id 1 a second time"),
        ([], r"holds no question"),
        (["{oops"], r"line 1"),
    ],
    ids=["not-an-object", "bool-id", "no-category", "no-turns", "turn-not-text", "twice", "empty", "not-json"],
)
def test_a_broken_question_file_is_one_line(tmp_path, rows, message):
    with pytest.raises(MegaevalError, match=message):
        load_questions(write(tmp_path / "question.jsonl", rows))


A = {"question_id": 1, "answer_id": "x", "model_id": "m", "choices": [{"index": 0, "turns": ["a1", "a2"]}], "tstamp": 0}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{**A, "choices": []}], r"line 1: choices\[0\]\.turns missing or not a list of texts"),
        ([{**A, "choices": [{"turns": "a1"}]}], r"choices\[0\]\.turns missing"),
        ([A, A], r"line 2: question_id 1 a second time \(FastChat would keep the last silently\)"),
        ([], r"holds no answer"),
    ],
    ids=["no-choices", "turns-a-string", "twice", "empty"],
)
def test_a_broken_answer_file_is_one_line(tmp_path, rows, message):
    with pytest.raises(MegaevalError, match=message):
        load_answers(write(tmp_path / "m.jsonl", rows))


def test_answers_must_answer_exactly_the_questions(tmp_path):
    questions = [Question(1, "writing", ("a", "b")), Question(2, "stem", ("c", "d"))]
    with pytest.raises(MegaevalError, match=r"has no answer to question 2 \(1 of 2 missing\)"):
        mt.check_answers(load_answers(write(tmp_path / "m.jsonl", [A])), questions)
    with pytest.raises(MegaevalError, match=r"answers question 3, which the question file lacks"):
        mt.check_answers(load_answers(write(tmp_path / "m.jsonl", [A, {**A, "question_id": 2},
                                                                {**A, "question_id": 3}])), questions)  # fmt: skip
    with pytest.raises(MegaevalError, match=r"question 2 has 2 turns, its answer 1"):
        one = {**A, "question_id": 2, "choices": [{"index": 0, "turns": ["only one"]}]}
        mt.check_answers(load_answers(write(tmp_path / "m.jsonl", [A, one])), questions)
    mt.check_answers(
        load_answers(write(tmp_path / "m.jsonl", [A, {**A, "question_id": 2}])), questions[:1], questions
    )  # --first-n 1: the answers to the other questions of the file are no error
    with pytest.raises(MegaevalError, match=r"is not a \.jsonl file"):
        load_answers(tmp_path / "m.json")


J = {"question_id": 81, "model": "m", "judge": ["gpt-4", "single-v1"], "user_prompt": "p", "judgment": "[[5]]",
     "score": 5, "turn": 1, "tstamp": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{**J, "score": "5"}], r"line 1: score is '5', not a number"),
        ([{**J, "score": float("nan")}], r"line 1: score is nan, not a number"),
        ([{**J, "turn": 3}], r"line 1: turn is 3, not 1 or 2"),
        ([{**J, "model": None}], r"line 1: model missing or not text"),
        ([{"question_id": 81, "model_1": "a", "model_2": "b", "g1_winner": "tie"}], r"is a pairwise judgment"),
        ([], r"holds no judgment"),
    ],
    ids=["score-text", "score-nan", "turn-3", "no-model", "pairwise", "empty"],
)
def test_a_broken_judgment_file_is_one_line(tmp_path, rows, message):
    with pytest.raises(MegaevalError, match=message):
        mt.load_judgments(write(tmp_path / "j.jsonl", rows))


def answers_of(model: str, questions: list[Question]) -> Answers:
    return Answers(model, None, None, {json.dumps(q.question_id): tuple(f"{model} {t}" for t in q.turns)
                                       for q in questions})  # fmt: skip


def test_matches_follow_gen_judgments_order_prompts_and_fields():
    questions = [Question(1, "writing", ("w1", "w2")), Question(2, "math", ("m1", "m2")),
                 Question(3, "stem", ("s1",)), Question(4, "coding", ("c1", "c2"))]  # fmt: skip
    reference = Answers("gpt-4", None, None, {"2": ("r1", "r2"), "4": ("R1", "R2")})
    matches = make_matches(questions, [answers_of("a", questions), answers_of("b", questions)], reference)
    got = [(m.prompt, m.question.question_id, m.model, m.turn) for m in matches]
    assert got == [("single-v1", 1, "a", 1), ("single-v1", 1, "b", 1), ("single-v1", 3, "a", 1),
                   ("single-v1", 3, "b", 1), ("single-math-v1", 2, "a", 1), ("single-math-v1", 2, "b", 1),
                   ("single-math-v1", 4, "a", 1), ("single-math-v1", 4, "b", 1),
                   ("single-v1-multi-turn", 1, "a", 2), ("single-v1-multi-turn", 1, "b", 2),  # 3 has one turn
                   ("single-math-v1-multi-turn", 2, "a", 2), ("single-math-v1-multi-turn", 2, "b", 2),
                   ("single-math-v1-multi-turn", 4, "a", 2), ("single-math-v1-multi-turn", 4, "b", 2)]  # fmt: skip
    assert matches[0].fields == {"question": "w1", "answer": "a w1"}
    assert matches[4].fields == {"question": "m1", "answer": "a m1", "ref_answer_1": "r1"}
    assert matches[-1].fields == {"question_1": "c1", "question_2": "c2", "answer_1": "b c1", "answer_2": "b c2",
                                  "ref_answer_1": "R1", "ref_answer_2": "R2"}  # fmt: skip
    with pytest.raises(MegaevalError, match=r"question 2 \(math\) is judged against a reference answer, and there is "
                       "none"):  # fmt: skip
        make_matches(questions, [answers_of("a", questions)], None)
    short = Answers("gpt-4", None, None, {"2": ("r1",), "4": ("R1", "R2")})
    with pytest.raises(MegaevalError, match=r"have no answer to every turn of question 2 \(math\)"):
        make_matches(questions, [answers_of("a", questions)], short)


JUDGED = [Judgment(81, "a", 1, 8), Judgment(81, "a", 2, 6.5), Judgment(82, "a", 1, -1), Judgment(82, "a", 2, 3),
          Judgment(101, "a", 1, 10), Judgment(101, "a", 2, 9), Judgment(81, "b", 1, 2), Judgment(81, "b", 2, -1),
          Judgment(82, "b", 1, 7.25), Judgment(101, "b", 2, 1), Judgment(81, "a", 1, 4)]  # fmt: skip
CATEGORIES = [Question(81, "writing", ("x", "y")), Question(82, "roleplay", ("x", "y")), Question(101, "math", ("x",
              "y"))]  # fmt: skip


def test_the_means_are_show_results_and_the_radar_charts():
    res = mtbench_results(JUDGED, CATEGORIES)
    for model in ("a", "b"):
        mine = [j for j in JUDGED if j.model == model and j.score != -1]
        row = res["models"][model]
        for turn in (1, 2):
            scores = [j.score for j in mine if j.turn == turn]
            assert row[f"turn_{turn}"] == pytest.approx(sum(scores) / len(scores))
            assert row["rated"][f"turn_{turn}"] == len(scores)
        assert row["overall"] == pytest.approx(sum(j.score for j in mine) / len(mine))  # every rated turn pooled
        assert row["unrated"] == sum(j.model == model and j.score == -1 for j in JUDGED)
        cats = {q.question_id: q.category for q in CATEGORIES}
        for category, mean in row["categories"].items():
            scores = [j.score for j in mine if cats[j.question_id] == category]
            assert mean == (pytest.approx(sum(scores) / len(scores)) if scores else None)
    assert list(res["models"]) == ["a", "b"] and res["categories_known"]
    assert mt.repeated(JUDGED) == 1
    pandas = pytest.importorskip("pandas")  # show_result.py's own reading, on the same rows
    df = pandas.DataFrame([vars(j) for j in JUDGED])[["model", "score", "turn"]]
    df = df[df["score"] != -1]
    assert df.groupby("model")["score"].mean().to_dict() == pytest.approx({m: r["overall"] for m, r in
                                                                            res["models"].items()})  # fmt: skip
    unknown = mtbench_results(JUDGED, CATEGORIES[:2])
    assert not unknown["categories_known"] and unknown["models"]["a"]["categories"] is None


def test_the_tables_show_the_means_and_a_damaged_report_is_one_line():
    res = {**mtbench_results(JUDGED, CATEGORIES), "judged": True}
    (title, header, rows), (_, cats, cells) = mtbench_parts(res)
    assert header == ["model", "first turn", "second turn", "average", "rated", "unrated"]
    assert rows[0][:4] == ["a", f"{(8 + 10 + 4) / 3:.2f}", f"{(6.5 + 3 + 9) / 3:.2f}", f"{40.5 / 6:.2f}"]
    assert cats == ["model", "writing", "roleplay", "math"] and cells[1] == ["b", "2.00", "7.25", "1.00"]
    broken = json.loads(json.dumps(res))
    broken["models"]["a"]["turn_1"] = "eight"
    with pytest.raises(MegaevalError, match=r"results\.models\.a\.turn_1 is 'eight', not a number or null"):
        mtbench_parts(broken)
    del broken["models"]["a"]["rated"]["turn_2"]
    broken["models"]["a"]["turn_1"] = 8
    with pytest.raises(MegaevalError, match=r"results\.models\.a\.rated\.turn_2 is missing, not a count"):
        mtbench_parts(broken)
