"""Benchmark: tokens/s and peak memory of MEGALODON `score` on CPU at 1x, 16x and 256x the chunk size.

Every context length scores the same number of tokens (256 chunks), in segments of that length with
a fresh state per segment, so only the context length changes. Each length runs in its own process
so that its peak resident memory (ru_maxrss) is its own.

    python bench/score_cpu.py                  # small config: 4 x 128, chunk 2048
    python bench/score_cpu.py --multiples 1,16,256 --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

import torch

from megaeval.models.megalodon import Megalodon, MegalodonLM, ModelArgs

SMALL = ModelArgs(
    num_layers=4, model_dim=128, z_dim=64, value_dim=256, num_heads=2, ffn_hidden_dim=256, cema_ndim=8,
    chunk_size=2048, norm_num_groups=16, swiglu=True, vocab_size=4096,
)  # fmt: skip


class _Tok:
    vocab_size, bos_id, eos_id = SMALL.vocab_size, 1, 2

    def describe(self) -> dict:
        return {}


def rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(multiple: int, total_chunks: int, batch: int, threads: int) -> dict:
    """Score total_chunks chunks in segments of `multiple` chunks; return speed and memory."""
    torch.set_num_threads(threads)
    lm = MegalodonLM(Megalodon(SMALL).init_weights(0), _Tok(), None)
    chunk = SMALL.chunk_size
    seg = multiple * chunk
    gen = torch.Generator().manual_seed(0)
    warm = torch.randint(0, SMALL.vocab_size, (batch, chunk + 1), generator=gen)
    lm.score(warm[:, :-1], warm[:, 1:], lm.init_state(batch))
    base = rss_bytes()
    tokens = torch.randint(0, SMALL.vocab_size, (batch, seg + 1), generator=gen)
    start, nll_sum = time.perf_counter(), 0.0
    for _ in range(total_chunks // multiple):
        nll, _ = lm.score(tokens[:, :-1], tokens[:, 1:], lm.init_state(batch))
        nll_sum += float(nll.sum())
    seconds = time.perf_counter() - start
    scored = batch * total_chunks * chunk
    return {
        "context_tokens": seg,
        "chunks": multiple,
        "tokens_scored": scored,
        "seconds": round(seconds, 2),
        "tokens_per_second": round(scored / seconds),
        "peak_rss_bytes": rss_bytes(),
        "peak_rss_above_warm_bytes": rss_bytes() - base,
        "mean_nll": nll_sum / scored,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multiples", default="1,16,256", help="context lengths in chunks")
    parser.add_argument("--total-chunks", type=int, default=256, help="chunks scored at every length")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child is not None:
        print(json.dumps(measure(a.child, a.total_chunks, a.batch_size, a.threads)))
        return
    rows = []
    for m in [int(x) for x in a.multiples.split(",")]:
        argv = [sys.executable, __file__, "--child", str(m), "--total-chunks", str(a.total_chunks),
                "--batch-size", str(a.batch_size), "--threads", str(a.threads)]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{r['chunks']:>4}x chunk ({r['context_tokens']:>7} tokens): {r['tokens_per_second']:>7} tok/s, "
            f"peak RSS {r['peak_rss_bytes'] / 2**20:7.1f} MiB (+{r['peak_rss_above_warm_bytes'] / 2**20:.1f} MiB "
            f"after warm-up), {r['seconds']} s",
            flush=True,
        )
    first, last = rows[0], rows[-1]
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "threads": a.threads,
                "torch": torch.__version__,
                "config": SMALL.to_dict(),
                "rows": rows,
                "speed_ratio_longest_vs_shortest": round(last["tokens_per_second"] / first["tokens_per_second"], 3),
                "memory_ratio_longest_vs_shortest": round(last["peak_rss_bytes"] / first["peak_rss_bytes"], 3),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
