"""Reading GGUF files fast: the same fields as gguf's own reader, with the long metadata arrays (a tokenizer's
vocabulary and merges: 100K strings) parsed in one pass instead of one memory-mapped view per element.

transformers reads a GGUF file three times to load a model and its tokenizer (tokenizer, config, weights) and
rebuilds gguf's tensor-name table once per module of the model; with gguf's reader that took 15 of the 18 seconds
of loading SmolLM2-135M. Inside `fast_reading()` transformers gets this reader (one per file, shared by every read
of the load) and a memoized name table. It then converts exactly what it would have converted: the fields are
equal part for part (tested against gguf's reader on every value type).
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

try:
    import gguf
except ImportError:  # the hf extra is not installed: loading a GGUF file says so (models.hf.config)
    gguf = None  # type: ignore[assignment]

_open: dict[str, Any] | None = None  # path -> reader, while fast_reading() is active


@functools.cache
def reader_class() -> type:
    """gguf's GGUFReader with one-pass arrays (the class is made when gguf is first needed)."""
    from gguf.gguf_reader import GGUFReader  # the class itself, also while fast_reading() stands in for it

    value_type = gguf.GGUFValueType
    little = {t: np.dtype(d).newbyteorder("<") for t, d in GGUFReader.gguf_scalar_to_np.items()}
    length = np.dtype("<u8")

    class FastGGUFReader(GGUFReader):
        """GGUFReader whose arrays of strings and of scalars are parsed in one pass (little-endian files)."""

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
