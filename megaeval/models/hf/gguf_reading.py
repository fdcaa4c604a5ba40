"""Reading GGUF files fast: the same fields as gguf's own reader, with the long metadata arrays (a tokenizer's
vocabulary and merges: 100K strings) parsed in one pass instead of one memory-mapped view per element.

transformers reads a GGUF file three times to load a model and its tokenizer (tokenizer, config, weights) and
rebuilds gguf's tensor-name table once per module of the model; with gguf's reader that took 15 of the 18 seconds
of loading SmolLM2-135M. Inside `fast_reading()` transformers gets this reader (one per file, shared by every read
of the load) and a memoized name table. It then converts exactly what it would have converted: the fields are
equal part for part (tested against gguf's reader on every value type).

Every file is first walked by `check_gguf`, which checks each count, length and offset against the bytes the file
has before anything is allocated or looped over: a damaged or hostile file (an array claiming 2**40 items, a file cut
anywhere) is one line naming the field and the file, in time and memory bounded by the file's size.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import MegaevalError, fail

try:
    import gguf
except ImportError:  # the hf extra is not installed: loading a GGUF file says so (models.hf.config)
    gguf = None  # type: ignore[assignment]

_open: dict[str, Any] | None = None  # path -> reader, while fast_reading() is active

# GGUF value types (the format's numbering): the size of each scalar, and the two compound types
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4
VERSIONS = (2, 3)  # those gguf's reader reads
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses tensors with more
MAX_NESTING = 8  # arrays of arrays: real files nest one level at most
DAMAGED = "the file is damaged or truncated; copy it again"


def check_gguf(path: str | Path) -> None:
    """Walk a GGUF file's header, metadata and tensor table, every count, length and offset checked against the file's
    size before use; one line naming the field and the file when one does not fit (or the file is not GGUF)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise fail(f"{path} is not a readable GGUF file: it is empty (0 bytes)", DAMAGED)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _Walk(path, buf, size).file()
    except (OSError, ValueError) as e:  # ValueError: mmap of something that is not a regular file
        reason = getattr(e, "strerror", None) or e
        raise fail(f"cannot read {path} ({reason})", "check the path and the file's permissions") from None


