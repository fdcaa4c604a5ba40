"""Model families register themselves here: how to recognise a checkpoint, load it, and which options it takes."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import fail

# The families that ship with megaeval; each module calls `register` when imported.
BUILTIN_FAMILIES = (
    "megaeval.models.megalodon", "megaeval.models.hf", "megaeval.models.rfa", "megaeval.models.recurrent",
)  # fmt: skip


@dataclass(frozen=True)
class Family:
    """A model family: its name, how to recognise and load its checkpoints, and its options with defaults."""

    name: str
    detect: Callable[[Path], bool]
    load: Callable[..., Any]  # (path, device, dtype, **options) -> StreamingLM
    load_tokenizer: Callable[..., Any]  # (path, **options) -> Tokenizer
    options: dict[str, Any] = field(default_factory=dict)  # every option it accepts, with its default
    # (lm, chunk group) -> a StreamingLM whose calls are collective over the group (--chunk-parallel P), or its
    # "module:name" when importing it is costly (imported when a model is first spread); None: the family cannot
    # share one sequence between ranks
    chunk_parallel: Callable[[Any, Any], Any] | str | None = None
    # a family whose `detect` also accepts this one's checkpoints: they load here, named either way (a Mamba
    # checkpoint is a transformers directory, but `hf:DIR` and a bare DIR of it load as a recurrent model)
    refines: str | None = None


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make a family loadable by name (FAMILY:PATH) and by detection of its checkpoint directories."""
    _FAMILIES[family.name] = family
    return family


def chunk_parallel_lm(lm: Any, chunk: Any) -> Any:
    """`lm` spread over the ranks of chunk-parallel group `chunk` (every call collective over the group), or a
    one-line refusal for a family that cannot share a sequence between ranks."""
    able = sorted(name for name, f in families().items() if f.chunk_parallel is not None)
    family = _FAMILIES.get(getattr(lm, "family", ""))
    if family is None or family.chunk_parallel is None:
        names = ", ".join(able[:-1]) + " and " + able[-1] if len(able) > 1 else "".join(able)
        raise fail(f"--chunk-parallel runs {names} models only, not {getattr(lm, 'family', lm)}",
                   "use --chunk-parallel 1")  # fmt: skip
    spread = family.chunk_parallel
    if isinstance(spread, str):
        module, _, name = spread.partition(":")
        spread = getattr(importlib.import_module(module), name)
    return spread(lm, chunk)


def route(path: Path, named: str | None = None) -> str | None:
    """The family that loads checkpoint `path`: the one that refines `named` and detects it, else `named`; with no
    name, the family that detects it (one that refines another detecting family wins), else None."""
    known = families()
    hits = [name for name, f in known.items() if f.detect(path)] if named is None else [named]
    for hit in hits:
        refined = [n for n, f in known.items() if f.refines == hit and n != hit and f.detect(path)]
        if refined:
            return refined[0]
    return hits[0] if hits else None


def families() -> dict[str, Family]:
    """Every registered family, by name (the built-in ones are imported on first use)."""
    for module in BUILTIN_FAMILIES:
        importlib.import_module(module)
    return dict(_FAMILIES)


def family_defaults(load: Callable[..., Any]) -> dict[str, Any]:
    """The keyword-only options of a family's `load` with their defaults: the one list of its options."""
    params = inspect.signature(load).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
