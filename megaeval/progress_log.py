"""Append-only record of finished examples, so a run can resume where it stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import fail


class ProgressLog:
    """Append-only JSONL of finished examples (first line: the settings' fingerprint), for resume.

    Each record needs "task" and "id". A record is flushed and fsynced before the next example
    starts, so a crash loses at most the example in flight.
    """

    def __init__(self, path: Path, fingerprint: dict, resume: bool):
        self.path = path
        fingerprint = json.loads(json.dumps(fingerprint))  # as it reads back from disk
        if path.exists() and not resume:
            raise fail(f"an interrupted run left {path}", "pass --resume to continue it, or delete that file")
        self.records = self._read(fingerprint) if path.exists() else []
        with open(path, "w", encoding="utf-8") as f:  # rewritten without a line a crash may have cut
            f.write(json.dumps({"fingerprint": fingerprint}) + "\n")
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records)
        self.done = {(r["task"], r["id"]) for r in self.records}

    def _read(self, fingerprint: dict) -> list[dict]:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            saved = json.loads(lines[0])["fingerprint"]
        except (IndexError, ValueError, KeyError):
            raise fail(f"{self.path} is corrupt", "delete it and start over") from None
        if saved != fingerprint:
            raise fail(f"cannot resume {self.path}: the settings, model or data differ from the interrupted run",
                       "rerun with the original settings, or delete that file to start over")  # fmt: skip
        records = []
        for line in lines[1:]:
            try:
                records.append(json.loads(line))
            except ValueError:
                break  # a line cut by the crash: that example runs again
        return records

    def add(self, record: dict) -> None:
        """Record one finished example durably."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)
        self.done.add((record["task"], record["id"]))

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
