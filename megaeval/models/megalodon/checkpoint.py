"""The official MEGALODON checkpoint layout: read it, merge model-parallel shards, validate, write.

A checkpoint directory holds
  config.json               {"model": {official ModelConf fields}, "tokenizer": {"path", "additional_vocab_size"}}
  consolidate_config.json   {"model_parallel_size": N, "dtype": "bf16" | "fp16" | "fp32"}
  consolidated.pth          when N == 1, else consolidated.00.pth ... consolidated.{N-1:02d}.pth
Files are read with models.weights.load_tensors (torch.load(weights_only=True)): a checkpoint can never run code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import fail
from ...tokenizers import SentencePieceTokenizer, tokenizer_option
from ..weights import check_state_dict as check_state_dict_of
from ..weights import load_tensors, place_tokenizer, refuse_integer_weights
from .config import ModelArgs

# Model-parallel shards are concatenated along these dims; None means replicated on every shard.
SHARD_RULES: list[tuple[str, int | None]] = [
    (r"embed\.weight", 1),
    (r"output\.output\.weight", 1),
    (r"rope\.freqs", None),
    (r"layers\.\d+\.mega\.(wv|wz|wr|wh1)\.(weight|bias)", 0),
    (r"layers\.\d+\.nffn\.(fc1|fc3)\.weight", 0),
    (r"layers\.\d+\.(mega\.wh2|nffn\.fc2)\.weight", 1),
    (r"layers\.\d+\.mega\.cema\.(alpha|delta|theta|gamma|omega)", 0),
    (r"(layers\.\d+\.mega\.timenorm|output\.final_norm)\.(weight|bias|prior_mean|prior_logv)", 0),
    (r"(layers\.\d+\.mega\.timenorm|output\.final_norm)\.prior_count", None),
    (r"layers\.\d+\.mega\.(gamma|beta)", 1),
    (r"layers\.\d+\.(mega\.rmsnorm|nffn\.norm)\.(weight|bias)", None),
    (r"layers\.\d+\.nffn\.alpha", None),
]
IGNORED_KEYS = {"rope.freqs"}  # recomputed from rope_base
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def shard_dim(key: str) -> int | None:
    """The dim along which `key` is split across model-parallel shards (None: replicated)."""
    for pattern, dim in SHARD_RULES:
        if re.fullmatch(pattern, key):
            return dim
    raise fail(f"unexpected key {key!r} in checkpoint shards", "it is not part of the MEGALODON layout")


@dataclass
class CheckpointInfo:
    """What the JSON files of a checkpoint directory say."""

    path: Path
    args: ModelArgs
    tokenizer_path: Path
    additional_vocab_size: int
    model_parallel_size: int
    stored_dtype: str
    raw_config: dict[str, Any]

    @property
    def weight_files(self) -> list[Path]:
        if self.model_parallel_size == 1:
            return [self.path / "consolidated.pth"]
        return [self.path / f"consolidated.{r:02d}.pth" for r in range(self.model_parallel_size)]


def is_checkpoint_dir(path: Path) -> bool:
    """True when `path` looks like an official MEGALODON checkpoint directory."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("model"), dict) and "cema_ndim" in config["model"]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise fail(
            f"missing {path.name} in {path.parent}",
            "an official MEGALODON checkpoint has config.json, consolidate_config.json and consolidated*.pth",
        )
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise fail(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise fail(f"{path} must hold a JSON object")
    return data


def read_info(path: str | Path, tokenizer: str | Path | None = None) -> CheckpointInfo:
    """Read and check config.json and consolidate_config.json of a checkpoint directory."""
    path = Path(path)
    if not path.is_dir():
        raise fail(f"checkpoint directory not found: {path}", "pass an existing MEGALODON checkpoint directory")
    config = _read_json(path / "config.json")
    consolidate = _read_json(path / "consolidate_config.json")
    if not isinstance(config.get("model"), dict):
        raise fail(f"{path / 'config.json'} has no 'model' section", "expected the official {model, tokenizer} config")
    tok_cfg, additional = _tokenizer_section(config, path / "config.json")
    tok_path = _resolve_tokenizer(path, tokenizer, tok_cfg.get("path"))
    model_cfg = dict(config["model"])
    if model_cfg.get("vocab_size", -1) == -1:  # old checkpoints leave it to the tokenizer, as the official loader
        model_cfg["vocab_size"] = SentencePieceTokenizer(tok_path, additional).vocab_size
    args = ModelArgs.from_dict(model_cfg, source=str(path / "config.json"))
    mp = consolidate.get("model_parallel_size")
    if not isinstance(mp, int) or mp < 1:
        raise fail(f"{path / 'consolidate_config.json'}: model_parallel_size must be a positive integer, got {mp!r}")
    stored = consolidate.get("dtype", "fp32")
    return CheckpointInfo(path, args, tok_path, additional, mp, str(stored), config)


def _tokenizer_section(config: dict[str, Any], file: Path) -> tuple[dict[str, Any], int]:
    """config.json's `tokenizer` object (absent or null: {}) and its additional_vocab_size, checked."""
    section = config.get("tokenizer")
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise fail(
            f'{file}: tokenizer must be an object like {{"path": "tokenizer.model"}}, got {section!r}',
            "write the official {path, additional_vocab_size} tokenizer section",
        )
    path = section.get("path")
    if path is not None and not isinstance(path, str):
        raise fail(f"{file}: tokenizer.path must be a string, got {path!r}", "write the path of the .model file")
    additional = section.get("additional_vocab_size", 0)
    if additional is None:
        additional = 0
    if not isinstance(additional, int) or isinstance(additional, bool) or additional < 0:
        raise fail(
            f"{file}: tokenizer.additional_vocab_size must be a non-negative integer, got {additional!r}",
            "write the number of extra token ids (0 if none)",
        )
    return section, additional


def _resolve_tokenizer(ckpt: Path, override: str | Path | None, configured: str | None) -> Path:
    if override is not None:
        candidates = [tokenizer_option(override, "MEGALODON", folder=False)]
    elif configured:
        p = Path(configured)
        candidates = [p if p.is_absolute() else ckpt / p, ckpt / p.name]  # also accept a copy beside the weights
    else:
        candidates = [ckpt / "tokenizer.model"]
    for c in candidates:
        if c.is_file():
            return c
    raise fail(f"tokenizer not found at {candidates[0]}", "pass --model-args tokenizer=PATH (a sentencepiece .model)")


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise fail(
            f"missing weights file {path}",
            "the checkpoint needs consolidated.pth (or one "
            "consolidated.NN.pth per model-parallel rank, as consolidate_config.json says)",
        )
    return load_tensors(path)


def load_state_dict(info: CheckpointInfo, floats: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """Read the weight file(s) and merge model-parallel shards into one state dict; a tensor stored as an integer
    where the model holds floats (`floats`) is refused in its shard, before merging could cast it."""
    shards = [_torch_load(p) for p in info.weight_files]
    for path, shard in zip(info.weight_files, shards, strict=True):
        refuse_integer_weights(shard, path, floats)
    if len(shards) == 1:
        return shards[0]
    keys = list(shards[0])
    for i, shard in enumerate(shards[1:], start=1):
        if set(shard) != set(keys):
            diff = sorted(set(shard) ^ set(keys))
            raise fail(f"shard {info.weight_files[i].name} has different keys than shard 00 ({', '.join(diff[:3])})")
    merged = {}
    for key in keys:
        dim = shard_dim(key)
        parts = [s[key] for s in shards]
        if dim is None:
            if any(p.shape != parts[0].shape or not torch.equal(p, parts[0]) for p in parts[1:]):
                raise fail(f"shards disagree on replicated key {key!r}", "the shards come from different checkpoints")
            merged[key] = parts[0]
        else:
            for i, part in enumerate(parts[1:], start=1):
                rest = [n for d, n in enumerate(part.shape) if d != dim]
                if part.dim() != parts[0].dim() or rest != [n for d, n in enumerate(parts[0].shape) if d != dim]:
                    raise fail(
                        f"shard {info.weight_files[i].name}: {key} has shape {list(part.shape)}, which does not fit "
                        f"shard {info.weight_files[0].name}'s {list(parts[0].shape)} (split along dim {dim})",
                        "the shards come from different checkpoints",
                    )
            merged[key] = torch.cat(parts, dim=dim)
    return merged


def check_state_dict(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], share_emb: bool) -> None:
    """Raise one error naming every missing key, unexpected key and shape mismatch (a tied output may be absent)."""
    given = {k: v for k, v in state.items() if k not in IGNORED_KEYS}
    optional = {"output.output.weight"} if share_emb else set()
    check_state_dict_of(given, expected, "the weights", optional)


def save_checkpoint(
    model: torch.nn.Module,
    out_dir: str | Path,
    tokenizer_path: str | Path,
    *,
    shards: int = 1,
    dtype: str = "fp32",
    additional_vocab_size: int = 0,
    copy_tokenizer: bool = True,
) -> Path:
    """Write `model` (a Megalodon) in the official layout, split into `shards` model-parallel files."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = place_tokenizer(out, tokenizer_path, copy_tokenizer)
    config = {
        "model": model.args.to_dict(),
        "tokenizer": {"path": str(tok), "additional_vocab_size": additional_vocab_size},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "consolidate_config.json").write_text(json.dumps({"model_parallel_size": shards, "dtype": dtype}) + "\n")
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    state = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in state.items()}
    if shards == 1:
        torch.save(state, out / "consolidated.pth")
        return out
    for rank in range(shards):
        part = {}
        for key, value in state.items():
            dim = shard_dim(key)
            if dim is None:
                part[key] = value.clone()
            else:
                if value.shape[dim] % shards:
                    raise fail(f"cannot split {key} {list(value.shape)} into {shards} shards along dim {dim}")
                part[key] = value.chunk(shards, dim=dim)[rank].clone()
        torch.save(part, out / f"consolidated.{rank:02d}.pth")
    return out
