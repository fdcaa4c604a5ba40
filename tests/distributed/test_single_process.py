"""megaeval.distributed without a launcher, and the pure parts (launcher detection, sharding, slices,
the exact merges chunk parallel relies on), all in this one process."""

from __future__ import annotations

import pytest
import torch

from megaeval.distributed import (
    ChunkGroup,
    DistContext,
    broadcast_object,
    detect_launch,
    gather,
    gather_round,
    init_distributed,
    num_rounds,
    rounds,
    shard,
)
from megaeval.errors import MegaevalError, fail
from megaeval.kernels.cema import cema
from megaeval.kernels.timestep_norm import timestep_norm
from megaeval.models.group import chunk_slices
from megaeval.models.megalodon import MegalodonLM
from megaeval.models.megalodon.parallel import advance, merge, score_chunk_parallel, slice_moments
from megaeval.models.megalodon.state import NormState
from megaeval_testing import VOCAB, FakeTokenizer, random_model, small_args

# ----------------------------------------------------------------------------------- trivial context


def test_single_process_context_is_trivial():
    ctx = init_distributed("cpu", env={})
    assert not ctx.is_distributed and ctx.is_main and ctx.reports
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.num_groups, ctx.group_index) == (0, 1, None, 1, 0)
    assert ctx.chunk_parallel == 1 and ctx.chunk.group is None and ctx.device == torch.device("cpu")
    assert shard(5, ctx) == [0, 1, 2, 3, 4] and shard([7, 3, 9], ctx) == [7, 3, 9]
    assert rounds(3, ctx) == [0, 1, 2] and num_rounds(0, ctx) == 0
    assert gather(ctx, {2: "b", 0: "a"}) == {0: "a", 2: "b"} and list(gather(ctx, {2: "b", 0: "a"})) == [0, 2]
    assert gather_round(ctx, 4, {"nll": 1.0}) == {4: {"nll": 1.0}} and gather_round(ctx, None) == {}
    assert broadcast_object(ctx, [1, 2]) == [1, 2]
    ctx.check(None)
    ctx.barrier()
    error = fail("bad input", "fix it")
    with pytest.raises(MegaevalError) as raised:
        ctx.check(error)
    assert raised.value is error  # one process: unchanged, no "rank 0:" prefix
    with pytest.raises(ValueError, match="boom"), ctx:  # leaving the context re-raises as is
        raise ValueError("boom")
    assert ctx.closed


