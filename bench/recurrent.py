"""Benchmark: megaeval's Mamba-1 against transformers' own forward, and the flat memory of a recurrent sweep.

speed: one call of `--tokens` tokens (default 4,096) through a Mamba checkpoint (`--model DIR`; default: a random
Mamba of the embedded zoo's size, 6 layers x 128, state 16, saved by transformers with the zoo's tokenizer), on CPU
with one thread in float32: megaeval's `forward` (chunked parallel scan, state carried) against transformers'
MambaForCausalLM forward (use_cache=False; its pure-PyTorch path on a machine without mamba_ssm). Checks that the
logits agree, then prints tokens/s of both and the ratio. Target: >= 5x.

memory: `megaeval ppl-sweep` of the same checkpoint over the six Austen novels from 4K to 256K tokens of
context, one sequence per length; peak memory (process RSS, reset per length) of the longest over the shortest.
Target: <= 1.2.

    python bench/recurrent.py speed [--tokens 4096] [--model DIR]
    python bench/recurrent.py memory [--lengths 4K,...,256K]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ZOO_TOKENIZER = REPO / "megaeval" / "assets" / "transformer-tiny"  # the zoo's tokenizer as transformers files
SIZE = dict(vocab_size=4096, hidden_size=128, state_size=16, num_hidden_layers=6, expand=2, conv_kernel=4)


def random_mamba(folder: Path) -> Path:
    """A random Mamba of the zoo's size saved by transformers, with the zoo's tokenizer (made once)."""
    import shutil

    import transformers

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        transformers.MambaForCausalLM(transformers.MambaConfig(**SIZE, bos_token_id=1, eos_token_id=2)).save_pretrained(
            folder
        )
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ZOO_TOKENIZER / name, folder / name)
    return folder


def timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    """Best wall time of `repeats` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def speed(a: argparse.Namespace) -> dict:
    import transformers

    from megaeval import load_model

    torch.set_num_threads(1)
    a.model = a.model or random_mamba(a.work / "mamba")
    lm = load_model(a.model, dtype="float32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    tokens = torch.randint(3, lm.tokenizer.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(0))
    ours_s, ours = timed(lambda: lm.forward(tokens, lm.init_state(1))[0], a.repeats)
    with torch.inference_mode():
        theirs_s, theirs = timed(lambda: ref(input_ids=tokens, use_cache=False).logits, a.repeats)
    diff = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    result = {
        "model": str(a.model), "tokens": a.tokens, "threads": 1, "dtype": "float32",
        "megaeval_tokens_per_second": round(a.tokens / ours_s, 1),
        "transformers_tokens_per_second": round(a.tokens / theirs_s, 1),
        "speedup": round(theirs_s / ours_s, 2), "max_abs_logit_diff_over_max_logit": diff,
    }  # fmt: skip
    if diff > 1e-4:
        raise SystemExit(f"logits disagree: {diff:.2e} relative to the largest logit")
    return result


def memory(a: argparse.Namespace) -> dict:
    work = a.work
    model = str(a.model or random_mamba(work / "mamba"))
    stream = work / "austen-mamba"
    run = [sys.executable, "-m", "megaeval"]
    if not (stream / "manifest.json").exists():
        subprocess.run([*run, "prep-books", str(REPO / "data_prep/corpora/austen"), "--model", model,
                        "--out", str(stream), "--no-progress"], check=True, stdout=sys.stderr)  # fmt: skip
    out = work / "sweep_mamba.json"
    subprocess.run([*run, "ppl-sweep", "--model", model, "--stream", str(stream), "--lengths",
                    a.lengths, "--tokens", a.lengths.split(",")[-1], "--batch-size", "1", "--out", str(out),
                    "--no-progress"], check=True, stdout=sys.stderr)  # fmt: skip
    rows = json.loads(out.read_text())["results"]["lengths"]
    keep = [{k: r[k] for k in ("context_length", "tokens_per_second", "peak_memory_bytes", "ppl")} for r in rows]
    ratio = rows[-1]["peak_memory_bytes"] / rows[0]["peak_memory_bytes"]
    return {"rows": keep, "memory_longest_vs_shortest": round(ratio, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "memory"])
    parser.add_argument("--model", type=Path, default=None, help="a Mamba checkpoint directory")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--lengths", default="4K,8K,16K,32K,64K,128K,256K")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "megaeval-bench-recurrent")
    a = parser.parse_args()
    print(json.dumps(speed(a) if a.what == "speed" else memory(a), indent=1))


if __name__ == "__main__":
    main()
