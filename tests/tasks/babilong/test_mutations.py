"""Property-based damage to BABILong's sets (issue 57, as issue 46 did for RULER and LongPPL): one instance of a set
in the folder layouts (`qa1/0k.json`, `0k/qa1.jsonl`), damaged at one drawn place (a key deleted, a value of another
JSON type: tests/helpers/megaeval_testing/mutation.py), gives the clean instances or one line (a MegaevalError),
never a traceback and never other instances."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaeval.tasks.babilong.data import read_instances
from megaeval.tasks.babilong.spec import load_babilong_task
from megaeval_testing import REPO
from megaeval_testing.mutation import EXAMPLES, check, draw_damage

FROZEN = REPO / "tests" / "fixtures" / "babilong" / "frozen"


def write(path: Path, rows: list, lines: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows) if lines else json.dumps(rows)
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize(("task", "name", "lines"), [("qa1", "qa1/0k.json", False), ("qa4", "1k/qa4.jsonl", True)])
def test_a_damaged_instance_is_the_clean_set_or_one_line(tmp_path, task, name, lines):
    length = "0k" if name.endswith("0k.json") else "1k"
    rows = json.loads((FROZEN / task / f"{length}.json").read_text(encoding="utf-8"))
    spec = load_babilong_task(task)

    def taken() -> list[dict]:
        instances = read_instances(str(tmp_path), task, length, spec)
        instances.check_all()
        return [instances[i] for i in range(len(instances))]

    write(tmp_path / name, rows, lines)
    expected = taken()
    assert len(expected) == len(rows)

    @EXAMPLES
    @given(st.data())
    def damaged(data):
        n = data.draw(st.integers(0, len(rows) - 1), label="instance")
        write(tmp_path / name, [draw_damage(data, r) if i == n else r for i, r in enumerate(rows)], lines)
        check(taken, expected)

    damaged()
