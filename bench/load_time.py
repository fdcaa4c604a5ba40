"""Model load time: megaeval's `load_model` against transformers' own `from_pretrained` of the same folder.

Each measurement is a fresh process (the page cache warm, as in any second run), its imports done and transformers'
lazy classes touched before the clock starts, then one of:
- `transformers`: `AutoModelForCausalLM.from_pretrained(folder, dtype)` and `AutoTokenizer.from_pretrained(folder)`,
  what RULER's and LongBench's own scripts do before their first prompt;
- `megaeval`: `load_model("hf:FOLDER", dtype=...)`: the same two calls plus megaeval's checks (every weight present,
  integer weights refused, the tokenizer's BOS rule, a causal-attention probe of two 8-token forwards);
- `megaeval+checksum`: that and the weights' sha256 the report records (`weights_sha256()`), as a run computes it;
  it is cached by path, size, mtime, ctime and inode in megaeval's cache folder, so only a changed file is hashed
  again: the first run after a change pays the hash once (`--cold-checksum` clears that entry first).
Then, in every process, the first forward of an 8-token prompt (page-in of the weights a lazy load leaves for it).

    python bench/load_time.py                      # SmolLM2-135M-Instruct as float32 (538 MB), 5 runs each
    python bench/load_time.py --folder DIR --dtype bfloat16 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))  # megaeval_testing: SmolLM2's float32 folder

CHILD = r"""
import json, sys, time
import torch, transformers
import megaeval
from megaeval import load_model
for name in ("AutoModelForCausalLM", "AutoTokenizer", "LlamaForCausalLM", "PreTrainedTokenizerFast"):
    getattr(transformers, name)
torch.set_num_threads(1)
folder, dtype, how, cold = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
if cold:
    from megaeval.files import cache_dir
    import shutil
    shutil.rmtree(cache_dir() / "sha256", ignore_errors=True)
start = time.perf_counter()
if how == "transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    transformers.AutoTokenizer.from_pretrained(folder)
else:
    lm = load_model("hf:" + folder, dtype=dtype)
    if how == "megaeval+checksum":
        lm.weights_sha256()
    model = lm.model
load = time.perf_counter() - start
start = time.perf_counter()
with torch.inference_mode():
    model(input_ids=torch.arange(8)[None] + 10)
print(json.dumps({"load": load, "first_forward": time.perf_counter() - start}))
"""


def measure(folder: Path, dtype: str, how: str, cold: bool) -> dict[str, float]:
    """One fresh process's load and first-forward seconds."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), dtype, how, "1" if cold else "0"], check=True,
                         capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                                                              "TRANSFORMERS_VERBOSITY": "error",
                                                              **_path_env()})  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _path_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "XDG_CACHE_HOME", "TMPDIR")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", help="a transformers model folder (default: SmolLM2-135M-Instruct as float32)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold-checksum", action="store_true", help="hash the weights afresh in every run")
    args = parser.parse_args()
    if args.folder:
        folder = Path(args.folder)
    else:
        from megaeval_testing.servers import smollm2_folder

        folder = smollm2_folder()
    size = sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".safetensors")
    hows = ("transformers", "megaeval", "megaeval+checksum")
    runs: dict[str, list[dict[str, float]]] = {how: [] for how in hows}
    for _ in range(args.repeats):  # interleaved, so that a change in the machine's load hits every column alike
        for how in hows:
            runs[how].append(measure(folder, args.dtype, how, args.cold_checksum))
    base = statistics.median(r["load"] for r in runs["transformers"])
    print(f"{folder} ({size / 1e6:,.0f} MB of weights, {args.dtype}), median of {args.repeats} fresh processes")
    print(f"{'load':<20}{'load s':>9}{'÷ transformers':>16}{'first forward s':>17}")
    for how in hows:
        load = statistics.median(r["load"] for r in runs[how])
        first = statistics.median(r["first_forward"] for r in runs[how])
        print(f"{how:<20}{load:>9.2f}{load / base:>16.2f}{first:>17.2f}")


if __name__ == "__main__":
    main()
