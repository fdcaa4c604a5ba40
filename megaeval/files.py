"""File helpers: checksums, atomic JSON writes, early writability checks."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import fail


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to a temporary file beside `path`, then rename it over `path`."""
    _write_atomic(path, lambda f: f.write(json.dumps(obj, indent=1, allow_nan=False) + "\n"))


def write_jsonl_atomic(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Write one JSON object per line, atomically (a samples file)."""
    _write_atomic(path, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _write_atomic(path: str | Path, write: Any) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; give it the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable(path: str | Path, flag: str = "--out") -> Path:
    """Fail now, before any work, if a file cannot be written at `path`."""
    path = Path(path)
    if path.is_dir():
        raise fail(f"{flag} {path} is a directory", "give a file name such as report.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise fail(f"cannot write {flag} {path}: {e.strerror or e}", "choose a writable location") from None
    return path
