"""megaeval models inside lm-evaluation-harness (megaeval.harness): request grouping, rolling modes, generation,
and the harness's own CLI on local tasks.

Every test here needs lm-eval, beyond the extras `make test` installs: the module is the integration tier's
(`make test-integration` installs lm-eval 0.4.13; elsewhere it is skipped when lm-eval is missing).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration
pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from megaeval import MegaevalError, load_model  # noqa: E402
from megaeval.harness import (  # noqa: E402
    MegaevalLM,
    generate,
    loglikelihoods,
    rolling_full,
    rolling_harness,
)
from megaeval.models.megalodon import MegalodonLM, save_checkpoint  # noqa: E402
from megaeval.scoring.generate import greedy_generate, prefill  # noqa: E402
from megaeval.scoring.requests import bos_prefix, encode_pair, score_requests  # noqa: E402
from megaeval_testing import AUSTEN, REPO, FakeTokenizer, random_model, small_args  # noqa: E402
from megaeval_testing.references import continuation_logprob  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def ids_lm() -> MegalodonLM:
    """A random small MEGALODON in float64 that is given token ids (chunk 8)."""
    return MegalodonLM(random_model(small_args(), 0, torch.float64), FakeTokenizer(), None, kernels="torch")


def ids(n: int, seed: int) -> list[int]:
    g = random.Random(seed)
    return [g.randrange(3, 512) for _ in range(n)]


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


# ---------------------------------------------------------------------------- registration and packaging


def test_the_registry_resolves_megaeval():
    from lm_eval.api.registry import get_model, model_registry

    assert get_model("megaeval") is MegaevalLM
    assert "hf" in model_registry  # registering megaeval keeps the harness's own models known


def test_pyproject_declares_the_plugin_and_the_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["lm_eval.models"]["megaeval"] == "megaeval.harness:MegaevalLM"
    assert project["optional-dependencies"]["harness"] == ["lm-eval>=0.4,<0.5"]


# ---------------------------------------------------------------------------- the scoring functions


def test_grouped_loglikelihoods_do_not_depend_on_request_order(ids_lm):
    # grouping reuses score_requests, whose read-once accounting test_academic checks (forward_tokens)
    contexts = [ids(n, seed) for seed, n in enumerate((1, 5, 13, 20))]
    pairs = [(c, ids(k, 100 * i + k)) for i, c in enumerate(contexts) for k in (1, 2, 7)]
    pairs += [(contexts[1], ids(3, 999)), (contexts[1], [])]  # a context asked again later, an empty continuation
    first = loglikelihoods(ids_lm, pairs)
    order = list(range(len(pairs)))
    random.Random(0).shuffle(order)
    shuffled = loglikelihoods(ids_lm, [pairs[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(pairs))] == first  # bit for bit
    assert first[-1] == (0.0, True)
    for (context, cont), (logprob, greedy) in zip(pairs[:-1], first[:-1], strict=True):
        alone, alone_greedy = continuation_logprob(ids_lm, context, cont)  # one whole pass from scratch
        assert abs(alone - logprob) <= 1e-10 and alone_greedy == greedy


@pytest.mark.parametrize("batch_size", [3, 8])
def test_loglikelihoods_in_batches_equal_one_context_at_a_time(ids_lm, batch_size):
    """Contexts scored `batch_size` at a time (hf: choices of several contexts share calls) give what each gets
    alone, for a family that shares calls (hf) and one that scores each context on its own (MEGALODON)."""
    from tests.test_batched_scoring import make_lm

    contexts = [ids(n, seed) for seed, n in enumerate((1, 5, 13, 20, 9, 30))]
    pairs = [(c, ids(k, 100 * i + k)) for i, c in enumerate(contexts) for k in (1, 2, 7)]
    for lm in (ids_lm, make_lm("hf", torch.float64)):
        got = loglikelihoods(lm, pairs, batch_size=batch_size)
        for (context, cont), (logprob, greedy) in zip(pairs, got, strict=True):
            alone, alone_greedy = continuation_logprob(lm, context, cont)
            assert abs(alone - logprob) <= 1e-10 and alone_greedy == greedy


def test_rolling_full_is_one_carried_pass(ids_lm):
    doc = [1] + ids(203, 7)  # 25 chunks of 8
    logits, _ = ids_lm.forward(torch.tensor([doc[:-1]]), ids_lm.init_state(1))
    expected = float(torch.log_softmax(logits[0].double(), -1).gather(-1, torch.tensor(doc[1:])[:, None]).sum())
    assert rel(rolling_full(ids_lm, doc), expected) <= 1e-9
    assert rolling_full(ids_lm, [1]) == 0.0


def test_rolling_harness_is_the_harness_window_split(ids_lm):
    tokens = ids(150, 3)
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 1, 32, 1)]
    assert len(windows) == 5 and len(windows[-1][1]) == 150 - 4 * 32  # the last window is partial
    expected = sum(continuation_logprob(ids_lm, c, t)[0] for c, t in windows)
    got = rolling_harness(ids_lm, tokens, 1, 32)
    assert rel(got, expected) <= 1e-9
    assert rel(got, rolling_full(ids_lm, [1] + tokens)) > 1e-6  # windows forget; one pass does not
    assert rel(rolling_harness(ids_lm, tokens, 1, 1000), rolling_full(ids_lm, [1] + tokens)) <= 1e-9


def test_fixed_context_rolling_uses_the_window_policy(ids_lm, monkeypatch):
    doc = [1] + ids(40, 5)
    monkeypatch.setattr(ids_lm, "max_context", 16, raising=False)
    expected = sum(continuation_logprob(ids_lm, doc[s : s + 1], doc[s + 1 : s + 17])[0] for s in range(0, 40, 16))
    assert rel(rolling_full(ids_lm, doc), expected) <= 1e-9  # disjoint: windows of 16 from fresh states
    assert rel(rolling_full(ids_lm, doc, "sliding:8"), expected) > 1e-6


# ---------------------------------------------------------------------------- the LM, on a checkpoint


@pytest.fixture(scope="module")
def checkpoint(sp_model, tmp_path_factory) -> Path:
    """A random small MEGALODON checkpoint with the test tokenizer."""
    return save_checkpoint(random_model(None, 0, torch.float32), tmp_path_factory.mktemp("harness") / "ckpt", sp_model)


@pytest.fixture(scope="module")
def harness_lm(checkpoint) -> MegaevalLM:
    return MegaevalLM(pretrained=str(checkpoint), dtype="float64", device="cpu", batch_size=1)


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


def test_loglikelihood_equals_academic_scoring_and_follows_the_bos_policy(harness_lm, checkpoint):
    lm = harness_lm.model
    context = "Anne Elliot walked to the window. She saw"
    conts = [" the sea", " nothing at all", " Captain Wentworth"]
    got = harness_lm.loglikelihood([request("loglikelihood", context + " ", c.lstrip()) for c in conts])
    pairs = [encode_pair(lm, context + " ", c.lstrip()) for c in conts]
    expected = score_requests(lm, bos_prefix(lm, True) + pairs[0][0], [p[1] for p in pairs])
    assert [g[0] for g in got] == pytest.approx(expected.loglikelihoods, abs=1e-9)
    assert [g[1] for g in got] == expected.is_greedy
    brute = [continuation_logprob(lm, [lm.tokenizer.bos_id] + ctx, cont) for ctx, cont in pairs]  # independent
    assert [g[0] for g in got] == pytest.approx([b[0] for b in brute], abs=1e-9)
    assert [g[1] for g in got] == [b[1] for b in brute]
    no_bos = MegaevalLM(pretrained=str(checkpoint), dtype="float64", device="cpu", bos="never")
    unprefixed = no_bos.loglikelihood([request("loglikelihood", context, conts[0])])[0][0]
    assert unprefixed == pytest.approx(score_requests(lm, pairs[0][0], [pairs[0][1]]).loglikelihoods[0], abs=1e-9)
    assert abs(unprefixed - got[0][0]) > 1e-6
    empty = harness_lm.loglikelihood([request("loglikelihood", "", "Anne")])[0][0]  # conditioned on BOS once
    alone, _ = continuation_logprob(lm, [lm.tokenizer.bos_id], lm.tokenizer.encode("Anne"))
    assert empty == pytest.approx(alone, abs=1e-9)


def test_rolling_and_generation_through_the_lm(harness_lm):
    lm = harness_lm.model
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")[:800]
    (got,) = harness_lm.loglikelihood_rolling([request("loglikelihood_rolling", text)])
    assert rel(got, rolling_full(lm, [lm.tokenizer.bos_id] + lm.tokenizer.encode(text))) <= 1e-12
    prompt = "Sir Walter Elliot, of Kellynch Hall,"
    (out,) = harness_lm.generate_until([request("generate_until", prompt, {"until": ["zzz"], "max_gen_toks": 5})])
    logits, state = prefill(lm, [lm.tokenizer.bos_id] + lm.tokenizer.encode(prompt), lm.init_state(1))
    full = greedy_generate(lm, logits, state, 5)
    assert out == full.text
    stop = full.text[len(full.text) // 2 :][:2]
    if stop.strip():
        (cut,) = harness_lm.generate_until([request("generate_until", prompt, {"until": stop, "max_gen_toks": 5})])
        assert cut == full.text[: full.text.find(stop)]
    assert generate(lm, [lm.tokenizer.bos_id] + lm.tokenizer.encode(prompt), [], 5) == full.text
    with pytest.raises(MegaevalError, match="greedily"):
        harness_lm.generate_until([request("generate_until", prompt, {"do_sample": True})])


@pytest.mark.parametrize(
    "args, message",
    [
        ({}, "pretrained"),
        ({"bos": "maybe"}, "bos"),
        ({"rolling": "sometimes"}, "rolling"),
        ({"window_policy": "wide"}, "window-policy"),
        ({"max_context": 64}, "unknown option"),
    ],
)
def test_bad_model_args_fail_with_one_line(checkpoint, args, message):
    kwargs = {"pretrained": str(checkpoint)} if args else {}
    with pytest.raises(MegaevalError, match=message):
        MegaevalLM(**kwargs, **args, device="cpu")


# ---------------------------------------------------------------------------- the harness's CLI (integration)


def write_tasks(folder: Path) -> Path:
    """Three local tasks (multiple choice, rolling, generation) as YAML + jsonl files; returns the folder."""
    paras = [p.strip() for p in (AUSTEN / "emma.txt").read_text(encoding="utf-8").split("\n\n") if len(p) > 200]
    rows = {
        "mc": [{"question": paras[i][:120], "choices": [paras[(i + k) % 10][120:150] for k in range(4)],
                "answer": i % 4} for i in range(10)],
        "roll": [{"text": paras[i][: 300 + 100 * i]} for i in range(10)],
        "gen": [{"question": paras[i][:100], "answer": "the"} for i in range(10)],
    }  # fmt: skip
    specs = {
        "mc": 'output_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
        "doc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n",
        "roll": 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n",
        "gen": 'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 8\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, docs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / f"{name}.yaml").write_text(
            f"task: megaeval_test_{name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {folder / name}.jsonl\ntest_split: test\n{specs[name]}"
        )
    return folder


def run_harness(checkpoint: Path, tasks: Path, out: Path, tasks_csv: str, extra: str = "", ranks: int = 1) -> dict:
    """`python -m megaeval.harness` (or under torchrun); the logged samples by task."""
    prefix = TORCHRUN if ranks == 2 else [sys.executable]
    cmd = [*prefix, "-m", "megaeval.harness", "--model", "megaeval", "--model_args",
           f"pretrained={checkpoint},dtype=float64{extra}", "--device", "cpu", "--tasks", tasks_csv,
           "--include_path", str(tasks), "--limit", "8", "--log_samples", "--output_path", str(out)]  # fmt: skip
    env = {**ENV, "HF_HOME": str(out.parent / "hf")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=out.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = {}
    for path in out.rglob("samples_*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        samples[path.name.split("_20")[0].removeprefix("samples_")] = sorted(rows, key=lambda r: r["doc_id"])
    return samples


@pytest.fixture(scope="module")
def cli_runs(checkpoint, tmp_path_factory):
    """One run of the three tasks by default, one rolling run with rolling=harness and 64-token windows."""
    root = tmp_path_factory.mktemp("harness_cli")
    tasks = write_tasks(root / "tasks")
    every = "megaeval_test_mc,megaeval_test_roll,megaeval_test_gen"
    default = run_harness(checkpoint, tasks, root / "out", every)
    windows = run_harness(
        checkpoint, tasks, root / "out_harness", "megaeval_test_roll", ",rolling=harness,max_length=64"
    )
    return default, windows


@pytest.mark.integration
def test_harness_cli_gives_megaeval_numbers(cli_runs, checkpoint):
    default, windows = cli_runs
    lm = load_model(str(checkpoint), dtype="float64")
    bos = lm.tokenizer.bos_id
    assert len(default["megaeval_test_mc"]) == len(default["megaeval_test_roll"]) == 8
    for sample in default["megaeval_test_mc"]:
        args = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        pairs = [encode_pair(lm, context, cont) for context, cont in args]
        expected = score_requests(lm, [bos] + pairs[0][0], [p[1] for p in pairs])  # as `megaeval academic` does
        got = [float(r[0][0]) for r in sample["resps"]]
        assert max(abs(g - e) for g, e in zip(got, expected.loglikelihoods, strict=True)) <= 1e-6
        brute = [continuation_logprob(lm, [bos] + ctx, cont)[0] for ctx, cont in pairs]  # one pass each, from scratch
        assert max(abs(g - e) for g, e in zip(got, brute, strict=True)) <= 1e-6
    for full, split in zip(default["megaeval_test_roll"], windows["megaeval_test_roll"], strict=True):
        text = full["arguments"]["gen_args_0"]["arg_0"]
        doc = [bos] + lm.tokenizer.encode(text)
        nll, _ = lm.score(torch.tensor([doc[:-1]]), torch.tensor([doc[1:]]), lm.init_state(1))  # one pass
        assert rel(float(full["resps"][0][0]), -float(nll.sum())) <= 1e-9
        parts = [make_disjoint_window(w) for w in get_rolling_token_windows(doc[1:], bos, 64, 1)]
        expected = sum(continuation_logprob(lm, c, t)[0] for c, t in parts)
        assert rel(float(split["resps"][0][0]), expected) <= 1e-9
    longest = max(zip(default["megaeval_test_roll"], windows["megaeval_test_roll"], strict=True),
                  key=lambda fs: len(fs[0]["arguments"]["gen_args_0"]["arg_0"]))  # fmt: skip
    assert rel(float(longest[1]["resps"][0][0]), float(longest[0]["resps"][0][0])) > 1e-6  # 64-token windows forget
    for sample in default["megaeval_test_gen"]:
        prompt, kwargs = sample["arguments"]["gen_args_0"]["arg_0"], sample["arguments"]["gen_args_0"]["arg_1"]
        logits, state = prefill(lm, [bos] + lm.tokenizer.encode(prompt), lm.init_state(1))
        assert sample["resps"][0][0] == greedy_generate(lm, logits, state, 8, kwargs["until"]).text


@pytest.mark.integration
@pytest.mark.slow
def test_two_ranks_under_torchrun_give_the_single_process_samples(cli_runs, checkpoint, tmp_path):
    default, _ = cli_runs
    tasks = write_tasks(tmp_path / "tasks")
    every = "megaeval_test_mc,megaeval_test_roll,megaeval_test_gen"
    spread = run_harness(checkpoint, tasks, tmp_path / "out", every, ranks=2)
    for task, samples in default.items():
        assert [s["resps"] for s in spread[task]] == [s["resps"] for s in samples], task


@pytest.mark.integration
def test_a_bad_model_arg_is_one_line_and_exit_code_2(tmp_path):
    tasks = write_tasks(tmp_path / "tasks")
    proc = subprocess.run(
        [sys.executable, "-m", "megaeval.harness", "--model", "megaeval", "--model_args",
         f"pretrained={tmp_path / 'missing'}", "--device", "cpu", "--tasks", "megaeval_test_mc",
         "--include_path", str(tasks), "--limit", "1"],
        capture_output=True, text=True, env={**ENV, "HF_HOME": str(tmp_path / "hf")}, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert (
        proc.stderr.splitlines()[-1]
        == f"error: model not found: {tmp_path / 'missing'}; pass a checkpoint directory (or FAMILY:PATH)"
    )


@pytest.mark.parametrize("spec", ["embedded:transformer-tiny", "embedded:mamba2-tiny"])
def test_generate_until_in_batches_equals_one_request_at_a_time(spec):
    prompts = ["Sir Walter Elliot, of Kellynch Hall,", "It was", "Anne", "Captain Wentworth had no fortune. He"
               " had been lucky in his profession, but", "She"]  # fmt: skip
    kwargs = [{"until": ["\n"], "max_gen_toks": 12}] * 3 + [{"until": [","], "max_gen_toks": 7}] * 2
    requests = [request("generate_until", p, k) for p, k in zip(prompts, kwargs, strict=True)]
    one = MegaevalLM(pretrained=spec, dtype="float64", device="cpu", batch_size=1)
    many = MegaevalLM(pretrained=spec, dtype="float64", device="cpu", batch_size=4)
    auto = MegaevalLM(pretrained=spec, dtype="float64", device="cpu", batch_size="auto:8")
    alone = one.generate_until(requests)
    assert many.generate_until(requests) == alone == auto.generate_until(requests)
    lm = one.model
    for prompt, k, text in zip(prompts, kwargs, alone, strict=True):
        assert text == generate(lm, one.bos_tokens + lm.tokenizer.encode(prompt), k["until"], k["max_gen_toks"])


# ---------------------------------------------------------------------------- chat (--apply_chat_template)

# A template that writes BOS itself and has no system role (it raises on one, as many do).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system turn') }}"
    "{% endif %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n"
    "{% endif %}"
)
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory) -> Path:
    """embedded:transformer-tiny with CHAT_TEMPLATE, its tokenizer adding BOS by default (a Llama-style chat model)."""
    from megaeval.models import ASSETS

    folder = tmp_path_factory.mktemp("chat") / "transformer-tiny-chat"
    shutil.copytree(ASSETS / "transformer-tiny", folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return folder


def test_chat_methods_render_select_and_encode_as_lm_eval(chat_folder, caplog):
    lm = MegaevalLM(pretrained=str(chat_folder), dtype="float64", device="cpu")
    assert lm.bos_tokens == [1]  # the tokenizer adds BOS, so bos=auto does
    assert lm.chat_template(False) is None and lm.chat_template(None) is None
    assert lm.chat_template(True) == CHAT_TEMPLATE
    user, prefix = {"role": "user", "content": "Who wrote Emma?"}, {"role": "assistant", "content": "Answer:"}
    prompt = lm.apply_chat_template([user])
    assert prompt == "<s><|user|>\nWho wrote Emma?</s>\n<|assistant|>\n"
    assert lm.apply_chat_template([user, prefix], add_generation_prompt=False) == (
        "<s><|user|>\nWho wrote Emma?</s>\n<|assistant|>\nAnswer:"
    )  # the final assistant turn continued
    assert lm.apply_chat_template([{"role": "system", "content": "Be brief."}, user]) == prompt  # as HFLM: dropped
    assert lm.get_model_info()["megaeval"]["chat_template"]["system_turn_dropped"] is True
    # the template writes BOS: the context is read with that one BOS (HFLM's tok_encode), a plain one gets the policy's
    (got,) = lm.loglikelihood([request("loglikelihood", prompt, "Austen")])
    context, continuation = encode_pair(lm.model, prompt, "Austen")
    assert context[:2] == [1, context[1]] and context[1] != 1
    assert got == pytest.approx(continuation_logprob(lm.model, context, continuation), abs=1e-9)
    (plain,) = lm.loglikelihood([request("loglikelihood", "Who wrote Emma?", " Austen")])
    context, continuation = encode_pair(lm.model, "Who wrote Emma?", " Austen")
    assert plain == pytest.approx(continuation_logprob(lm.model, [1] + context, continuation), abs=1e-9)
    # lm-eval's selection among several templates, and a cache name that follows the templates
    name = lm.tokenizer_name
    assert name.startswith("transformer-tiny-chat-") and "/" not in name
    lm.model.tokenizer.tok.chat_template = {"default": CHAT_TEMPLATE, "plain": PLAIN_TEMPLATE}
    assert lm.tokenizer_name != name
    assert lm.chat_template(True) == CHAT_TEMPLATE
    assert lm.chat_template("plain") == PLAIN_TEMPLATE
    assert lm.apply_chat_template([user, prefix], add_generation_prompt=False) == (
        "user: Who wrote Emma?\nassistant: Answer:"
    )
    with pytest.raises(MegaevalError, match="--apply_chat_template nope: .* no template of that name; use one of: "
                       "default, plain"):  # fmt: skip
        lm.chat_template("nope")
    lm.model.tokenizer.tok.chat_template = {"plain": PLAIN_TEMPLATE}
    with pytest.raises(MegaevalError, match="no default; name one: --apply_chat_template NAME"):
        lm.chat_template(True)
    lm.model.tokenizer.tok.chat_template = CHAT_TEMPLATE
    assert lm.chat_template("plain") == CHAT_TEMPLATE  # a name for a single template: ignored, with a warning
    assert "one template without a name" in caplog.text
    base = MegaevalLM(pretrained="embedded:megalodon-tiny", device="cpu")  # sentencepiece: no chat template
    assert base.tokenizer_name.startswith("megalodon-tiny__tokenizer.model-")
    for ask in (lambda: base.chat_template(True), lambda: base.apply_chat_template([user])):
        with pytest.raises(MegaevalError, match=r"--apply_chat_template: the tokenizer of .*megalodon-tiny has no chat "
                           r"template; drop --apply_chat_template"):  # fmt: skip
            ask()


def write_chat_tasks(folder: Path) -> Path:
    """A multiple-choice and a generation task (with a gen_prefix) on three questions, one first-n exemplar each."""
    docs = [{"q": "Who wrote Emma?", "choices": ["Austen", "Dickens"], "a": 0},
            {"q": "Which is a colour?", "choices": ["red", "run"], "a": 0},
            {"q": "Two plus two?", "choices": ["three", "four"], "a": 1}]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    head = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'docs.jsonl'}\n"
            f"  cache_dir: {folder / 'datasets'}\ntest_split: test\nfewshot_split: test\nnum_fewshot: 1\n"
            'fewshot_config:\n  sampler: first_n\ndoc_to_text: "{{q}}"\n')  # fmt: skip
    (folder / "mc.yaml").write_text(
        f"task: megaeval_chat_mc\n{head}output_type: multiple_choice\ndoc_to_choice: choices\ndoc_to_target: a\n"
        "metric_list:\n  - metric: acc\n"
    )
    (folder / "gen.yaml").write_text(
        f"task: megaeval_chat_gen\n{head}output_type: generate_until\ndoc_to_target: \"{{{{choices[a]}}}}\"\n"
        'gen_prefix: "Answer:"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
    )  # fmt: skip
    return folder


def test_apply_chat_template_runs_give_hflm_prompts_and_numbers(chat_folder, tmp_path, monkeypatch):
    """lm-eval's simple_evaluate with apply_chat_template and fewshot_as_multiturn (and a system instruction the
    template cannot take): the adapter gets the chat-rendered contexts, scores HFLM's tokens (the template's BOS,
    none added) and gives HFLM's log-likelihoods, decisions and generations on the same model."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import megaeval.harness as harness

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    scored: list[tuple[list[int], list[int]]] = []

    def spy(lm, pairs, *args, **kwargs):
        scored.extend(pairs)
        return loglikelihoods(lm, pairs, *args, **kwargs)

    monkeypatch.setattr(harness, "loglikelihoods", spy)
    tasks = TaskManager(include_path=str(write_chat_tasks(tmp_path / "tasks")), include_defaults=False)
    mine = MegaevalLM(pretrained=str(chat_folder), dtype="float64", device="cpu")
    theirs = HFLM(pretrained=str(chat_folder), dtype="float64", device="cpu", batch_size=1)
    runs = [
        lm_eval.simple_evaluate(
            model=lm,
            tasks=["megaeval_chat_mc", "megaeval_chat_gen"],
            task_manager=tasks,
            limit=3,
            apply_chat_template=True,
            fewshot_as_multiturn=True,
            system_instruction="Be brief.",
            log_samples=True,
        )
        for lm in (mine, theirs)
    ]
    turn = "<|user|>\n{}</s>\n<|assistant|>\n{}"
    ask = ["Who wrote Emma?", "Which is a colour?", "Two plus two?"]
    shot = [turn.format(ask[1], "{}red</s>\n")] + [turn.format(ask[0], "{}Austen</s>\n")] * 2  # first-n, not itself
    mc, gen = (
        sorted(runs[0]["samples"][t], key=lambda s: s["doc_id"]) for t in ("megaeval_chat_mc", "megaeval_chat_gen")
    )
    assert [s["arguments"][0][0] for s in mc] == [
        "<s>" + shot[i].format("") + turn.format(ask[i], "") for i in range(3)
    ]  # the system turn dropped: the template has no system role
    assert [s["arguments"][0][0] for s in gen] == [
        "<s>" + shot[i].format("Answer: ") + turn.format(ask[i], "Answer:") for i in range(3)
    ]  # gen_prefix: the final assistant turn continued
    assert mc[0]["arguments"][0][0] == (
        "<s><|user|>\nWhich is a colour?</s>\n<|assistant|>\nred</s>\n<|user|>\nWho wrote Emma?</s>\n<|assistant|>\n"
    )  # one of them written out whole
    assert [[arg[1] for arg in s["arguments"]] for s in mc] == [
        ["Austen", "Dickens"],
        ["red", "run"],
        ["three", "four"],
    ]
    pairs = [arg for s in mc for arg in s["arguments"]]
    assert sorted(pair[0] for pair in scored) == sorted(
        theirs._encode_pair(context, choice)[0] for context, choice in pairs
    )
    assert all(ids[:1] == [1] and ids[1] != 1 for ids, _ in scored)  # the template's BOS, none added
    for task in ("megaeval_chat_mc", "megaeval_chat_gen"):
        a, b = (sorted(run["samples"][task], key=lambda s: s["doc_id"]) for run in runs)
        assert [s["arguments"] for s in a] == [s["arguments"] for s in b]
        if task == "megaeval_chat_mc":
            got = [r[0][0] for s in a for r in s["resps"]]
            assert got == pytest.approx([r[0][0] for s in b for r in s["resps"]], abs=1e-9)
            assert [s["acc"] for s in a] == [s["acc"] for s in b]
        else:
            assert [s["resps"] for s in a] == [s["resps"] for s in b]
    assert runs[0]["config"]["megaeval"]["chat_template"]["system_turn_dropped"] is True


