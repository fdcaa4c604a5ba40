"""`megaeval ruler` end to end: --prepare-only writes RULER's own instances (byte for byte what RULER's prepare.py
wrote, tests/fixtures/ruler/reference), --data-dir reads them back, a model given the answers scores 100 on every
task at every length whether it reads generated or prepared instances, and bad inputs are one line."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import fields

import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.ruler import RulerSettings, prepare_ruler, run_ruler
from megaeval.errors import MegaevalError
from megaeval.tasks.ruler.data import instances_path, read_instances
from megaeval_testing import REPO
from megaeval_testing.oracle import save_oracle

FIXTURES = REPO / "tests" / "fixtures" / "ruler"
INPUTS = {"essays": str(FIXTURES / "inputs" / "essays.json"), "qa_data": str(FIXTURES / "inputs")}
TASKS = "niah_single_1,niah_multikey_2,fwe,qa_1"


@pytest.mark.parametrize("kind, tokenizer, length", [
    ("hf", "embedded:transformer-tiny", 1024),
    ("bpe", str(FIXTURES / "tokenizer-bpe"), 2048),  # a transformers tokenizer folder that counts differently
], ids=["hf", "bpe"])  # fmt: skip
def test_prepare_only_writes_what_rulers_prepare_wrote(tmp_path, kind, tokenizer, length):
    result = CliRunner().invoke(app, ["ruler", "--prepare-only", "--tokenizer", tokenizer,
                                      "--write-data", str(tmp_path), "--lengths", str(length), "--num-samples", "2",
                                      "--tasks", "niah_single_2,cwe,qa_2", "--essays", INPUTS["essays"],
                                      "--qa-data", INPUTS["qa_data"]])  # fmt: skip
    assert result.exit_code == 0, result.output
    for task in ("niah_single_2", "cwe", "qa_2"):
        reference = FIXTURES / "reference" / kind / str(length) / task / "validation.jsonl.gz"
        assert instances_path(tmp_path, length, task).read_bytes() == gzip.decompress(reference.read_bytes()), task


def test_prepare_only_refuses_in_one_line_where_ruler_loops(tmp_path):
    # with the bpe tokenizer 500 essay words (RULER's smallest haystack) do not fit in 1K: RULER's run kept looping
    result = CliRunner().invoke(app, ["ruler", "--prepare-only", "--tokenizer", str(FIXTURES / "tokenizer-bpe"),
                                      "--write-data", str(tmp_path), "--lengths", "1K", "--num-samples", "2",
                                      "--tasks", "niah_single_2", "--essays", INPUTS["essays"]])  # fmt: skip
    assert result.exit_code != 0
    assert re.search(r"niah_single_2 does not fit in 1024 tokens: .*loop forever.*use a longer length", result.output)
    assert not instances_path(tmp_path, 1024, "niah_single_2").exists()


def test_a_model_given_the_answers_scores_100_everywhere_from_generated_or_prepared_instances(tmp_path):
    data = tmp_path / "data"
    common = dict(tasks=TASKS, lengths="3K,4K", num_samples=2, qa_data=INPUTS["qa_data"])  # no task reads essays
    prepare_ruler(RulerSettings(tokenizer=str(save_oracle(tmp_path / "bare")), prepare_only=True,
                                write_data=str(data), **common))  # fmt: skip
    answers = []
    for task in TASKS.split(","):
        for length in (3072, 4096):
            for r in read_instances(data, length, task):
                answers.append((r["input"] + r["answer_prefix"], " " + ", ".join(r["outputs"])))
    oracle = str(save_oracle(tmp_path / "oracle", answers=answers))
    generated = run_ruler(RulerSettings(model=oracle, out=str(tmp_path / "g.json"), samples=str(tmp_path / "g.jsonl"),
                                        **common), progress=False)  # fmt: skip
    prepared = run_ruler(RulerSettings(model=oracle, out=str(tmp_path / "p.json"), data_dir=str(data),
                                       tasks=TASKS, lengths="3K,4K", num_samples=2), progress=False)  # fmt: skip
    for report in (generated, prepared):
        results = report["results"]
        assert {t: [r["score"] for r in v["lengths"]] for t, v in results["tasks"].items()} == {
            t: [100.0, 100.0] for t in TASKS.split(",")}  # fmt: skip
        assert results["average"] == 100.0 and results["effective_length"] == 4096
    rows = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 * 2 and all(r["score"] == 1.0 for r in rows)
    assert all(r["prompt_tokens"] + load_budget(r["task"]) <= r["length"] + 1 for r in rows)  # + BOS
    table = CliRunner().invoke(app, ["report", str(tmp_path / "g.json")]).output
    assert "effective length 4K" in table and "100.00" in table


def test_instances_read_the_starts_they_share_once_and_answer_the_same(tmp_path):
    common = dict(model="embedded:transformer-tiny", tasks="niah_single_1", lengths="512", num_samples=4,
                  batch_size=4)  # fmt: skip
    reports, samples = {}, {}
    for share in (True, False):
        out = tmp_path / f"{share}.json"
        reports[share] = run_ruler(RulerSettings(share_prefixes=share, out=str(out), samples=str(out) + "l",
                                                 **common), progress=False)  # fmt: skip
        samples[share] = [{k: r[k] for k in ("task", "sample", "prediction", "score")}
                          for r in map(json.loads, (tmp_path / f"{share}.jsonl").read_text().splitlines())]  # fmt: skip
    assert samples[True] == samples[False] and len(samples[True]) == 4
    read = {share: sum(r["model"]["prefill"]["tokens"].values()) for share, r in reports.items()}
    prompts = sum(s["prompt_tokens"] for s in map(json.loads, (tmp_path / "False.jsonl").read_text().splitlines()))
    # each prompt whole (its last token in a call of its own, for its logits); shared: the noise haystack's start once
    assert read[False] == prompts - 4 and read[True] < 0.8 * prompts, (read, prompts)
    assert reports[True]["settings"]["share_prefixes"] is True


def load_budget(task: str) -> int:
    from megaeval.tasks.ruler.spec import load_ruler_task

    return load_ruler_task(task)["tokens_to_generate"]


def test_bad_inputs_are_one_line(tmp_path):
    qa_only = dict(tasks="qa_1", lengths="1K", num_samples=1, prepare_only=True, write_data=str(tmp_path / "w"),
                   tokenizer="embedded:transformer-tiny")  # fmt: skip
    with pytest.raises(MegaevalError, match=r"squad\.json.*--qa-data"):
        prepare_ruler(RulerSettings(**qa_only))
    with pytest.raises(MegaevalError, match=r"--prepare-only writes instances and nothing else; pass --write-data"):
        RulerSettings(prepare_only=True)
    with pytest.raises(MegaevalError, match=r"niah_single_1.*256"):
        prepare_ruler(RulerSettings(**{**qa_only, "tasks": "niah_single_1", "lengths": "256"}))
    path = instances_path(tmp_path / "d", 1024, "vt")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"input": "x", "outputs": ["a"], "length": 10}) + "\n")
    with pytest.raises(MegaevalError, match=r"validation\.jsonl line 1: `answer_prefix` is missing"):
        read_instances(tmp_path / "d", 1024, "vt")
    with pytest.raises(MegaevalError, match=r"no 2048/vt/validation\.jsonl"):
        read_instances(tmp_path / "d", 2048, "vt")


def test_the_cost_line_counts_the_instances_and_tokens_still_to_run(tmp_path, capfd):
    settings = dict(model="embedded:megalodon-tiny", tasks="fwe", lengths="1K,2K", num_samples=2,
                    out=str(tmp_path / "r.json"))  # fmt: skip

    def stop_after_one(done):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_ruler(RulerSettings(**settings), progress=True, on_unit=stop_after_one)
    first = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ruler: ")]
    # (1K + 2K) x 2 samples: 4 instances, 6,144 tokens; at most 50 tokens generated each, a task's 2 rows together
    assert first[0].startswith("ruler: 4 of 4 instances to run, 6,144 prompt tokens to read (and up to 200 to ")
    duration = r"[\d.]+ (s|min|h|days)"
    assert re.search(
        rf"about {duration} per model copy, {duration} reading and up to {duration} generating \(a "
        r"512-token read at [\d,]+ tokens/s and [\d,]+ ms a new token a row, 2 rows together, timed now\)",
        first[0],
    ), first[0]
    # --write-data added on the resume writes every set, the finished unit's too
    run_ruler(RulerSettings(**settings, resume=True, write_data=str(tmp_path / "w")), progress=True)
    # the first 1K instance done: 1K + 2K + 2K left
    again = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ruler: ")]
    assert again[0].startswith("ruler: 3 of 4 instances to run, 5,120 prompt tokens to read (and up to 150 to ")
    assert [len(read_instances(tmp_path / "w", n, "fwe")) for n in (1024, 2048)] == [2, 2]


def test_the_fingerprint_holds_the_checksums_of_the_instance_files_read(tmp_path):
    from megaeval.commands.ruler import data_facts
    from megaeval.tasks.ruler.spec import load_ruler_task

    path = instances_path(tmp_path, 1024, "fwe")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"input": "x", "outputs": ["a"], "length": 10, "answer_prefix": " A:"}) + "\n")
    settings = RulerSettings(model="embedded:megalodon-tiny", tasks="fwe", lengths="1K", num_samples=1,
                             data_dir=str(tmp_path))  # fmt: skip
    before = data_facts(settings, {"fwe": load_ruler_task("fwe")})
    path.write_text(path.read_text().replace('"a"', '"b"'))
    after = data_facts(settings, {"fwe": load_ruler_task("fwe")})
    assert before["data_dir"]["sha256"]["1024/fwe"] != after["data_dir"]["sha256"]["1024/fwe"]


def test_flags_that_do_not_apply_are_refused_by_one_table(tmp_path):
    prepare = dict(prepare_only=True, write_data=str(tmp_path / "w"), tasks="fwe", lengths="1K")
    RulerSettings(**prepare, tokenizer="embedded:megalodon-tiny", seed=7)  # they apply
    RulerSettings(**prepare, bos="auto", out="reports/ruler.json")  # defaults are not given flags
    defaults = {f.name: f.default for f in fields(RulerSettings)}
    for flag, modes in RulerSettings.MODES.items():
        mode = next(m for m in ("prepare", "data", "generate") if m not in modes)
        given = {"prepare": prepare, "generate": dict(tasks="fwe", lengths="1K"),
                 "data": dict(tasks="fwe", lengths="1K", data_dir=str(tmp_path))}[mode]  # fmt: skip
        other = {None: "x", 42: 7, "auto": 4, False: True, 1: 2, 1800.0: 9.0, "reports/ruler.json": "r.json",
                 "cpu": "cuda", "float32": "float16"}.get(defaults[flag], 50.0)  # fmt: skip
        with pytest.raises(MegaevalError, match=rf"--{flag.replace('_', '-')} does not apply"):
            RulerSettings(**{**given, flag: other})
