"""Speed against LongBench's own `pred.py` (v1): `megaeval longbench --version 1` and the official `get_pred` on the
same records and the same model, one thread each, one after the other; the predictions compared record by record.

LongBench's side runs THUDM/LongBench's `LongBench/pred.py` at the pinned commit (from the local mirror, or --longbench
DIR), its own `get_pred` loop for every task: its prompt format and max_gen (config/dataset2prompt.json,
dataset2maxlen.json), its middle truncation at `--max-length` tokens, its `model.generate` calls (greedy, batch 1,
samsum with "\\n" as a second EOS) and its decoding of the output. What differs from a GPU run of it, each a stand-in
written here: the device is the CPU (its `torch.device(f'cuda:{rank}')` becomes `torch.device('cpu')`), the model
loads through the generic branch of its `load_model_and_tokenizer` (`AutoTokenizer.from_pretrained` and
`AutoModelForCausalLM.from_pretrained(..., torch_dtype=D)`: its named branches are for its seven 7B chat models), a
one-process gloo group is opened so its closing `destroy_process_group` runs, and its flash-attention monkey patch
(imported at the top, never called here) is an empty module. A model name that none of its chat templates knows
means no template, as megaeval's default (base-model prompts).

megaeval's side: `megaeval longbench --version 1 --model hf:FOLDER --dtype D --data DATA --max-prompt-tokens L`.

    python bench/longbench_vs_pipeline.py --tasks all --dtype float32
    python bench/longbench_vs_pipeline.py --data /data/longbench --tasks hotpotqa,qasper --num-samples 5

Default data: tests/fixtures/longbench/v1/data (2 records a task, real LongBench schema, short contexts). With
--long-contexts N, each record's context becomes N words of the shipped Austen novels (record k from the k-th novel;
its question, answers and the rest kept), so that prompts reach --max-length as LongBench's do: the speed of long
records, not their scores.

    python bench/longbench_vs_pipeline.py --tasks narrativeqa,gov_report --long-contexts 9000
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pipelines import REPO, model_folder, one_thread_env, print_comparison, work_folder

LONGBENCH_COMMIT = "2e00731f8d0bff23dc4325161044d0ed8af94c1e"  # as tests/fixtures/longbench
LONGBENCH_GIT = os.environ.get("LONGBENCH_GIT", "/work/.mirror/THUDM+LongBench/repo")
V1_TASKS = ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh", "hotpotqa", "2wikimqa", "musique",
            "dureader", "gov_report", "qmsum", "multi_news", "vcsum", "trec", "triviaqa", "samsum", "lsht",
            "passage_count", "passage_retrieval_en", "passage_retrieval_zh", "lcc", "repobench-p")  # fmt: skip

# The official loop, in a process of its own: argv = [work, folder, dtype, max_length, tasks, num_samples, data].
OFFICIAL = r"""
import json, os, sys, types
work, folder, dtype, max_length, tasks, limit, data = sys.argv[1:8]
sys.path.insert(0, os.path.join(work, "LongBench"))
sys.modules["llama_flash_attn_monkey_patch"] = types.SimpleNamespace(replace_llama_attn_with_flash_attn=None)
import torch, torch.distributed as dist
torch.set_num_threads(1)
source = open(os.path.join(work, "LongBench", "pred.py"), encoding="utf-8").read()
source = source.replace("torch.device(f'cuda:{rank}')", "torch.device('cpu')")
pred = types.ModuleType("pred")
exec(compile(source, "pred.py", "exec"), pred.__dict__)
from transformers import AutoModelForCausalLM, AutoTokenizer
def generic_loader(path, model_name, device):
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, torch_dtype=getattr(torch, dtype))
    return model.to(device).eval(), tokenizer
pred.load_model_and_tokenizer = generic_loader
os.chdir(os.path.join(work, "LongBench"))
prompts = json.load(open("config/dataset2prompt.json"))
maxlen = json.load(open("config/dataset2maxlen.json"))
for task in tasks.split(","):
    rows = [json.loads(l) for l in open(os.path.join(data, task + ".jsonl"), encoding="utf-8")][: int(limit)]
    out = os.path.join(work, "official", task + ".jsonl")
    dist.init_process_group("gloo", init_method="file://" + os.path.join(work, "pg-" + task), rank=0, world_size=1)
    pred.get_pred(0, 1, rows, int(max_length), maxlen[task], prompts[task], task, None, "smollm2",
                  {"smollm2": folder}, out)
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--folder", type=Path, help="transformers model folder (default: SmolLM2-135M-Instruct, float32)")
    p.add_argument("--data", type=Path, default=REPO / "tests/fixtures/longbench/v1/data")
    p.add_argument("--tasks", default="all")
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    p.add_argument("--max-length", type=int, default=7500, help="prompt tokens kept (model2maxlen's 8K models: 7500)")
    p.add_argument("--batch-size", default="auto", help="megaeval's --batch-size")
    p.add_argument("--longbench", type=Path, help="a LongBench git directory (default: the local mirror)")
    p.add_argument("--work", type=Path, help="keep everything here (default: a temporary folder)")
    p.add_argument("--long-contexts", type=int, metavar="WORDS", help="contexts of WORDS words of Austen's novels")
    return p.parse_args()


