"""MEGALODON model arguments, under the official ModelConf field names."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from ...errors import fail

# Fields of the official ModelConf that only matter for training; accepted and ignored here.
TRAINING_ONLY = {
    "efficient_attn",
    "init_mode",
    "dropout",
    "hidden_dropout",
    "attention_dropout",
    "layerwise_ckpt",
    "custom_bwd",
    "loss_parallel",
}


@dataclass(frozen=True)
class ModelArgs:
    """Architecture of a MEGALODON model (defaults are the official ModelConf defaults)."""

    num_layers: int = 8
    model_dim: int = 1024
    z_dim: int = 256
    value_dim: int = 2048
    num_heads: int = 1
    ffn_hidden_dim: int = 2048
    cema_ndim: int = 16
    chunk_size: int = 2048
    vocab_size: int = -1
    output_size: int = -1  # -1: same as vocab_size
    norm_num_groups: int = 32
    norm_affine: bool = True
    norm_eps: float = 1e-5
    rope_base: float | None = None  # None: 10000
    swiglu: bool = False
    rescale_nffn: bool = False
    scale_emb: bool = False
    share_emb: bool = False

    @property
    def out_size(self) -> int:
        """Size of the output layer."""
        return self.vocab_size if self.output_size == -1 else self.output_size

    @property
    def z_head_dim(self) -> int:
        return self.z_dim // self.num_heads

    @property
    def v_head_dim(self) -> int:
        return self.value_dim // self.num_heads

    def flops_per_token(self, context_length: int | None = None) -> float:
        """Matmul FLOPs of the forward pass per token, 2 per multiply-add (the model FLOPs of MFU).

        Per layer: the projections v, z, r (model_dim D to value_dim E, z_dim Z, E), h (D to D and E to D) and
        the feed-forward (D to ffn_hidden_dim F and back, SwiGLU adding a second D to F), so
        2 (D E + D Z + D E + D D + E D + D F (3 with SwiGLU, else 2)); and causal attention within chunks: a token
        meets k keys, each costing Z multiply-adds for QK^T and E for PV (summed over heads), so 2 k (Z + E).
        Then the output layer, 2 D out_size. k is averaged over a fresh-state pass of `context_length` tokens
        (whole chunks, and a partial last one): (chunk_size + 1) / 2 when the length is a multiple of the chunk,
        as for None. Not counted: CEMA, norms, softmax, the embedding lookup, elementwise work, attention
        positions masked out (causal half) and the official-window mode's recomputation of norm statistics.
        """
        D, Z, E, F = self.model_dim, self.z_dim, self.value_dim, self.ffn_hidden_dim
        projections = D * E + D * Z + D * E + D * D + E * D + D * F * (3 if self.swiglu else 2)
        keys = chunked_keys_per_token(self.chunk_size, context_length)
        return self.num_layers * 2 * (projections + keys * (Z + E)) + 2 * D * self.out_size

    def to_dict(self) -> dict[str, Any]:
        """Plain dict under the official field names."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelArgs:
        """Parse the `model` section of an official config.json, rejecting unknown fields."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known - TRAINING_ONLY)
        if unknown:
            raise fail(
                f"{source}: unknown model field(s) {', '.join(unknown)}",
                "megaeval reads the official MEGALODON ModelConf fields only",
            )
        args = cls(**{k: v for k, v in raw.items() if k in known})
        args.validate(source)
        return args

    def validate(self, source: str = "config") -> None:
        """Raise a MegaevalError naming the first inconsistent field."""
        for name in POSITIVE_INTS:
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise fail(f"{source}: model.{name} must be a positive integer, got {value!r}")
        if not _is_int(self.output_size) or not (self.output_size == -1 or self.output_size > 0):
            raise fail(f"{source}: model.output_size must be -1 or a positive integer, got {self.output_size!r}")
        for name, value in (("norm_eps", self.norm_eps), ("rope_base", self.rope_base)):
            if value is None and name == "rope_base":
                continue
            if not _is_number(value) or not 0 < value < math.inf:
                raise fail(f"{source}: model.{name} must be a positive number, got {value!r}")
        for name in BOOLS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise fail(f"{source}: model.{name} must be true or false, got {value!r}")
        checks = [
            (self.z_dim % self.num_heads == 0, "z_dim must be divisible by num_heads"),
            (self.value_dim % self.num_heads == 0, "value_dim must be divisible by num_heads"),
            (self.z_head_dim % 2 == 0, "z_dim / num_heads must be even (rotary embedding)"),
            (self.model_dim % self.norm_num_groups == 0, "model_dim must be divisible by norm_num_groups"),
            (not self.share_emb or self.out_size == self.vocab_size, "share_emb needs output_size == vocab_size"),
        ]
        for ok, message in checks:
            if not ok:
                raise fail(f"{source}: {message}")


POSITIVE_INTS = (
    "num_layers",
    "model_dim",
    "z_dim",
    "value_dim",
    "num_heads",
    "ffn_hidden_dim",
    "cema_ndim",
    "chunk_size",
    "norm_num_groups",
    "vocab_size",
)
BOOLS = ("norm_affine", "swiglu", "rescale_nffn", "scale_emb", "share_emb")


def chunked_keys_per_token(chunk: int, length: int | None = None) -> float:
    """Keys a token attends to under causal attention within chunks, averaged over a pass of `length` tokens from
    a chunk boundary (None: whole chunks, (chunk + 1) / 2)."""
    if length is None:
        return (chunk + 1) / 2
    if length <= 0:
        raise ValueError(f"context length must be positive, got {length}")
    whole, rest = divmod(length, chunk)
    return (whole * chunk * (chunk + 1) / 2 + rest * (rest + 1) / 2) / length


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
