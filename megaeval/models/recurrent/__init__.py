"""Recurrent language models streamed exactly: Mamba (and FalconMamba), Mamba-2, RWKV-4 and RecurrentGemma, the
`recurrent` family. `hf:DIR` and a bare DIR of these architectures load here (routed by config.json's model_type).

The family's rooms: config.py (what a checkpoint says; routing by model_type; the mamba_ssm layout), checkpoint.py
(its files), scan.py (the linear recurrence every architecture runs, beside its token-loop reference), layers.py (the
carried causal conv and the logits they share), one module per architecture (mamba.py, mamba2.py, rwkv.py,
recurrent_gemma.py: config, state and model in plain PyTorch),
adapter.py (RecurrentLM), parallel.py (--chunk-parallel for Mamba and Mamba-2).
"""

from ..registry import Family, family_defaults, register
from .adapter import RecurrentLM, load, load_tokenizer
from .config import ARCHITECTURES, REFUSED_TYPES, SUPPORTED, is_recurrent_dir

__all__ = ["ARCHITECTURES", "REFUSED_TYPES", "SUPPORTED", "RecurrentLM", "is_recurrent_dir", "load", "load_tokenizer"]

register(
    Family(
        "recurrent",
        is_recurrent_dir,
        load,
        load_tokenizer,
        family_defaults(load),
        refines="hf",
        chunk_parallel=f"{__name__}.parallel:chunk_parallel_lm",
    )  # fmt: skip
)
