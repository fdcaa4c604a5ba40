"""MT-Bench against FastChat's own code (fschat 0.2.36, whose llm_judge is 0e6d3e4's, the commit the shipped files
come from): the judge prompts megaeval sends equal those `fastchat.llm_judge.common.run_judge_single` builds for a
recording stand-in judge, for every question of every category and both turns, reference answers where FastChat
uses them; the rating read from a reply equals FastChat's; and `--judgments` prints show_result.py's numbers, run as
a script. Integration tier: FastChat is installed by `make setup-all`."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from megaeval.judging.parse import rating
from megaeval.judging.prompts import judge_prompt, load_judge_prompts
from megaeval.tasks.mtbench.data import builtin_data, load_answers, load_questions
from megaeval.tasks.mtbench.matches import make_matches
from megaeval_testing import REPO

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fastchat():
    """FastChat's llm_judge.common, imported when a test asks for it (about 8 s: not at every collection)."""
    return pytest.importorskip("fastchat.llm_judge.common")  # MEGAEVAL_REQUIRE_OPTIONAL=1: a failure instead


class Recorder:
    """A stand-in for FastChat's OpenAI judge: it records the conversation it is asked and replies as told."""

    def __init__(self, reply: str = "Rating: [[5]]"):
        self.reply, self.asked = reply, []

    def __call__(self, model, conv, temperature, max_tokens, api_dict=None):
        self.asked.append((conv.to_openai_api_messages(), temperature, max_tokens))
        return self.reply


def fastchat_judges(fastchat, prompts_file) -> dict:
    prompts = fastchat.load_judge_prompts(str(prompts_file))
    return {"single-v1": fastchat.Judge("gpt-4", prompts["single-v1"]),
            "single-math-v1": fastchat.Judge("gpt-4", prompts["single-math-v1"], ref_based=True),
            "single-v1-multi-turn": fastchat.Judge("gpt-4", prompts["single-v1-multi-turn"], multi_turn=True),
            "single-math-v1-multi-turn": fastchat.Judge("gpt-4", prompts["single-math-v1-multi-turn"], ref_based=True,
                                                        multi_turn=True)}  # fmt: skip


def test_every_judge_prompt_megaeval_sends_is_the_one_fastchat_builds(fastchat, monkeypatch, tmp_path):
    """All 160 judgments of MT-Bench (80 questions, two turns) of a model whose answers hold braces and quotes."""
    data = builtin_data()
    questions = load_questions(data / "question.jsonl")
    raw = {q["question_id"]: q for q in map(json.loads, (data / "question.jsonl").read_text().splitlines())}
    answer_file = tmp_path / "my-model.jsonl"
    turns = [[f'First {{answer}} to {i}: "{q.turns[0][:20]}"', f"Second [[answer]] {i}"]
             for i, q in enumerate(questions)]  # fmt: skip
    answer_file.write_text("".join(json.dumps({"question_id": q.question_id, "answer_id": "x", "model_id": "my-model",
                                               "choices": [{"index": 0, "turns": t}], "tstamp": 0.0}) + "\n"
                                   for q, t in zip(questions, turns, strict=True)))  # fmt: skip
    answers = load_answers(answer_file)
    reference = load_answers(data / "reference_answer" / "gpt-4.jsonl", "reference answer file")
    ours = load_judge_prompts()
    matches = make_matches(questions, [answers], reference)
    judges = fastchat_judges(fastchat, data / "judge_prompts.jsonl")
    assert len(matches) == 160 and {m.prompt for m in matches} == set(judges)

    recorder = Recorder()
    monkeypatch.setattr(fastchat, "chat_completion_openai", recorder)
    their_answers = {json.loads(x)["question_id"]: json.loads(x) for x in answer_file.read_text().splitlines()}
    refs = fastchat.load_model_answers(str(data / "reference_answer"))["gpt-4"]
    for m in matches:
        judge = judges[m.prompt]
        qid = m.question.question_id
        ref = refs[qid] if judge.ref_based else None
        score, user_prompt, _ = fastchat.run_judge_single(raw[qid], their_answers[qid], judge, ref, judge.multi_turn)
        messages, temperature, max_tokens = recorder.asked[-1]
        assert list(judge_prompt(ours, m.prompt).render(m.fields)) == messages, (qid, m.turn)
        assert user_prompt == messages[-1]["content"] and (temperature, max_tokens) == (0, 2048) and score == 5
    assert len(recorder.asked) == 160


