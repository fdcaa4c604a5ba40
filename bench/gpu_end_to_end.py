"""Benchmark (CUDA GPU, written for an H100/H200): `score` of a 7B-shaped MEGALODON in bfloat16, end to end.

    python bench/gpu_end_to_end.py [--layers 32] [--tokens 256K] [--long-layers 4] [--long-tokens 2M] [--out F.json]

A 7B-shaped MEGALODON (model_dim 4096, z 1024, value 8192, 4 heads, FFN 11264 SwiGLU, chunk 2048, vocabulary
32000) with random weights, drawn on the GPU, scores one stream of random tokens through `MegalodonLM.score`
(the path ppl-sweep takes), carrying the state from segment to segment:

1. `--layers` (default 32, the whole model) over `--tokens` (default 256K) in segments of 16K tokens: tokens/s
   and peak memory of every segment (flat = the same at every position), model FLOPs utilisation (FLOPs per
   token from the config over the measured bf16 matmul peak) and the ratio to the matmul-bound time; one
   segment with the PyTorch references (kernels "torch") beside it.
2. `--long-layers` (default 4) over `--long-tokens` (default 2M) in segments of 128K: the same numbers out to
   2M tokens, where the whole model would take minutes.
3. Where the time goes: a profile of one 2,048-token step of the whole model, kernels grouped by kind, and the
   whole model over 32K tokens with one part of the fast path swapped back to its PyTorch reference (the
   elementwise glue; the chunk attention).

Target: >= 25K tokens/s for the whole 32-layer model (about half the matmul-bound rate), flat in time and
memory from the first segment to the last. Without CUDA it stops with a message.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

import torch

from megaeval.kernels import TRITON, attention, rms_norm, silu_mul
from megaeval.models.megalodon import Megalodon, MegalodonLM, ModelArgs

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # bench/ beside this file: its kernels.py for the shared parts
from kernels import DEVICE, SEVEN_B, peak_matmul_tflops, require_cuda, write_result  # noqa: E402

E2E_TARGET = 25_000  # tokens/s of the 32-layer model


class _Tokenizer:
    bos_id, eos_id = 1, 2

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def describe(self) -> dict[str, Any]:
        return {}


def parse_tokens(text: str) -> int:
    """'256K' -> 262144, '2M' -> 2097152."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


