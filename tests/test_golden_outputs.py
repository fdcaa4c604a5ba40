"""Golden outputs: one small run of every command on the embedded models (reports, samples, written data, printed
tables, the HTML page, the plots) equals the outputs recorded in tests/fixtures/golden, byte for byte after removing
what legitimately differs between runs (timing, versions, the checkout's path: megaeval_testing.golden says what).

A refactor that changes no behaviour keeps every file identical. A change that is meant to change outputs records
them again, and the diff of tests/fixtures/golden shows what changed:

    MEGAEVAL_RECORD_GOLDEN=1 .venv/bin/pytest tests/test_golden_outputs.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from megaeval_testing import golden as G
from megaeval_testing import hostile as H

RECORD = os.environ.get("MEGAEVAL_RECORD_GOLDEN", "") not in ("", "0")
MACHINE_FILE = G.GOLDEN / "MACHINE.json"
RECORDED = sorted(str(p.relative_to(G.GOLDEN)) for p in G.GOLDEN.rglob("*") if p.is_file() and p != MACHINE_FILE)


def _run(cli: H.Megaeval, command: str, work: Path) -> H.Result:
    result = cli.run(G.argv(command), work)
    assert result.returncode == 0, result.describe()
    return result


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The folder the runs write in."""
    return tmp_path_factory.mktemp("golden")


@pytest.fixture(scope="module")
def produced(work) -> dict[str, bytes]:
    """Every golden file's name and its bytes, from this checkout."""
    G.prepare_inputs(work)
    out: dict[str, bytes] = {}
    cli = H.Megaeval()
    try:
        for name, argv in G.RUNS:
            out[f"stdout/{name}.txt"] = G.normalize_stdout(_run(cli, argv, work).stdout)
        for path in G.OUTPUTS:
            out[f"files/{path.replace('/', '__')}"] = G.normalize_file(work / path)
        G.write_normalized_reports(work, work / "norm")
        for name, argv in G.report_runs(work / "norm"):
            out[f"stdout/{name}.txt"] = G.normalize_stdout(_run(cli, argv, work).stdout)
    finally:
        cli.close()
    out["files/page.html"] = G.without_repo((work / "page.html").read_text(encoding="utf-8")).encode()
    for picture in ("ppl.png", "needle.png", "babilong.png"):
        out[f"files/{picture}"] = (work / picture).read_bytes()
    if RECORD:
        if G.GOLDEN.exists():
            for old in G.GOLDEN.rglob("*"):
                if old.is_file():
                    old.unlink()
        for name, data in out.items():
            (G.GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (G.GOLDEN / name).write_bytes(data)
        MACHINE_FILE.write_text(json.dumps(G.machine(), indent=1) + "\n")
    return out


def test_every_output_has_a_golden_file_and_every_golden_file_an_output(produced):
    assert RECORDED, "no golden files: record them (see this module's docstring)"
    assert sorted(produced) == RECORDED


@pytest.mark.parametrize("name", RECORDED)
def test_output_equals_its_golden_file(produced, name):
    same_machine = json.loads(MACHINE_FILE.read_text()) == G.machine()
    why = G.compare(name, produced[name], (G.GOLDEN / name).read_bytes(), same_machine)
    assert why is None, f"{name} differs from tests/fixtures/golden/{name}: {why}"


def test_derived_values_agree_with_the_files_the_run_wrote(produced, work):
    """On every machine: each report's samples checksum is the sha256 of the samples file its run wrote, and the
    page embeds one row per samples line (on another machine these are what the golden comparison cannot check)."""
    assert G.derived_problems(work) == []


def test_a_derived_value_that_disagrees_with_its_file_is_found(produced, work, tmp_path):
    """derived_problems can fail: a samples file changed after its run (one score's last digit) is caught."""
    import shutil

    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    samples = copy / "academic.jsonl"
    samples.write_text(samples.read_text(encoding="utf-8").replace('"acc": 0.0', '"acc": 0.0001', 1))
    problems = G.derived_problems(copy)
    assert len(problems) == 1 and problems[0].startswith("academic.json: data.samples_sha256"), problems


def test_on_another_machine_a_real_difference_in_samples_still_fails(produced):
    """The looser rule on the real outputs: last-bit noise in a samples file, the page's embedded samples or a
    report's derived checksum passes; a changed number, a changed field or a missing checksum fails."""
    lines = produced["files/longppl.jsonl"].decode().splitlines()
    record, key = json.loads(lines[0]), "longppl"

    def with_value(value) -> bytes:
        return "\n".join([json.dumps({**record, key: value}, ensure_ascii=False), *lines[1:]]).encode() + b"\n"

    golden = produced["files/longppl.jsonl"]
    assert G.compare("files/longppl.jsonl", with_value(record[key] * (1 + 1e-9)), golden, False) is None
    assert G.compare("files/longppl.jsonl", with_value(record[key] * 1.001), golden, False) is not None
    assert G.compare("files/longppl.jsonl", with_value(record[key] * (1 + 1e-9)), golden, True) is not None
    report = json.loads(produced["files/academic.json"])
    other = json.dumps({**report, "data": {**report["data"], "samples_sha256": "0" * 64}}).encode()
    assert G.compare("files/academic.json", other, produced["files/academic.json"], False) is None
    missing = {k: v for k, v in report["data"].items() if k != "samples_sha256"}
    assert G.compare("files/academic.json", json.dumps({**report, "data": missing}).encode(),
                     produced["files/academic.json"], False) is not None  # fmt: skip
    page = produced["files/page.html"].decode()
    for where in (page.index('id="samples-data"'), 0):  # in the embedded samples, in the markup (an SVG point)
        number = re.compile(r"\d+\.\d{8,}").search(page, where)
        assert number, "the page holds no number printed in full"
        for factor, passes in ((1 + 1e-10, True), (1.001, False)):
            value = repr(float(number.group(0)) * factor)
            changed = (page[: number.start()] + value + page[number.end() :]).encode()
            assert (G.compare("files/page.html", changed, produced["files/page.html"], False) is None) is passes


def test_on_another_machine_only_last_digits_may_differ():
    """Where the goldens were recorded elsewhere: printed numbers one unit of their last digit apart and JSON
    numbers within 1e-6 pass; anything more, or any other change, fails."""
    assert G.compare("a.txt", b"ppl 85.549 at 1,024\n", b"ppl 85.548 at 1,024\n", False) is None
    assert G.compare("a.txt", b"ppl 85.549\n", b"ppl 85.539\n", False) is not None
    assert G.compare("a.txt", b"ppl 85.549\n", b"nll 85.549\n", False) is not None
    assert G.compare("a.json", b'{"a": [1.0000001]}', b'{"a": [1.0]}', False) is None
    assert G.compare("a.json", b'{"a": [1.001]}', b'{"a": [1.0]}', False) is not None
    assert G.compare("a.jsonl", b'{"a": 1.0}\n', b'{"a": 1.0, "b": 2}\n', False) is not None
    assert G.compare("a.json", b'{"a": 1.0000001}', b'{"a": 1.0}', True) is not None
