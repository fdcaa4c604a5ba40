"""HTTP to an OpenAI-compatible server: JSON requests with a timeout, bounded retries with backoff on what a busy or
restarting server answers (connection errors, timeouts, 429, 5xx), then one line naming the request. The API key
goes in a header and nowhere else: every text a server sends back is scrubbed of it before it reaches a message."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from ..errors import fail

RETRIED_STATUS = {408, 425, 429}  # and every 5xx: the server is busy, restarting or overloaded
BACKOFF_S = 0.5  # the first wait; it doubles with each try, to MAX_BACKOFF_S
MAX_BACKOFF_S = 30.0
LENGTH_WORDS = ("context length", "maximum context", "too long", "context window", "max_model_len", "exceeds")


class RequestError(Exception):
    """A request the server refused for good (a 4xx other than those retried): its status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message

    @property
    def about_length(self) -> bool:
        """Whether the server says the prompt (with its tokens to generate) is longer than its context."""
        return any(word in self.message.lower() for word in LENGTH_WORDS)


class Client:
    """Requests to one server, safe to share between threads; counts the tries it made again (`retried`)."""

    def __init__(self, base_url: str, key: str | None, timeout: float, retries: int, sleep=time.sleep):
        self.base_url, self._key, self.timeout, self.retries = base_url, key, timeout, retries
        self._sleep = sleep
        self._lock = threading.Lock()
        self.retried = 0
        self.sent = 0

    def scrub(self, text: str) -> str:
        """`text` with the API key written as ***."""
        return text.replace(self._key, "***") if self._key else text

    def get(self, path: str, what: str) -> Any:
        """The JSON a GET of `path` answers."""
        return self._call(path, None, what)

    def post(self, path: str, body: dict[str, Any], what: str, retry_5xx: bool = True) -> Any:
        """The JSON a POST of `body` to `path` answers; a refusal raises RequestError (a 5xx too, without
        `retry_5xx`: a probe that some servers refuse with a 500)."""
        return self._call(path, body, what, retry_5xx)

    def _call(self, path: str, body: dict[str, Any] | None, what: str, retry_5xx: bool = True) -> Any:
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last = ""
        for attempt in range(self.retries + 1):
            wait = min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
            try:
                with self._lock:
                    self.sent += 1
                request = urllib.request.Request(
                    url, data=data, headers=headers, method="GET" if data is None else "POST"
                )
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                return self._json(raw, what)
            except urllib.error.HTTPError as e:
                message = self._message(e)
                if e.code not in RETRIED_STATUS and (e.code < 500 or not retry_5xx):
                    raise RequestError(e.code, message) from None
                last = f"HTTP {e.code}: {message}"
                wait = max(wait, _retry_after(e.headers.get("Retry-After")))
            except (http.client.HTTPException, OSError) as e:  # refused, reset, timed out, cut short
                reason = getattr(e, "reason", None) or e
                last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
            if attempt < self.retries:
                with self._lock:
                    self.retried += 1
                self._sleep(wait)
        raise fail(f"{what}: no answer from {url} after {self.retries + 1} tries ({self.scrub(last)[:200]})",
                   "check that the server runs and is reachable (--model-args timeout=S, retries=N give it longer); "
                   "the same command with --resume sends only the requests not yet answered")  # fmt: skip

    def _json(self, raw: bytes, what: str) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            snippet = self.scrub(raw[:80].decode("utf-8", "replace"))
            raise fail(f"{what}: the server's answer is not JSON ({snippet!r})",
                       "check that --model points at an OpenAI-compatible /v1 base URL") from None  # fmt: skip

    def _message(self, e: urllib.error.HTTPError) -> str:
        """The error text a server sent with a refusal (OpenAI's {"error": {"message"}}, FastAPI's {"detail"})."""
        try:
            raw = e.read()[:2000].decode("utf-8", "replace")
        except OSError:
            raw = ""
        try:
            body = json.loads(raw)
            error = body.get("error", body) if isinstance(body, dict) else body
            text = error.get("message") or error.get("detail") or raw if isinstance(error, dict) else str(error)
        except ValueError:
            text = raw or e.reason
        return self.scrub(" ".join(str(text).split()))[:300]


def _retry_after(value: str | None) -> float:
    """Seconds a Retry-After header asks for (a number; a date is not waited for), at most MAX_BACKOFF_S."""
    try:
        return min(max(float(value), 0.0), MAX_BACKOFF_S) if value else 0.0
    except ValueError:
        return 0.0
