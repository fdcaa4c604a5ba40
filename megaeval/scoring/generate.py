"""Prefill and decoding (greedy, or sampled at a temperature) through the StreamingLM contract, carrying the state
token by token."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cmp_to_key

import numpy as np
import torch

from ..errors import fail
from ..models.base import READ_TOKENS, Decoder, State, StreamingLM, can_stack, stack_states
from ..models.group import GroupLM
from .decoding import GREEDY, Decoding, Generation, Row, next_step
from .finite import require_finite


def prefill(lm: StreamingLM, ids: list[int], state: State) -> tuple[torch.Tensor, State]:
    """Feed `ids` (at least one) into `state`; return the last position's logits [V] and the new state.

    One call of `forward_last`: the output layer runs for the last position only, so a whole book can be
    read without materialising [T, V] logits.
    """
    tokens = torch.tensor([ids], dtype=torch.long, device=lm.device)
    logits, state = lm.forward_last(tokens, state, 1)
    return require_finite(logits[0, -1], "the logits after the prompt"), state


def greedy_generate(
    lm: StreamingLM, logits: torch.Tensor, state: State, max_new_tokens: int, stop: list[str] | None = None,
    decoding: Decoding | None = None,
) -> Generation:  # fmt: skip
    """Greedy decoding from the logits of the last prompt token, one token per call on the carried state.

    Stops at EOS, at the first occurrence of any `stop` string in the decoded text (the text is cut
    there), or after `max_new_tokens` tokens. `decoding` may sample instead (with its first seed) and stop at token
    ids too.
    """
    return _alone(lm, Row(0, [], decoding or GREEDY), logits, state, max_new_tokens, stop)


def _alone(
    lm: StreamingLM, row: Row, logits: torch.Tensor, state: State, max_new_tokens: int, stop: list[str] | None
) -> Generation:
    """`row` decoded by itself from the logits of its last prompt token and its state."""
    stop = [s for s in (stop or []) if s]
    rows: _Stacked | _Slots | None = None
    while True:
        ended = next_step(lm, row, row.choose(lm, logits), max_new_tokens, stop)
        if ended is not None:
            return ended
        if rows is None:
            rows = _rows(lm, [state])
        logits = require_finite(rows.step([row.tokens[-1]])[0], "the logits of a generated token")


class _Stacked:
    """Rows decoded together by `lm.forward` on their states stacked (`models.base.stack_states`)."""

    def __init__(self, lm: StreamingLM, states: list[State]):
        self.lm, self.state = lm, stack_states(states)

    def join(self, states: list[State]) -> None:
        self.state = stack_states(([self.state] if self.state is not None else []) + states)

    def keep(self, rows: list[int]) -> None:
        self.state = self.state.select(rows) if rows else None

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Logits [rows, V] after one more token per row."""
        out, self.state = self.lm.forward(torch.tensor([[t] for t in tokens], device=self.lm.device), self.state)
        return out[:, -1]


