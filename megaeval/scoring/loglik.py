"""Log-likelihood of continuations: shared context tokens read once, the choices scored in batched calls.

A request is (context, continuation) token ids; the model's input is context + continuation[:-1] and the
last len(continuation) positions predict the continuation. Requests that start from the same state (a
fresh one, or a few-shot prefix's) are scored together:

* the longest input prefix they share (up to the token before each one's last context token) may be read
  once, without logits (`lm.advance`), and its state repeated over a batch dimension (`state.repeat(n)`);
* the distinct remaining inputs (identical ones are read once: MMLU's " A", " B", " C", " D" all continue
  from the same token) are read in batched calls, padded on the right (a padded position changes nothing
  before it, and is never read back), computing logits only for the positions scored (`lm.forward_last`).

How to group them is planned per request set: a model call costs about `CALL_TOKENS` tokens beyond the
tokens it reads (each call streams every weight once), and padding costs what it reads. On a CPU a call
of a small model costs about what 16 tokens cost, so continuations of very different lengths go in
separate calls; on a GPU one call holds them all. Any grouping gives the same numbers (tested to 1e-5 in
float32, 1e-10 in float64).

Several documents (`score_pair_sets`) go further where the family runs rows at different positions in one call
(hf, Mamba, Mamba-2, RWKV): their fresh contexts are read several per call (`lm.read_rows`), and the tails of
all of them are grouped into calls together, each row continuing its own document's state (`State.stack`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch

from ..models.base import State, StreamingLM, rows_share_calls, stack_states
from .finite import require_finite

LOGITS_BUDGET = 1 << 24  # logits (rows x positions x vocabulary) of one batched call: 64 MiB in float32
STATE_BUDGET = 1 << 30  # bytes of the stacked states of one call that joins several documents
CALL_TOKENS = {"cpu": 16}  # what a model call costs beyond its tokens, in tokens read, per device type
DEFAULT_CALL_TOKENS = 512  # accelerators: a call costs far more than a row of a few dozen tokens


@dataclass
class Continuation:
    """Score of one continuation: sum of its tokens' log-probabilities, and whether greedy decoding
    would have produced it."""

    logprob: float
    is_greedy: bool
    tokens: int


@dataclass
class Prefix:
    """The start of many contexts (a few-shot block, say), read once, and the state after it."""

    ids: list[int]
    state: State


@dataclass
class Batch:
    """Continuations scored together, and the tokens the model read for them (padding and a prefix's tokens
    not counted)."""

    scores: list[Continuation]
    tokens_read: int


def read_prefix(lm: StreamingLM, ids: list[int]) -> Prefix:
    """Read `ids` from a fresh state."""
    state = lm.init_state(1)
    if ids:
        state = lm.advance(torch.tensor([ids], dtype=torch.long, device=lm.device), state)
    return Prefix(list(ids), state)


def starts_with(context: list[int], prefix: Prefix | None) -> bool:
    """Whether `context` begins with the prefix's tokens and goes on after them."""
    return prefix is not None and 0 < len(prefix.ids) < len(context) and context[: len(prefix.ids)] == prefix.ids


def call_tokens(lm: StreamingLM) -> int:
    """The cost of one model call beyond its tokens, in tokens, on the model's device."""
    return CALL_TOKENS.get(torch.device(lm.device).type, DEFAULT_CALL_TOKENS)


def plan_groups(widths: Sequence[int], call: int, max_rows: Sequence[int] | None = None) -> list[list[int]]:
    """Indices of rows grouped into calls at the least total cost, a call costing `call` + rows x its widest row.

    Groups are runs of the rows sorted by width (an optimal grouping has that form); `max_rows[i]` caps the
    rows of a call whose widest row is row i (the logits budget). Exact dynamic programming over the runs."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        widest = order[end - 1]
        cap = max_rows[widest] if max_rows is not None else len(order)
        for start in range(max(0, end - max(cap, 1)), end):
            cost = best[start] + call + (end - start) * widths[widest]
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


def _plan_cost(groups: list[list[int]], widths: Sequence[int], call: int) -> int:
    """What `plan_groups`' grouping costs, in tokens."""
    return sum(call + len(g) * max(widths[i] for i in g) for g in groups)


def score_pairs(
    lm: StreamingLM, pairs: Sequence[tuple[list[int], list[int]]], prefix: Prefix | None = None, batched: bool = True
) -> Batch:
    """Score (context, continuation) pairs (non-empty both; a context starts with BOS, say) from a fresh state,
    or from `prefix`'s state when every context starts with its tokens and goes on after them.

    batched=False reads each pair on its own, in one call from a copy of the starting state: the same numbers.
    """
    return score_pair_sets(lm, [(pairs, prefix)], batched)[0]


