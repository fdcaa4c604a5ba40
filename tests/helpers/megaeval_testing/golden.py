"""Golden outputs (tests/test_golden_outputs.py): one small run of every command on the embedded models, its
outputs made comparable across runs and checkouts, and compared with the recorded ones in tests/fixtures/golden.

What legitimately differs between two runs is replaced before comparing, and nothing else:
- in JSON (reports, samples, manifests, key files): the values of TIMING_KEYS (wall-clock seconds, speed, memory,
  MFU, dates), the environment's versions, platform, git revision and date, the manifest's `created` and the
  stream's `manifest_sha256` (a checksum over that date and the sources' absolute paths);
- everywhere: the checkout's own path (`<REPO>`), since a fresh clone lives elsewhere;
- in printed tables: the cells of timing columns, and the width of whitespace and rules (a table is as wide as
  its longest cell, and a path under `<REPO>` is as long as the checkout's path).

Each golden file is compared byte for byte on a machine like the one that recorded them (MACHINE: the same torch,
CPU instruction set and matplotlib); elsewhere numbers may differ in their last bits, so JSON numbers are compared
to 1e-6 relative, printed numbers to one unit of their last digit (or 1e-6 relative, for a number printed in full),
the page's embedded JSON as JSON, and pictures not at all. A value derived from another output's bytes (DERIVED_KEYS:
a report's checksum of its samples file) cannot be compared within a tolerance: it is checked against the file the
run wrote (`derived_problems`) on every machine, and left out of the comparison with the golden elsewhere.
"""

from __future__ import annotations

import json
import math
import platform
import re
import shlex
from pathlib import Path
from typing import Any

from . import REPO, TIMING_KEYS

GOLDEN = REPO / "tests" / "fixtures" / "golden"
SAMPLES = REPO / "data_prep" / "samples"
VOLATILE_ENVIRONMENT = {"megaeval", "torch", "triton", "python", "platform", "device_name", "git_revision", "date"}
TIMING_COLUMNS = {"tok/s", "peak mem", "seconds"}
# Values computed from the bytes of another output: equal to what the run wrote, whatever the golden holds.
DERIVED_KEYS = {"samples_sha256"}
# Every academic task but MMLU (its 57 subjects' prompts take longer than all the others), at its default shots.
ACADEMIC = "hellaswag,piqa,siqa,winogrande,arc_easy,arc_challenge,boolq,nq_open,triviaqa"

# (name, command line): run in order in one work folder; {repo} is the checkout. Each one's stdout is a golden
# file, and so is every file the runs write (OUTPUTS). Models run in float64: last-bit differences between machines
# stay far below every printed digit.
# fmt: off
RUNS: list[tuple[str, str]] = [
    ("info-megalodon", "info embedded:megalodon-tiny"),
    ("info-rfa", "info embedded:rfa-tiny --json"),
    ("prep-books", "prep-books {repo}/data_prep/corpora/austen/persuasion.txt --out stream --no-progress"),
    ("ppl-sweep", "ppl-sweep --model embedded:megalodon-tiny --stream stream --lengths 256,1K --tokens 2048 "
                  "--batch-size 2 --no-progress --out sweep.json --dtype float64"),
    ("scrolls", "scrolls --model embedded:transformer-tiny --data-dir sdata --tasks qmsum --max-new-tokens 8 "
                "--stop ### --no-progress --out scrolls.json --samples scrolls.jsonl --dtype float64"),
    ("academic", f"academic --data-dir {{repo}}/data_prep/samples --limit 1 --tasks {ACADEMIC} --no-progress "
                 "--out academic.json --samples academic.jsonl --dtype float64"),
    ("needle", "needle --model embedded:mamba2-tiny --tasks passkey,niah_single_1 --lengths 512 --depths 0,100 "
               "--no-progress --out needle.json --samples needle.jsonl --dtype float64"),
    ("ruler", "ruler --tasks niah_single_1,vt,cwe,fwe --lengths 1K --num-samples 1 --no-progress --out ruler.json "
              "--samples ruler.jsonl --dtype float64"),
    ("ruler-prepare", "ruler --tasks niah_single_1,vt --lengths 1K --num-samples 2 --prepare-only --write-data rdata "
                      "--no-progress"),
    ("babilong", "babilong --model embedded:megalodon-tiny --data {repo}/tests/fixtures/babilong/frozen --tasks "
                 "qa1,qa4 --lengths 0k,1k --no-progress --out babilong.json --samples babilong.jsonl "
                 "--write-predictions bpreds --dtype float64"),
    ("longppl", "longppl --model embedded:mamba2-tiny --evaluator embedded:megalodon-tiny --data docs --trunc-len 64 "
                "--sliding-window 32 --alpha 0.3 --beta -3 --save-key-tokens keys.json --samples longppl.jsonl "
                "--out longppl.json --no-progress --dtype float64"),
]
OUTPUTS = ["stream/manifest.json", "sweep.json", "scrolls.json", "scrolls.jsonl", "academic.json", "academic.jsonl",
           "needle.json", "needle.jsonl", "ruler.json", "ruler.jsonl",
           "rdata/1024/niah_single_1/validation.jsonl", "rdata/1024/vt/validation.jsonl", "longppl.json",
           "longppl.jsonl", "keys.json", "babilong.json", "babilong.jsonl",
           "bpreds/qa4_1k_instruction_yes_examples_yes_post_prompt_yes_chat_template_no_system_prompt_no.csv",
           "bpreds/qa4_1k_instruction_yes_examples_yes_post_prompt_yes_chat_template_no_system_prompt_no.json"]
