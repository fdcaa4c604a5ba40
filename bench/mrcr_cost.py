"""Benchmark: the cost of one OpenAI MRCR record of about --tokens o200k_base tokens read whole by a model.

Writes one 8-needle record in openai/mrcr's schema and current layout (8needle/8needle_0.parquet), its chat made of
writing asks answered by consecutive passages of the public-domain classics in ../shared/data (the card's records
are GPT-4o's writing; only the length matters here), grown until its prompt + answer reach --tokens o200k_base
tokens (the card's bin count). Then runs `megaeval mrcr` on it in a fresh process (greedy, --max-new-tokens new
tokens; a state-carrying model reads the whole prompt) and reports the record's o200k_base tokens and bin, the
prompt's tokens in the model's tokenizer, the wall time of the whole command, the prompt tokens read per second, the
process's peak memory and the model state's size after the prompt (from the report's bin).

    python bench/mrcr_cost.py [--model embedded:megalodon-tiny] [--tokens 1000000] [--device cuda]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import string
import tempfile
from pathlib import Path

import pandas as pd
from ruler_cost import timed  # bench/: the child's wall seconds and peak RSS

from megaeval.tasks.mrcr.o200k import o200k

REPO = Path(__file__).resolve().parents[1]
CLASSICS = REPO.parent / "shared" / "data" / "books" / "classics"
FORMATS = ("poem", "blog post", "short story", "riddle", "social media post", "essay", "letter", "speech")
TOPICS = ("tapirs", "rocks", "lanterns", "harbors", "meadows", "rivers", "winter", "trains")


def passages(folder: Path, words: int = 300):
    """Consecutive passages of about `words` words from the books in `folder` (sorted by name), forever."""
    while True:
        for path in sorted(folder.glob("*.txt*")):
            text = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" else path.read_text()
            tokens = text.split()
            for start in range(0, len(tokens) - words, words):
                yield " ".join(tokens[start : start + words])


def make_record(tokens: int, folder: Path, needles: int = 8, seed: int = 0) -> dict:
    """One record in the card's schema whose prompt + answer reach about `tokens` o200k_base tokens."""
    rng, enc, texts = random.Random(seed), o200k(), passages(folder)
    ask = "write a poem about tapirs"
    messages, count, needle_answers = [], 0, []
    filler_asks = [f"write a {f} about {t}" for f in FORMATS for t in TOPICS if f"write a {f} about {t}" != ask]
    while count < tokens - 600 or len(needle_answers) < needles:
        is_needle = len(needle_answers) < needles and rng.random() < needles / max(8, tokens // 8000)
        user = ask if is_needle else rng.choice(filler_asks)
        body = next(texts)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": body}]
        count += enc.count(user) + enc.count(body)
        if is_needle:
            needle_answers.append((len(messages) - 1, body))
    k = rng.randint(1, needles)
    prefix = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(10))
    ordinal = {1: "1st", 2: "2nd", 3: "3rd"}.get(k, f"{k}th")
    messages.append({"role": "user", "content": f"Prepend {prefix} to the {ordinal} (1 indexed) poem about tapirs. "
                                                "Do not include any other text in your response."})  # fmt: skip
    prompt = json.dumps(messages)
    index, answer = needle_answers[k - 1]
    return {"prompt": prompt, "answer": prefix + answer, "random_string_to_prepend": prefix, "n_needles": needles,
            "desired_msg_index": index, "total_messages": len(messages), "n_chars": len(prompt)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:megalodon-tiny")
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--books", default=str(CLASSICS))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / "data", Path(tmp) / "r.json"
        (data / "8needle").mkdir(parents=True)
        pd.DataFrame([make_record(args.tokens, Path(args.books))]).to_parquet(data / "8needle" / "8needle_0.parquet")
        seconds, peak = timed(["mrcr", "--model", args.model, "--device", args.device, "--dtype", args.dtype, "--data",
                               str(data), "--max-new-tokens", str(args.max_new_tokens), "--out", str(out), "--samples",
                               f"{out}l", "--no-progress"])  # fmt: skip
        res = json.loads(out.read_text())["results"]
        sample = json.loads(Path(f"{out}l").read_text())
    ((name, cell),) = res["bins"].items()
    o200k_tokens = sample["o200k_prompt_tokens"] + sample["o200k_answer_tokens"]
    print(" | ".join(("o200k tokens", "bin", "prompt tokens", "run s", "tokens/s", "peak MiB", "state KiB", "grade")))
    print(" | ".join((f"{o200k_tokens:,}", name, f"{sample['prompt_tokens']:,}", f"{seconds:.1f}",
                      f"{cell['tokens_per_second']:,.0f}", f"{peak / 2**20:,.0f}",
                      f"{(cell['state_bytes'] or 0) / 1024:,.0f}", f"{sample['score']:.3f}")))  # fmt: skip


if __name__ == "__main__":
    main()
