"""Check: `megaeval ruler --prepare-only` writes, byte for byte, what RULER's own prepare.py writes, for every
(tokenizer, length, task).

1. RULER's side: `python -m megaeval.data_prep.ruler_reference` (RULER's pinned scripts, run offline) for each
   tokenizer into REF/<hf|sp|bpe>/, or, with --reference REF where REF/<kind>/ruler_reference.json exists, those files
   reused (the layout of tests/fixtures/ruler/reference; .jsonl or .jsonl.gz);
2. megaeval's side: `python -m megaeval ruler --prepare-only` once per (tokenizer, length, task), so that one
   refusal stops nothing else, into a temporary folder (or --megaeval-out DIR);
3. per (tokenizer, length, task): the files byte for byte and, where they differ, field by field (input, outputs,
   answer_prefix, length, then any other) to the first differing field and character offset (in the field's text,
   or in its JSON for a list or number).

    python bench/ruler_vs_reference.py --lengths 8192,16384 --num-samples 2 --timeout 900 --jobs 2 \\
        --reference /tmp/ruler-ref-8k16k
    python bench/ruler_vs_reference.py --lengths 1024 --reference tests/fixtures/ruler/reference  # quick

Exit status 1 where both generated and differ, or RULER generated and megaeval refused. Where RULER did not
generate (timeout: it loops, or was only slow; failed: it raised) and megaeval did, that is a note, not a failure,
when megaeval's records look sound (N records, each `length` within the length, non-empty input and outputs):
megaeval decides up front what RULER would loop on, and a longer timeout may let RULER finish; otherwise a failure.
Both refusing agrees.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ROOT / "tests" / "fixtures" / "ruler" / "inputs"
TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")  # fmt: skip
# kind: (RULER's --tokenizer path, megaeval's --tokenizer spec), as in tests/fixtures/ruler/reference
TOKENIZERS = {"hf": ("megaeval/assets/transformer-tiny", "embedded:transformer-tiny"),
              "sp": ("megaeval/assets/megalodon-tiny/tokenizer.model", "embedded:megalodon-tiny"),
              "bpe": ("tests/fixtures/ruler/tokenizer-bpe", "tests/fixtures/ruler/tokenizer-bpe")}  # fmt: skip
FIELDS = ("input", "outputs", "answer_prefix", "length")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lengths", default="8192,16384", help="comma list of lengths in tokens")
    p.add_argument("--tokenizers", default="hf,sp", help="comma list of " + ", ".join(TOKENIZERS))
    p.add_argument("--tasks", default="all", help="all, or a comma list of RULER's tasks")
    p.add_argument("--num-samples", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--essays", type=Path, default=INPUTS / "essays.json")
    p.add_argument("--qa-dir", type=Path, default=INPUTS, help="folder with squad.json and hotpotqa.json")
    p.add_argument("--english-words", type=Path, help="RULER's english_words.json, given to both sides")
    p.add_argument("--reference", type=Path, help="RULER's output REF/<kind>/...: reused where there, else made there")
    p.add_argument("--megaeval-out", type=Path, help="keep megaeval's files here (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per RULER run")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (each side)")
    args = p.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    args.tokenizers = [k.strip() for k in args.tokenizers.split(",") if k.strip()]
    args.tasks = list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",") if t.strip()]
    if bad := [x for x in args.tokenizers if x not in TOKENIZERS] + [t for t in args.tasks if t not in TASKS]:
        p.error(f"unknown: {', '.join(bad)}")
    return args


def run_ruler(args: argparse.Namespace, kind: str, out: Path) -> dict[tuple[int, str], str]:
    """RULER's status per (length, task), running RULER's prepare.py into `out` unless it already ran there."""
    summary = out / "ruler_reference.json"
    if not summary.is_file():
        cmd = [sys.executable, "-m", "megaeval.data_prep.ruler_reference", "--tokenizer", TOKENIZERS[kind][0],
               "--essays", str(args.essays), "--qa-dir", str(args.qa_dir), "--tasks", ",".join(args.tasks),
               "--lengths", ",".join(map(str, args.lengths)), "--num-samples", str(args.num_samples),
               "--seed", str(args.seed), "--timeout", str(args.timeout), "--jobs", str(args.jobs),
               "--out", str(out)]  # fmt: skip
        cmd += ["--english-words", str(args.english_words)] if args.english_words else []
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
    settings = json.loads(summary.read_text(encoding="utf-8"))
    if (settings["num_samples"], settings["seed"]) != (args.num_samples, args.seed):
        sys.exit(f"{summary}: made with {settings['num_samples']} samples, seed {settings['seed']}; rerun or match")
    return {(r["length"], r["task"]): r["status"] for r in settings["runs"]}


def run_megaeval(args: argparse.Namespace, kind: str, out: Path, length: int, task: str) -> tuple[str, float]:
    """megaeval's prepare-only for one (length, task): "ok", or its one-line refusal; and the seconds it took."""
    cmd = [sys.executable, "-m", "megaeval", "ruler", "--prepare-only", "--tokenizer", TOKENIZERS[kind][1],
           "--write-data", str(out), "--lengths", str(length), "--num-samples", str(args.num_samples), "--tasks", task,
           "--essays", str(args.essays), "--qa-data", str(args.qa_dir), "--seed", str(args.seed)]  # fmt: skip
    cmd += ["--english-words", str(args.english_words)] if args.english_words else []
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode == 0:
        return "ok", seconds
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return (lines[-1].removeprefix("error: ") if lines else f"exit {proc.returncode}"), seconds


