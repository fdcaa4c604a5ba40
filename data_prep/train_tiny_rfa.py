"""Train the embedded tiny RFA: a gated, gaussian random-feature-attention LM in the rfa format.

Same data, tokenizer and recipe as the tiny MEGALODON (train_tiny.py, tiny_training.py): five
Austen novels, Persuasion held out, the sentencepiece model of megaeval/assets/megalodon-tiny.
Uses megaeval's own RFA code (megaeval/models/rfa/model.py) in float32; autograd runs through its
chunked form. Writes config.json, model.safetensors and a copy of the tokenizer.

One addition to the recipe: each training window starts at a random absolute position in
[0, --max-position) (the state's position counter), because the model's only position signal is an
absolute sinusoidal embedding. Trained on positions 0..511 alone, it would meet unseen embeddings
past 512 tokens; with random offsets it learns not to depend on where a sequence starts, so the
perplexity sweep can read it far past its training windows.

    OMP_NUM_THREADS=1 python -m megaeval.data_prep.train_tiny_rfa --out megaeval/assets/rfa-tiny
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from megaeval.models.rfa import RFAConfig, RFAModel, save_checkpoint
from megaeval.models.rfa.adapter import CHUNK

from . import tiny_training as recipe

TINY = RFAConfig(
    vocab_size=4096,
    model_dim=128,
    num_layers=4,
    num_heads=2,
    num_features=32,
    feature_map="gaussian",
    gated=True,
    ffn_hidden_dim=512,
    norm_eps=1e-5,
    denominator_floor=1e-3,
    tie_embeddings=True,
)


def train(
    out: Path, s: recipe.TrainSettings, tokenizer: Path = recipe.SHARED_TOKENIZER, max_position: int = 65536
) -> dict:
    """Train the model; write the checkpoint (with a copy of the tokenizer) to `out`; return the log."""
    import sentencepiece as spm

    torch.manual_seed(s.seed)
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    data = recipe.book_tokens(sp, recipe.TRAIN_BOOKS)
    model = RFAModel(TINY).init_weights(s.seed).train()
    positions = torch.Generator().manual_seed(s.seed + 1)

    def logits_of(inputs: torch.Tensor, position: int = 0) -> torch.Tensor:
        state = model.init_state(len(inputs))
        state.position = position
        return model.logits(model(inputs, state, chunk=CHUNK)[0])

    def loss_of(window: torch.Tensor) -> torch.Tensor:
        position = int(torch.randint(0, max(1, max_position - s.seq_len), (), generator=positions))
        return F.cross_entropy(logits_of(window[:, :-1], position).flatten(0, 1), window[:, 1:].flatten())

    log = recipe.train_model(model, loss_of, data, s, TINY.to_dict())
    log["max_position"] = max_position
    held, nll_sum = recipe.book_tokens(sp, [recipe.HELD_OUT]), recipe.window_nll_sum(logits_of)
    log["heldout"] = recipe.heldout_ppl(nll_sum, held, context=4096)
    log["heldout_by_context"] = [recipe.heldout_ppl(nll_sum, held, context=c) for c in (512, 4096, 16384)]
    print(f"held-out {recipe.HELD_OUT}: {log['heldout_by_context']}", flush=True)
    save_checkpoint(model, out, tokenizer, copy_tokenizer=True)
    recipe.write_log(out, log)
    return log


def main() -> None:
    parser = recipe.make_parser(__doc__, tokenizer=True)
    parser.add_argument("--max-position", type=int, default=65536, help="windows start at random positions below it")
    args = parser.parse_args()
    train(args.out, recipe.settings_from(args), args.tokenizer, args.max_position)


if __name__ == "__main__":
    main()
