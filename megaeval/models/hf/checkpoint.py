"""Reading a Hugging Face model's files with transformers, offline and quietly: the weights, the tokenizer, and the
checksum of the weight files. Pickle-based weights (.bin) are read with torch.load(weights_only=True) only, so no
code runs; a file that holds code is refused with one line (models.weights)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ...errors import MegaevalError, fail
from ...files import files_sha256
from ..weights import load_error as weights_load_error
from ..weights import pickled_files

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def transformers_module() -> Any:
    """transformers, imported when first needed (the `hf` extra; a second or more to import)."""
    try:
        import transformers
    except ImportError:
        raise fail("the hf model family needs transformers", "pip install 'megaeval[hf]'") from None
    return transformers


@contextmanager
def quiet(tf: Any) -> Iterator[None]:
    """Keep transformers' progress bars, log messages and warnings off the user's terminal while loading."""
    import huggingface_hub.utils as hub_utils

    logging = tf.utils.logging
    verbosity, bars, hub_bars = (
        logging.get_verbosity(), logging.is_progress_bar_enabled(), not hub_utils.are_progress_bars_disabled()
    )  # fmt: skip
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
        if not hub_bars:
            hub_utils.disable_progress_bars()


def load_error(path: Path, error: Exception) -> MegaevalError:
    """One line for an exception of from_pretrained."""
    text = str(error)
    if "trust_remote_code" in text:
        return fail(f"{path} needs custom code to load", "pass --model-args trust_remote_code=true if you trust it")
    if "GLOBAL" in text or "Weights only load failed" in text:
        pickled = ", ".join(pickled_files(path)) or "the weights"
        return weights_load_error(f"{pickled} in {path}", error, "convert the weights to safetensors")
    if "ignore_mismatched_sizes" in text or "size mismatch" in text:
        return fail(f"{path}: the weights' shapes differ from what config.json says (vocab_size, hidden_size, ...)",
                    "check that the weight files belong to this config.json")  # fmt: skip
    return fail(f"cannot load {path}: {' '.join(text.split())[:200] or type(error).__name__}")


def read_tokenizer(path: Path, gguf_file: str | None, trust_remote_code: bool) -> Any:
    """The transformers tokenizer of a located model directory (or GGUF file), offline."""
    tf = transformers_module()
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        with quiet(tf):
            return tf.AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:
        raise fail(f"cannot load the tokenizer of {path}: {' '.join(str(e).split())[:200]}") from None


def read_model(
    path: Path, dtype: torch.dtype, gguf_file: str | None, trust_remote_code: bool, attn_implementation: str | None
) -> Any:
    """The transformers causal LM of a located model directory (or GGUF file), every weight present."""
    tf = transformers_module()
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        with quiet(tf):  # pickled weights (.bin) are read with torch.load(weights_only=True): no code runs
            model, loading = tf.AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, trust_remote_code=trust_remote_code, weights_only=True,
                output_loading_info=True, **kwargs,
            )  # fmt: skip
    except Exception as e:  # transformers raises ValueError, OSError, UnpicklingError, RuntimeError, ...
        raise load_error(path, e) from None
    missing = sorted(loading.get("missing_keys") or [])
    if missing:  # transformers would fill them with random values; no number from such a model means anything
        shown = ", ".join(missing[:4]) + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
        raise fail(f"{path}: the weights lack {shown}", "check that the weight files belong to this config.json")
    return model


def weights_sha256(path: Path, gguf_file: str | None) -> str:
    """sha256 of the weight file, or of the weight files' checksums in name order."""
    files = (
        [path / gguf_file]
        if gguf_file is not None
        else sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    )
    return files_sha256(files)
