"""Benchmark (CUDA GPU, written for an H100/H200): MEGALODON's fast ops against their PyTorch references.

    python bench/kernels.py [--out kernels_bench.json]        # one table + JSON

At 7B shapes in bfloat16 (model_dim 4096, 64 norm groups, cema_ndim 16, z 1024 / value 8192 over 4 heads,
chunk 2048, vocabulary 32000), each op of `megaeval.kernels.TRITON` against its reference in
`megaeval.kernels.TORCH`, on the same inputs: median time (triton.testing.do_bench), the largest difference
relative to the reference's largest value, and for the projection + NLL the peak memory of one call.

- TimestepNorm and CEMA (Triton), over 2,048 and 4,096 tokens; RMSNorm and a * silu(b) (Triton) over 4,096.
- Chunk attention (PyTorch's fused SDPA with value heads cut into q/k-wide slices, Triton rotary) over two
  2,048-token chunks, beside plain SDPA on the sliced shapes with each fused backend forced (flash, cuDNN,
  memory-efficient): the one it picks by default should be the fastest.
- Projection + NLL (cuBLAS in pieces + the Triton log-sum-exp) against F.linear + F.cross_entropy, at 4K and
  16K tokens, in time and memory.

Targets printed beside the numbers: TimestepNorm, CEMA and chunk attention >= 2x their references, chunk
attention >= the flash backend on the sliced shapes, the NLL >= 1x its reference in time and below it in memory.
Without CUDA it stops with a message.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from megaeval.kernels import attention, cema, nll, rms_norm, silu_mul, timestep_norm
from megaeval.kernels.common import available
from megaeval.models.megalodon import ModelArgs
from megaeval.models.megalodon.model import MultiHeadComplexEMA
from megaeval.runs.utilisation import measure_matmul_tflops

SEVEN_B = dict(
    model_dim=4096, z_dim=1024, value_dim=8192, num_heads=4, ffn_hidden_dim=11264, cema_ndim=16, chunk_size=2048,
    norm_num_groups=64, swiglu=True, vocab_size=32000,
)  # fmt: skip
DEVICE = "cuda"
KERNEL_TARGET = 2.0  # TimestepNorm, CEMA and chunk attention at least this many times faster than the reference
NLL_TARGET = 1.0  # projection + NLL at least as fast as cuBLAS + cross-entropy


def require_cuda() -> None:
    """Stop with a clear message when there is no CUDA GPU or no Triton."""
    if not torch.cuda.is_available():
        raise SystemExit(
            "this benchmark needs a CUDA GPU (it is written for an H100/H200) and torch sees none; "
            "on a CPU, test the kernels with `pytest tests/kernels` (Triton's interpreter)"
        )
    if not available():
        raise SystemExit("this benchmark needs Triton: pip install triton")


def milliseconds(fn: Callable[[], Any]) -> float:
    """Median time of fn in ms (Triton's do_bench: warm-up, L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=150, return_mode="median"))


def peak_matmul_tflops() -> float:
    """Peak bfloat16 matmul throughput, as `ppl-sweep --peak-tflops measure` takes it (megaeval.runs.utilisation)."""
    return measure_matmul_tflops(torch.device(DEVICE), torch.bfloat16)


def write_result(result: dict[str, Any], out: str, table: Callable[[dict[str, Any]], str]) -> None:
    """The result as JSON in `out`, and as a table on stdout."""
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    print(f"\nJSON: {out}", file=sys.stderr)


def relative_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| over the first tensor of each result (complex states as pairs)."""
    got, ref = (r[0] if isinstance(r, tuple) else r for r in (got, ref))
    got, ref = (torch.view_as_real(t) if t.is_complex() else t for t in (got, ref))
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Device memory one call of fn adds at its peak over what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - base


def randn(*shape: int, g: torch.Generator, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Random normal numbers on the GPU (never zeros: they hide unwritten outputs and run faster)."""
    return torch.randn(*shape, device=DEVICE, dtype=dtype, generator=g)


# ------------------------------------------------------------------------------------ cases


def row(op: str, ref_fn: Callable[[], Any], fast_fn: Callable[[], Any], target: float | None, **extra: Any) -> dict:
    """Time both, compare their results; one table row."""
    err = relative_error(fast_fn(), ref_fn())
    ref_ms, fast_ms = milliseconds(ref_fn), milliseconds(fast_fn)
    speedup = ref_ms / fast_ms
    met = None if target is None else speedup >= target
    out = {"op": op, "reference_ms": ref_ms, "fast_ms": fast_ms, "speedup": speedup, "target": target, "met": met,
           "rel_err": err, **extra}  # fmt: skip
    torch.cuda.empty_cache()
    return out


def norm_and_cema(a: ModelArgs, T: int, g: torch.Generator) -> list[dict[str, Any]]:
    """TimestepNorm and CEMA at model_dim x T, carrying a state in."""
    B, D, G, N = 1, a.model_dim, a.norm_num_groups, a.cema_ndim
    x = randn(B, T, D, g=g)
    weight, bias = randn(D, g=g) * 0.1, randn(D, g=g) * 0.1
    mean, var = randn(B, G, g=g, dtype=torch.float64) * 0.1, randn(B, G, g=g, dtype=torch.float64).abs() + 0.5
    norm_args = (x, weight, bias, 1000, mean, var, 1e-5)
    module = MultiHeadComplexEMA(D, N).to(DEVICE)
    with torch.no_grad():  # about the official initialisation; speed does not depend on the values
        for param, std in zip(module.parameters(), (0.2, 0.2, 1.0, 1.0, 0.25), strict=True):
            param.normal_(0.0, std, generator=g)
    p, log_q, gamma = module.coefficients()
    h = torch.complex(randn(B, D, N, g=g, dtype=torch.float32), randn(B, D, N, g=g, dtype=torch.float32))
    cema_args = (x, h, p, log_q, gamma, module.omega.to(torch.bfloat16))
    return [
        row(f"timestep_norm T={T}", lambda: timestep_norm.timestep_norm(*norm_args),
            lambda: timestep_norm.timestep_norm_triton(*norm_args), KERNEL_TARGET),
        row(f"cema T={T} ({-(-T // cema.block_len(T))} blocks)", lambda: cema.cema(*cema_args),
            lambda: cema.cema_triton(*cema_args), KERNEL_TARGET),
    ]  # fmt: skip


def glue(a: ModelArgs, T: int, g: torch.Generator) -> list[dict[str, Any]]:
    """The elementwise glue: RMSNorm of T x model_dim, a * silu(b) of T x ffn_hidden_dim (SwiGLU's product)."""
    x, w = randn(T, a.model_dim, g=g), randn(a.model_dim, g=g) * 0.1
    u, v = randn(T, a.ffn_hidden_dim, g=g), randn(T, a.ffn_hidden_dim, g=g)
    return [
        row(f"rms_norm T={T}", lambda: rms_norm.rms_norm(x, w, 1e-5), lambda: rms_norm.rms_norm_triton(x, w, 1e-5),
            None),
        row(f"silu_mul T={T} x {a.ffn_hidden_dim}", lambda: silu_mul.silu_mul(u, v),
            lambda: silu_mul.silu_mul_triton(u, v), None),
    ]  # fmt: skip


def chunk_attention(a: ModelArgs, T: int, g: torch.Generator) -> list[dict[str, Any]]:
    """Chunk attention over T tokens from a chunk boundary: reference, fused SDPA, the Triton kernel, and plain
    SDPA on the sliced shapes with each fused backend forced."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, dz, dv, chunk = a.num_heads, a.z_head_dim, a.v_head_dim, a.chunk_size
    q, k, v = randn(1, T, H, dz, g=g), randn(1, T, H, dz, g=g), randn(1, T, H, dv, g=g)
    args = (q, k, v, q[:, :0], v[:, :0], chunk, 10000.0)
    causal_flops = 2 * H * (T // chunk) * chunk * (chunk + 1) / 2 * (dz + dv)
    rows = [
        row(f"chunk attention T={T} (fused SDPA)", lambda: attention.chunked_attention(*args),
            lambda: attention.chunked_attention_fused(*args), KERNEL_TARGET),
    ]  # fmt: skip
    for r in rows:
        r["tflops"] = causal_flops / r["fast_ms"] / 1e9
    split = dv // dz
    n = T // chunk
    qs, ks = (t.reshape(n, chunk, H, dz).transpose(1, 2).repeat_interleave(split, 1) for t in (q, k))
    vs = v.reshape(n, chunk, H * split, dz).transpose(1, 2)
    fused_ms = rows[0]["fast_ms"]
    sliced_flops = 2 * H * split * n * chunk * (chunk + 1) / 2 * (dz + dz)  # what the fused kernels compute
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip

        def plain(backend: Any = backend) -> torch.Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=1.0)

        try:
            ms = milliseconds(plain)
        except RuntimeError as e:  # a backend that does not take these shapes
            rows.append({"op": f"  plain SDPA {name}, sliced shapes", "error": str(e).splitlines()[0][:80]})
            continue
        rows.append({"op": f"  plain SDPA {name}, sliced shapes", "reference_ms": ms, "fast_ms": fused_ms,
                     "speedup": ms / fused_ms, "target": 1.0 if name == "flash" else None,
                     "met": ms / fused_ms >= 0.95 if name == "flash" else None,
                     "tflops": sliced_flops / ms / 1e9})  # fmt: skip
    return rows


def linear_nll(a: ModelArgs, T: int, g: torch.Generator) -> dict[str, Any]:
    """Projection + NLL of T tokens: F.linear + F.cross_entropy (the reference) against cuBLAS in pieces + the
    Triton log-sum-exp; time and peak memory."""
    D, V = a.model_dim, a.vocab_size
    hidden, weight = randn(T, D, g=g), randn(V, D, g=g) * D**-0.5
    targets = torch.randint(0, V, (T,), device=DEVICE, generator=g)
    ref = lambda: nll.linear_nll(hidden, weight, targets)  # noqa: E731
    fast = lambda: nll.linear_nll_triton(hidden, weight, targets)  # noqa: E731
    out = row(f"linear + NLL T={T}", ref, fast, NLL_TARGET)
    out["reference_peak_bytes"], out["fast_peak_bytes"] = peak_bytes(ref), peak_bytes(fast)
    out["met"] = out["met"] and out["fast_peak_bytes"] < out["reference_peak_bytes"]
    return out


# ------------------------------------------------------------------------------------- output


def table(result: dict[str, Any]) -> str:
    """The results as aligned text."""
    header = f"{'op (7B shapes, bf16)':<44}{'ref ms':>9}{'fast ms':>9}{'speedup':>9}{'rel err':>9}  target / notes"
    lines = [f"{result['device']} | torch {result['torch']} | triton {result['triton']} | "
             f"peak bf16 matmul {result['peak_bf16_tflops']:.0f} TFLOP/s", "", header]  # fmt: skip
    for r in result["kernels"]:
        if "error" in r:
            lines.append(f"{r['op']:<44}  not run: {r['error']}")
            continue
        target = "" if r["target"] is None else f">= {r['target']:.0f}x {'ok' if r['met'] else 'MISSED'}"
        notes = [target] if target else []
        if "tflops" in r:
            notes.append(f"{r['tflops']:.0f} TFLOP/s")
        if "fast_peak_bytes" in r:
            notes.append(f"memory {r['fast_peak_bytes'] / 2**20:,.0f} vs {r['reference_peak_bytes'] / 2**20:,.0f} MiB")
        err = f"{r['rel_err']:.1e}" if "rel_err" in r else "-"
        lines.append(f"{r['op']:<44}{r['reference_ms']:>9.3f}{r['fast_ms']:>9.3f}{r['speedup']:>8.2f}x{err:>9}  "
                     + ", ".join(notes))  # fmt: skip
    return "\n".join(lines)


def run() -> dict[str, Any]:
    """Every measurement; the result as a dict."""
    require_cuda()
    a = ModelArgs(num_layers=1, **SEVEN_B)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"), "peak_bf16_tflops": peak_matmul_tflops(), "shapes": SEVEN_B,
    }  # fmt: skip
    with torch.inference_mode():
        rows = norm_and_cema(a, 2048, g) + norm_and_cema(a, 4096, g) + glue(a, 4096, g) + chunk_attention(a, 4096, g)
        rows += [linear_nll(a, 4096, g), linear_nll(a, 16384, g)]
    result["kernels"] = rows
    return result


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="kernels_bench.json", help="JSON output (default kernels_bench.json)")
    args = parser.parse_args()
    write_result(run(), args.out, table)


if __name__ == "__main__":
    main()
