"""Small GGUF files written here: a tiny Llama with a byte-level BPE tokenizer, and raw metadata of every type."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np


def byte_level_alphabet() -> list[str]:
    """GPT-2's 256 printable stand-ins for bytes, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_llama(path: Path, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                     ff: int = 64, seed: int = 0) -> Path:  # fmt: skip
    """A random Llama in GGUF: Q8_0 matrices, F32 norms, tied embeddings, a byte-level BPE with a few merges."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "h e", "Ġt he", "a n", "Ġ a", "i n"]
    tokens = ["<|endoftext|>", *byte_level_alphabet(), *(m.replace(" ", "") for m in merges)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (len(tokens) - 1))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)

    def tensor(name: str, shape: tuple[int, ...]) -> None:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if len(shape) == 1:
            writer.add_tensor(name, data)
        else:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, quantize(data, q8), raw_dtype=q8)

    kv = hidden * kv_heads // heads
    tensor("token_embd.weight", (len(tokens), hidden))
    for i in range(layers):
        shapes = {"attn_norm": (hidden,), "attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
                  "attn_output": (hidden, hidden), "ffn_norm": (hidden,), "ffn_gate": (ff, hidden),
                  "ffn_up": (ff, hidden), "ffn_down": (hidden, ff)}  # fmt: skip
        for name, shape in shapes.items():
            tensor(f"blk.{i}.{name}.weight", shape)
    tensor("output_norm.weight", (hidden,))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# GGUF value types (the format's numbering) and how each scalar is packed, little-endian
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


def _packed(kind: int, value: Any, item: int | None = None) -> bytes:
    if kind == STRING:
        data = value.encode()
        return struct.pack("<Q", len(data)) + data
    if kind == ARRAY:  # an array of arrays holds arrays of int32
        body = b"".join(_packed(item, v, 5 if item == ARRAY else None) for v in value)
        return struct.pack("<IQ", item, len(value)) + body
    return struct.pack("<" + SCALARS[kind], value)


def write_raw_metadata(path: Path, fields: list[tuple[str, int, Any, int | None]]) -> Path:
    """A GGUF file (version 3, no tensors) holding `fields`: (key, value type, value, item type of an array)."""
    body = b"".join(_packed(STRING, key) + struct.pack("<I", kind) + _packed(kind, value, item)
                    for key, kind, value, item in fields)  # fmt: skip
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + body)
    return path
