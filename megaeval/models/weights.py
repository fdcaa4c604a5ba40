"""Weights safety and checks for every family: the one list of pickle-based suffixes, the one safe torch.load (plain
tensors only: a checkpoint can never run code), the one-line reasons for unreadable files, and checking loaded
weights against the tensors a config expects.

Families that store weights as safetensors refuse pickle-based files by suffix (`pickled_files`); families that read
torch files read them with `load_tensors`; families whose loader is a library's (transformers) explain its errors
with `pickled_global` and `torch_load_reason`.

Weights that are ambiguous or not what they claim are refused here for every family, naming the tensor and the
files: a tensor in two files, an index (model.safetensors.index.json) that disagrees with its shards
(`locate_tensors`), two checkpoint names that load as one (`rename_keys`), and integer tensors where the model holds
floating-point weights, i.e. a quantized checkpoint (`refuse_integer_weights`).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from ..errors import MegaevalError, fail

T = TypeVar("T")

# Files torch.load (pickle) would read: never unpickled except with weights_only=True, which runs no code
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def empty_model(build: Callable[[], T]) -> T:
    """`build()` on the meta device with torch.nn.init's initializers skipped: the weights are the checkpoint's,
    and a meta-device initializer such as normal_ runs a Python kernel whose first call imports torch._dynamo
    (about 2 s of every process's start)."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    for name in names:
        setattr(torch.nn.init, name, _keep)
    try:
        with torch.device("meta"):
            return build()
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def _keep(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


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


# safetensors' dtype codes, named as torch names dtypes (others, such as F8_E4M3, are floating point)
SAFETENSORS_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
                      "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
                      "F32": "float32", "F64": "float64"}  # fmt: skip
REFETCH = "re-download or re-save the checkpoint"


def dtype_name(value: torch.Tensor | str) -> str:
    """A tensor's dtype as torch names it without the prefix ("int8"); a name is returned as it is."""
    return value if isinstance(value, str) else str(value.dtype).removeprefix("torch.")


def tensor_dtypes(file: Path, family: str) -> dict[str, str]:
    """Each tensor's name and dtype name, from a safetensors file's header alone (nothing else is read), or from a
    torch file read with `load_tensors` (memory-mapped)."""
    if file.suffix != ".safetensors":
        return {k: dtype_name(v) for k, v in load_tensors(file).items()}
    try:
        from safetensors import safe_open
    except ImportError:
        raise fail(f"{family} checkpoints need the safetensors package", "pip install safetensors") from None
    try:
        with safe_open(str(file), framework="pt") as f:
            codes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    except Exception as e:  # SafetensorError / OSError, multi-line
        reason = " ".join(str(e).split())[:160]
        raise fail(f"cannot read {file}: not a valid safetensors file ({reason})", "re-copy or re-save it") from None
    return {k: SAFETENSORS_DTYPES.get(code, code.lower()) for k, code in codes.items()}


def read_index(index: Path) -> dict[str, str]:
    """The weight_map of a sharded checkpoint's index file (tensor name -> shard file in the same folder), checked."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise fail(f"cannot read {index}: {' '.join(str(e).split())[:100]}", REFETCH) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise fail(f"{index} has no weight_map (an object of tensor names to shard files)", REFETCH)
    for name, shard in weight_map.items():
        if not shard or Path(shard).name != shard or shard in (".", ".."):
            raise fail(f"{index} puts {name} in {shard!r}, which is not a file beside the index",
                       "an index names shards by file name only; " + REFETCH)  # fmt: skip
    return weight_map


def index_shards(index: Path) -> list[Path]:
    """The shard files an index names, sorted; one line when one of them is missing."""
    folder, names = index.parent, sorted(set(read_index(index).values()))
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise fail(f"{folder}: shard(s) {_listed(missing)} named by {index.name} are missing",
                   "copy every shard beside the index")  # fmt: skip
    return [folder / n for n in names]


def locate_tensors(tables: Mapping[Path, Collection[str]], index: Path | None = None) -> dict[str, Path]:
    """Which file holds each tensor, given each weight file's tensor names. One line, naming the tensor and the
    files, for a tensor found in two files (one would silently win) and, with an index, for a tensor the index puts
    in a shard that lacks it or a shard holding a tensor the index does not list."""
    origin: dict[str, Path] = {}
    for file, names in tables.items():
        for name in names:
            if name in origin:
                raise fail(f"tensor {name} is stored twice, in {origin[name]} and in {file}: which one is meant is "
                           "ambiguous", "remove the stale copy, or " + REFETCH)  # fmt: skip
            origin[name] = file
    if index is None:
        return origin
    weight_map = read_index(index)
    for name, shard in sorted(weight_map.items()):
        held = origin.get(name)
        if held is None or held.name != shard:
            where = f" (it is in {held})" if held is not None else ""
            raise fail(f"{index.name} puts tensor {name} in {index.parent / shard}, which does not hold it{where}",
                       REFETCH)  # fmt: skip
    unlisted = sorted(set(origin) - set(weight_map))
    if unlisted:
        raise fail(f"{origin[unlisted[0]]} holds tensor {unlisted[0]}, which {index} does not list"
                   + (f" (+{len(unlisted) - 1} more)" if len(unlisted) > 1 else ""), REFETCH)  # fmt: skip
    return origin


def read_weights(
    files: list[Path], family: str, index: Path | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Every tensor of a checkpoint's weight files (safetensors, or torch files read with weights_only) and the file
    each came from, checked by `locate_tensors` (no tensor in two files; shards as their index says)."""
    parts = {f: read_safetensors(f, family) if f.suffix == ".safetensors" else load_tensors(f) for f in files}
    origin = locate_tensors(parts, index)
    return {k: v for part in parts.values() for k, v in part.items()}, origin


def rename_keys(
    state: Mapping[str, T], rename: Callable[[str], str], where: str | Mapping[str, Path]
) -> dict[str, T]:  # fmt: skip
    """`state` with each key renamed (a layout's names as the model names them); one line naming both keys and their
    file (`where`: one for all, or each key's) when two would load as the same name: one would silently be dropped."""
    out: dict[str, T] = {}
    source: dict[str, str] = {}
    for key, value in state.items():
        target = rename(key)
        if target in source:
            first = source[target]
            files = (where, where) if isinstance(where, str) else (where.get(first), where.get(key))
            held = (f"{files[0]} holds both {first} and {key}" if files[0] == files[1] else
                    f"{files[0]} holds {first} and {files[1]} holds {key}")  # fmt: skip
            raise fail(f"{held}, which both load as {target}: which one is meant is ambiguous", "remove one of them")
        source[target], out[target] = key, value
    return out


def refuse_integer_weights(
    state: Mapping[str, torch.Tensor | str], origin: Mapping[str, Path] | Path | str, floats: Collection[str],
    why: str | None = None,
) -> None:  # fmt: skip
    """One line naming a tensor (its dtype and file) stored as an integer or bool where the model holds a
    floating-point weight (`floats`: those names): a quantized checkpoint, which casting would silently garble."""
    bad = sorted(k for k, v in state.items() if k in floats and dtype_name(v).startswith(("int", "uint", "bool")))
    if bad:
        name = bad[0]
        file = origin.get(name, "the weights") if isinstance(origin, Mapping) else origin
        more = f", and {len(bad) - 1} more tensor(s) alike" if len(bad) > 1 else ""
        raise fail(f"tensor {name} in {file} is {dtype_name(state[name])}, where the model holds floating-point "
                   "weights" + (f" ({why})" if why else "") + more,
                   "quantized checkpoints are not supported; use the unquantized (float) weights")  # fmt: skip


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