REPLIES = ["Rating: [[8]]", "[[7.5]] then [[2]]", "Rating: [9]", "[3] then [[8]]", "8/10", "[[eight]]", "[[10.]]",
           "[[0]]", "Rating: [[ 6 ]]", "[[6.25]] [6]", "", "[[1, 2]]", "[2.] ok", "[[5]"]  # fmt: skip


@pytest.mark.parametrize("reply", REPLIES)
def test_a_rating_is_read_as_fastchats_own_code_reads_it(fastchat, monkeypatch, reply):
    monkeypatch.setattr(fastchat, "chat_completion_openai", Recorder(reply))
    judge = fastchat_judges(fastchat, builtin_data() / "judge_prompts.jsonl")["single-v1"]
    question = {"question_id": 1, "category": "writing", "turns": ["q"]}
    theirs, _, _ = fastchat.run_judge_single(question, {"choices": [{"turns": ["a"]}]}, judge, None)
    ours = rating(reply)
    assert ours == theirs and type(ours) is type(theirs)


def show_result(path) -> dict[str, dict[int | str, float]]:
    """show_result.py --mode single, run as a script: its printed means by table ('1', '2', 'average') and model."""
    out = subprocess.run([sys.executable, "-m", "fastchat.llm_judge.show_result", "--input-file", str(path),
                          "--bench-name", "mt_bench", "--mode", "single"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    tables: dict = {}
    table = None
    for line in out.splitlines():
        heading = re.match(r"#+ (First turn|Second turn|Average) #+", line)
        if heading:
            table = {"First turn": "1", "Second turn": "2", "Average": "average"}[heading.group(1)]
            tables[table] = {}
            continue
        row = re.match(r"^(\S+)\s+(?:\d\s+)?(-?\d+\.\d+)$", line.strip())
        if table and row and row.group(1) not in ("model", "score"):
            tables[table][row.group(1)] = float(row.group(2))
    return tables


@pytest.mark.usefixtures("fastchat")  # show_result.py is FastChat's
def test_judgments_print_show_results_numbers(tmp_path):
    """Two judgment files (FastChat's format, three models, unrated replies, decimals, a repeated judgment as a rerun
    of gen_judgment.py appends): `megaeval mtbench --judgments` equals show_result.py on their concatenation."""
    lines = []
    for i, (model, turn, score) in enumerate([("alpha", 1, 8), ("alpha", 2, 6.5), ("alpha", 1, -1), ("beta", 1, 3),
                                              ("beta", 2, 9), ("beta", 2, 7.25), ("gamma", 1, 10), ("gamma", 2, -1),
                                              ("gamma", 2, 2), ("alpha", 1, 4)]):  # fmt: skip
        qid = 81 + i % 4 if i < 9 else 81  # the last judges alpha's turn 1 of question 81 a second time
        lines.append({"question_id": qid, "model": model, "judge": ["gpt-4", "single-v1"], "user_prompt": "p",
                      "judgment": f"[[{score}]]", "score": score, "turn": turn, "tstamp": 1.0})  # fmt: skip
    first, second = tmp_path / "a_single.jsonl", tmp_path / "b_single.jsonl"
    first.write_text("".join(json.dumps(x) + "\n" for x in lines[:5]))
    second.write_text("".join(json.dumps(x) + "\n" for x in lines[5:]))
    both = tmp_path / "both_single.jsonl"
    both.write_text(first.read_text() + second.read_text())
    theirs = show_result(both)
    argv = ["mtbench", "--judgments", str(first), "--judgments", str(second), "--out", str(tmp_path / "r.json")]
    run = subprocess.run([sys.executable, "-m", "megaeval", *argv], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    models = json.loads((tmp_path / "r.json").read_text())["results"]["models"]
    for table, field in (("1", "turn_1"), ("2", "turn_2"), ("average", "overall")):
        assert theirs[table] == {m: round(r[field], 6) for m, r in models.items()}, table
    assert list(models) == list(theirs["average"])  # best first, as show_result.py sorts
    assert json.loads((tmp_path / "r.json").read_text())["results"]["repeated_judgments"] == 1