@pytest.mark.integration
def test_apply_chat_template_without_a_template_is_one_line_and_exit_code_2(tmp_path):
    tasks = write_chat_tasks(tmp_path / "tasks")
    proc = subprocess.run(
        [sys.executable, "-m", "megaeval.harness", "--model", "megaeval", "--model_args",
         "pretrained=embedded:megalodon-tiny", "--device", "cpu", "--tasks", "megaeval_chat_mc",
         "--include_path", str(tasks), "--limit", "1", "--apply_chat_template"],
        capture_output=True, text=True, env={**ENV, "HF_HOME": str(tmp_path / "hf")}, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    line = proc.stderr.splitlines()[-1]
    assert line.startswith("error: --apply_chat_template: the tokenizer of megalodon:") and line.endswith(
        "megalodon-tiny has no chat template; drop --apply_chat_template (a base model reads the prompt as it is)"
    )


@pytest.mark.integration
def test_a_template_that_raises_inside_is_one_line_and_exit_code_2(chat_folder, tmp_path):
    """A TypeError inside the template (code the user brought) ends lm-eval's run with megaeval's one line."""
    folder = tmp_path / "raises"
    shutil.copytree(chat_folder, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": "{{ messages | length + 'x' }}"})
    )
    tasks = write_chat_tasks(tmp_path / "tasks")
    proc = subprocess.run(
        [sys.executable, "-m", "megaeval.harness", "--model", "megaeval", "--model_args", f"pretrained=hf:{folder}",
         "--device", "cpu", "--tasks", "megaeval_chat_mc", "--include_path", str(tasks), "--limit", "1",
         "--apply_chat_template"],
        capture_output=True, text=True, env={**ENV, "HF_HOME": str(tmp_path / "hf")}, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    line = proc.stderr.splitlines()[-1]
    assert line.startswith("error: --apply_chat_template: the chat template 'default' cannot be rendered (TypeError:")