def random_model(layers: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> Megalodon:
    """The 7B-shaped model with `layers` layers (`overrides` changing its config) on the GPU, initialised there
    (`Megalodon.init_weights` draws on the model's device: 8.6B numbers drawn on the CPU would take minutes)."""
    with torch.device("meta"):
        model = Megalodon(ModelArgs(num_layers=layers, **{**SEVEN_B, **overrides}))
    model = model.to(dtype).to_empty(device=DEVICE)
    with torch.no_grad():
        for buf in model.buffers():  # the norms' priors: none (count 0, mean 0, log-variance 0)
            buf.zero_()
    return model.init_weights(seed).eval().requires_grad_(False)


def lm_of(model: Megalodon, kernels: str) -> MegalodonLM:
    """The model behind the StreamingLM contract, with the given kernels."""
    return MegalodonLM(model, _Tokenizer(model.args.vocab_size), None, kernels=kernels)


def stream(lm: MegalodonLM, total: int, segment: int, peak_tflops: float) -> list[dict[str, Any]]:
    """Score one sequence of `total` random tokens in segments, carrying the state; one row per segment."""
    g = torch.Generator(device=DEVICE).manual_seed(1)
    tokens = torch.randint(3, lm.vocab_size, (1, total + 1), device=DEVICE, generator=g)
    warm = lm.args.chunk_size
    lm.score(tokens[:, :warm], tokens[:, 1 : warm + 1], lm.init_state(1))  # compile and autotune outside the clock
    flops = lm.args.flops_per_token()
    state, rows = lm.init_state(1), []
    for start in range(0, total, segment):
        end = min(total, start + segment)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        nll, state = lm.score(tokens[:, start:end], tokens[:, start + 1 : end + 1], state)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rate = (end - start) / seconds
        rows.append({"start": start, "tokens": end - start, "seconds": seconds, "tokens_per_s": rate,
                     "peak_memory_bytes": torch.cuda.max_memory_allocated(), "mean_nll": float(nll.float().mean()),
                     "mfu": rate * flops / (peak_tflops * 1e12)})  # fmt: skip
        if not math.isfinite(rows[-1]["mean_nll"]):
            raise SystemExit(f"non-finite NLL in the segment at {start}: the random model overflowed")
    return rows


def summary(name: str, lm: MegalodonLM, rows: list[dict[str, Any]], peak_tflops: float) -> dict[str, Any]:
    """A stream's rows and what they add up to."""
    rates = [r["tokens_per_s"] for r in rows]
    memory = [r["peak_memory_bytes"] for r in rows]
    tokens = sum(r["tokens"] for r in rows)
    rate = tokens / sum(r["seconds"] for r in rows)
    flops = lm.args.flops_per_token()
    return {
        "config": name, "layers": lm.args.num_layers, "kernels": lm.model.ops.backend, "tokens": tokens,
        "tokens_per_s": rate, "mfu": rate * flops / (peak_tflops * 1e12), "flops_per_token": flops,
        "matmul_bound_tokens_per_s": peak_tflops * 1e12 / flops, "slowest_vs_fastest_segment": min(rates) / max(rates),
        "last_vs_first_segment": rates[-1] / rates[0], "memory_last_vs_first": memory[-1] / memory[0],
        "peak_memory_bytes": max(memory), "segments": rows,
    }  # fmt: skip


KINDS = (  # kernel name fragments -> what they compute, first match wins
    ("gemm", "matmul"), ("sm90", "matmul"), ("cutlass", "matmul"), ("cublas", "matmul"), ("nvjet", "matmul"),
    ("flash", "attention"), ("fmha", "attention"), ("attention", "attention"), ("cudnn", "attention"),
    ("_cema", "cema"), ("_timestep_norm", "timestep_norm"), ("_lse_nll", "nll"),
)  # fmt: skip


def profile_step(lm: MegalodonLM) -> dict[str, Any]:
    """GPU time of one 2,048-token score step, by kernel kind and by the heaviest kernels."""
    from torch.profiler import ProfilerActivity, profile

    T = lm.args.chunk_size
    tokens = torch.randint(3, lm.vocab_size, (1, T + 1), device=DEVICE)
    state = lm.init_state(1)
    lm.score(tokens[:, :-1], tokens[:, 1:], state)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        lm.score(tokens[:, :-1], tokens[:, 1:], state)
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if us <= 0:
            continue
        name = e.key.lower()
        kind = next((k for frag, k in KINDS if frag in name), "elementwise / other")
        by_kind[kind] += us / 1e3
        kernels.append({"kernel": e.key[:90], "ms": us / 1e3, "calls": e.count, "kind": kind})
    kernels.sort(key=lambda k: -k["ms"])
    total = sum(by_kind.values())
    return {"tokens": T, "total_ms": total, "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top_kernels": kernels[:15]}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    """The results as aligned text."""
    lines = [f"{result['device']} | peak bf16 matmul {result['peak_bf16_tflops']:.0f} TFLOP/s", ""]
    header = f"{'score, bf16':<30}{'tokens':>10}{'tok/s':>10}{'MFU':>7}{'bound tok/s':>13}{'slow/fast':>10}"
    lines.append(header + f"{'mem GiB':>9}{'mem last/first':>16}  target")
    for s in result["streams"]:
        target = ""
        if s["layers"] == 32 and "(" not in s["config"]:
            target = f">= {E2E_TARGET:,} tok/s {'ok' if s['tokens_per_s'] >= E2E_TARGET else 'MISSED'}"
        lines.append(f"{s['config']:<30}{s['tokens']:>10,}{s['tokens_per_s']:>10,.0f}{s['mfu']:>7.1%}"
                     f"{s['matmul_bound_tokens_per_s']:>13,.0f}{s['slowest_vs_fastest_segment']:>10.2f}"
                     f"{s['peak_memory_bytes'] / 2**30:>9.1f}{s['memory_last_vs_first']:>16.3f}  {target}")  # fmt: skip
    for s in result["streams"]:
        rates = ", ".join(f"{r['tokens_per_s'] / 1e3:.1f}K" for r in s["segments"])
        lines.append(f"  {s['config']} per segment: {rates}")
    p = result.get("profile")
    if p:
        lines += ["", f"one {p['tokens']}-token step of the whole model: {p['total_ms']:.1f} ms of GPU time"]
        lines += [f"  {kind:<22}{ms:>9.2f} ms {ms / p['total_ms']:>6.1%}" for kind, ms in p["by_kind_ms"].items()]
        lines += [f"    {k['ms']:>8.2f} ms {k['calls']:>5}x  {k['kernel']}" for k in p["top_kernels"][:10]]
    return "\n".join(lines)


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32, help="layers of the whole model (default 32)")
    parser.add_argument("--tokens", default="256K", help="tokens streamed through the whole model (default 256K)")
    parser.add_argument("--long-layers", type=int, default=4, help="layers of the long stream's model (default 4)")
    parser.add_argument("--long-tokens", default="2M", help="tokens of the long stream (default 2M; 0: skip)")
    parser.add_argument("--out", default="gpu_end_to_end.json", help="JSON output (default gpu_end_to_end.json)")
    args = parser.parse_args()
    require_cuda()
    peak = peak_matmul_tflops()
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d"), "peak_bf16_tflops": peak, "streams": []}  # fmt: skip
    with torch.inference_mode():
        model = random_model(args.layers)
        fast = lm_of(model, "auto")
        name = f"7B-shaped x{args.layers}"
        result["streams"].append(summary(name, fast, stream(fast, parse_tokens(args.tokens), 16384, peak), peak))
        result["profile"] = profile_step(fast)
        variants = {
            "glue in PyTorch": replace(TRITON, rms_norm=rms_norm.rms_norm, silu_mul=silu_mul.silu_mul),
            "PyTorch attention": replace(TRITON, chunked_attention=attention.chunked_attention),
        }
        for label, ops in variants.items():
            model.use_kernels(ops)
            rows = stream(fast, 32768, 16384, peak)
            result["streams"].append(summary(f"{name} ({label})", fast, rows, peak))
        model.use_kernels(TRITON)
        ref = lm_of(model, "torch")
        result["streams"].append(summary(name + " (torch ops)", ref, stream(ref, 32768, 16384, peak), peak))
        del model, fast, ref
        torch.cuda.empty_cache()
        long_tokens = parse_tokens(args.long_tokens)
        if long_tokens:
            long = lm_of(random_model(args.long_layers), "auto")
            rows = stream(long, long_tokens, 131072, peak)
            result["streams"].append(summary(f"7B-shaped x{args.long_layers}", long, rows, peak))
    write_result(result, args.out, table)


if __name__ == "__main__":
    main()
