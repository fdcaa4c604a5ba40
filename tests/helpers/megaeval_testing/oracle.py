"""A StreamingLM that is given the answer: it reads bytes, finds the needles the question asks about in what it has
read (a regular expression, not a model) and greedily spells their values, then EOS. With `window=W` it only sees
the last W characters, as a model that forgets would. It lets tests run `megaeval needle` end to end and know
what every score must be.

With `answers` (oracle.json's list of [prompt, answer] pairs) it is given the answer outright: after reading one
of those prompts whole it spells that answer (how tests run `megaeval ruler`, whose tasks a regular expression does
not solve).

Register it by importing this module; load it as `oracle:DIR` (DIR holds oracle.json, which may set "window").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from megaeval.models.base import StreamingLM
from megaeval.models.registry import Family, register

BOS, EOS, VOCAB = 256, 257, 258
PASSKEY = re.compile(r"The pass key is (\d+)\. Remember it\.")
ASKED = re.compile(r"What (?:is|are all) the special magic \w+ for (.+?) mentioned in the provided text\?")
CUES = ("What is the pass key? The pass key is", "mentioned in the provided text is",
        "mentioned in the provided text are")  # fmt: skip


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then BOS and EOS."""

    vocab_size, bos_id, eos_id, adds_bos = VOCAB, BOS, EOS, True

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def describe(self) -> dict[str, Any]:
        return {"kind": "bytes", "vocab_size": VOCAB, "bos_id": BOS, "eos_id": EOS}


@dataclass
class OracleState:
    """Everything read, per row (a test double: a real state does not grow)."""

    texts: list[bytearray] = field(default_factory=list)

    def clone(self) -> OracleState:
        return OracleState([bytearray(t) for t in self.texts])

    def repeat(self, n: int) -> OracleState:
        return OracleState([bytearray(t) for t in self.texts for _ in range(n)])

    def nbytes(self) -> int:
        return 0


def answer_for(text: str, window: int = 0) -> str | None:
    """What the oracle says after the cue at the end of `text` (None: no question asked yet)."""
    cue = max((text.rfind(c) + len(c) for c in CUES if c in text), default=-1)
    if cue < 0:
        return None
    seen = text[:cue] if not window else text[max(0, cue - window) : cue]
    if "pass key" in text[cue - 40 : cue]:
        keys = PASSKEY.findall(seen)
        return f" {keys[-1]}." if keys else " I do not know."
    asked = ASKED.findall(text[:cue])
    if not asked:
        return " I do not know."
    keys = asked[-1].replace(", and ", ", ").split(", ")
    values = []
    for key in keys:
        values += re.findall(rf"One of the special magic \w+ for {re.escape(key)} is: ([^\s.]+)\.", seen)
    return " " + ", ".join(values) + "." if values else " I do not know."


class OracleLM(StreamingLM):
    """Spells the asked needles' values after the question's cue, one byte per step, then EOS."""

    family = "oracle"
    max_context = None

    def __init__(self, path: Path, window: int = 0, answers: list[list[str]] | None = None):
        self.path, self.window, self.answers = path, window, answers or []
        self.tokenizer = ByteTokenizer()
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def init_state(self, batch_size: int) -> OracleState:
        return OracleState([bytearray() for _ in range(batch_size)])

    def _read(self, tokens: torch.Tensor, state: OracleState) -> None:
        for row, ids in zip(state.texts, tokens.tolist(), strict=True):
            row.extend(i for i in ids if i < 256)

    def forward(self, tokens: torch.Tensor, state: OracleState) -> tuple[torch.Tensor, OracleState]:
        self._read(tokens, state)
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], VOCAB)
        if getattr(self, "_given", None) is None:  # the given answers as UTF-8 (spelled a byte at a time)
            self._given = [(p.encode("utf-8"), a.encode("utf-8")) for p, a in self.answers]
        for b, row in enumerate(state.texts):
            given = next(((prompt, said) for prompt, said in self._given if row.startswith(prompt)), None)
            if given is not None:
                said, answer = bytes(row[len(given[0]) :]), given[1]
                nxt = EOS if not answer.startswith(said) or said == answer else answer[len(said)]
                logits[b, -1, nxt] = 1.0
                continue
            text = row.decode("utf-8", errors="replace")
            cue = max((text.rfind(c) + len(c) for c in CUES if c in text), default=-1)
            answer = answer_for(text, self.window)
            said = text[cue:] if cue >= 0 else ""
            nxt = EOS if answer is None or not answer.startswith(said) or said == answer else answer[len(said)]
            logits[b, -1, nxt if isinstance(nxt, int) else ord(nxt)] = 1.0
        return logits, state

    def score(self, inputs: torch.Tensor, targets: torch.Tensor, state: OracleState) -> tuple[torch.Tensor, Any]:
        self._read(inputs, state)
        return torch.zeros(inputs.shape, dtype=torch.float32), state

    def describe(self) -> dict[str, Any]:
        return {"family": "oracle", "window": self.window, "tokenizer": self.tokenizer.describe()}

    def options(self) -> dict[str, Any]:
        return {"window": self.window}

    def info_rows(self) -> list[tuple[str, str]]:
        return [("family", "oracle")]


def load_oracle(path: Path, device: Any = None, dtype: Any = None, *, window: int | None = None) -> OracleLM:
    """The oracle of DIR/oracle.json (its "window", unless the option gives one)."""
    config = json.loads((Path(path) / "oracle.json").read_text())
    return OracleLM(Path(path), config.get("window", 0) if window is None else window, config.get("answers"))


def save_oracle(folder: Path, window: int = 0, answers: list[tuple[str, str]] | None = None) -> Path:
    """A checkpoint folder for the oracle (given `answers`: (prompt, answer) pairs)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "oracle.json").write_text(json.dumps({"window": window, "answers": answers or []}))
    return folder


register(Family("oracle", detect=lambda p: (Path(p) / "oracle.json").is_file(), load=load_oracle,
                load_tokenizer=lambda p, **_: ByteTokenizer(), options={"window": None}))  # fmt: skip
