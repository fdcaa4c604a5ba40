"""Questions on one document share its reading (issue 45, item 1): the same predictions as reading each prompt whole,
on every family, with the tokens read counted; a group split by --limit or a resume; the tree reader alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from megaeval import load_model
from megaeval.cli import app
from megaeval.commands.scrolls import ScrollsSettings, run_scrolls
from megaeval.scoring import answering
from megaeval.scoring.generate import branch_tree, prefill
from megaeval_testing import AUSTEN

TEXT = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")
# (document, questions): documents of different lengths, given interleaved (B is cut to fit a 64-token context, by
# the length of its question); questions that share their first words (the reading must not start over)
DOCS = {
    "A": (TEXT[:160], ["What did Anne do?", "What is Kellynch?", "Who is Sir Walter?"]),
    "B": (TEXT[160:420], ["Why?", "What did Mary say about the visit to Uppercross?", "Where?"]),
    "C": (TEXT[500:560], ["Who came?"]),
}
ORDER = ["A0", "B0", "A1", "C0", "B1", "A2", "B2"]
MEASURED = ("peak_memory_bytes", "state_bytes", "prompt_tokens_read")


def write_data(folder) -> None:
    rows = [{"id": key, "input": f"{DOCS[key[0]][1][int(key[1])]}\n\n{DOCS[key[0]][0]}", "output": f"answer {key}"}
            for key in ORDER]  # fmt: skip
    for split in ("validation", "train"):
        (folder / "qasper").mkdir(parents=True, exist_ok=True)
        (folder / "qasper" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def run(tmp_path, name: str, **flags) -> tuple[dict, list[str]]:
    data = tmp_path / "data"
    if not data.exists():
        write_data(data)
    settings = ScrollsSettings(tasks="qasper", data_dir=str(data), shots=0, max_new_tokens=2, stop=[],
                               out=str(tmp_path / f"{name}.json"), samples=str(tmp_path / f"{name}.jsonl"),
                               **flags)  # fmt: skip
    report = run_scrolls(settings, progress=False)
    return report, (tmp_path / f"{name}.jsonl").read_text().splitlines()


def trie_size(prompts: list[list[int]]) -> int:
    """Tokens a reading that shares every common start reads: the nodes of the prompts' prefix tree."""
    return len({bytes(np.asarray(p[:k], dtype=np.int64)) for p in prompts for k in range(1, len(p) + 1)})


@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("megalodon-tiny", {"dtype": "float64"}),
        pytest.param("rfa-tiny", {}, marks=pytest.mark.slow),  # -m slow: the default run keeps one of each kind
        pytest.param("mamba2-tiny", {}, marks=pytest.mark.slow),
        pytest.param("transformer-tiny", {}, marks=pytest.mark.slow),
        ("transformer-tiny", {"model_args": {"max_context": 64}}),
    ],
    ids=["megalodon-f64", "rfa", "mamba2", "transformer", "transformer-cut"],
)
def test_shared_reading_equals_reading_each_prompt_whole(monkeypatch, tmp_path, model, args):
    groups: list[list[list[int]]] = []  # the fitted prompts of each document, as read
    read_prompts, tokenizers = answering.read_prompts, []

    def recording(lm, prompts, state, *rest):
        groups.append([list(p) for p in prompts])
        tokenizers.append(lm.tokenizer)
        return read_prompts(lm, prompts, state, *rest)

    flags = {"model": f"embedded:{model}", "batch_size": 3, **args}
    with monkeypatch.context() as m:
        m.setattr(answering, "read_prompts", recording)
        shared, lines = run(tmp_path, "shared", **flags)
    alone, alone_lines = run(tmp_path, "alone", share_documents=False, **flags)
    assert lines == alone_lines  # the same predictions, scores and prompts, in the examples' order
    assert [json.loads(line)["id"] for line in lines] == ORDER
    got, want = shared["results"]["qasper"], alone["results"]["qasper"]
    assert {k: v for k, v in got.items() if k not in MEASURED} == {k: v for k, v in want.items() if k not in MEASURED}
    assert shared["settings"]["share_documents"] and not alone["settings"]["share_documents"]
    naive = want["prompt_tokens_naive"]
    assert want["prompt_tokens_read"] == naive and got["prompt_tokens_naive"] == naive
    samples = {s["id"]: s for s in map(json.loads, lines)}
    assert [len(g) for g in groups] == [3, 3, 1]  # one reading per document, every question in it
    prefix = naive - sum(len(p) for g in groups for p in g)
    assert got["prompt_tokens_read"] == prefix + sum(trie_size(g) for g in groups)  # each shared start read once
    if "model_args" in args:  # B's questions cut its document differently: shared as far as the cuts agree
        assert [bool(samples[f"B{k}"]["truncated_tokens"]) for k in range(3)] == [True] * 3
        assert trie_size(groups[1]) < sum(map(len, groups[1])) - 2 * 20
        return
    tokenizer = tokenizers[0]
    assert groups == [[tokenizer.encode(f"{doc} Q: {q} A:") for q in questions] for doc, questions in DOCS.values()]
    documents = [len(tokenizer.encode(doc)) for doc, _ in DOCS.values()]
    questions = sum(len(p) - d for g, d in zip(groups, documents, strict=True) for p in g)
    # each document read once, and each question's part: unique document tokens + questions, over all prompt tokens
    assert got["prompt_tokens_read"] - prefix <= sum(documents) + questions + len(groups)
    assert got["prompt_tokens_read"] < naive * 0.6