REPORTS = ["sweep.json", "scrolls.json", "academic.json", "needle.json", "ruler.json", "longppl.json",
           "babilong.json"]
SAMPLE_FILES = ["scrolls.jsonl", "academic.jsonl", "needle.jsonl", "ruler.jsonl", "longppl.jsonl",
                "babilong.jsonl"]
# fmt: on


def prepare_inputs(work: Path) -> None:
    """The inputs the runs read besides the checkout's: short QMSum rows, two short documents."""
    from .hostile import short_qmsum_rows, write_jsonl

    for split in ("validation", "train"):
        write_jsonl(work / "sdata" / "qmsum" / f"{split}.jsonl", short_qmsum_rows(split, 2, chars=3000))
    (work / "docs").mkdir()
    for name, chars in (("emma.txt", 6000), ("northangerabbey.txt", 5000)):
        text = (REPO / "data_prep" / "corpora" / "austen" / name).read_text(encoding="utf-8")[:chars]
        (work / "docs" / name).write_text(text, encoding="utf-8")


def report_runs(norm: Path) -> list[tuple[str, str]]:
    """The runs over the normalized reports (so timing is fixed): report in every format, the page, the plots."""
    runs = [(f"report-{r.removesuffix('.json')}-{fmt}", f"report {norm.name}/{r} --format {fmt}")
            for r in REPORTS for fmt in ("table", "markdown", "csv")]  # fmt: skip
    reports = " ".join(f"{norm.name}/{r}" for r in REPORTS)
    samples = " ".join(f"--samples {norm.name}/{s}" for s in SAMPLE_FILES)
    runs.append(("report-html", f"report {reports} {samples} --format html --out page.html"))
    runs.append(("plot-ppl", f"plot {norm.name}/sweep.json --out ppl.png --position-curve"))
    runs.append(("plot-needle", f"plot {norm.name}/needle.json --out needle.png"))
    runs.append(("plot-babilong", f"plot {norm.name}/babilong.json --out babilong.png"))
    return runs


def argv(command: str) -> list[str]:
    """A run's command line as arguments, with the checkout's path filled in."""
    return shlex.split(command.format(repo=REPO))


def normalize_json(obj: Any) -> Any:
    """`obj` with timing values zeroed (their type kept) and the environment's volatile entries blanked."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key in TIMING_KEYS and value is not None:
                value = "<date>" if isinstance(value, str) else type(value)(0)
            elif key == "environment" and isinstance(value, dict):
                value = {k: "<env>" if k in VOLATILE_ENVIRONMENT else v for k, v in value.items()}
            elif key in ("created", "manifest_sha256") and isinstance(value, str):
                value = "<date>"
            out[key] = normalize_json(value)
        return out
    if isinstance(obj, list):
        return [normalize_json(v) for v in obj]
    return obj


def without_repo(text: str) -> str:
    """`text` with the checkout's path (plain and JSON-escaped) written as <REPO>."""
    for form in (str(REPO), json.dumps(str(REPO))[1:-1]):
        text = text.replace(form, "<REPO>")
    return text


