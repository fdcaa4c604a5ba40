"""What a recurrent checkpoint directory says before anything is loaded: which architecture it is (routing by
`model_type`), its config as transformers writes it, and the original `mamba_ssm` layout translated to that."""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import fail

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class Architecture:
    """One supported architecture: its module under models/recurrent, its config and model classes, its name."""

    module: str
    config_class: str
    model_class: str
    name: str

    def classes(self) -> tuple[Any, Any]:
        """(config class, model class), imported when first needed."""
        mod = importlib.import_module(f"{__package__}.{self.module}")
        return getattr(mod, self.config_class), getattr(mod, self.model_class)


# model_type (transformers' config.json) -> architecture: the one list of what the recurrent family runs
ARCHITECTURES = {
    "mamba": Architecture("mamba", "MambaConfig", "MambaModel", "Mamba"),
    "falcon_mamba": Architecture("mamba", "MambaConfig", "MambaModel", "FalconMamba"),
    "mamba2": Architecture("mamba2", "Mamba2Config", "Mamba2Model", "Mamba-2"),
    "rwkv": Architecture("rwkv", "RwkvConfig", "RwkvModel", "RWKV-4"),
    "recurrent_gemma": Architecture("recurrent_gemma", "RecurrentGemmaConfig", "RecurrentGemmaModel", "RecurrentGemma"),
}
SUPPORTED = "Mamba, FalconMamba, Mamba-2, RWKV-4 and RecurrentGemma"
# Hybrids and other non-Transformer architectures transformers loads as causal LMs: neither family streams them
# exactly (their states mix attention caches with recurrences megaeval does not implement), so they are refused.
REFUSED_TYPES = (
    "jamba", "bamba", "zamba", "zamba2", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2", "lfm2_vl",
    "qwen3_next", "plamo2", "xlstm", "minimax", "rwkv5", "rwkv6", "rwkv7",
)  # fmt: skip


def positive_int(raw: dict[str, Any], key: str, source: str, default: Any = None) -> int:
    """raw[key] (or `default` when absent), checked to be a positive integer."""
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fail(f"{source}: {key} must be a positive integer, got {value!r}")
    return value


def positive_float(raw: dict[str, Any], key: str, source: str, default: float) -> float:
    """raw[key] (or `default`), checked to be a positive finite number."""
    value = raw.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise fail(f"{source}: {key} must be a positive number, got {value!r}")
    return float(value)


