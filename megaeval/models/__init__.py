"""Model families behind the StreamingLM contract, and `load_model`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..errors import MegaevalError, fail
from ..serving.spec import is_served
from ..tokenizers import TOKENIZER_FILES, SentencePieceTokenizer, check_tokenizer
from .base import State, StreamingLM, Tokenizer
from .options import check_option_types, parse_model_args
from .registry import Family, chunk_parallel_lm, families, family_defaults, register, route

ASSETS = Path(__file__).resolve().parent.parent / "assets"  # the embedded models, one directory each
DEFAULT_MODEL = ASSETS / "megalodon-tiny"
FOLDER_HOLDS = {"megalodon": "config.json and consolidated*.pth"}  # what a family's checkpoint folder holds
EMBEDDED = "embedded"  # spec prefix: embedded:NAME is the model in ASSETS / NAME

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


def _family_list() -> str:
    return ", ".join(f + ":PATH" for f in families())


def embedded_models() -> list[str]:
    """Names of the models shipped with megaeval (spec `embedded:NAME`)."""
    return sorted(p.name for p in ASSETS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def parse_spec(spec: str | Path | None) -> tuple[str, Path]:
    """Split a model spec into (family, path). `None` means the embedded default model; `embedded:NAME`
    an embedded one (its family detected)."""
    if spec is None:
        return "megalodon", DEFAULT_MODEL
    text = str(spec)
    if is_served(text):
        raise fail(
            f"{text} is a served model: here a model is loaded in this process",
            "pass a checkpoint (DIR or FAMILY:PATH); a served model is the --model of an evaluation command",
        )
    if not text.strip():  # an unset shell variable, say: never silently the embedded default
        raise fail(f"empty model spec {text!r}", "pass --model with a checkpoint directory or FAMILY:PATH, or leave "
                   "--model out to use the embedded default")  # fmt: skip
    known = families()
    prefix, sep, rest = text.partition(":")
    if sep and prefix == EMBEDDED:
        names = embedded_models()
        if rest not in names:
            choices = ", ".join(f"{EMBEDDED}:{n}" for n in names)
            raise fail(f"unknown embedded model {rest!r}", f"use one of: {choices}")
        text, sep = str(ASSETS / rest), ""
    elif sep and prefix in known:
        path = Path(rest).expanduser()
        if path.is_file() and not (prefix == "hf" and path.suffix == ".gguf"):
            holds = FOLDER_HOLDS.get(prefix, "its config.json and weights")
            what = "a sentencepiece tokenizer file" if path.suffix == ".model" else "a file"
            raise fail(f"{text} is {what}, but a {prefix} checkpoint is a folder holding {holds}",
                       "pass the checkpoint folder" + (" (or a .gguf file)" if prefix == "hf" else ""))  # fmt: skip
        return route(path, prefix) or prefix, path
    path = Path(text).expanduser()
    if sep and not path.exists() and prefix.isidentifier():
        raise fail(f"unknown model family {prefix!r} in spec {text!r}",
                   f"use a checkpoint directory or one of: {_family_list()}")  # fmt: skip
    if not path.exists():
        raise fail(f"model not found: {text}", "pass a checkpoint directory (or FAMILY:PATH)")
    name = route(path)
    if name is not None:
        return name, path
    if lone_tokenizer(text) is not None:
        raise fail(f"{text} is a tokenizer without a model (no weights)",
                   "pass a checkpoint folder (or FAMILY:PATH); a tokenizer alone serves only where one is asked for, "
                   "as --tokenizer")  # fmt: skip
    config = path / "config.json"
    if config.is_file():
        try:
            json.loads(config.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise fail(f"{config} is not valid JSON ({e})") from None
    raise fail(f"cannot tell which model family {text} is", f"name the family: {_family_list()}")


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
    except (RuntimeError, TypeError):
        raise fail(f"unknown device {name!r}", "use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise fail(f"device {name} requested but CUDA is not available", "use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise fail(f"unsupported device {name!r}", "use cpu, cuda or cuda:N")
    return device


def _check_options(family: Family, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(family.options))
    if unknown:
        raise fail(f"unknown option(s) {', '.join(unknown)} for {family.name} models",
                   f"accepted: {', '.join(family.options)}")  # fmt: skip
    check_option_types(family.name, family.load, options)


def _checked_tokenizer(family: Family, tok: Tokenizer) -> Tokenizer:
    """`tok`, the tokenizer a family loaded, past the checks every family's tokenizer passes (megaeval.tokenizers)."""
    if "tokenizer" in family.options:
        fix = "pass --model-args tokenizer=PATH with the tokenizer the model was trained with"
    else:
        fix = "put the tokenizer files the model was trained with beside its weights"
    check_tokenizer(tok, fix)
    return tok


