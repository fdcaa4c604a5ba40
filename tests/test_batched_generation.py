"""Rows at different positions in one batch (`State.stack`, `state.select`) and greedy decoding in batches with
rows leaving and joining (`scoring.generate.decode_rows`): every row gets what it gets alone.

References: each row's own calls from its own state (float64, <= 1e-10), and `greedy_generate`, the plain
one-row loop (identical tokens, texts and stop reasons)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megaeval.models import load_model
from megaeval.models.base import can_stack, stack_states
from megaeval.scoring.answering import LocalAnswerer, Query, Rule, like_lengths
from megaeval.scoring.decoding import GREEDY, Decoding
from megaeval.scoring.generate import decode_rows, generate_branches, greedy_generate, read
from megaeval_testing.recurrent import save_tiny

STACKING = [
    "embedded:transformer-tiny",
    "embedded:mamba2-tiny",
    "mamba",
    "rwkv",
    "embedded:rfa-tiny",
    "embedded:megalodon-tiny",
    "megalodon-chunk8",
    "recurrent_gemma",  # a 16-token attention window: rows both shorter and longer than it
]
EVERY = STACKING  # families decoded in batches (one that cannot stack would be added here)


@pytest.fixture(scope="module")
def models(tmp_path_factory, sp_model):
    cache = {}

    def get(name):
        if name not in cache:
            if name == "megalodon-chunk8":  # rows cross chunk boundaries at different steps
                from megaeval.models.megalodon import save_checkpoint
                from megaeval_testing import random_model, small_args

                spec = str(save_checkpoint(random_model(small_args(chunk_size=8)), tmp_path_factory.mktemp(name),
                                           sp_model))  # fmt: skip
            else:
                spec = name if ":" in name else str(save_tiny(tmp_path_factory.mktemp(name), name))
            cache[name] = load_model(spec, dtype="float64")
        return cache[name]

    return get


def ids(lm, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, lm.tokenizer.vocab_size - 1, n)


@pytest.mark.parametrize("name", STACKING)
def test_stacked_rows_of_very_different_lengths_give_each_row_its_own_logits(models, name):
    lm = models(name)
    lengths = (1, 37, 4, 120, 9)
    states = [read(lm, ids(lm, n, n), lm.init_state(1), logits=False)[1] for n in lengths]
    assert all(can_stack(s) for s in states)
    nxt = torch.as_tensor(np.stack([ids(lm, 3, 100 + k) for k in range(len(lengths))]))
    alone = [lm.forward(nxt[k : k + 1], s.clone())[0][0] for k, s in enumerate(states)]
    stacked = stack_states([s.clone() for s in states])
    out, stacked = lm.forward(nxt, stacked)
    assert max(float((out[k] - alone[k]).abs().max()) for k in range(len(lengths))) <= 1e-10
    # keep rows 3 and 0 (in that order), then go on: still each row's own numbers
    kept = stacked.select([3, 0])
    more = torch.as_tensor(np.stack([ids(lm, 2, 200), ids(lm, 2, 201)]))
    out2, kept = lm.forward(more, kept)
    for j, k in enumerate([3, 0]):
        ref = lm.forward(nxt[k : k + 1], states[k].clone())[1]
        ref_out, _ = lm.forward(more[j : j + 1], ref)
        assert float((out2[j] - ref_out[0]).abs().max()) <= 1e-10
    # a batch already stacked takes more rows, and a fresh (empty) state stacks too
    grown = stack_states([kept, states[1].clone(), lm.init_state(1)])
    assert grown.select([0, 1, 2, 3]) is not None
    out3, _ = lm.forward(torch.as_tensor(np.stack([ids(lm, 1, 300 + k) for k in range(4)])), grown)
    refs = [lm.forward(more[0:1], lm.forward(nxt[3:4], states[3].clone())[1])[1], None, states[1].clone(),
            lm.init_state(1)]  # fmt: skip
    refs[1] = lm.forward(more[1:2], lm.forward(nxt[0:1], states[0].clone())[1])[1]
    for k in range(4):
        ref_out, _ = lm.forward(torch.as_tensor(ids(lm, 1, 300 + k))[None], refs[k])
        assert float((out3[k] - ref_out[0]).abs().max()) <= 1e-10


@pytest.mark.parametrize("name", STACKING)
def test_a_stacked_state_repeated_keeps_each_rows_own_position(models, name):
    """`repeat(n)` of rows at different positions: row i * n + j continues row i (one token per row)."""
    lm = models(name)
    states = [read(lm, ids(lm, n, n), lm.init_state(1), logits=False)[1] for n in (3, 21)]
    repeated = stack_states([s.clone() for s in states]).repeat(2)
    nxt = torch.as_tensor(np.stack([ids(lm, 1, 400 + k) for k in range(4)]))
    out, _ = lm.forward(nxt, repeated)
    for r in range(4):
        ref, _ = lm.forward(nxt[r : r + 1], states[r // 2].clone())
        assert float((out[r] - ref[0]).abs().max()) <= 1e-10


def test_selecting_rows_leaves_the_state_as_it_was_and_drops_padding_no_row_needs(models):
    lm = models("embedded:transformer-tiny")
    states = [read(lm, ids(lm, n, n), lm.init_state(1), logits=False)[1] for n in (5, 50)]
    batch = stack_states([s.clone() for s in states])
    assert (batch.pads, batch.length, batch.row_lengths()) == ([45, 0], 50, [5, 50])
    short, long = batch.select([0]), batch.select([1])
    assert (batch.pads, batch.length, batch.batch_size) == ([45, 0], 50, 2)  # untouched
    assert (short.pads, short.length, long.pads, long.length) == (None, 5, None, 50)
    for row, state in ((short, states[0]), (long, states[1])):
        a, _ = lm.forward(torch.ones(1, 2, dtype=torch.long), row)
        b, _ = lm.forward(torch.ones(1, 2, dtype=torch.long), state.clone())
        assert float((a - b).abs().max()) <= 1e-10


@pytest.mark.parametrize("name", EVERY)
# batches of every size with -m slow; by default 5 rows, which end, leave and are refilled
@pytest.mark.parametrize("batch_size", [pytest.param(n, marks=pytest.mark.slow) for n in (1, 2)] + [5])
def test_decoding_in_batches_gives_each_prompt_its_own_answer(models, name, batch_size):
    lm = models(name)
    prompts = [ids(lm, n, 10 + k) for k, n in enumerate((3, 40, 17, 90, 1, 60, 25, 8))]
    piece = lm.tokenizer.decode([int(ids(lm, 1, 99)[0])]).strip()
    stop = [piece[:1]] if piece else []  # a stop string some answers reach (rows end at different steps)
    alone = []
    for p in prompts:
        logits, state = read(lm, p, lm.init_state(1))
        alone.append(greedy_generate(lm, logits, state, 9, stop))
    taken = []

    def rows():
        for k, p in enumerate(prompts):
            taken.append(k)
            yield read(lm, p, lm.init_state(1))

    got = decode_rows(lm, rows(), 9, stop, batch_size)
    assert [(g.text, g.tokens, g.stop_reason) for g in got] == [(a.text, a.tokens, a.stop_reason) for a in alone]
    assert taken == list(range(len(prompts)))


def sizes_into(sizes: list[int]):
    return lambda state: sizes.append(state.nbytes())


def test_prompts_that_share_no_start_decode_longest_first_and_answer_in_their_order(models):
    """`LocalAnswerer.answer` without shared starts: rows of like lengths together (read longest first), each answer
    in its prompt's place, sampled rows with their own prompt's seed; what each prompt gets alone."""
    lm = models("embedded:transformer-tiny")
    prompts = [ids(lm, n, 70 + n) for n in (12, 90, 3, 44, 90, 7)]
    seeds = tuple(100 + k for k in range(len(prompts)))
    for decoding in (GREEDY, Decoding(temperature=1.0, seeds=seeds)):
        alone = []
        for k, p in enumerate(prompts):
            one = Decoding(decoding.temperature, (seeds[k],)) if decoding.temperature else decoding
            alone.append(LocalAnswerer(lm).answer([Query(p)], Rule(7, (), one))[0][0])
        sizes: list[int] = []  # each prompt's KV cache as it is read: its length
        asked = [Query(p) for p in prompts]
        got, read_tokens = LocalAnswerer(lm).answer(
            asked, Rule(7, (), decoding), rows=3, after_prompt=sizes_into(sizes)
        )
        assert [(g.tokens, g.stop_reason) for g in got] == [(a.tokens, a.stop_reason) for a in alone]
        assert read_tokens == sum(map(len, prompts)) and sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    assert like_lengths([len(p) for p in prompts]) == [1, 4, 3, 0, 5, 2]  # longest first, ties as given


def test_rows_end_at_different_steps_and_the_queue_refills_the_batch(models):
    lm = models("embedded:mamba2-tiny")
    prompts = [ids(lm, n, 50 + n) for n in (12, 3, 30, 7, 19, 2, 44)]
    reference = []
    for p in prompts:
        logits, state = read(lm, p, lm.init_state(1))
        reference.append(greedy_generate(lm, logits, state, 6))
    lengths = {len(g.tokens) for g in reference}
    calls = []
    forward = lm.forward

    def counting(tokens, state):
        calls.append(tokens.shape[0])
        return forward(tokens, state)

    lm.forward = counting
    try:
        got = decode_rows(lm, (read(lm, p, lm.init_state(1)) for p in prompts), 6, None, 3)
    finally:
        del lm.forward
    assert [g.tokens for g in got] == [g.tokens for g in reference]
    assert max(calls) == 3 and sum(calls) == sum(len(g.tokens) - (g.stop_reason == "length") for g in reference)
    assert len(calls) < sum(len(g.tokens) for g in reference)  # fewer calls than one row at a time
    assert lengths  # (every row ran to the 6-token limit or to EOS)


def test_needle_prompts_decode_the_same_in_a_batch(models):
    lm = models("embedded:mamba2-tiny")
    trunk = ids(lm, 300, 1)
    prompts = [np.concatenate([trunk[:at], ids(lm, 40, at)]) for at in (0, 90, 250, 299)]
    one, read_one = generate_branches(lm, prompts, lm.init_state(1), 7, shared=True, batch_size=1)
    many, read_many = generate_branches(lm, prompts, lm.init_state(1), 7, shared=True, batch_size=4)
    assert [g.tokens for g in one] == [g.tokens for g in many] and read_one == read_many


# ---- the commands: --batch-size 1 and auto give identical reports and samples


def _same_runs(tmp_path, argv: list[str], tol: float = 1e-5) -> dict:
    """Run with --batch-size 1 and auto: the same results and samples; multiple-choice log-likelihoods, whose calls
    hold rows of several documents at auto, agree within `tol` (float32 sums over other shapes), decisions exactly."""
    import json

    from typer.testing import CliRunner

    from megaeval.cli import app

    reports = {}
    for size in ("1", "auto"):
        out, samples = tmp_path / f"{size}.json", tmp_path / f"{size}.jsonl"
        result = CliRunner().invoke(app, [*argv, "--batch-size", size, "--out", str(out), "--samples", str(samples),
                                          "--no-progress"])  # fmt: skip
        assert result.exit_code == 0, result.output
        reports[size] = json.loads(out.read_text())
    one, auto = ([json.loads(line) for line in (tmp_path / f"{size}.jsonl").read_text().splitlines()]
                 for size in ("1", "auto"))  # fmt: skip
    assert len(one) == len(auto)
    for a, b in zip(one, auto, strict=True):
        lls = a.pop("loglikelihoods", []), b.pop("loglikelihoods", [])
        assert a == b
        assert lls[1] == pytest.approx(lls[0], rel=0, abs=tol)
    strip = {"peak_memory_bytes", "state_bytes"}
    results = [{t: {k: v for k, v in r.items() if k not in strip} if isinstance(r, dict) else r
                for t, r in rep["results"].items()} for rep in reports.values()]  # fmt: skip
    assert results[0] == results[1]
    return reports


@pytest.mark.parametrize(("model", "dtype", "tasks", "limit"), [
    pytest.param("embedded:transformer-tiny", "float32", "nq_open,triviaqa,arc_easy,winogrande", "12",
                 marks=pytest.mark.slow),  # -m slow: float64 below holds the same paths
    ("embedded:transformer-tiny", "float64", "nq_open,arc_easy,winogrande", "12"),
    ("embedded:mamba2-tiny", "float32", "nq_open,triviaqa,arc_easy,winogrande", "12"),
    pytest.param("embedded:transformer-tiny", "float32", "mmlu", "1",
                 marks=pytest.mark.slow),  # 57 subjects: batches span several few-shot blocks
])  # fmt: skip
def test_academic_in_batches_equals_one_at_a_time(tmp_path, model, dtype, tasks, limit):
    from megaeval_testing import REPO

    reports = _same_runs(tmp_path, ["academic", "--model", model, "--tasks", tasks, "--dtype", dtype,
                                    "--data-dir", str(REPO / "data_prep" / "samples"), "--limit", limit],
                         tol=1e-10 if dtype == "float64" else 1e-4)  # fmt: skip
    assert reports["1"]["settings"]["batch_size_effective"] == 1
    assert reports["auto"]["settings"]["batch_size_effective"] == 8


def test_scrolls_in_batches_equals_one_at_a_time(tmp_path):
    from megaeval_testing import REPO

    reports = _same_runs(tmp_path, ["scrolls", "--model", "embedded:transformer-tiny", "--tasks", "qmsum",
                                    "--data-dir", str(REPO / "data_prep" / "samples" / "scrolls"), "--limit", "5",
                                    "--max-new-tokens", "30"])  # fmt: skip
    assert reports["auto"]["settings"]["batch_size_effective"] == 8  # max_context 512: the KV caches are small


def test_states_that_cannot_stack_answer_one_at_a_time(tmp_path):
    from megaeval_testing import REPO

    # MEGALODON's official-window norm mode keeps token history in its state: its rows cannot join a batch
    reports = _same_runs(tmp_path, ["academic", "--model", "embedded:megalodon-tiny", "--model-args",
                                    "norm_stats=official-window", "--tasks", "nq_open", "--data-dir",
                                    str(REPO / "data_prep" / "samples"), "--limit", "3"])  # fmt: skip
    assert reports["auto"]["settings"]["batch_size_effective"] == 1
