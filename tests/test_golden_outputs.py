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
def produced(tmp_path_factory) -> dict[str, bytes]:
    """Every golden file's name and its bytes, from this checkout."""
    work = tmp_path_factory.mktemp("golden")
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
