"""Served models without a model behind them (default tier): the spec and its --model-args checked in one line, the
transport settings a resume may change, what refuses a served model, the order requests go in, answered requests in
the resume journal, and a server that is not there (a real closed port)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from megaeval import MegaevalError
from megaeval.cli import app
from megaeval.runs.journal import Journal
from megaeval.serving.answers import SHARED_START, _waves
from megaeval.serving.client import Client
from megaeval.serving.spec import answer_settings, is_served, refuse_served, server_spec
from megaeval_testing.servers import free_port

URL = "openai:http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("spec", "args", "message"),
    [
        ("openai:ftp://host/v1", {"tokenizer": "t"}, r"'ftp://host/v1' is not an http\(s\) URL"),
        ("openai:http://u:secret@host/v1", {"tokenizer": "t"}, r"holds credentials, a query or a fragment"),
        ("openai:http://host/v1?key=secret", {"tokenizer": "t"}, r"holds credentials, a query or a fragment"),
        (URL, {"tokenizer": "t", "temperature": 0}, r"unknown option\(s\) temperature for a served model"),
        (URL, {}, r"needs a tokenizer: prompts are built, fitted to lengths and counted with it"),
        (URL, {"tokenizer": "t", "api": "responses"}, r"api='responses'; use one of: completions, chat"),
        (URL, {"tokenizer": "t", "prompt": "tokens"}, r"prompt='tokens'; use one of: auto, ids, text"),
        (URL, {"tokenizer": "t", "dialect": "sglang"}, r"dialect='sglang'; use one of: openai, vllm"),
        (URL, {"tokenizer": "t", "concurrency": 0}, r"concurrency=0 must be a whole number from 1 to 4096"),
        (URL, {"tokenizer": "t", "retries": 1.5}, r"retries=1.5 must be a whole number"),
        (URL, {"tokenizer": "t", "timeout": -1}, r"timeout=-1 must be a positive number of seconds"),
        (URL, {"tokenizer": "t", "api_key_env": "my-key"}, r"api_key_env='my-key' is not an environment variable"),
        (URL, {"tokenizer": "t", "api_key_env": "MEGAEVAL_NO_SUCH_VARIABLE"}, r"that environment variable is not set"),
    ],
    ids=[
        "scheme",
        "credentials",
        "query",
        "unknown",
        "no-tokenizer",
        "api",
        "prompt",
        "dialect",
        "concurrency",
        "retries",
        "timeout",
        "env-name",
        "env-unset",
    ],  # fmt: skip
)
def test_a_bad_spec_is_one_line(spec, args, message):
    with pytest.raises(MegaevalError, match=message) as refused:
        server_spec(spec, args)
    assert "secret" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_good_spec_and_what_a_resume_may_change(monkeypatch):
    monkeypatch.setenv("MEGAEVAL_TEST_KEY", "sk-1")
    served = server_spec(URL + "/", {"tokenizer": "t", "api_key_env": "MEGAEVAL_TEST_KEY", "timeout": 5})
    assert served.base_url == "http://127.0.0.1:8000/v1" and served.timeout == 5.0 and served.concurrency == 8
    assert "sk-1" not in json.dumps(served.options())
    args = {"tokenizer": "t", "api": "chat", "concurrency": 4, "retries": 9, "timeout": 3, "api_key_env": "K"}
    assert answer_settings(URL, args) == {"tokenizer": "t", "api": "chat"}
    assert answer_settings("embedded:megalodon-tiny", {"timeout": 3}) == {"timeout": 3}
    assert is_served(URL) and not is_served("hf:/models/x") and not is_served(None)


def test_what_needs_a_models_state_refuses_a_served_one():
    with pytest.raises(MegaevalError, match=r"^ppl-sweep carries .*; a served model \(openai:.*\) answers prompts"):
        refuse_served(URL, "ppl-sweep", "carries the model's state")
    refuse_served("embedded:megalodon-tiny", "ppl-sweep", "carries the model's state")
    runner = CliRunner()
    cases = [
        (["ppl-sweep", "--model", URL, "--stream", "s"], "error: ppl-sweep carries the model's state"),
        (["longppl", "--model", URL, "--data", "d", "--key-tokens", "k"], "error: longppl scores every token"),
        (["info", URL, "--model-args", "tokenizer=t", "--dtype", "bf16"], "error: --device, --dtype"),
        (["needle", "--model", URL, "--model-args", "tokenizer=t", "--dtype", "bf16"],
         "error: --dtype applies to a model megaeval loads, not to a served one"),
    ]  # fmt: skip
    for argv, start in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and result.output.startswith(start) and result.output.count("\n") == 1, (
            argv, result.output)  # fmt: skip


def test_requests_sharing_a_long_start_wait_for_the_first_of_them():
    """Sorted by their tokens; of prompts sharing SHARED_START tokens or more, the first goes in the first wave."""
    rng = np.random.default_rng(0)
    haystack = rng.integers(5, 1000, 2 * SHARED_START)
    prompts = [np.concatenate([haystack, [7, i]]) for i in range(3)] + [rng.integers(5, 1000, 50), haystack[:100]]
    first, second = _waves([10, 11, 12, 13, 14], prompts)
    assert sorted(first + second) == [10, 11, 12, 13, 14]
    assert len([i for i in first if i in (10, 11, 12)]) == 1 and {13, 14} <= set(first)
    assert _waves([], []) == []


def test_answered_requests_are_journaled_apart_from_units(tmp_path):
    path = tmp_path / "r.json.partial.jsonl"
    journal = Journal(path, {"a": 1}, resume=False)
    journal.add_request("k1", {"choices": [{"text": "x"}], "_seconds": 1.5})
    journal.abandon(KeyboardInterrupt())
    assert path.exists()  # answered requests are kept even with no finished unit
    again = Journal(path, {"a": 1}, resume=True)
    assert again.answered("k1") == {"choices": [{"text": "x"}], "_seconds": 1.5} and len(again) == 0
    assert again.interrupted().startswith("interrupted after 0 units, 1 requests answered")
    again.close()
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1].replace('"x"', '"y"')]) + "\n")
    with pytest.raises(MegaevalError, match=r"line 2 was edited"):
        Journal(path, {"a": 1}, resume=True)


def test_a_server_that_is_not_there_is_one_line_after_its_retries():
    port = free_port()  # nobody listens: each try is refused at once
    waits: list[float] = []
    client = Client(f"http://127.0.0.1:{port}/v1", "sk-secret", timeout=5, retries=3, sleep=waits.append)
    with pytest.raises(MegaevalError) as refused:
        client.post("/completions", {"prompt": "x"}, "ruler vt at length 1024, instance 3")
    message = str(refused.value)
    assert message.startswith(f"ruler vt at length 1024, instance 3: no answer from http://127.0.0.1:{port}/v1/"
                              "completions after 4 tries (ConnectionRefusedError")  # fmt: skip
    assert "--resume sends only the requests not yet answered" in message and "sk-secret" not in message
    assert waits == [0.5, 1.0, 2.0] and client.retried == 3 and client.scrub("Bearer sk-secret") == "Bearer ***"


class StubServer:
    """A localhost OpenAI-compatible stub serving model "m": /v1/completions answers a text prompt, and answers a
    prompt of ids with `ids_status` (llama-cpp-python's server refuses ids with a 500; vLLM takes them: 200)."""

    def __init__(self, ids_status: int, text_status: int = 200):
        import http.server
        import threading

        self.prompts: list = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply(200, {"data": [{"id": "m"}]})

            def do_POST(self):
                prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
                stub.prompts.append(prompt)
                status = ids_status if isinstance(prompt, list) else text_status
                if status != 200:
                    return self.reply(status, {"detail": "prompt: Input should be a valid string"})
                self.reply(200, {"model": "m", "choices": [{"text": "!", "finish_reason": "length"}]})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("ids_status", "expected"), [(200, "ids"), (422, "text"), (500, "text")])
def test_prompt_auto_asks_once_whether_the_server_reads_ids_and_else_sends_text(ids_status, expected):
    from megaeval.models import ASSETS
    from megaeval.serving.model import open_served

    stub = StubServer(ids_status)
    try:
        lm = open_served(f"openai:{stub.url}", {"tokenizer": str(ASSETS / "transformer-tiny"), "retries": 3})
        assert lm.prompt_format == expected
        assert [isinstance(p, list) for p in stub.prompts] == ([True, False] if ids_status == 500 else [True])
    finally:
        stub.close()


def test_a_server_that_refuses_both_forms_of_the_probe_is_one_line():
    from megaeval.models import ASSETS
    from megaeval.serving.model import open_served

    stub = StubServer(500, text_status=404)
    try:
        refusal = r"refuses a one-token completion, its prompt as ids and as text \(HTTP 404: prompt: Input should"
        with pytest.raises(MegaevalError, match=refusal + r" be a valid string\); check --model-args model=NAME"):
            open_served(f"openai:{stub.url}", {"tokenizer": str(ASSETS / "transformer-tiny")})
    finally:
        stub.close()
