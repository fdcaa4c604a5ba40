"""Checking loaded weights against the tensors a config expects, for every family."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..errors import fail


def _listed(items: list[str]) -> str:
    return ", ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")


def check_state_dict(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Size], source: str,
    optional: set[str] = frozenset(), floats_only: bool = False,
) -> None:  # fmt: skip
    """Raise one error naming every missing key, unexpected key, shape mismatch (and non-float tensor)."""
    missing = sorted(set(expected) - set(state) - set(optional))
    unexpected = sorted(set(state) - set(expected))
    shared = sorted(set(state) & set(expected))
    shapes = [f"{k} {list(state[k].shape)} vs {list(expected[k])}" for k in shared if state[k].shape != expected[k]]
    kinds = [f"{k} ({str(state[k].dtype).removeprefix('torch.')})" for k in shared
             if floats_only and not state[k].is_floating_point()]  # fmt: skip
    problems = []
    if missing:
        problems.append(f"missing keys {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_listed(unexpected)}")
    if shapes:
        problems.append(f"shape mismatch (checkpoint vs config) {_listed(shapes)}")
    if kinds:
        problems.append(f"non-float tensors {_listed(kinds)}")
    if problems:
        raise fail(f"{source} does not match config.json: " + "; ".join(problems),
                   "check that config.json belongs to these weights")  # fmt: skip


def place_tokenizer(out: Path, tokenizer_path: str | Path, copy: bool = True) -> Path:
    """The tokenizer path a new checkpoint in `out` records: relative when it sits (or is copied) beside the weights."""
    tok = Path(tokenizer_path)
    if tok.resolve().parent == out.resolve():
        return Path(tok.name)
    if copy:
        shutil.copyfile(tok, out / "tokenizer.model")
        return Path("tokenizer.model")
    return tok.resolve()
