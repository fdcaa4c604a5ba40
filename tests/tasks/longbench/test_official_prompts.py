"""megaeval's LongBench prompts and truncation (megaeval.tasks.longbench.prompts) against what THUDM/LongBench's own
code builds on the fixtures: tests/fixtures/longbench/official_prompts.json.gz, written by
data_prep/longbench/official_prompts.py, which runs LongBench/pred.py `get_pred` (v1) and the root pred.py
`get_pred` (v2) with real transformers tokenizers, a recording fake model and a recording fake API client."""

from __future__ import annotations

import gzip
import hashlib
import json
from functools import cache
from typing import Any

import pytest

from megaeval.metrics.longbench import extract_answer
from megaeval.models import load_tokenizer
from megaeval.tasks.longbench.prompts import special_ids, truncate_v1, truncate_v2, v1_prompt, v2_prompt
from megaeval.tasks.longbench.spec import load_longbench_task, v2_templates
from megaeval_testing import REPO

FIXTURES = REPO / "tests" / "fixtures" / "longbench"
TOKENIZERS = {"transformer-tiny": "embedded:transformer-tiny", "bpe-bos": str(FIXTURES / "tokenizer-bpe-bos")}


@cache
def official() -> dict[str, Any]:
    return json.loads(gzip.decompress((FIXTURES / "official_prompts.json.gz").read_bytes()).decode("utf-8"))


def text(index: int) -> Any:
    return official()["texts"][index]


@cache
def tokenizer(name: str) -> Any:
    return load_tokenizer(TOKENIZERS[name])


@cache
def task(name: str) -> dict[str, Any]:
    return load_longbench_task(name)


@cache
def records(file: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / "v1" / "data" / f"{file}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@cache
def v2_items() -> list[dict[str, Any]]:
    return json.loads((FIXTURES / "v2" / "data.json").read_text(encoding="utf-8"))


def test_recorded_on_these_fixtures_and_task_files() -> None:
    """The expected values were made from the fixture files as they are, and with the prompts, budgets and v2
    templates that megaeval's task files hold."""
    header, v1 = official()["header"], official()["v1"]
    for name, sha in header["fixtures_sha256"].items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == sha, f"{name} changed: rerun the script"
    assert len(v1["templates"]) == 21
    for name, template in v1["templates"].items():
        spec = task(name)
        assert (spec["prompt"], spec["max_new_tokens"]) == (template, v1["budgets"][name]), name
    assert v2_templates() == official()["v2"]["templates"]


def test_cases_cover_cuts_and_whole_prompts() -> None:
    cases = official()["v1"]["cases"]
    files = {c["file"] for c in cases}
    assert len(files) == 34 and all(len(records(f)) == (3 if f.endswith("_e") else 2) for f in files)
    for name in TOKENIZERS:
        mine = [c for c in cases if c["tokenizer"] == name]
        assert {c["max_length"] % 2 for c in mine if c["prompt_tokens"] > c["max_length"]} == {0, 1}
        assert sum(c["prompt_tokens"] <= c["max_length"] for c in mine) >= 20
        assert any(c["prompt_tokens"] == c["max_length"] for c in mine)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_v1_prompts_equal_the_official(name: str) -> None:
    """For every recorded case: the prompt's token count, the truncated prompt (before any chat format), the ids
    fed on the tasks without chat format, and the generation arguments."""
    tok, v1 = tokenizer(name), official()["v1"]
    cases = [c for c in v1["cases"] if c["tokenizer"] == name]
    assert len(cases) > 150
    for case in cases:
        where = f"{name} {case['file']}[{case['index']}] max_length={case['max_length']}"
        spec, record = task(case["task"]), records(case["file"])[case["index"]]
        prompt = v1_prompt(spec["prompt"], record)
        n = len(special_ids(tok, prompt))
        assert n == case["prompt_tokens"], where
        cut, dropped = truncate_v1(tok, prompt, case["max_length"])
        assert cut == text(case["prompt"]), where
        assert dropped == (n - 2 * int(case["max_length"] / 2) if n > case["max_length"] else 0), where
        fed = special_ids(tok, cut).tolist()
        assert spec["chat"] == ("input_ids" not in case), where  # pred.py's tasks without build_chat
        if spec["chat"]:
            assert len(fed) == case["input_tokens"], where
        else:
            assert fed == text(case["input_ids"]), where
        generate = case["generate"]
        assert generate["max_new_tokens"] == spec["max_new_tokens"], where
        assert (generate["num_beams"], generate["do_sample"]) == (1, False), where
        if spec["stop_at_newline"]:  # samsum: EOS or the last token of "\n" stops; at least one new token
            assert generate["eos_token_id"] == [tok.eos_id, tok.encode("\n")[-1]], where
            assert generate["min_length"] == len(fed) + 1, where
        else:
            assert "eos_token_id" not in generate and "min_length" not in generate, where
        line = case["line"]
        assert line == {"pred": v1["reply"], "answers": record["answers"], "all_classes": record["all_classes"],
                        "length": record["length"]}, where  # fmt: skip


@pytest.mark.parametrize("name", TOKENIZERS)
def test_v2_prompts_equal_the_official(name: str) -> None:
    """Every request pred.py sent (plain, --cot's two, --no_context): its message is the template filled and cut as
    megaeval does it; the budget is 1024 for the reasoning and 128 otherwise, the temperature 0.1."""
    tok, templates, items = tokenizer(name), v2_templates(), v2_items()
    runs = [c for c in official()["v2"]["cases"] if c["tokenizer"] == name]
    assert {(c["mode"], c["max_length"]) for c in runs} == {(m, n) for m in ("0shot", "cot", "no_context")
                                                            for n in official()["v2"]["max_lengths"]}  # fmt: skip
    cuts = 0
    for run in runs:
        for query in run["queries"]:
            where = f"{name} {run['mode']} max_len={run['max_length']} item {query['item']} {query['template']}"
            item = items[query["item"]]
            prompt = v2_prompt(templates[query["template"]], item, item["context"], query.get("cot"))
            cut, dropped = truncate_v2(tok, prompt, run["max_length"])
            assert cut == text(query["content"]), where
            cuts += dropped > 0
            assert query["max_tokens"] == (1024 if query["template"] == "0shot_cot" else 128), where
            assert query["temperature"] == 0.1, where
    assert cuts > 10


def test_v2_lines_skip_empty_outputs_and_extract_as_the_official() -> None:
    """pred.py writes no line for an item whose reasoning or answer came back empty, and its `pred` is what
    megaeval's extract_answer gives on the stripped response."""
    v2, items = official()["v2"], v2_items()
    for run in v2["cases"]:
        canned = v2["canned"][run["mode"]]
        assert [line["item"] for line in run["lines"]] == [i for i, out in enumerate(canned) if "" not in out]
        for line in run["lines"]:
            assert line["response"] == canned[line["item"]][-1].strip()
            assert line["pred"] == extract_answer(line["response"])
            assert line["judge"] == (line["pred"] == items[line["item"]]["answer"])
    preds = {line["pred"] for run in v2["cases"] for line in run["lines"]}
    assert None in preds and {"A", "B", "C", "D"} <= preds
