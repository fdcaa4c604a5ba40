"""Sharded safetensors checkpoints written by hand, as save_pretrained writes them (shards and an index), so a test
can make them disagree: a tensor in two shards, an index that names the wrong shard, a shard the index does not list."""

from __future__ import annotations

import json
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"


def shard_names(count: int) -> list[str]:
    """save_pretrained's shard file names."""
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_shards(folder: Path, state: dict[str, torch.Tensor], count: int = 2,
                 extra: dict[int, dict[str, torch.Tensor]] | None = None,
                 weight_map: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """Replace `folder`'s model.safetensors with `state` split into `count` shards (keys in name order, dealt in
    turn) and an index; `extra[i]`: tensors shard i also holds, unlisted; `weight_map`: entries of the index
    changed (None: left out). Returns the weight map written."""
    from safetensors.torch import save_file

    names = shard_names(count)
    keys = sorted(state)
    where = {k: names[i % count] for i, k in enumerate(keys)}
    for i, name in enumerate(names):
        part = {k: state[k].contiguous() for k in keys if where[k] == name} | (extra or {}).get(i, {})
        save_file(part, str(folder / name), metadata={"format": "pt"})
    (folder / "model.safetensors").unlink(missing_ok=True)
    written = {k: v for k, v in {**where, **(weight_map or {})}.items() if v is not None}
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": written}, indent=1))
    return written
