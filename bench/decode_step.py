"""Decoding steps measured: the seconds one greedy step takes for rows that hold a long prompt's KV cache.

megaeval's hf family (`lm.forward` on its states, stacked rows padded on the left and masked, the KV cache in
buffers with room to spare: `megaeval.models.hf.kv_cache`) against transformers' own model called with its
DynamicCache, as the benchmarks' pipelines' `generate` runs it (the cache concatenated at every step), on the same
rows. Also the weights alone: a step of one row over a one-token cache (the floor every step pays). Each cell is the
mean of --steps steps after one warm-up step, on --threads threads, nothing else running.

    python bench/decode_step.py --length 3900 --rows 1,2,8
    python bench/decode_step.py --folder DIR --length 16000 --rows 1,4 --dtype bfloat16

Prints one JSON line per cell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipelines import model_folder  # noqa: E402
from prefill_rules import book_tokens  # noqa: E402


def timed_steps(step, steps: int) -> float:
    """Mean seconds of `step()` over `steps` calls, after one warm-up call."""
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--folder", type=Path, help="transformers model folder (default: SmolLM2-135M-Instruct, float32)")
    p.add_argument("--length", type=int, default=3900, help="tokens each row's cache holds (rows after the first: 5 %% "
                   "shorter each, so that they pad)")  # fmt: skip
    p.add_argument("--rows", default="1,2,8")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from megaeval import load_model

    lm = load_model(f"hf:{model_folder(args.folder)}", dtype=args.dtype)
    ids = torch.tensor([book_tokens(lm, args.length)])
    cell = {"length": args.length, "dtype": args.dtype, "threads": args.threads}
    with torch.inference_mode():
        weights = timed_steps(lambda: lm.model(input_ids=ids[:, :1]), args.steps)
    print(json.dumps({**cell, "side": "weights alone (one token, no cache)", "rows": 1, "step_s": round(weights, 4)}))
    for rows in (int(r) for r in args.rows.split(",")):
        for side, seconds in measure(lm, ids, args.length, rows, args.steps):
            print(json.dumps({**cell, "side": side, "rows": rows, "step_s": round(seconds, 4),
                              "per_row_s": round(seconds / rows, 4)}))  # fmt: skip


def measure(lm, ids: torch.Tensor, length: int, rows: int, steps: int) -> list[tuple[str, float]]:
    """Seconds a step of `rows` rows takes, megaeval's and transformers' DynamicCache's, the rows' caches holding
    `length` tokens and 5 % fewer each after the first."""
    from megaeval.models.base import stack_states
    from megaeval.models.hf.adapter import _padded_rows

    states = [lm.forward_last(ids[:, : round(length * 0.95**r)], lm.init_state(1), 1)[1] for r in range(rows)]
    token = torch.full((rows, 1), int(ids[0, -1]))
    batch = [stack_states(states)]

    def ours() -> None:
        batch[0] = lm.forward(token, batch[0])[1]

    # transformers' own: the same stacked rows in its DynamicCache (grown by torch.cat), padding masked
    stacked = stack_states(states)
    cache = sys.modules["transformers"].DynamicCache()
    for i, layer in enumerate(stacked.cache.layers):
        cache.update(layer.keys.contiguous(), layer.values.contiguous(), i)

    def theirs() -> None:
        kwargs = _padded_rows(stacked, 1, lm.device) if stacked.pads else {}
        with torch.inference_mode():
            lm.model(input_ids=token, use_cache=True, **{lm._cache_kw: cache}, **kwargs)
        stacked.length += 1

    return [("megaeval", timed_steps(ours, steps)), ("transformers DynamicCache", timed_steps(theirs, steps))]


if __name__ == "__main__":
    main()
