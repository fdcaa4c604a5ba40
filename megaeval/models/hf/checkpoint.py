"""Reading a Hugging Face model's files with transformers, offline and quietly: the weights, the tokenizer, and the
checksum of the weight files. Pickle-based weights (.bin) are read with torch.load(weights_only=True) only, so no
code runs; a file that holds code is refused with one line (models.weights)."""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ...errors import MegaevalError, fail
from ...files import files_sha256
from ...tokenizers import check_tokenizer_files
from ..weights import index_shards, locate_tensors, pickled_files, refuse_integer_weights, rename_keys, tensor_dtypes
from ..weights import load_error as weights_load_error

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
TOKENIZER_FIX = "copy the tokenizer files the model was trained with beside its config.json"
# The weight files transformers reads, in its order of preference: one file, else the shards its index names
READ_ORDER = (
    ("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json")
)  # fmt: skip


def transformers_module() -> Any:
    """transformers, imported when first needed (the `hf` extra; a second or more to import)."""
    try:
        import transformers
    except ImportError:
        raise fail("the hf model family needs transformers", "pip install 'megaeval[hf]'") from None
    return transformers


@contextmanager
def quiet(tf: Any, gguf: bool = False) -> Iterator[None]:
    """Keep transformers' progress bars (`gguf`: the GGUF conversion's too), log messages and warnings off the
    user's terminal while loading, and its log messages and deprecation warnings (a forward's) for the rest of the
    process. A user who sets TRANSFORMERS_VERBOSITY, transformers' own switch, sees all of them."""
    if os.environ.get("TRANSFORMERS_VERBOSITY"):
        yield
        return
    import huggingface_hub.utils as hub_utils

    logging = tf.utils.logging
    logging.set_verbosity_error()  # kept after loading: the model's calls log deprecation notices
    warnings.filterwarnings("ignore", message=r".*\bdeprecated\b", category=FutureWarning)
    bars, hub_bars = logging.is_progress_bar_enabled(), not hub_utils.are_progress_bars_disabled()
    logging.disable_progress_bar()
    # transformers draws the GGUF conversion's bar with tqdm itself, whatever its progress-bar switch says
    converting = importlib.import_module("transformers.modeling_gguf_pytorch_utils") if gguf else None
    bar = getattr(converting, "tqdm", None)
    if bar is not None:
        converting.tqdm = functools.partial(bar, disable=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if bar is not None:
            converting.tqdm = bar
        if bars:
            logging.enable_progress_bar()
        if not hub_bars:
            hub_utils.disable_progress_bars()


def config_error(path: Path, error: Exception) -> MegaevalError | None:
    """One line for transformers' own check of a config.json field (it checks the config while loading a tokenizer
    too), naming the file; None for any other error."""
    if not any(k.__name__ == "StrictDataclassError" for k in type(error).__mro__):
        return None
    reason = " ".join(str(error).split())[:200]
    return fail(f"{path / 'config.json'} fails transformers' check: {reason}", "correct that field of config.json")


def load_error(path: Path, error: Exception) -> MegaevalError:
    """One line for an exception of from_pretrained."""
    refused = config_error(path, error)
    if refused is not None:
        return refused
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


def read_tokenizer(path: Path, gguf_file: str | None, trust_remote_code: bool, fix: str = TOKENIZER_FIX) -> Any:
    """The transformers tokenizer of a located model directory (or GGUF file), offline; `fix`: what to do when the
    directory holds none."""
    tf = transformers_module()
    if gguf_file is None:
        check_tokenizer_files(path, fix)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        with quiet(tf, gguf_file is not None):
            return tf.AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:
        refused = config_error(path, e)
        if refused is not None:
            raise refused from None
        raise fail(f"cannot load the tokenizer of {path}: {' '.join(str(e).split())[:200]}", fix) from None


def read_model(
    path: Path, dtype: torch.dtype, gguf_file: str | None, trust_remote_code: bool, attn_implementation: str | None
) -> Any:
    """The transformers causal LM of a located model directory (or GGUF file), every weight present."""
    tf = transformers_module()
    dtypes, origin = weight_table(path) if gguf_file is None else ({}, {})
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        # pickled weights (.bin) are read with torch.load(weights_only=True): no code runs
        with quiet(tf, gguf_file is not None):
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
    check_loaded(model, dtypes, origin)
    return model


def weight_table(path: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """The tensors transformers will read from a model directory (name -> dtype name, name -> file), from headers
    where it can; one line for a tensor in two files or shards that disagree with their index (models.weights)."""
    for single, index in READ_ORDER:
        if (path / single).is_file():
            files, index_file = [path / single], None
            break
        if (path / index).is_file():
            files, index_file = index_shards(path / index), path / index
            break
    else:
        return {}, {}  # no weights transformers reads: its own error says so
    tables = {f: tensor_dtypes(f, "hf") for f in files}
    origin = locate_tensors(tables, index_file)
    return {k: v for table in tables.values() for k, v in table.items()}, origin


def loaded_name(model: Any) -> Callable[[str], str]:
    """The parameter name transformers loads a checkpoint tensor as: its renamings (legacy LayerNorm.gamma, ...) and
    the base-model prefix added or dropped. A tensor a converter merges with others (MoE experts, fused projections)
    keeps its name: several sources per target is what converters are for."""
    meta, prefix = model.state_dict(), getattr(model, "base_model_prefix", "") or ""

    def by_prefix(key: str) -> str:  # transformers without conversion mappings (4.x) only moves the prefix
        if prefix and key.startswith(prefix + ".") and key[len(prefix) + 1 :] in meta:
            return key[len(prefix) + 1 :]
        return f"{prefix}.{key}" if prefix and f"{prefix}.{key}" in meta else key

    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(model)
    except Exception:
        return by_prefix
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]

    def rename(key: str) -> str:
        target, converted = rename_source_key(key, renamings, converters, prefix or None, meta)
        return key if converted is not None else target

    return rename


def check_loaded(model: Any, dtypes: dict[str, str], origin: dict[str, Path]) -> None:
    """Refuse what transformers loads without a word: two checkpoint tensors that load as one parameter (one silently
    wins), and, without a quantization_config, integer tensors cast into floating-point parameters."""
    if not dtypes:
        return
    rename = loaded_name(model)
    loaded = rename_keys(dtypes, rename, origin)
    if getattr(model.config, "quantization_config", None):
        return
    floats = {n for n, p in model.named_parameters() if p.is_floating_point()}
    where = {rename(k): f for k, f in origin.items()}
    refuse_integer_weights(loaded, where, floats, "config.json names no quantization_config")


def weights_sha256(path: Path, gguf_file: str | None) -> str:
    """sha256 of the weight file, or of the weight files' checksums in name order."""
    files = (
        [path / gguf_file]
        if gguf_file is not None
        else sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    )
    return files_sha256(files)
