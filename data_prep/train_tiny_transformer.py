"""Train the embedded tiny Transformer: a Llama-style causal LM (transformers) with a 512-token context.

Same data, tokenizer and recipe as the tiny MEGALODON (train_tiny.py, tiny_training.py): five
Austen novels, Persuasion held out, 512-token windows. The sentencepiece model of
megaeval/assets/megalodon-tiny is saved as an equivalent transformers tokenizer (same ids), so the
`hf` family loads the directory offline.

    OMP_NUM_THREADS=1 python -m megaeval.data_prep.train_tiny_transformer --out megaeval/assets/transformer-tiny
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .tiny_training import (
    HELD_OUT,
    SHARED_TOKENIZER,
    TRAIN_BOOKS,
    TrainSettings,
    add_arguments,
    book_tokens,
    heldout_ppl,
    log_header,
    settings_from,
    train_loop,
    write_log,
)
from .tokenizer import hf_tokenizer_from_sentencepiece

CONTEXT = 512
TINY = dict(
    vocab_size=4096,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=CONTEXT,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


def build_model(seed: int) -> Any:
    """A freshly initialised LlamaForCausalLM of the TINY config (float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY))


def nll_sum_of(model: Any) -> Callable[[torch.Tensor], float]:
    """Summed NLL of a window's targets, read from an empty cache."""

    def nll_sum(window: torch.Tensor) -> float:
        logits = model(input_ids=window[:, :-1], use_cache=False).logits
        return float(F.cross_entropy(logits[0].float(), window[0, 1:], reduction="sum"))

    return nll_sum


def train(out: Path, s: TrainSettings, tokenizer: Path = SHARED_TOKENIZER) -> dict:
    """Train the model; write it and its transformers tokenizer to `out` (save_pretrained); return the log."""
    import sentencepiece as spm

    if s.seq_len > CONTEXT:
        raise SystemExit(f"--seq-len {s.seq_len} exceeds the model's context {CONTEXT}")
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    data = book_tokens(sp, TRAIN_BOOKS)
    model = build_model(s.seed).train()
    log = log_header(TINY, sum(p.numel() for p in model.parameters()), data, s)

    def loss_of(window: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=window[:, :-1], use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten())

    log.update(train_loop(model, loss_of, data, s))
    model.eval()
    with torch.no_grad():
        log["heldout"] = heldout_ppl(nll_sum_of(model), book_tokens(sp, [HELD_OUT]), context=CONTEXT)
    print(f"held-out {HELD_OUT}: {log['heldout']}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    hf_tokenizer_from_sentencepiece(tokenizer).save_pretrained(out)
    write_log(out, log)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--tokenizer", type=Path, default=SHARED_TOKENIZER, help="sentencepiece model to train with")
    args = parser.parse_args()
    train(args.out, settings_from(args), args.tokenizer)


if __name__ == "__main__":
    main()
