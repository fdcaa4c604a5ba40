"""Model families behind the StreamingLM contract, and `load_model`."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import fail
from . import hf
from .base import StreamingLM, Tokenizer
from .megalodon import adapter as megalodon_adapter
from .megalodon import is_checkpoint_dir as is_megalodon_dir
from .options import parse_model_args

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "assets" / "megalodon-tiny"

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


@dataclass(frozen=True)
class Family:
    """A model family: how to recognise its checkpoints and how to load them."""

    detect: Callable[[Path], bool]
    load: Callable[..., StreamingLM]
    load_tokenizer: Callable[..., Tokenizer]


FAMILIES: dict[str, Family] = {
    "megalodon": Family(
        detect=is_megalodon_dir, load=megalodon_adapter.load, load_tokenizer=megalodon_adapter.load_tokenizer
    ),
    "hf": Family(detect=hf.is_hf_dir, load=hf.load, load_tokenizer=hf.load_tokenizer),
}


def parse_spec(spec: str | Path | None) -> tuple[str, Path]:
    """Split a model spec into (family, path). `None` means the embedded default model."""
    if spec is None or str(spec) == "":
        return "megalodon", DEFAULT_MODEL
    text = str(spec)
    prefix, sep, rest = text.partition(":")
    if sep and prefix in FAMILIES:
        return prefix, Path(rest).expanduser()
    path = Path(text).expanduser()
    if sep and not path.exists() and prefix.isidentifier():
        raise fail(
            f"unknown model family {prefix!r} in spec {text!r}",
            f"use a checkpoint directory or one of: {', '.join(f + ':PATH' for f in FAMILIES)}",
        )
    if not path.exists():
        raise fail(f"model not found: {text}", "pass a checkpoint directory (or FAMILY:PATH)")
    for name, family in FAMILIES.items():
        if family.detect(path):
            return name, path
    config = path / "config.json"
    if config.is_file():
        try:
            json.loads(config.read_text())
        except ValueError as e:
            raise fail(f"{config} is not valid JSON ({e})") from None
    raise fail(
        f"cannot tell which model family {text} is",
        f"it is not an official MEGALODON checkpoint; name the family: {', '.join(f + ':PATH' for f in FAMILIES)}",
    )


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """torch dtype from a name such as 'float32' or 'bf16'."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise fail(f"unknown dtype {name!r}", "use float32, float64, bfloat16 or float16")
    return DTYPES[name]


def parse_device(name: str | torch.device) -> torch.device:
    """torch device, checked to exist."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise fail(f"unknown device {name!r}", "use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise fail(f"device {name} requested but CUDA is not available", "use --device cpu")
    return device


def _check_options(family: str, options: dict[str, Any]) -> None:
    accepted = [p for p in inspect.signature(FAMILIES[family].load).parameters if p not in ("path", "device", "dtype")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise fail(f"unknown option(s) {', '.join(unknown)} for {family} models", f"accepted: {', '.join(accepted)}")


def load_model(
    spec: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    **options: Any,
) -> StreamingLM:
    """Load a model as a StreamingLM. `spec`: a checkpoint dir, FAMILY:PATH, or None for the default model."""
    family, path = parse_spec(spec)
    _check_options(family, options)
    lm = FAMILIES[family].load(path, device=parse_device(device), dtype=parse_dtype(dtype), **options)
    lm.spec = f"{family}:{path}"
    return lm


def model_options(spec: str | Path | None, model_args: dict[str, Any], **flags: Any) -> dict[str, Any]:
    """--model-args plus family flags given on the command line (None: not given), checked against the family.

    `norm_stats` and `kernels` apply to MEGALODON only; a non-default value for another family is an error.
    """
    family, _ = parse_spec(spec)
    options = dict(model_args)
    accepted = inspect.signature(FAMILIES[family].load).parameters
    defaults = {"norm_stats": "cumulative", "kernels": "auto"}
    for name, value in flags.items():
        if value is None:
            continue
        if name in accepted:
            options[name] = value
        elif value != defaults.get(name):
            raise fail(f"--{name.replace('_', '-')} {value} applies to MEGALODON models only, not {family}")
    return options


def load_tokenizer(spec: str | Path | None = None, **options: Any) -> Tokenizer:
    """The tokenizer of a model spec (same options as `load_model`), without loading the weights."""
    family, path = parse_spec(spec)
    _check_options(family, options)
    return FAMILIES[family].load_tokenizer(path, **options)


__all__ = [
    "StreamingLM",
    "Tokenizer",
    "FAMILIES",
    "DEFAULT_MODEL",
    "load_model",
    "parse_spec",
    "parse_model_args",
    "parse_dtype",
    "parse_device",
]