def normalize_file(path: Path) -> bytes:
    """A written output, comparable: JSON normalized (its layout kept as the file had it), the repo path blanked."""
    text = without_repo(path.read_text(encoding="utf-8"))
    if path.suffix == ".csv":
        return text.encode()
    if path.suffix == ".jsonl":
        return "".join(json.dumps(normalize_json(json.loads(line)), ensure_ascii=False) + "\n"
                       for line in text.splitlines() if line.strip()).encode()  # fmt: skip
    second = text.split("\n")[1] if "\n" in text else ""
    indent = len(second) - len(second.lstrip(" ")) or None
    return (json.dumps(normalize_json(json.loads(text)), indent=indent, ensure_ascii=False) + "\n").encode()


_RULE = re.compile(r"[─━═]{2,}")
_SPACES = re.compile(r" {2,}")


def mask_timing_columns(text: str) -> str:
    """Printed rich tables with the cells of TIMING_COLUMNS (and `info`'s load time) replaced by `<t>`."""
    out, masked = [], set()
    for line in text.splitlines():
        if "┃" in line:  # a header row: which columns are timing
            cells = line.split("┃")
            masked = {i for i, c in enumerate(cells) if c.strip() in TIMING_COLUMNS}
        elif "│" in line and masked:
            cells = line.split("│")
            line = "│".join(" <t> " if i in masked else c for i, c in enumerate(cells))
        elif "│" in line and line.split("│")[1].strip() == "load time":  # `info`'s row of its load time
            cells = line.split("│")
            line = "│".join(" <t> " if i == 2 else c for i, c in enumerate(cells))
        elif line.startswith("└"):
            masked = set()
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def normalize_stdout(text: str) -> bytes:
    """A command's stdout, comparable: repo path blanked, timing cells masked, runs of spaces and rules as one."""
    text = mask_timing_columns(without_repo(text))
    text = re.sub(r'"load_seconds": [-\d.e]+', '"load_seconds": "<t>"', text)  # `info --json`'s load time
    return "\n".join(_SPACES.sub(" ", _RULE.sub("─", line)).rstrip() for line in text.splitlines()).encode() + b"\n"


def write_normalized_reports(work: Path, norm: Path) -> None:
    """The reports and samples, normalized, under `norm` (what the report and plot runs read)."""
    norm.mkdir()
    for name in REPORTS + SAMPLE_FILES:
        (norm / name).write_bytes(normalize_file(work / name))


