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
from ..fields import field, flag, positive_float, positive_int

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
    """A mamba_ssm config.json (MambaConfig of state-spaces/mamba) as the transformers config of the same model.

    Every field is checked here under the name the file gives it (d_model, ssm_cfg.headdim, ...), so no refusal
    speaks of the transformers names the translation uses; absent fields take mamba_ssm's defaults."""
    ssm = raw.get("ssm_cfg")
    if ssm is not None and not isinstance(ssm, dict):
        raise fail(f"{source}: ssm_cfg must be an object, got {ssm!r}")
    ssm = ssm or {}
    if raw.get("attn_layer_idx") or raw.get("d_intermediate"):
        raise fail(f"{source}: a hybrid mamba_ssm model (attention layers or MLPs) is not supported",
                   f"the recurrent family runs pure {SUPPORTED} models")  # fmt: skip
    if raw.get("rms_norm", True) is not True:
        raise fail(f"{source}: rms_norm false (LayerNorm) is not supported", "only RMSNorm mamba_ssm models load")
    layer = ssm.get("layer", "Mamba1")
    if layer not in ("Mamba1", "Mamba2"):
        raise fail(f"{source}: ssm_cfg.layer {layer!r} is not supported",
                   "mamba_ssm layouts load for Mamba1 and Mamba2")  # fmt: skip
    vocab = positive_int(raw, "vocab_size", source, 50277)
    vocab += (-vocab) % positive_int(raw, "pad_vocab_size_multiple", source, 8)  # mamba_ssm pads the embedding rows
    hidden, expand = positive_int(raw, "d_model", source), positive_int(raw, "ssm_cfg.expand", source, 2)
    common = {
        "hidden_size": hidden, "num_hidden_layers": positive_int(raw, "n_layer", source), "vocab_size": vocab,
        "layer_norm_epsilon": positive_float(raw, "norm_epsilon", source, 1e-5),
        "residual_in_fp32": flag(raw, "residual_in_fp32", source, True),
        "tie_word_embeddings": flag(raw, "tie_embeddings", source, True),
        "conv_kernel": positive_int(raw, "ssm_cfg.d_conv", source, 4), "expand": expand,
        "use_bias": flag(raw, "ssm_cfg.bias", source, False),
        "use_conv_bias": flag(raw, "ssm_cfg.conv_bias", source, True),
    }  # fmt: skip
    if layer == "Mamba1":
        rank = ssm.get("dt_rank", "auto")
        return {"model_type": "mamba", **common, "state_size": positive_int(raw, "ssm_cfg.d_state", source, 16),
                "time_step_rank": rank if rank == "auto" else positive_int(raw, "ssm_cfg.dt_rank", source),
                "hidden_act": "silu"}  # fmt: skip
    head_dim, inner = positive_int(raw, "ssm_cfg.headdim", source, 64), expand * hidden
    if inner % head_dim:
        raise fail(f"{source}: ssm_cfg.expand * d_model ({inner}) is not divisible by ssm_cfg.headdim {head_dim}")
    groups = positive_int(raw, "ssm_cfg.ngroups", source, 1)
    if (inner // head_dim) % groups:
        raise fail(f"{source}: ssm_cfg.ngroups {groups} does not divide the {inner // head_dim} heads "
                   "(ssm_cfg.expand * d_model / ssm_cfg.headdim)")  # fmt: skip
    if flag(raw, "ssm_cfg.norm_before_gate", source, False) or not flag(raw, "ssm_cfg.rmsnorm", source, True):
        raise fail(f"{source}: only Mamba-2 with a gated RMSNorm after the gate (the default) is supported")
    return {"model_type": "mamba2", **common, "state_size": positive_int(raw, "ssm_cfg.d_state", source, 128),
            "head_dim": head_dim, "num_heads": inner // head_dim, "n_groups": groups,
            "time_step_limit": list(step_limit(raw, "ssm_cfg.dt_limit", source)), "hidden_act": "silu"}  # fmt: skip


def step_limit(raw: dict[str, Any], key: str, source: str) -> tuple[float, float]:
    """raw[key] (absent: no limit): the [low, high] range Mamba-2 clamps its time steps to, 0 <= low < high
    (transformers writes infinity to JSON as {"__float__": "Infinity"})."""
    limit = field(raw, key, (0.0, math.inf))
    if isinstance(limit, (list, tuple)):
        limit = [_json_float(v) for v in limit]
    if (not isinstance(limit, (list, tuple)) or len(limit) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in limit)
            or not 0 <= limit[0] < limit[1]):  # fmt: skip
        raise fail(f"{source}: {key} must be [low, high] with 0 <= low < high, got {limit!r}")
    return float(limit[0]), float(limit[1])


def _json_float(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"__float__"}:
        try:
            return float(value["__float__"])
        except (TypeError, ValueError):
            return value
    return value


def mamba_ssm_keys(state: dict[str, Any]) -> dict[str, Any]:
    """mamba_ssm tensor names as transformers names them (the embedding is the one that differs)."""
    rename = {"backbone.embedding.weight": "backbone.embeddings.weight"}
    return {rename.get(k, k): v for k, v in state.items()}
