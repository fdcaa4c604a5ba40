"""Parquet files damaged past an intact footer, as a disk or a bad copy leaves them: a page header overwritten, or
one row's string bytes made non-UTF-8."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

GROUP = 5  # rows per row group: a damaged second page names rows 6-10


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as a plain parquet file (no compression, dictionary or statistics: each string's bytes appear once, in
    its data page), GROUP rows per row group."""
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=GROUP, compression="NONE", use_dictionary=False,
                   write_statistics=False)  # fmt: skip
    return path


def damage_page(path: Path, group: int = 1) -> Path:
    """Overwrite the header of the first data page of row group `group` (the footer stays intact)."""
    offset = pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    return path


def break_utf8(path: Path, text: str) -> Path:
    """Make the first two bytes of the (unique) string `text` in the file invalid UTF-8."""
    data = bytearray(path.read_bytes())
    at = data.index(text.encode())
    data[at : at + 2] = b"\xff\xfe"
    path.write_bytes(bytes(data))
    return path
