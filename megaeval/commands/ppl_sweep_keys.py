"""`ppl-sweep --key-tokens F` / `--evaluator E`: LongPPL beside perplexity at every length. The key-token spans of
each book (from the file, or an evaluator reading the book whole) become the model's key target positions in the
stream (`scoring.stream_keys`); the sweep sums each segment's losses there."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..files import file_sha256
from ..metrics.longppl import KeySettings
from ..models import StreamingLM
from ..runs.report import model_facts
from ..scoring.key_tokens import load_evaluator
from ..scoring.stream_keys import evaluator_spans, file_spans, stream_key_positions
from ..streams import BooksStream
from ..tasks.longppl.data import check_chars, key_identity, key_settings, read_key_file

EVALUATOR_BATCH = 8  # short-context windows read together (changes no number)


@dataclass
class KeyedSweep:
    """A sweep's key tokens: where they come from, the settings that found them, their stream positions."""

    stream: BooksStream
    key: KeySettings
    texts: dict[str, str]
    key_tokens: str | None
    evaluator: str | None
    evaluator_args: dict[str, Any]
    dtype: str
    held: dict[str, Any] | None = None
    spans: dict[str, list[tuple[int, int]]] | None = None  # each book's, by sha256 (None: the evaluator finds them)
    evaluator_facts: dict[str, Any] = field(default_factory=dict)
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def open(cls, settings: Any, stream: BooksStream) -> KeyedSweep | None:
        """The key tokens a sweep's settings ask for (None: none), checked before any model is loaded."""
        if settings.key_tokens is None and settings.evaluator is None:
            return None  # (the key-token flags were refused without them: SweepSettings' check_key_modes)
        held = read_key_file(settings.key_tokens) if settings.key_tokens else None
        key = key_settings(settings, held, settings.key_tokens)
        spans = file_spans(stream, held, settings.key_tokens) if held else None  # every book held, before reading them
        texts = stream.book_texts()
        if held is not None:  # the file's spans were checked against its chars: those must be the book's
            for number, doc in enumerate(held["documents"]):
                if doc["sha256"] in texts:
                    check_chars(doc, texts[doc["sha256"]], settings.key_tokens, number)
        return cls(stream, key, texts, settings.key_tokens, settings.evaluator,
                   settings.evaluator_args, settings.dtype, held, spans)  # fmt: skip

    def prepare(self, lm: StreamingLM) -> dict[str, Any]:
        """Find (or read) every book's spans and lay them on the stream for `lm`'s tokens; what identifies them."""
        spans = self.spans
        if self.held is not None:
            self.evaluator_facts = self.held["evaluator"]
        else:
            evaluator = load_evaluator(self.evaluator, self.evaluator_args, lm, self.dtype)
            self.evaluator_facts = model_facts(evaluator)
            spans = evaluator_spans(self.stream, self.texts, evaluator, self.key, EVALUATOR_BATCH)
        self.positions = stream_key_positions(self.stream, self.texts, lm.tokenizer, spans)
        return key_identity(self.evaluator_facts, asdict(self.key), self.key_tokens)

    def settings(self) -> dict[str, Any]:
        """The key settings as used, for the report's settings."""
        return asdict(self.key)

    def describe(self) -> dict[str, Any]:
        """The report's data.key_tokens: the file or evaluator, and how many key tokens the stream holds."""
        return {"file": self.key_tokens, "sha256": file_sha256(self.key_tokens) if self.key_tokens else None,
                "evaluator": self.evaluator_facts, "stream_key_tokens": int(len(self.positions))}  # fmt: skip
