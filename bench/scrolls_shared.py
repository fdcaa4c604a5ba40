"""Benchmark: `megaeval scrolls` with questions sharing their document's reading, against reading each prompt whole.

For each model, runs `megaeval scrolls --tasks qmsum --data-dir data_prep/samples/scrolls --limit 12` (the
bundled QMSum samples' first 12 questions: 5 on one meeting, 7 on the next; `--limit 0`: all 34 on 5 meetings,
minutes on CPU, as reading each prompt whole MEGALODON reads 734K prompt tokens) twice in fresh processes: shared
(the default) and `--no-share-documents`. Prints the prompt tokens read and the naive count (the report's
`prompt_tokens_read`, `prompt_tokens_naive`), the wall time, the peak memory the report measured, and whether the
samples files (predictions, scores) are identical.
For a state-carrying model it also prints what reading each document once should give: (the prefix + the unique
document tokens + each question's own tokens) / all prompt tokens.

    python bench/scrolls_shared.py [--models embedded:megalodon-tiny,embedded:transformer-tiny]
                                   [--max-new-tokens 16] [--limit 12] [--device cpu] [--data-dir DIR]
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

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data_prep" / "samples" / "scrolls"


def run(model: str, shared: bool, folder: Path, args: argparse.Namespace) -> tuple[float, dict, str]:
    """One scrolls run in a fresh process: its wall time, its qmsum results and its samples file."""
    name = f"{model.replace(':', '_')}_{'shared' if shared else 'whole'}"
    out, samples = folder / f"{name}.json", folder / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "megaeval", "scrolls", "--model", model, "--tasks", "qmsum", "--data-dir",
           str(args.data_dir), "--max-new-tokens", str(args.max_new_tokens), "--device", args.device, "--out",
           str(out), "--samples", str(samples), "--no-progress", *(["--limit", str(args.limit)] if args.limit else []),
           *([] if shared else ["--no-share-documents"])]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    seconds = time.perf_counter() - start
    return seconds, json.loads(out.read_text())["results"]["qmsum"], samples.read_text(encoding="utf-8")


def documents_once(model: str, limit: int | None, data: Path = DATA) -> float | None:
    """(prefix + unique document tokens + the questions' own tokens) / all prompt tokens, for a state-carrying model
    (None for a fixed-context one: its documents are cut, differently for each question)."""
    from megaeval import load_model
    from megaeval.commands.scrolls import ScrollsSettings
    from megaeval.scoring.requests import resolve_bos
    from megaeval.tasks.scrolls.evaluate import fit_prefix
    from megaeval.tasks.scrolls.prepare import prepare_scrolls_task

    lm = load_model(model)
    if lm.max_context is not None:
        return None
    task = prepare_scrolls_task(ScrollsSettings(tasks="qmsum", data_dir=str(data), limit=limit), "qmsum", {})
    prefix = len(fit_prefix(lm, task, resolve_bos(lm, "auto")).ids)
    encode = lm.tokenizer.encode
    prompts = [len(encode(f"{ex.document} Q: {ex.question} A:")) for ex in task.examples]
    documents = {ex.document: len(encode(ex.document)) for ex in task.examples}
    questions = sum(p - documents[ex.document] for p, ex in zip(prompts, task.examples, strict=True))
    return (prefix + sum(documents.values()) + questions) / (prefix + sum(prompts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="embedded:megalodon-tiny,embedded:transformer-tiny")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--limit", type=int, default=12, help="questions (0: all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data-dir", type=Path, default=DATA, help="a folder holding qmsum/{train,validation}.jsonl")
    args = parser.parse_args()
    print(f"QMSum bundled samples{f' (first {args.limit})' if args.limit else ''}, --max-new-tokens "
          f"{args.max_new_tokens}, device {args.device}, 2 threads")  # fmt: skip
    print(f"{'model':<26} {'reading':<9} {'seconds':>8} {'peak MiB':>9} {'read':>10} {'naive':>10} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            outcomes = {shared: run(model, shared, Path(tmp), args) for shared in (True, False)}
            for shared, (seconds, res, _) in outcomes.items():
                read, naive, peak = res["prompt_tokens_read"], res["prompt_tokens_naive"], res["peak_memory_bytes"]
                print(f"{model:<26} {'shared' if shared else 'whole':<9} {seconds:8.1f} {peak / 2**20:9.1f} "
                      f"{read:10,} {naive:10,} {read / naive:6.3f}")  # fmt: skip
            same = outcomes[True][2] == outcomes[False][2]
            once = documents_once(model, args.limit or None, args.data_dir)
            print(f"{'':<26} samples identical: {same}"
                  + (f"; each document once would read {once:.3f} of naive" if once is not None else ""))  # fmt: skip


if __name__ == "__main__":
    main()