class _Slots:
    """Rows decoded together in the slots of a static decoder (`StreamingLM.decoder`): a row that ends frees its slot
    (which steps on, unread, until a row joins there), a row that joins is loaded into a free one."""

    def __init__(self, decoder: Decoder, states: list[State]):
        self.decoder, self.slots = decoder, []
        self.join(states)

    def join(self, states: list[State]) -> None:
        for state in states:
            free = next(s for s in range(self.decoder.batch_size) if s not in self.slots)
            self.decoder.load(state, [free])
            self.slots.append(free)

    def keep(self, rows: list[int]) -> None:
        self.slots = [self.slots[r] for r in rows]

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Logits [rows, V] after one more token per row."""
        every = [0] * self.decoder.batch_size
        for slot, token in zip(self.slots, tokens, strict=True):
            every[slot] = token
        return self.decoder.step(every)[self.slots]


def _rows(lm: StreamingLM, states: list[State]) -> _Stacked | _Slots:
    """Rows of one state each, decoding together: in the slots of `lm.decoder` when the family has one, room for
    as many rows as start, else by `lm.forward`."""
    decoder = lm.decoder(len(states))
    return _Stacked(lm, states) if decoder is None else _Slots(decoder, states)


def parse_batch_size(value: str | int) -> str | int:
    """--batch-size: auto, or a positive number of prompts."""
    if str(value).strip() == "auto":
        return "auto"
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise fail(f"bad --batch-size {value!r}", "pass auto or a positive number of prompts, e.g. --batch-size 8")
    return number


def rows_per_batch(lm: StreamingLM, setting: str | int, length: int) -> int:
    """Prompts decoded together at `length`: 1 for a family whose states cannot be stacked (and under
    --chunk-parallel); auto: 8 on CPU, 32 on an accelerator, and for a fixed-context model no more rows than keep
    the KV cache of the batch within that many 4K-token rows."""
    if isinstance(lm, GroupLM) or not can_stack(lm.init_state(1)):
        return 1
    if setting != "auto":
        return int(setting)
    cap = 8 if lm.device.type == "cpu" else 32
    return cap if lm.max_context is None else max(1, min(cap, cap * 4096 // length))


def read(
    lm: StreamingLM, ids: Sequence[int] | np.ndarray, state: State, logits: bool = True
) -> tuple[torch.Tensor | None, State]:
    """Feed `ids` into `state` in calls of at most `lm.read_call_tokens` tokens (a family that plans its own prefill
    takes the prompt whole); with `logits`, return the last position's logits [V] (the output layer runs there
    only), so memory stays flat however long the prompt."""
    ids = np.asarray(ids, dtype=np.int64)
    call = lm.read_call_tokens(len(ids))
    end = len(ids) - 1 if logits else len(ids)
    for start in range(0, end, call):
        piece = torch.from_numpy(ids[start : min(start + call, end)]).to(lm.device)[None]
        state = lm.advance(piece, state)
    if not logits:
        return None, state
    out, state = lm.forward_last(torch.from_numpy(ids[-1:]).to(lm.device)[None], state, 1)
    return require_finite(out[0, -1], "the logits after the prompt"), state


def read_rate(lm: StreamingLM, tokens: int, steps: int = 4, rows: int = 1) -> tuple[float, float]:
    """What a prompt costs the model now: tokens per second it reads a `tokens`-token prompt at, and the seconds a new
    token then takes a row, `rows` rows decoding together (the mean of `steps` calls, the state repeated), timed."""

    def synced() -> float:
        if lm.device.type == "cuda":
            torch.cuda.synchronize(lm.device)
        return time.perf_counter()

    if lm.max_context is not None:
        tokens = max(1, min(tokens, lm.max_context - steps))
    ids = np.arange(tokens + steps, dtype=np.int64) % min(lm.tokenizer.vocab_size, 1000)
    read(lm, ids[: min(tokens, 64)], lm.init_state(1), logits=False)
    start = synced()
    _, state = read(lm, ids[:tokens], lm.init_state(1), logits=False)
    state.nbytes()
    read_seconds = synced() - start
    rows = rows_per_batch(lm, rows, tokens)  # 1 where decode_rows cannot stack rows
    state = state.repeat(rows) if rows > 1 else state
    start = synced()
    for i in range(tokens, tokens + steps):
        step = torch.from_numpy(ids[i : i + 1]).to(lm.device)[None].expand(rows, 1)
        _, state = lm.forward_last(step, state, 1)
    step_seconds = (synced() - start) / steps / rows
    return tokens / max(read_seconds, 1e-9), step_seconds


def branch_prompts(
    lm: StreamingLM, prompts: Sequence[np.ndarray], state: State, shared: bool = True,
    after_prompt: Callable[[State], None] | None = None, counter: list[int] | None = None,
) -> Iterator[tuple[torch.Tensor, State]]:  # fmt: skip
    """Each prompt read from `state` (which is not changed): (its last logits, its state), one prompt at a time.

    With `shared`, a prompt's start shared with the next prompt is read once: a trunk state reads up to there,
    and each prompt branches from a copy of it (prompts that share long starts, in order: a haystack with its
    needle further and further in). Otherwise every prompt is read whole from a copy of `state`.
    `after_prompt` sees each prompt's state once it is read; `counter[0]` counts the tokens the model reads.
    """
    counter = counter if counter is not None else [0]
    trunk, at = state.clone(), 0
    trunk_ids = np.zeros(0, dtype=np.int64)  # what the trunk has read
    for i, ids in enumerate(prompts):
        if shared:
            nxt = prompts[i + 1] if i + 1 < len(prompts) else ids
            common = min(_common_prefix(ids, nxt), len(ids) - 1)
            if common < at or _common_prefix(ids, trunk_ids) < at:
                trunk, at = state.clone(), 0  # the trunk read tokens this prompt does not start with: start over
            _, trunk = read(lm, ids[at:common], trunk, logits=False)
            counter[0] += common - at
            at, trunk_ids = common, ids[:common]
            branch = trunk.clone() if i + 1 < len(prompts) else trunk
            logits, branch = read(lm, ids[common:], branch)
            counter[0] += len(ids) - common
        else:
            logits, branch = read(lm, ids, state.clone())
            counter[0] += len(ids)
        if after_prompt is not None:
            after_prompt(branch)
        yield logits, branch


def tree_order(prompts: Sequence[Sequence[int] | np.ndarray]) -> list[int]:
    """The order `branch_tree` reads prompts in: by their tokens (ties as given), so prompts sharing a start meet."""
    arrays = [np.asarray(p) for p in prompts]

    def compare(i: int, j: int) -> int:
        a, b = arrays[i], arrays[j]
        n = _common_prefix(a, b)
        if n == len(a) or n == len(b):
            return len(a) - len(b)  # a start sorts first
        return -1 if a[n] < b[n] else 1

    return sorted(range(len(arrays)), key=cmp_to_key(compare))


def branch_tree(
    lm: StreamingLM, prompts: Sequence[Sequence[int] | np.ndarray], state: State,
    after_prompt: Callable[[State], None] | None = None, counts: list[int] | None = None,
) -> Iterator[tuple[int, torch.Tensor, State]]:  # fmt: skip
    """Each prompt read from `state` (which is not changed), every start that prompts share read once: yields (its
    index, its last logits, its state) in `tree_order`, a depth-first walk of the prompts' prefix tree.

    A stack holds a state at each depth where a later prompt leaves the current one's path (the running minima of
    the common starts ahead, each state read from the one below it); a prompt branches from a copy of the deepest
    (from the deepest itself when no later prompt needs it) and reads the rest, at least its last token. Unlike
    `branch_prompts`, a prompt that shares less with the next one than with the previous one re-reads nothing.
    `after_prompt` sees each prompt's state once it is read; `counts[i]` gets the tokens read for prompt i (its
    branch and the stack's states it added), so that they sum to the tokens the model read."""
    ids = [np.asarray(p, dtype=np.int64) for p in prompts]
    counts = counts if counts is not None else [0] * len(ids)
    order = tree_order(ids)
    common = [_common_prefix(ids[a], ids[b]) for a, b in zip(order, order[1:], strict=False)]
    stack: list[tuple[int, State]] = [(0, state)]  # (tokens read, state): starts of the current prompt
    for k, i in enumerate(order):
        p = ids[i]
        while stack[-1][0] > min(common[k - 1] if k else 0, len(p) - 1):  # states this prompt does not start with
            stack.pop()
        depths: list[int] = []  # where later prompts leave this one, deepest first
        low = len(p) - 1
        for c in common[k:]:
            low = min(low, c)
            if low <= stack[-1][0]:
                break
            if not depths or depths[-1] != low:
                depths.append(low)
        for depth in reversed(depths):
            at, below = stack[-1]
            stack.append((depth, read(lm, p[at:depth], below.clone(), logits=False)[1]))
            counts[i] += depth - at
        at, trunk = stack[-1]
        needed = k + 1 < len(order) and at <= common[k]
        if len(stack) > 1 and not needed:
            stack.pop()  # its last prompt: read on from it, no copy
        else:
            trunk = trunk.clone()
        rest = p[at:]  # a short rest (a question after its document) in one call, as `prefill` reads a prompt
        logits, branch = prefill(lm, rest.tolist(), trunk) if len(rest) <= READ_TOKENS else read(lm, rest, trunk)
        counts[i] += len(p) - at
        if after_prompt is not None:
            after_prompt(branch)
        yield i, logits, branch