def machine() -> dict[str, str]:
    """What makes outputs bitwise reproducible: torch, its CPU instruction set, matplotlib, the architecture."""
    import matplotlib
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "matplotlib": matplotlib.__version__, "machine": platform.machine()}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Comparing on another machine: numbers within tolerance

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def close_json(actual: Any, expected: Any, where: str = "") -> str | None:
    """None when equal with numbers to 1e-6 relative; else where they first differ."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        if actual.keys() != expected.keys():
            return f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        return next((d for k in expected if (d := close_json(actual[k], expected[k], f"{where}.{k}"))), None)
    if isinstance(expected, list) and isinstance(actual, list):
        if len(actual) != len(expected):
            return f"{where}: {len(actual)} items != {len(expected)}"
        pairs = enumerate(zip(actual, expected, strict=True))
        return next((d for i, (a, e) in pairs if (d := close_json(a, e, f"{where}[{i}]"))), None)
    numbers = (int, float)
    if isinstance(expected, float) and isinstance(actual, numbers) and not isinstance(actual, bool):
        ok = math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(actual) and math.isnan(expected))
        return None if ok else f"{where}: {actual!r} != {expected!r}"
    return None if actual == expected else f"{where}: {actual!r:.200} != {expected!r:.200}"


def close_text(actual: str, expected: str) -> str | None:
    """None when equal but for printed numbers one unit of their last digit apart (or, a number printed in full,
    1e-6 relative); else the first differing line."""
    a_lines, e_lines = actual.splitlines(), expected.splitlines()
    if len(a_lines) != len(e_lines):
        return f"{len(a_lines)} lines != {len(e_lines)}"
    for a, e in zip(a_lines, e_lines, strict=True):
        if _NUMBER.split(a) != _NUMBER.split(e):
            return f"{a!r} != {e!r}"
        for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(e), strict=True):
            digits = len(y.partition(".")[2].partition("e")[0]) if "." in y else 0
            u, v = float(x.replace(",", "")), float(y.replace(",", ""))
            if abs(u - v) > 1.01 * 10**-digits and not math.isclose(u, v, rel_tol=1e-6, abs_tol=1e-9):
                return f"{a!r} != {e!r}"
    return None


def without_derived(obj: Any) -> Any:
    """`obj` with the values of DERIVED_KEYS replaced by a mark (their presence still compared)."""
    if isinstance(obj, dict):
        return {k: "<derived>" if k in DERIVED_KEYS else without_derived(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [without_derived(v) for v in obj]
    return obj


_EMBEDDED = re.compile(r'(<script type="application/json"[^>]*>)(.*?)(</script>)', re.S)


def close_page(actual: str, expected: str) -> str | None:
    """The HTML page: its embedded JSON blocks compared as JSON (close_json), the markup around them as text."""
    a_blocks, e_blocks = _EMBEDDED.findall(actual), _EMBEDDED.findall(expected)
    if [b[0] for b in a_blocks] != [b[0] for b in e_blocks]:
        return f"embedded blocks {[b[0] for b in a_blocks]} != {[b[0] for b in e_blocks]}"
    for (tag, a, _), (_, e, _) in zip(a_blocks, e_blocks, strict=True):
        if why := close_json(json.loads(a), json.loads(e), tag):
            return why
    return close_text(_EMBEDDED.sub(r"\1\3", actual), _EMBEDDED.sub(r"\1\3", expected))


def derived_problems(work: Path) -> list[str]:
    """What in the runs' outputs under `work` disagrees with the files they derive from: each report's
    data.samples_sha256 against the samples file its run wrote, and the page's embedded samples against the
    samples files it was given (one row per line). Empty when all agree."""
    import hashlib

    problems = []
    for report_name in REPORTS:
        report = json.loads((work / report_name).read_text(encoding="utf-8"))
        recorded, named = report["data"].get("samples_sha256"), report["settings"].get("samples")
        if (recorded is None) != (named is None):
            problems.append(f"{report_name}: settings.samples {named!r} but data.samples_sha256 {recorded!r}")
        elif named is not None:
            written = hashlib.sha256((work / named).read_bytes()).hexdigest()
            if recorded != written:
                problems.append(f"{report_name}: data.samples_sha256 {recorded} != sha256 of {named} ({written})")
    page = (work / "page.html").read_text(encoding="utf-8")
    embedded = dict((tag, body) for tag, body, _ in _EMBEDDED.findall(page))
    rows = json.loads(embedded['<script type="application/json" id="samples-data">'])["samples"]
    lines = sum(len((work / "norm" / s).read_text(encoding="utf-8").splitlines()) for s in SAMPLE_FILES)
    if len(rows) != lines:
        problems.append(f"page.html embeds {len(rows)} samples, the samples files it was given hold {lines}")
    return problems


def compare(name: str, actual: bytes, expected: bytes, same_machine: bool) -> str | None:
    """None when `actual` matches the golden `expected`; else why not."""
    if actual == expected:
        return None
    if same_machine:
        if name.endswith(".png"):
            return "not byte-identical"
        lines = zip(actual.decode().splitlines(), expected.decode().splitlines(), strict=False)
        first = next(((k, a, e) for k, (a, e) in enumerate(lines, 1) if a != e), None)
        where = f": line {first[0]} is {first[1]!r:.300}, golden {first[2]!r:.300}" if first else ""
        return "not byte-identical" + where
    if name.endswith(".png"):
        return None  # another matplotlib or CPU draws other pixels; the plotted numbers are tested in test_plot
    if name.endswith((".json", ".jsonl")):
        if name.endswith(".jsonl"):
            parse = lambda b: [json.loads(x) for x in b.decode().splitlines() if x.strip()]  # noqa: E731
        else:
            parse = lambda b: json.loads(b)  # noqa: E731
        return close_json(without_derived(parse(actual)), without_derived(parse(expected)))
    if name.endswith(".html"):
        return close_page(actual.decode(), expected.decode())
    return close_text(actual.decode(), expected.decode())
