"""Run RULER's own data preparation (NVIDIA/RULER `scripts/data/prepare.py`) offline, to get the reference
instances that megaeval's RULER generators must equal byte for byte. A developer tool: megaeval never calls it.

    python -m megaeval.data_prep.ruler_reference --tokenizer megaeval/assets/transformer-tiny \\
        --essays tests/fixtures/ruler/inputs/essays.json --qa-dir tests/fixtures/ruler/inputs \\
        --tasks all --lengths 1024,2048,4096 --num-samples 2 --seed 42 --out /tmp/ruler-hf

What it does, for each (length, task), in RULER's base template (`--model_template_type base`):

- takes a copy of RULER's `scripts/` folder: from `--ruler DIR` (a RULER checkout, or a git directory, from which
  `--commit` is extracted), by default from a local mirror at RULER_GIT (pinned commit below);
- puts the input files where RULER's scripts read them, in the copy's `scripts/data/synthetic/json/`:
  `--essays FILE` as PaulGrahamEssays.json ({"text": ...}), `--qa-dir DIR`'s squad.json and hotpotqa.json, and
  `--english-words FILE` as english_words.json (cwe reads it on start; without it an empty stand-in, which RULER
  only samples from past wonderwords' 8,166 words, far beyond 4K tokens: there it would fail, never differ);
- runs `python prepare.py --benchmark synthetic --task T --tokenizer_path P --tokenizer_type hf|nemo
  --max_seq_length L --num_samples N --random_seed S --model_template_type base` in that copy, with `python`
  on PATH being this interpreter (prepare.py shells out to a bare `python`), NLTK_DATA pointing at the Punkt data
  megaeval ships (plus an empty `tokenizers/punkt` folder, so prepare.py's check for the old pickled model finds
  something and never tries to download), and Hugging Face offline;
- a transformers tokenizer folder runs as RULER's "hf" type (AutoTokenizer, `len(tok.tokenize(text))`); a
  sentencepiece `.model` file as RULER's "nemo" type, for which a small stand-in for NeMo's
  `nemo.collections.common.tokenizers.sentencepiece_tokenizer.SentencePieceTokenizer(model_path=...)` is put on
  PYTHONPATH for the subprocess only: `text_to_tokens(text)` is `sp.encode_as_pieces(text)`, as NeMo's is;
- gives each run `--timeout` seconds: RULER's scripts loop forever where a haystack cannot fit (small tokenizers
  at 1K on essay tasks, QA with few documents), and prepare.py reports a failed script as success, so each output
  file is checked for N records;
- writes RULER's layout, OUT/<length>/<task>/validation.jsonl (`--gzip`: .jsonl.gz, reproducible bytes), and
  OUT/ruler_reference.json with each run's status (ok, timeout, failed) and the settings.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RULER_COMMIT = "c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a"
RULER_GIT = os.environ.get("RULER_GIT", "/work/.mirror/NVIDIA+RULER/repo")
TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")  # fmt: skip
ESSAY_TASKS = {"niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery"}
QA_TASKS = {"qa_1": "squad.json", "qa_2": "hotpotqa.json"}

# NeMo's SentencePieceTokenizer, as far as RULER's "nemo" tokenizer type uses it (scripts/data/tokenizer.py)
NEMO_SHIM = '''"""Stand-in for NeMo's SentencePieceTokenizer, for RULER's --tokenizer_type nemo (ruler_reference)."""
import sentencepiece


class SentencePieceTokenizer:
    def __init__(self, model_path, **_ignored):
        self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(model_path))

    def text_to_tokens(self, text):
        return self.tokenizer.encode_as_pieces(text)

    def tokens_to_text(self, tokens):
        return self.tokenizer.decode_pieces(tokens)
'''


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokenizer", required=True, help="a transformers tokenizer folder, or a sentencepiece .model")
    p.add_argument("--tokenizer-type", choices=("hf", "nemo"), help="RULER's type (default: hf for a folder, "
                   "nemo for a file)")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="output folder (RULER's layout)")
    p.add_argument("--tasks", default="all", help="all, or a comma list of " + ", ".join(TASKS))
    p.add_argument("--lengths", default="4096", help="comma list of max_seq_length values (tokens)")
    p.add_argument("--num-samples", type=int, default=500)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--essays", type=Path, help='PaulGrahamEssays.json-format file {"text": ...}')
    p.add_argument("--qa-dir", type=Path, help="folder with squad.json and hotpotqa.json")
    p.add_argument("--english-words", type=Path, help="RULER's english_words.json (default: an empty stand-in)")
    p.add_argument("--ruler", type=Path, help=f"a RULER checkout or git directory (default: {RULER_GIT})")
    p.add_argument("--commit", default=RULER_COMMIT, help="the commit to extract from a git directory")
    p.add_argument("--timeout", type=float, default=300, help="seconds per (length, task) run")
    p.add_argument("--jobs", type=int, default=4, help="runs at once")
    p.add_argument("--gzip", action="store_true", help="write validation.jsonl.gz (reproducible bytes)")
    args = p.parse_args(argv)
    args.tasks = list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        p.error(f"unknown tasks: {', '.join(unknown)}")
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lengths {args.lengths}: give whole numbers of tokens, e.g. 1024,4096")
    args.tokenizer_arg = args.tokenizer  # as given, for the record
    args.tokenizer = Path(args.tokenizer).resolve()
    if not args.tokenizer.exists():
        p.error(f"--tokenizer {args.tokenizer}: not found")
    args.tokenizer_type = args.tokenizer_type or ("hf" if args.tokenizer.is_dir() else "nemo")
    if " " in str(args.tokenizer):
        p.error("prepare.py passes the tokenizer path through a shell unquoted: use a path without spaces")
    needs = [(t, "--essays") for t in args.tasks if t in ESSAY_TASKS and not args.essays]
    needs += [(t, f"--qa-dir with {QA_TASKS[t]}") for t in args.tasks if t in QA_TASKS
              and not (args.qa_dir and (args.qa_dir / QA_TASKS[t]).is_file())]  # fmt: skip
    if needs:
        p.error("; ".join(f"{t} needs {what}" for t, what in needs))
    return args


def ruler_scripts(source: Path | None, commit: str, into: Path) -> str:
    """Copy RULER's scripts/ folder into `into` (from a checkout, or `commit` of a git directory); its commit."""
    source = Path(source or RULER_GIT)
    if (source / "scripts" / "data" / "prepare.py").is_file():
        shutil.copytree(source / "scripts", into / "scripts")
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True)
        return head.stdout.strip() if head.returncode == 0 else "unknown (not a git checkout)"
    if not (source / "objects").is_dir():
        sys.exit(f"--ruler {source}: neither a RULER checkout nor a git directory; pass --ruler DIR (a clone of "
                 "NVIDIA/RULER)")  # fmt: skip
    tar = subprocess.run(["git", "--git-dir", str(source), "archive", "--format=tar", commit, "scripts"],
                         capture_output=True)  # fmt: skip
    if tar.returncode != 0:
        sys.exit(f"--ruler {source}: cannot extract {commit}: {tar.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(into, filter="data")
        else:
            t.extractall(into)  # noqa: S202 (our own git archive)
    return commit


def prepare_checkout(args: argparse.Namespace, work: Path) -> dict[str, str]:
    """Lay out RULER's scripts and inputs under `work`; the environment its runs need."""
    args.ruler_commit = ruler_scripts(args.ruler, args.commit, work)
    data = work / "scripts" / "data" / "synthetic" / "json"
    data.mkdir(parents=True, exist_ok=True)
    if args.essays:
        shutil.copyfile(args.essays, data / "PaulGrahamEssays.json")
    for name in QA_TASKS.values():
        if args.qa_dir and (args.qa_dir / name).is_file():
            shutil.copyfile(args.qa_dir / name, data / name)
    target = data / "english_words.json"
    target.unlink(missing_ok=True)  # in a mirror it is a git-LFS pointer, not the file
    if args.english_words:
        shutil.copyfile(args.english_words, target)
    else:
        target.write_text("{}\n", encoding="utf-8")

    bin_dir = work / "bin"  # `python` for prepare.py's shell command: this interpreter, venv and all
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec '{sys.executable}' \"$@\"\n", encoding="utf-8")
    (bin_dir / "python").chmod(0o755)
    stub = work / "nltk_stub" / "tokenizers" / "punkt"  # prepare.py checks for the old pickled model by name
    stub.mkdir(parents=True)
    from megaeval.tasks.ruler.inputs import nltk_data_dir

    env = dict(os.environ)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               NLTK_DATA=f"{nltk_data_dir()}{os.pathsep}{work / 'nltk_stub'}",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONHASHSEED="0")  # fmt: skip
    if args.tokenizer_type == "nemo":
        shim = work / "nemo_shim"
        package = shim / "nemo" / "collections" / "common" / "tokenizers"
        package.mkdir(parents=True)
        for folder in (shim / "nemo", shim / "nemo" / "collections", shim / "nemo" / "collections" / "common", package):
            (folder / "__init__.py").write_text("", encoding="utf-8")
        (package / "sentencepiece_tokenizer.py").write_text(NEMO_SHIM, encoding="utf-8")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
    return env