def score_pair_sets(
    lm: StreamingLM, sets: Sequence[tuple[Sequence[tuple[list[int], list[int]]], Prefix | None]], batched: bool = True
) -> list[Batch]:
    """`score_pairs` for several sets of pairs (documents, each with its prefix), each scored as alone.

    Each set's shared start is read on its own. When the model runs rows at different positions in one call
    (`models.base.rows_share_calls`), the remaining inputs of all sets share calls: the calls hold rows of
    several documents, each continuing its own document's state (states stacked)."""
    for pairs, _ in sets:
        if any(not ctx or not cont for ctx, cont in pairs):
            raise ValueError("empty context or continuation")
    if not batched:
        return [_one_by_one(lm, pairs, prefix) for pairs, prefix in sets]
    together = sum(1 for pairs, _ in sets if pairs) > 1 and rows_share_calls(lm.init_state(1))
    plans = [_Pending.plan(lm, pairs, prefix, together) for pairs, prefix in sets]
    fresh = [plan for plan in plans if together and plan.start.state is None and plan.unread()]
    for group in plan_groups([len(plan.unread()) for plan in fresh], call_tokens(lm)) if fresh else []:
        mine = [fresh[i] for i in group]  # contexts read from a fresh state, several per call
        for plan, state in zip(mine, lm.read_rows([plan.unread() for plan in mine]), strict=True):
            plan.read_start(lm, state)
    for plan in plans:
        if plan not in fresh:
            plan.read_start(lm)
    live = [plan for plan in plans if plan.tails]
    if together and live:
        _run_together(lm, live)
    else:
        for plan in live:
            plan.run_own_calls(lm)
    return [plan.batch() for plan in plans]


@dataclass(eq=False)
class _Pending:
    """One set of pairs being scored: its starting state, its distinct inputs after that state (tails), and the
    logits of each tail once read."""

    pairs: Sequence[tuple[list[int], list[int]]]
    start: _Start
    rows: list[list[int]]
    firsts: list[int]  # per pair, the row position whose logits predict cont[0]
    base: int  # row tokens before the tails (read into `start`)
    tails: list[tuple[int, ...]]
    groups: list[list[int]]  # this set's own calls, when it runs alone
    read: int  # tokens read so far
    logits: dict[tuple[int, ...], tuple[torch.Tensor, int]]

    @classmethod
    def plan(
        cls, lm: StreamingLM, pairs: Sequence[tuple[list[int], list[int]]], prefix: Prefix | None, shared: bool
    ) -> _Pending:
        """Plan a set (see `_plan`; `shared`: its tails will share calls with other sets); nothing is read yet."""
        start = _origin(lm, pairs, prefix)
        rows = [ctx + cont[:-1] for ctx, cont in pairs]
        firsts = [len(ctx) - 1 for ctx, _ in pairs]
        pending = cls(pairs, start, rows, firsts, start.skip, [], [], 0, {})
        if not pairs:
            return pending
        pending.base, pending.tails, pending.groups = _plan(lm, start, rows, firsts, shared)
        pending.read += pending.base - start.skip + sum(len(t) for t in pending.tails)
        return pending

    def unread(self) -> list[int]:
        """The shared start's tokens not yet read ([] when there are none)."""
        return self.rows[0][self.start.skip : self.base] if self.rows else []

    def read_start(self, lm: StreamingLM, state: State | None = None) -> None:
        """Read the shared start once (or take `state`, the state after it read elsewhere)."""
        if state is None and self.unread():
            tokens = torch.tensor([self.unread()], dtype=torch.long, device=lm.device)
            state = lm.advance(tokens, self.start.copies(1))
        if state is not None:
            self.start = _Start(lm, state, self.base, owned=True)

    def needed(self) -> dict[tuple[int, ...], int]:
        """Per tail, the first of its positions whose logits are scored."""
        out: dict[tuple[int, ...], int] = {}
        for row, first in zip(self.rows, self.firsts, strict=True):
            key = tuple(row[self.base :])
            out[key] = min(out.get(key, first - self.base), first - self.base)
        return out

    def run_own_calls(self, lm: StreamingLM) -> None:
        """Read this set's tails in its own planned calls."""
        needed = self.needed()
        for n, group in enumerate(self.groups):
            tails = [self.tails[i] for i in group]
            width = max(len(t) for t in tails)
            last = width - min(needed[t] for t in tails)
            state = self.start.copies(len(group), last_use=n == len(self.groups) - 1)
            out, _ = lm.forward_last(_padded(lm, tails), state, last)
            for r, tail in enumerate(tails):
                self.logits[tail] = (out[r], width - last)

    def batch(self) -> Batch:
        """The set's scores from the logits read."""
        scores = []
        for row, first, (_, cont) in zip(self.rows, self.firsts, self.pairs, strict=True):
            out, offset = self.logits[tuple(row[self.base :])]
            scores.append(_scored(out[first - self.base - offset :], cont))
        return Batch(scores, self.read)


def _origin(lm: StreamingLM, pairs: Sequence[tuple[list[int], list[int]]], prefix: Prefix | None) -> _Start:
    """Where a set starts: `prefix`'s state when every context starts with its tokens and goes on, else fresh."""
    use_prefix = bool(pairs) and all(starts_with(ctx, prefix) for ctx, _ in pairs)
    return _Start(lm, prefix.state if use_prefix else None, len(prefix.ids) if use_prefix else 0)


