"""Benchmark: the cost of LongBench v2's longest context (about 2M words) read whole by a state-carrying model.

Writes one v2 item (official schema) whose context is the first --words words of the public-domain classics in
../shared/data (the longest v2 contexts are about 2M words), then runs `megaeval longbench --version 2` on it in a
fresh process (greedy, 128 new tokens, no truncation: the model reads the whole prompt) and reports the prompt's
tokens, the wall time of the whole command, the tokens per second of reading and answering, the process's peak
memory meanwhile and the model state's size after the prompt (from the report).

    python bench/longbench_cost.py [--model embedded:megalodon-tiny] [--words 2000000] [--device cuda]
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from pathlib import Path

from ruler_cost import timed  # bench/: the child's wall seconds and peak RSS

REPO = Path(__file__).resolve().parents[1]
CLASSICS = REPO.parent / "shared" / "data" / "books" / "classics"


def context_words(folder: Path, words: int) -> str:
    """The first `words` words of the books in `folder` (sorted by name), their lines kept."""
    lines, count = [], 0
    for path in sorted(folder.glob("*.txt*")):
        text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text()
        for line in text.splitlines():
            lines.append(line)
            count += len(line.split())
            if count >= words:
                return "\n".join(lines)
    raise SystemExit(f"{folder} holds only {count:,} words; ask for fewer --words")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:megalodon-tiny")
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--books", default=str(CLASSICS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    item = {"_id": "bench", "domain": "Single-Document QA", "sub_domain": "Literary", "difficulty": "hard",
            "length": "long", "question": "Which of these books is quoted first in the text?",
            "choice_A": "The first book", "choice_B": "The second book", "choice_C": "The third book",
            "choice_D": "None of them", "answer": "A",
            "context": context_words(Path(args.books), args.words)}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / "data.json", Path(tmp) / "r.json"
        data.write_text(json.dumps([item]))
        seconds, _ = timed(["longbench", "--version", "2", "--model", args.model, "--device", args.device, "--dtype",
                            args.dtype, "--data", str(data), "--temperature", "0", "--out", str(out), "--samples",
                            f"{out}l", "--no-progress"])  # fmt: skip
        res = json.loads(out.read_text())["results"]
        sample = json.loads(Path(f"{out}l").read_text())
    print(" | ".join(("words", "prompt tokens", "run s", "tokens/s", "peak MiB", "state KiB", "truncated")))
    print(" | ".join([f"{args.words:,}", f"{sample['prompt_tokens']:,}", f"{seconds:.1f}",
                      f"{res['tokens_per_second']:,.0f}", f"{res['peak_memory_bytes'] / 2**20:.0f}",
                      f"{res['state_bytes'] / 2**10:.0f}", str(res["truncated"])]))  # fmt: skip


if __name__ == "__main__":
    main()
