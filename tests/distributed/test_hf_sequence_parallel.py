"""Sequence parallel for hf models (--chunk-parallel with the hf family): two gloo ranks on CPU, one thread
each, against one process on the same rank; the command line through torchrun against one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megaeval import MegaevalError
from megaeval.distributed import ChunkGroup
from megaeval_testing import AUSTEN, smollm2
from megaeval_testing import hf_ranks as work
from megaeval_testing.distributed import run_ranks, values

pytest.importorskip("transformers")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return work.save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def one_line_on_both(rank0: dict, rank1: dict, key: str) -> str:
    assert rank0[key] == rank1[key] and rank0[key] is not None, (rank0[key], rank1[key])
    assert "\n" not in rank0[key]
    return rank0[key]


# ------------------------------------------------------------------------------------ library


@pytest.mark.parametrize("fused", [True, False])
def test_online_softmax_merges_shards_exactly(fused, monkeypatch):
    """Partial states over disjoint key sets (any split, tiles of 3), merged, equal plain causal attention,
    with visible and same-position causal tiles through PyTorch's fused CPU attention or all explicit."""
    from megaeval.models.hf import attention
    from megaeval.models.hf.attention import OnlineSoftmax

    assert attention.FUSED  # this torch has the fused CPU kernel, so `fused` really switches paths
    monkeypatch.setattr(attention, "FUSED", fused)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 10, 4, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    scores = (q.view(2, 2, 2, 10, 4) @ k[:, :, None].transpose(-1, -2)) * 0.5
    pos = torch.arange(10)
    for window in (None, 3):
        allowed = (pos[None] <= pos[:, None]) & ((pos[None] > pos[:, None] - window) if window else True)
        ref = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, :, None]).reshape(2, 4, 10, 4)
        old = attention.TILE
        try:
            attention.TILE = 3
            parts = []
            for keys in (torch.arange(0, 4), torch.arange(4, 7), torch.arange(7, 10)):
                acc = OnlineSoftmax(q, pos, 2, 0.5, window, None)
                acc.add(k[:, :, keys], v[:, :, keys], keys)
                parts.append(acc.packed())
        finally:
            attention.TILE = old
        acc.merge(parts)
        assert torch.allclose(acc.result(), ref.transpose(1, 2), rtol=0, atol=1e-14)


