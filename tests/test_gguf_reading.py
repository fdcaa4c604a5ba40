"""GGUF files read fast: the same fields as gguf's own reader, and the same model and tokenizer as transformers'
own GGUF path, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf.gguf_reader import GGUFReader  # noqa: E402

from megaeval.models import load_model, load_tokenizer  # noqa: E402
from megaeval.models.hf.gguf_reading import fast_reading, open_gguf, reader_class  # noqa: E402
from megaeval_testing.gguf_files import ARRAY, STRING, write_raw_metadata, write_tiny_llama  # noqa: E402

EVERY_TYPE = [
    ("a.u8", 0, 200, None), ("a.i8", 1, -100, None), ("a.u16", 2, 60000, None), ("a.i16", 3, -30000, None),
    ("a.u32", 4, 4_000_000_000, None), ("a.i32", 5, -2_000_000_000, None), ("a.f32", 6, 0.25, None),
    ("a.bool", 7, True, None), ("a.str", STRING, "héllo wörld", None), ("a.u64", 10, 2**63 + 5, None),
    ("a.i64", 11, -(2**62), None), ("a.f64", 12, -1.5e300, None), ("a.empty_str", STRING, "", None),
    ("b.strings", ARRAY, ["", "a", "ü✓", "x" * 300] * 50, STRING), ("b.u8", ARRAY, [0, 1, 255], 0),
    ("b.i32", ARRAY, list(range(-500, 500)), 5), ("b.f32", ARRAY, [0.5, -2.0, 3.25], 6),
    ("b.bools", ARRAY, [True, False, True], 7), ("b.u64", ARRAY, [1, 2**64 - 1], 10), ("b.f64", ARRAY, [1e-300], 12),
    ("b.empty_strings", ARRAY, [], STRING), ("b.empty_ints", ARRAY, [], 5),
    ("b.nested", ARRAY, [[1, 2], [], [3, 4, 5]], ARRAY), ("c.after", STRING, "last", None),
]  # fmt: skip


def fields_of(reader):
    """Every field as plain values: name, offset, data indices, types, and each part's dtype and contents."""
    return [
        (f.name, f.offset, list(f.data), list(f.types), [(p.dtype.str, p.tolist()) for p in f.parts])
        for f in reader.fields.values()
    ]


def test_fast_reader_fields_equal_gguf_readers_on_every_value_type(tmp_path):
    path = write_raw_metadata(tmp_path / "m.gguf", EVERY_TYPE)
    slow, fast = GGUFReader(path), reader_class()(path)
    assert [f[0] for f in fields_of(fast)][3:] == [name for name, *_ in EVERY_TYPE]
    assert fields_of(fast) == fields_of(slow)
    assert fast.fields["b.strings"].contents() == ["", "a", "ü✓", "x" * 300] * 50
    assert fast.fields["b.nested"].contents() == [1, 2, 3, 4, 5]  # gguf's reader flattens arrays of arrays
    assert fast.fields["b.empty_strings"].contents() == []


def test_fast_reader_equals_gguf_reader_on_a_model_file(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    slow, fast = GGUFReader(path), reader_class()(path)
    assert fields_of(fast) == fields_of(slow)
    assert [(t.name, t.tensor_type, t.data_offset, t.shape.tolist()) for t in fast.tensors] == [
        (t.name, t.tensor_type, t.data_offset, t.shape.tolist()) for t in slow.tensors
    ]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(fast.tensors, slow.tensors, strict=True))


def test_fast_reading_parses_each_file_once_and_restores_gguf(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    with fast_reading():
        first = gguf.GGUFReader(str(path))
        with fast_reading():  # nested: the same readers
            assert gguf.GGUFReader(path) is first
        assert open_gguf(tmp_path / "." / "m.gguf") is first
    assert gguf.GGUFReader is GGUFReader
    assert open_gguf(path) is not first


def test_gguf_model_and_tokenizer_equal_transformers_own_load(tmp_path):
    """megaeval's load (fast reading) gives transformers' own GGUF load's weights, config and token ids exactly."""
    path = write_tiny_llama(tmp_path / "m.gguf")
    lm = load_model(f"hf:{tmp_path}", gguf_file="m.gguf")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32)
    ref_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    ours, theirs = lm.model.state_dict(), ref.state_dict()
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert lm.model.config.to_dict() == ref.config.to_dict()
    for text in ["the cat in the hat, éà", " an inn\n\nthe end", "✓ ünïcode"]:
        assert lm.tokenizer.encode(text) == ref_tok(text, add_special_tokens=False).input_ids
    assert load_tokenizer(f"hf:{path}").encode("the hen") == ref_tok("the hen", add_special_tokens=False).input_ids
    assert gguf.GGUFReader is GGUFReader
