"""Benchmark: the cost of one RULER instance per length with a state-carrying model (128K and 1M by default).

For each (task, length), in fresh processes: `megaeval ruler --prepare-only` (the instance alone: RULER's haystack
fitting with the model's tokenizer; wall time and the process's peak RSS), then `megaeval ruler` on that instance
(wall time of the whole command; from the report, the tokens per second of reading and answering, the peak memory
while doing so, and the model state's size after the prompt).

    python bench/ruler_cost.py [--model embedded:megalodon-tiny] [--tasks niah_single_1,niah_single_2]
                               [--lengths 128K,1M] [--device cpu] [--dtype float32]
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


def timed(argv: list[str]) -> tuple[float, int]:
    """Run `python -m megaeval ARGV`; its wall seconds and peak RSS in bytes (the child's, alone)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen([sys.executable, "-m", "megaeval", *argv], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"megaeval {' '.join(argv)} failed:\n{err.read().decode()}")
    return seconds, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:megalodon-tiny")
    parser.add_argument("--tasks", default="niah_single_1,niah_single_2")
    parser.add_argument("--lengths", default="128K,1M")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    header = ("task", "length", "prepare s", "prepare RSS MiB", "run s", "tokens/s", "peak MiB", "state KiB")
    print(" | ".join(header))
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            for length in args.lengths.split(","):
                common = ["--tasks", task, "--lengths", length, "--num-samples", "1", "--no-progress"]
                prep_s, prep_rss = timed(["ruler", "--prepare-only", "--tokenizer", args.model, "--write-data",
                                          f"{tmp}/data", *common])  # fmt: skip
                out = Path(tmp) / "r.json"
                run_s, _ = timed(["ruler", "--model", args.model, "--device", args.device, "--dtype", args.dtype,
                                  "--out", str(out), *common])  # fmt: skip
                row = json.loads(out.read_text())["results"]["lengths"][0]
                print(" | ".join([task, length, f"{prep_s:.1f}", f"{prep_rss / 2**20:.0f}", f"{run_s:.1f}",
                                  f"{row['tokens_per_second']:,.0f}", f"{row['peak_memory_bytes'] / 2**20:.0f}",
                                  f"{row['state_bytes'] / 2**10:.0f}"]), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