def official_side(args: argparse.Namespace, folder: Path, work: Path, tasks: list[str]) -> float:
    """Seconds of LongBench's get_pred over every task, in one process (its model loaded per task, as pred.py does)."""
    if not (work / "LongBench" / "pred.py").is_file():
        git = ["git", "-C", str(args.longbench or LONGBENCH_GIT), "archive", LONGBENCH_COMMIT]
        archive = subprocess.run([*git, "LongBench/pred.py", "LongBench/config"], check=True, capture_output=True)
        archive = archive.stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    (work / "official").mkdir(exist_ok=True)
    for task in tasks:
        (work / "official" / f"{task}.jsonl").unlink(missing_ok=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", OFFICIAL, str(work), str(folder), args.dtype, str(args.max_length),
                    ",".join(tasks), str(args.num_samples), str(args.data)], check=True, env=one_thread_env(),
                   capture_output=True, text=True)  # fmt: skip
    return time.perf_counter() - start  # the process's wall clock, as megaeval's: imports and loads included


def megaeval_side(args: argparse.Namespace, folder: Path, work: Path, tasks: list[str]) -> float:
    """Seconds of one `megaeval longbench --version 1` process; its samples in WORK/megaeval.jsonl."""
    cmd = [sys.executable, "-m", "megaeval", "longbench", "--version", "1", "--model", f"hf:{folder}", "--dtype",
           args.dtype, "--data", str(args.data), "--tasks", ",".join(tasks), "--num-samples", str(args.num_samples),
           "--max-prompt-tokens", str(args.max_length), "--batch-size", args.batch_size,
           "--samples", str(work / "megaeval.jsonl"), "--out", str(work / "megaeval.json"),
           "--no-progress"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=one_thread_env(), cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def long_records(source: Path, target: Path, tasks: list[str], words: int) -> Path:
    """Copies of the tasks' records in `target`, each context replaced by `words` words of one Austen novel."""
    novels = sorted((REPO / "data_prep" / "corpora" / "austen").glob("*.txt"))

    @functools.cache
    def context(k: int) -> str:  # each novel read once, and only if a record takes it
        text = novels[k].read_text(encoding="utf-8").split()
        if len(text) < words:
            raise SystemExit(f"{novels[k].name} holds {len(text):,} words; ask for fewer")
        return " ".join(text[:words])

    target.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        rows = [json.loads(x) for x in (source / f"{task}.jsonl").read_text("utf-8").splitlines() if x.strip()]
        for k, row in enumerate(rows):
            row.update(context=context(k % len(novels)), length=words)
        (target / f"{task}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return target


def predictions(work: Path, tasks: list[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """LongBench's and megaeval's predictions, task by task in the data's order."""
    files = {task: work / "official" / f"{task}.jsonl" for task in tasks}
    theirs = {task: [json.loads(x)["pred"] for x in f.read_text("utf-8").splitlines()] for task, f in files.items()}
    ours: dict[str, list[str]] = {}
    for s in map(json.loads, (work / "megaeval.jsonl").read_text(encoding="utf-8").splitlines()):
        ours.setdefault(s["task"], []).append(s["prediction"])
    return theirs, ours


def main() -> None:
    args = parse_args()
    folder = model_folder(args.folder)
    work = work_folder(args.work, "longbench-vs-pipeline-")
    present = [t for t in V1_TASKS if (args.data / f"{t}.jsonl").is_file()]
    tasks = present if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.long_contexts:
        args.data = long_records(args.data, work / "data", tasks, args.long_contexts)
    print(f"{len(tasks)} tasks of {args.data}, {args.dtype}, max_length {args.max_length}, one thread; in {work}")
    theirs = official_side(args, folder, work, tasks)
    print(f"  LongBench pred.py: {theirs:,.1f} s", flush=True)
    ours = megaeval_side(args, folder, work, tasks)
    print_comparison("LongBench pred.py", theirs, ours, *predictions(work, tasks))


if __name__ == "__main__":
    main()
