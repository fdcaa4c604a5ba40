"""megaeval/text.py: the one place text files are read: strict UTF-8, lone surrogates refused, file and line named."""

from __future__ import annotations

import pytest

from megaeval import MegaevalError
from megaeval.text import ParquetRows, check_text, iter_jsonl, read_json, read_parquet, read_text
from megaeval_testing.parquet import break_utf8, damage_page, write_parquet


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


def _rows(n: int = 10) -> list[dict]:
    return [{"id": f"r{i}", "text": f"row number {i} of the set"} for i in range(n)]


def test_parquet_rows_are_read_a_group_at_a_time_and_checked(tmp_path):
    path = write_parquet(tmp_path / "ok.parquet", _rows())
    rows = ParquetRows(path, ["text", "no-such-column"])
    assert rows.columns == ["text"] and len(rows) == 10 and rows[7] == {"text": "row number 7 of the set"}
    assert list(rows) == [{"text": r["text"]} for r in _rows()] and read_parquet(path) == _rows()


@pytest.mark.parametrize("read", [read_parquet, lambda p: ParquetRows(p)[7], lambda p: list(ParquetRows(p))])
def test_a_damaged_parquet_page_names_the_file_and_its_rows(tmp_path, read):
    path = damage_page(write_parquet(tmp_path / "d.parquet", _rows()))
    with pytest.raises(MegaevalError, match=r"d\.parquet rows 6-10 cannot be read: a damaged page \(.*\); export"):
        read(path)
    assert ParquetRows(path)[2]["id"] == "r2"  # the intact group still reads


@pytest.mark.parametrize("read", [read_parquet, lambda p: ParquetRows(p)[7], lambda p: list(ParquetRows(p))])
def test_parquet_text_that_is_not_utf8_names_the_file_row_and_column(tmp_path, read):
    path = break_utf8(write_parquet(tmp_path / "u.parquet", _rows()), "row number 7")
    with pytest.raises(MegaevalError, match=r"u\.parquet row 8: `text` holds bytes that are not UTF-8 .*convert"):
        read(path)


def test_a_file_that_is_not_parquet_is_one_line(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(MegaevalError, match=r"x\.parquet is not a readable parquet file \(.*\); export the file"):
        ParquetRows(tmp_path / "x.parquet")
