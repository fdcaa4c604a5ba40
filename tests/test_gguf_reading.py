"""GGUF files read fast: the same fields as gguf's own reader, and the same model and tokenizer as transformers'
own GGUF path, bit for bit."""

from __future__ import annotations

import re
import struct
import time
import tracemalloc

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf.gguf_reader import GGUFReader  # noqa: E402

from megaeval.errors import MegaevalError  # noqa: E402
from megaeval.models import load_model, load_tokenizer  # noqa: E402
from megaeval.models.hf.gguf_reading import check_gguf, fast_reading, open_gguf, reader_class  # noqa: E402
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


# ------------------------------------------------------------------------------------------- damaged and hostile files


def huge_array_file(path):
    """55 bytes whose one array claims 2**40 one-byte items."""
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    path.write_bytes(header + struct.pack("<Q", 5) + b"a.arr" + struct.pack("<IIQ", 9, 0, 2**40) + b"xx")
    return path


def test_a_huge_claimed_array_fails_at_once_without_allocating(tmp_path):
    path = huge_array_file(tmp_path / "huge.gguf")
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(MegaevalError) as err:
        reader_class()(path)
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 1 and peak < 1 << 20
    assert str(err.value) == (
        f"{path} is not a readable GGUF file: a.arr claims 1,099,511,627,776 items of at least 1 byte(s), but only 2 "
        "bytes follow (at byte 53); the file is damaged or truncated; copy it again"
    )
    for load in (load_model, load_tokenizer):  # megaeval's walk comes before transformers' GGUF loader
        with pytest.raises(MegaevalError, match=r"huge\.gguf is not a readable GGUF file: a\.arr claims"):
            load(f"hf:{path}")


def at(reader, key):
    """The offset of a metadata field's value (after its key and value type)."""
    return reader.fields[key].offset + 8 + len(key.encode()) + 4


def tensor_at(reader, index):
    """The offset of tensor `index`'s n_dims in the tensor table."""
    field = reader.tensors[index].field
    return field.offset + 8 + len(field.name.encode())


def patched(data, offset, fmt, value):
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offset, value)
    return bytes(out)


def metadata_cases(data, r):
    """(id, bytes, the line's pattern) for every count and length of the metadata, inflated."""
    return [
        ("kv_count", patched(data, 16, "Q", 2**62), r"kv_count \(metadata entries\) claims 4,611,686,018,427,387,904"),
        ("tensor_count", patched(data, 8, "Q", 2**40), r"tensor_count \(tensors\) claims"),
        ("key-length", patched(data, 24, "Q", 2**63), r"the key of metadata entry 0 claims 9,223,372,036,854,775,808"),
        ("string-length", patched(data, at(r, "a.str"), "Q", 2**50), r"a\.str claims"),
        ("string-array-count", patched(data, at(r, "b.strings") + 4, "Q", 2**40), r"b\.strings claims .* at least 8"),
        ("string-in-array", patched(data, at(r, "b.strings") + 12, "Q", 2**40), r"b\.strings\[0\] claims"),
        ("scalar-array-count", patched(data, at(r, "b.i32") + 4, "Q", 2**61), r"b\.i32 claims .* at least 4 byte"),
        ("nested-array-count", patched(data, at(r, "b.nested") + 4, "Q", 2**40), r"b\.nested claims .* at least 12"),
        ("value-type", patched(data, at(r, "a.u8") - 4, "I", 13), r"a\.u8 has unknown value type 13"),
        ("item-type", patched(data, at(r, "b.u8"), "I", 99), r"b\.u8 has unknown item type 99"),
        ("version", patched(data, 4, "I", 1), r"GGUF version 1 is not supported"),
        ("magic", b"GGML" + data[4:], r"it does not start with the GGUF magic"),
        ("empty", b"", r"it is empty"),
        ("duplicate-key", data.replace(b"a.u16", b"a.i16", 1), r"metadata key a\.i16 appears twice"),
    ]  # fmt: skip


def tensor_cases(data, r):
    """(id, bytes, the line's pattern) for every field of the tensor table, damaged."""
    first = tensor_at(r, 0)  # token_embd.weight: 2 dims, Q8_0
    name = r"tensor token_embd\.weight"
    return [
        ("n_dims", patched(data, first, "I", 2**32 - 1), name + r" claims 4,294,967,295 dimensions"),
        ("dim", patched(data, first + 4, "Q", 2**40 * 32), name + r"'s data \(bytes .*\) runs past the end"),
        ("block", patched(data, first + 4, "Q", 33), name + r"'s first dimension \(33\) is not a multiple"),
        ("type", patched(data, first + 20, "I", 1000), name + r" has unknown type 1000"),
        ("offset", patched(data, first + 24, "Q", 2**60), name + r"'s data .* runs past the end"),
        ("misaligned", patched(data, tensor_at(r, 1) + 16, "Q", 3), r"the data offset 3 of tensor "
         r"blk\.0\.attn_norm\.weight is not a multiple of the alignment 32"),
    ]  # fmt: skip


def test_every_inflated_count_length_and_offset_is_one_line_naming_the_field(tmp_path):
    """Each field checked against the file's size, named with the file, in a few milliseconds."""
    raw = write_raw_metadata(tmp_path / "raw.gguf", EVERY_TYPE)
    model = write_tiny_llama(tmp_path / "model.gguf")
    cases = metadata_cases(raw.read_bytes(), GGUFReader(raw)) + tensor_cases(model.read_bytes(), GGUFReader(model))
    for case, data, pattern in cases:
        path = tmp_path / f"{case}.gguf"
        path.write_bytes(data)
        start = time.perf_counter()
        line = rf"{re.escape(str(path))} is not a readable GGUF file: {pattern}"
        with pytest.raises(MegaevalError, match=line) as err:
            reader_class()(path)
        assert "\n" not in str(err.value) and time.perf_counter() - start < 0.5, case
    assert len(cases) == 20


def test_general_alignment_must_be_a_power_of_two(tmp_path):
    for value, kind in [(24, 4), (0, 4), (32, 5)]:  # 5: int32, not the uint32 the format says
        path = write_raw_metadata(tmp_path / "align.gguf", [("general.alignment", kind, value, None)])
        with pytest.raises(MegaevalError, match=r"general\.alignment must be a 32-bit unsigned power of two"):
            check_gguf(path)


def test_a_file_cut_anywhere_is_one_line(tmp_path):
    """Cuts at every byte of the header, every few bytes of the metadata and tensor table, and in the tensor data."""
    data = write_tiny_llama(tmp_path / "model.gguf").read_bytes()
    data_start = GGUFReader(tmp_path / "model.gguf").data_offset
    cut = tmp_path / "cut.gguf"
    for n in [*range(64), *range(64, data_start + 40, 23), *range(data_start + 40, len(data), 997), len(data) - 1]:
        cut.write_bytes(data[:n])
        with pytest.raises(MegaevalError, match=r"cut\.gguf is not a readable GGUF file: .*copy it again$") as err:
            reader_class()(cut)
        assert "\n" not in str(err.value), n