def command(args: argparse.Namespace, save_dir: Path, task: str, length: int) -> list[str]:
    return ["python", "prepare.py", "--save_dir", str(save_dir), "--benchmark", "synthetic", "--task", task,
            "--tokenizer_path", str(args.tokenizer), "--tokenizer_type", args.tokenizer_type,
            "--max_seq_length", str(length), "--model_template_type", "base", "--num_samples", str(args.num_samples),
            "--random_seed", str(args.seed)]  # fmt: skip


def run_one(args: argparse.Namespace, work: Path, env: dict[str, str], length: int, task: str) -> dict:
    """One prepare.py run, killed (its whole process group) past the timeout; the record of how it went."""
    save_dir = work / "out" / str(length)
    log_path = work / "logs" / f"{length}_{task}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command(args, save_dir, task, length), cwd=work / "scripts" / "data", env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=args.timeout)
            status = None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
    seconds = round(time.monotonic() - start, 1)
    made = save_dir / task / "validation.jsonl"
    record = {"length": length, "task": task, "seconds": seconds}
    tail = " | ".join(log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:])
    if status == "timeout":
        return {**record, "status": "timeout", "error": f"no result within {args.timeout:g} s; log ends: {tail}"}
    lines = made.read_text(encoding="utf-8").splitlines() if made.is_file() else []
    if proc.returncode != 0 or len(lines) != args.num_samples:
        return {**record, "status": "failed", "error": f"exit {proc.returncode}, {len(lines)} records; {tail}"}
    target = args.out / str(length) / task / ("validation.jsonl.gz" if args.gzip else "validation.jsonl")
    target.parent.mkdir(parents=True, exist_ok=True)
    raw = made.read_bytes()
    if args.gzip:
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
            f.write(raw)
        raw = buffer.getvalue()
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(raw)
    partial.replace(target)
    return {**record, "status": "ok"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(length, task) for length in args.lengths for task in args.tasks]
    with tempfile.TemporaryDirectory(prefix="ruler_reference_") as tmp:
        work = Path(tmp)
        env = prepare_checkout(args, work)
        print(f"RULER {args.ruler_commit}: {len(runs)} runs, tokenizer {args.tokenizer} ({args.tokenizer_type})",
              flush=True)  # fmt: skip
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(run_one, args, work, env, length, task) for length, task in runs]
            results = []
            for future in futures:
                r = future.result()
                results.append(r)
                print(f"{r['length']:>7} {r['task']:<16} {r['status']:<8} {r['seconds']:>7.1f} s"
                      + (f"  {r['error']}" if "error" in r else ""), flush=True)  # fmt: skip
    summary = {
        "ruler_commit": args.ruler_commit,
        "tokenizer": args.tokenizer_arg,
        "tokenizer_type": args.tokenizer_type,
        "model_template_type": "base",
        "num_samples": args.num_samples,
        "seed": args.seed,
        "timeout_s": args.timeout,
        "essays": str(args.essays) if args.essays else None,
        "qa_dir": str(args.qa_dir) if args.qa_dir else None,
        "english_words": str(args.english_words) if args.english_words else "empty stand-in",
        "runs": results,
        "not_generated": [f"{r['length']}/{r['task']}" for r in results if r["status"] != "ok"],
    }
    (args.out / "ruler_reference.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    bad = summary["not_generated"]
    print(f"{len(results) - len(bad)} of {len(results)} generated" + (f"; not: {', '.join(bad)}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
