"""The one seam every command that generates asks: answers to prompts under a decoding rule. A model in this process
answers through the StreamingLM state machinery (`scoring.generate`: shared starts read once, rows decoded
together); a served model answers over HTTP (`serving.answers`). Commands build `Query`s and a `Rule` and never ask
which backend answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from ..models.base import State, StreamingLM
from .chat import ChatFormat, ChatTemplate, chat_bos, conversation, select_template, single_turn
from .decoding import GREEDY, Decoding, Generation
from .generate import Clock, decode_rows, generate_branches, read_prompts, read_rate, rows_per_batch
from .loglik import read_prefix


@dataclass(frozen=True)
class Query:
    """One prompt: the ids a model reads (BOS, template and answer prefix included); the same prompt as text after
    BOS (None: decoded from the ids where a server takes text); its turns for a chat API; a name for messages."""

    ids: np.ndarray | list[int]
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    name: str = "a prompt"


@dataclass(frozen=True)
class Rule:
    """How answers are decoded: at most `max_new_tokens`, cut before the first `stop` string, greedy or as
    `decoding` says (seeded sampling, stop ids, a minimum length)."""

    max_new_tokens: int
    stop: tuple[str, ...] = ()
    decoding: Decoding = GREEDY


@dataclass
class Grouped:
    """Answers to groups of prompts that continue one prefix, by group: each prompt's Generation, the prompt tokens
    read for it after the prefix (a start shared in its group counted once), and what `after_prompt` said of its
    state (None where no state was read)."""

    answers: list[list[Generation]]
    read: list[list[int]]
    notes: list[list[Any]]


class Answerer(Protocol):
    """Answers to prompts: each prompt's Generation, in order, and the prompt tokens the model read for them; how
    many prompts to give it at once; how fast it reads a prompt and decodes a row among `rows` (None: not known
    before it answers); `timing`: the
    seconds its last call spent reading prompts and decoding answers (None: not known, a server's)."""

    lm: StreamingLM
    timing: tuple[float, float] | None

    def rows(self, setting: str | int, length: int) -> int: ...

    def read_rate(self, tokens: int, rows: int = 1) -> tuple[float, float] | None: ...

    def answer(
        self, prompts: Sequence[Query], rule: Rule, *, shared: bool = False, rows: int = 1,
        after_prompt: Callable[[State], None] | None = None,
    ) -> tuple[list[Generation], int]: ...  # fmt: skip

    def answer_groups(
        self, prefix: Query, groups: Sequence[Sequence[Query]], rule: Rule, *, shared: bool = True, rows: int = 1,
        after_prompt: Callable[[State], Any] | None = None,
    ) -> Grouped: ...  # fmt: skip

    @property
    def scores_choices(self) -> bool: ...


class LocalAnswerer:
    """A model in this process: prompts read as `generate_branches` reads them (`shared`: a start shared with the next
    prompt read once, in the order given; otherwise longest first, so that rows decoded together have like lengths
    and pad little), `rows` decoded together; `after_prompt` sees each prompt's state."""

    def __init__(self, lm: StreamingLM):
        self.lm = lm
        self._prefixes: dict[tuple[int, ...], State] = {}
        self.timing: tuple[float, float] | None = None

    def rows(self, setting: str | int, length: int) -> int:
        """Prompts of `length` tokens decoded together (`--batch-size`: auto or N): `rows_per_batch`."""
        return rows_per_batch(self.lm, setting, length)

    def read_rate(self, tokens: int, rows: int = 1) -> tuple[float, float]:
        """Tokens per second the model reads a `tokens`-token prompt at, and the seconds a new token then takes a row
        when `rows` rows decode together, timed now: `scoring.generate.read_rate`."""
        return read_rate(self.lm, tokens, rows=rows)

    def answer(
        self, prompts: Sequence[Query], rule: Rule, *, shared: bool = False, rows: int = 1,
        after_prompt: Callable[[State], None] | None = None,
    ) -> tuple[list[Generation], int]:  # fmt: skip
        ids = [np.asarray(p.ids) for p in prompts]
        order = list(range(len(ids))) if shared else like_lengths([len(i) for i in ids])
        decoding = rule.decoding
        if decoding.seeds is not None and len(decoding.seeds) == len(ids):  # each prompt keeps its own seed
            decoding = replace(decoding, seeds=tuple(decoding.seeds[i] for i in order))
        clock = Clock()
        answers, read = generate_branches(self.lm, [ids[i] for i in order], self.lm.init_state(1), rule.max_new_tokens,
                                          list(rule.stop), shared, after_prompt, rows, decoding, clock)  # fmt: skip
        self.timing = (clock.prefill, clock.decode)
        out: list[Any] = [None] * len(ids)
        for k, i in enumerate(order):
            out[i] = answers[k]
        return out, read

    def answer_groups(
        self, prefix: Query, groups: Sequence[Sequence[Query]], rule: Rule, *, shared: bool = True, rows: int = 1,
        after_prompt: Callable[[State], Any] | None = None,
    ) -> Grouped:  # fmt: skip
        """Prompts that continue `prefix` (a few-shot block: its ids read once and its state kept for the next call
        with the same ids), in groups that may share their starts (a document's questions): with `shared`, each group
        read as `branch_tree` reads it (every start its prompts share read once), else each prompt whole from a copy
        of the prefix's state; decoded `rows` together. `after_prompt(state)` is asked of each prompt's state."""
        start = self._prefix(prefix.ids)
        order: list[tuple[int, int]] = []
        read = [[0] * len(group) for group in groups]
        notes: list[list[Any]] = [[None] * len(group) for group in groups]

        seen: list[Any] = []  # what after_prompt said of the prompt read last
        note = None if after_prompt is None else (lambda state: seen.append(after_prompt(state)))

        def states() -> Iterator[tuple[Any, State]]:  # group by group: prompts share only within one
            for g, group in enumerate(groups):
                ids = [list(q.ids) for q in group]
                for k, logits, state in read_prompts(self.lm, ids, start, shared, note, read[g]):
                    order.append((g, k))
                    if after_prompt is not None:
                        notes[g][k] = seen[-1]
                    yield logits, state

        clock = Clock()
        decoded = decode_rows(self.lm, states(), rule.max_new_tokens, list(rule.stop), rows, rule.decoding, clock)
        self.timing = (clock.prefill, clock.decode)
        answers: list[list[Any]] = [[None] * len(group) for group in groups]
        for (g, k), gen in zip(order, decoded, strict=True):
            answers[g][k] = gen
        return Grouped(answers, read, notes)

    @property
    def scores_choices(self) -> bool:
        """Whether continuations can be scored by log-likelihood (`scoring.requests`): by a model in this process."""
        return True

    def _prefix(self, ids: Sequence[int]) -> State:
        """The state after `ids` from a fresh one, read once per distinct prefix (a run's few tasks each have one)."""
        key = tuple(int(t) for t in ids)
        if key not in self._prefixes:
            self._prefixes[key] = read_prefix(self.lm, list(key)).state
        return self._prefixes[key]


def like_lengths(lengths: Sequence[int]) -> list[int]:
    """The order prompts of these lengths are answered in when they share no start: longest first (ties as given), so
    that the rows of a batch, and the rows that join it as others end, have like lengths (less padding read)."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def chat_messages(chat: ChatFormat, text: str) -> tuple[dict[str, str], ...]:
    """A task text as a chat API's messages, the turns --chat-template renders here (the system instruction's turn,
    then the text as one user turn); the server's own template renders them."""
    turns = conversation(text, fmt=chat)
    return tuple(m.to_dict() for m in turns) if chat.fewshot_as_multiturn else tuple(single_turn(turns))


