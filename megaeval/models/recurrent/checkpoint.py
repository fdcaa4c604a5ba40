"""A recurrent checkpoint's files: its weights (safetensors, sharded or not, or torch files read with
weights_only), checked against the model the config describes, its tokenizer, and writing one (tests, tiny models).

Layouts: what transformers' save_pretrained writes (config.json with model_type, model.safetensors or shards with
model.safetensors.index.json, or pytorch_model.bin; tokenizer files beside them), and the original mamba_ssm one
(config.json with d_model/n_layer/ssm_cfg, pytorch_model.bin; its tokenizer is passed as tokenizer=DIR).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...errors import fail
from ...files import files_sha256
from ..weights import check_state_dict, index_shards, pickled_files, read_weights, refuse_integer_weights, rename_keys
from .config import mamba_ssm_keys

INDEX_FILE = "model.safetensors.index.json"
TORCH_FILES = ("pytorch_model.bin", "model.pt", "model.pth")


def weight_files(path: Path) -> list[Path]:
    """The files holding a checkpoint's tensors: safetensors first (one file or the shards an index names),
    else one torch file (read with weights_only=True). One-line error when there are none."""
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / INDEX_FILE
    if index.is_file():
        return index_shards(index)
    shards = sorted(path.glob("*.safetensors"))
    if shards:
        return shards
    for name in TORCH_FILES:
        if (path / name).is_file():
            return [path / name]
    pickled = pickled_files(path)
    if pickled:
        return [path / pickled[0]]
    raise fail(f"{path} has config.json but no weights (model.safetensors, shards, or pytorch_model.bin)",
               "copy the weight files beside config.json")  # fmt: skip


def read_tensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Every tensor of the weight files (CPU) and the file each came from, no tensor in two files and shards as
    their index says; torch files are read with weights_only=True, so no code runs."""
    index = files[0].parent / INDEX_FILE
    sharded = index.is_file() and files[0].name != "model.safetensors"  # model.safetensors wins over an index
    return read_weights(files, "recurrent", index if sharded else None)


def _mamba_ssm_name(key: str) -> str:
    """One mamba_ssm tensor name as transformers names it (config's renaming, applied to that key alone)."""
    return next(iter(mamba_ssm_keys({key: None})))


def load_weights(model: torch.nn.Module, path: Path, layout: str, dtype: torch.dtype, device: torch.device) -> str:
    """Fill `model` (built on the meta device) with the checkpoint's tensors, checked key by key and shape by shape
    in one error; returns the stored dtype ("mixed" when they differ)."""
    files = weight_files(path)
    state, origin = read_tensors(files)
    source = files[0].name if len(files) == 1 else f"the {len(files)} shards in {path}"
    if layout == "mamba_ssm":
        origin = {_mamba_ssm_name(k): f for k, f in origin.items()}
        state = rename_keys(state, _mamba_ssm_name, str(files[0]) if len(files) == 1 else source)
    tied = dict(getattr(model, "TIED_KEYS", {})) if getattr(model.config, "tie_word_embeddings", False) else {}
    meta = model.state_dict()
    expected = {k: v.shape for k, v in meta.items()}
    refuse_integer_weights(state, origin, {k for k, v in meta.items() if v.is_floating_point()})
    check_state_dict(state, expected, source, optional=set(tied), floats_only=True)
    stored = {str(t.dtype).removeprefix("torch.") for t in state.values()}
    for key in tied:
        state.pop(key, None)  # tied: the output layer is the embedding (a stored copy is the same tensor)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=False, assign=True)
    _tie(model, tied)
    left = [n for n, p in model.named_parameters() if p.is_meta] + [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise fail(f"{path}: the weights lack {', '.join(left[:4])}", "check that the weights belong to config.json")
    return stored.pop() if len(stored) == 1 else "mixed"


def _tie(model: torch.nn.Module, tied: dict[str, str]) -> None:
    """Point each tied output weight at the embedding Parameter it shares."""
    for key, source_key in tied.items():
        owner_name, _, name = key.rpartition(".")
        src_owner, _, src_name = source_key.rpartition(".")
        owner = model.get_submodule(owner_name)
        setattr(owner, name, getattr(model.get_submodule(src_owner), src_name))


def weights_sha256(path: Path) -> str:
    """sha256 of the weight file, or of the weight files' checksums in name order."""
    return files_sha256(weight_files(path))


def save_checkpoint(model: torch.nn.Module, out: Path, tokenizer: Any, hf_config: dict[str, Any]) -> Path:
    """Write `model` as transformers would (config.json with model_type, model.safetensors without tied copies) and
    a transformers tokenizer beside it."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tied = set(getattr(model, "TIED_KEYS", {})) if hf_config.get("tie_word_embeddings") else set()
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    tokenizer.save_pretrained(out)
    return out
