"""Prefill rules measured: how fast a transformers model reads a prompt, by length, dtype and rule.

The rules (`megaeval.models.hf.prefill`): `one-call`, the whole prompt in one causal call (the attention
implementation's causal fast path: sdpa with is_causal, no mask tensor), logits only for the last position; and
`steps-N`, the prompt in calls of N tokens, each attending to the cache so far through an explicit mask (what
megaeval did for every prompt before issue #55). Each cell is one fresh state reading the same text (a public-domain
book), the median of --repeats, on --threads threads, nothing else running. Also the seconds the stepped rules
spend growing the cache by concatenation (a cat of the same tensors, timed alone).

    python bench/prefill_rules.py --lengths 4096,8192,16384,32768 --dtypes float32,bfloat16 --threads 1
    python bench/prefill_rules.py --folder DIR --lengths 2048 --rules one-call,steps-512 --repeats 1
    python bench/prefill_rules.py --lengths 4096 --dtypes float32 --cached 512   # a read onto a cache (masked)

Prints one JSON line per cell and a table at the end: the rule megaeval's `auto` picks should be the fastest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))
BOOK = REPO / "data_prep" / "corpora" / "austen"


def book_tokens(lm, n: int) -> list[int]:
    """`n` token ids of the public-domain books shipped in data_prep (repeated when too short)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(BOOK.glob("*.txt")))
    ids = lm.tokenizer.encode(text[: n * 8])
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def cat_seconds(lm, length: int, step: int) -> float:
    """Seconds a DynamicCache spends growing a cache of `length` tokens by `step`-token concatenations."""
    cfg = lm.model.config
    kv = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    piece = torch.zeros(1, kv, step, dim, dtype=lm.dtype)
    start = time.perf_counter()
    for _ in range(cfg.num_hidden_layers):
        for _ in range(2):  # keys and values
            t = piece
            for _ in range(length // step - 1):
                t = torch.cat([t, piece], dim=-2)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", help="a transformers model folder (default: SmolLM2-135M-Instruct as float32)")
    p.add_argument("--lengths", default="4096,8192,16384,32768")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rules", default="one-call,steps-512,steps-2048")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--cached", type=int, default=0, help="read LENGTH - CACHED tokens onto a cache of CACHED tokens")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from megaeval import load_model
    from megaeval.models.hf import prefill

    if args.folder:
        folder = Path(args.folder)
    else:
        from megaeval_testing.servers import smollm2_folder

        folder = smollm2_folder()
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for dtype in args.dtypes.split(","):
        lm = load_model(f"hf:{folder}", dtype=dtype, max_context=max(lengths))
        lm.forward_last(torch.tensor([book_tokens(lm, 256)]), lm.init_state(1), 1)  # warm-up
        for length in lengths:
            ids = torch.tensor([book_tokens(lm, length)])
            for rule in args.rules.split(","):
                seconds = []
                for _ in range(args.repeats):
                    state = lm.init_state(1)
                    if args.cached:  # a read that continues a cache (a prompt after a shared start)
                        _, state = lm.forward_last(ids[:, : args.cached], state, 1)
                    start = time.perf_counter()
                    with prefill.forced(rule):
                        lm.forward_last(ids[:, args.cached :], state, 1)
                    seconds.append(time.perf_counter() - start)
                    del state
                step = int(rule.split("-")[1]) if rule.startswith("steps-") else None
                row = {"dtype": dtype, "length": length, "cached": args.cached, "rule": rule,
                       "seconds": statistics.median(seconds), "threads": args.threads,
                       "tokens_per_second": (length - args.cached) / statistics.median(seconds),
                       "cat_seconds": cat_seconds(lm, length, step) if step else 0.0}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
        del lm
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"\n{folder}, {args.threads} thread(s), torch {torch.__version__} ({cpu})")
    print(f"{'dtype':<10}{'length':>8}  {'rule':<12}{'seconds':>9}{'tok/s':>9}{'cat s':>8}{'÷ fastest':>11}")
    for dtype in args.dtypes.split(","):
        for length in lengths:
            cells = [r for r in rows if r["dtype"] == dtype and r["length"] == length]
            best = min(r["seconds"] for r in cells)
            for r in cells:
                print(f"{dtype:<10}{length:>8}  {r['rule']:<12}{r['seconds']:>9.1f}{r['tokens_per_second']:>9.0f}"
                      f"{r['cat_seconds']:>8.2f}{r['seconds'] / best:>11.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
