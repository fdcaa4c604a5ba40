"""LongPPL's arithmetic (megaeval.metrics.longppl) against naive loops, hand-computed values and, where the
`longppl` package is installed, the reference's own merge_intervals and cal_overlap."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from megaeval.errors import MegaevalError
from megaeval.metrics.longppl import (
    document_longppl,
    key_positions,
    merge_spans,
    pooled_perplexity,
    short_windows,
    tokens_inside,
)


def test_short_windows_are_the_references_and_score_every_position_past_trunc_len_once():
    assert short_windows(10, 4, 3) == [(0, 7), (3, 10)]
    assert short_windows(12, 4, 3) == [(0, 7), (3, 10), (6, 12)]  # the last one cut at the text's end
    assert short_windows(4, 4, 3) == [] and short_windows(5, 4, 3) == [(0, 5)]
    rng = random.Random(0)
    for _ in range(200):
        n, t, w = rng.randint(1, 60), rng.randint(1, 20), rng.randint(1, 20)
        scored = [p for s, e in short_windows(n, t, w) for p in range(s + t, e)]
        assert scored == list(range(t, n)), (n, t, w)  # each position >= t once, in order
        assert all(e - s <= t + w for s, e in short_windows(n, t, w))
    with pytest.raises(MegaevalError, match="must be positive"):
        short_windows(10, 0, 3)


def test_key_positions_are_strict_on_both_conditions():
    full = np.array([0.0, 1.0, 1.0, 1.999, 2.0, 0.5])
    short = np.array([np.nan, 3.0, 3.0001, 4.5, 9.0, np.nan])
    # position 1: a drop of exactly 2 is not more than alpha; 2: it is; 3: kept; 4: full == 2 is not below 2;
    # 5: no short-context loss
    assert key_positions(full, short, 2.0, -2.0).tolist() == [2, 3]
    rng = np.random.default_rng(1)
    full, short = rng.uniform(0, 6, 500), rng.uniform(0, 8, 500)
    naive = [p for p in range(500) if short[p] - full[p] > 1.5 and full[p] < 3.0]
    assert key_positions(full, short, 1.5, -3.0).tolist() == naive


def test_spans_merge_only_where_they_touch():
    assert merge_spans([(0, 3), (3, 5), (6, 8), (8, 9), (9, 9)]) == [(0, 5), (6, 9)]
    assert merge_spans([]) == []


def test_tokens_inside_are_those_wholly_within_a_span():
    offsets = [(0, 2), (2, 5), (5, 9), (9, 12), (12, 13), (13, 20)]
    spans = [(2, 9), (10, 13)]
    # (2,5) and (5,9) lie inside [2, 9]; (9,12) overlaps [10,13] only in part; (12,13) lies inside it
    assert tokens_inside(offsets, spans) == [1, 2, 4]
    rng = random.Random(2)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, 80), rng.randint(1, 20)))
        offsets = list(zip([0, *cuts], [*cuts, 80], strict=True))
        points = sorted(rng.sample(range(0, 81), 2 * rng.randint(1, 5)))
        spans = merge_spans(list(zip(points[::2], points[1::2], strict=True)))
        naive = [i for i, (a, b) in enumerate(offsets) if any(s <= a and b <= e for s, e in spans)]
        assert tokens_inside(offsets, spans) == naive


def test_document_and_pooled_perplexity_by_hand():
    nll = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    assert document_longppl(nll, [2, 4]) == pytest.approx(math.exp(3.0))
    assert document_longppl(nll, []) is None and document_longppl(nll, [0]) is None
    # token-weighted: exp((3 ln 2 + 1 ln 8) / 4) = 2 ** 1.5; a document without key tokens is left out
    assert pooled_perplexity([(2.0, 3), (None, 0), (8.0, 1)]) == pytest.approx(2**1.5)
    assert pooled_perplexity([(None, 0)]) is None


def test_merge_and_overlap_equal_the_reference_package():
    reference = pytest.importorskip("longppl.longppl")
    torch = pytest.importorskip("torch")
    rng = random.Random(3)
    for _ in range(100):
        points = sorted(rng.sample(range(0, 200), 2 * rng.randint(1, 12)))
        raw = list(zip(points[::2], points[1::2], strict=True))
        touching = [(a, b) for a, b in raw] + [(b, b + 3) for _, b in raw[:2]]
        spans = sorted(set(touching))
        ours = merge_spans(spans)
        theirs = reference.merge_intervals(torch.tensor(spans)).tolist()
        ordered = all(s[1] <= t[0] for s, t in zip(spans, spans[1:], strict=False))
        if ordered:  # the reference expects ordered, disjoint spans
            assert [list(s) for s in ours] == theirs
        cuts = sorted(rng.sample(range(1, 200), rng.randint(1, 40)))
        offsets = list(zip([0, *cuts], [*cuts, 200], strict=True))
        # cal_overlap returns i - 1: the loss index of token i in its shifted loss vector
        assert [i - 1 for i in tokens_inside(offsets, ours)] == reference.cal_overlap(offsets, ours)
