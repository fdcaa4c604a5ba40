"""Benchmark (CUDA GPU, written for an H100): hf sequence-parallel attention on one rank against plain SDPA.

    python bench/gpu_sequence_parallel.py --out FILE.json     # table on stdout, numbers in FILE.json

A Llama-like attention layer (batch 1, 32 query heads, 8 key/value heads, head dim 128, bfloat16) over a
fresh T-token call, T = 8192 and 32768: torch SDPA (causal, grouped-query heads, output as transformers
returns it) against megaeval's `sequence_parallel_attention` in a one-rank `Call` (the path of a
`SequenceParallelLM` call on one rank). Target: SDPA ms / ours ms >= 0.9, outputs equal up to bfloat16
rounding. Checks of the log-sum-exp merge, against SDPA's rows: a continuation (the second half of the
queries over a cache of the first half: two fused calls merged) and one decoding step, in bfloat16 and in
float32 (memory-efficient kernel, a length not a multiple of 32). Without CUDA it stops with a message.
"""

from __future__ import annotations

import argparse
import json
import platform
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from megaeval.models.hf.attention import ACTIVE, Call, fused_kernel, sequence_parallel_attention

DEVICE = "cuda"
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
LENGTHS = (8192, 32768)
TARGET = 0.9  # SDPA time / ours at least this
MODULE = SimpleNamespace(is_causal=True)  # what the attention function reads of the layer


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_sequence_parallel.py needs a CUDA GPU (written for an H100) and torch sees none")


def milliseconds(fn) -> float:
    """Median time of fn in ms (Triton's do_bench: warm-up, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def inputs(T: int, dtype: torch.dtype, heads: int = HEADS, kv_heads: int = KV_HEADS, d: int = HEAD_DIM):
    """q [1, H, T, d] laid out [1, T, H, d] as a projection's view; k, v [1, Hkv, T, d] as the cache holds them."""
    g = torch.Generator(device=DEVICE).manual_seed(T)
    q = torch.randn(1, T, heads, d, device=DEVICE, dtype=dtype, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, kv_heads, T, d, device=DEVICE, dtype=dtype, generator=g) for _ in range(2))
    return q, k, v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).contiguous()


def ours(q, k, v, start: int = 0):
    """Queries at positions start.. (the last q.shape[2]) over keys 0..n-1, one rank: [B, Tq, H, d]."""
    n = k.shape[2]
    token = ACTIVE.set(Call(0, [torch.arange(start, n)], [torch.arange(n)], replicated=False, store=True))
    try:
        return sequence_parallel_attention(MODULE, q, k, v, None, scaling=q.shape[-1] ** -0.5)[0]
    finally:
        ACTIVE.reset(token)


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    diff = (out.double() - ref.double()).flatten()
    return dict(max_abs=diff.abs().max().item(), rel=(diff.norm() / ref.double().norm()).item())


def reference(q, k, v, dtype: torch.dtype) -> torch.Tensor:
    """Causal attention in `dtype` (float64: SDPA's math kernel), key heads repeated: [B, T, H, d]."""
    G = q.shape[1] // k.shape[1]
    return sdpa(q.to(dtype), k.to(dtype).repeat_interleave(G, 1), v.to(dtype).repeat_interleave(G, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    args = parser.parse_args()
    require_cuda()
    rows, checks = [], []
    print(f"{'T':>6} {'kernel':>9} {'SDPA ms':>9} {'ours ms':>9} {'ratio':>6} {'max abs':>9} {'rel err':>9}")
    with torch.inference_mode():
        for T in LENGTHS:
            q, k, v = inputs(T, torch.bfloat16)
            ref = sdpa(q, k, v)
            err = errors(ours(q, k, v), ref)
            sdpa_ms = milliseconds(lambda q=q, k=k, v=v: sdpa(q, k, v))
            ours_ms = milliseconds(lambda q=q, k=k, v=v: ours(q, k, v))
            kernel = str(fused_kernel(q, k, v, True, None))
            row = dict(T=T, kernel=kernel, sdpa_ms=sdpa_ms, ours_ms=ours_ms, ratio=sdpa_ms / ours_ms, **err)
            rows.append(row)
            print(f"{T:>6} {row['kernel']:>9} {sdpa_ms:>9.3f} {ours_ms:>9.3f} {row['ratio']:>6.3f} "
                  f"{err['max_abs']:>9.2e} {err['rel']:>9.2e}")  # fmt: skip
            del q, k, v, ref
        # the log-sum-exp merge: queries after a cache (a fused call over the cache, one causal), one decoding step
        cases = ((torch.bfloat16, 8192, HEADS, KV_HEADS, HEAD_DIM, torch.float32, 1e-2),
                 (torch.float32, 1000, 8, 2, 64, torch.float64, 1e-5))  # fmt: skip
        for dtype, T, heads, kv_heads, d, ref_dtype, tol in cases:
            q, k, v = inputs(T, dtype, heads, kv_heads, d)
            ref = reference(q, k, v, ref_dtype)
            for name, start in (("continuation", T // 2 + 3), ("decoding step", T - 1)):
                out = ours(q[:, :, start:], k, v, start)
                err = errors(out, ref[:, start:])
                ms = milliseconds(lambda q=q, k=k, v=v, s=start: ours(q[:, :, s:], k, v, s))
                kernel = str(fused_kernel(q[:, :, start:], k[:, :, :start], v[:, :, :start], False, None))
                checks.append(dict(case=name, dtype=str(dtype), T=T, start=start, kernel=kernel, ours_ms=ms,
                                   ok=err["rel"] <= tol, **err))  # fmt: skip
                verdict = "ok" if err["rel"] <= tol else "FAILED"
                print(f"{name} {dtype} T={T} from {start}: kernel {kernel}, {ms:.3f} ms, max abs {err['max_abs']:.2e}, "
                      f"rel err {err['rel']:.2e} ({verdict}, tolerance {tol})")  # fmt: skip
    met = all(r["ratio"] >= TARGET for r in rows)
    exact = all(r["rel"] <= 1e-2 for r in rows) and all(c["ok"] for c in checks)
    print(f"target SDPA / ours >= {TARGET}: {'met' if met else 'NOT met'}; agreement: {'ok' if exact else 'FAILED'}")
    result = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, python=platform.python_version(),
        shape=dict(batch=1, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype="bfloat16"),
        target=TARGET, target_met=met, agreement=exact, rows=rows, merge_checks=checks,
    )  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