def test_a_group_split_by_limit_or_a_resume_gives_the_same_answers(tmp_path):
    flags = {"model": "embedded:rfa-tiny", "batch_size": 2}
    whole, lines = run(tmp_path, "whole", **flags)
    limited, limited_lines = run(tmp_path, "limited", limit=4, **flags)  # B's 3 questions: 1 in, 2 out
    assert limited_lines == lines[:4]

    def stop_after_one(done):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scrolls(ScrollsSettings(tasks="qasper", data_dir=str(tmp_path / "data"), shots=0, max_new_tokens=2,
                                    stop=[], out=str(tmp_path / "cut.json"), samples=str(tmp_path / "cut.jsonl"),
                                    **flags), progress=False, on_unit=stop_after_one)  # fmt: skip
    journal = (tmp_path / "cut.json.partial.jsonl").read_text().splitlines()
    assert [json.loads(line)["unit"] for line in journal[1:]] == [["qasper", "A0", "A1", "A2"]]  # a group a line
    resumed, resumed_lines = run(tmp_path, "cut", resume=True, **flags)
    assert resumed_lines == lines
    for report in (resumed, whole):
        report["results"]["qasper"].pop("peak_memory_bytes")
    assert resumed["results"] == whole["results"]


def test_branch_tree_reads_each_shared_start_once_and_equals_reading_whole():
    lm = load_model("embedded:megalodon-tiny", dtype="float64")
    rng = np.random.default_rng(0)
    trunk = rng.integers(5, 4000, 70).tolist()
    prompts = [trunk + [7, 8, 9], trunk + [7, 8, 10, 11], trunk[:30] + [12], trunk + [7, 13], trunk[:30] + [12],
               [14], trunk + [7, 8, 9, 15]]  # fmt: skip
    _, prefix = prefill(lm, [1, 2, 3], lm.init_state(1))
    before = [t.clone() for t in prefix.tensors()]
    counts, seen = [0] * len(prompts), {}
    for i, logits, state in branch_tree(lm, prompts, prefix, counts=counts):
        seen[i] = (logits, state)
    assert sorted(seen) == list(range(len(prompts)))
    for i, ids in enumerate(prompts):
        logits, state = prefill(lm, ids, prefix.clone())
        torch.testing.assert_close(seen[i][0], logits, rtol=0, atol=1e-12)
        for a, b in zip(seen[i][1].tensors(), state.tensors(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # every distinct start once, but for the last token of a repeated prompt and of one that starts another (read
    # again: a prompt's last token is read in its own branch, for its logits)
    assert sum(counts) == trie_size(prompts) + 2
    assert all(torch.equal(a, b) for a, b in zip(prefix.tensors(), before, strict=True))  # `prefix` untouched


def test_no_share_documents_with_predictions_is_refused_in_one_line(tmp_path):
    write_data(tmp_path / "data")
    (tmp_path / "p.jsonl").write_text(json.dumps({"task": "qasper", "id": "A0", "prediction": "x"}) + "\n")
    args = ["scrolls", "--tasks", "qasper", "--data-dir", str(tmp_path / "data"), "--predictions",
            str(tmp_path / "p.jsonl"), "--no-share-documents", "--out", str(tmp_path / "r.json")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "--no-share-documents would be ignored" in result.stderr and not (tmp_path / "r.json").exists()
