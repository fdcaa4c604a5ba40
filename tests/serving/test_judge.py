"""A real judge: SmolLM2-135M-Instruct grading answers with FastChat's single-v1 prompt, in this process (its chat
template) and behind `transformers serve` (its chat API): the same replies, read as FastChat reads them, and a
second judging of the same answers asks the judge nothing (integration tier, as tests/serving/test_served.py)."""

from __future__ import annotations

import json

import pytest

from megaeval.judging.judge import Judge, JudgeSettings
from megaeval.judging.parse import rating
from megaeval.judging.prompts import judge_prompt, load_judge_prompts
from megaeval.runs.run import open_answerer

pytestmark = pytest.mark.integration

ANSWERS = [("What is the capital of France?", "The capital of France is Paris."),
           ("Write a haiku about the sea.", "Waves fold into foam / the gull counts the tide's slow breath / salt on "
            "the wind's tongue")]  # fmt: skip


def test_a_served_judge_equals_the_same_judge_in_process_and_its_cache_asks_nothing_twice(proxy, folder, tmp_path):
    prompt = judge_prompt(load_judge_prompts(), "single-v1")
    asks = [(prompt, {"question": q, "answer": a}) for q, a in ANSWERS]
    settings = JudgeSettings(max_tokens=48)  # short replies keep the test quick; FastChat's judges get 2,048
    local = Judge(open_answerer(f"hf:{folder}", {}), settings)
    served = Judge(open_answerer(f"openai:{proxy.url}", {"tokenizer": str(folder), "api": "chat"}), settings,
                   cache=tmp_path / "cache.jsonl")  # fmt: skip
    mine, theirs = local.judge(asks), served.judge(asks)
    assert [j.reply for j in theirs] == [j.reply for j in mine] and all(j.reply for j in mine)
    assert [j.score for j in theirs] == [rating(j.reply) for j in theirs]
    bodies = proxy.answered_bodies()
    sent = sorted(json.dumps(b["messages"]) for b in bodies)  # requests in flight together arrive in any order
    assert sent == sorted(json.dumps(list(prompt.render({"question": q, "answer": a}))) for q, a in ANSWERS)
    assert all(b["temperature"] == 0 and b["max_tokens"] == 48 for b in bodies)
    again = Judge(open_answerer(f"openai:{proxy.url}", {"tokenizer": str(folder), "api": "chat"}), settings,
                  cache=tmp_path / "cache.jsonl")  # fmt: skip
    before = len(proxy.answered_bodies())
    replay = again.judge(asks)
    assert len(proxy.answered_bodies()) == before and again.asked == 0 and all(j.cached for j in replay)
    assert [j.reply for j in replay] == [j.reply for j in theirs]
    facts = served.facts([prompt])
    assert facts["model"]["served_model"] == str(folder) and facts["settings"] == {"temperature": 0.0, "max_tokens": 48}
    assert facts["prompts"] == {"single-v1": prompt.sha256} and facts["template"]["name"] == "default"
