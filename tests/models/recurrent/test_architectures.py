"""Mamba-1, FalconMamba, Mamba-2, RWKV-4 and RecurrentGemma: megaeval's chunked models against transformers'
one-pass forward and a token loop, state carried across any split of calls, rows independent, states in float32 or
wider, one-line config errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from megaeval.errors import MegaevalError
from megaeval.models.recurrent.mamba import MambaConfig
from megaeval.models.recurrent.mamba2 import Mamba2Config
from megaeval.models.recurrent.recurrent_gemma import RecurrentGemmaConfig
from megaeval_testing.recurrent import (
    TINY,
    float64_faithful,
    megaeval_copy,
    random_tokens,
    read_in_calls,
    stress_rwkv,
    tiny_model,
)

KINDS = ["mamba", "falcon_mamba", "mamba2", "rwkv", "recurrent_gemma"]


def pair(kind: str, dtype: torch.dtype = torch.float64, chunk: int = 16, **overrides):
    ref = tiny_model(kind, **overrides).to(dtype)
    if kind == "rwkv":
        stress_rwkv(ref)
    return ref, megaeval_copy(ref, chunk)


def row_of(state, r: int):
    """Row r of a state as a state of one row (every tensor of every layer sliced)."""
    layers = [type(s)(*(getattr(s, f.name)[r : r + 1].clone() for f in dataclasses.fields(s))) for s in state.layers]
    return type(state)(layers, state.position)


def recurrent_parts(layer) -> torch.Tensor:
    """The tensor a layer's recurrence accumulates in (SSM state, WKV numerator, RG-LRU state, attention keys)."""
    for name in ("ssm", "num", "lru", "keys"):
        if hasattr(layer, name):
            return getattr(layer, name)
    raise AssertionError(f"no recurrent tensor in {layer}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", [1, 37, 200])
def test_one_call_equals_transformers_one_pass(kind: str, T: int) -> None:
    ref, model = pair(kind, chunk=64 if kind == "mamba2" else 16)
    tokens = random_tokens(2, T)
    with torch.no_grad(), float64_faithful():
        want = ref(input_ids=tokens, use_cache=False).logits
    got, _ = read_in_calls(model, tokens)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-8 * want.abs().max())


@pytest.mark.parametrize("kind", KINDS)
def test_any_split_equals_one_call_and_the_token_loop(kind: str) -> None:
    _, model = pair(kind)
    tokens = random_tokens(2, 200, seed=1)
    whole, end = read_in_calls(model, tokens)
    split, end_split = read_in_calls(model, tokens, [1, 5, 63, 2, 129])
    torch.testing.assert_close(split, whole, rtol=1e-10, atol=1e-10 * whole.abs().max())
    with torch.no_grad():
        hidden, end_ref = model.forward_reference(tokens, model.init_state(2))
    torch.testing.assert_close(model.logits(hidden), whole, rtol=1e-10, atol=1e-10 * whole.abs().max())
    for a, b in zip(end.layers, end_split.layers, strict=True):
        torch.testing.assert_close(recurrent_parts(a), recurrent_parts(b), rtol=1e-10, atol=1e-12)
    assert end.position == end_split.position == 200


@pytest.mark.parametrize("kind", KINDS)
def test_transformers_float32_casts_are_the_only_difference(kind: str) -> None:
    """Against transformers as shipped (float32 inside its float64 model) agreement is about 1e-7, not better."""
    ref, model = pair(kind)
    tokens = random_tokens(1, 100)
    with torch.no_grad():
        want = ref(input_ids=tokens, use_cache=False).logits
    got, _ = read_in_calls(model, tokens)
    torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-5, atol=1e-5 * want.abs().max())


@pytest.mark.parametrize("kind", ["mamba", "mamba2", "rwkv", "recurrent_gemma"])
def test_state_size_is_constant_and_rows_are_independent(kind: str) -> None:
    _, model = pair(kind)
    tokens = random_tokens(3, 120, seed=2)
    _, after10 = read_in_calls(model, tokens[:, :10])
    logits, after120 = read_in_calls(model, tokens)
    assert after10.nbytes() == after120.nbytes() == model.init_state(3).nbytes()
    alone, _ = read_in_calls(model, tokens[1:2])
    torch.testing.assert_close(logits[1:2], alone, rtol=1e-12, atol=1e-12)
    padded = tokens.clone()
    padded[0, 50:] = 0  # right padding changes nothing before it
    logits_padded, _ = read_in_calls(model, padded)
    torch.testing.assert_close(logits_padded[0, :50], logits[0, :50], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["falcon_mamba", "mamba2", "rwkv", "recurrent_gemma"])
