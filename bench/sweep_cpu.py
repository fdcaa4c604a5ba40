"""Benchmark: `ppl-sweep` speed and peak memory per context length on CPU, up to 256x chunk_size.

Prepares the six Austen novels as one stream with the embedded model's tokenizer, then sweeps the
embedded tiny MEGALODON (chunk 128) over 128 .. 32K tokens of context (256 x chunk) at a fixed
batch size. Reads each length's tokens/s and peak memory (process peak RSS, reset per length)
from the report. Targets: peak memory at the longest length <= 1.2x the shortest; tokens/s at the
longest >= 0.9x the shortest.

    python bench/sweep_cpu.py [--batch-sizes 1,8] [--tokens 256K]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LENGTHS = "128,256,512,1K,2K,4K,8K,16K,32K"


def megaeval(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "megaeval", *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--tokens", default="256K", help="targets per length")
    parser.add_argument("--lengths", default=LENGTHS)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "megaeval-bench-sweep")
    a = parser.parse_args()
    stream = a.work / "austen"
    if not (stream / "manifest.json").exists():
        megaeval("prep-books", str(REPO / "data_prep/corpora/austen"), "--out", str(stream), "--no-progress")
    summary = {}
    for batch in [int(b) for b in a.batch_sizes.split(",")]:
        out = a.work / f"sweep_b{batch}.json"
        megaeval("ppl-sweep", "--stream", str(stream), "--lengths", a.lengths, "--tokens", a.tokens,
                 "--batch-size", str(batch), "--out", str(out), "--no-progress")  # fmt: skip
        rows = json.loads(out.read_text())["results"]["lengths"]
        first, last = rows[0], rows[-1]
        summary[batch] = {
            "rows": [
                {k: r[k] for k in ("context_length", "tokens_per_second", "peak_memory_bytes", "ppl")} for r in rows
            ],
            "speed_longest_vs_shortest": round(last["tokens_per_second"] / first["tokens_per_second"], 3),
            "memory_longest_vs_shortest": round(last["peak_memory_bytes"] / first["peak_memory_bytes"], 3),
        }
        print(f"batch {batch}:")
        for r in rows:
            print(f"  {r['context_length']:>6}: {r['tokens_per_second']:>9,.0f} tok/s  "
                  f"peak {r['peak_memory_bytes'] / 2**20:7.1f} MiB  ppl {r['ppl']:.2f}")  # fmt: skip
        print(f"  longest/shortest: speed {summary[batch]['speed_longest_vs_shortest']}, "
              f"memory {summary[batch]['memory_longest_vs_shortest']}", flush=True)  # fmt: skip
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
