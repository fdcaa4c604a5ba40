"""`megaeval babilong` end to end: a model given the answers scores 100 everywhere (and one that answers wrong, 0),
what the samples and report hold, batch sizes and the shared schedule change no answer, the heatmap table, and bad
input as one line."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.babilong import BabilongSettings, run_babilong
from megaeval.errors import MegaevalError
from megaeval.tasks.babilong.prompts import format_prompt
from megaeval.tasks.babilong.spec import load_babilong_task
from megaeval_testing import REPO
from megaeval_testing.oracle import save_oracle

FIXTURES = REPO / "tests" / "fixtures" / "babilong"
FROZEN = FIXTURES / "frozen"
TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")


def oracle(tmp_path, answer=lambda r: f"The answer is {r['target']}."):
    """An oracle that says `answer(record)` after each fixture prompt (at most BABILong's 20 new tokens: bytes)."""
    pairs = []
    for task in TASKS:
        spec = load_babilong_task(task)
        for length in ("0k", "1k"):
            for r in json.loads((FROZEN / task / f"{length}.json").read_text()):
                pairs.append((format_prompt(spec, r["input"], r["question"]), answer(r)[:20]))
    return str(save_oracle(tmp_path / "oracle", answers=pairs))


def test_a_model_given_the_answers_scores_100_and_one_answering_wrong_0(tmp_path):
    right = run_babilong(BabilongSettings(model=oracle(tmp_path, lambda r: f"{r['target']}."), data=str(FROZEN),
                                          lengths="0k,1k", out=str(tmp_path / "r.json"),
                                          samples=str(tmp_path / "s.jsonl")), progress=False)  # fmt: skip
    assert {t: {n: c["accuracy"] for n, c in v.items()} for t, v in right["results"]["tasks"].items()} == {
        t: {"0k": 100.0, "1k": 100.0} for t in TASKS}  # fmt: skip
    assert [row["average"] for row in right["results"]["lengths"]] == [100.0, 100.0]
    assert (
        right["settings"]["prompt_name"]
        == "instruction_yes_examples_yes_post_prompt_yes_chat_template_no_system_prompt_no"
    )
    assert right["data"]["generated"]["seed"] == 42 and right["data"]["sets"]["qa1/0k"]["sha256"]
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(samples) == 5 * 2 * 2 and all(s["score"] == 1.0 and s["correct"] for s in samples)
    assert {"task", "length", "id", "target", "question", "prediction", "prompt_head", "prompt_tail"} <= set(samples[0])
    rows = right["results"]["lengths"]
    assert all(r["peak_memory_bytes"] > 0 and r["tokens_per_second"] > 0 and r["state_bytes"] == 0 for r in rows)
    assert all(r["prompt_tokens_per_second"] > r["tokens_per_second"] and r["generated_tokens_per_second"] > 0
               for r in rows)  # fmt: skip
    shutil.rmtree(tmp_path / "oracle")
    settings = BabilongSettings(model=oracle(tmp_path, lambda r: "kitchen and garden."), data=str(FROZEN),
                                tasks="qa1", lengths="0k", out=str(tmp_path / "w.json"))  # fmt: skip
    wrong = run_babilong(settings, progress=False)
    assert wrong["results"]["tasks"]["qa1"]["0k"] == {"accuracy": 0.0, "correct": 0, "n": 2}
    assert wrong["results"]["lengths"][0]["average"] is None


@pytest.mark.parametrize("model", ["embedded:megalodon-tiny", "embedded:mamba2-tiny"])
def test_batch_sizes_and_schedules_change_no_answer(tmp_path, model):
    """Instances decoded one at a time reading each prompt whole, or together from the shared prompt start."""
    common = dict(model=model, data=str(FROZEN), tasks="qa4", lengths="0k,1k")
    runs = {}
    for name, extra in {
        "one-naive": dict(batch_size=1, schedule="naive"),
        "auto-shared": dict(schedule="shared"),
    }.items():
        report = run_babilong(BabilongSettings(**common, **extra, out=str(tmp_path / f"{name}.json"),
                                               samples=str(tmp_path / f"{name}.jsonl")), progress=False)  # fmt: skip
        runs[name] = [(s["id"], s["prediction"]) for s in map(json.loads, (tmp_path / f"{name}.jsonl").open())]
        assert report["settings"]["schedule_effective"] == name.split("-")[1]
    assert runs["one-naive"] == runs["auto-shared"] and len(runs["one-naive"]) == 4


def test_the_command_prints_the_task_by_length_table(tmp_path):
    result = CliRunner().invoke(app, ["babilong", "--model", oracle(tmp_path, lambda r: r["target"]), "--data",
                                      str(FROZEN), "--lengths", "0k", "--no-progress", "--out",
                                      str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in lines] == [*TASKS, "average"]
    assert all(line.split("│")[2].strip() == "100.0" for line in lines)
    table = CliRunner().invoke(app, ["report", str(tmp_path / "r.json"), "--format", "csv"])
    assert table.output.splitlines()[0] == "model,task,0k" and table.output.splitlines()[-1].endswith(",average,100.0")


@pytest.mark.parametrize(("flags", "message"), [
    (["--lengths", "3M"], r"holds no qa1 at 3M; it holds qa1: 0k, 1k, 4k; qa2: 0k, 1k, 4k"),
    (["--tasks", "qa21"], "unknown babilong task(s) qa21; choose from: all, qa1"),
    (["--system-instruction", "Be brief.", "--chat-template"], "drops any system prompt"),
    (["--model", "embedded:transformer-tiny", "--lengths", "1k"], "max_context 512 tokens, but --lengths asks for 1k"),
    (["--num-samples", "0"], "--num-samples must be at least 1"),
    (["--prepare-only"], "pass exactly one of --data, --predictions and --prepare-only"),
    (["--babi", "x"], "--babi does not apply with --data (it would be ignored); use --babi with --prepare-only"),
    (["--seed", "7"], "--seed does not apply with --data"),
])  # fmt: skip
def test_bad_input_is_one_line(tmp_path, flags, message):
    defaults = {"--tasks": "qa1", "--lengths": "0k"}  # each option once: a repeated one is refused
    argv = ["babilong", "--data", str(FROZEN), "--no-progress", "--out", str(tmp_path / "r.json"), *flags,
            *(x for k, v in defaults.items() if k not in flags for x in (k, v))]  # fmt: skip
    if "--prepare-only" in flags:
        argv += ["--predictions", str(tmp_path)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "r.json").exists()


def test_a_record_without_its_target_an_empty_set_and_a_prompt_past_the_context_are_refused(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(FROZEN, data)
    records = json.loads((data / "qa1" / "0k.json").read_text())
    del records[1]["target"]
    (data / "qa1" / "0k.json").write_text(json.dumps(records))
    with pytest.raises(MegaevalError, match=r"qa1/0k.json instance 1: `target` is missing"):
        run_babilong(BabilongSettings(model="embedded:megalodon-tiny", data=str(data), tasks="qa1", lengths="0k",
                                      out=str(tmp_path / "r.json")), progress=False)  # fmt: skip
    (data / "qa1" / "0k.json").write_text("[]")
    with pytest.raises(MegaevalError, match=r"qa1/0k.json holds no instances"):
        run_babilong(BabilongSettings(model="embedded:megalodon-tiny", data=str(data), tasks="qa1", lengths="0k",
                                      out=str(tmp_path / "r.json")), progress=False)  # fmt: skip
    long = tmp_path / "long"
    (long / "qa1").mkdir(parents=True)
    (long / "qa1" / "0k.json").write_text(
        json.dumps([{"input": "word " * 600, "question": "Where?", "target": "kitchen"}])
    )
    with pytest.raises(MegaevalError, match=r"qa1 at 0k, instance 0: its prompt is [\d,]+ tokens.*never truncates"):
        run_babilong(BabilongSettings(model="embedded:transformer-tiny", data=str(long), tasks="qa1", lengths="0k",
                                      out=str(tmp_path / "t.json")), progress=False)  # fmt: skip
    assert not (tmp_path / "t.json").exists()


def test_the_hub_layout_parquet_and_save_to_disk_read_as_the_json_layout(tmp_path):
    import datasets

    records = {t: json.loads((FROZEN / t / "0k.json").read_text()) for t in ("qa1", "qa2")}
    parquet, saved = tmp_path / "parquet", tmp_path / "saved"
    for task, rows in records.items():
        (parquet / "data" / "0k").mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_list(rows).to_parquet(str(parquet / "data" / "0k" / f"{task}-00000-of-00001.parquet"))
    datasets.DatasetDict({t: datasets.Dataset.from_list(r) for t, r in records.items()}).save_to_disk(str(saved / "0k"))
    got = {}
    for name, folder in (("json", FROZEN), ("parquet", parquet), ("saved", saved)):
        report = run_babilong(BabilongSettings(model=oracle(tmp_path / name, lambda r: r["target"]), data=str(folder),
                                               tasks="qa1,qa2", lengths="0k", out=str(tmp_path / f"{name}.json")),
                              progress=False)  # fmt: skip
        got[name] = report["results"]["tasks"]
    assert got["json"] == got["parquet"] == got["saved"] == {t: {"0k": {"accuracy": 100.0, "correct": 2, "n": 2}}
                                                             for t in ("qa1", "qa2")}  # fmt: skip


@pytest.mark.parametrize(("flags", "message"), [
    (dict(prepare_only=True, write_data="w", babi="b", samples="s.jsonl"), "--samples does not apply with --prep"),
    (dict(prepare_only=True, write_data="w", babi="b", chat_template="default"), "--chat-template does not apply"),
    (dict(predictions="p", write_predictions="w"), "--write-predictions does not apply with --predictions"),
    (dict(predictions="p", model="embedded:megalodon-tiny"), "--model does not apply with --predictions"),
    (dict(data=str(FROZEN), clean_up_spaces=False), "--no-clean-up-spaces does not apply with --data"),
])  # fmt: skip
def test_a_flag_is_refused_where_it_does_not_apply(flags, message):
    with pytest.raises(MegaevalError, match=message):
        BabilongSettings(**flags)


def one_set(tmp_path, records, task="qa1", length="0k"):
    """A data folder holding `records` as `task` at `length` (the generator's layout)."""
    folder = tmp_path / "one"
    (folder / task).mkdir(parents=True, exist_ok=True)
    (folder / task / f"{length}.json").write_text(json.dumps(records))
    return folder


def run_cli(tmp_path, *flags):
    """`megaeval babilong` through the real command line; its result."""
    return CliRunner().invoke(app, ["babilong", "--no-progress", "--out", str(tmp_path / "r.json"), *flags])


@pytest.mark.parametrize(("change", "message"), [
    ({"target": "apple,milk"}, r"instance 1: the target 'apple,milk' is none of qa1's labels; pass qa1's own"),
    ({"target": " "}, r"instance 1: the target is empty"),
    ({"question": ""}, r"instance 1: the question is empty"),
])  # fmt: skip
def test_an_instance_that_cannot_be_right_is_refused_before_the_model_loads(tmp_path, change, message):
    records = json.loads((FROZEN / "qa1" / "0k.json").read_text())
    records[1].update(change)
    result = run_cli(tmp_path, "--data", str(one_set(tmp_path, records)), "--tasks", "qa1", "--lengths", "0k",
                     "--model", "no-such-model")  # fmt: skip
    assert result.exit_code == 2 and re.search(message, " ".join(result.output.split())), result.output
    assert not (tmp_path / "r.json").exists()


def test_an_instance_far_longer_than_its_set_names_the_cause(tmp_path):
    """A 0k instance of 400,000 characters on a 512-token model: the cause (hundreds of times a 0k instance's
    facts, ten times the most a 0k instance can hold), not advice to use shorter lengths."""
    records = [{"input": "Mary went to the kitchen. " * 15_385, "question": "Where is Mary?", "target": "kitchen"}]
    result = run_cli(tmp_path, "--data", str(one_set(tmp_path, records)), "--tasks", "qa1", "--lengths", "0k",
                     "--model", "embedded:transformer-tiny")  # fmt: skip
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "instance 0: its input is 400,010 characters, 10 times what a 0k instance" in text
    assert "it belongs to a longer set" in text and "shorter --lengths" not in text
    assert not (tmp_path / "r.json").exists()


def test_a_zero_k_prompt_past_the_context_advises_a_longer_context_not_shorter_lengths(tmp_path):
    from megaeval.commands.babilong import past_context

    class Short:
        spec, max_context = "embedded:transformer-tiny", 512

    spec = load_babilong_task("qa1")
    assert "use a model with a longer context (0k is BABILong's shortest set)" in str(
        past_context(Short(), spec, "qa1", "0k", 0, 900)
    )
    assert str(past_context(Short(), spec, "qa1", "1k", 0, 900)).endswith("; use shorter --lengths")


@pytest.mark.parametrize("other", ["qa1/0k.jsonl", "0k/qa1.parquet", "data/0k/qa1.json"])
def test_a_set_in_two_layouts_is_refused_naming_both(tmp_path, other):
    import datasets

    folder = tmp_path / "two"
    shutil.copytree(FROZEN, folder)
    records = json.loads((FROZEN / "qa1" / "0k.json").read_text())
    path = folder / other
    path.parent.mkdir(parents=True, exist_ok=True)
    if other.endswith(".parquet"):
        datasets.Dataset.from_list(records).to_parquet(str(path))
    else:
        path.write_text("\n".join(map(json.dumps, records)) if other.endswith("l") else json.dumps(records))
    result = run_cli(tmp_path, "--data", str(folder), "--tasks", "qa1", "--lengths", "0k")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and f"holds qa1 at 0k twice: {folder / 'qa1' / '0k.json'} and {path}" in text, text


def test_resume_refuses_a_save_to_disk_set_whose_arrow_file_was_replaced(tmp_path):
    """The split's fingerprint does not change when its files do: the checksums of the arrow files read do."""
    import datasets

    saved = tmp_path / "saved"
    for length in ("0k", "1k"):
        rows = json.loads((FROZEN / "qa1" / f"{length}.json").read_text())
        datasets.DatasetDict({"qa1": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved / length))
    settings = BabilongSettings(model=oracle(tmp_path, lambda r: r["target"]), data=str(saved), tasks="qa1",
                                lengths="0k", batch_size=1, out=str(tmp_path / "r.json"))  # fmt: skip

    def stop(done):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_babilong(settings, progress=False, on_unit=stop)
    arrows = sorted((saved / "0k" / "qa1").glob("*.arrow"))
    shutil.copy(sorted((saved / "1k" / "qa1").glob("*.arrow"))[0], arrows[0])  # the 1k set's rows, under 0k
    settings.resume = True
    with pytest.raises(MegaevalError, match=r"cannot resume .* differs .*qa1/0k\.sha256\.data-00000-of-00001\.arrow"):
        run_babilong(settings, progress=False)
    assert not (tmp_path / "r.json").exists()
