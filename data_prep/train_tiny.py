"""Train megaeval's embedded default model: a SentencePiece tokenizer and a tiny MEGALODON.

Trains on five Jane Austen novels (data_prep/corpora/austen) and holds out Persuasion as the
validation stream. Uses megaeval's own model code and writes the official checkpoint layout.
The tokenizer it trains is the one every embedded model shares (see tiny_training.py).

    python -m megaeval.data_prep.train_tiny --out megaeval/assets/megalodon-tiny
"""

from __future__ import annotations

from pathlib import Path

import torch

from megaeval.models.megalodon import Megalodon, ModelArgs, save_checkpoint

from . import tiny_training as recipe
from .tokenizer import train_sentencepiece

VOCAB = 4096
TINY = ModelArgs(
    num_layers=4,
    model_dim=128,
    z_dim=64,
    value_dim=256,
    num_heads=2,
    ffn_hidden_dim=256,
    cema_ndim=8,
    chunk_size=128,
    norm_num_groups=16,
    swiglu=True,
    share_emb=True,
    vocab_size=VOCAB,
)


def train(out: Path, s: recipe.TrainSettings) -> dict:
    """Train tokenizer and model; write the checkpoint to `out`; return the training log."""
    import sentencepiece as spm

    torch.manual_seed(s.seed)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = train_sentencepiece(
        [recipe.CORPUS / f"{b}.txt" for b in recipe.TRAIN_BOOKS], out / "tokenizer.model", VOCAB
    )
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    data = recipe.book_tokens(sp, recipe.TRAIN_BOOKS)
    model = Megalodon(TINY).init_weights(s.seed).train()

    def logits_of(inputs: torch.Tensor) -> torch.Tensor:
        return model.logits(model(inputs, model.init_state(len(inputs)))[0])

    def loss_of(window: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits_of(window[:, :-1]).flatten(0, 1), window[:, 1:].flatten())

    log = recipe.train_model(model, loss_of, data, s, TINY.to_dict())
    log["heldout"] = recipe.heldout_ppl(
        recipe.window_nll_sum(logits_of), recipe.book_tokens(sp, [recipe.HELD_OUT]), context=4096
    )
    print(f"held-out {recipe.HELD_OUT}: {log['heldout']}", flush=True)
    save_checkpoint(model, out, tok_path, copy_tokenizer=False)
    recipe.write_log(out, log)
    return log


def main() -> None:
    args = recipe.make_parser(__doc__).parse_args()
    train(args.out, recipe.settings_from(args))


if __name__ == "__main__":
    main()
