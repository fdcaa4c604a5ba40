"""The resume journal: an append-only JSONL of finished units (and of a served model's answered requests), one format
for every command."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..errors import MegaevalError, fail
from ..files import write_output


def differences(old: Any, new: Any, prefix: str = "") -> str:
    """What differs between two fingerprints, as 'key: OLD then, NEW now; ...'."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return "" if old == new else f"{prefix.rstrip('.') or 'fingerprint'}: {old!r:.80} then, {new!r:.80} now"
    items = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = differences(a, b, f"{prefix}{key}.")
            if inner:
                items.append(inner)
        elif a != b:
            items.append(f"{prefix}{key}: {a!r:.80} then, {b!r:.80} now")
    return "; ".join(items)


def _unit_key(unit: Any) -> str:
    return json.dumps(unit, sort_keys=True)


def _checksum(unit: Any, record: Any) -> str:
    return hashlib.sha256(json.dumps([unit, record], sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _line(unit: Any, record: dict[str, Any]) -> dict[str, Any]:
    """A unit's journal line; its sha256 makes an edited record (a number changed by hand) refused on resume."""
    return {"unit": unit, "record": record, "sha256": _checksum(unit, record)}


def _request_line(key: str, response: dict[str, Any]) -> dict[str, Any]:
    """An answered request's journal line (its key: the request's sha256), checksummed as a unit's line is."""
    return {"request": key, "response": response, "sha256": _checksum(key, response)}


class Journal:
    """Finished units of a run, for resume: line 1 is the run's fingerprint, then one line per unit.

    A line is {"unit": KEY, "record": {...}, "sha256": ...}, written, flushed and fsynced before the next unit
    starts, so a crash (even SIGKILL) loses at most the unit in flight. Resuming checks the
    fingerprint and names every setting that differs. A served model's answers are journaled one request at a time
    as they arrive ({"request": SHA256, "response": {...}, "sha256": ...}), so that a resumed run never sends an
    answered request again, even one of a unit that did not finish.
    """

    def __init__(self, path: str | Path | None, fingerprint: dict[str, Any], resume: bool):
        """Open the journal at `path` (None: kept in memory only, for an output such as /dev/null that a run
        cannot resume into)."""
        self.path = None if path is None else Path(path)
        fingerprint = json.loads(json.dumps(fingerprint))  # as it reads back from disk
        self.records: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, dict[str, Any]] = {}
        self.units: int | None = None  # how many units the run has in all, once it says (Run.map)
        self._lock: int | None = None
        if self.path is None:
            return
        if self.path.exists():
            self._refuse_if_in_use()
            if not resume:
                raise fail(f"an interrupted run left {self.path}", "pass --resume to continue it, or delete that file")
            self.records, self.requests = self._read(fingerprint)
        header = {"fingerprint": fingerprint, "pid": os.getpid()}
        lines = [header] + [_request_line(k, r) for k, r in self.requests.items()]
        lines += [_line(json.loads(k), r) for k, r in self.records.items()]
        # rewritten without a line a crash may have cut
        write_output(self.path, lambda f: f.writelines((json.dumps(x) + "\n").encode() for x in lines),
                     "the resume file")  # fmt: skip
        self._lock = os.open(self.path, os.O_RDONLY)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the process ends: one writer

    def _refuse_if_in_use(self) -> None:
        """Fail if a live run holds the journal (two writers would interleave their units)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = "?"
            with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
                pid = json.loads(self.path.read_text(encoding="utf-8").splitlines()[0]).get("pid", "?")
            raise fail(f"another megaeval run (process {pid}) is writing {self.path} right now",
                       "wait for it to end, or give this run another --out") from None  # fmt: skip
        finally:
            os.close(fd)

    def _read(self, fingerprint: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        corrupt = (f"{self.path} is not a megaeval resume journal", "delete it to start over")
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
            header = json.loads(lines[0]) if lines else None
        except (ValueError, UnicodeDecodeError):
            raise fail(*corrupt) from None
        if not isinstance(header, dict) or "fingerprint" not in header:
            raise fail(*corrupt)
        if header["fingerprint"] != fingerprint:
            raise fail(
                f"cannot resume {self.path}: the run differs from the interrupted one "
                f"({differences(header['fingerprint'], fingerprint)})",
                "rerun with the original settings, or delete that file to start over",
            )
        records: dict[str, dict[str, Any]] = {}
        requests: dict[str, dict[str, Any]] = {}
        for number, line in enumerate(lines[1:], 2):
            try:
                entry = json.loads(line)
            except ValueError:
                if number == len(lines):
                    break  # the line a crash cut: that unit runs again
                raise fail(f"{self.path} line {number} is not valid JSON", "delete the file to start over") from None
            if isinstance(entry, dict) and isinstance(entry.get("request"), str):
                if not isinstance(entry.get("response"), dict):
                    raise fail(f"{self.path} line {number} is not a request record", "delete the file to start over")
                if entry.get("sha256") != _checksum(entry["request"], entry["response"]):
                    raise fail(f"{self.path} line {number} was edited (its sha256 does not match it)",
                               "delete the file to start over")  # fmt: skip
                requests[entry["request"]] = entry["response"]
                continue
            if not (isinstance(entry, dict) and "unit" in entry and isinstance(entry.get("record"), dict)):
                raise fail(f"{self.path} line {number} is not a unit record", "delete the file to start over")
            if entry.get("sha256") != _checksum(entry["unit"], entry["record"]):
                raise fail(f"{self.path} line {number} was edited (its sha256 does not match it)",
                           "delete the file to start over")  # fmt: skip
            records[_unit_key(entry["unit"])] = entry["record"]
        return records, requests

    def __contains__(self, unit: Any) -> bool:
        return _unit_key(unit) in self.records

    def __len__(self) -> int:
        return len(self.records)

    def get(self, unit: Any) -> dict[str, Any]:
        """The record of a finished unit."""
        return self.records[_unit_key(unit)]

    def add(self, unit: Any, record: dict[str, Any]) -> None:
        """Record one finished unit durably."""
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(_line(unit, record), ensure_ascii=False) + "\n")
                f.flush()
                # in the file from here: an interrupt during the (slow) fsync must not leave it uncounted
                self.records[_unit_key(unit)] = record
                os.fsync(f.fileno())
        self.records[_unit_key(unit)] = record

    def answered(self, key: str) -> dict[str, Any] | None:
        """A served model's answer to the request of sha256 `key`, if a run journaled it."""
        return self.requests.get(key)

    def add_request(self, key: str, response: dict[str, Any]) -> None:
        """Record one answered request durably (as `add` records a unit)."""
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(_request_line(key, response), ensure_ascii=False) + "\n")
                f.flush()
                self.requests[key] = response
                os.fsync(f.fileno())
        self.requests[key] = response

    def abandon(self, error: BaseException) -> None:
        """The run stops on `error`: a journal with no finished unit goes (a rerun starts afresh, no --resume
        needed); one with finished units stays, and a bad-input error or an interrupt says so in its one line."""
        if self.path is None:
            return
        if not self.records and not self.requests:
            self.path.unlink(missing_ok=True)
        elif isinstance(error, MegaevalError) and len(error.args) == 1:
            kept = f"{len(self.records)} finished units" + (f" and {len(self.requests)} answered requests"
                                                             if self.requests else "")  # fmt: skip
            error.args = (f"{error.args[0]} ({kept} are kept in {self.path}: --resume continues after them once this "
                          "is fixed; delete that file to start over)",)  # fmt: skip
        elif isinstance(error, KeyboardInterrupt):  # the CLI prints its message as the interrupt line
            error.args = (self.interrupted(),)
        self.close()

    def interrupted(self) -> str:
        """The line an interrupted run ends with: how far it got, and what --resume will do."""
        done = len(self.records)
        answered = f", {len(self.requests)} requests answered" if self.requests else ""
        if self.units is None or self.units < done:
            return (f"interrupted after {done} units{answered}; run the same command with --resume to continue after "
                    f"them (they are kept in {self.path})")  # fmt: skip
        then = f"continue with the {self.units - done} left" if done < self.units else "write the report from them"
        return (f"interrupted after {done} of {self.units} units{answered}; run the same command with --resume to "
                f"{then} (the finished ones are kept in {self.path})")  # fmt: skip

    def finish(self) -> None:
        """The run is complete: its report holds everything; the journal goes."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.close()

    def close(self) -> None:
        """Let another run open this journal (a run that ends, or stops, does this)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
