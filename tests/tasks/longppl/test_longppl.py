"""`megaeval longppl` (issue 33): key tokens from a streamed evaluator equal a naive window-by-window computation;
the model's LongPPL equals its losses at those tokens; key-token files round-trip; resume equals one run; bad
inputs are one line. (Equality with the `longppl` package itself: test_reference.py; the arithmetic:
tests/metrics/test_longppl.py; two ranks: tests/distributed/test_commands.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.commands.longppl import LongpplSettings, run_longppl
from megaeval_testing import AUSTEN, read_jsonl

TEXTS = [(AUSTEN / name).read_text(encoding="utf-8")[start : start + 4500]
         for name, start in (("emma.txt", 30_000), ("persuasion.txt", 50_000))]  # fmt: skip
KEY = dict(trunc_len=128, sliding_window=96)


def naive_losses(lm, ids: list[int], pieces=(1, 7, 530, 301)) -> np.ndarray:
    """-log P(ids[p] | ids[:p]) for p >= 1, from `forward` fed in pieces of odd sizes carrying the state; NaN at 0."""
    tokens = torch.tensor(ids)[None]
    out, state, at, k = [np.nan], lm.init_state(1), 0, 0
    while at < len(ids) - 1:
        size = min(pieces[k % len(pieces)], len(ids) - 1 - at)
        logits, state = lm.forward(tokens[:, at : at + size], state)
        logp = torch.log_softmax(logits[0].double(), -1)
        out += (-logp[torch.arange(size), tokens[0, at + 1 : at + size + 1]]).tolist()
        at, k = at + size, k + 1
    return np.array(out)


def naive_key_spans(lm, ids, offsets, trunc_len, window, alpha=2.0, beta=-2.0):
    """The reference's loop, each short window read alone from a fresh state."""
    full = naive_losses(lm, ids)
    keys = []
    for s in range(0, len(ids) - trunc_len, window):
        part = ids[s : s + trunc_len + window]
        short = naive_losses(lm, part, pieces=(len(part),))
        for j in range(trunc_len, len(part)):
            if short[j] - full[s + j] > alpha and full[s + j] < -beta:
                keys.append(s + j)
    spans = []
    for p in keys:
        a, b = offsets[p]
        if spans and spans[-1][1] == a:
            spans[-1][1] = b
        else:
            spans.append([a, b])
    return spans, keys


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("longppl")
    (folder / "docs.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS), encoding="utf-8")
    return folder / "docs.jsonl"


def settings(docs, out, **extra) -> LongpplSettings:
    base = dict(data=[str(docs)], text_field="body", model="embedded:mamba2-tiny", evaluator="embedded:megalodon-tiny",
                dtype="float64", out=str(out / "r.json"), samples=str(out / "s.jsonl"), **KEY)  # fmt: skip
    return LongpplSettings(**{**base, **extra})


def test_streamed_key_tokens_and_longppl_equal_a_naive_loop(docs, tmp_path):
    saving = settings(docs, tmp_path, save_key_tokens=str(tmp_path / "k.json"), alpha=0.5, beta=-4.0)
    report = run_longppl(saving, False)
    held = json.loads((tmp_path / "k.json").read_text())
    evaluator = load_model("embedded:megalodon-tiny", dtype="float64")
    model = load_model("embedded:mamba2-tiny", dtype="float64")
    total_keys = 0
    for text, doc, row in zip(TEXTS, held["documents"], report["results"]["documents"], strict=True):
        ids, offsets = evaluator.tokenizer.encode_offsets(text, True)
        assert ids[0] == evaluator.tokenizer.bos_id and ids[1:] == evaluator.tokenizer.encode(text)
        spans, keys = naive_key_spans(evaluator, ids, offsets, KEY["trunc_len"], KEY["sliding_window"], 0.5, -4.0)
        assert [list(s) for s in doc["spans"]] == spans and doc["evaluator_key_tokens"] == len(keys)
        assert doc["evaluator_tokens"] == len(ids) and doc["chars"] == len(text)
        m_ids, m_offsets = model.tokenizer.encode_offsets(text)
        nll = naive_losses(model, m_ids)
        inside = [i for i, (a, b) in enumerate(m_offsets) if i >= 1 and any(s <= a and b <= e for s, e in spans)]
        assert row["n_key_tokens"] == len(inside) and row["n_tokens"] == len(m_ids)
        assert row["ppl"] == pytest.approx(math.exp(np.mean(nll[1:])), rel=1e-9)
        assert row["longppl"] == pytest.approx(math.exp(np.mean(nll[inside])), rel=1e-9)
        total_keys += len(inside)
    assert total_keys > 10  # the thresholds found something to measure
    res = report["results"]
    rows = res["documents"]
    pooled = sum(r["n_key_tokens"] * math.log(r["longppl"]) for r in rows) / sum(r["n_key_tokens"] for r in rows)
    assert res["longppl"] == pytest.approx(math.exp(pooled), rel=1e-12)
    samples = read_jsonl(tmp_path / "s.jsonl")
    assert [s["longppl"] for s in samples] == [r["longppl"] for r in rows]
    assert report["settings"]["trunc_len"] == 128 and report["settings"]["alpha"] == 0.5

    # The same spans read back from the file give the same numbers, with no evaluator
    again = run_longppl(settings(docs, tmp_path / "again", evaluator=None, key_tokens=str(tmp_path / "k.json"),
                                 trunc_len=None, sliding_window=None), False)  # fmt: skip
    assert again["results"]["documents"] == [{**r, "evaluator_key_tokens": None} for r in rows]
    assert again["settings"]["alpha"] == 0.5  # the file's settings
    assert again["data"]["evaluator"]["weights_sha256"] == report["data"]["evaluator"]["weights_sha256"]
    with pytest.raises(MegaevalError, match=r"--trunc-len 64 differs from the 128 key-token file .* was made with"):
        run_longppl(settings(docs, tmp_path / "x", evaluator=None, key_tokens=str(tmp_path / "k.json"),
                             trunc_len=64), False)  # fmt: skip
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"body": t}) + "\n" for t in reversed(TEXTS)), encoding="utf-8")
    with pytest.raises(MegaevalError, match=r"was made for other data: document 0 \(other\.jsonl:0\)"):
        run_longppl(settings(other, tmp_path / "x", evaluator=None, key_tokens=str(tmp_path / "k.json"),
                             trunc_len=None, sliding_window=None), False)  # fmt: skip


