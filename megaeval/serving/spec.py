"""Served model specs: `openai:BASE_URL` and the --model-args that say which model, which API, which tokenizer and
how to talk to the server; each checked in one line before any request is sent."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from ..errors import fail

PREFIX = "openai:"
APIS = ("completions", "chat")
PROMPTS = ("auto", "ids", "text")  # how a completions prompt goes: token ids, text, or ids where the server takes them
DIALECTS = ("openai", "vllm")  # the request fields sent: OpenAI's only, or also vLLM's and SGLang's sampling fields


@dataclass(frozen=True)
class ServerSpec:
    """A served model: where it is and how requests are made. Every field but `base_url` is a --model-args key."""

    base_url: str
    model: str | None = None  # the served model's name (None: the server's only model, from /v1/models)
    api: str = "completions"
    tokenizer: str | None = None  # the tokenizer prompts are built and fitted with (any tokenizer spec megaeval reads)
    concurrency: int = 8  # requests in flight
    api_key_env: str | None = None  # the environment variable holding the API key (never the key itself)
    timeout: float = 600.0  # seconds one request may take before it is tried again
    retries: int = 5  # tries after the first, on connection errors, timeouts, 429 and 5xx
    max_context: int | None = None  # the server's context in tokens (None: /v1/models' max_model_len, else unknown)
    prompt: str = "auto"
    dialect: str = "openai"

    def options(self) -> dict[str, Any]:
        """The --model-args a report records (the key's variable name, never its value)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "base_url"}


OPTIONS = tuple(f.name for f in fields(ServerSpec) if f.name != "base_url")
# How requests travel, not what they ask: a resumed run may change these (more retries once a server has died)
TRANSPORT = ("concurrency", "api_key_env", "timeout", "retries")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_served(spec: Any) -> bool:
    """Whether a model spec names a model behind a server (`openai:BASE_URL`)."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


def answer_settings(spec: Any, model_args: dict[str, Any]) -> dict[str, Any]:
    """The --model-args that can change a served model's answers (all of them for a model loaded here): what a
    resumed run must share with the interrupted one."""
    return {k: v for k, v in model_args.items() if k not in TRANSPORT} if is_served(spec) else dict(model_args)


def refuse_served(spec: Any, what: str, why: str) -> None:
    """One line when a step that needs the model itself (its state, its weights) is given a served model."""
    if is_served(spec):
        raise fail(f"{what} {why}; a served model ({spec}) answers prompts over HTTP and holds no state megaeval can "
                   "carry", "run the model in-process (--model DIR or FAMILY:PATH)")  # fmt: skip


def server_spec(spec: str, options: dict[str, Any]) -> ServerSpec:
    """The spec and its --model-args, checked: a URL without credentials, known options of the right types, a
    tokenizer, and the API key's variable set when one is named."""
    url = spec[len(PREFIX) :].strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(f"--model {spec}: {url!r} is not an http(s) URL", "write openai:http://HOST:PORT/v1")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise fail(f"--model {PREFIX}{parts.scheme}://{parts.hostname}...: the URL holds credentials, a query or a "
                   "fragment, which a report would record", "give the base URL alone and the key through "
                   "--model-args api_key_env=VARIABLE")  # fmt: skip
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise fail(f"unknown option(s) {', '.join(unknown)} for a served model", f"accepted: {', '.join(OPTIONS)}")
    served = ServerSpec(url, **{k: _typed(k, v) for k, v in options.items()})
    for name, allowed in (("api", APIS), ("prompt", PROMPTS), ("dialect", DIALECTS)):
        if getattr(served, name) not in allowed:
            raise fail(f"--model-args {name}={getattr(served, name)!r}", f"use one of: {', '.join(allowed)}")
    if served.tokenizer is None:
        raise fail(
            f"--model {spec} needs a tokenizer: prompts are built, fitted to lengths and counted with it",
            "add --model-args tokenizer=DIR (the served model's tokenizer folder, or any tokenizer spec)",
        )
    if served.api_key_env is not None:
        if not _ENV_NAME.fullmatch(served.api_key_env):
            raise fail(f"--model-args api_key_env={served.api_key_env!r} is not an environment variable's name",
                       "name the variable that holds the key, e.g. api_key_env=OPENAI_API_KEY")  # fmt: skip
        if not os.environ.get(served.api_key_env):
            raise fail(f"--model-args api_key_env={served.api_key_env}: that environment variable is not set",
                       f"export {served.api_key_env}=... before the run")  # fmt: skip
    return served


_INTS = {"concurrency": (1, 4096), "retries": (0, 100), "max_context": (1, 1 << 40)}


def _typed(name: str, value: Any) -> Any:
    """A --model-args value as its field wants it (parse_model_args made numbers of numbers already)."""
    if name in _INTS:
        low, high = _INTS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise fail(f"--model-args {name}={value!r} must be a whole number from {low} to {high}", f"write {name}=N")
        return value
    if name == "timeout":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e7:
            raise fail(f"--model-args timeout={value!r} must be a positive number of seconds", "write timeout=600")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise fail(f"--model-args {name}={value!r} must be a non-empty text", f"write {name}=NAME")
    return value
