"""Weights safety and checks for every family: the one list of pickle-based suffixes, the one safe torch.load (plain
tensors only: a checkpoint can never run code), the one-line reasons for unreadable files, and checking loaded
weights against the tensors a config expects.

Families that store weights as safetensors refuse pickle-based files by suffix (`pickled_files`); families that read
torch files read them with `load_tensors`; families whose loader is a library's (transformers) explain its errors
with `pickled_global` and `torch_load_reason`.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import torch

from ..errors import MegaevalError, fail

# Files torch.load (pickle) would read: never unpickled except with weights_only=True, which runs no code
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def pickled_files(folder: Path) -> list[str]:
    """Names of the pickle-based weight files in `folder`, sorted."""
    return sorted(p.name for p in Path(folder).iterdir() if p.suffix in PICKLE_SUFFIXES)


def pickled_global(error: BaseException) -> str | None:
    """The Python object a torch.load(weights_only=True) refused to unpickle (os.system, say), "a Python object"
    when the error names none, or None when `error` is not such a refusal."""
    text = str(error)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return found.group(1)
    return "a Python object" if "GLOBAL" in text else None


def torch_load_reason(error: BaseException, limit: int = 120) -> str:
    """The informative part of a torch.load error, on one line, cut at a word boundary."""
    text = str(error)
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)  # the reason under torch's boilerplate
    lines = [found.group(1)] if found else [line for line in text.splitlines() if line.strip()]
    if not lines:
        return "the file ends early" if isinstance(error, EOFError) else type(error).__name__
    reason = re.split(r"\.\s+(?=[A-Z])", " ".join(lines[0].split()), maxsplit=1)[0]  # its first sentence
    if len(reason) > limit:
        reason = reason[:limit].rsplit(" ", 1)[0].rstrip(".,;:") + " ..."
    return reason


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A flat state dict of tensors from a torch file (memory-mapped when it can be), read with
    torch.load(weights_only=True): pickled code is refused with one line, never run."""
    if path.stat().st_size == 0:
        raise fail(f"cannot read {path}: the file is empty (0 bytes)", "re-copy or re-save the file")
    try:
        with warnings.catch_warnings():  # torch warns (multi-line) about pickle protocols of foreign files
            warnings.simplefilter("ignore")
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except PermissionError as e:
        raise fail(f"cannot read {path} ({e.strerror or e})", "check the file's permissions") from None
    except Exception as e:
        raise load_error(str(path), e, "re-save the weights as a state dict of tensors", "corrupt or not a PyTorch "
                         "checkpoint") from None  # fmt: skip
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise fail(f"{path} is not a flat state dict of tensors", "save model.state_dict() as the official scripts do")
    return obj


def read_safetensors(file: Path, family: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (CPU), or one line: the package missing, or the file not safetensors."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise fail(f"{family} checkpoints need the safetensors package", "pip install safetensors") from None
    try:
        return load_file(str(file), device="cpu")
    except Exception as e:  # safetensors raises SafetensorError / OSError with multi-line messages
        reason = " ".join(str(e).split())[:160]
        raise fail(f"cannot read {file}: not a valid safetensors file ({reason})", "re-copy or re-save it") from None


def load_error(what: str, error: BaseException, convert: str, unreadable: str | None = None) -> MegaevalError:
    """One line for a failed torch.load of `what`: pickled code refused (`convert`: how to store tensors instead), or
    the file unreadable (`unreadable`: what it then is, before the reason)."""
    code = pickled_global(error)
    if code is not None:
        return fail(f"refusing to load {what}: it contains pickled code ({code}) that could run on load",
                    f"megaeval loads plain tensors only; {convert}")  # fmt: skip
    reason = torch_load_reason(error)
    return fail(f"cannot read {what}: {unreadable} ({reason})" if unreadable else f"cannot read {what} ({reason})",
                "re-copy or re-save the file")  # fmt: skip


def _listed(items: list[str]) -> str:
    return ", ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")


def check_state_dict(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Size], source: str,
    optional: set[str] = frozenset(), floats_only: bool = False,
) -> None:  # fmt: skip
    """Raise one error naming every missing key, unexpected key, shape mismatch (and non-float tensor)."""
    missing = sorted(set(expected) - set(state) - set(optional))
    unexpected = sorted(set(state) - set(expected))
    shared = sorted(set(state) & set(expected))
    shapes = [f"{k} {list(state[k].shape)} vs {list(expected[k])}" for k in shared if state[k].shape != expected[k]]
    kinds = [f"{k} ({str(state[k].dtype).removeprefix('torch.')})" for k in shared
             if floats_only and not state[k].is_floating_point()]  # fmt: skip
    problems = []
    if missing:
        problems.append(f"missing keys {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_listed(unexpected)}")
    if shapes:
        problems.append(f"shape mismatch (checkpoint vs config) {_listed(shapes)}")
    if kinds:
        problems.append(f"non-float tensors {_listed(kinds)}")
    if problems:
        raise fail(f"{source} does not match config.json: " + "; ".join(problems),
                   "check that config.json belongs to these weights")  # fmt: skip


def place_tokenizer(out: Path, tokenizer_path: str | Path, copy: bool = True) -> Path:
    """The tokenizer path a new checkpoint in `out` records: relative when it sits (or is copied) beside the weights."""
    tok = Path(tokenizer_path)
    if tok.resolve().parent == out.resolve():
        return Path(tok.name)
    if copy:
        shutil.copyfile(tok, out / "tokenizer.model")
        return Path("tokenizer.model")
    return tok.resolve()
