"""`megaeval longbench` end to end: a model given the answers scores 100 on every v1 task and v2 figure (and one
answering wrong, 0), the official prediction files it writes rescore to the same table, an empty v2 output is left
out as pred.py leaves it out, --cot reads its reasoning back, seeded sampling repeats at any batch size, a resumed run
equals one run, and bad input is one line."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.longbench import LongbenchSettings, run_longbench
from megaeval.errors import MegaevalError
from megaeval.tasks.longbench.data import read_v1, read_v2
from megaeval.tasks.longbench.prompts import v1_prompt, v2_prompt
from megaeval.tasks.longbench.spec import load_longbench_task, v2_templates
from megaeval_testing import REPO
from megaeval_testing.oracle import save_oracle

FIXTURES = REPO / "tests" / "fixtures" / "longbench"
V1, V2 = FIXTURES / "v1", FIXTURES / "v2" / "data.json"
# one task of every metric, the raw (no chat) and first-line rules, samsum's newline stop, both languages
TASKS = ("qasper", "multifieldqa_zh", "vcsum", "gov_report", "trec", "samsum", "lsht", "passage_count",
         "passage_retrieval_en", "passage_retrieval_zh", "lcc")  # fmt: skip


def v1_oracle(tmp_path, answer=lambda r: r["answers"][0]):
    pairs = []
    for task in TASKS:
        spec = load_longbench_task(task)
        pairs += [(v1_prompt(spec["prompt"], r), answer(r)) for r in read_v1(str(V1), task, False)[0]]
    return str(save_oracle(tmp_path / "oracle", answers=pairs))


def v2_oracle(tmp_path, answer, template="0shot"):
    items = read_v2(str(V2))[0]
    pairs = [(v2_prompt(v2_templates()[template], x, x["context"]), answer(x)) for x in items]
    return str(save_oracle(tmp_path / "oracle", answers=pairs)), items


def test_v1_a_model_given_the_answers_scores_100_and_its_predictions_rescore_alike(tmp_path):
    settings = LongbenchSettings(model=v1_oracle(tmp_path), data=str(V1), tasks=",".join(TASKS),
                                 out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    report = run_longbench(settings, progress=False)
    tasks = report["results"]["tasks"]
    assert {t: (row["score"], row["n"], row["truncated"]) for t, row in tasks.items()} == {
        t: (100.0, 2, 0) for t in TASKS
    }
    board = report["results"]["leaderboard"]
    assert board["English"]["Avg"] == board["Chinese"]["Avg"] == 100.0
    assert report["settings"]["max_prompt_tokens_effective"] == "the whole prompt"
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert {s["stop_reason"] for s in samples if s["task"] == "samsum"} <= {"eos", "stop_id"}
    # pred.py's files from the samples: --predictions scores them as eval.py does
    pred = tmp_path / "pred"
    pred.mkdir()
    for task in TASKS:
        rows = [{"pred": s["prediction"], "answers": s["answers"], "all_classes": r["all_classes"],
                 "length": r["length"]} for s, r in zip([s for s in samples if s["task"] == task],
                                                        read_v1(str(V1), task, False)[0], strict=True)]  # fmt: skip
        (pred / f"{task}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    again = run_longbench(LongbenchSettings(predictions=str(pred), out=str(tmp_path / "p.json")), progress=False)
    keys = ("score", "n", "metric", "truncated", "tokens_dropped")
    assert {t: {k: row[k] for k in keys} for t, row in again["results"]["tasks"].items()} == {
        t: {k: row[k] for k in keys} for t, row in tasks.items()
    }
    assert all(row["tokens_per_second"] > 0 and row["peak_memory_bytes"] > 0 for row in tasks.values())
    # reading alone is faster than reading and answering; answers are timed over the decoding alone
    assert all(row["prompt_tokens_per_second"] > row["tokens_per_second"] for row in tasks.values())
    assert all(row["generated_tokens_per_second"] > 0 for row in tasks.values())
    # the report's tables and page
    table = CliRunner().invoke(app, ["report", str(tmp_path / "r.json"), "--format", "markdown"])
    # no multi-document QA task ran: a blank category; a category without some of its tasks, and so each language's
    # average, is marked incomplete (English synthetic and the Chinese categories but code hold all theirs)
    assert table.exit_code == 0
    assert "| English | 100.0* | 100.0* |  | 100.0* | 100.0* | 100.0* | 100.0 |" in table.output
    assert "| Chinese | 100.0* | 100.0 |  | 100.0 | 100.0 | 100.0* | 100.0 |" in table.output
    assert report["results"]["leaderboard_missing"]["Chinese"] == {"Multi-Doc QA": ["dureader"],
                                                                   "Code Completion": ["repobench-p"]}  # fmt: skip
    page = CliRunner().invoke(app, ["report", str(tmp_path / "r.json"), "--format", "html", "--samples",
                                    str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "p.html")])  # fmt: skip
    assert page.exit_code == 0 and "LongBench leaderboard" in (tmp_path / "p.html").read_text()
    broken = json.loads((tmp_path / "r.json").read_text())
    del broken["results"]["tasks"]["lcc"]["score"]
    (tmp_path / "b.json").write_text(json.dumps(broken))
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "b.json")])
    assert bad.exit_code == 2 and "results.tasks.lcc" in bad.output and "score" in bad.output
    wrong = run_longbench(LongbenchSettings(model=v1_oracle(tmp_path / "w", lambda r: "zzz"), data=str(V1),
                                            tasks="qasper,passage_count", out=str(tmp_path / "w.json")),
                          progress=False)  # fmt: skip
    assert [row["score"] for row in wrong["results"]["tasks"].values()] == [0.0, 0.0]


def test_v1_longbench_e_buckets_by_length(tmp_path):
    spec = load_longbench_task("qasper")
    records = read_v1(str(V1), "qasper", True)[0]
    pairs = [(v1_prompt(spec["prompt"], r), r["answers"][0] if r["length"] < 8000 else "no") for r in records]
    report = run_longbench(LongbenchSettings(model=str(save_oracle(tmp_path / "o", answers=pairs)), data=str(V1),
                                             tasks="qasper", longbench_e=True, out=str(tmp_path / "r.json")),
                           progress=False)  # fmt: skip
    assert report["results"]["tasks"]["qasper"]["buckets"] == {"0-4k": 100.0, "4-8k": 100.0, "8k+": 0.0}
    assert report["results"]["buckets"] == {"0-4k": 100.0, "4-8k": 100.0, "8k+": 0.0}


def test_v2_figures_an_empty_output_is_left_out_and_cot_reads_its_reasoning(tmp_path):
    model, items = v2_oracle(tmp_path, lambda x: "" if x is None else f"The correct answer is ({x['answer']})")
    report = run_longbench(LongbenchSettings(version=2, model=model, data=str(V2), temperature=0,
                                             out=str(tmp_path / "r.json")), progress=False)  # fmt: skip
    res = report["results"]
    assert res["figures"] == dict.fromkeys(("overall", "easy", "hard", "short", "medium", "long"), 100.0)
    assert (res["n"], res["answered"], res["empty_outputs"]) == (8, 8, 0)
    # the first item answers nothing: pred.py writes no line for it, so the figures leave it out
    first = items[0]["_id"]
    model, _ = v2_oracle(tmp_path / "e", lambda x: "" if x["_id"] == first else "The correct answer is A")
    res = run_longbench(LongbenchSettings(version=2, model=model, data=str(V2), temperature=0,
                                          out=str(tmp_path / "e.json"),
                                          samples=str(tmp_path / "e.jsonl")), progress=False)["results"]  # fmt: skip
    answered = items[1:]
    assert (res["answered"], res["empty_outputs"]) == (7, 1)
    expected = round(100 * sum(x["answer"] == "A" for x in answered) / 7, 1)
    assert res["figures"]["overall"] == expected
    # --cot: the answer prompt holds the reasoning, stripped
    templates = v2_templates()
    pairs = [(v2_prompt(templates["0shot_cot"], x, x["context"]), f" thinking about {x['_id']} ") for x in items]
    pairs += [(v2_prompt(templates["0shot_cot_ans"], x, x["context"], cot=f"thinking about {x['_id']}"),
               f"The correct answer is {x['answer']}") for x in items]  # fmt: skip
    oracle = str(save_oracle(tmp_path / "c", answers=pairs))
    cot = run_longbench(LongbenchSettings(version=2, cot=True, temperature=0, model=oracle,
                                          data=str(V2), out=str(tmp_path / "c.json")), progress=False)  # fmt: skip
    assert cot["results"]["figures"]["overall"] == 100.0


@pytest.mark.slow  # a real model sampling 128 tokens; by default tests/scoring/test_decoding.py holds draws to rows
def test_v2_seeded_sampling_repeats_at_any_batch_size_and_with_another_seed_differs(tmp_path):
    runs = {}
    for name, extra in {"one": dict(batch_size=1), "two": dict(batch_size=2), "seed7": dict(seed=7)}.items():
        settings = LongbenchSettings(version=2, model="embedded:megalodon-tiny", data=str(V2), num_samples=2,
                                     temperature=1.0, out=str(tmp_path / f"{name}.json"),
                                     samples=str(tmp_path / f"{name}.jsonl"), **extra)  # fmt: skip
        run_longbench(settings, progress=False)
        runs[name] = [(s["_id"], s["response"]) for s in map(json.loads, (tmp_path / f"{name}.jsonl").open())]
    assert runs["one"] == runs["two"] and runs["one"][0][1] != runs["one"][1][1]
    assert [r for _, r in runs["seed7"]] != [r for _, r in runs["one"]]


def test_v2_a_resumed_sampled_run_equals_one_run(tmp_path, capfd):
    """Items drawn with their own seeds: an interrupted run resumed gives the uninterrupted run's samples; the cost
    line counts what is left."""
    model, _ = v2_oracle(tmp_path, lambda x: f"The correct answer is ({x['answer']})")
    common = dict(version=2, model=model, data=str(V2), temperature=1.0, batch_size=1)
    whole = LongbenchSettings(**common, out=str(tmp_path / "w.json"), samples=str(tmp_path / "w.jsonl"))
    run_longbench(whole, progress=False)
    settings = LongbenchSettings(**common, out=str(tmp_path / "r.json"), samples=str(tmp_path / "r.jsonl"))

    def stop(done):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_longbench(settings, progress=False, on_unit=stop)
    settings.resume = True
    capfd.readouterr()
    run_longbench(settings, progress=True)
    assert (tmp_path / "r.jsonl").read_text() == (tmp_path / "w.jsonl").read_text()
    # the oracle reads bytes: each item's context and question are about that many tokens
    items = read_v2(str(V2))[0][3:]
    tokens = sum(len((x["context"] + x["question"]).encode()) for x in items)
    line = next(x for x in capfd.readouterr().err.splitlines() if x.startswith("longbench: "))
    assert re.match(
        rf"longbench: 5 of 8 records to run, about {tokens:,} prompt tokens to read \(and up to 640 "
        r"to generate\): about [\d.]+ \w+ per model copy, [\d.]+ \w+ reading and up to [\d.]+ \w+ "
        r"generating \(a [\dK]+-token read at [\d,]+ tokens/s and [\d,]+ ms a new token",
        line,
    ), line


def test_the_command_prints_the_official_tables(tmp_path):
    model, _ = v2_oracle(tmp_path, lambda x: f"**The correct answer is {x['answer']}**")
    result = CliRunner().invoke(app, ["longbench", "--version", "2", "--model", model, "--data", str(V2),
                                      "--temperature", "0", "--no-progress", "--out",
                                      str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("│ accuracy"))
    assert [c.strip() for c in row.split("│")[2:-1]] == ["100.0"] * 6
    table = CliRunner().invoke(app, ["report", str(tmp_path / "r.json"), "--format", "csv"])
    assert table.exit_code == 0 and "accuracy" in table.output


@pytest.mark.parametrize(("flags", "message"), [
    (["--tasks", "nosuch"], "unknown longbench task(s) nosuch"),
    (["--version", "2", "--protocol", "loglik", "--cot"], "--cot asks for reasoning before the answer"),
    (["--version", "2"], "is a LongBench v1 record (input, context, answers); pass it with --version 1"),
    (["--cot"], "--cot does not apply with v1"),
    (["--e", "--tasks", "narrativeqa"], "LongBench-E has no narrativeqa"),
    (["--max-prompt-tokens", "1"], "--max-prompt-tokens must be at least 2"),
    (["--model", "embedded:transformer-tiny", "--tasks", "gov_report"], "the 512 new tokens of gov_report leave"),
    (["--model", "embedded:transformer-tiny", "--tasks", "qasper,trec", "--max-prompt-tokens", "400"],
     "--max-prompt-tokens 400 and the 128 new tokens of qasper leave no room for a prompt"),
    (["--predictions", "x"], "pass exactly one of --data and --predictions"),
])  # fmt: skip
def test_bad_input_is_one_line(tmp_path, flags, message):
    data = str(V1 / "data" / "qasper.jsonl") if "--version" in flags and "--cot" not in flags else str(V1)
    argv = ["longbench", "--data", data, "--no-progress", "--out", str(tmp_path / "r.json"), *flags]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("drop", "message"), [
    ("answers", "`answers` is missing; it must be a non-empty list of texts"),
    ("context", "`context` is missing; it must be text"),
])  # fmt: skip
def test_a_record_without_a_field_is_refused_naming_it(tmp_path, drop, message):
    folder = tmp_path / "data"
    folder.mkdir()
    lines = (V1 / "data" / "qasper.jsonl").read_text().splitlines()
    broken = {k: v for k, v in json.loads(lines[1]).items() if k != drop}
    (folder / "qasper.jsonl").write_text(lines[0] + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(MegaevalError, match=f"qasper.jsonl line 2: {message}".replace("(", r"\(")):
        run_longbench(LongbenchSettings(model="embedded:megalodon-tiny", data=str(tmp_path), tasks="qasper",
                                        out=str(tmp_path / "r.json")), progress=False)  # fmt: skip