def test_an_interrupted_run_resumes_to_the_same_report(docs, tmp_path):
    whole = run_longppl(settings(docs, tmp_path / "whole", batch_size=3), False)

    def stop_after_one(done):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_longppl(settings(docs, tmp_path / "cut"), False, on_unit=stop_after_one)
    assert not (tmp_path / "cut" / "r.json").exists()
    resumed = run_longppl(settings(docs, tmp_path / "cut", resume=True), False)
    assert resumed["results"] == whole["results"]  # batch size changes no number either
    from megaeval.commands.report.kinds import compare
    from megaeval.tables import format_value

    rows = [f"{d['id']},{format_value(d['n_key_tokens'])}" for d in whole["results"]["documents"]]
    table = compare([tmp_path / "whole" / "r.json"], fmt="csv", metric="n_key_tokens").splitlines()
    assert table[1:] == [*rows, f"all (pooled),{format_value(whole['results']['n_key_tokens'])}"]
    assert (tmp_path / "cut" / "s.jsonl").read_text() == (tmp_path / "whole" / "s.jsonl").read_text()


def test_bad_inputs_are_one_line(docs, tmp_path):
    from megaeval_testing.hostile import build_hf_bert

    out = dict(out=str(tmp_path / "r.json"))
    with pytest.raises(MegaevalError, match=r"^pass exactly one of --evaluator E"):
        LongpplSettings(data=[str(docs)], **out)
    with pytest.raises(MegaevalError, match=r"^pass exactly one of --evaluator E"):
        LongpplSettings(data=[str(docs)], evaluator="embedded:megalodon-tiny", key_tokens="k.json", **out)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": "words"}) + "\n" + json.dumps({"text": "  "}) + "\n")
    with pytest.raises(MegaevalError, match=r"^document empty\.jsonl:1 of .* is empty"):
        run_longppl(LongpplSettings(data=[str(empty)], evaluator="embedded:megalodon-tiny", **out), False)
    with pytest.raises(MegaevalError, match=r"^--trunc-len 4,096 is not below document docs\.jsonl:0's [\d,]+ eval"):
        run_longppl(settings(docs, tmp_path, trunc_len=4096), False)
    with pytest.raises(MegaevalError, match=r"document docs\.jsonl:0 has [\d,]+ tokens but the evaluator's "
                       r"context is 512 tokens.*--chunk-parallel P"):  # fmt: skip
        run_longppl(settings(docs, tmp_path, evaluator="embedded:transformer-tiny"), False)
    bert = build_hf_bert(tmp_path / "bert")
    with pytest.raises(MegaevalError, match=r"causal"):
        run_longppl(settings(docs, tmp_path, evaluator=f"hf:{bert}"), False)
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(MegaevalError, match=r"bad\.json is not a megaeval key-token file"):
        run_longppl(settings(docs, tmp_path, evaluator=None, key_tokens=str(tmp_path / "bad.json")), False)
    with pytest.raises(MegaevalError, match=r"^key-token file not found"):
        run_longppl(settings(docs, tmp_path, evaluator=None, key_tokens=str(tmp_path / "none.json")), False)
    assert not (tmp_path / "r.json").exists()


