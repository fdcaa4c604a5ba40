"""MEGALODON: the model, its official checkpoint layout, and its StreamingLM adapter."""

from ..registry import Family, family_defaults, register
from .adapter import NORM_STATS, MegalodonLM, load, load_tokenizer
from .checkpoint import is_checkpoint_dir, save_checkpoint
from .config import ModelArgs
from .model import Megalodon, MegalodonState

__all__ = [
    "NORM_STATS",
    "MegalodonLM",
    "load",
    "is_checkpoint_dir",
    "save_checkpoint",
    "ModelArgs",
    "Megalodon",
    "MegalodonState",
]


def chunk_parallel(lm: MegalodonLM, chunk: object) -> object:
    """MEGALODON over a chunk-parallel group (megaeval.models.megalodon.parallel_lm)."""
    from .parallel_lm import ChunkParallelLM

    return ChunkParallelLM(lm, chunk)


register(Family("megalodon", is_checkpoint_dir, load, load_tokenizer, family_defaults(load), chunk_parallel))
