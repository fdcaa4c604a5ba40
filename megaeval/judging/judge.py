"""A judge: any model megaeval can ask (a served one through its chat API, or one in this process through its chat
template) asked with judge prompts, greedy by default as FastChat's judges are (temperature 0, 2,048 tokens), each
reply parsed as FastChat parses it and cached by (judge, rendered prompt, settings) in a file, so that judging the
same answers again, or resuming, asks the judge nothing twice."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import fail
from ..scoring.answering import Answerer, Rule, chat_query, chat_template_of
from ..scoring.chat import ChatTemplate
from ..scoring.decoding import GREEDY, Decoding, check_temperature
from ..text import iter_jsonl
from .parse import rating, verdict
from .prompts import JudgePrompt


@dataclass(frozen=True)
class JudgeSettings:
    """How the judge decodes: FastChat asks its judges at temperature 0 for at most 2,048 tokens."""

    temperature: float = 0.0
    max_tokens: int = 2048

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and self.max_tokens >= 1):
            raise fail(f"bad judge settings (temperature {self.temperature}, max_tokens {self.max_tokens})",
                       "use a temperature of 0 or more and at least one token")  # fmt: skip
        check_temperature(self.temperature, "judge temperature")


@dataclass(frozen=True)
class Judgment:
    """One reply of the judge: the prompt it was asked with, the turns it read, its text, what that text says (a
    rating, -1 when it gives none; or "A", "B", "tie", "error") and whether it came from the cache."""

    prompt: str
    turns: tuple[dict[str, str], ...]
    reply: str
    score: float | int | str
    cached: bool


class JudgeCache:
    """Replies by key in a JSONL file (one {"key", "reply"} a line, each written and fsynced as it comes), read whole
    when opened; None: kept in memory only."""

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self.replies: dict[str, str] = {}
        if self.path is not None and self.path.exists():
            for number, row in iter_jsonl(self.path, "judge cache", "delete the file to ask the judge again"):
                if not (
                    isinstance(row, dict) and isinstance(row.get("key"), str) and isinstance(row.get("reply"), str)
                ):
                    raise fail(f"judge cache {self.path} line {number} is not a {{key, reply}} record",
                               "delete the file to ask the judge again")  # fmt: skip
                self.replies[row["key"]] = row["reply"]

    def add(self, key: str, reply: str) -> None:
        """Keep one reply, durably."""
        self.replies[key] = reply
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "reply": reply}, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())


class Judge:
    """`answerer`'s model as a judge (`settings`), its replies cached in `cache`."""

    def __init__(self, answerer: Answerer, settings: JudgeSettings = JudgeSettings(), cache: str | Path | None = None):
        self.answerer, self.settings, self.cache = answerer, settings, JudgeCache(cache)
        lm = answerer.lm
        self.template: ChatTemplate | None = chat_template_of(lm)  # None: a chat API renders the turns itself
        self.asked = 0  # requests this judge sent (cached replies are not asked again)
        # what identifies its replies (a cache key's first part): its model, its template, its settings
        model = getattr(lm, "model_name", None) or lm.weights_sha256()
        self.identity = {"spec": lm.spec, "model": model, "template": self.template.sha256 if self.template else None,
                         "settings": asdict(self.settings)}  # fmt: skip

    def facts(self, prompts: list[JudgePrompt]) -> dict[str, Any]:
        """What a report records of the judge: its model's facts, template, settings, prompts and cache."""
        lm = self.answerer.lm
        return {"spec": lm.spec, "model": {"options": lm.options(), **lm.describe()},
                "template": self.template.facts() if self.template else None, "settings": asdict(self.settings),
                "prompts": {p.name: p.sha256 for p in prompts},
                "cache": str(self.cache.path) if self.cache.path else None}  # fmt: skip

    def judge(self, asks: list[tuple[JudgePrompt, dict[str, str]]], rows: int = 1) -> list[Judgment]:
        """The judge's reply to each (prompt, fields), in order: from the cache where it answered before, else
        asked (all that are new, together; a model in this process decodes `rows` of them at once)."""
        turns = [prompt.render(fields) for prompt, fields in asks]
        keys = [self._key(t) for t in turns]
        new = [i for i, k in enumerate(keys) if k not in self.cache.replies]
        if new:
            queries = [chat_query(self.answerer.lm, self.template, turns[i], f"judging with {asks[i][0].name}, "
                                  f"request {i + 1}") for i in new]  # fmt: skip
            seeds = tuple(int(keys[i][:12], 16) for i in new) if self.settings.temperature > 0 else None
            decoding = Decoding(self.settings.temperature, seeds) if seeds else GREEDY
            answers, _ = self.answerer.answer(queries, Rule(self.settings.max_tokens, (), decoding), rows=rows)
            for i, answer in zip(new, answers, strict=True):
                self.cache.add(keys[i], answer.text)
            self.asked += len(new)
        out = []
        for i, ((prompt, _), key) in enumerate(zip(asks, keys, strict=True)):
            reply = self.cache.replies[key]
            score = rating(reply) if prompt.type == "single" else verdict(reply, prompt.output_format)
            out.append(Judgment(prompt.name, turns[i], reply, score, i not in new))
        return out

    def _key(self, turns: tuple[dict[str, str], ...]) -> str:
        return hashlib.sha256(json.dumps([self.identity, turns], sort_keys=True).encode()).hexdigest()
