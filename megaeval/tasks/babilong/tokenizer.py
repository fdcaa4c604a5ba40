"""The tokenizer BABILong's generator counts lengths with: GPT-2's (`gpt2`, shipped in data_prep/gpt2, loaded as the
official code loads it: `AutoTokenizer`), or any transformers tokenizer folder (`--length-tokenizer DIR`)."""

from __future__ import annotations

import atexit
import gzip
import json
import shutil
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import fail

GPT2 = "gpt2"
GPT2_CONFIG = {"model_max_length": 1024, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>", "add_prefix_space": False, "clean_up_tokenization_spaces": False,
               "tokenizer_class": "GPT2Tokenizer"}  # fmt: skip


def length_tokenizer(spec: str) -> Any:
    """A transformers tokenizer: `gpt2` (GPT-2's, offline), or the folder `spec` (AutoTokenizer)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise fail("the BABILong generator counts tokens with a transformers tokenizer, and transformers is not "
                   "installed", "pip install 'megaeval[hf]'") from None  # fmt: skip
    folder = gpt2_folder() if spec == GPT2 else Path(spec)
    if not folder.is_dir():
        raise fail(f"--length-tokenizer {spec}: no such tokenizer folder",
                   f"pass a transformers tokenizer folder, or {GPT2} (BABILong's)")  # fmt: skip
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # transformers' errors for a folder without a tokenizer
        reason = " ".join(str(e).split())[:160]
        raise fail(f"--length-tokenizer {spec}: not a transformers tokenizer folder ({reason})",
                   f"pass a folder with tokenizer.json or vocab files, or {GPT2}") from None  # fmt: skip


@cache
def gpt2_folder() -> Path:
    """GPT-2's tokenizer files (vocab.json, merges.txt, tokenizer_config.json) in a temporary folder, written once
    per process from the shipped merges (data_prep/gpt2/README.md)."""
    packed = resources.files("megaeval.data_prep").joinpath("gpt2", "merges.txt.gz").read_bytes()
    merges_text = gzip.decompress(packed).decode("utf-8")
    merges = [line for line in merges_text.split("\n")[1:] if line]
    vocab = {char: i for i, char in enumerate(byte_chars())}
    for i, merge in enumerate(merges):
        vocab[merge.replace(" ", "")] = 256 + i
    vocab["<|endoftext|>"] = len(vocab)
    folder = Path(tempfile.mkdtemp(prefix="megaeval-gpt2-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(GPT2_CONFIG), encoding="utf-8")
    return folder


def byte_chars() -> list[str]:
    """GPT-2's 256 byte tokens in id order: the printable bytes as themselves, the others shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(rest))]


# transformers 4.x's `clean_up_tokenization`, which its decode applied to GPT-2 by default (BABILong's sets were made
# so); transformers 5 no longer applies it to byte-level BPE tokenizers.
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))  # fmt: skip


def decode(tokenizer: Any, ids: list[int], clean_up_spaces: bool) -> str:
    """`ids` as text (special tokens kept, as the generator decodes), spaces before punctuation and English
    contractions removed when `clean_up_spaces` (transformers 4.x's decoding, which made the published sets)."""
    text = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    if clean_up_spaces:
        for before, after in _CLEAN_UP:
            text = text.replace(before, after)
    return text
