"""A model behind an OpenAI-compatible server, as the commands see a model: a tokenizer to build and fit prompts with,
a context length, and the facts a report records. It answers prompts through `serving.answers`; whatever needs the
model's state (a carried-state sweep, chunk parallel) is refused in one line."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import fail
from ..models import load_tokenizer, naming
from ..models.base import State, StreamingLM
from .client import Client, RequestError
from .spec import PREFIX, ServerSpec, server_spec

STATELESS = ("this step needs the model's state, and a served model answers prompts over HTTP only",
             "run the model in-process (--model DIR or FAMILY:PATH)")  # fmt: skip
PROBE = "Hello"  # the text of the one request that asks whether the server reads token ids


class ServedModel(StreamingLM):
    """A served model: `tokenizer`, `max_context`, its facts; `client` makes the requests (`serving.answers`)."""

    family = "openai"
    path = None

    def __init__(self, spec: ServerSpec, client: Client, tokenizer: Any, served: dict[str, Any], prompt_format: str):
        self.server, self.client, self.tokenizer = spec, client, tokenizer
        self.model_name = str(served["id"])
        self.served = served  # the server's /v1/models entry for the model
        self.prompt_format = prompt_format  # "ids" or "text" (completions), "messages" (chat)
        listed = served.get("max_model_len")
        self.max_context = spec.max_context or (listed if isinstance(listed, int) and listed > 0 else None)
        self.device = torch.device("cpu")  # where megaeval runs; the model runs on the server
        self.dtype = "server"

    @property
    def spec(self) -> str:
        return PREFIX + self.server.base_url

    def init_state(self, batch_size: int) -> State:
        raise fail(*STATELESS)

    def forward(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        raise fail(*STATELESS)

    def score(self, inputs: torch.Tensor, targets: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        raise fail(*STATELESS)

    def describe(self) -> dict[str, Any]:
        """What a report records: the server, the model it serves, how prompts go, the tokenizer."""
        return {
            "family": self.family, "base_url": self.server.base_url, "served_model": self.model_name,
            "api": self.server.api, "prompt_format": self.prompt_format, "dialect": self.server.dialect,
            "server_template_applied": self.server.api == "chat", "max_context": self.max_context,
            "server_model_entry": {k: v for k, v in self.served.items() if isinstance(v, (str, int, float, bool))},
            "tokenizer": self.tokenizer.describe(),
        }  # fmt: skip

    def options(self) -> dict[str, Any]:
        return self.server.options()

    def info_rows(self) -> list[tuple[str, str]]:
        return [("server", self.server.base_url), ("model", self.model_name), ("api", self.server.api),
                ("prompts as", self.prompt_format), ("max context", str(self.max_context or "unknown")),
                ("tokenizer", str(self.server.tokenizer))]  # fmt: skip


def open_served(spec: str, model_args: dict[str, Any]) -> ServedModel:
    """The served model `spec` names, after asking the server which models it serves (and, for completions with
    prompt=auto, whether it reads token ids: one request of one token)."""
    server = server_spec(spec, model_args)
    key = os.environ.get(server.api_key_env) if server.api_key_env else None
    client = Client(server.base_url, key, server.timeout, server.retries)
    listing = client.get("/models", f"asking {server.base_url} which models it serves")
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries) or not entries:
        raise fail(f"{server.base_url}/models lists no models ({str(listing)[:80]!r})",
                   "check that --model points at an OpenAI-compatible /v1 base URL")  # fmt: skip
    ids = [str(e["id"]) for e in entries]
    if server.model is None and len(ids) > 1:
        raise fail(
            f"{server.base_url} serves {len(ids)} models ({', '.join(ids[:5])})", "name one: --model-args model=NAME"
        )
    wanted = server.model if server.model is not None else ids[0]
    if wanted not in ids:
        raise fail(f"{server.base_url} does not serve model {wanted!r} (it serves {', '.join(ids[:5])})",
                   "name one of those: --model-args model=NAME")  # fmt: skip
    with naming("--model-args tokenizer=", server.tokenizer):
        tokenizer = load_tokenizer(server.tokenizer)
    served = entries[ids.index(wanted)]
    return ServedModel(server, client, tokenizer, served, _prompt_format(server, client, tokenizer, wanted))


def _prompt_format(server: ServerSpec, client: Client, tokenizer: Any, model: str) -> str:
    """How prompts go: messages (chat); ids or text as asked; under auto, ids if the server takes a prompt of ids,
    text if it refuses them (a 4xx); a 5xx (llama-cpp-python answers ids with a 500) is not tried again but read as
    a refusal once the same prompt as text is answered (a server that answers neither is a fault)."""
    if server.api == "chat":
        return "messages"
    if server.prompt != "auto":
        return server.prompt
    body = {"model": model, "prompt": tokenizer.encode(PROBE), "max_tokens": 1, "temperature": 0.0}
    try:
        client.post("/completions", body, f"asking {server.base_url} whether it reads token ids", retry_5xx=False)
        return "ids"
    except RequestError as e:
        if e.status < 500:
            return "text"
    try:
        client.post("/completions", {**body, "prompt": PROBE}, f"asking {server.base_url} for a completion")
    except RequestError as e:
        raise fail(f"{server.base_url} refuses a one-token completion, its prompt as ids and as text ({e})",
                   "check --model-args model=NAME, and that the server answers /v1/completions (or pass "
                   "api=chat)") from None  # fmt: skip
    return "text"
