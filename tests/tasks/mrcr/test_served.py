"""MRCR through a chat API (`--model openai:URL --model-args api=chat`): the server is sent each record's messages
exactly as given (no system turn added), and its replies are graded by the card's grade(). A stub server on
localhost answers each request with the record's answer, looked up by the last message."""

from __future__ import annotations

import http.server
import json
import threading

from megaeval.commands.mrcr import MrcrSettings, run_mrcr
from megaeval.models import ASSETS
from megaeval.tasks.mrcr.data import read_records, record_messages
from megaeval.tasks.mrcr.o200k import o200k
from megaeval_testing import REPO

DATA = REPO / "tests" / "fixtures" / "mrcr" / "current"


class ChatStub:
    """An OpenAI-compatible chat server that answers a chat ending with a record's last message by its answer."""

    def __init__(self, answers: dict[str, str]):
        self.requests: list[dict] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply({"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                text = answers.get(body["messages"][-1]["content"], "I do not know.")
                self.reply({"model": "m", "choices": [{"message": {"role": "assistant", "content": text},
                                                       "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 10, "completion_tokens": 5}})  # fmt: skip

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_chat_api_is_sent_the_messages_as_given_and_its_replies_are_graded(tmp_path):
    records, _ = read_records(DATA, o200k(), needles=[2, 8])
    messages = {r.id: record_messages(r) for r in records}
    stub = ChatStub({m[-1]["content"]: r.answer for r, m in ((r, messages[r.id]) for r in records)})
    try:
        args = {"tokenizer": str(ASSETS / "transformer-tiny"), "api": "chat", "retries": 0}
        report = run_mrcr(MrcrSettings(model=f"openai:{stub.url}", model_args=args, data=str(DATA), needles="2,8",
                                       max_new_tokens=64, out=str(tmp_path / "r.json")), progress=False)  # fmt: skip
    finally:
        stub.close()
    assert report["results"]["mean"] == 1.0 and report["results"]["n"] == 4
    chosen = report["settings"]
    assert chosen["render_effective"] == "template" and chosen["chat_template_effective"] is None  # the server's
    sent = sorted(json.dumps(q["messages"]) for q in stub.requests)
    assert sent == sorted(json.dumps(m) for m in messages.values())  # every record's messages, nothing added
    assert all(q["max_tokens"] == 64 and q["temperature"] == 0 for q in stub.requests)
