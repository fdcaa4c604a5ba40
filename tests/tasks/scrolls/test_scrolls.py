"""`megaeval scrolls`: data, prompts, truncation, state reuse, decoding, scoring, resume, errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from megaeval import MegaevalError, load_model
from megaeval.cli import app
from megaeval.commands.scrolls import ScrollsSettings, run_scrolls
from megaeval.metrics.scrolls import scrolls_scores
from megaeval.scoring.generate import greedy_generate, prefill
from megaeval.tasks.scrolls.docs import Example, PromptForm, fit_few_shot, fit_prompt, group_examples, split_input
from megaeval.tasks.scrolls.docs import render_prompt as render
from megaeval.tokenizers import SentencePieceTokenizer
from megaeval_testing import AUSTEN, REPO
from megaeval_testing.hostile import tree_diff, tree_state
from megaeval_testing.scrolls_runs import run_recording

runner = CliRunner()


def test_question_and_document_split_at_the_first_blank_line():
    assert split_input("Who is Anne?\n\nChapter 1\n\nSir Walter...") == ("Who is Anne?", "Chapter 1\n\nSir Walter...")
    assert split_input("No document") == ("No document", "")


def test_rows_sharing_an_id_are_one_example_with_several_references():
    rows = [
        {"id": "a", "pid": "a_0", "input": "Q1?\n\nDoc A", "output": "x"},
        {"id": "b", "pid": "b_0", "input": "Q2?\n\nDoc B", "output": "y"},
        {"id": "a", "pid": "a_1", "input": "Q1?\n\nDoc A", "output": "z"},
    ]
    examples = group_examples(rows)
    assert [(e.id, e.question, e.document, e.references) for e in examples] == [
        ("a", "Q1?", "Doc A", ["x", "z"]), ("b", "Q2?", "Doc B", ["y"])]  # fmt: skip
    with pytest.raises(MegaevalError, match="row 1 has no 'output'"):
        group_examples([{"id": "a", "input": "x"}])


def test_rows_sharing_an_id_with_another_question_are_refused_naming_file_and_id(tmp_path):
    """Merged, the second question would never be asked and its answer would count as a reference of the first."""
    rows = [{"id": "a", "pid": "a_0", "input": "Q1?\n\nDoc A", "output": "x"},
            {"id": "a", "pid": "a_1", "input": "Q2?\n\nDoc A", "output": "y"}]  # fmt: skip
    write_scrolls(tmp_path / "data", "qasper", "validation", rows)
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["scrolls", "--predictions", str(tmp_path / "p.jsonl"), "--data-dir",
                                 str(tmp_path / "data"), "--tasks", "qasper", "--out", str(out)])  # fmt: skip
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and not out.exists(), result.output
    where = tmp_path / "data" / "qasper" / "validation.jsonl"
    assert lines[0].startswith(f"error: {where} row 2: id 'a' is also row 1's, with another input: its question")


def test_prompt_assembly_keeps_braces_in_documents():
    ex = Example("a", "Who wrote {this}?", "A {curly} text.", ["x"])
    assert render("{CONTEXT} Q: {QUESTION} A:", ex) == "A {curly} text. Q: Who wrote {this}? A:"


def test_prompt_fields_are_substituted_in_one_pass():
    # the document was inserted first, then "{QUESTION}" replaced everywhere: the question got spliced into it
    ex = Example("a", "Who is {CONTEXT}?", "The memo says {QUESTION} twice: {QUESTION}.", ["x"])
    assert (
        render("{CONTEXT} Q: {QUESTION} A:", ex)
        == "The memo says {QUESTION} twice: {QUESTION}. Q: Who is {CONTEXT}? A:"
    )
    assert render("Q: {QUESTION}\n{CONTEXT}\nQ: {QUESTION} A:", ex, "{QUESTION}") == (
        "Q: Who is {CONTEXT}?\n{QUESTION}\nQ: Who is {CONTEXT}? A:"
    )


@pytest.mark.parametrize("mode", ["middle", "left", "right"])
def test_truncation_drops_document_tokens_only(sp_model, mode):
    tok = SentencePieceTokenizer(sp_model)
    lm = SimpleNamespace(tokenizer=tok)
    document = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:3000]
    ex = Example("a", "Who is Sir Walter Elliot?", document, ["a baronet"])
    template = "{CONTEXT} Q: {QUESTION} A:"
    full = tok.encode(render(template, ex))
    ids, dropped = fit_prompt(lm, PromptForm(template), ex, 300, mode)
    assert len(ids) <= 300 and dropped == len(full) - len(ids) and dropped > 0
    text = tok.decode(ids)
    assert text.endswith(" Q: Who is Sir Walter Elliot? A:")  # question and cue survive
    body = text.removesuffix(" Q: Who is Sir Walter Elliot? A:")
    if mode in ("middle", "right"):
        assert body.startswith(document[:40])
    if mode in ("middle", "left"):
        assert body.endswith(document[-30:])
    assert fit_prompt(lm, PromptForm(template), ex, None, mode) == (full, 0)


@pytest.fixture
def lm64(make_checkpoint):
    return load_model(str(make_checkpoint()), dtype="float64")


def test_few_shot_state_reuse_equals_recomputation(lm64):
    prefix = [lm64.tokenizer.bos_id] + lm64.tokenizer.encode("Anne Elliot. Q: Who? A: Anne\n\n")
    example = lm64.tokenizer.encode("Captain Wentworth returned. Q: Who returned? A:")
    _, prefix_state = prefill(lm64, prefix, lm64.init_state(1))
    snapshot = prefix_state.clone()
    reused, _ = prefill(lm64, example, prefix_state.clone())
    again, _ = prefill(lm64, example, prefix_state.clone())  # the prefix state is untouched by the first use
    whole, _ = lm64.forward(torch.tensor([prefix + example]), lm64.init_state(1))
    torch.testing.assert_close(reused, whole[0, -1], rtol=0, atol=1e-9)
    torch.testing.assert_close(again, reused, rtol=0, atol=0)
    for a, b in zip(prefix_state.tensors(), snapshot.tensors(), strict=True):
        assert torch.equal(a, b)


def test_greedy_generation_equals_recomputing_from_scratch(lm64):
    prompt = lm64.tokenizer.encode("It was a fine day in Bath, and")
    logits, state = prefill(lm64, prompt, lm64.init_state(1))
    gen = greedy_generate(lm64, logits, state, max_new_tokens=12)
    ids = list(prompt)
    for _ in range(12):  # naive: the whole sequence from a fresh state at every step
        full, _ = lm64.forward(torch.tensor([ids]), lm64.init_state(1))
        ids.append(int(full[0, -1].argmax()))
    assert gen.tokens == ids[len(prompt) :] and gen.stop_reason == "length"
    assert gen.text == lm64.tokenizer.decode(gen.tokens)
    first_piece = lm64.tokenizer.decode(gen.tokens[:3])
    stopped = greedy_generate(lm64, logits, state, max_new_tokens=12, stop=[first_piece[-1]])
    assert stopped.stop_reason == "stop" and first_piece[-1] not in stopped.text
    assert len(stopped.tokens) <= 3


def write_scrolls(folder, task: str, split: str, rows: list[dict]) -> None:
    (folder / task).mkdir(parents=True, exist_ok=True)
    with open(folder / task / f"{split}.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def scrolls_data(tmp_path):
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")
    data = tmp_path / "data"
    val = [
        {"id": "v1", "pid": "v1_0", "input": f"Who is Anne?\n\n{text[:1500]}", "output": "Anne Elliot"},
        {"id": "v1", "pid": "v1_1", "input": f"Who is Anne?\n\n{text[:1500]}", "output": "his daughter"},
        {"id": "v2", "pid": "v2_0", "input": f"Where is Kellynch?\n\n{text[1500:2600]}", "output": "Somersetshire"},
        {"id": "v3", "pid": "v3_0", "input": f"What happened?\n\n{text[2600:3500]}", "output": "a visit"},
    ]
    train = [{"id": f"t{i}", "pid": f"t{i}_0", "input": f"Q{i}?\n\n{text[4000 + 300 * i: 4300 + 300 * i]}",
              "output": f"answer {i}"} for i in range(4)]  # fmt: skip
    for task in ("qasper", "qmsum"):
        write_scrolls(data, task, "validation", val)
        write_scrolls(data, task, "train", train)
    return data


def test_end_to_end_on_local_files_with_resume(make_checkpoint, tmp_path):
    data = scrolls_data(tmp_path)
    ckpt = make_checkpoint()
    base = dict(model=str(ckpt), tasks="qasper,qmsum", data_dir=str(data), max_new_tokens=6)
    whole = run_scrolls(ScrollsSettings(**base, out=str(tmp_path / "whole.json"), samples=str(tmp_path / "s.jsonl")),
                        progress=False)  # fmt: skip
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [(s["task"], s["id"]) for s in samples] == [(t, i) for t in ("qasper", "qmsum") for i in ("v1", "v2", "v3")]
    first = samples[0]
    assert first["references"] == ["Anne Elliot", "his daughter"] and first["truncated_tokens"] == 0
    assert set(first) >= {"prompt_tokens", "prediction", "scores", "exemplar_ids"}
    qasper = whole["results"]["qasper"]
    assert qasper["n"] == 3 and qasper["metric"] == "f1" and len(qasper["exemplar_ids"]) == 2  # 2-shot default
    assert (
        whole["results"]["qmsum"]["metric"] == "geometric_rouge" and len(whole["results"]["qmsum"]["exemplar_ids"]) == 1
    )
    expected = scrolls_scores(
        "geometric_rouge", [s["prediction"] for s in samples[3:]], [s["references"] for s in samples[3:]]
    )
    assert whole["results"]["qmsum"]["rougeL"] == expected["rougeL"]
    assert whole["settings"]["per_task"]["qasper"]["template"] == "{CONTEXT} Q: {QUESTION} A:"

    def stop_after_four(done):
        if done == 4:
            raise KeyboardInterrupt

    cut = ScrollsSettings(**base, out=str(tmp_path / "cut.json"))
    with pytest.raises(KeyboardInterrupt):
        run_scrolls(cut, progress=False, on_unit=stop_after_four)
    with pytest.raises(MegaevalError, match="pass --resume"):
        run_scrolls(cut, progress=False)
    with pytest.raises(
        MegaevalError, match=r"differs from the interrupted one \(settings.max_new_tokens: 6 then, 7 now\)"
    ):
        run_scrolls(ScrollsSettings(**{**base, "max_new_tokens": 7}, out=cut.out, resume=True), progress=False)
    resumed = run_scrolls(ScrollsSettings(**base, out=cut.out, resume=True), progress=False)
    for task in ("qasper", "qmsum"):  # the same results, but for the measured memory
        assert resumed["results"][task].pop("peak_memory_bytes") > 0 and whole["results"][task].pop("peak_memory_bytes")
        assert resumed["results"][task] == whole["results"][task]
    assert not (tmp_path / "cut.json.partial.jsonl").exists()


def test_scoring_only_mode(tmp_path):
    data = scrolls_data(tmp_path)
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps(p) for p in [
        {"task": "qasper", "id": "v1", "prediction": "Anne Elliot."},
        {"task": "qasper", "id": "v2", "prediction": "in Somersetshire"},
    ]))  # fmt: skip
    out = tmp_path / "r.json"
    args = ["scrolls", "--predictions", str(preds), "--data-dir", str(data), "--tasks", "qasper", "--out", str(out)]
    refused = runner.invoke(app, args)  # 2 of 3 examples: a headline score would hide the missing one
    assert refused.exit_code == 2 and "predicts 2 of the 3 qasper examples (1 missing)" in refused.stderr
    assert not out.exists()
    result = runner.invoke(app, [*args, "--allow-partial"])
    assert result.exit_code == 0, result.output
    assert "coverage" in result.stdout and "2/3" in result.stdout  # shown beside the score
    res = json.loads(out.read_text())["results"]["qasper"]
    # v1: exact match after normalisation (F1 1); v2: tokens {in, somersetshire} vs {somersetshire}: P 1/2, R 1, F1 2/3
    assert res["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2) and res["exact_match"] == 50.0
    assert res["n"] == 2 and res["coverage"] == "2/3"
    preds.write_text(json.dumps({"id": "nope", "prediction": "x"}))
    bad = runner.invoke(app, ["scrolls", "--predictions", str(preds), "--data-dir", str(data), "--tasks", "qasper",
                              "--out", str(out)])  # fmt: skip
    assert bad.exit_code == 2 and "id 'nope' is not in the qasper data" in bad.stderr


def test_scrolls_errors(make_checkpoint, tmp_path):
    data = scrolls_data(tmp_path)

    def run(*args):
        return runner.invoke(
            app, ["scrolls", "--model", str(make_checkpoint()), "--out", str(tmp_path / "o.json"), *args]
        )

    for args, message in [
        (["--tasks", "gov_report", "--data-dir", str(data)], "unknown scrolls task(s) gov_report"),
        (["--tasks", "narrative_qa", "--data-dir", str(data)], "no validation data for narrative_qa"),
        (["--tasks", "qasper", "--data-dir", str(data), "--truncation", "both"], "unknown --truncation 'both'"),
        (["--tasks", "qasper", "--data-dir", str(data), "--shots", "9"], "9 shots asked but the train split has 4"),
    ]:
        result = run(*args)
        assert result.exit_code == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.output


# ---- fixed-context models: the whole few-shot prompt fits (issue 23, A6); --stop '' refused (A8)

SAMPLES = REPO / "data_prep" / "samples" / "scrolls"
TINY = "embedded:transformer-tiny"  # an hf Transformer, max_context 512, no BOS under --bos auto


def sample_rows(split: str) -> dict[str, dict]:
    rows = [json.loads(line) for line in (SAMPLES / "qmsum" / f"{split}.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in rows}


def test_fixed_context_one_shot_qmsum_fits_the_whole_prompt(monkeypatch, tmp_path):
    # used to stop: "this state would hold 21,947 tokens, beyond max_context 512" (the 1-shot prefix was not cut)
    settings = ScrollsSettings(model=TINY, tasks="qmsum", data_dir=str(SAMPLES), limit=3, max_new_tokens=8,
                               out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    report, seen = run_recording(monkeypatch, settings)
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    tok, val, train = seen["tokenizer"], sample_rows("validation"), sample_rows("train")
    assert report["settings"]["bos_effective"] is False
    (prefix,) = seen["prefix"]  # read once for the task
    (shot_id,) = samples[0]["exemplar_ids"]
    shot_q, _, shot_doc = train[shot_id]["input"].partition("\n\n")
    shot_ref = train[shot_id]["output"]
    shown = tok.decode(prefix)  # the exemplar keeps its question, answer and joiner, and the ends of its document
    assert shown.endswith(f" Q: {shot_q} A: {shot_ref}\n\n")
    assert shown.startswith(shot_doc[:40]) and shot_doc.rstrip()[-20:] in shown
    naive_prefix = len(tok.encode(f"{shot_doc} Q: {shot_q} A: {shot_ref}\n\n"))  # what an unlimited model reads
    assert naive_prefix > 20_000
    assert len(samples) == len(seen["prompt"]) == 3
    for s, (ids, start) in zip(samples, seen["prompt"], strict=True):
        question, _, document = val[s["id"]]["input"].partition("\n\n")
        assert start == len(prefix)  # each example starts from the prefix's state
        assert s["prompt_tokens"] == len(prefix) + len(ids) <= 512 - 8
        text = tok.decode(ids)
        assert text.endswith(f" Q: {question} A:") and text.startswith(document[:40])
        naive = len(tok.encode(f"{document} Q: {question} A:"))
        assert s["truncated_tokens"] == naive - len(ids) > 0
        assert s["exemplar_truncated_tokens"] == [naive_prefix - len(prefix)]
        assert s["truncated_tokens"] + sum(s["exemplar_truncated_tokens"]) == naive_prefix + naive - s["prompt_tokens"]
    res = report["results"]["qmsum"]
    assert res["truncated_tokens"] == sum(s["truncated_tokens"] for s in samples) and res["examples_truncated"] == 3
    assert res["exemplar_truncated_tokens"] == [naive_prefix - len(prefix)]
    fit = report["settings"]["per_task"]["qmsum"]["context_fit"]
    bare_prefix = len(tok.encode(f" Q: {shot_q} A: {shot_ref}\n\n"))
    longest = max(len(tok.encode(f" Q: {r['input'].partition(chr(10) * 2)[0].strip()} A:")) for r in val.values())
    share = (512 - 8 - bare_prefix - longest) // 2  # what is left for documents, halved: exemplar and example
    assert fit == {"rule": "equal_document_shares", "prompt_budget": 504, "prefix_fixed_tokens": bare_prefix,
                   "example_reserve": longest, "document_share": share, "prefix_tokens": len(prefix),
                   "example_budget": 504 - len(prefix)}  # fmt: skip
    assert share - 2 <= len(prefix) - bare_prefix <= share  # the exemplar's document got its share (± tokenizing)
    assert all(len(ids) >= 504 - len(prefix) - 1 for ids, _ in seen["prompt"])  # the example got the rest


def test_fixed_context_prefix_is_the_same_for_every_example_and_every_limit(monkeypatch, tmp_path):
    runs = {}
    for limit in (1, 3):
        settings = ScrollsSettings(model=TINY, tasks="qmsum", data_dir=str(SAMPLES), limit=limit, max_new_tokens=2,
                                   out=str(tmp_path / f"r{limit}.json"))  # fmt: skip
        with monkeypatch.context() as m:
            runs[limit] = run_recording(m, settings)[1]
    (prefix,) = runs[3]["prefix"]
    assert runs[1]["prefix"] == [prefix]  # --limit does not change the exemplar's cut
    assert [start for _, start in runs[3]["prompt"]] == [len(prefix)] * 3
    assert runs[1]["prompt"][0] == runs[3]["prompt"][0]  # nor the first example's prompt


def test_fixed_context_refuses_only_when_the_non_document_parts_do_not_fit(tmp_path):
    val, train = sample_rows("validation"), sample_rows("train")
    tok = load_model(TINY).tokenizer
    first = next(iter(val.values()))
    question = first["input"].partition("\n\n")[0].strip()
    shot = train["qmsum-test-m01-q03"]  # the seeded draw (the report names it)
    shot_q = shot["input"].partition("\n\n")[0]
    bare = len(tok.encode(f" Q: {shot_q} A: {shot['output']}\n\n")) + len(tok.encode(f" Q: {question} A:"))
    base = ["scrolls", "--model", TINY, "--tasks", "qmsum", "--data-dir", str(SAMPLES), "--limit", "1",
            "--no-progress", "--samples", str(tmp_path / "s.jsonl")]  # fmt: skip
    out = tmp_path / "r.json"
    ok = runner.invoke(app, [*base, "--max-new-tokens", "8", "--model-args", f"max_context={bare + 8}", "--out",
                             str(out)])  # fmt: skip
    assert ok.exit_code == 0, ok.output  # exactly room for the non-document parts: no document token is left
    (sample,) = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert sample["prompt_tokens"] == bare and sample["exemplar_ids"] == ["qmsum-test-m01-q03"]
    one_short = ["--max-new-tokens", "8", "--model-args", f"max_context={bare + 7}"]
    for args, left in [(one_short, bare - 1), ([], 0)]:  # [] : QMSum's 512 new tokens fill the 512-token context
        refused = runner.invoke(app, [*base, *args, "--out", str(tmp_path / "no.json")])
        assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
        assert refused.stderr.startswith(f"error: qmsum: the prompt without its documents needs {bare} tokens")
        assert f"leaves {left}; use fewer --shots, fewer --max-new-tokens, or a model with a longer" in refused.stderr
        assert "window-policy" not in refused.stderr and not (tmp_path / "no.json").exists()


def test_empty_stop_string_is_refused(tmp_path):
    data = scrolls_data(tmp_path)
    out = tmp_path / "o.json"
    result = runner.invoke(app, ["scrolls", "--tasks", "qasper", "--data-dir", str(data), "--limit", "1",
                                 "--max-new-tokens", "2", "--stop", "", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith("error: --stop '': an empty stop string") and not out.exists()
    with pytest.raises(MegaevalError, match="--stop ''"):  # the library refuses it too
        run_scrolls(ScrollsSettings(tasks="qasper", data_dir=str(data), stop=["\n", ""], out=str(out)))


def test_unlimited_context_prompts_and_predictions_are_unchanged(monkeypatch, make_checkpoint, tmp_path):
    data = scrolls_data(tmp_path)
    settings = ScrollsSettings(model=str(make_checkpoint()), tasks="qasper", data_dir=str(data), max_new_tokens=4,
                               dtype="float64", out=str(tmp_path / "r.json"),
                               samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    report, seen = run_recording(monkeypatch, settings)
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    lines = [line for split in ("train", "validation") for line in (data / "qasper" / f"{split}.jsonl").open()]
    rows = {r["id"]: r for r in map(json.loads, lines)}
    lm = load_model(settings.model, dtype="float64")
    assert lm.max_context is None
    shots = "".join(f"{rows[i]['input'].partition(chr(10) * 2)[2]} Q: {rows[i]['input'].partition(chr(10) * 2)[0]} "
                    f"A: {rows[i]['output']}\n\n" for i in samples[0]["exemplar_ids"])  # fmt: skip
    prefix = [lm.tokenizer.bos_id] + lm.tokenizer.encode(shots)  # the naive rendering: nothing cut
    assert seen["prefix"] == [prefix] and len(samples[0]["exemplar_ids"]) == 2
    for s, (ids, _) in zip(samples, seen["prompt"], strict=True):
        question, _, document = rows[s["id"]]["input"].partition("\n\n")
        assert ids == lm.tokenizer.encode(f"{document} Q: {question} A:")
        assert s["truncated_tokens"] == 0 and s["exemplar_truncated_tokens"] == [0, 0]
        logits, state = prefill(lm, prefix + ids, lm.init_state(1))  # from scratch, in one call
        assert s["prediction"] == greedy_generate(lm, logits, state, 4, ["\n"]).text.strip()
    assert report["settings"]["per_task"]["qasper"]["context_fit"] is None
    assert report["results"]["qasper"]["exemplar_truncated_tokens"] == [0, 0]


@pytest.mark.parametrize("mode", ["middle", "left", "right"])
def test_few_shot_fit_gives_each_document_an_equal_share(sp_model, mode):
    tok = SentencePieceTokenizer(sp_model)
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")
    long, short = Example("a", "Who is Anne?", text[:3000], ["Anne"]), Example("b", "Where?", text[3000:3100], ["Bath"])
    template, reserve = "{CONTEXT} Q: {QUESTION} A:", 12
    form = PromptForm(template, [long, short])
    fit = fit_few_shot(tok, form, [tok.bos_id], 600, 50, mode, reserve)
    shown, kept = tok.decode(fit.ids[1:]), f" Q: Who is Anne? A: Anne\n\n{short.document} Q: Where? A: Bath\n\n"
    assert fit.ids[0] == tok.bos_id and shown.endswith(kept)  # every question, answer and joiner; the short one whole
    fixed = 1 + len(tok.encode(" Q: Who is Anne? A: Anne\n\n Q: Where? A: Bath\n\n"))
    share = (600 - 50 - fixed - reserve) // 3  # two exemplars and the example
    assert fit.facts is not None and fit.facts["document_share"] == share and fit.facts["prefix_fixed_tokens"] == fixed
    whole = f"{long.document} Q: Who is Anne? A: Anne\n\n{short.document} Q: Where? A: Bath\n\n"
    naive = [tok.bos_id, *tok.encode(whole)]
    assert fit.dropped[1] == 0 and fit.dropped[0] == len(naive) - len(fit.ids) > 0  # the short one is whole
    short_doc = len(tok.encode(short.document))
    assert len(fit.ids) <= fixed + share + short_doc + 2  # the long one got its share (± joining)
    assert fit.budget == 550 - len(fit.ids) >= reserve + share + (share - short_doc) - 2  # the short one's rest
    assert fit_few_shot(tok, form, [tok.bos_id], None, 50, mode, 0).ids == naive  # unlimited


# ---- bad input refused at the boundary (issue 23, D): exit 2, one error line naming the field and the fix, no
# traceback, nothing written


def refused(args: list[str], root) -> str:
    """Run `megaeval scrolls ARGS`; assert it stopped cleanly, leaving the tree under `root` as it was."""
    before = tree_state(root)
    result = runner.invoke(app, ["scrolls", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    assert tree_diff(before, tree_state(root)) == []
    return result.stderr


def test_predictions_with_a_model_are_refused(tmp_path):
    data = scrolls_data(tmp_path)
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"task": "qasper", "id": i, "prediction": "Anne"}) + "\n"
                             for i in ("v1", "v2", "v3")))  # fmt: skip
    base = ["--predictions", str(preds), "--data-dir", str(data), "--tasks", "qasper",
            "--out", str(tmp_path / "r.json")]  # fmt: skip
    for extra, named in [(["--model", "embedded:rfa-tiny"], "so --model embedded:rfa-tiny would be ignored"),
                         (["--model-args", "max_context=64"], "so --model-args would be ignored")]:  # fmt: skip
        message = refused([*base, *extra], tmp_path)
        assert f"--predictions scores the predictions in {preds} without a model, {named}" in message
        assert "drop --model and --model-args to score the predictions, or drop --predictions" in message
    with pytest.raises(MegaevalError, match="would be ignored"):  # the library refuses it too
        run_scrolls(ScrollsSettings(model="embedded:rfa-tiny", predictions=str(preds), tasks="qasper",
                                    data_dir=str(data), out=str(tmp_path / "r.json")))  # fmt: skip
    assert runner.invoke(app, ["scrolls", *base]).exit_code == 0  # without the model: scored


INPUT_FIX = "write each input as SCROLLS does: the question, a blank line, then the document"


@pytest.mark.parametrize(
    ("split", "field", "value", "problem", "fix"),
    [
        ("validation", "input", "Who is Anne? Chapter 1. Sir Walter Elliot", "'input' has no blank line, so the whole "
         "input would be the question and the document empty", INPUT_FIX),
        ("validation", "input", "", "'input' is empty", INPUT_FIX),
        ("validation", "input", " \n\n ", "'input' is empty", INPUT_FIX),
        ("validation", "input", "\n\nChapter 1. Sir Walter Elliot", "'input' has no question", INPUT_FIX),
        ("validation", "input", "Who is Anne?\n\n  \n", "'input' has no document", INPUT_FIX),
        ("validation", "output", "", "'output' is empty", "give every row its reference answer"),
        ("validation", "output", "  ", "'output' is empty", "give every row its reference answer"),
        ("train", "output", "", "'output' is empty", "give every row its reference answer"),  # an exemplar's answer
    ],
)  # fmt: skip
def test_rows_without_a_question_document_or_reference_are_refused(make_checkpoint, tmp_path, split, field, value,
                                                                   problem, fix):  # fmt: skip
    data = scrolls_data(tmp_path)
    path = data / "qasper" / f"{split}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1][field] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = refused(["--model", str(make_checkpoint()), "--tasks", "qasper", "--data-dir", str(data),
                       "--out", str(tmp_path / "r.json")], tmp_path)  # fmt: skip
    assert message.startswith(f"error: {path} row 2: {problem}") and f"; {fix}" in message
    with pytest.raises(MegaevalError, match=f"row 2: {problem}"):
        group_examples(rows, str(path))


@pytest.mark.parametrize(
    "template",
    [
        "{FOO} {CONTEXT} Q: {QUESTION} A:",
        "{CONTEXT} Q: {QUESTION} A: {}",
        "{0}: {CONTEXT} Q: {QUESTION} A:",
        "{CONTEXT} Q: {QUESTION} {question} A:",
    ],
)
def test_templates_with_unknown_fields_are_refused(tmp_path, template):
    data = scrolls_data(tmp_path)
    field = next(f for f in ("{FOO}", "{}", "{0}", "{question}") if f in template)
    message = refused(["--tasks", "qasper", "--data-dir", str(data), "--template", template, "--out",
                       str(tmp_path / "r.json")], tmp_path)  # fmt: skip
    assert message.startswith(f"error: --template {template!r} has an unknown field {field}")
    assert "use only {CONTEXT} (the document) and {QUESTION} (the question)" in message
    with pytest.raises(MegaevalError, match="unknown field"):
        run_scrolls(ScrollsSettings(tasks="qasper", data_dir=str(data), template=template, out=str(tmp_path / "r")))