def load_model(
    spec: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    **options: Any,
) -> StreamingLM:
    """Load a model as a StreamingLM. `spec`: a checkpoint dir, FAMILY:PATH, or None for the default model."""
    name, path = parse_spec(spec)
    family = families()[name]
    _check_options(family, options)
    lm = family.load(path, device=parse_device(device), dtype=parse_dtype(dtype), **options)
    _checked_tokenizer(family, lm.tokenizer)
    return lm


def model_options(spec: str | Path | None, model_args: dict[str, Any], **flags: Any) -> dict[str, Any]:
    """--model-args plus options given as their own flags (None: not given), checked against the family.

    A flag the family does not take (e.g. --norm-stats for a Transformer) is an error unless it has
    the default value of the family that does take it.
    """
    if lone_tokenizer(spec) is not None and not any(v is not None for v in flags.values()):
        return dict(model_args)  # a tokenizer alone: `load_tokenizer` checks what it takes
    name, _ = parse_spec(spec)
    known = families()
    options = dict(model_args)
    for flag, value in flags.items():
        if value is None:
            continue
        if flag in known[name].options:
            if flag in options and options[flag] != value:
                raise fail(f"--{flag.replace('_', '-')} {value} contradicts --model-args {flag}={options[flag]}",
                           "give the option once")  # fmt: skip
            options[flag] = value
            continue
        owners = [f for f in known.values() if flag in f.options]
        if not owners or value != owners[0].options[flag]:
            takers = " and ".join(f.name for f in owners) or "no"
            raise fail(f"--{flag.replace('_', '-')} {value} applies to {takers} models, not {name}",
                       f"drop --{flag.replace('_', '-')}")  # fmt: skip
    return options


def load_tokenizer(spec: str | Path | None = None, **options: Any) -> Tokenizer:
    """The tokenizer of a model spec (same options as `load_model`), without loading the weights; or a tokenizer
    alone (`lone_tokenizer`). Callers name the flag that gave `spec` with `naming`."""
    alone = lone_tokenizer(spec)
    if alone is not None:
        tok = _load_alone(*alone, options)
        check_tokenizer(tok, "pass the tokenizer files the model was trained with")
        return tok
    name, path = parse_spec(spec)
    family = families()[name]
    _check_options(family, options)
    return _checked_tokenizer(family, family.load_tokenizer(path, **options))


def lone_tokenizer(spec: str | Path | None) -> tuple[str, Path] | None:
    """("hf", folder) for a transformers tokenizer folder without a model (tokenizer files, no config.json, no
    GGUF; as DIR or hf:DIR), ("sentencepiece", file) for a sentencepiece .model file (as FILE, megalodon:FILE or
    rfa:FILE); None for anything else."""
    if spec is None:
        return None
    prefix, sep, rest = str(spec).partition(":")
    path = Path(rest if sep and prefix in families() else str(spec)).expanduser()
    prefix = prefix if sep and prefix in families() else None
    if path.is_dir() and prefix in (None, "hf") and not (path / "config.json").exists():
        if not any(path.glob("*.gguf")) and any((path / name).is_file() for name in TOKENIZER_FILES):
            return "hf", path
    if path.is_file() and path.suffix == ".model" and prefix in (None, "megalodon", "rfa"):
        return "sentencepiece", path
    return None


def _load_alone(kind: str, path: Path, options: dict[str, Any]) -> Tokenizer:
    takes = ("trust_remote_code",) if kind == "hf" else ()
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise fail(f"option(s) {', '.join(unknown)} do not apply to a tokenizer without a model ({path})",
                   "leave them out" + (f" (a {kind} tokenizer takes {', '.join(takes)})" if takes else ""))  # fmt: skip
    if kind == "sentencepiece":
        return SentencePieceTokenizer(path)
    from .hf.adapter import HFTokenizer
    from .hf.checkpoint import read_tokenizer
    from .options import as_bool

    trust = as_bool("trust_remote_code", options.get("trust_remote_code", False))
    return HFTokenizer(read_tokenizer(path, None, trust, "pass a folder of transformers tokenizer files"), str(path))


@contextmanager
def naming(flag: str | None, spec: str | Path | None) -> Iterator[None]:
    """Refusals inside name `flag` (and the spec it was given) unless they already do."""
    try:
        yield
    except MegaevalError as e:
        if flag is None or str(e).startswith(flag):
            raise
        raise MegaevalError(f"{flag} {spec}: {e}") from None


__all__ = [
    "ASSETS", "DEFAULT_MODEL", "Family", "State", "StreamingLM", "Tokenizer", "chunk_parallel_lm", "embedded_models",
    "families", "family_defaults", "load_model",
    "load_tokenizer", "lone_tokenizer", "model_options", "naming", "parse_device", "parse_dtype", "parse_model_args",
    "parse_spec", "register",
]  # fmt: skip
