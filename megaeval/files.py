"""File helpers: checksums, the one output writer (atomic, never replacing a device), early writability checks."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from .errors import fail


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def files_sha256(files: list[Path]) -> str:
    """sha256 of one file, or of several files' "name:sha256" in the given order (a checkpoint's weight files),
    each remembered while its file is unchanged (`cached_file_sha256`: a model's load need not read gigabytes)."""
    if len(files) == 1:
        return cached_file_sha256(files[0])
    digests = [f"{p.name}:{cached_file_sha256(p)}" for p in files]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()


def dataset_files_sha256(dataset: Any) -> dict[str, str]:
    """The checksum of each file a `datasets` Dataset reads (its arrow files, by name): what identifies its rows
    in a report and a resume fingerprint, where the dataset's own fingerprint stays the same when its files are
    replaced. Hashed once while a file is unchanged (`cached_file_sha256`)."""
    return {Path(f["filename"]).name: cached_file_sha256(f["filename"]) for f in dataset.cache_files}


def write_json_atomic(path: str | Path, obj: Any, flag: str = "--out") -> None:
    """Write JSON to `path` with `write_output` (a report)."""
    text = json.dumps(obj, indent=1, allow_nan=False) + "\n"
    write_output(path, lambda f: f.write(text.encode("utf-8")), flag)


def write_jsonl_atomic(path: str | Path, records: list[dict[str, Any]], flag: str = "--samples") -> str:
    """Write one JSON object per line with `write_output` (a samples file); return the sha256 of the bytes written
    (a report records it, so that its samples file is known by its contents: `data.samples_sha256`)."""
    data = b"".join((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in records)
    write_output(path, lambda f: f.write(data), flag)
    return hashlib.sha256(data).hexdigest()


def is_special(path: str | Path) -> bool:
    """Whether `path` names an existing file that is neither a regular file nor a folder (a device, a FIFO,
    a socket), following symbolic links."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def written_through(path: str | Path) -> bool:
    """Whether an output at `path` is written through rather than replaced: a device, FIFO or socket, or a
    link in /dev or /proc such as /dev/stdout (replacing it would replace the link, for the whole machine)."""
    path = Path(path)
    return is_special(path) or (path.is_symlink() and str(path.absolute()).startswith(("/dev/", "/proc/")))


def write_output(path: str | Path, write: Callable[[BinaryIO], Any], flag: str = "--out") -> None:
    """The one way megaeval writes an output file: `write(f)` fills a binary file object.

    A regular file (or a new one) is written to a temporary file beside it, which then replaces it, so
    readers never see half a file and a failed write leaves the old one; missing folders are created. A
    device or FIFO (`--out /dev/null`, `/dev/stdout`, a named pipe) is written through, never replaced.
    Every OSError becomes one line naming `flag`, the path and the reason.
    """
    path = Path(path)
    try:
        if written_through(path):
            _write_through(path, write)
        else:  # through a symbolic link, the file it names is replaced and the link kept
            _write_replacing(Path(os.path.realpath(path)) if path.is_symlink() else path, write)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise fail(f"cannot write {flag} {path}: no space left on the device",
                       f"free some space, or choose another {flag} path") from None  # fmt: skip
        raise fail(f"cannot write {flag} {path}: {e.strerror or e}", f"choose another {flag} path") from None


def _write_through(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    flags = os.O_WRONLY | os.O_APPEND
    if stat.S_ISFIFO(os.stat(path).st_mode):
        flags |= os.O_NONBLOCK  # fails at once (ENXIO) when nothing reads the FIFO, instead of hanging
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "it is a FIFO that nothing reads") from None
        raise
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as f:
        write(f)


def _write_replacing(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
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


def check_writable(path: str | Path, flag: str = "--out", room: int = 0) -> Path:
    """Fail now, before any work, if a file cannot be written at `path` (creating no folder on the way); `room`:
    bytes its name must leave for a suffix (the resume file beside a report)."""
    if not str(path).strip():
        raise fail(f"{flag} is empty", f"give {flag} a file name")
    path = Path(path)
    name_max = 255
    with contextlib.suppress(OSError, ValueError):
        name_max = os.pathconf(_existing_ancestor(path), "PC_NAME_MAX")
    size = len(os.fsencode(path.name))
    if size + room > name_max:
        beside = f" and its resume file's {size + room}" if room else ""
        raise fail(f"{flag} file name is {size} bytes long{beside}; this file system allows {name_max}",
                   f"give {flag} a shorter file name")  # fmt: skip
    if path.is_dir():
        raise fail(f"{flag} {path} is a directory, not a file", f"give {flag} a file name inside it")
    if written_through(path):  # never replaced: it must accept writes
        if not os.access(path, os.W_OK):
            raise fail(f"cannot write {flag} {path}: permission denied", f"choose another {flag} path")
        return path
    ancestor = _existing_ancestor(path)
    if not ancestor.is_dir():
        raise fail(f"cannot write {flag} {path}: {ancestor} is a file, not a folder", f"choose another {flag} path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".megaeval.", suffix=".probe", dir=ancestor)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise fail(f"cannot write {flag} {path}: {e.strerror or e} in {ancestor}", "choose a writable place") from None
    return path


def _existing_ancestor(path: Path) -> Path:
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    return ancestor


def cache_dir() -> Path:
    """Where megaeval keeps caches: $MEGAEVAL_CACHE_DIR, else $XDG_CACHE_HOME/megaeval, else ~/.cache/megaeval."""
    if os.environ.get("MEGAEVAL_CACHE_DIR"):
        return Path(os.environ["MEGAEVAL_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "megaeval"


def cached_file_sha256(path: str | Path) -> str:
    """sha256 of a (large) file, hashed once and then remembered while the file is unchanged.

    The cache key covers the file's identity and every stat field a write changes (size, mtime and
    ctime in ns, inode, device); ctime cannot be set back by a user, so an edit always re-hashes.
    """
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}|{st.st_dev}"
    entry = cache_dir() / "sha256" / hashlib.sha256(key.encode()).hexdigest()
    try:
        cached = entry.read_text().strip()
        if len(cached) == 64:
            return cached
    except OSError:
        pass
    digest = file_sha256(path)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(digest + "\n")
        os.replace(tmp, entry)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return digest


def _files_under(path: Path, limit: int = 10_000) -> list[Path]:
    if not path.is_dir():
        return [path]
    found: list[Path] = []
    for root, _dirs, names in os.walk(path):
        found += [Path(root) / n for n in names]
        if len(found) >= limit:
            break
    return found


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def check_outputs(outputs: dict[str, str | Path | None], reads: Iterable[str | Path | None]) -> None:
    """Refuse, before any work, an output that is a file being read or that another output also names.

    `outputs` maps a flag (e.g. "--out") to its path; `reads` are the files and folders the run reads
    (a folder stands for every file in it).
    """
    named = [(flag, Path(p)) for flag, p in outputs.items() if p is not None]
    for i, (flag, path) in enumerate(named):
        for other_flag, other in named[:i]:
            if _same_file(path, other) and not _is_char_device(path):  # /dev/null may take every output
                raise fail(f"{other_flag} and {flag} are the same file {path}", "give each output its own file name")
    inputs = [f for r in reads if r is not None for f in _files_under(Path(r))]
    for flag, path in named:
        for source in inputs:
            if _same_file(path, source):
                raise fail(
                    f"{flag} {path} is an input of this run ({source}); writing it would destroy that input",
                    f"choose another {flag} path",
                )


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError
