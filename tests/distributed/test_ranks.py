"""Two real ranks (spawned processes, gloo, a file:// store, 1 thread each, hard deadlines): sharding and
gathering give one process's unit order, one rank's failure ends both within seconds with its message,
and chunk parallel equals one process."""

from __future__ import annotations

import pytest

from megaeval.distributed import init_distributed
from megaeval_testing import distributed as work
from megaeval_testing.distributed import run_ranks, values

# ----------------------------------------------------------------------------------- sharding, gather


def _one_process(n_units):
    with init_distributed("cpu", env={}) as ctx:
        return work.journal_run(list(range(n_units)), ctx)


@pytest.mark.parametrize(
    "chunk_parallel", [1, pytest.param(2, marks=pytest.mark.slow, id="2")]
)  # P=2: one data-parallel group of two ranks
def test_sharded_rounds_and_gather_give_one_process_order(tmp_path, chunk_parallel):
    n = 7  # uneven: with 2 groups, group 1 is idle in the last round
    rank0, rank1 = values(run_ranks(work.shard_and_gather, 2, tmp_path, n_units=n, chunk_parallel=chunk_parallel))
    expected = [item for rnd in _one_process(n) for item in rnd]
    assert [item for rnd in rank0["journal"] for item in rnd] == expected  # journaled round by round
    assert rank0["gathered"] == expected and rank1["gathered"] is None
    assert rank1["journal"] == []
    assert [item for rnd in rank0["resumed"] for item in rnd] == expected[3:]  # a resumed run: the rest
    if chunk_parallel == 1:
        assert (rank0["mine"], rank1["mine"]) == ([0, 2, 4, 6], [1, 3, 5])
        assert (rank0["rounds"], rank1["rounds"]) == ([0, 2, 4, 6], [1, 3, 5, None])
        assert [len(rnd) for rnd in rank0["journal"]] == [2, 2, 2, 1]
    else:
        assert rank0["mine"] == rank1["mine"] == list(range(n))
        assert rank0["group"] == (0, 1, 0, (0, 1)) and rank1["group"] == (0, 1, 1, (0, 1))


# ----------------------------------------------------------------------------------- faults


MESSAGE = "rank 1: bad token id 9999 in example 3; re-encode"


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raise", MESSAGE),  # rank 1 raises out of the run while rank 0 waits in a collective
        pytest.param("check", MESSAGE, marks=pytest.mark.slow),  # passed to the round's collective
        pytest.param("bug", "rank 1: ValueError: shapes do not match", marks=pytest.mark.slow),  # rank 0 computing
    ],
)
def test_an_error_on_rank_1_stops_both_ranks_with_its_message(tmp_path, how, message):
    results = run_ranks(work.fail_on_rank1, 2, tmp_path, timeout=60, how=how)
    rank0, rank1 = results
    assert rank0["error"] == message and rank0["type"] == "MegaevalError" and rank0["exitcode"] == 2
    if how == "bug":  # the failing rank keeps its own exception (and traceback)
        assert rank1["type"] == "ValueError" and rank1["exitcode"] == 1
    else:
        assert rank1["error"] == message and rank1["type"] == "MegaevalError" and rank1["exitcode"] == 2
    assert abs(rank0["finished"] - rank1["finished"]) < 5  # promptly: rank 0 had 60 s of work left in "bug"


@pytest.mark.slow
def test_a_killed_rank_does_not_leave_the_other_waiting(tmp_path):
    rank0, rank1 = run_ranks(work.fail_on_rank1, 2, tmp_path, timeout=60, how="killed")
    assert rank1["exitcode"] == 9
    assert rank0["error"].startswith("rank 0: lost contact with another rank") and rank0["exitcode"] == 2


@pytest.mark.slow
def test_a_hung_rank_times_out_and_both_stop(tmp_path):
    """Rank 1 never reaches the collective; after the 2 s timeout rank 0 fails and tells rank 1."""
    rank0, rank1 = run_ranks(work.hang_with_timeout, 2, tmp_path, timeout=60)
    assert rank0["error"].startswith("rank 0: lost contact with another rank") and "Timed out" in rank0["error"]
    assert rank1["error"] == rank0["error"] and rank1["exitcode"] == 2
    assert abs(rank0["finished"] - rank1["finished"]) < 5


# ----------------------------------------------------------------------------------- chunk parallel


def _assert_exact(results, tol_sum, tol_tok):
    rank0, rank1 = values(results)
    assert rank0 == rank1  # every rank of the group ends with the same numbers
    for case in rank0:
        assert case["rel_sum"] <= tol_sum, case
        assert case["max_tok"] <= tol_tok and case["next"] <= tol_tok, case
        assert case["state"] <= tol_tok, case


def test_chunk_parallel_equals_one_process(tmp_path):
    """P = 2 on a random float64 MEGALODON (chunk 8): nll_sum within rel 1e-12 of one process, for
    even and uneven slices, a partial last chunk, batches, a state that starts mid-chunk, a segment
    shorter than a chunk (rank 1 idle) and one token; the state after it carries on exactly."""
    cases = [
        ("float64", 1, 40, 0),  # 5 chunks: 3 + 2
        ("float64", 2, 37, 0),  # partial last chunk, batch 2
        ("float64", 2, 64, 5),  # after a 5-token prefix: slices cut at absolute chunk boundaries
        ("float64", 1, 3, 0),  # less than a chunk: rank 1 has nothing to do
        ("float64", 3, 1, 0),
    ]
    results = run_ranks(work.chunk_parallel_cases, 2, tmp_path, cases=cases)
    _assert_exact(results, 1e-12, 1e-12)
    assert [tuple(c["case"]) for c in values(results)[0]] == cases


def test_chunk_parallel_model_serves_scrolls_and_academic_calls(tmp_path):
    """The chunk-parallel MEGALODON model of scrolls and academic (prompts read chunk parallel, the last
    positions' logits on every rank from the full state) equals one process within 1e-10."""
    for r in values(run_ranks(work.megalodon_contract, 2, tmp_path)):
        for key in ("forward_last", "repeat", "after_repeat", "score_pairs"):
            assert r[key] <= 1e-10, (key, r)
        assert r["score_pairs_greedy"]


@pytest.mark.slow
def test_chunk_parallel_equals_one_process_in_steps_and_float32(tmp_path):
    """Several internal steps per slice (as long segments take), and a float32 model."""
    cases = [("float64", 1, 200, 0), ("float64", 2, 157, 13), ("float32", 2, 50, 3)]
    values_ = values(run_ranks(work.chunk_parallel_cases, 2, tmp_path, cases=cases, step_tokens=16))
    for rank in values_:
        for case in rank:
            tol = (1e-12, 1e-12) if case["case"][0] == "float64" else (1e-6, 1e-4)
            assert case["rel_sum"] <= tol[0] and case["max_tok"] <= tol[1] and case["state"] <= tol[1], case


@pytest.mark.slow
def test_chunk_parallel_refusals_reach_every_rank_of_the_group(tmp_path):
    rank0, rank1 = values(run_ranks(work.chunk_parallel_refusals, 2, tmp_path))
    assert rank0 == rank1
    assert rank0["official-window"].startswith("--chunk-parallel needs --norm-stats cumulative")
    assert rank0["different"].startswith("the ranks of a chunk-parallel group were given different segments")
    assert rank0["bad-token"].startswith("token ids must lie in [0, 512)")