def _one_by_one(lm: StreamingLM, pairs: Sequence[tuple[list[int], list[int]]], prefix: Prefix | None) -> Batch:
    """Each pair read whole after the set's start, in a call of its own: the reference for the batched paths."""
    start, read, scores = _origin(lm, pairs, prefix), 0, []
    for ctx, cont in pairs:
        tail = (ctx + cont[:-1])[start.skip :]
        logits, _ = lm.forward_last(_padded(lm, [tail]), start.copies(1), len(cont))
        scores.append(_scored(logits[0], cont))
        read += len(tail)
    return Batch(scores, read)


def _run_together(lm: StreamingLM, plans: list[_Pending]) -> None:
    """Read the tails of several sets in shared calls, grouped by width at the least cost; each row of a call
    continues its own set's state (stacked), within LOGITS_BUDGET and STATE_BUDGET."""
    items = [(plan, tail) for plan in plans for tail in plan.tails]
    widths = [len(tail) for _, tail in items]
    vocab = getattr(lm.tokenizer, "vocab_size", 1)
    row_bytes = max(plan.start.row_bytes() for plan in plans)
    state_cap = max(1, STATE_BUDGET // max(row_bytes, 1))
    caps = [min(max(1, LOGITS_BUDGET // (w * vocab)), state_cap) for w in widths]
    needed = {id(plan): plan.needed() for plan in plans}
    for group in plan_groups(widths, call_tokens(lm), caps):
        group = sorted(group)  # rows of one set next to each other: their state is one repeat
        width = max(widths[i] for i in group)
        last = width - min(needed[id(items[i][0])][items[i][1]] for i in group)
        runs = groupby(items[i][0] for i in group)  # plans compare by identity
        state = stack_states([plan.start.copies(len(list(rows))) for plan, rows in runs])
        out, _ = lm.forward_last(_padded(lm, [items[i][1] for i in group]), state, last)
        for r, i in enumerate(group):
            plan, tail = items[i]
            plan.logits[tail] = (out[r], width - last)


class _Start:
    """The state requests start from (None: a fresh one), the tokens it has read, and copies of it for calls."""

    def __init__(self, lm: StreamingLM, state: State | None, skip: int, owned: bool = False):
        self.lm, self.state, self.skip, self.owned = lm, state, skip, owned

    def copies(self, n: int, last_use: bool = False) -> State:
        """A state for n rows, each a copy of this one (this one untouched, unless it is ours and used last)."""
        if self.state is None:
            return self.lm.init_state(n)
        if n == 1 and last_use and self.owned:
            return self.state
        return self.state.clone() if n == 1 else self.state.repeat(n)

    def row_bytes(self) -> int:
        """Bytes of one row's copy of this state."""
        return 0 if self.state is None else self.state.nbytes()


def _plan(lm: StreamingLM, start: _Start, rows: list[list[int]], firsts: list[int], shared: bool = False):
    """(base, distinct tails after it, groups of tail indices per call): the cheapest of reading the shared
    start once then the tails, or reading whole rows. `shared`: the tails' calls are shared with other sets, so
    they cost about their tokens only."""
    common = start.skip
    while common < min(firsts) and all(r[common] == rows[0][common] for r in rows):
        common += 1
    call, vocab = call_tokens(lm), getattr(lm.tokenizer, "vocab_size", 1)
    best = None
    for base in dict.fromkeys((start.skip, common)):
        tails = list(dict.fromkeys(tuple(r[base:]) for r in rows))
        widths = [len(t) for t in tails]
        caps = [max(1, LOGITS_BUDGET // (w * vocab)) for w in widths]
        groups = plan_groups(widths, 0 if shared else call, caps)
        cost = _plan_cost(groups, widths, 0 if shared else call) + (
            call + base - start.skip if base > start.skip else 0
        )
        if best is None or cost < best[0]:
            best = (cost, base, tails, groups)
    return best[1:]


def _padded(lm: StreamingLM, tails: Sequence[Sequence[int]]) -> torch.Tensor:
    """Rows padded on the right with token 0 (never scored, and after every position that is)."""
    inputs = torch.zeros(len(tails), max(len(t) for t in tails), dtype=torch.long)
    for r, tail in enumerate(tails):
        inputs[r, : len(tail)] = torch.tensor(tail, dtype=torch.long)
    return inputs.to(lm.device)


def _scored(logits: torch.Tensor, cont: list[int]) -> Continuation:
    """A continuation scored from the logits whose first row predicts its first token."""
    logp = torch.log_softmax(require_finite(logits[: len(cont)], "the logits of a continuation").double(), -1)
    target = torch.tensor(cont, device=logp.device)
    greedy = bool((logp.argmax(-1) == target).all())
    return Continuation(float(logp.gather(-1, target[:, None]).sum()), greedy, len(cont))