def causal_reference(q, k, v, qpos, kpos, scale, window=None):
    """Plain softmax attention [B, T, H, d] of q [B, H, T, d] over k, v [B, Hkv, n, d] masked by position,
    and the log-sum-exp of each query's scores [B, H, T]."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    allowed = kpos[None] <= qpos[:, None]
    if window is not None:
        allowed &= kpos[None] > qpos[:, None] - window
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2), s.logsumexp(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_fused_attention_gives_the_output_and_log_sum_exp(dtype, causal):
    """The kernel fused_kernel picks on CPU, through fused_attention, with grouped-query heads: the output and the
    log-sum-exp of plain softmax attention (causal: by index, the same positions)."""
    from megaeval.models.hf.attention import fused_attention, fused_kernel

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 7, 8, generator=g, dtype=dtype) for h in (6, 2, 2))
    kernel = fused_kernel(q, k, v, causal, None)
    out, lse = fused_attention(kernel, q, k, v, 0.3, causal)
    pos = torch.arange(7)
    ref, ref_lse = causal_reference(q, k, v, pos, pos if causal else torch.zeros(7, dtype=torch.long), 0.3)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert kernel == "cpu" and out.dtype == dtype
    assert torch.allclose(out.transpose(1, 2), ref, rtol=0, atol=tol)
    assert torch.allclose(lse.to(dtype), ref_lse, rtol=0, atol=tol)


def test_online_softmax_takes_the_fewest_fused_calls_the_positions_allow(monkeypatch):
    """A chunk after a cache (queries 6..9, keys 0..9; tiles of 3): one fused call for the keys before the chunk,
    one causal for the chunk, nothing explicit, as on a GPU. A state from one fused call (normalized) folds in
    explicit tiles (a sliding window's edge) and merges with other ranks' states exactly."""
    from megaeval.models.hf import attention
    from megaeval.models.hf.attention import OnlineSoftmax

    monkeypatch.setattr(attention, "TILE", 3)
    calls, fused = [], attention.fused_attention

    def counted(kernel, q, k, v, scale, causal):
        calls.append((q.shape[-2], k.shape[-2], causal))
        return fused(kernel, q, k, v, scale, causal)

    monkeypatch.setattr(attention, "fused_attention", counted)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, h, n, 8, generator=g, dtype=torch.float64) for h, n in ((4, 4), (2, 10), (2, 10)))
    qpos, kpos = torch.arange(6, 10), torch.arange(10)
    # a window: the chunk's keys in tiles; the last query sees all of the first tile and its own key (fused)
    cases = ((None, [(4, 6, False), (4, 4, True)]), (100, [(4, 6, False), (1, 3, False), (1, 1, False)]))
    for window, expected in cases:
        ref = causal_reference(q, k, v, qpos, kpos, 0.5, window)[0]
        calls.clear()
        acc = OnlineSoftmax(q, qpos, 2, 0.5, window, None)
        acc.add(k[:, :, :6], v[:, :, :6], kpos[:6])
        acc.add(k[:, :, 6:], v[:, :, 6:], kpos[6:])  # window: explicit, onto the fused call's normalized state
        assert calls == expected
        assert torch.allclose(acc.result(), ref, rtol=0, atol=1e-14)
        parts = []  # three ranks' key shards for the same queries, merged
        for keys in (slice(0, 3), slice(3, 6), slice(6, 10)):
            part = OnlineSoftmax(q, qpos, 2, 0.5, window, None)
            part.add(k[:, :, keys], v[:, :, keys], kpos[keys])
            parts.append(part.packed())
        acc.merge(parts)
        assert torch.allclose(acc.result(), ref, rtol=0, atol=1e-14)


def test_fused_kernel_on_cpu_and_where_there_is_none(monkeypatch):
    """CPU: PyTorch's flash attention for CPU, any dtype (it runs in the scores' dtype); soft caps, devices with no
    fused kernel and a torch without the CPU kernel: None, the explicit path. (CUDA: SDPA's own choice.)"""
    from megaeval.models.hf import attention
    from megaeval.models.hf.attention import fused_kernel

    def qkv(dtype, device="cpu"):
        q, kv = torch.zeros(1, 4, 3, 8, dtype=dtype, device=device), torch.zeros(1, 2, 3, 8, dtype=dtype, device=device)
        return q, kv, kv

    assert fused_kernel(*qkv(torch.float32), True, None) == fused_kernel(*qkv(torch.float64), False, None) == "cpu"
    assert fused_kernel(*qkv(torch.float32), True, 30.0) is None
    assert fused_kernel(*qkv(torch.float32, "meta"), True, None) is None
    monkeypatch.setattr(attention, "FUSED", False)
    assert fused_kernel(*qkv(torch.float32), True, None) is None


def test_other_families_are_refused_before_any_exchange():
    from megaeval.models import chunk_parallel_lm

    class RFA:
        family = "rfa"

    with pytest.raises(
        MegaevalError, match="^--chunk-parallel runs hf, megalodon and recurrent models only, not rfa; use --"
    ):
        chunk_parallel_lm(RFA(), ChunkGroup(2, 0, (0, 1)))


def test_one_rank_is_the_model_and_the_model_keeps_its_attention(llama_dir):
    """P = 1 (no exchange): two calls equal one process; the registered attention is set only during calls."""
    from megaeval import load_model
    from megaeval.distributed import ChunkGroup
    from megaeval.models.hf.parallel import SequenceParallelLM

    lm = load_model(f"hf:{llama_dir}", dtype="float64")
    sp = SequenceParallelLM(lm, ChunkGroup())
    ids = work.tokens(2, 100, seed=0)
    state = sp.init_state(2)
    first, state = sp.forward(ids[:, :70], state)
    second, state = sp.forward(ids[:, 70:], state)
    ref, ref_state = lm.forward(ids, lm.init_state(2))
    assert work.rel(torch.cat([first, second], 1), ref) <= 1e-12
    assert state.nbytes() == ref_state.nbytes() and state.length == 100
    assert lm.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "kind, message",
    [("gpt_neo", "GPTNeoForCausalLM computes attention outside transformers' attention interface"),
     ("bert", "BertLMHeadModel is not a causal language model")],
)  # fmt: skip
def test_unhookable_and_non_causal_models_are_refused_before_any_exchange(kind, message):
    from megaeval.distributed import ChunkGroup
    from megaeval.models.hf.parallel import score_sequence_parallel

    ids = work.tokens(1, 9, seed=0)
    with pytest.raises(MegaevalError, match=f"^{message}.*; use --chunk-parallel 1$"):
        score_sequence_parallel(work.tiny_model(kind), ids[:, :-1], ids[:, 1:], ChunkGroup(2, 0, (0, 1)))