def test_the_sweep_adds_longppl_per_length_from_a_key_file_or_an_evaluator(docs, tmp_path):
    from megaeval.commands.ppl_sweep import SweepSettings, run_ppl_sweep
    from megaeval.streams.writer import prepare_books

    books = tmp_path / "books"
    books.mkdir()
    for i, text in enumerate(TEXTS):
        (books / f"b{i}.txt").write_text(text, encoding="utf-8")
    stream = tmp_path / "stream"
    prepare_books([str(books)], stream, {"model": "embedded:mamba2-tiny"}, workers=1, progress=False)
    relaxed = dict(alpha=0.5, beta=-4.0)
    run_longppl(settings(books, tmp_path / "l", text_field="text", save_key_tokens=str(tmp_path / "k.json"),
                         **relaxed), False)  # fmt: skip
    sweep = dict(stream=str(stream), model="embedded:mamba2-tiny", lengths="256,1K", dtype="float64", batch_size=4)
    from_file = run_ppl_sweep(SweepSettings(**sweep, key_tokens=str(tmp_path / "k.json"), out=str(tmp_path / "a.json")),
                              progress=False)  # fmt: skip

    # Independently: each book's tokens wholly inside a span, placed in the stream; each segment scored alone
    from megaeval.streams import BooksStream

    s = BooksStream(stream)
    model = load_model("embedded:mamba2-tiny", dtype="float64")
    held = {d["sha256"]: d["spans"] for d in json.loads((tmp_path / "k.json").read_text())["documents"]}
    by_sha, keys = {_sha(t): t for t in TEXTS}, set()
    for book in s.manifest["books"]:
        _, offsets = model.tokenizer.encode_offsets(by_sha[book["sha256"]])
        spans, first = held[book["sha256"]], book["offset"] + 1  # after BOS
        keys |= {first + i for i, (a, b) in enumerate(offsets) if i and any(x <= a and b <= y for x, y in spans)}
    for row in from_file["results"]["lengths"]:
        length, total, count = row["context_length"], 0.0, 0
        for start in range(0, row["tokens"], length):
            window = torch.tensor(np.asarray(s.tokens[start : start + length + 1], dtype=np.int64))[None]
            nll, _ = model.score(window[:, :-1], window[:, 1:], model.init_state(1))
            for j in range(length):
                if start + 1 + j in keys:
                    total, count = total + float(nll[0, j]), count + 1
        assert row["n_key_tokens"] == count > 10
        assert row["key_nll_sum"] == pytest.approx(total, rel=1e-9)
        assert row["longppl"] == pytest.approx(math.exp(total / count), rel=1e-9)

    # An evaluator run inside the sweep finds the same key tokens
    direct = run_ppl_sweep(SweepSettings(**sweep, evaluator="embedded:megalodon-tiny", **KEY, **relaxed,
                                         out=str(tmp_path / "b.json")), progress=False)  # fmt: skip
    for a, b in zip(from_file["results"]["lengths"], direct["results"]["lengths"], strict=True):
        assert (a["n_key_tokens"], a["longppl"]) == (b["n_key_tokens"], b["longppl"])
    assert direct["settings"]["trunc_len"] == 128 and from_file["settings"]["alpha"] == 0.5
    with pytest.raises(MegaevalError, match=r"^--trunc-len does not apply without --evaluator or --key-tokens"):
        run_ppl_sweep(SweepSettings(**sweep, trunc_len=64, out=str(tmp_path / "c.json")), progress=False)
    partial = json.loads((tmp_path / "k.json").read_text())
    partial["documents"] = partial["documents"][:1]
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    with pytest.raises(MegaevalError, match=r"partial\.json holds no spans for book books/b1\.txt"):
        run_ppl_sweep(SweepSettings(**sweep, key_tokens=str(tmp_path / "partial.json"), out=str(tmp_path / "c.json")),
                      progress=False)  # fmt: skip


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
