"""Answers from a served model: one request per prompt with every sampling parameter sent, `concurrency` requests in
flight, ordered so that a server's prefix cache can reuse what prompts share, each answer journaled as it arrives
(a resumed run sends no answered request again) and checked (the model that answered, the tokens it read, its
finish reason, its usage counts)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from ..errors import fail
from ..models.base import State
from ..scoring.answering import Grouped, Query, Rule
from ..scoring.decoding import Generation
from .client import RequestError
from .model import ServedModel

SHARED_START = 256  # prompts whose tokens agree this far are sent after the first of them has been answered
FINISH = {"stop": "eos", "length": "length", "eos": "eos", "eos_token": "eos", "stop_sequence": "stop"}


class ServedAnswerer:
    """Answers of `lm` (a ServedModel); answered requests go to `journal` (a run's resume journal, or None), marked
    with `role` (a run's model, or its judge: one journal may hold both, and each reports its own)."""

    def __init__(self, lm: ServedModel, journal: Any | None = None, role: str = "model"):
        self.lm, self.journal, self.role = lm, journal, role
        self.concurrency = lm.server.concurrency
        self.requests_sent = 0  # requests this process sent (a journaled answer is not sent again)
        self.from_journal = 0  # answers a resumed run found journaled
        # every answer of the run by request key, this process's and those an interrupted one journaled
        self.answered: dict[str, dict[str, Any]] = journal.requests if journal is not None else {}
        self.timing: tuple[float, float] | None = None  # the server's reading and decoding are not seen apart

    def keep_in(self, journal: Any | None) -> None:
        """Journal answered requests in `journal` from now on (a judge opened before its run's journal was)."""
        self.journal = journal
        if journal is not None:
            journal.requests.update(self.answered)
            self.answered = journal.requests

    def rows(self, setting: str | int, length: int) -> int:
        """Prompts given at once (`--batch-size`: auto, or N): auto keeps every request slot busy, four times over,
        so that a slow answer holds few others back."""
        return 4 * self.lm.server.concurrency if setting == "auto" else int(setting)

    def read_rate(self, tokens: int, rows: int = 1) -> None:
        """Unknown before the server answers (the cost line counts requests and tokens instead)."""
        return None

    def answer(
        self, prompts: Sequence[Query], rule: Rule, *, shared: bool = False, rows: int = 1,
        after_prompt: Callable[[State], None] | None = None,
    ) -> tuple[list[Generation], int]:  # fmt: skip
        """Each prompt's answer, in order, and the prompt tokens sent for them (`shared`, `rows` and `after_prompt`
        concern a model's state: a server has its own batching and prefix cache)."""
        self._check(rule)
        bodies = [self.body(p, rule, i) for i, p in enumerate(prompts)]
        keys = [hashlib.sha256(json.dumps(b, sort_keys=True).encode()).hexdigest() for b in bodies]
        responses: dict[int, dict[str, Any]] = {}
        for i, key in enumerate(keys):
            found = self.journal.answered(key) if self.journal is not None else None
            if found is not None:
                responses[i] = found
                self.from_journal += 1
        todo = [i for i in range(len(prompts)) if i not in responses]
        for wave in _waves(todo, [prompts[i].ids for i in todo]):
            self._send(wave, prompts, bodies, keys, responses)
        gens = [self._generation(prompts[i], rule, responses[i]) for i in range(len(prompts))]
        return gens, sum(len(p.ids) for p in prompts)

    def answer_groups(
        self, prefix: Query, groups: Sequence[Sequence[Query]], rule: Rule, *, shared: bool = True, rows: int = 1,
        after_prompt: Callable[[State], Any] | None = None,
    ) -> Grouped:  # fmt: skip
        """Prompts that continue `prefix`, each sent whole (the prefix's ids, or text, before its own): the server's
        prefix cache, not megaeval, reuses what they share."""
        flat = [self._joined(prefix, q) for group in groups for q in group]
        answers, _ = self.answer(flat, rule)
        out, at = [], 0
        for group in groups:
            out.append(answers[at : at + len(group)])
            at += len(group)
        return Grouped(out, [[len(q.ids) for q in group] for group in groups], [[None] * len(g) for g in groups])

    @property
    def scores_choices(self) -> bool:
        """False: megaeval does not ask a server for prompt log-probabilities (no server it could be checked against
        here returns them right), so choices are scored by a model in this process only."""
        return False

    def _joined(self, prefix: Query, query: Query) -> Query:
        """`query` after `prefix`, as one prompt (its text from both texts, else decoded from the joined ids)."""
        ids = np.concatenate([np.asarray(prefix.ids, dtype=np.int64), np.asarray(query.ids, dtype=np.int64)])
        text = None if prefix.text is None or query.text is None else prefix.text + query.text
        return Query(ids, text, query.messages, query.name)

    def body(self, query: Query, rule: Rule, index: int) -> dict[str, Any]:
        """The request for `query`: every parameter that changes an answer sent, none left to the server's defaults
        (a model's generation_config.json among them)."""
        server, decoding = self.lm.server, rule.decoding
        body: dict[str, Any] = {"model": self.lm.model_name, "max_tokens": rule.max_new_tokens,
                                "temperature": float(decoding.temperature), "top_p": 1.0, "n": 1, "stream": False,
                                "frequency_penalty": 0.0, "presence_penalty": 0.0}  # fmt: skip
        if self.lm.prompt_format == "messages":
            if query.messages is None:
                raise fail(f"{query.name}: this command builds no chat messages", "use --model-args api=completions")
            body["messages"] = [dict(m) for m in query.messages]
        elif self.lm.prompt_format == "ids":
            body["prompt"] = [int(t) for t in np.asarray(query.ids)]
        else:
            body["prompt"] = self._text(query)
        if rule.stop:
            body["stop"] = list(rule.stop)
        if decoding.temperature > 0:
            body["seed"] = int(decoding.seeds[index]) if decoding.seeds is not None else None
        if server.dialect == "vllm":  # the sampling fields a vLLM or SGLang server would otherwise take from the model
            body.update(top_k=-1, min_p=0.0, repetition_penalty=1.0, min_tokens=decoding.min_new_tokens,
                        stop_token_ids=list(decoding.stop_ids), skip_special_tokens=True)  # fmt: skip
        return body

    def _check(self, rule: Rule) -> None:
        """Refuse a rule the server's API cannot express."""
        needs = rule.decoding.stop_ids or rule.decoding.min_new_tokens
        if needs and self.lm.server.dialect != "vllm":
            raise fail("this task stops at token ids or asks for a minimum answer length, which OpenAI's API cannot "
                       "express", "serve the model with vLLM or SGLang and add --model-args dialect=vllm")  # fmt: skip

    def _text(self, query: Query) -> str:
        """The prompt as text for a server that tokenizes it: its text after BOS, or its ids decoded."""
        if query.text is not None:
            return query.text
        ids = [int(t) for t in np.asarray(query.ids)]
        tok = self.lm.tokenizer
        return tok.decode(ids[1:] if ids and ids[0] == tok.bos_id else ids)

    def _send(self, wave: list[int], prompts: Sequence[Query], bodies: list[dict], keys: list[str],
              responses: dict[int, dict[str, Any]]) -> None:  # fmt: skip
        """Send the requests of `wave`, `concurrency` at a time; journal each answer as it arrives."""
        path = "/chat/completions" if self.lm.prompt_format == "messages" else "/completions"
        with ThreadPoolExecutor(max_workers=self.lm.server.concurrency) as pool:
            pending: dict[Future, int] = {}
            queue = list(reversed(wave))
            try:
                while queue or pending:
                    while queue and len(pending) < self.lm.server.concurrency:
                        i = queue.pop()
                        pending[pool.submit(self._post, path, bodies[i], prompts[i])] = i
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = pending.pop(future)
                        responses[i] = {**future.result(), "_role": self.role}
                        self.requests_sent += 1
                        if self.journal is not None:
                            self.journal.add_request(keys[i], responses[i])
                        else:
                            self.answered[keys[i]] = responses[i]
            finally:
                for future in pending:
                    future.cancel()

    def _post(self, path: str, body: dict[str, Any], query: Query) -> dict[str, Any]:
        """The server's answer to one request, with the seconds it took; a refusal is one line naming the query."""
        start = time.perf_counter()
        try:
            response = self.lm.client.post(path, body, query.name)
        except RequestError as e:
            if e.about_length:
                raise fail(f"{query.name}: the server refused its {len(query.ids):,}-token prompt (with "
                           f"{body['max_tokens']} tokens to generate) for its length ({e.message[:160]})",
                           "use shorter --lengths, or serve the model with a longer context (vLLM: --max-model-len)"
                           ) from None  # fmt: skip
            raise fail(f"{query.name}: the server refused the request (HTTP {e.status}: {e.message[:200]})",
                       "check --model-args model=, api=, dialect= and prompt= against what the server accepts"
                       ) from None  # fmt: skip
        if not isinstance(response, dict):
            raise fail(f"{query.name}: the server's answer is not a JSON object", "check the server")
        return {**response, "_seconds": round(time.perf_counter() - start, 4), "_ids": len(query.ids)}

    def _generation(self, query: Query, rule: Rule, response: dict[str, Any]) -> Generation:
        """The answer a response holds, checked: the requested model answered, with one choice of text."""
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise fail(
                f"{query.name}: the server's answer has no choices ({str(response)[:100]!r})", "check the server"
            )
        model = response.get("model")
        if model is not None and str(model) != self.lm.model_name:
            raise fail(f"{query.name}: answered by model {model!r}, not {self.lm.model_name!r}",
                       "check that the server serves the model named in --model-args model=")  # fmt: skip
        choice = choices[0]
        chat = self.lm.prompt_format == "messages"
        text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
        if not isinstance(text, str):
            text = "" if text is None and choice.get("finish_reason") else text
            if not isinstance(text, str):
                raise fail(
                    f"{query.name}: the server's answer holds no text ({str(choice)[:100]!r})", "check the server"
                )
        cut = min((k for k in (text.find(s) for s in rule.stop if s) if k >= 0), default=-1)
        finish = choice.get("finish_reason")
        reason = "stop" if cut >= 0 or (finish == "stop" and rule.stop and _stopped_on_string(choice)) else None
        reason = reason or FINISH.get(str(finish), str(finish))
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        counted = usage.get("prompt_tokens")
        if self.lm.prompt_format == "ids" and isinstance(counted, int) and counted != len(query.ids):
            raise fail(
                f"{query.name}: the server read {counted:,} prompt tokens for the {len(query.ids):,} ids sent",
                "check that the server takes token ids as the prompt (else --model-args prompt=text)",
            )
        served = {"finish_reason": finish, "server_prompt_tokens": counted,
                  "completion_tokens": usage.get("completion_tokens")}  # fmt: skip
        return Generation(text[:cut] if cut >= 0 else text, [], reason, served)

    def stats(self) -> dict[str, Any]:
        """What the report records of the run's requests (an interrupted run's journaled ones included, so that a
        resumed run records what an uninterrupted one would): how many, the tokens the server counted, prompts it
        counted otherwise than megaeval built them, latency per request, generated tokens per second of requests;
        and of this process: requests sent, answers found journaled, tries made again."""
        answers = [a for a in self.answered.values() if a.get("_role", "model") == self.role]
        usage = [a.get("usage") if isinstance(a.get("usage"), dict) else {} for a in answers]
        tokens = {name: sum(u[name] for u in usage if isinstance(u.get(name), int))
                  for name in ("prompt_tokens", "completion_tokens")}  # fmt: skip
        lat = sorted(float(a.get("_seconds", 0.0)) for a in answers)
        pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: None)
        busy = sum(lat)
        odd = sum(isinstance(u.get("prompt_tokens"), int) and u["prompt_tokens"] != a.get("_ids")
                  for u, a in zip(usage, answers, strict=True))  # fmt: skip
        return {"requests": len(answers), "concurrency": self.lm.server.concurrency, **tokens,
                "prompt_token_mismatches": odd,
                "latency_seconds": {"mean": round(busy / len(lat), 4) if lat else None, "p50": pick(0.5),
                                    "p95": pick(0.95), "max": lat[-1] if lat else None},
                "completion_tokens_per_request_second": round(tokens["completion_tokens"] / busy, 2) if busy else None,
                "this_process": {"requests_sent": self.requests_sent, "answers_from_journal": self.from_journal,
                                 "retried": self.lm.client.retried}}  # fmt: skip


def _stopped_on_string(choice: dict[str, Any]) -> bool:
    """Whether a server says the answer ended on a stop string (vLLM's stop_reason holds it), not on EOS."""
    return isinstance(choice.get("stop_reason"), str)


def _waves(todo: list[int], ids: list[Any]) -> list[list[int]]:
    """The requests in the order a prefix cache can use: by their tokens, so prompts sharing a start are adjacent;
    the first of each run of prompts sharing SHARED_START tokens or more goes in the first wave, the rest in the
    second, once the server has read that start."""
    if not todo:
        return []
    arrays = [np.asarray(a) for a in ids]
    order = sorted(range(len(todo)), key=lambda k: tuple(arrays[k][:SHARED_START].tolist()))
    first, later = [], []
    for pos, k in enumerate(order):
        prev = order[pos - 1] if pos else None
        shares = prev is not None and _common(arrays[prev], arrays[k]) >= SHARED_START
        (later if shares else first).append(todo[k])
    return [w for w in (first, later) if w]


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
