"""What megaeval prints: results on standard output, errors as one `error:` line on standard error."""

from __future__ import annotations

import errno
import functools
import os
import re
import signal
import sys
import unicodedata

from .errors import fail


def echo(text: str = "", end: str = "\n") -> None:
    """Print to standard output; a full disk or a closed pipe there is one error line, not a traceback, and a character
    its encoding lacks (PYTHONIOENCODING=ascii, a legacy code page) is degraded (`printable`)."""
    try:
        sys.stdout.write(printable(str(text) + end, getattr(sys.stdout, "encoding", None) or "utf-8"))
        sys.stdout.flush()
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what stays buffered goes nowhere at exit
        reason = "no space left on the device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise fail(f"cannot write to standard output: {reason}", "free some space, or send it elsewhere") from None


def printable(text: str, encoding: str) -> str:
    """`text` as `encoding` can carry it: unchanged when it can; else a table's box drawing as ASCII (- | +) and any
    other character it lacks as "?" (two for a wide one, so columns stay aligned)."""
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        pass
    try:
        "".encode(encoding)
    except LookupError:  # an encoding Python does not know: ASCII is safe
        encoding = "ascii"
    return "".join(_degraded(ch, encoding) for ch in text)


@functools.cache
def _degraded(ch: str, encoding: str) -> str:
    try:
        ch.encode(encoding)
        return ch
    except UnicodeEncodeError:
        pass
    name = unicodedata.name(ch, "").split()
    if name[:2] == ["BOX", "DRAWINGS"]:  # a line (─ ━ │ ┃) or a corner or junction (┏ ┳ ╇: "... AND ...")
        return "+" if "AND" in name else "-" if "HORIZONTAL" in name else "|" if "VERTICAL" in name else "+"
    return "?" * (2 if unicodedata.east_asian_width(ch) in "WF" else 1)


def error_line(message: str) -> None:
    """`error: MESSAGE` on stderr as one line in one write (ranks sharing a terminal never glue lines). Under a
    multi-rank launch each rank names itself first; a rank stopped by another's failure names that one too
    (`rank 0: stopped by rank 1: ...`)."""
    _line_to_stderr(f"error: {_own_rank(' '.join(str(message).split()))}\n")


def note_line(message: str) -> None:
    """A note for the user on stderr (not a result, not an error), as one line."""
    _line_to_stderr(f"{' '.join(str(message).split())}\n")


def interrupted_line(message: str = "interrupted") -> None:
    """The line an interrupted command ends with (after Ctrl-C or SIGTERM), naming this rank under a launch."""
    _line_to_stderr(f"{_own_rank(' '.join(message.split()))}\n")


def _own_rank(message: str) -> str:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world in (None, "1"):
        return message
    named = re.match(r"rank (\d+): ", message)  # a failure every rank shares names the rank it happened on
    if named is None:
        return f"rank {rank}: {message}"
    if named.group(1) == rank:
        return message
    return f"rank {rank}: stopped by rank {named.group(1)}: {message[named.end() :]}"


def _line_to_stderr(line: str) -> None:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stderr (tests, notebooks) has no descriptor
        sys.stderr.write(line)
        return
    sys.stderr.flush()
    os.write(fd, line.encode(errors="replace"))


def interrupt_on_sigterm() -> None:
    """Take SIGTERM (`kill`, a scheduler's stop) as Ctrl-C: a run cleans up and leaves what it can resume."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