def read_bytes(folder: Path, length: int, task: str) -> bytes | None:
    path = folder / str(length) / task / "validation.jsonl"
    if path.is_file():
        return path.read_bytes()
    gz = path.with_name(path.name + ".gz")
    return gzip.decompress(gz.read_bytes()) if gz.is_file() else None


def first_difference(want: bytes, got: bytes) -> str:
    """Where megaeval's records first differ from RULER's: record, field and character offset."""
    a = [json.loads(line) for line in want.decode("utf-8").splitlines()]
    b = [json.loads(line) for line in got.decode("utf-8").splitlines()]
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        for key in (*FIELDS, *[k for k in dict.fromkeys([*x, *y]) if k not in FIELDS]):
            if x.get(key) != y.get(key):
                s, t = (v if isinstance(v, str) else json.dumps(v) for v in (x.get(key), y.get(key)))
                at = next((j for j, (c, d) in enumerate(zip(s, t, strict=False)) if c != d), min(len(s), len(t)))
                return f"record {i} {key} @{at}: RULER {s[at : at + 24]!r} megaeval {t[at : at + 24]!r}"
        if list(x) != list(y):
            return f"record {i}: key order {list(x)} vs {list(y)}"
    if len(a) != len(b):
        return f"{len(a)} records vs {len(b)}"
    return "same records, different bytes (JSON formatting)"


def sound(data: bytes, length: int, num_samples: int) -> bool:
    """megaeval's records look like a valid RULER file: N records, each within the length, input and answers."""
    records = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    return len(records) == num_samples and all(
        0 < r["length"] <= length and r["input"] and r["outputs"] and all(r["outputs"]) for r in records)  # fmt: skip


def compare(args: argparse.Namespace, kind: str, ruler: str, ref: Path, out: Path, length: int, task: str,
            mega: str) -> tuple[str, str, bool]:  # fmt: skip
    """(equal column, note, failure?) for one (tokenizer, length, task)."""
    want, got = read_bytes(ref, length, task), read_bytes(out, length, task)
    if ruler == "ok" and mega == "ok":
        if want == got:
            return "yes", "", False
        return "no", first_difference(want or b"", got or b""), True
    if ruler == "ok":
        return "no", "RULER generated, megaeval refused", True
    if mega == "ok":
        if got is not None and sound(got, length, args.num_samples):
            return "-", f"note: RULER {ruler}, megaeval's records look sound", False
        return "-", f"RULER {ruler}, megaeval wrote unsound records", True
    return "-", "both refuse", False


def main() -> int:
    args = parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ruler_vs_reference_") as tmp:
        ref_root = args.reference or Path(tmp) / "ruler"
        mega_root = args.megaeval_out or Path(tmp) / "megaeval"
        with ThreadPoolExecutor(max_workers=len(args.tokenizers)) as pool:  # RULER's side, each tokenizer at once
            made = pool.map(lambda k: run_ruler(args, k, ref_root / k), args.tokenizers)
            statuses = dict(zip(args.tokenizers, made, strict=True))
        ruler_seconds = time.monotonic() - start
        pairs = [(k, n, t) for k in args.tokenizers for n in args.lengths for t in args.tasks]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            megas = list(pool.map(lambda p: run_megaeval(args, p[0], mega_root / p[0], p[1], p[2]), pairs))
        mega_seconds = sum(s for _, s in megas)
        rows, failures = [], 0
        for (kind, length, task), (mega, seconds) in zip(pairs, megas, strict=True):
            ruler = statuses[kind].get((length, task), "not run")
            equal, note, failed = compare(args, kind, ruler, ref_root / kind, mega_root / kind, length, task, mega)
            failures += failed
            rows.append((kind, length, task, ruler, mega, equal, note, seconds, failed))
    print(f"{'tok':<3} {'length':>6} {'task':<16} {'RULER':<7} {'megaeval':<8} {'equal':<5} {'s':>5}  note")
    for kind, length, task, ruler, mega, equal, note, seconds, failed in rows:
        text = "; ".join(x for x in ("" if mega == "ok" else mega, note) if x)
        mark = "FAIL " if failed else ""
        print(f"{kind:<3} {length:>6} {task:<16} {ruler:<7} {'ok' if mega == 'ok' else 'refused':<8} {equal:<5} "
              f"{seconds:5.1f}  {mark}{text}")  # fmt: skip
    same = sum(r[5] == "yes" for r in rows)
    print(f"{same} of {len(rows)} equal byte for byte; {failures} failures; RULER's side {ruler_seconds:.0f} s, "
          f"megaeval {mega_seconds:.0f} s of runs, total {time.monotonic() - start:.0f} s")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
