"""Benchmark: `megaeval needle` with a state-carrying model from 4K up, one process per length.

For each length, runs `megaeval needle --task TASK --lengths L --depths D` in a fresh process and prints its wall
time, the peak memory the report measured while the model read and answered (process RSS on CPU, the allocator's
peak on CUDA), the state size, and the tokens read against a naive run's. Targets: peak memory of the longest
length <= 1.1x the shortest's (flat); tokens read <= 0.6x naive with 11 depths.

On CPU the process RSS also holds what glibc's heap keeps after large frees (its mmap threshold rises after the
first large free, so later large blocks come from a heap that fragments): a few percent more at longer lengths.
`--mmap-threshold 65536` sets MALLOC_MMAP_THRESHOLD_ in the runs, so every large block is returned when freed and
the peak shows the model's own memory (about 2x slower on CPU: a measurement setting, not a default).

    python bench/needle.py [--model embedded:megalodon-tiny] [--lengths 4K,16K,64K,256K] [--depths 0,50,100]
                           [--task passkey] [--device cpu] [--mmap-threshold BYTES]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:megalodon-tiny")
    parser.add_argument("--lengths", default="4K,16K,64K,256K")
    parser.add_argument("--depths", default="0,10,20,30,40,50,60,70,80,90,100")
    parser.add_argument("--task", default="passkey")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mmap-threshold", type=int, default=None, help="MALLOC_MMAP_THRESHOLD_ for the runs")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths.split(","):
            out = Path(tmp) / f"{length}.json"
            cmd = [sys.executable, "-m", "megaeval", "needle", "--model", args.model, "--task", args.task,
                   "--lengths", length, "--depths", args.depths, "--device", args.device, "--out", str(out),
                   "--no-progress"]  # fmt: skip
            start = time.perf_counter()
            env = {**os.environ, "OMP_NUM_THREADS": "2"}
            if args.mmap_threshold is not None:
                env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            seconds = time.perf_counter() - start
            row = json.loads(out.read_text())["results"][args.task]["lengths"][0]
            rows.append((length, seconds, row))
    threshold = f", MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}" if args.mmap_threshold is not None else ""
    print(f"model {args.model}, task {args.task}, depths {args.depths}, device {args.device}{threshold}")
    print(f"{'length':>7} {'seconds':>8} {'tok/s':>8} {'peak MiB':>9} {'state KiB':>9} {'read':>10} {'naive':>10}")
    for length, seconds, row in rows:
        print(f"{length:>7} {seconds:8.1f} {row['tokens_read'] / seconds:8.0f} {row['peak_memory_bytes'] / 2**20:9.1f} "
              f"{row['state_bytes'] / 1024:9.1f} {row['tokens_read']:10,} {row['tokens_naive']:10,}")  # fmt: skip
    peaks = [row["peak_memory_bytes"] for _, _, row in rows]
    last = rows[-1][2]
    print(f"peak memory, longest / shortest: {peaks[-1] / peaks[0]:.3f}x (target <= 1.1x)")
    print(f"tokens read / naive at {rows[-1][0]}: {last['tokens_read'] / last['tokens_naive']:.3f}")


if __name__ == "__main__":
    main()