def test_launcher_detection():
    assert detect_launch({}) is None
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    launch = detect_launch(env)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.local_world_size) == (3, 4, 1, 2)
    with pytest.raises(MegaevalError, match="WORLD_SIZE is not set"):
        detect_launch({"RANK": "0"})
    with pytest.raises(MegaevalError, match="not all integers"):
        detect_launch({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(MegaevalError, match="do not fit"):
        detect_launch({"RANK": "2", "WORLD_SIZE": "2"})
    # torchrun with one process is one process: no process group
    ctx = init_distributed("cpu", env={**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert not ctx.is_distributed


@pytest.mark.parametrize(
    ("world", "chunk_parallel", "message"),
    [
        (1, 2, "--chunk-parallel 2 needs 2 ranks but this is a single process; launch with torchrun"),
        (2, 3, "--chunk-parallel 3 does not divide the 2 ranks"),
        (4, 0, "--chunk-parallel must be a whole number >= 1, got 0"),
        (4, 1.5, "--chunk-parallel must be a whole number >= 1"),
    ],
)
def test_bad_chunk_parallel_is_refused_before_any_process_group(tmp_path, world, chunk_parallel, message):
    kwargs = {} if world == 1 else dict(rank=0, world_size=world, init_method=f"file://{tmp_path}/store")
    with pytest.raises(MegaevalError, match="^" + message.replace("(", r"\(")) as raised:
        init_distributed("cpu", chunk_parallel, 5.0, env={}, **kwargs)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "store").exists()


def test_bad_timeout_is_refused():
    with pytest.raises(MegaevalError, match="timeout must be positive"):
        init_distributed("cpu", 1, 0, env={})


# ----------------------------------------------------------------------------------- sharding


def _contexts(world: int, P: int) -> list[DistContext]:
    """What every rank's context says about groups (no process group needed: sharding is pure)."""
    return [
        DistContext(r, world, r, "gloo", "cpu", ChunkGroup(P, r % P, tuple(range(r - r % P, r - r % P + P))))
        for r in range(world)
    ]


@pytest.mark.parametrize(("world", "P"), [(1, 1), (2, 1), (2, 2), (3, 1), (4, 2), (6, 3), (4, 4)])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 9])
def test_every_unit_once_in_order_and_the_same_rounds_everywhere(world, P, n):
    units = [10 + 3 * i for i in range(n)]  # ids, e.g. what a resumed run still has to do
    ctxs = _contexts(world, P)
    per_rank = [rounds(units, c) for c in ctxs]
    assert len({len(r) for r in per_rank}) == 1  # every rank takes part in every round
    for c, r in zip(ctxs, per_rank, strict=True):
        assert [u for u in r if u is not None] == shard(units, c)
        assert r == per_rank[c.group_index * P]  # a chunk-parallel group shares its units
    leaders = [r for c, r in zip(ctxs, per_rank, strict=True) if c.reports]
    folded = [u for k in range(len(per_rank[0])) for r in leaders if (u := r[k]) is not None]
    assert folded == units  # rank 0 folding round by round, group by group, sees unit order
    if n:
        assert max(len(shard(units, c)) for c in ctxs) - min(len(shard(units, c)) for c in ctxs) <= 1


# ----------------------------------------------------------------------------------- chunk parallel


@pytest.mark.parametrize("position", [0, 3, 8, 13])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_chunk_slices_are_contiguous_chunk_aligned_and_balanced(position, parts):
    C = 8
    for T in range(0, 70):
        slices = chunk_slices(T, parts, C, position)
        assert len(slices) == parts and slices[0][0] == 0 and slices[-1][1] == T
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
        assert all(s <= e for s, e in slices)
        assert all((position + s) % C == 0 for s, e in slices[1:] if e > s)
        chunks = [-(-(e - s - (min((-position) % C, e - s) if i == 0 else 0)) // C) for i, (s, e) in enumerate(slices)]
        assert max(chunks) - min(chunks) <= 1


def test_merged_statistics_equal_the_running_ones():
    """Chan's merge of slice statistics equals TimestepNorm's running statistics over the whole."""
    g = torch.Generator().manual_seed(0)
    B, G, D = 2, 4, 16
    x = torch.randn(B, 50, D, dtype=torch.float64, generator=g) * 3 + 1
    w = torch.zeros(D, dtype=torch.float64)
    mean0 = torch.randn(B, G, dtype=torch.float64, generator=g)
    prior = NormState(7, mean0, torch.rand(B, G, dtype=torch.float64, generator=g) + 0.5)
    for carried in (prior, NormState(0, prior.mean, prior.var)):
        _, mean, var = timestep_norm(x, w, w, carried.count, carried.mean, carried.var, 1e-5)
        merged = carried
        for a, b in [(0, 13), (13, 13), (13, 40), (40, 50)]:  # an empty slice too
            m = slice_moments(x[:, a:b], G, [(0, b - a)] if b > a else [])
            merged = merge(merged, b - a, m[0], m[1])
        assert merged.count == carried.count + 50
        torch.testing.assert_close(merged.mean, mean, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(merged.var, var, rtol=1e-13, atol=1e-13)
    pieces = slice_moments(x, G, [(0, 5), (5, 30), (30, 50)])  # piece by piece = all at once
    torch.testing.assert_close(pieces, slice_moments(x, G, [(0, 50)]), rtol=1e-14, atol=1e-14)


def test_cema_states_combine_across_slices():
    """h_in(k) = q**n(k-1) h_in(k-1) + h_local(k-1): the CEMA state entering each slice, exactly."""
    model = random_model(small_args(), 0, torch.float64)
    e = model.layers[0].mega.cema
    p, log_q, gamma = e.coefficients()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 45, 16, dtype=torch.float64, generator=g)
    h0 = torch.randn(2, 16, 4, dtype=torch.complex128, generator=g)
    y_ref, h_ref = cema(x, h0, p, log_q, gamma, e.omega)
    h, ys = h0, []
    for a, b in [(0, 16), (16, 40), (40, 45)]:
        _, h_local = cema(x[:, a:b], torch.zeros_like(h0), p, log_q, gamma, e.omega)
        y, _ = cema(x[:, a:b], h, p, log_q, gamma, e.omega)  # the slice, from the combined state
        ys.append(y)
        h = advance(h, log_q, b - a) + h_local
    torch.testing.assert_close(torch.cat(ys, 1), y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)


def _lm(norm_stats="cumulative"):
    return MegalodonLM(random_model(small_args(), 0, torch.float64), FakeTokenizer(), None, norm_stats=norm_stats)


def test_chunk_parallel_of_one_rank_is_score():
    lm = _lm()
    toks = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(0))
    ref, ref_state = lm.score(toks[:, :-1], toks[:, 1:], lm.init_state(2))
    nll, state = score_chunk_parallel(lm, toks[:, :-1], toks[:, 1:], ChunkGroup(), keep_state=True)
    assert torch.equal(nll, ref) and state.position == ref_state.position == 29


def test_chunk_parallel_refuses_official_window_and_other_families():
    toks = torch.zeros(1, 9, dtype=torch.long)
    pair = ChunkGroup(2, 0, (0, 1))  # refused before any exchange: no process group needed
    with pytest.raises(MegaevalError, match="^--chunk-parallel needs --norm-stats cumulative, not official-window"):
        score_chunk_parallel(_lm("official-window"), toks[:, :-1], toks[:, 1:], pair)

    class OtherLM:
        family = "hf"

    with pytest.raises(MegaevalError, match="^--chunk-parallel runs MEGALODON models only, not hf"):
        score_chunk_parallel(OtherLM(), toks[:, :-1], toks[:, 1:], pair)
