"""RFA (random feature attention, gated or not): the model, its checkpoint format, and its StreamingLM adapter."""

from ..registry import Family, family_defaults, register
from .adapter import RFALM, load, load_tokenizer
from .checkpoint import is_rfa_dir, save_checkpoint
from .config import FEATURE_MAPS, RFAConfig
from .model import RFAModel, RFAState

__all__ = [
    "RFALM",
    "load",
    "load_tokenizer",
    "is_rfa_dir",
    "save_checkpoint",
    "FEATURE_MAPS",
    "RFAConfig",
    "RFAModel",
    "RFAState",
]

register(Family("rfa", is_rfa_dir, load, load_tokenizer, family_defaults(load)))
