"""Train the embedded tiny Mamba-2: a Mamba-2 causal LM saved in transformers' layout (Mamba2ForCausalLM).

Same data, tokenizer and recipe as the tiny MEGALODON, RFA and Transformer (tiny_training.py): five Austen novels,
Persuasion held out, 512-token windows, 800 AdamW steps. Trained with megaeval's own Mamba-2 code
(megaeval/models/recurrent/mamba2.py: autograd runs through its SSD chunks; a Mamba-1 of this size takes 20 s a step
on a CPU core through its selective scan, transformers' pure-PyTorch Mamba path minutes), written as transformers
writes it, then read back by transformers, whose logits must equal megaeval's. About 2.2 s a step on two cores.
The sentencepiece model of megaeval/assets/megalodon-tiny is saved beside it as the same transformers tokenizer the
tiny Transformer carries.

    OMP_NUM_THREADS=2 python -m megaeval.data_prep.train_tiny_mamba2 --out megaeval/assets/mamba2-tiny --minutes 45
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import tiny_training as recipe
from .tokenizer import hf_tokenizer_from_sentencepiece

TINY = dict(
    vocab_size=4096,
    hidden_size=128,
    state_size=16,
    num_hidden_layers=6,
    expand=2,
    conv_kernel=4,
    num_heads=8,
    head_dim=32,
    n_groups=1,
    chunk_size=64,
    layer_norm_epsilon=1e-5,
    residual_in_fp32=True,
    tie_word_embeddings=True,
    use_bias=False,
    use_conv_bias=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
TRAIN_CHUNK = 64  # SSD chunk while training


def build_model(seed: int) -> Any:
    """A freshly initialised Mamba-2 of the TINY config (float32), initialised as transformers initialises one."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from megaeval.models.recurrent.mamba2 import Mamba2Config as Config
    from megaeval.models.recurrent.mamba2 import Mamba2Model

    torch.manual_seed(seed)
    reference = Mamba2ForCausalLM(Mamba2Config(**TINY))
    model = Mamba2Model(Config.from_hf({"model_type": "mamba2", **TINY}, "TINY"), chunk=TRAIN_CHUNK)
    model.load_state_dict(reference.state_dict(), strict=True)
    return model


def save(model: Any, out: Path, tokenizer: Path) -> None:
    """config.json, model.safetensors and the tokenizer, as MambaForCausalLM.save_pretrained writes them."""
    from transformers import Mamba2Config

    from megaeval.models.recurrent.checkpoint import save_checkpoint

    save_checkpoint(model, out, hf_tokenizer_from_sentencepiece(tokenizer), Mamba2Config(**TINY).to_dict())


def check_with_transformers(out: Path, model: Any, window: torch.Tensor) -> float:
    """Largest logit difference between transformers' reading of the saved model and megaeval's (float64)."""
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
    ours = model.double()
    with torch.no_grad():
        want = theirs(input_ids=window, use_cache=False).logits
        hidden, _ = ours(window, ours.init_state(window.shape[0]))
        got = ours.logits(hidden)
    model.float()
    return float((got - want).abs().max() / want.abs().max())


def train(out: Path, s: recipe.TrainSettings, tokenizer: Path = recipe.SHARED_TOKENIZER) -> dict:
    """Train the model; write it and its transformers tokenizer to `out`; return the log."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    data = recipe.book_tokens(sp, recipe.TRAIN_BOOKS)
    model = build_model(s.seed).train()

    def logits_of(inputs: torch.Tensor) -> torch.Tensor:
        hidden, _ = model(inputs, model.init_state(inputs.shape[0]))
        return model.logits(hidden)

    def loss_of(window: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits_of(window[:, :-1]).flatten(0, 1).float(), window[:, 1:].flatten())

    log = recipe.train_model(model, loss_of, data, s, TINY)
    held_out = recipe.book_tokens(sp, [recipe.HELD_OUT])
    log["heldout"] = recipe.heldout_ppl(recipe.window_nll_sum(logits_of), held_out, context=s.seq_len)
    print(f"held-out {recipe.HELD_OUT}: {log['heldout']}", flush=True)
    save(model, out, tokenizer)
    log["transformers_max_rel_logit_diff"] = check_with_transformers(out, model, held_out[None, :300])
    print(f"transformers reads it back: max relative logit difference {log['transformers_max_rel_logit_diff']:.1e}")
    if log["transformers_max_rel_logit_diff"] > 1e-5:  # transformers computes norms and the scan in float32
        raise SystemExit("transformers' logits of the saved model differ from megaeval's")
    recipe.write_log(out, log)
    return log


def main() -> None:
    args = recipe.make_parser(__doc__, tokenizer=True).parse_args()
    train(args.out, recipe.settings_from(args), args.tokenizer)


if __name__ == "__main__":
    main()
