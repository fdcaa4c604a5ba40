"""Benchmark: the cost of one BABILong instance per length with a state-carrying model (1M and 10M by default).

For each length, in fresh processes: `megaeval babilong --prepare-only` (one qa1 instance from BABILong's generator,
background books from --background: the 55 public-domain classics of ../shared/data by default; wall time and peak
RSS), then `megaeval babilong` on it (wall time of the whole command; from the report, the tokens per second of
reading and answering, the process's peak memory meanwhile, and the model state's size after the prompt).

    python bench/babilong_cost.py [--model embedded:megalodon-tiny] [--lengths 1M,10M] [--background DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ruler_cost import timed  # bench/: the child's wall seconds and peak RSS

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:megalodon-tiny")
    parser.add_argument("--lengths", default="1M,10M")
    parser.add_argument("--background", default=str(REPO.parent / "shared" / "data" / "books" / "classics"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    header = ("length", "prepare s", "prepare RSS MiB", "prompt tokens", "run s", "tokens/s", "peak MiB", "state KiB")
    print(" | ".join(header))
    babi = REPO / "tests" / "fixtures" / "babilong" / "babi"
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths.split(","):
            common = ["--tasks", "qa1", "--lengths", length, "--num-samples", "1", "--no-progress"]
            prep_s, prep_rss = timed(["babilong", "--prepare-only", "--babi", str(babi), "--background",
                                      args.background, "--write-data", f"{tmp}/{length}", *common])  # fmt: skip
            out = Path(tmp) / f"{length}.json"
            run = ["babilong", "--model", args.model, "--device", args.device, "--dtype", args.dtype, "--data",
                   f"{tmp}/{length}", "--out", str(out), "--samples", f"{out}l", *common]  # fmt: skip
            run_s, _ = timed(run)
            row = json.loads(out.read_text())["results"]["lengths"][0]
            sample = json.loads(Path(f"{out}l").read_text())
            print(" | ".join([length, f"{prep_s:.1f}", f"{prep_rss / 2**20:.0f}", f"{sample['prompt_tokens']:,}",
                              f"{run_s:.1f}", f"{row['tokens_per_second']:,.0f}",
                              f"{row['peak_memory_bytes'] / 2**20:.0f}", f"{row['state_bytes'] / 2**10:.0f}"]),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
