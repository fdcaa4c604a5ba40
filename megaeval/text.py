"""Text files in and out through one place: strict UTF-8, no lone surrogates (JSON's `\\ud800` escapes, which no
UTF-8 writer can write back), and every refusal naming the file and the line (a parquet file's: the row)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import MegaevalError, fail

CONVERT = "convert the file to UTF-8 text"


def is_number(value: Any) -> bool:
    """Whether a value read from JSON is a finite number (not a bool, NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_text(path: str | Path, what: str = "", fix: str = "check the path and its permissions") -> str:
    """The UTF-8 text of a file; a missing, unreadable or non-UTF-8 file is one line naming it (and `what` it is)."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise fail(f"{name}: no such file", fix) from None
    except IsADirectoryError:
        raise fail(f"{name} is a folder, not a file", fix) from None
    except OSError as e:
        raise fail(f"cannot read {name}: {e.strerror or e}", fix) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise fail(f"{name} line {line} is not UTF-8 text ({e.reason} at byte {e.start})", CONVERT) from None


def check_text(value: Any, where: str) -> Any:
    """`value` itself, after checking that every string in it (keys included, however deep) is writable UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_string(item, where)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    _check_string(key, where)
                stack.append(child)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return value


def _check_string(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        raise fail(f"{where} holds a lone surrogate (U+{code:04X}), which is not text",
                   "write the character itself, or a complete \\ud8xx\\udcxx pair") from None  # fmt: skip


def parse_json(text: str, where: str, fix: str = "fix the file") -> Any:
    """One JSON value from `text` (read from `where`: "FILE" or "FILE line N"), its strings checked."""
    return check_text(_loads(text, where, fix), where)


def read_json(path: str | Path, what: str = "", fix: str = "fix the file") -> Any:
    """The JSON value a UTF-8 file holds, or one line naming the file (and the line, for a lone surrogate)."""
    text = read_text(path, what, fix)
    name = f"{what} {path}" if what else str(path)
    value = _loads(text, name, fix)
    try:
        return check_text(value, name)
    except MegaevalError:
        raise fail(f"{name} line {_surrogate_line(text)} holds a lone surrogate escape (\\udXXX), which is not text",
                   "write the character itself, or a complete surrogate pair") from None  # fmt: skip


def _loads(text: str, where: str, fix: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise fail(f"{where} is nested too deeply to be data", fix) from None
    except ValueError as e:
        raise fail(f"{where} is not valid JSON ({e})", fix) from None


def _surrogate_line(text: str) -> int:
    """The line of the first lone surrogate escape in JSON text (1 when it cannot be placed)."""
    pair = r"\\u[dD][89abAB][0-9a-fA-F]{2}(?P<low>\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    for m in re.finditer(pair, text):
        if m.group(0)[3].lower() in "cdef" or not m.group("low"):
            return text.count("\n", 0, m.start()) + 1
    return 1


def iter_jsonl(path: str | Path, what: str = "", fix: str = "fix or remove that line") -> Iterator[tuple[int, Any]]:
    """(line number, JSON value) for each non-blank line of a UTF-8 JSONL file, read a line at a time."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise fail(f"{name}: no such file", "check the path") from None
    except IsADirectoryError:
        raise fail(f"{name} is a folder, not a file", "check the path") from None
    except OSError as e:
        raise fail(f"cannot read {name}: {e.strerror or e}", "check the path and its permissions") from None
    with f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise fail(f"{name} line {number} is not UTF-8 text ({e.reason})", CONVERT) from None
            if line.strip():
                yield number, parse_json(line, f"{name} line {number}", fix)


class ParquetRows:
    """A parquet file's rows (of `columns` where it has them; None: all), read a piece at a time and checked as the
    JSON readers check lines: a damaged page, or a string that is not UTF-8, is one line naming the file and the
    row (counted from 1). Indexing holds one row group, iterating 64 rows: a set of huge rows never sits in memory."""

    def __init__(self, path: str | Path, columns: list[str] | None = None, fix: str = "export the file again"):
        import pyarrow.parquet as pq

        self.path, self.fix = Path(path), fix
        try:
            self._file = pq.ParquetFile(self.path)
        except FileNotFoundError:
            raise fail(f"{self.path}: no such file", "check the path") from None
        except Exception as e:  # pyarrow's errors for a file it cannot parse (OSError, ArrowInvalid, ...)
            raise fail(f"{self.path} is not a readable parquet file ({_reason(e)})", fix) from None
        self.names = self._file.schema_arrow.names  # every column of the file; `columns`: those read
        self.columns = self.names if columns is None else [c for c in columns if c in self.names]
        sizes = [self._file.metadata.row_group(g).num_rows for g in range(self._file.num_row_groups)]
        self._starts = [sum(sizes[:g]) for g in range(len(sizes) + 1)]
        self._group: tuple[int, list[dict[str, Any]]] | None = None

    def __len__(self) -> int:
        return self._starts[-1]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import pyarrow as pa

        for group in range(len(self._starts) - 1):
            batches, done = self._file.iter_batches(64, row_groups=[group], columns=self.columns), self._starts[group]
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except Exception as e:  # a damaged page or header past an intact footer (read ahead: its group)
                    raise self._damaged(group, e) from None
                yield from self._checked(pa.Table.from_batches([batch]), done)
                done += batch.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        group = next(g for g in range(len(self._starts) - 1) if index < self._starts[g + 1])
        if self._group is None or self._group[0] != group:
            self._group = None  # the previous group goes before the next is read
            try:
                table = self._file.read_row_group(group, columns=self.columns)
            except Exception as e:  # a damaged page or header past an intact footer
                raise self._damaged(group, e) from None
            self._group = (group, self._checked(table, self._starts[group]))
        return self._group[1][index - self._starts[group]]

    def _damaged(self, group: int, error: Exception) -> Exception:
        """The refusal of a row group that cannot be read, naming its rows."""
        first, end = self._starts[group] + 1, self._starts[group + 1]
        return fail(f"{self.path} rows {first}-{end} cannot be read: a damaged page ({_reason(error)})",
                    self.fix)  # fmt: skip

    def _checked(self, table: Any, done: int) -> list[dict[str, Any]]:
        """The rows of `table` (the file's rows from `done` on), every string checked."""
        try:
            rows = table.to_pylist()
        except UnicodeDecodeError as e:
            row, column = _undecodable(table)
            raise fail(f"{self.path} row {done + row + 1}: `{column}` holds bytes that are not UTF-8 ({e.reason})",
                       CONVERT) from None  # fmt: skip
        return check_text(rows, f"{self.path} rows {done + 1}-{done + len(rows)}")


def read_parquet(path: str | Path, fix: str = "export the file again") -> list[dict[str, Any]]:
    """Every row of a parquet file, checked as `ParquetRows` checks them."""
    return list(ParquetRows(path, fix=fix))


def _undecodable(table: Any) -> tuple[int, str]:
    """The first (row, column) of a table whose strings are not all UTF-8 (for the error line)."""
    for row in range(table.num_rows):
        for column in table.column_names:
            try:
                table.slice(row, 1).column(column).to_pylist()
            except UnicodeDecodeError:
                return row, column
    return 0, table.column_names[0]


def _reason(error: Exception) -> str:
    """pyarrow's message on one line (its lines joined, the damaged bytes it quotes dropped), cut at 120 characters."""
    text = "".join(c if c.isprintable() else " " for c in str(error))
    return " ".join(text.split())[:120] or type(error).__name__