class _Walk:
    """A bounds-checked pass over a GGUF file: `at` moves only by what the file holds; loops run at most once per
    byte that remains, since every item is at least one byte."""

    def __init__(self, path: Path, buf: mmap.mmap, size: int):
        self.path, self.buf, self.size, self.at, self.order = path, buf, size, 0, "<"

    def fail(self, problem: str) -> MegaevalError:
        return fail(f"{self.path} is not a readable GGUF file: {problem}", DAMAGED)

    def left(self) -> int:
        return self.size - self.at

    def skip(self, size: int, what: str) -> int:
        """The offset of the next `size` bytes (`what`), which must be in the file."""
        if size > self.left():
            raise self.fail(f"reading {what} at byte {self.at:,} needs {size:,} bytes, but the file ends at "
                            f"{self.size:,}")  # fmt: skip
        self.at += size
        return self.at - size

    def uint(self, size: int, what: str) -> int:
        start = self.skip(size, what)
        return int.from_bytes(self.buf[start : start + size], "little" if self.order == "<" else "big")

    def items(self, n: int, least: int, what: str) -> None:
        """`n` items of at least `least` bytes each must fit in what is left."""
        if n * least > self.left():
            raise self.fail(f"{what} claims {n:,} items of at least {least} byte(s), but only {self.left():,} bytes "
                            f"follow (at byte {self.at:,})")  # fmt: skip

    def text(self, what: str) -> str:
        n = self.uint(8, f"the length of {what}")
        if n > self.left():
            raise self.fail(f"{what} claims {n:,} bytes, but only {self.left():,} follow (at byte {self.at:,})")
        start = self.skip(n, what)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {start:,} is not UTF-8 text") from None

    def value(self, kind: int, what: str, depth: int = 0) -> None:
        if kind in SCALAR_SIZES:
            self.skip(SCALAR_SIZES[kind], what)
        elif kind == STRING:
            n = self.uint(8, f"the length of {what}")
            if n > self.left():
                raise self.fail(f"{what} claims {n:,} bytes, but only {self.left():,} follow (at byte {self.at:,})")
            self.at += n
        elif kind == ARRAY:
            self.array(what, depth)
        else:
            raise self.fail(f"{what} has unknown value type {kind}")

    def array(self, what: str, depth: int) -> None:
        if depth >= MAX_NESTING:
            raise self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        item = self.uint(4, f"the item type of {what}")
        n = self.uint(8, f"the item count of {what}")
        if item in SCALAR_SIZES:
            self.items(n, SCALAR_SIZES[item], what)
            self.at += n * SCALAR_SIZES[item]
        elif item == STRING:  # a vocabulary: 100K strings, so the loop is kept lean
            self.items(n, 8, what)
            unpack, buf, end = struct.Struct(self.order + "Q").unpack_from, self.buf, self.size
            for i in range(n):
                if end - self.at < 8:
                    raise self.fail(f"the length of {what}[{i}] at byte {self.at:,} runs past the end ({end:,})")
                length = unpack(buf, self.at)[0]
                if length > end - self.at - 8:
                    raise self.fail(f"{what}[{i}] claims {length:,} bytes, but only {end - self.at - 8:,} follow")
                self.at += 8 + length
        elif item == ARRAY:
            self.items(n, 12, what)
            for i in range(n):
                self.array(f"{what}[{i}]", depth + 1)
        else:
            raise self.fail(f"{what} has unknown item type {item}")

    def file(self) -> None:
        if self.buf[self.skip(4, "the magic bytes") : 4] != b"GGUF":
            raise self.fail("it does not start with the GGUF magic bytes")
        version = self.uint(4, "the version")
        if version & 0xFFFF == 0:  # written on a machine of the other byte order (gguf's reader reads those too)
            self.order, version = ">", int.from_bytes(self.buf[4:8], "big")
        if version not in VERSIONS:
            raise self.fail(f"GGUF version {version} is not supported (versions {VERSIONS[0]} and {VERSIONS[1]} are)")
        tensor_count = self.uint(8, "tensor_count")
        kv_count = self.uint(8, "kv_count")
        self.items(kv_count, 8 + 4 + 1, "kv_count (metadata entries)")  # key length, value type, a 1-byte value
        alignment, keys = 32, set()
        for i in range(kv_count):
            key = self.text(f"the key of metadata entry {i}")
            if key in keys:
                raise self.fail(f"metadata key {key} appears twice")
            keys.add(key)
            kind = self.uint(4, f"the value type of {key}")
            start = self.at
            self.value(kind, key)
            if key == "general.alignment":
                alignment = self.uint_at(start) if kind == UINT32 else 0
                if alignment == 0 or alignment & (alignment - 1):
                    raise self.fail("general.alignment must be a 32-bit unsigned power of two")
        self.items(tensor_count, 8 + 4 + 4 + 8, "tensor_count (tensors)")  # name length, n_dims, type, offset
        self.tensors(tensor_count, alignment)

    def uint_at(self, start: int) -> int:
        return int.from_bytes(self.buf[start : start + 4], "little" if self.order == "<" else "big")

    def tensors(self, count: int, alignment: int) -> None:
        from gguf.constants import GGML_QUANT_SIZES

        sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
        names: set[str] = set()
        table = []
        for i in range(count):
            name = self.text(f"the name of tensor {i}")
            if name in names:
                raise self.fail(f"tensor {name} appears twice")
            names.add(name)
            n_dims = self.uint(4, f"n_dims of tensor {name}")
            if n_dims > MAX_DIMS:
                raise self.fail(f"tensor {name} claims {n_dims:,} dimensions (at most {MAX_DIMS})")
            dims = [self.uint(8, f"dimension {d} of tensor {name}") for d in range(n_dims)]
            kind = self.uint(4, f"the type of tensor {name}")
            offset = self.uint(8, f"the data offset of tensor {name}")
            if kind not in sizes:
                raise self.fail(f"tensor {name} has unknown type {kind}")
            block, type_size = sizes[kind]
            if block > 1 and (not dims or dims[0] % block):
                raise self.fail(f"tensor {name}'s first dimension ({dims[0] if dims else 'none'}) is not a multiple "
                                f"of its type's block of {block}")  # fmt: skip
            table.append((name, offset, math.prod(dims) * type_size // block))
        start = -(-self.at // alignment) * alignment  # the data section, aligned
        for name, offset, n_bytes in table:
            if offset % alignment:
                raise self.fail(f"the data offset {offset:,} of tensor {name} is not a multiple of the alignment "
                                f"{alignment}")  # fmt: skip
            if start + offset + n_bytes > self.size:
                raise self.fail(f"tensor {name}'s data (bytes {start + offset:,} to {start + offset + n_bytes:,}) "
                                f"runs past the end of the file ({self.size:,} bytes)")  # fmt: skip


@functools.cache
def reader_class() -> type:
    """gguf's GGUFReader with one-pass arrays (the class is made when gguf is first needed)."""
    from gguf.gguf_reader import GGUFReader  # the class itself, also while fast_reading() stands in for it

    value_type = gguf.GGUFValueType
    little = {t: np.dtype(d).newbyteorder("<") for t, d in GGUFReader.gguf_scalar_to_np.items()}
    length = np.dtype("<u8")

    class FastGGUFReader(GGUFReader):
        """GGUFReader whose arrays of strings and of scalars are parsed in one pass (little-endian files), of files
        `check_gguf` walked first (so no count or offset it meets lies about the file)."""

        def __init__(self, path: str | os.PathLike[str], mode: str = "r"):
            check_gguf(path)
            super().__init__(path, mode)

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list, list]:
            if raw_type != value_type.ARRAY or self.byte_order != "I" or sys.byteorder != "little":
                return super()._get_field_parts(orig_offs, raw_type)
            data = self.data.view(np.ndarray)  # plain views: a memmap view costs ~20x more to make
            item_type, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            kind, n, offs = value_type(int(item_type[0])), int(count[0]), orig_offs + 12
            parts: list = [item_type, count]
            types = [value_type.ARRAY, kind] if n else [value_type.ARRAY]  # gguf names the item type from item 0
            if kind == value_type.STRING:
                buffer = memoryview(data)
                for _ in range(n):
                    (size,) = struct.unpack_from("<Q", buffer, offs)
                    parts += (data[offs : offs + 8].view(length), data[offs + 8 : offs + 8 + size])
                    offs += 8 + size
                return offs - orig_offs, parts, list(range(3, 3 + 2 * n, 2)), types
            dtype = little.get(kind)
            if dtype is None:  # arrays of arrays: gguf's own walk
                return super()._get_field_parts(orig_offs, raw_type)
            flat = data[offs : offs + n * dtype.itemsize].view(dtype)
            parts += [flat[i : i + 1] for i in range(n)]
            return 12 + n * dtype.itemsize, parts, list(range(2, 2 + n)), types

    return FastGGUFReader


def open_gguf(path: str | Path, mode: str = "r") -> Any:
    """A reader of the GGUF file at `path` (inside `fast_reading()`, the one already opened for it)."""
    if _open is None or mode != "r":
        return reader_class()(path, mode)
    key = str(Path(path).resolve())
    if key not in _open:
        _open[key] = reader_class()(path, mode)
    return _open[key]


@contextmanager
def fast_reading() -> Iterator[None]:
    """While active, gguf's reader (as transformers imports it) is the fast one, each file is parsed once, and
    gguf's tensor-name table is built once per (architecture, layers)."""
    global _open
    if gguf is None or _open is not None:  # no gguf, or already inside (the readers are shared)
        yield
        return
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    _open = {}
    gguf.GGUFReader, gguf.get_tensor_name_map = open_gguf, functools.cache(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved
        _open = None
