"""megaeval/text.py: the one place text files are read: strict UTF-8, lone surrogates refused, file and line named."""

from __future__ import annotations

import pytest

from megaeval import MegaevalError
from megaeval.text import check_text, iter_jsonl, read_json, read_text


def test_json_with_a_lone_surrogate_is_refused_naming_its_line_and_a_pair_is_text(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"ok": "\\ud83d\\ude00",\n "bad": ["x", "\\udc00"]}', encoding="utf-8")
    with pytest.raises(MegaevalError, match=r"^--f .*a\.json line 2 holds a lone surrogate escape"):
        read_json(path, "--f")
    path.write_text('{"ok": "\\ud83d\\ude00"}', encoding="utf-8")
    assert read_json(path) == {"ok": "\U0001f600"}


def test_jsonl_lines_are_numbered_as_in_the_file_and_bad_bytes_name_theirs(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n\n[2]\n"\xe9t\xe9"\n')
    rows = iter_jsonl(path)
    assert next(rows) == (1, {"a": 1}) and next(rows) == (3, [2])  # the blank line keeps its number
    with pytest.raises(MegaevalError, match=r"r\.jsonl line 4 is not UTF-8 text"):
        next(rows)
    path.write_text('{"k": "\\ud800"}\n', encoding="utf-8")
    with pytest.raises(MegaevalError, match=r"r\.jsonl line 1 holds a lone surrogate \(U\+D800\)"):
        list(iter_jsonl(path))


def test_text_files_and_values_are_checked_whole(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("line one\nlíne two\n".encode("latin-1"))
    with pytest.raises(MegaevalError, match=r"^--essays .*t\.txt line 2 is not UTF-8 text"):
        read_text(path, "--essays")
    with pytest.raises(MegaevalError, match=r"^--essays .*gone\.txt: no such file"):
        read_text(tmp_path / "gone.txt", "--essays")
    with pytest.raises(MegaevalError, match=r"where holds a lone surrogate"):
        check_text({"deep": [{"\udfff key": 1}]}, "where")
    assert check_text(value := {"x": ["ok", 1, None]}, "where") is value