def test_prefill_decode_and_nll_on_two_ranks_equal_one_process(llama_dir, tmp_path):
    """2K-token prefill, 16 greedy steps, a replicated and a sliced continuation: logits within 1e-10 of one
    process; NLLs within 1e-10 relative; each rank holds half the KV cache. And the rest of the contract
    scrolls and academic use: forward_last, advance, repeated states, score_pairs."""
    rank0, rank1 = values(run_ranks(work.prefill_and_decode, 2, tmp_path, timeout=240, model_dir=llama_dir))
    for r in (rank0, rank1):
        for key in ("prefill", "decode", "continue_20", "continue_160", "nll_token", "nll_continued",
                    "forward_last", "repeat", "after_repeat", "score_pairs"):  # fmt: skip
            assert r[key] <= 1e-10, (key, r[key])
        assert r["nll_sum"] <= 1e-10
        assert r["decode_same_tokens"] and r["greedy"][0] == r["greedy"][1] and r["score_pairs_greedy"]
        assert r["attn_implementation"] == "sdpa"
    # the prefill splits 1024 / 1024; the decoding steps alternate, starting with the last rank
    assert rank0["kv_prefill"][0] == rank1["kv_prefill"][0] == rank0["kv_prefill"][1] // 2
    assert rank0["kv_decode"][2] == [
        [(0, 1024), *((p, p + 1) for p in range(2049, 2064, 2))],
        [(1024, 2049), *((p, p + 1) for p in range(2050, 2063, 2))],
    ]
    assert rank0["kv_decode"][0] + rank1["kv_decode"][0] == rank0["kv_decode"][1]
    assert rank0["kv_end"][0] + rank1["kv_end"][0] == rank0["kv_end"][1]
    assert max(rank0["kv_end"][0], rank1["kv_end"][0]) <= 0.52 * rank0["kv_end"][1]


@pytest.mark.slow
def test_llama_mistral_qwen2_gpt_neox_gpt2_equal_one_process(tmp_path):
    """The attention hook works across architectures: grouped-query heads, a sliding window (Mistral, 48 of
    a 300-token prefill), partial rotary (GPT-NeoX), learned absolute positions (GPT-2)."""
    kinds = ["llama", "mistral", "qwen2", "gpt_neox", "gpt2"]
    for r in values(run_ranks(work.architectures, 2, tmp_path, timeout=240, kinds=kinds)):
        assert all(r[k] <= 1e-10 for k in kinds), r


@pytest.mark.slow
def test_refusals_reach_every_rank_as_one_line(llama_dir, tmp_path):
    rank0, rank1 = values(run_ranks(work.refusals, 2, tmp_path, timeout=120, model_dir=llama_dir))
    assert one_line_on_both(rank0, rank1, "gpt_neo").startswith(
        "GPTNeoForCausalLM computes attention outside transformers' attention interface"
    )
    assert one_line_on_both(rank0, rank1, "bert").startswith("BertLMHeadModel is not a causal language model")
    assert one_line_on_both(rank0, rank1, "megalodon").startswith("sequence parallel runs hf models only")
    assert one_line_on_both(rank0, rank1, "different").startswith("the ranks of a chunk-parallel group were given")
    assert "beyond max_context 4,096" in one_line_on_both(rank0, rank1, "too_long")


@pytest.mark.integration
def test_smollm2_float32_on_two_ranks_equals_one_process(tmp_path):
    folder, gguf = smollm2()
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:4000]
    results = values(run_ranks(work.smollm2, 2, tmp_path, timeout=400, model_dir=folder, gguf=gguf, text=text))
    for r in results:
        assert r["logits"] <= 1e-5 and r["nll_sum"] <= 1e-5, r
        assert r["mean_nll"] < 4.0  # a real model reads Austen well


# ------------------------------------------------------------------------------------ command line


def megaeval(*args: str, cwd: Path, ranks: int = 1, timeout: float = 240) -> subprocess.CompletedProcess:
    """The CLI, run from `cwd`: not from the repository, whose kernels/ would hide Hugging Face's `kernels`."""
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*(prefix if ranks == 2 else [sys.executable]), "-m", "megaeval", *args, "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=cwd)