def test_repeat_then_continue_equals_continuing_each_row(kind: str) -> None:
    _, model = pair(kind)
    prefix, cont = random_tokens(2, 30, seed=3), random_tokens(6, 20, seed=4)
    _, state = read_in_calls(model, prefix)
    together, _ = read_in_calls(model, cont, state=state.repeat(3))
    for i in range(6):
        one, _ = read_in_calls(model, cont[i : i + 1], state=row_of(state, i // 3))
        torch.testing.assert_close(together[i : i + 1], one, rtol=1e-12, atol=1e-12)
    assert state.batch_size == 2


@pytest.mark.parametrize("kind", ["mamba", "mamba2", "rwkv", "recurrent_gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_states_are_float32_for_narrow_models(kind: str, dtype: torch.dtype) -> None:
    ref, model = pair(kind, dtype=dtype)
    state = model.init_state(1)
    assert all(recurrent_parts(s).dtype == torch.float32 for s in state.layers if not hasattr(s, "keys"))
    logits, after = read_in_calls(model, random_tokens(1, 70))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert all(recurrent_parts(s).dtype == torch.float32 for s in after.layers if not hasattr(s, "keys"))
    with torch.no_grad():
        want = ref(input_ids=random_tokens(1, 70), use_cache=False).logits.float()
    tol = 1e-4 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(logits, want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize(
    "field, value, message",
    [("hidden_size", 0, "hidden_size must be a positive integer"), ("hidden_act", "gelu", "hidden_act 'gelu'"),
     ("use_bias", "yes", "use_bias must be true or false"), ("layer_norm_epsilon", -1, "layer_norm_epsilon")],
)  # fmt: skip
def test_config_errors_are_one_line(field: str, value, message: str) -> None:
    raw = tiny_model("mamba").config.to_dict()
    with pytest.raises(MegaevalError, match=message) as err:
        MambaConfig.from_hf({**raw, field: value}, "c.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("c.json")


def test_mamba2_chunk_form_equals_the_token_loop_with_extreme_decays() -> None:
    """Decays that underflow within a chunk (dt * A down to -700) and none at all: chunk form == token loop."""
    from megaeval.models.recurrent.mamba2 import ssd_chunk, ssd_reference

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 40, 3, 4, generator=g, dtype=torch.float64)
    b, c = (torch.randn(2, 40, 3, 5, generator=g, dtype=torch.float64) for _ in range(2))
    h0 = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    for log_a in (-700 * torch.rand(2, 40, 3, generator=g, dtype=torch.float64), torch.zeros(2, 40, 3).double()):
        y, h = ssd_chunk(x, log_a, b, c, h0)
        y_ref, h_ref = ssd_reference(x, log_a, b, c, h0)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)


def test_mamba2_config_checks_heads() -> None:
    raw = tiny_model("mamba2").config.to_dict()
    with pytest.raises(MegaevalError, match="num_heads \\* head_dim"):
        Mamba2Config.from_hf({**raw, "head_dim": 8}, "c.json")
    with pytest.raises(MegaevalError, match="time_step_limit"):
        Mamba2Config.from_hf({**raw, "time_step_limit": [1.0]}, "c.json")


def test_rwkv_chunk_form_equals_the_token_loop_with_extreme_keys() -> None:
    """Keys of +-300 and bonuses that dwarf them (exp would overflow float64 unshifted): chunk form == token loop."""
    from megaeval.models.recurrent.rwkv import EMPTY_MAX, wkv_chunk, wkv_reference

    g = torch.Generator().manual_seed(6)
    k = 300 * torch.randn(2, 40, 5, generator=g, dtype=torch.float64)
    v = torch.randn(2, 40, 5, generator=g, dtype=torch.float64)
    w, u = -torch.rand(5, generator=g, dtype=torch.float64) * 5, 200 * torch.randn(5, generator=g, dtype=torch.float64)
    start = (torch.zeros(2, 5).double(), torch.zeros(2, 5).double(), torch.full((2, 5), EMPTY_MAX).double())
    for state in (start, wkv_reference(w, u, k[:, :7], v[:, :7], *start)[1:]):
        got, want = wkv_chunk(w, u, k, v, *state), wkv_reference(w, u, k, v, *state)
        assert torch.isfinite(got[0]).all()
        torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
        # the states may keep different maxima: compare the sums they stand for, relative to the larger max
        top = torch.maximum(got[3], want[3])
        for a, b in ((got[1], want[1]), (got[2], want[2])):
            torch.testing.assert_close(a * (got[3] - top).exp(), b * (want[3] - top).exp(), rtol=1e-10, atol=1e-12)


def test_recurrent_gemma_attends_only_within_its_window() -> None:
    """A token further back than attention_window_size reaches the attention layers only through the recurrent
    ones: with the recurrent layers' outputs cut off, changing it changes nothing."""
    _, model = pair("recurrent_gemma")
    for block in model.model.layers:
        if hasattr(block.temporal_block, "rg_lru"):
            with torch.no_grad():
                block.temporal_block.linear_out.weight.zero_()
                block.temporal_block.linear_out.bias.zero_()
    tokens = random_tokens(1, 60, seed=7)
    other = tokens.clone()
    other[0, 20] = (other[0, 20] + 1) % 300  # 39 tokens before the last one: outside a 16-token window
    a, _ = read_in_calls(model, tokens, [7, 30, 23])
    b, _ = read_in_calls(model, other)
    torch.testing.assert_close(a[:, 36:], b[:, 36:], rtol=1e-12, atol=1e-12)  # 36 = 20 + 16: out of reach
    assert not torch.allclose(a[:, 35], b[:, 35])  # the last position that still sees token 20


@pytest.mark.parametrize("field", ["num_key_value_heads", "lru_width"])
def test_recurrent_gemma_derived_sizes_are_filled_only_when_absent(field: str) -> None:
    """As transformers does: absent or null takes the derived value; 0 is kept, and refused by its own name."""
    raw = tiny_model("recurrent_gemma").config.to_dict()
    derived = {"num_key_value_heads": raw["num_attention_heads"], "lru_width": raw["hidden_size"]}[field]
    for absent in ({k: v for k, v in raw.items() if k != field}, {**raw, field: None}):
        assert getattr(RecurrentGemmaConfig.from_hf(absent, "c.json"), field) == derived
    with pytest.raises(MegaevalError, match=f"^c.json: {field} must be a positive integer, got 0$"):
        RecurrentGemmaConfig.from_hf({**raw, field: 0}, "c.json")


# ------------------------------------------------------------------------------------- config.json, field by field

JUNK = (0, -1, "x", None)
# transformers' names for what a mamba_ssm config.json calls otherwise: never in a refusal of such a file
TRANSFORMERS_NAMES = (
    "hidden_size", "num_hidden_layers", "state_size", "conv_kernel", "head_dim", "n_groups", "time_step",
    "layer_norm_epsilon", "tie_word_embeddings", "use_bias", "use_conv_bias",
)  # fmt: skip


def mamba_ssm_config(layer: str) -> dict:
    """A tiny config.json of the original state-spaces layout, Mamba1 or Mamba2."""
    ssm = {"d_state": 8, "d_conv": 4, "expand": 2, "dt_rank": 2, "bias": False, "conv_bias": True}
    if layer == "Mamba2":
        ssm = {**ssm, "layer": "Mamba2", "headdim": 16, "ngroups": 2, "chunk_size": 16, "dt_limit": [0.0, 1e9]}
    return {"d_model": 32, "n_layer": 2, "vocab_size": 300, "ssm_cfg": ssm, "rms_norm": True, "norm_epsilon": 1e-5,
            "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 4,
            "tie_embeddings": True}  # fmt: skip


def read_config(raw: dict) -> object:
    """What loading reads from config.json `raw` (either layout), as load() does it."""
    from megaeval.models.recurrent.config import architecture_of, from_mamba_ssm, is_mamba_ssm_config

    hf = from_mamba_ssm(raw, "c.json") if is_mamba_ssm_config(raw) else raw
    return architecture_of(hf, "c.json").classes()[0].from_hf(hf, "c.json")


def numeric_places(value, at: tuple = ()) -> list[tuple]:
    """The key path of every number in a JSON value (booleans aside), however deep."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    found = []
    for key, child in items:
        if isinstance(child, (int, float)) and not isinstance(child, bool):
            found.append((*at, key))
        found += numeric_places(child, (*at, key))
    return found


def with_value(raw: dict, place: tuple, value) -> dict:
    raw = json.loads(json.dumps(raw))
    parent = raw
    for key in place[:-1]:
        parent = parent[key]
    parent[place[-1]] = value
    return raw


def tiny_configs() -> dict[str, dict]:
    """The config.json of each tiny architecture (transformers' to_dict, as save_pretrained writes it) and of the two
    mamba_ssm layouts."""
    import transformers

    configs = {kind: getattr(transformers, TINY[kind][0])(**TINY[kind][2], vocab_size=300).to_dict() for kind in KINDS}
    return {**configs, "mamba_ssm": mamba_ssm_config("Mamba1"), "mamba2_ssm": mamba_ssm_config("Mamba2")}


@pytest.mark.parametrize("kind", [*KINDS, "mamba_ssm", "mamba2_ssm"])
def test_every_numeric_field_set_to_junk_is_read_or_refused_in_one_line(kind: str) -> None:
    """0, -1, a string or null in any numeric field: a config (the field unused, or null meaning derived) or one line
    naming config.json and the field as the file writes it, never a traceback."""
    raw = tiny_configs()[kind]
    read_config(raw)
    for place in numeric_places(raw):
        for junk in JUNK:
            try:
                read_config(with_value(raw, place, junk))
            except MegaevalError as e:
                text = str(e)
                assert "\n" not in text and text.startswith("c.json: "), (place, junk, text)
                if kind.endswith("_ssm"):
                    assert not any(name in text for name in TRANSFORMERS_NAMES), (place, junk, text)


@pytest.mark.parametrize(
    "place, value, message",
    [(("d_model",), "x", "d_model must be a positive integer, got 'x'"),
     (("n_layer",), None, "n_layer must be a positive integer, got None"),
     (("ssm_cfg", "headdim"), 0, "ssm_cfg.headdim must be a positive integer, got 0"),
     (("ssm_cfg", "expand"), "x", "ssm_cfg.expand must be a positive integer, got 'x'"),
     (("ssm_cfg", "ngroups"), 3, r"ssm_cfg.ngroups 3 does not divide the 4 heads \(ssm_cfg.expand \* d_model / "),
     (("ssm_cfg", "headdim"), 24, r"ssm_cfg.expand \* d_model \(64\) is not divisible by ssm_cfg.headdim 24"),
     (("ssm_cfg", "dt_limit"), [0.0, 0.0], r"ssm_cfg.dt_limit must be \[low, high\] with 0 <= low < high"),
     (("ssm_cfg", "d_conv"), -1, "ssm_cfg.d_conv must be a positive integer, got -1"),
     (("norm_epsilon",), 0, "norm_epsilon must be a positive number, got 0"),
     (("tie_embeddings",), "yes", "tie_embeddings must be true or false, got 'yes'")],
)  # fmt: skip
def test_mamba_ssm_config_errors_name_the_field_as_the_file_does(place: tuple, value, message: str) -> None:
    with pytest.raises(MegaevalError, match=f"^c.json: {message}") as err:
        read_config(with_value(mamba_ssm_config("Mamba2"), place, value))
    assert "\n" not in str(err.value)


def test_mamba_ssm_defaults_are_mamba_ssm_s() -> None:
    """Absent fields take state-spaces' MambaConfig defaults: vocab_size 50277 padded to a multiple of 8, ..."""
    raw = {k: v for k, v in mamba_ssm_config("Mamba1").items() if k not in ("vocab_size", "pad_vocab_size_multiple")}
    config = read_config({**raw, "ssm_cfg": {}})
    assert (config.vocab_size, config.state_size, config.conv_kernel, config.expand) == (50280, 16, 4, 2)


def test_recurrent_gemma_rotary_factor_is_a_fraction_giving_channel_pairs() -> None:
    raw = tiny_configs()["recurrent_gemma"]
    rope = raw["rope_parameters"]
    for bad, message in ((1.5, "at most 1, got 1.5"), (0, "above 0 and at most 1, got 0")):
        with pytest.raises(MegaevalError, match=f"^c.json: rope_parameters.partial_rotary_factor must be .*{message}$"):
            RecurrentGemmaConfig.from_hf({**raw, "rope_parameters": {**rope, "partial_rotary_factor": bad}}, "c.json")
    with pytest.raises(MegaevalError, match="partial_rotary_factor 0.5625 rotates 9 of a head's 16 channels, an odd"):
        RecurrentGemmaConfig.from_hf({**raw, "rope_parameters": {**rope, "partial_rotary_factor": 0.5625}}, "c.json")
    # as transformers before 5 wrote them: at the top level, read (and refused) there
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    config = RecurrentGemmaConfig.from_hf({**legacy, "partial_rotary_factor": 0.25, "rope_theta": 500.0}, "c.json")
    assert (config.partial_rotary_factor, config.rope_theta) == (0.25, 500.0)
    with pytest.raises(MegaevalError, match="^c.json: partial_rotary_factor must be a number above 0 and at most 1"):
        RecurrentGemmaConfig.from_hf({**legacy, "partial_rotary_factor": 2.0}, "c.json")
