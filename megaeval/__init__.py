"""megaeval: evaluate long-context language models (MEGALODON, Transformers, recurrent models)."""

from .errors import MegaevalError
from .models import StreamingLM, load_model

__version__ = "0.1.0"

__all__ = ["MegaevalError", "StreamingLM", "load_model", "__version__"]
