"""Batched scoring: every choice of a question in one call from a repeated state, per family, against one call
per choice and against reading each (context, continuation) from scratch."""

from __future__ import annotations

import pytest
import torch

from megaeval.models.megalodon import MegalodonLM
from megaeval.models.rfa import RFALM
from megaeval.scoring import loglik
from megaeval.scoring.loglik import read_prefix, score_pairs
from megaeval_testing import VOCAB, FakeTokenizer, random_model, small_args
from tests.models.test_rfa import random_rfa, rfa_config

FAMILIES = ["megalodon", "megalodon-window", "rfa", "hf"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_lm(family: str, dtype: torch.dtype):
    """A small random model of the family, chunked small (8 tokens) so contexts and choices cross chunks."""
    if family.startswith("megalodon"):
        norm = "official-window" if family == "megalodon-window" else "cumulative"
        return MegalodonLM(
            random_model(small_args(), 0, dtype), FakeTokenizer(), None, norm_stats=norm, kernels="torch"
        )
    if family == "rfa":
        return RFALM(random_rfa(rfa_config(), 0).to(dtype), FakeTokenizer(), chunk_size=8)
    transformers = pytest.importorskip("transformers")
    from megaeval.models.hf import HFCausalLM

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    return HFCausalLM(transformers.LlamaForCausalLM(config).to(dtype), FakeTokenizer(), None, None, 512)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def requests() -> list[tuple[list[int], list[int]]]:
    """A 77-token question with five choices (lengths 1 to 13, two identical), then two WinoGrande-style
    options: contexts sharing their first 30 tokens, one continuation."""
    question = ids(77, 0)
    choices = [ids(1, 1), ids(4, 2), ids(13, 3), ids(2, 4), ids(13, 3)]
    shared, cont = ids(30, 5), ids(6, 6)
    return [(question, c) for c in choices] + [(shared + ids(7, 7), cont), (shared + ids(11, 8), cont)]


def from_scratch(lm, context: list[int], cont: list[int]) -> tuple[float, bool]:
    """The whole input read from a fresh state in one forward call, and a log_softmax."""
    row = context + cont[:-1]
    logits, _ = lm.forward(torch.tensor([row]), lm.init_state(1))
    logp = torch.log_softmax(logits[0, len(context) - 1 :].double(), -1)
    target = torch.tensor(cont)
    return float(logp.gather(-1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_equals_one_call_per_choice_and_from_scratch(family, dtype):
    lm = make_lm(family, dtype)
    pairs = requests()
    groups = [pairs[:5], pairs[5:]]
    for group in groups:
        batched = score_pairs(lm, group)
        alone = score_pairs(lm, group, batched=False)
        tol = 1e-10 if dtype == torch.float64 else 1e-5
        for b, a, (ctx, cont) in zip(batched.scores, alone.scores, group, strict=True):
            assert b.logprob == pytest.approx(a.logprob, rel=0, abs=tol)
            assert b.is_greedy == a.is_greedy and b.tokens == len(cont)
            if dtype == torch.float64:
                expected, greedy = from_scratch(lm, ctx, cont)
                assert b.logprob == pytest.approx(expected, rel=0, abs=1e-9)
                assert b.is_greedy == greedy
        assert batched.tokens_read < alone.tokens_read
    question = groups[0]  # the question once (but its last token), then 4 distinct rows: last token + choice[:-1]
    assert score_pairs(lm, question).tokens_read == 76 + (1 + 4 + 13 + 2)


def spy(lm, monkeypatch) -> list[tuple]:
    """Every model call made from outside the model: (method, rows, tokens)."""
    calls: list[tuple] = []
    depth = [0]

    def wrap(name, method):
        def call(x, *args):
            if not depth[0]:
                calls.append((name, *x.shape))
            depth[0] += 1
            try:
                return method(x, *args)
            finally:
                depth[0] -= 1

        return call

    for name in ("advance", "forward", "forward_last", "score"):
        monkeypatch.setattr(lm, name, wrap(name, getattr(lm, name)))
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_calls_follow_the_plan(family, monkeypatch):
    lm = make_lm(family, torch.float64)
    pairs = requests()[:5]
    expected = [s.logprob for s in score_pairs(lm, pairs, batched=False).scores]
    calls = spy(lm, monkeypatch)
    monkeypatch.setitem(loglik.CALL_TOKENS, "cpu", 60)  # a call costs 60 tokens: the question once, one call
    batched = score_pairs(lm, pairs)
    assert calls == [("advance", 1, 76), ("forward_last", 4, 13)]  # duplicates read once, padded to the longest
    assert [s.logprob for s in batched.scores] == pytest.approx(expected, rel=0, abs=1e-10)
    calls.clear()
    prefix = read_prefix(lm, pairs[0][0][:40])  # a few-shot block: read once, its state reused
    calls.clear()
    batched = score_pairs(lm, pairs, prefix)
    assert calls == [("advance", 1, 36), ("forward_last", 4, 13)] and batched.tokens_read == 36 + 20
    assert [s.logprob for s in batched.scores] == pytest.approx(expected, rel=0, abs=1e-10)
    calls.clear()
    monkeypatch.setitem(loglik.CALL_TOKENS, "cpu", 3)  # cheap calls: rows of widths 1, 2, 4 apart from 13
    batched = score_pairs(lm, pairs)
    assert calls == [("advance", 1, 76), ("forward_last", 2, 2), ("forward_last", 1, 4), ("forward_last", 1, 13)]
    assert [s.logprob for s in batched.scores] == pytest.approx(expected, rel=0, abs=1e-10)
    calls.clear()
    monkeypatch.setitem(loglik.CALL_TOKENS, "cpu", 10_000)  # calls dearer than reading the question 4 times
    batched = score_pairs(lm, pairs)
    assert calls == [("forward_last", 4, 89)]
    assert [s.logprob for s in batched.scores] == pytest.approx(expected, rel=0, abs=1e-10)
    calls.clear()
    (one,) = score_pairs(lm, pairs[:1]).scores  # a single request: one call, whatever the cost
    assert calls == [("forward_last", 1, 77)] and one.logprob == pytest.approx(expected[0], rel=0, abs=1e-10)


def documents() -> list[tuple[list[tuple[list[int], list[int]]], bool]]:
    """Five documents: (pairs, whether they continue a shared few-shot block), contexts of 9 to 70 tokens."""
    block = ids(25, 50)
    docs = []
    for d, (n, k, fewshot) in enumerate([(9, 4, False), (70, 2, False), (30, 5, True), (12, 3, True), (41, 1, False)]):
        context = (block if fewshot else []) + ids(n, 60 + d)
        docs.append(([(context, ids(1 + (3 * c) % 7, 70 + 10 * d + c)) for c in range(k)], fewshot))
    return docs


@pytest.mark.parametrize("family", FAMILIES)
def test_documents_scored_together_equal_each_alone(family, monkeypatch):
    """Several documents' pairs in shared calls (rows of different documents continuing their own states) give
    each document what it gets alone; a family that cannot run such rows together scores each on its own."""
    lm = make_lm(family, torch.float64)
    prefix = read_prefix(lm, ids(25, 50))
    sets = [(pairs, prefix if fewshot else None) for pairs, fewshot in documents()]
    calls = spy(lm, monkeypatch)
    alone = [score_pairs(lm, pairs, fewshot) for pairs, fewshot in sets]
    calls_alone = len(calls)
    calls.clear()
    together = loglik.score_pair_sets(lm, sets)
    calls_together = len(calls)
    for t, a, (pairs, _) in zip(together, alone, sets, strict=True):
        assert t.tokens_read == a.tokens_read
        for ts, s_alone, (ctx, cont) in zip(t.scores, a.scores, pairs, strict=True):
            assert ts.logprob == pytest.approx(s_alone.logprob, rel=0, abs=1e-10)
            assert ts.logprob == pytest.approx(from_scratch(lm, ctx, cont)[0], rel=0, abs=1e-10)
            assert ts.is_greedy == s_alone.is_greedy
    widest = max((rows for name, rows, _ in calls[:calls_together] if name == "forward_last"), default=1)
    if family == "hf":  # fresh contexts read in shared calls, and calls holding several documents' choices
        assert calls_together < calls_alone and widest > 5
    else:  # positions go in per row one token at a time: each document's own calls
        assert calls_together == calls_alone and widest <= 5


def brute_force_plan(widths: list[int], call: int) -> int:
    """The cheapest cost over every partition of the rows into calls."""

    def partitions(items):
        if not items:
            yield []
            return
        head, rest = items[0], items[1:]
        for part in partitions(rest):
            yield [[head], *part]
            for k in range(len(part)):
                yield [*part[:k], [head, *part[k]], *part[k + 1 :]]

    return min(sum(call + len(g) * max(widths[i] for i in g) for g in p) for p in partitions(list(range(len(widths)))))


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_is_the_cheapest_grouping(seed):
    g = torch.Generator().manual_seed(seed)
    widths = torch.randint(1, 40, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
    for call in (0, 3, 16, 1000):
        groups = loglik.plan_groups(widths, call)
        assert sorted(i for grp in groups for i in grp) == list(range(len(widths)))
        assert sum(call + len(grp) * max(widths[i] for i in grp) for grp in groups) == brute_force_plan(widths, call)
    capped = loglik.plan_groups(widths, 1000, [2] * len(widths))  # the logits budget caps the rows of a call
    assert max(len(grp) for grp in capped) <= 2


@pytest.mark.parametrize("family", FAMILIES)
def test_repeat_copies_each_row_and_leaves_the_state_alone(family):
    lm = make_lm(family, torch.float64)
    starts = [ids(21, 9), ids(21, 10)]
    _, state = lm.forward(torch.tensor(starts), lm.init_state(2))
    before, _ = lm.forward(torch.tensor([[5], [6]]), state.clone())
    nxt = torch.tensor([ids(11, 11 + r) for r in range(6)])
    out, _ = lm.forward(nxt, state.repeat(3))
    for r in range(6):  # row i * 3 + j continues row i: as if that row had been read on its own
        _, alone = lm.forward(torch.tensor([starts[r // 3]]), lm.init_state(1))
        expected, _ = lm.forward(nxt[r : r + 1], alone)
        torch.testing.assert_close(out[r], expected[0], rtol=0, atol=1e-10)
    after, _ = lm.forward(torch.tensor([[5], [6]]), state)
    torch.testing.assert_close(after, before, rtol=0, atol=0)  # repeat left the original as it was


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_last_is_the_end_of_forward(family):
    lm = make_lm(family, torch.float64)
    tokens = torch.tensor([ids(37, 20), ids(37, 21)])
    full, state = lm.forward(tokens, lm.init_state(2))
    for last in (0, 1, 9, 37):
        part, other = lm.forward_last(tokens, lm.init_state(2), last)
        assert part.shape == (2, last, full.shape[-1])
        torch.testing.assert_close(part, full[:, 37 - last :], rtol=0, atol=1e-12)
        after, _ = lm.forward(torch.tensor([[4], [5]]), other)  # the same state as forward's
        expected, _ = lm.forward(torch.tensor([[4], [5]]), state.clone())
        torch.testing.assert_close(after, expected, rtol=0, atol=1e-12)
    advanced = lm.advance(tokens, lm.init_state(2))
    torch.testing.assert_close(lm.forward(torch.tensor([[4], [5]]), advanced)[0], expected, rtol=0, atol=1e-12)