def filled(raw: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """raw with each key of `defaults` set to its default where absent or null: the fields transformers derives
    (from hidden_size, say) only when not given; any value given, 0 included, is kept and checked."""
    return {**raw, **{k: v for k, v in defaults.items() if raw.get(k) is None}}


def flag(raw: dict[str, Any], key: str, source: str, default: bool) -> bool:
    """raw[key] (or `default`), checked to be true or false."""
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise fail(f"{source}: {key} must be true or false, got {value!r}")
    return value


def read_config(path: Path) -> dict[str, Any] | None:
    """config.json of a directory as a dict, or None when it has none or it is not a JSON object."""
    try:
        data = json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_mamba_ssm_config(raw: dict[str, Any]) -> bool:
    """The original state-spaces/mamba layout: d_model, n_layer and ssm_cfg, no model_type."""
    return "model_type" not in raw and {"d_model", "n_layer"} <= set(raw) and "ssm_cfg" in raw


def is_recurrent_dir(path: Path) -> bool:
    """A directory whose config.json names a supported recurrent model_type, or is in the mamba_ssm layout."""
    raw = read_config(path)
    return raw is not None and (raw.get("model_type") in ARCHITECTURES or is_mamba_ssm_config(raw))


def architecture_of(raw: dict[str, Any], source: str) -> Architecture:
    """The architecture a (translated) config names, or a one-line refusal."""
    kind = raw.get("model_type")
    if kind not in ARCHITECTURES:
        raise fail(f"{source}: model_type {kind!r} is not a recurrent architecture megaeval runs",
                   f"the recurrent family runs {SUPPORTED}")  # fmt: skip
    return ARCHITECTURES[kind]


def hf_config(path: Path) -> tuple[dict[str, Any], str]:
    """The transformers-style config of a recurrent checkpoint directory and its layout ("hf" or "mamba_ssm")."""
    file = Path(path) / CONFIG_FILE
    if not Path(path).is_dir():
        raise fail(f"checkpoint directory not found: {path}", "pass an existing model directory")
    if not file.is_file():
        raise fail(f"missing {CONFIG_FILE} in {path}", "a recurrent checkpoint has config.json beside its weights")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise fail(f"cannot read {file}: {' '.join(str(e).split())[:120]}", "re-save the model") from None
    if not isinstance(raw, dict):
        raise fail(f"{file} holds a JSON {type(raw).__name__}, not an object", "re-save the model")
    if is_mamba_ssm_config(raw):
        return from_mamba_ssm(raw, str(file)), "mamba_ssm"
    if raw.get("auto_map"):
        raise fail(f"{file} asks to run custom code ({', '.join(sorted(raw['auto_map']))})",
                   f"megaeval runs its own code for {SUPPORTED}; drop auto_map")  # fmt: skip
    architecture_of(raw, str(file))
    return raw, "hf"


def from_mamba_ssm(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """A mamba_ssm config.json (MambaConfig of state-spaces/mamba) as the transformers config of the same model."""
    ssm = raw.get("ssm_cfg") or {}
    if not isinstance(ssm, dict):
        raise fail(f"{source}: ssm_cfg must be an object, got {ssm!r}")
    if raw.get("attn_layer_idx") or raw.get("d_intermediate"):
        raise fail(f"{source}: a hybrid mamba_ssm model (attention layers or MLPs) is not supported",
                   f"the recurrent family runs pure {SUPPORTED} models")  # fmt: skip
    if raw.get("rms_norm", True) is not True:
        raise fail(f"{source}: rms_norm false (LayerNorm) is not supported", "only RMSNorm mamba_ssm models load")
    vocab, multiple = raw.get("vocab_size"), raw.get("pad_vocab_size_multiple", 1)
    if not isinstance(vocab, int) or not isinstance(multiple, int) or vocab < 1 or multiple < 1:
        raise fail(f"{source}: vocab_size and pad_vocab_size_multiple must be positive integers")
    vocab += (-vocab) % multiple  # mamba_ssm pads the embedding rows
    common = {
        "hidden_size": raw["d_model"], "num_hidden_layers": raw["n_layer"], "vocab_size": vocab,
        "layer_norm_epsilon": raw.get("norm_epsilon", 1e-5), "residual_in_fp32": raw.get("residual_in_fp32", True),
        "tie_word_embeddings": raw.get("tie_embeddings", True), "conv_kernel": ssm.get("d_conv", 4),
        "expand": ssm.get("expand", 2), "use_bias": ssm.get("bias", False),
        "use_conv_bias": ssm.get("conv_bias", True),
    }  # fmt: skip
    layer = ssm.get("layer", "Mamba1")
    if layer == "Mamba1":
        return {"model_type": "mamba", **common, "state_size": ssm.get("d_state", 16),
                "time_step_rank": ssm.get("dt_rank", "auto"), "hidden_act": "silu"}  # fmt: skip
    if layer == "Mamba2":
        head_dim = ssm.get("headdim", 64)
        inner = common["expand"] * common["hidden_size"]
        if inner % head_dim:
            raise fail(f"{source}: expand * d_model ({inner}) is not divisible by headdim {head_dim}")
        if ssm.get("norm_before_gate", False) or not ssm.get("rmsnorm", True):
            raise fail(f"{source}: only Mamba-2 with a gated RMSNorm after the gate (the default) is supported")
        return {"model_type": "mamba2", **common, "state_size": ssm.get("d_state", 128), "head_dim": head_dim,
                "num_heads": inner // head_dim, "n_groups": ssm.get("ngroups", 1),
                "chunk_size": ssm.get("chunk_size", 256),
                "time_step_limit": list(ssm.get("dt_limit", (0.0, float("inf")))), "hidden_act": "silu"}  # fmt: skip
    raise fail(f"{source}: ssm_cfg layer {layer!r} is not supported", "mamba_ssm layouts load for Mamba1 and Mamba2")


def mamba_ssm_keys(state: dict[str, Any]) -> dict[str, Any]:
    """mamba_ssm tensor names as transformers names them (the embedding is the one that differs)."""
    rename = {"backbone.embedding.weight": "backbone.embeddings.weight"}
    return {rename.get(k, k): v for k, v in state.items()}
