"""`megaeval mtbench` with a real model and a real served judge: SmolLM2-135M-Instruct answers two MT-Bench questions
in this process and behind `transformers serve` (its chat API: the server's template, the same as the in-process
one: the same answers), a served SmolLM2 judges the served run's (its ratings mean nothing at this size: the
pipeline, FastChat's files and resume are the point), and the served run, killed while judging, resumes without
sending any request twice, counted at the server. Integration tier, as tests/serving/test_served.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megaeval.tasks.mtbench.data import builtin_data
from megaeval_testing.servers import FaultProxy

from .test_served import ENV, lines, megaeval, ok

pytestmark = pytest.mark.integration

# greedy categories (FastChat answers extraction and reasoning at temperature 0), so that both runs agree
QUESTION_IDS = (131, 101)


@pytest.fixture
def data(tmp_path) -> Path:
    """A --data folder of two MT-Bench questions, one needing GPT-4's reference answer, in FastChat's layout."""
    folder = tmp_path / "data"
    (folder / "reference_answer").mkdir(parents=True)
    rows = [x for x in (builtin_data() / "question.jsonl").read_text().splitlines()
            if json.loads(x)["question_id"] in QUESTION_IDS]  # fmt: skip
    (folder / "question.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "reference_answer" / "gpt-4.jsonl").write_bytes((builtin_data() / "reference_answer" /
                                                               "gpt-4.jsonl").read_bytes())  # fmt: skip
    return folder


def args(data: Path, name: str, judge: FaultProxy | None, folder: Path) -> list[str]:
    judging = [] if judge is None else ["--judge", f"openai:{judge.url}", "--judge-args",
                                        f"tokenizer={folder},api=chat,concurrency=1", "--judge-max-tokens", "24",
                                        "--judge-id", "smol-judge"]  # fmt: skip
    return ["mtbench", "--data", str(data), "--max-new-tokens", "16", *judging, "--output-dir", name, "--out",
            f"{name}.json", "--batch-size", "2"]  # fmt: skip


def test_served_answers_equal_in_process_ones_and_a_run_killed_while_judging_asks_nothing_twice(
    proxy, server, folder, data, tmp_path
):  # fmt: skip
    ok(megaeval([*args(data, "local", None, folder), "--model", f"hf:{folder}", "--model-id", "smol"], tmp_path))
    second = FaultProxy(server.url)  # the served run's own count of requests
    try:
        served = ["--model", f"openai:{second.url}", "--model-args", f"tokenizer={folder},api=chat,concurrency=1",
                  "--model-id", "smol"]  # fmt: skip
        argv = [sys.executable, "-m", "megaeval", *args(data, "served", second, folder), *served]
        # four answers, two judgments, then the third judge request held at the proxy (never reaching the server):
        # the kill lands while the run judges, with no request answered by the server and not yet by the client
        second.faults = ["pass"] * 6 + ["slow:600"]
        run = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        journal = tmp_path / "served.json.partial.jsonl"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and run.poll() is None:
            if len(second.posts) >= 7 and journal.read_bytes().count(b'"_role": "judge"') >= 2:
                break
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        run.wait(60)
        held = journal.read_text()
        assert held.count('"_role": "judge"') == 2 and held.count('"_role": "model"') == 4
        ok(megaeval([*args(data, "served", second, folder), *served, "--resume"], tmp_path))
        sent = [json.dumps(b, sort_keys=True) for b in second.answered_bodies()]
        assert len(sent) == len(set(sent)) == 4 + 4  # two questions' two turns answered, then four judgments
    finally:
        second.close()
    local_answers, served_answers = (lines(tmp_path / d / "model_answer" / "smol.jsonl") for d in ("local", "served"))
    assert [a["choices"] for a in served_answers] == [a["choices"] for a in local_answers]
    assert all(t for a in local_answers for t in a["choices"][0]["turns"])
    judged = lines(tmp_path / "served" / "model_judgment" / "smol-judge_single.jsonl")
    assert [(j["question_id"], j["turn"], j["judge"][1]) for j in judged] == [
        (131, 1, "single-v1"), (101, 1, "single-math-v1"), (131, 2, "single-v1-multi-turn"),
        (101, 2, "single-math-v1-multi-turn")]  # fmt: skip
    assert "[The Start of Reference Answer]" in judged[1]["user_prompt"]
    first = next(a for a in local_answers if a["question_id"] == 131)["choices"][0]["turns"][0]
    assert f"[The Start of Assistant's Answer]\n{first}\n" in judged[0]["user_prompt"]
    report = json.loads((tmp_path / "served.json").read_text())
    scores = {(j["question_id"], j["turn"]): j["score"] for j in judged}
    assert report["results"]["models"]["smol"]["unrated"] == sum(s == -1 for s in scores.values())
    assert report["data"]["judge"]["serving"]["requests"] == 4 and report["environment"]["serving"]["requests"] == 4
    assert report["data"]["judge"]["settings"] == {"temperature": 0.0, "max_tokens": 24}
    bodies = second.answered_bodies()
    assert all(b["temperature"] == 0 and b["max_tokens"] in (16, 24) for b in bodies)
