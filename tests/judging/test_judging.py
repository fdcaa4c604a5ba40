"""Judge prompts as data, replies parsed as FastChat's llm_judge parses them, the reply cache (default tier; a real
judge model, in this process and behind a server, is tests/serving/test_judge.py's)."""

from __future__ import annotations

import json

import pytest

from megaeval import MegaevalError
from megaeval.judging.judge import JudgeCache, JudgeSettings
from megaeval.judging.parse import NO_RATING, rating, verdict
from megaeval.judging.prompts import builtin_judge_prompts, judge_prompt, load_judge_prompts

FASTCHAT = ["pair-v2", "pair-v2-multi-turn", "pair-math-v1", "pair-math-v1-multi-turn", "single-v1",
            "single-math-v1", "single-v1-multi-turn", "single-math-v1-multi-turn"]  # fmt: skip


def test_fastchats_judge_prompts_are_shipped_and_read_as_they_are():
    prompts = load_judge_prompts()
    assert list(prompts) == FASTCHAT
    raw = [json.loads(line) for line in builtin_judge_prompts().read_text(encoding="utf-8").splitlines()]
    for row in raw:
        p = prompts[row["name"]]
        assert (p.type, p.system_prompt, p.prompt_template, p.output_format) == (
            row["type"], row["system_prompt"], row["prompt_template"], row["output_format"])  # fmt: skip
    assert prompts["single-v1"].placeholders == ("question", "answer")
    assert set(prompts["single-math-v1-multi-turn"].placeholders) == {
        "question_1", "question_2", "answer_1", "answer_2", "ref_answer_1", "ref_answer_2"}  # fmt: skip


def test_a_prompt_renders_as_fastchats_conversation():
    """FastChat's judge conversation for an OpenAI model: the system message, then the filled template as the user."""
    single = judge_prompt(load_judge_prompts(), "single-v1")
    turns = single.render({"question": "What is 2+2?", "answer": "4, {of course}"})
    assert turns == ({"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": single.prompt_template.format(question="What is 2+2?",
                                                                               answer="4, {of course}")})  # fmt: skip
    assert "[Question]\nWhat is 2+2?\n\n[The Start of Assistant's Answer]\n4, {of course}\n" in turns[1]["content"]
    with pytest.raises(MegaevalError, match=r"single-v1 asks for answer, which this judging gives it no value for"):
        single.render({"question": "q"})
    with pytest.raises(MegaevalError, match=r"no judge prompt named 'single-v2'; use one of: pair-v2, "):
        judge_prompt(load_judge_prompts(), "single-v2")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", r"line 1 is not a JSON object"),
        (
            '{"name": "x", "type": "single", "system_prompt": "s", "prompt_template": 5, '
            '"output_format": "[[rating]]"}',
            r"line 1: prompt_template missing or not text",
        ),
        (
            '{"name": "x", "type": "triple", "system_prompt": "s", "prompt_template": "t", "output_format": "[[A]]"}',
            r"line 1: type 'triple'; use one of: single, pairwise",
        ),
        (
            '{"name": "x", "type": "single", "system_prompt": "s", "prompt_template": "t", "output_format": "[[A]]"}',
            r"line 1: output_format '\[\[A\]\]' for a single prompt; use one of: \[\[rating\]\]",
        ),
        (
            '{"name": "x", "type": "single", "system_prompt": "s", "prompt_template": "a {b", "output_format": '
            '"[[rating]]"}',
            r"line 1: prompt_template is not a format string",
        ),
        ("", r"holds no prompt"),
    ],
    ids=["not-an-object", "template-not-text", "bad-type", "format-of-the-other-type", "lone-brace", "empty"],
)
def test_a_broken_judge_prompt_file_is_one_line(tmp_path, line, message):
    path = tmp_path / "judge.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(MegaevalError, match=message):
        load_judge_prompts(path)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The answer is right. Rating: [[8]]", 8),
        ("Rating: [[7.5]] and later [[2]]", 7.5),  # the first match
        ("Rating: [9] (no double brackets)", 9),  # the backup pattern
        ("[[8]] then [3]", 8),  # the main pattern wins over an earlier backup
        ("[3] then [[8]]", 8),
        ("Rating: 8/10", NO_RATING),
        ("[[eight]]", NO_RATING),
        ("[[10.]]", 10.0),
    ],
)
def test_a_rating_is_read_as_fastchat_reads_it(reply, expected):
    got = rating(reply)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("reply", "fmt", "expected"),
    [
        ("[[A]]", "[[A]]", "A"),
        ("[[B]] but [[A]]", "[[A]]", "A"),  # FastChat tests [[A]] first, wherever it is
        ("[[C]]", "[[A]]", "tie"),
        ("A is better", "[[A]]", "error"),
        ("[[8, 6]]", "[[rating_a,rating_b]]", "A"),
        ("[6,8]", "[[rating_a,rating_b]]", "B"),
        ("[[7, 7.1]]", "[[rating_a,rating_b]]", "tie"),  # within TIE_DELTA
        ("[[7, 7.2]]", "[[rating_a,rating_b]]", "B"),
        ("[[7]]", "[[rating_a,rating_b]]", "error"),
    ],
)
def test_a_pairwise_verdict_is_read_as_fastchat_reads_it(reply, fmt, expected):
    assert verdict(reply, fmt) == expected


def test_the_cache_keeps_replies_across_opens_and_refuses_a_broken_line(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = JudgeCache(path)
    cache.add("k1", "Rating: [[5]]")
    cache.add("k2", "ünïcode [[A]]")
    assert JudgeCache(path).replies == {"k1": "Rating: [[5]]", "k2": "ünïcode [[A]]"}
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"key": "k3"}\n')
    with pytest.raises(MegaevalError, match=r"judge cache .* line 3 is not a \{key, reply\} record"):
        JudgeCache(path)
    assert JudgeCache(None).replies == {}


def test_judge_settings_are_checked():
    assert JudgeSettings() == JudgeSettings(0.0, 2048)  # FastChat's: temperature 0, 2,048 tokens
    with pytest.raises(MegaevalError, match="bad judge settings"):
        JudgeSettings(max_tokens=0)