def generation_facts(gen: Generation) -> dict[str, Any]:
    """What a samples line adds for an answer a server gave (finish_reason, usage, latency); nothing otherwise."""
    return dict(gen.served or {})


def chat_template_of(lm: StreamingLM, name: str | None = None, system: str | None = None) -> ChatTemplate | None:
    """The template chat turns are rendered with: the model's own (`name`: one of several), required for a model
    asked a rendered prompt; for a chat API, its local tokenizer's where it has one (to count the tokens the server's
    template makes), else None (the server renders them)."""
    chat_api = getattr(lm, "prompt_format", None) == "messages"
    if chat_api and not getattr(getattr(lm.tokenizer, "tok", None), "chat_template", None):
        return None
    return select_template(lm, name, system)


def chat_query(lm: StreamingLM, template: ChatTemplate | None, turns: Sequence[dict[str, str]], name: str,
               bos: str = "auto") -> Query:  # fmt: skip
    """Chat turns as a model is asked them: the messages (a chat API's server renders them), and the prompt
    `template` renders from them here, BOS by `bos` (the policy); without a template, ids only count the texts."""
    messages = tuple(dict(t) for t in turns)
    if template is None:
        return Query(lm.tokenizer.encode("\n".join(t["content"] for t in turns)), None, messages, name)
    text = template.render(list(messages))
    start = [lm.tokenizer.bos_id] if chat_bos(lm, bos, text) else []
    return Query([*start, *lm.tokenizer.encode(text)], text, messages, name)