@pytest.mark.slow
def test_ppl_sweep_chunk_parallel_2_equals_one_process_with_windows(llama_dir, tmp_path):
    """torchrun, --chunk-parallel 2, float64: within 1e-10 relative of one process at a length within
    max_context (256, set by --model-args) and one beyond it (sliding windows, each window one pass)."""
    from transformers import AutoTokenizer

    from megaeval.models.hf import HFTokenizer
    from megaeval_testing import write_stream

    books = [(AUSTEN / f"{b}.txt").read_text(encoding="utf-8")[:8000] for b in ("emma", "persuasion")]
    stream = write_stream(tmp_path / "stream", books, None,
                          tokenizer=HFTokenizer(AutoTokenizer.from_pretrained(llama_dir), str(llama_dir)))  # fmt: skip
    args = ["ppl-sweep", "--model", f"hf:{llama_dir}", "--model-args", "max_context=256", "--stream", str(stream),
            "--lengths", "128,512", "--tokens", "1024", "--batch-size", "2", "--dtype", "float64",
            "--window-policy", "sliding:128"]  # fmt: skip
    one = megaeval(*args, "--out", str(tmp_path / "one.json"), cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = megaeval(*args, "--chunk-parallel", "2", "--out", str(tmp_path / "two.json"), cwd=tmp_path, ranks=2)
    assert two.returncode == 0, two.stderr
    reference = json.loads((tmp_path / "one.json").read_text())
    report = json.loads((tmp_path / "two.json").read_text())
    assert report["settings"]["chunk_parallel"] == 2 and report["environment"]["world_size"] == 2
    for a, b in zip(reference["results"]["lengths"], report["results"]["lengths"], strict=True):
        assert abs(b["nll_sum"] - a["nll_sum"]) <= 1e-10 * abs(a["nll_sum"]), (a, b)
        assert b["peak_memory_bytes"] > 0
    curves = zip(reference["results"]["position_curve"], report["results"]["position_curve"], strict=True)
    for a, b in curves:
        for x, y in zip(a["buckets"], b["buckets"], strict=True):
            assert abs(x["mean_nll"] - y["mean_nll"]) <= 1e-10 * abs(x["mean_nll"])


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_scrolls_and_academic_chunk_parallel_2_equal_one_process(llama_dir, tmp_path):
    """torchrun, --chunk-parallel 2, float64, against one process (run here): SCROLLS prompts of ~4K tokens read
    sliced and greedy answers on the sharded cache give the same samples file (predictions, prompt sizes,
    stops), and the report records the largest KV shard (half of one process's cache) and peak memory;
    academic choices (ARC, WinoGrande) and 5-shot NQ answers give the same decisions, log-likelihoods within
    1e-10."""
    from megaeval.commands.academic import AcademicSettings, run_academic
    from megaeval.commands.scrolls import ScrollsSettings, run_scrolls
    from megaeval_testing import REPO, assert_close_records, read_jsonl

    data = REPO / "data_prep" / "samples"
    model = {"model": f"hf:{llama_dir}", "dtype": "float64"}
    scrolls = {**model, "tasks": "qmsum", "data_dir": str(data / "scrolls"), "shots": 0, "limit": 3,
               "max_new_tokens": 6}  # fmt: skip
    academic = {**model, "tasks": "arc_easy,winogrande,nq_open", "data_dir": str(data), "limit": 3}
    for name, settings, run in (("scrolls", scrolls, run_scrolls), ("academic", academic, run_academic)):
        cls = ScrollsSettings if name == "scrolls" else AcademicSettings
        one = run(cls(**settings, out=str(tmp_path / f"{name}1.json"), samples=str(tmp_path / f"{name}1.jsonl")),
                  progress=False)  # fmt: skip
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
        out = tmp_path / f"{name}2"
        two = megaeval(name, *flags, "--chunk-parallel", "2", "--out", f"{out}.json", "--samples", f"{out}.jsonl",
                       cwd=tmp_path, ranks=2)  # fmt: skip
        assert two.returncode == 0, two.stderr
        two = json.loads((tmp_path / f"{name}2.json").read_text())
        assert two["settings"]["chunk_parallel"] == 2 and two["model"]["chunk_parallel"] == 2
        if name == "scrolls":
            assert (tmp_path / "scrolls2.jsonl").read_text() == (tmp_path / "scrolls1.jsonl").read_text()
            assert all(r["prompt_tokens"] > 3000 and r["truncated_tokens"] for r in read_jsonl(f"{out}.jsonl"))
            assert two["results"]["qmsum"].pop("peak_memory_bytes") > 0
            assert one["results"]["qmsum"].pop("peak_memory_bytes") > 0
            kv_one, kv_two = one["results"]["qmsum"].pop("state_bytes"), two["results"]["qmsum"].pop("state_bytes")
            assert 0.5 * kv_one <= kv_two <= 0.51 * kv_one  # each rank holds half of the prompt's KV cache
            assert two["results"] == one["results"]
        else:
            assert_close_records(read_jsonl(f"{out}.jsonl"), read_jsonl(tmp_path / "academic1.jsonl"), 1e-10)
            assert_close_records(two["results"], one["results"], 1e-10)
