"""Train the embedded tiny Transformer: a Llama-style causal LM (transformers) with a 512-token context.

Same data, tokenizer and recipe as the tiny MEGALODON (train_tiny.py, tiny_training.py): five
Austen novels, Persuasion held out, 512-token windows. The sentencepiece model of
megaeval/assets/megalodon-tiny is saved as an equivalent transformers tokenizer (same ids), so the
`hf` family loads the directory offline.

    OMP_NUM_THREADS=1 python -m megaeval.data_prep.train_tiny_transformer --out megaeval/assets/transformer-tiny
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import tiny_training as recipe
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


def train(out: Path, s: recipe.TrainSettings, tokenizer: Path = recipe.SHARED_TOKENIZER) -> dict:
    """Train the model; write it and its transformers tokenizer to `out` (save_pretrained); return the log."""
    import sentencepiece as spm

    if s.seq_len > CONTEXT:
        raise SystemExit(f"--seq-len {s.seq_len} exceeds the model's context {CONTEXT}")
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    data = recipe.book_tokens(sp, recipe.TRAIN_BOOKS)
    model = build_model(s.seed).train()

    def logits_of(inputs: torch.Tensor) -> torch.Tensor:
        return model(input_ids=inputs, use_cache=False).logits

    def loss_of(window: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits_of(window[:, :-1]).flatten(0, 1).float(), window[:, 1:].flatten())

    log = recipe.train_model(model, loss_of, data, s, TINY)
    log["heldout"] = recipe.heldout_ppl(
        recipe.window_nll_sum(logits_of), recipe.book_tokens(sp, [recipe.HELD_OUT]), context=CONTEXT
    )
    print(f"held-out {recipe.HELD_OUT}: {log['heldout']}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    hf_tokenizer_from_sentencepiece(tokenizer).save_pretrained(out)
    recipe.write_log(out, log)
    return log


def main() -> None:
    args = recipe.make_parser(__doc__, tokenizer=True).parse_args()
    train(args.out, recipe.settings_from(args), args.tokenizer)


if __name__ == "__main__":
    main()
