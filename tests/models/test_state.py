"""Every family's state satisfies the State protocol (models.base.State), in type and in behaviour: `clone` shares no
tensor, `repeat(n)` repeats each row n times and leaves the state as it was, `nbytes` counts every tensor held.

The tensors of a state are found here by walking its attributes, independently of each family's own code."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from megaeval import load_model
from megaeval.distributed import ChunkGroup
from megaeval.models.base import State
from megaeval_testing.recurrent import MODEL_TYPES


def held(obj, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from `obj` through lists, tuples, dicts and public instance attributes, in a fixed
    order (private attributes: the spare room of the hf family's KV buffers, `hf.kv_cache`, which `nbytes` does not
    count; tests/models/test_hf_kv_cache.py checks it)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [obj]
    if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float, bool, torch.dtype, torch.device)):
        return []
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in held(item, seen)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in held(item, seen)]
    public = [v for k, v in getattr(obj, "__dict__", {}).items() if not k.startswith("_")]
    return [t for item in public for t in held(item, seen)]


def megalodon(norm_stats: str):
    lm = load_model("embedded:megalodon-tiny", dtype="float64", norm_stats=norm_stats)
    return lm, lm.init_state


def rfa():
    lm = load_model("embedded:rfa-tiny", dtype="float64")
    return lm, lm.init_state


def hf(sequence_parallel: bool):
    lm = load_model("embedded:transformer-tiny", dtype="float64")
    if sequence_parallel:
        from megaeval.models.hf.parallel import SequenceParallelLM

        lm = SequenceParallelLM(lm, ChunkGroup())  # one rank: its ShardedState holds the whole cache
    return lm, lm.init_state


def recurrent(kind: str):
    """A tiny random checkpoint transformers saved, loaded by the recurrent family (the folder is gone after)."""
    from megaeval_testing.recurrent import save_tiny

    folder = Path(tempfile.mkdtemp(prefix=f"state-{kind}-"))
    try:
        lm = load_model(save_tiny(folder, kind), dtype="float64")
    finally:
        shutil.rmtree(folder)
    return lm, lm.init_state


FAMILIES = {
    "megalodon": lambda: megalodon("cumulative"),
    "megalodon-official-window": lambda: megalodon("official-window"),  # also keeps the last tokens
    "rfa": rfa,
    "hf": lambda: hf(False),
    "hf-sequence-parallel": lambda: hf(True),
    **{f"recurrent-{kind}": (lambda kind=kind: recurrent(kind)) for kind in MODEL_TYPES},
}  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILIES))
def state(request) -> State:
    """A state of batch 2 after 37 tokens (a partial MEGALODON chunk: its keys and values are held too)."""
    lm, init = FAMILIES[request.param]()
    tokens = torch.randint(0, lm.tokenizer.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0))
    _, after = lm.forward(tokens, init(2))
    assert isinstance(init(1), State)
    return after


def test_is_a_state(state):
    assert isinstance(state, State)
    assert isinstance(state.clone(), State) and isinstance(state.repeat(2), State)
    assert len(held(state)) > 0 and all(t.shape[0] == 2 for t in held(state))


def test_nbytes_is_the_bytes_of_every_tensor_held(state):
    assert state.nbytes() == sum(t.numel() * t.element_size() for t in held(state)) > 0


def test_clone_is_equal_and_shares_no_tensor(state):
    copy = state.clone()
    pairs = list(zip(held(copy), held(state), strict=True))
    for c, s in pairs:
        assert c.dtype == s.dtype and torch.equal(c, s)
        if s.numel():
            assert c.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
    before = [s.clone() for _, s in pairs]
    with torch.inference_mode():
        for c, _ in pairs:
            c.add_(1)
    assert all(torch.equal(s, b) for (_, s), b in zip(pairs, before, strict=True))
    assert copy.nbytes() == state.nbytes()


@pytest.mark.parametrize("n", [1, 3])
def test_repeat_gives_each_row_n_times_and_leaves_the_state(state, n):
    before = [t.clone() for t in held(state)]
    repeated = state.repeat(n)
    for r, s in zip(held(repeated), held(state), strict=True):
        assert r.shape == (s.shape[0] * n, *s.shape[1:]) and r.dtype == s.dtype
        for i in range(s.shape[0]):
            for j in range(n):
                assert torch.equal(r[i * n + j], s[i])
    assert all(torch.equal(s, b) for s, b in zip(held(state), before, strict=True))
    assert repeated.nbytes() == n * state.nbytes()
