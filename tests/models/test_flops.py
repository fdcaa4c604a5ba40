"""Model FLOPs per token (the numerator of ppl-sweep's MFU) against torch's own count of a forward pass.

torch.utils.flop_counter counts every matmul the reference forward runs. The references compute attention as a
full square of scores and mask it (MEGALODON: one square per chunk; transformers' eager attention: the whole
call), while the model FLOPs count only the positions attended to; so the counted attention is scaled by the share
of unmasked pairs, found here by listing the pairs one by one.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from megaeval.kernels import select
from megaeval.models.hf.flops import flops_per_token as hf_flops_per_token
from megaeval.models.megalodon.config import chunked_keys_per_token
from megaeval_testing import random_model, small_args

LINEAR = ("wv", "wz", "wr", "wh1", "wh2", "fc1", "fc2", "fc3", "output")


def counted(run) -> tuple[int, dict[str, int]]:
    """Total FLOPs torch counts while `run()` runs, and the FLOPs by module name."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        run()
    by_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    return counter.get_total_flops(), by_module


def unmasked_share(length: int, allowed) -> float:
    """Pairs (query i, key j) of a [length, length] square that `allowed(i, j)` keeps, over all pairs."""
    return sum(allowed(i, j) for i in range(length) for j in range(length)) / length**2


@pytest.mark.parametrize("swiglu", [True, False])
@pytest.mark.parametrize("chunks", [1, 3])
def test_megalodon_flops_match_torchs_count_of_the_forward_pass(swiglu, chunks):
    args = small_args(swiglu=swiglu)
    c = args.chunk_size
    model = random_model(args, dtype=torch.float32)
    model.use_kernels(select("torch", torch.device("cpu"), torch.float32))
    T = chunks * c
    tokens = torch.randint(3, args.vocab_size, (1, T))
    total, by_module = counted(lambda: model.logits(model(tokens, model.init_state(1))[0]))
    linear = sum(v for name, v in by_module.items() if name.rpartition(".")[2] in LINEAR)
    cema = sum(v for name, v in by_module.items() if name.endswith(".cema"))  # not model FLOPs (nor matmuls)
    attention = total - linear - cema
    assert attention == args.num_layers * 2 * T * c * (args.z_dim + args.value_dim)  # full squares, one per chunk
    share = unmasked_share(c, lambda i, j: j <= i)  # the same in every chunk
    assert linear + attention * share == pytest.approx(T * args.flops_per_token(T), rel=1e-12)
    assert args.flops_per_token(None) == args.flops_per_token(T)


@pytest.mark.parametrize("length", [1, 5, 8, 13, 16, 27])
def test_chunked_keys_per_token_counts_each_tokens_keys(length):
    chunk = 8
    keys = sum(position % chunk + 1 for position in range(length))  # a token meets its chunk's tokens up to itself
    assert chunked_keys_per_token(chunk, length) == pytest.approx(keys / length, rel=1e-12)


def test_megalodon_flops_by_hand_for_7b_shapes():
    """The formula written out for the 7B shapes of bench/kernels.py (one layer, SwiGLU, chunk 4096)."""
    args = small_args(num_layers=1, model_dim=4096, z_dim=1024, value_dim=8192, num_heads=4, ffn_hidden_dim=11264,
                      chunk_size=4096, norm_num_groups=64, vocab_size=32000)  # fmt: skip
    D, Z, E, F = 4096, 1024, 8192, 11264
    projections = 2 * (D * E + D * Z + D * E + D * D + E * D + 3 * D * F)
    attention = 2 * (4096 + 1) / 2 * (Z + E)
    assert args.flops_per_token() == projections + attention + 2 * D * 32000


@pytest.mark.parametrize("kind", ["llama", "gpt2", "mistral"])
def test_hf_flops_match_torchs_count_of_the_forward_pass(kind):
    tf = pytest.importorskip("transformers")

    tiny = dict(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    gpt = dict(vocab_size=400, n_embd=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2)
    make = {
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**tiny, num_key_value_heads=2)),
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(**gpt)),
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**tiny, num_key_value_heads=2, sliding_window=8)),
    }  # fmt: skip
    torch.manual_seed(0)
    model = make[kind]().eval()
    model.config._attn_implementation = "eager"  # scores as explicit matmuls (a full masked square)
    T = 24
    total, by_module = counted(lambda: model(torch.randint(0, 400, (1, T))))
    linear = [f"{type(model).__name__}.{name}" for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]  # fmt: skip
    attention = total - sum(by_module.get(name, 0) for name in linear)  # scores and mixing, all the rest
    if kind == "mistral":
        share = unmasked_share(T, lambda i, j: j <= i and i - j < 8)
    else:
        share = unmasked_share(T, lambda i, j: j <= i)
    assert attention > 0
    assert total - attention + attention * share == pytest.approx(T * hf_flops_per_token(model, T), rel=1e-12)


def test_hf_flops_unknown_for_mixture_of_experts():
    tf = pytest.importorskip("transformers")

    config = tf.MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, num_local_experts=4)  # fmt: skip
    assert hf_flops_per_token(tf.MixtralForCausalLM(config), 16) is None


def test_hf_layer_windows_follow_layer_types_then_sliding_window():
    from types import SimpleNamespace

    from megaeval.models.hf.flops import layer_windows, window_keys_per_token

    types = ["sliding_attention", "full_attention"]
    assert layer_windows(SimpleNamespace(sliding_window=4, layer_types=types), 2) == [4, None]
    assert layer_windows(SimpleNamespace(sliding_window=4), 2) == [4, 4]
    assert layer_windows(SimpleNamespace(sliding_window=4, use_sliding_window=False), 2) == [None, None]
    assert layer_windows(SimpleNamespace(sliding_window=None), 1) == [None]
    assert window_keys_per_token(10, 4) == pytest.approx(sum(min(i + 1, 4) for i in range(10)) / 10)
    assert window_keys_per_token(10, None) == window_keys_per_token(10, 10) == 5.5
