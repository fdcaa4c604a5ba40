"""The rfa checkpoint directory: read and check it, load its weights (safetensors only), write it.

A checkpoint directory holds
  config.json         {"family": "rfa", architecture fields (RFAConfig), "tokenizer": path relative to the dir}
  model.safetensors   the tensors, named as in RFAModel.state_dict() (output.weight absent when tied)
  tokenizer.model     the sentencepiece model (or wherever config.json's tokenizer points)
Weights are read with safetensors only: pickle-based files (models.weights.PICKLE_SUFFIXES) are never opened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import fail
from ...tokenizers import tokenizer_option
from ..weights import check_state_dict as check_state_dict_of
from ..weights import pickled_files, place_tokenizer, read_safetensors
from .config import RFAConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class CheckpointInfo:
    """What config.json of an rfa checkpoint says."""

    path: Path
    config: RFAConfig
    tokenizer_path: Path
    raw_config: dict[str, Any]

    @property
    def weights_path(self) -> Path:
        return self.path / WEIGHTS_FILE


def is_rfa_dir(path: Path) -> bool:
    """A directory whose config.json has "family": "rfa"."""
    try:
        config = json.loads((Path(path) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("family") == "rfa"


def read_info(path: str | Path, tokenizer: str | Path | None = None) -> CheckpointInfo:
    """Read and validate config.json; locate the tokenizer (an explicit `tokenizer` wins)."""
    path = Path(path)
    if not path.is_dir():
        raise fail(f"checkpoint directory not found: {path}", "pass an existing rfa checkpoint directory")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise fail(f"missing {CONFIG_FILE} in {path}", "an rfa checkpoint has config.json and model.safetensors")
    try:
        raw = json.loads(file.read_text())
    except ValueError as e:
        raise fail(f"{file} is not valid JSON ({' '.join(str(e).split())})") from None
    if not isinstance(raw, dict):
        raise fail(f"{file} must hold a JSON object")
    if raw.get("family") != "rfa":
        raise fail(f'{file}: family must be "rfa", got {raw.get("family")!r}')
    config = RFAConfig.from_dict(raw, source=str(file))
    configured = raw.get("tokenizer")
    if tokenizer is None and (not isinstance(configured, str) or not configured):
        raise fail(f"{file}: tokenizer must be a path (relative to the directory), got {configured!r}")
    tok = tokenizer_option(tokenizer, "rfa", folder=False) if tokenizer is not None else path / configured
    if not tok.is_file():
        raise fail(f"tokenizer not found at {tok}", "pass --model-args tokenizer=PATH (a sentencepiece .model)")
    return CheckpointInfo(path, config, tok, raw)


def load_weights(info: CheckpointInfo) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors (CPU). Never unpickles anything."""
    file = info.weights_path
    if not file.is_file():
        pickled = pickled_files(info.path)
        if pickled:
            raise fail(
                f"missing {WEIGHTS_FILE} in {info.path}; refusing to load {', '.join(pickled)} (pickle can run code)",
                "convert the weights to safetensors (safetensors.torch.save_file)",
            )
        raise fail(f"missing {WEIGHTS_FILE} in {info.path}", "an rfa checkpoint stores its weights as safetensors")
    return read_safetensors(file, "rfa")


def check_state_dict(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], source: str) -> None:
    """Raise one error naming every missing key, unexpected key, shape mismatch and non-float tensor."""
    check_state_dict_of(state, expected, source, floats_only=True)


def stored_dtype(state: dict[str, torch.Tensor]) -> str:
    """The dtype the weights are stored in ("mixed" when they differ)."""
    names = {DTYPE_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch.")) for t in state.values()}
    return names.pop() if len(names) == 1 else "mixed"


def save_checkpoint(
    model: torch.nn.Module,
    out_dir: str | Path,
    tokenizer_path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    copy_tokenizer: bool = True,
) -> Path:
    """Write `model` (an RFAModel) as an rfa checkpoint directory; `dtype`: stored dtype (default: the model's)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = place_tokenizer(out, tokenizer_path, copy_tokenizer)
    config = {"family": "rfa", **model.config.to_dict(), "tokenizer": str(tok)}
    state = {k: v.detach().to("cpu", dtype or v.dtype).contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out
