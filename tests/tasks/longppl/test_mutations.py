"""Property-based damage to LongPPL's inputs (issue 46 D): a key-token file that megaeval wrote, damaged at any place
(a value of another JSON type, a deletion) or at any byte (not UTF-8, a lone surrogate escape, a NUL), and LongPPL
documents damaged the same way, give either the clean result (the same key settings and the same key positions of
the model's tokens, which fix every LongPPL number) or one line (a MegaevalError), never a crash.

The key-token file is made once, as `longppl --save-key-tokens` writes one, for two short documents; each example then
only reads files and tokenizes (no model pass), so the properties stay fast."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaeval.commands.longppl import LongpplSettings
from megaeval.files import write_json_atomic
from megaeval.models import load_tokenizer
from megaeval.scoring.key_tokens import model_key_positions
from megaeval.tasks.data import read_documents
from megaeval.tasks.longppl.data import key_file, key_settings, read_key_file, spans_for
from megaeval.tokenizers import encode_offsets
from megaeval_testing import AUSTEN
from megaeval_testing.mutation import EXAMPLES, check, draw_damage, outcome

TEXTS = [(AUSTEN / "emma.txt").read_text(encoding="utf-8")[40_000:40_700],
         (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[20_000:20_600]]  # fmt: skip
MODEL = "embedded:mamba2-tiny"
BYTES = [b"\xff", b"\xc3", b"\\ud800", b"\\udfff", b"\x00", b'"', b"]"]  # never a digit: a span moved is other data


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Documents, a key-token file for them as `longppl --save-key-tokens` writes one (`key_file`, then
    `write_json_atomic`; spans: every third word, no evaluator run) and the model's tokenizer."""
    root = tmp_path_factory.mktemp("longppl-mutations")
    docs = root / "d.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    documents, _ = read_documents([str(docs)])
    spans = [[m.span() for m in re.finditer(r"\S+", d.text)][::3] for d in documents]
    settings = {"trunc_len": 32, "sliding_window": 32, "alpha": 0.5, "beta": -6.0}
    content = key_file({"spec": "embedded:megalodon-tiny", "weights_sha256": "0" * 64}, settings, documents, spans,
                       [len(d.text) // 3 for d in documents], [len(s) for s in spans])  # fmt: skip
    write_json_atomic(root / "k.json", content, flag="--save-key-tokens")
    return root, docs, (root / "k.json").read_bytes(), load_tokenizer(MODEL)


def result(docs: Path, keys: Path, tokenizer) -> tuple:
    """What a `longppl --key-tokens` run's numbers follow from: its key settings and each document's key positions
    among the model's tokens (the model's losses on the same tokens are the same)."""
    documents, _ = read_documents([str(docs)])
    held = read_key_file(keys)
    key = key_settings(LongpplSettings(data=[str(docs)], key_tokens=str(keys), out=str(docs.parent / "x.json")),
                       held, str(keys))  # fmt: skip
    spans = spans_for(held, keys, documents)
    positions = []
    for doc, doc_spans in zip(documents, spans, strict=True):
        _, offsets = encode_offsets(tokenizer, doc.text)
        positions.append(model_key_positions(offsets, doc_spans).tolist())
    return key, [d.id for d in documents], positions


def test_the_file_longppl_writes_reads_back(made):
    root, docs, content, tokenizer = made
    (root / "clean.json").write_bytes(content)
    key, ids, positions = result(docs, root / "clean.json", tokenizer)
    assert ids == ["d.jsonl:0", "d.jsonl:1"] and sum(map(len, positions)) > 0


@EXAMPLES
@given(data=st.data())
def test_a_damaged_key_token_file_is_read_right_or_refused_in_one_line(made, data):
    root, docs, content, tokenizer = made
    (root / "clean.json").write_bytes(content)
    clean = result(docs, root / "clean.json", tokenizer)
    (root / "bad.json").write_text(json.dumps(draw_damage(data, json.loads(content))), encoding="utf-8")
    check(lambda: result(docs, root / "bad.json", tokenizer), clean)


@EXAMPLES
@given(at=st.integers(0, 10**9), junk=st.sampled_from(BYTES))
def test_a_key_token_file_with_bad_bytes_is_read_right_or_refused_in_one_line(made, at, junk):
    root, docs, content, tokenizer = made
    (root / "clean.json").write_bytes(content)
    clean = result(docs, root / "clean.json", tokenizer)
    at %= len(content) + 1
    (root / "bad.json").write_bytes(content[:at] + junk + content[at:])
    check(lambda: result(docs, root / "bad.json", tokenizer), clean)


@EXAMPLES
@given(data=st.data())
def test_damaged_documents_are_read_right_or_refused_in_one_line(made, data):
    root, docs, content, tokenizer = made
    (root / "clean.json").write_bytes(content)
    clean = result(docs, root / "clean.json", tokenizer)
    rows = [json.loads(line) for line in docs.read_text(encoding="utf-8").splitlines()]
    bad = root / "bad" / "d.jsonl"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text("".join(json.dumps(r) + "\n" for r in draw_damage(data, rows)), encoding="utf-8")
    check(lambda: result(bad, root / "clean.json", tokenizer), clean)


@EXAMPLES
@given(row=st.integers(0, 1), at=st.integers(0, 10**9), junk=st.sampled_from(BYTES))
def test_documents_with_bad_bytes_are_refused_in_one_line_naming_the_line(made, row, at, junk):
    root, docs, content, tokenizer = made
    lines = docs.read_bytes().splitlines(keepends=True)
    text = lines[row]
    at = 10 + at % (len(text) - 13)  # inside the text's JSON string
    lines[row] = text[:at] + junk + text[at:]
    bad = root / "bytes" / "d.jsonl"
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(b"".join(lines))
    (root / "clean.json").write_bytes(content)
    kind, got = outcome(lambda: result(bad, root / "clean.json", tokenizer))
    assert kind == "error", "a document with other bytes was read as the clean one"
    assert "d.jsonl" in got and (f"line {row + 1}" in got or "other data" in got or "document" in got), got
