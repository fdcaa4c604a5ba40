"""Benchmark: how close the cost line's estimate comes to the work it estimates.

Runs a megaeval command in a fresh process with its progress on, notes when the cost line appears and what it
estimates ("about T per model copy"), and times the rest of the run from that moment to the process's end (the
reading, generating and scoring the line is about; loading and preparing come before it). Prints the estimate, the
time taken and their ratio, for each command given (after `--`, several separated by `;`).

    python bench/cost_line.py -- ruler --model hf:DIR --tasks niah_single_1,vt --lengths 4K --num-samples 2
    python bench/cost_line.py -- longbench --model hf:DIR --data tests/fixtures/longbench/v1 --tasks qasper \\; \\
        ruler --model hf:DIR --lengths 4K --num-samples 1
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

UNITS = {"s": 1, "min": 60, "h": 3600, "days": 86400}
ESTIMATE = re.compile(r"about ([\d.]+) (s|min|h|days) (per model copy|reading)")


def run(argv: list[str]) -> tuple[str, float, float]:
    """(the cost line, its estimate in seconds, the seconds from its appearance to the process's end)."""
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "r.json")
        env = {**os.environ, "COLUMNS": "250"}
        command = [sys.executable, "-m", "megaeval", *argv, "--out", out]
        child = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        line, seen, last = "", 0.0, ""
        assert child.stderr is not None
        for text in child.stderr:
            if not line and ESTIMATE.search(text):
                line, seen = text.strip(), time.perf_counter()
            last = text.strip() or last
        code = child.wait()
        ended = time.perf_counter()
    if code != 0 or not line:
        raise SystemExit(f"megaeval {' '.join(argv)}: exit {code}, cost line {'seen' if line else 'not seen'}: {last}")
    found = ESTIMATE.search(line)
    assert found is not None
    return line, float(found.group(1)) * UNITS[found.group(2)], ended - seen


def main() -> None:
    args = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    commands, current = [], []
    for a in args:
        if a == ";":
            commands.append(current)
            current = []
        else:
            current.append(a)
    if current:
        commands.append(current)
    print("| command | estimate s | taken s | estimate ÷ taken |\n|---|---:|---:|---:|")
    for argv in commands:
        line, estimate, taken = run(argv)
        print(f"| `megaeval {' '.join(argv)}` | {estimate:.0f} | {taken:.0f} | {estimate / taken:.2f} |")
        print(f"<!-- {line} -->")


if __name__ == "__main__":
    main()
