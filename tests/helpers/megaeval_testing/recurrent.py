"""Tiny random recurrent checkpoints (Mamba, FalconMamba, Mamba-2, RWKV-4, RecurrentGemma) saved by transformers
itself with save_pretrained, beside a small byte-level BPE tokenizer: what a user's checkpoint directory looks like."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from megaeval.models.recurrent.config import ARCHITECTURES

from .hf_ranks import save_bpe_tokenizer

VOCAB = 300
# model_type -> (transformers config class, causal LM class, tiny config fields)
TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mamba": ("MambaConfig", "MambaForCausalLM",
              dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM",
                     dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM",
               dict(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, head_dim=16,
                    num_heads=4, n_groups=2, chunk_size=16)),
    "rwkv": ("RwkvConfig", "RwkvForCausalLM",
             dict(hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64,
                  context_length=4096)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                        dict(hidden_size=32, lru_width=32, num_hidden_layers=3, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=16, intermediate_size=48, attention_window_size=16,
                             conv1d_width=4, block_types=["recurrent", "recurrent", "attention"])),
}  # fmt: skip
MODEL_TYPES = tuple(kind for kind in TINY if kind in ARCHITECTURES)  # those megaeval runs


def tiny_model(model_type: str, vocab_size: int = VOCAB, seed: int = 0, **overrides: Any) -> Any:
    """A random tiny transformers causal LM of `model_type` (float32), its parameters perturbed away from their
    initial values (unit norms, zero biases) so that no term of the forward pass hides."""
    import transformers

    config_name, model_name, fields = TINY[model_type]
    config = getattr(transformers, config_name)(
        **{**fields, "vocab_size": vocab_size, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, **overrides}
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or "norm" in name or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_tiny(folder: Path, model_type: str, seed: int = 0, **overrides: Any) -> Path:
    """`tiny_model` and a 300-piece BPE tokenizer written to `folder` as transformers writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = save_bpe_tokenizer(folder, vocab_size=VOCAB, chars=20_000)
    tiny_model(model_type, len(tok), seed, **overrides).save_pretrained(folder)
    return folder


@contextmanager
def float64_faithful() -> Iterator[None]:
    """transformers' recurrent models with their float32 casts lifted for float64 tensors.

    Its recurrent models cast to float32 inside norms, residuals and scans (`.float()`, `.to(torch.float32)`,
    `.type(torch.float32)`) even in a float64 model, which caps agreement at about 1e-7; within this context those
    casts leave float64 tensors as they are, so its one-pass forward is a float64 reference.
    """
    original_float, original_to = torch.Tensor.float, torch.Tensor.to

    def keep_float(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if self.dtype == torch.float64 else original_float(self, *args, **kwargs)

    def keep_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        target = kwargs.get("dtype", args[0] if args else None)
        if self.dtype == torch.float64 and target is torch.float32:
            return self
        return original_to(self, *args, **kwargs)

    def keep_type(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = kwargs.get("dtype", args[0] if args else None)
        if self.dtype == torch.float64 and target is torch.float32:
            return self
        return original_type(self, *args, **kwargs)

    original_type = torch.Tensor.type
    torch.Tensor.float, torch.Tensor.to, torch.Tensor.type = keep_float, keep_to, keep_type
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to, torch.Tensor.type = original_float, original_to, original_type


def chunk_parallel_scores(rank: int, world: int, init_method: str, checkpoint: str, cases: list) -> list[dict]:
    """On each of `world` ranks: each case (B, T, prefix) scored with --chunk-parallel `world` and with one process
    (float64, the same starting state after a prefix); the largest relative NLL error and the largest logit error
    of one more token read from the two states."""
    from megaeval import load_model
    from megaeval.models import chunk_parallel_lm

    from .distributed import TIMEOUT_S, join

    out = []
    with join(rank, world, init_method, world, TIMEOUT_S) as ctx:
        lm = load_model(checkpoint, dtype="float64")
        spread = chunk_parallel_lm(lm, ctx.chunk)
        for i, (B, T, prefix) in enumerate(cases):
            toks = torch.randint(
                3, lm.tokenizer.vocab_size, (B, prefix + T + 1), generator=torch.Generator().manual_seed(i)
            )
            start = lm.init_state(B)
            if prefix:
                _, start = lm.score(toks[:, :prefix], toks[:, 1 : prefix + 1], start)
            inputs, targets = toks[:, prefix : prefix + T], toks[:, prefix + 1 :]
            ref, ref_state = lm.score(inputs, targets, start.clone())
            nll, state = spread.score(inputs, targets, start.clone())
            assert state.position == ref_state.position
            nxt, _ = lm.forward(toks[:, -1:], state)
            nxt_ref, _ = lm.forward(toks[:, -1:], ref_state)
            out.append({"rel": float(((nll - ref).abs() / ref.abs().clamp_min(1e-300)).max()),
                        "next": float((nxt - nxt_ref).abs().max() / nxt_ref.abs().max())})  # fmt: skip
    return out


def stress_rwkv(ref: Any) -> Any:
    """An RWKV with decays, bonuses and keys large enough that the stable WKV form matters (in place; returned)."""
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "time_decay" in name or "time_first" in name:
                p.copy_(2 * torch.randn_like(p))
            if name.endswith("attention.key.weight"):
                p.mul_(30)
    return ref


def megaeval_copy(ref: Any, chunk: int = 16) -> Any:
    """megaeval's model of a transformers model's architecture, holding its tensors (strict), in its dtype."""
    config_class, model_class = ARCHITECTURES[ref.config.model_type].classes()
    dtype = next(ref.parameters()).dtype
    model = model_class(config_class.from_hf(ref.config.to_dict(), "config.json"), chunk=chunk).to(dtype)
    model.load_state_dict(ref.state_dict(), strict=True)
    return model.eval()


def random_tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    """Token ids [B, T] in [3, VOCAB) (no special tokens), seeded."""
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def read_in_calls(model: Any, tokens: torch.Tensor, sizes: list[int] | None = None, state: Any = None):
    """Logits of `tokens` read by a recurrent model in calls of `sizes` tokens (one call by default), and the state
    after them."""
    state = model.init_state(tokens.shape[0]) if state is None else state
    out, at = [], 0
    with torch.no_grad():
        for n in sizes or [tokens.shape[1]]:
            hidden, state = model(tokens[:, at : at + n], state)
            out.append(model.logits(hidden))
            at += n
    return torch.cat(out, 1), state