def read_prompts(
    lm: StreamingLM, prompts: list[list[int]], prefix: State, shared: bool = True,
    after_prompt: Callable[[State], None] | None = None, counts: list[int] | None = None,
) -> Iterator[tuple[int, torch.Tensor, State]]:  # fmt: skip
    """The prompts read on from the prefix's state, which is not changed: (each one's index, its last logits, its
    state). With `shared`, as `branch_tree` reads them: every start prompts share (the document
    that several questions ask about, as far as their fitted tokens agree) is read once, prompts in order of their
    tokens. Otherwise each prompt whole from a copy of the prefix's state, in order: the per-question reference.
    `counts[i]`: the tokens read for prompt i."""
    counts = counts if counts is not None else [0] * len(prompts)
    if shared:
        yield from branch_tree(lm, prompts, prefix, after_prompt, counts)
        return
    for i, ids in enumerate(prompts):
        logits, state = prefill(lm, ids, prefix.clone())
        counts[i] = len(ids)
        if after_prompt is not None:
            after_prompt(state)
        yield i, logits, state


def generate_branches(
    lm: StreamingLM, prompts: Sequence[np.ndarray], state: State, max_new_tokens: int, stop: list[str] | None = None,
    shared: bool = True, after_prompt: Callable[[State], None] | None = None, batch_size: int = 1,
    decoding: Decoding | None = None, clock: Clock | None = None,
) -> tuple[list[Generation], int]:  # fmt: skip
    """Greedy answers (or as `decoding` says) to prompts that continue `state` (read as `branch_prompts` reads them,
    decoded as `decode_rows` decodes them, timed by `clock`), and the tokens the model read."""
    if decoding is not None and decoding.seeds is not None and len(decoding.seeds) != len(prompts):
        raise fail(f"{len(decoding.seeds)} sampling seeds for {len(prompts)} prompts", "pass one seed per prompt")
    counter = [0]
    rows = branch_prompts(lm, prompts, state, shared, after_prompt, counter)
    return decode_rows(lm, rows, max_new_tokens, stop, batch_size, decoding, clock), counter[0]


