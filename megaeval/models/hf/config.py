"""What a Hugging Face model directory says, before anything is loaded: whether a path is one (or a GGUF file),
where its files are, whether it asks to run custom code, and its maximum context."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ...errors import MegaevalError, fail
from ..fields import ABSENT, field, positive_float, positive_int
from ..options import as_bool

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
# Fields that size or scale the forward pass, under the names common architectures give them, checked before
# transformers reads them (it takes 0 layers, a rope_theta of 0 or a negative size without a word). A null size is
# left to transformers, which derives some (head_dim, n_inner, num_key_value_heads) and refuses others.
SIZE_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "n_embd", "n_layer", "n_head", "n_inner", "d_model", "n_heads", "n_layers",
    "ffn_dim", "ffn_hidden_size", "original_max_position_embeddings", *CONTEXT_KEYS,
)  # fmt: skip
SCALE_FIELDS = (
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "rope_theta", "rotary_emb_base",
    "rope_parameters.rope_theta", "rope_parameters.factor", "rope_scaling.factor",
)  # fmt: skip
FRACTION_FIELDS = ("partial_rotary_factor", "rope_parameters.partial_rotary_factor", "rotary_pct")


def is_hf_dir(path: Path) -> bool:
    """A directory with a transformers config.json, or with a .gguf file."""
    if path.is_file():
        return path.suffix == ".gguf"
    try:
        config = json.loads((path / "config.json").read_text())
        return isinstance(config, dict) and ("model_type" in config or "architectures" in config)
    except (OSError, ValueError):
        return any(path.glob("*.gguf"))


def locate(path: Path, gguf_file: str | None) -> tuple[Path, str | None]:
    """The model directory and the GGUF file in it (None: a transformers directory), checked to exist."""
    if path.is_file() and path.suffix == ".gguf":
        _check_gguf(path)  # before transformers' own GGUF reader (config, tokenizer) meets it
        return path.parent, path.name
    if not path.is_dir():
        raise fail(f"model directory not found: {path}", "pass a local transformers model directory")
    if gguf_file is not None and not (path / gguf_file).is_file():
        raise fail(f"gguf_file {gguf_file} not found in {path}", f"files there: {', '.join(sorted(os.listdir(path)))}")
    if gguf_file is None and not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return path, ggufs[0]
        raise fail(f"{path} has no config.json", "pass --model-args gguf_file=NAME for a GGUF model")
    if gguf_file is None:
        _check_config(path / "config.json")
    else:
        _check_gguf(path / gguf_file)
    return path, gguf_file


def _check_config(config: Path) -> None:
    """config.json must hold a JSON object (transformers' own errors about it blame the tokenizer)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise fail(f"cannot read {config}: {' '.join(str(e).split())[:120]}", "re-save the model") from None
    if not isinstance(data, dict):
        raise fail(
            f"{config} holds a JSON {type(data).__name__}, not an object", "re-save the model with save_pretrained"
        )
    refuse_architecture(config.parent, data.get("model_type"))
    check_fields(data, str(config))


def check_fields(data: dict[str, Any], source: str) -> None:
    """The sizes and scales a transformers config.json gives: sizes (unless null) positive integers, scales
    positive numbers, fractions in (0, 1]."""
    for key in SIZE_FIELDS:
        if field(data, key, None) is not None:
            positive_int(data, key, source)
    for key in (*SCALE_FIELDS, *FRACTION_FIELDS):
        if field(data, key) is not ABSENT:
            positive_float(data, key, source, at_most=1.0 if key in FRACTION_FIELDS else math.inf)


def refuse_architecture(path: Path, model_type: Any) -> None:
    """A recurrent checkpoint belongs to the recurrent family; a hybrid or other non-Transformer one is refused."""
    from ..recurrent.config import ARCHITECTURES, REFUSED_TYPES, SUPPORTED  # at call time: recurrent imports hf

    if model_type in ARCHITECTURES:
        raise fail(f"{path} is a {model_type} model, which the hf family (a KV cache) does not stream",
                   f"load it as recurrent:{path} (or name the directory alone)")  # fmt: skip
    if model_type in REFUSED_TYPES:
        raise fail(f"{path} is a {model_type} model: megaeval does not stream this architecture exactly",
                   f"megaeval runs attention Transformers (hf) and {SUPPORTED} (recurrent)")  # fmt: skip


def _check_gguf(file: Path) -> None:
    """A GGUF file must be whole: its header, metadata and tensor table read back (a cut copy is named here)."""
    from .gguf_reading import gguf, open_gguf

    if gguf is None:
        raise fail("reading GGUF models needs the gguf package", "pip install 'megaeval[hf]'")
    try:
        open_gguf(file)  # check_gguf's walk first: each count, length and offset named when it does not fit
    except MegaevalError:
        raise
    except Exception as e:  # what gguf's reader raises for a file the walk let through
        raise fail(f"{file} is not a readable GGUF file ({' '.join(str(e).split())[:100]})",
                   "the file is damaged or truncated; copy it again") from None  # fmt: skip


def check_weights(path: Path, gguf_file: str | None, suffixes: tuple[str, ...]) -> None:
    """A transformers directory must hold weights beside its config.json."""
    if gguf_file is None and not any(p.suffix in suffixes for p in path.iterdir()):
        raise fail(f"{path} has config.json but no weights ({', '.join('*' + s for s in suffixes)})",
                   "copy the weight files beside config.json")  # fmt: skip


def refuse_remote_code(path: Path, trust_remote_code: bool) -> None:
    """Custom modelling/tokenizer code (an auto_map) runs only with explicit consent."""
    if as_bool("trust_remote_code", trust_remote_code):
        return
    for name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("auto_map"):
            raise fail(
                f"{path / name} asks to run custom code ({', '.join(sorted(config['auto_map']))})",
                "pass --model-args trust_remote_code=true only if you trust that code",
            )


def max_context_of(config: Any, path: Path, override: int | None) -> int:
    """The most tokens a state may hold: `override` (max_context=N) or what the model's config names."""
    max_context = override
    if max_context is None:
        max_context = next((getattr(config, k) for k in CONTEXT_KEYS if getattr(config, k, None)), None)
        if max_context is None:
            raise fail(f"{path}: the config names no maximum context", "pass --model-args max_context=N")
    if int(max_context) < 1:
        raise fail(f"max_context must be positive, got {max_context}")
    return int(max_context)
