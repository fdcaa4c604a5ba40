"""`megaeval mrcr` end to end: a model given the answers grades 1 everywhere and its samples, scored again as
--predictions, give the same report; a chat template renders the messages exactly as `apply_chat_template` does
(two templates); --max-length keeps whole bins; resume equals one pass; two ranks equal one process (slow); bad
input as one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.mrcr import MrcrSettings, record_query, run_mrcr
from megaeval.errors import MegaevalError
from megaeval.models import load_model
from megaeval.scoring.chat import select_template
from megaeval.tasks.mrcr.data import read_records, record_messages
from megaeval.tasks.mrcr.o200k import o200k
from megaeval.tasks.mrcr.prompts import plain_transcript
from megaeval_testing import REPO, read_jsonl, tiny_chat_model
from megaeval_testing.oracle import save_oracle

DATA = REPO / "tests" / "fixtures" / "mrcr" / "current"


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> str:
    """An oracle that answers each fixture record's transcript with the record's answer (plain rendering)."""
    records, _ = read_records(DATA, o200k())
    pairs = [(plain_transcript(record_messages(r)), r.answer) for r in records]
    return str(save_oracle(tmp_path_factory.mktemp("oracle"), answers=pairs))


MEASURED = ("peak_memory_bytes", "state_bytes", "tokens_per_second", "prompt_tokens_per_second",
            "generated_tokens_per_second", "peak_memory_method")  # fmt: skip


def scores(results: dict) -> dict:
    """A report's results without what reading cost (per-bin time and memory: a rerun measures them again) and
    without the count of responses cut (a --predictions report has none)."""
    out = {k: v for k, v in results.items() if k != "cut_at_max_new_tokens"}
    out["bins"] = {b: {k: v for k, v in cell.items() if k not in MEASURED} for b, cell in results["bins"].items()}
    return out


def settings(model: str, tmp_path, **more) -> MrcrSettings:
    return MrcrSettings(**{"model": model, "data": str(DATA), "max_new_tokens": 400, "out": str(tmp_path / "r.json"),
                           "samples": str(tmp_path / "s.jsonl"), **more})  # fmt: skip


def test_a_model_given_the_answers_grades_1_and_its_samples_grade_the_same_as_predictions(oracle, tmp_path):
    report = run_mrcr(settings(oracle, tmp_path), progress=False)
    res = report["results"]
    assert res["mean"] == 1.0 and res["n"] == 6 and res["prefix_missing"] == 0
    assert res["needles"]["2"]["bins"] == {"<4K": {"mean": 1.0, "n": 2}, "4K-8K": {"mean": 1.0, "n": 1}}
    assert report["settings"]["render_effective"] == "plain" and report["settings"]["bin_by"] == "prompt+answer"
    assert report["data"]["layout"] == "current" and report["schema_version"]
    samples = read_jsonl(tmp_path / "s.jsonl")
    assert {"id", "needles", "bin", "response", "answer", "random_string_to_prepend", "score", "prompt_head"} <= set(
        samples[0])  # fmt: skip
    assert all(s["generated_tokens"] >= 1 and "answer_tokens_share" not in s for s in samples)  # its own count
    again = run_mrcr(MrcrSettings(data=str(DATA), predictions=str(tmp_path / "s.jsonl"), out=str(tmp_path / "p.json")),
                     progress=False)  # fmt: skip
    assert again["results"] == scores(res)
    assert res["bins"]["4K-8K"]["tokens_per_second"] > 0 and res["bins"]["<4K"]["peak_memory_method"]
    # a response without the prefix grades 0 there, and --strip reads one with a leading space
    lines = [{"id": s["id"], "response": " " + s["response"]} for s in samples]
    (tmp_path / "spaced.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    spaced = MrcrSettings(data=str(DATA), predictions=str(tmp_path / "spaced.jsonl"), out=str(tmp_path / "q.json"))
    assert run_mrcr(spaced, progress=False)["results"]["mean"] == 0.0
    spaced.strip = True
    assert run_mrcr(spaced, progress=False)["results"]["mean"] == 1.0


def test_max_length_keeps_whole_bins_and_bin_by_prompt(oracle, tmp_path):
    report = run_mrcr(settings(oracle, tmp_path, max_length=4096), progress=False)
    assert report["results"]["n"] == 5 and report["data"]["left_out_bins"] == ["4K-8K"]
    assert report["settings"]["max_length_effective"] == 4096
    by_prompt = run_mrcr(settings(oracle, tmp_path, bin_by="prompt", needles="2", out=str(tmp_path / "b.json")),
                         progress=False)  # fmt: skip
    assert set(by_prompt["results"]["bins"]) == {"<4K", "4K-8K"} and by_prompt["results"]["n"] == 3


TEMPLATES = {
    "tags": ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}"),
    "chatml": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_messages_are_rendered_as_apply_chat_template_renders_them(tmp_path, name):
    lm = load_model(tiny_chat_model(tmp_path / "chat", TEMPLATES[name]))
    record = read_records(DATA, o200k(), needles=[4], limit=1)[0][0]
    query = record_query(lm, select_template(lm, None), "template", record, "auto")
    messages = record_messages(record)
    expected = lm.tokenizer.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert query.text == expected and list(query.ids) == list(lm.tokenizer.encode(expected))
    assert query.messages == tuple(messages)  # what a chat API is sent: the messages as given, no system turn


def test_a_fixed_context_model_runs_the_bins_that_fit_and_refuses_a_prompt_past_it_before_answering(tmp_path):
    chat = tiny_chat_model(tmp_path / "chat", TEMPLATES["tags"])  # max_context 512
    report = run_mrcr(settings(chat, tmp_path, max_new_tokens=4), progress=False)
    assert report["settings"]["max_length_effective"] == 512 and report["data"]["left_out_bins"] == ["4K-8K"]
    assert report["results"]["n"] == 5 and report["settings"]["render_effective"] == "template"
    assert report["settings"]["chat_template_effective"]["name"] == "default"
    late = settings(chat, tmp_path, max_new_tokens=100, out=str(tmp_path / "late.json"))
    with pytest.raises(MegaevalError, match=r"MRCR record 4needle/4needle_0\.parquet#0: its prompt is 456 tokens, "
                       r"and with --max-new-tokens 100 it passes .*max_context 512"):  # fmt: skip
        run_mrcr(late, progress=False, on_unit=lambda done: pytest.fail("a record was answered"))
    assert not (tmp_path / "late.json").exists()


def test_resume_after_an_interruption_equals_one_pass(oracle, tmp_path):
    whole = run_mrcr(settings(oracle, tmp_path / "whole", batch_size=1), progress=False)
    part = settings(oracle, tmp_path, batch_size=1)

    def stop(done):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_mrcr(part, progress=False, on_unit=stop)
    assert not (tmp_path / "r.json").exists() and (tmp_path / "r.json.partial.jsonl").exists()
    part.resume = True
    done = []
    resumed = run_mrcr(part, progress=False, on_unit=done.append)
    assert scores(resumed["results"]) == scores(whole["results"]) and len(done) == 4  # only the records left ran


def test_the_cli_prints_the_tables_for_an_embedded_model(tmp_path):
    result = CliRunner().invoke(app, ["mrcr", "--model", "embedded:mamba2-tiny", "--data", str(DATA), "--needles",
                                      "4,8", "--max-new-tokens", "4", "--no-progress", "--out",
                                      str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "MRCR: mean grade by needles and o200k_base bin" in result.output and "<4K" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["settings"]["render_effective"] == "plain"


@pytest.mark.parametrize(("lines", "message"), [
    ([{"id": "2needle/2needle_0.parquet#9", "response": "x"}], r"id '2needle/2needle_0\.parquet#9' is not one of"),
    ([{"id": "2needle/2needle_0.parquet#0", "response": "x"}], r"no response for record 2needle/2needle_0\.parquet#1"),
    ([{"id": "2needle/2needle_0.parquet#0"}], r"line 1 is not an object with a text `id` and a text `response`"),
])  # fmt: skip
def test_a_predictions_file_that_does_not_match_the_records_is_refused(tmp_path, lines, message):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(MegaevalError, match=message):
        run_mrcr(MrcrSettings(data=str(DATA), predictions=str(path), out=str(tmp_path / "r.json")), progress=False)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--predictions", "p.jsonl", "--model", "embedded:mamba2-tiny"], "--model would be ignored"),
    (["--predictions", "p.jsonl", "--max-new-tokens", "5"], "--max-new-tokens does not apply with --predictions"),
    (["--model", "embedded:mamba2-tiny", "--bin-by", "answer"], "unknown --bin-by 'answer'"),
    (["--model", "embedded:mamba2-tiny", "--needles", "two"], "bad --needles 'two'"),
    (["--hub"], "reads MRCR's files from a folder, not from the hub"),
])  # fmt: skip
def test_bad_flags_are_one_line(tmp_path, args, message):
    data = ["--data", "hub:openai/mrcr"] if args == ["--hub"] else ["--data", str(DATA), *args]
    result = CliRunner().invoke(app, ["mrcr", *data, "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


@pytest.mark.slow  # two ranks: Run.map's dealing is covered by default through ruler and ppl-sweep, the journal by
# test_resume_after_an_interruption_equals_one_pass
def test_two_ranks_under_torchrun_equal_one_process(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = ["-m", "megaeval", "mrcr", "--model", "embedded:mamba2-tiny", "--data", str(DATA), "--max-new-tokens", "8",
            "--batch-size", "1", "--no-progress"]  # fmt: skip
    prefix = {"one": [sys.executable], "two": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                               "--nproc-per-node", "2"]}  # fmt: skip
    for name, start in prefix.items():
        out = ["--out", str(tmp_path / f"{name}.json"), "--samples", str(tmp_path / f"{name}.jsonl")]
        run = subprocess.run([*start, *args, *out], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in prefix)
    assert scores(two["results"]) == scores(one["results"]) and two["environment"]["world_size"] == 2
    assert read_jsonl(tmp_path / "two.jsonl") == read_jsonl(tmp_path / "one.jsonl")