def decode_rows(
    lm: StreamingLM, rows: Iterable[tuple[torch.Tensor, State]], max_new_tokens: int, stop: list[str] | None = None,
    batch_size: int = 1, decoding: Decoding | None = None, clock: Clock | None = None,
) -> list[Generation]:  # fmt: skip
    """Greedy answers (or as `decoding` says, row i with seed i) for prompts already read (each row: its last
    logits [V] and its state), in order: what `greedy_generate` gives each row alone.

    Up to `batch_size` rows decode together, one model call per step (states stacked: `models.base.stack_states`;
    or the slots of the family's static decoder, `StreamingLM.decoder`, sized by the rows that start);
    a row that stops leaves the batch and the next row takes its place (continuous batching). Rows are taken from
    `rows` only when there is room, so at most `batch_size` states are alive. Families whose states cannot be
    stacked decode one row at a time. `clock` gets the seconds spent reading rows (taking them from `rows`) apart
    from the rest (decoding)."""
    stop = [s for s in (stop or []) if s]
    decoding = decoding or GREEDY
    clock = clock if clock is not None else Clock()
    source = clock.timed(iter(rows))
    results: dict[int, Generation] = {}
    active: list[Row] = []
    batch: _Stacked | _Slots | None = None
    logits: torch.Tensor | None = None
    taken = 0
    while True:
        fresh = []
        while len(active) + len(fresh) < max(batch_size, 1):
            row = next(source, None)
            if row is None:
                break
            if len(fresh) + len(active) == 0 and (batch_size <= 1 or not can_stack(row[1])):
                results[taken] = _alone(lm, Row(taken, [], decoding), row[0], row[1], max_new_tokens, stop)
                taken += 1
                continue
            fresh.append(row)
        if fresh:
            states = [st for _, st in fresh]
            if batch is None:  # the first rows fill the batch, or are all there are: its size
                batch = _rows(lm, states)
            else:
                batch.join(states)
            rows_logits = ([logits] if logits is not None else []) + [lg[None] for lg, _ in fresh]
            logits = torch.cat(rows_logits, 0)
            active += [Row(taken + k, [], decoding) for k in range(len(fresh))]
            taken += len(fresh)
        if not active:
            clock.finish()
            return [results[i] for i in range(taken)]
        keep, step = [], []
        for r, row in enumerate(active):
            ended = next_step(lm, row, row.choose(lm, logits[r]), max_new_tokens, stop)
            if ended is not None:
                results[row.index] = ended
            else:
                keep.append(r)
                step.append(row.tokens[-1])
        if len(keep) < len(active):
            batch.keep(keep)
            active = [active[r] for r in keep]
        if active:
            logits = require_finite(batch.step(step), "the logits of a generated token")
        else:
            logits = None


class Clock:
    """Seconds spent reading prompts (`prefill`) and decoding answers (`decode`) by one `decode_rows` call: the time
    inside the iterator of read rows is reading, the rest of the call decoding."""

    def __init__(self) -> None:
        self.prefill = self.decode = 0.0
        self._start = time.perf_counter()

    def timed(self, rows: Iterator[tuple[torch.Tensor, State]]) -> Iterator[tuple[torch.Tensor, State]]:
        """`rows`, the time each takes to arrive counted as reading."""
        while True:
            start = time.perf_counter()
            row = next(rows, None)
            self.prefill += time.perf_counter() - start
            if row is None:
                return
            yield row

    def finish(self) -> None:
        """The call is over: the time not spent reading was decoding."""
        self.decode = max(time.perf_counter() - self._start - self.prefill, 0.0)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n
