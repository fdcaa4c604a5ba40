"""RFA (random feature attention) model configuration: the `config.json` of an rfa checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ...errors import fail

FEATURE_MAPS = ("gaussian", "arccos")
INT_FIELDS = ("vocab_size", "model_dim", "num_layers", "num_heads", "num_features", "ffn_hidden_dim")
FLOAT_FIELDS = ("norm_eps", "denominator_floor")
BOOL_FIELDS = ("gated", "tie_embeddings")


@dataclass(frozen=True)
class RFAConfig:
    """Architecture of an RFA language model (every field is required in config.json)."""

    vocab_size: int
    model_dim: int
    num_layers: int
    num_heads: int
    num_features: int
    feature_map: str
    gated: bool
    ffn_hidden_dim: int
    norm_eps: float
    denominator_floor: float
    tie_embeddings: bool

    @property
    def head_dim(self) -> int:
        """d = model_dim / num_heads."""
        return self.model_dim // self.num_heads

    @property
    def feature_dim(self) -> int:
        """Length of phi(x) per head: 2F for the gaussian map (sin and cos), F for arccos."""
        return 2 * self.num_features if self.feature_map == "gaussian" else self.num_features

    def to_dict(self) -> dict[str, Any]:
        """The architecture fields, as written in config.json."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> RFAConfig:
        """Parse and validate a config.json object (family and tokenizer are read by the caller)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known - {"family", "tokenizer"})
        if unknown:
            raise fail(f"{source}: unknown field(s) {', '.join(unknown)}", f"an rfa config has: {', '.join(known)}")
        missing = [f.name for f in fields(cls) if f.name not in raw]
        if missing:
            raise fail(f"{source}: missing field(s) {', '.join(missing)}", "write every field of the rfa format")
        config = cls(**{k: raw[k] for k in known})
        config.validate(source)
        return config

    def validate(self, source: str = "config") -> None:
        """Raise a one-line MegaevalError naming the first bad field."""
        for name in INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise fail(f"{source}: {name} must be a positive integer, got {value!r}")
        for name in FLOAT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise fail(f"{source}: {name} must be a positive number, got {value!r}")
        for name in BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise fail(f"{source}: {name} must be true or false, got {value!r}")
        if self.feature_map not in FEATURE_MAPS:
            raise fail(f"{source}: feature_map must be one of {', '.join(FEATURE_MAPS)}, got {self.feature_map!r}")
        if self.model_dim % self.num_heads:
            raise fail(
                f"{source}: model_dim {self.model_dim} is not divisible by num_heads {self.num_heads}",
                "the head dim is model_dim / num_heads",
            )
