"""Train megaeval's embedded default model: a SentencePiece tokenizer and a tiny MEGALODON.

Trains on five Jane Austen novels (data_prep/corpora/austen) and holds out Persuasion as the
validation stream. Uses megaeval's own model code and writes the official checkpoint layout.
The tokenizer it trains is the one every embedded model shares (see tiny_training.py).

    python -m megaeval.data_prep.train_tiny --out megaeval/assets/megalodon-tiny
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from megaeval.models.megalodon import Megalodon, ModelArgs, save_checkpoint

from .tiny_training import (
    CORPUS,
    HELD_OUT,
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


def nll_sum_of(model: Megalodon) -> Callable[[torch.Tensor], float]:
    """Summed NLL of a window's targets, read from a fresh state."""

    def nll_sum(window: torch.Tensor) -> float:
        hidden, _ = model(window[:, :-1], model.init_state(1))
        return float(torch.nn.functional.cross_entropy(model.logits(hidden)[0], window[0, 1:], reduction="sum"))

    return nll_sum


def train(out: Path, s: TrainSettings) -> dict:
    """Train tokenizer and model; write the checkpoint to `out`; return the training log."""
    import sentencepiece as spm

    torch.manual_seed(s.seed)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = train_sentencepiece([CORPUS / f"{b}.txt" for b in TRAIN_BOOKS], out / "tokenizer.model", VOCAB)
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    data = book_tokens(sp, TRAIN_BOOKS)
    model = Megalodon(TINY).init_weights(s.seed).train()
    log = log_header(TINY.to_dict(), sum(p.numel() for p in model.parameters()), data, s)

    def loss_of(window: torch.Tensor) -> torch.Tensor:
        hidden, _ = model(window[:, :-1], model.init_state(len(window)))
        return torch.nn.functional.cross_entropy(model.logits(hidden).flatten(0, 1), window[:, 1:].flatten())

    log.update(train_loop(model, loss_of, data, s))
    model.eval()
    log["heldout"] = heldout_ppl(nll_sum_of(model), book_tokens(sp, [HELD_OUT]), context=4096)
    print(f"held-out {HELD_OUT}: {log['heldout']}", flush=True)
    save_checkpoint(model, out, tok_path, copy_tokenizer=False)
    write_log(out, log)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    train(args.out, settings_from(args))


if __name__ == "__main__":
    main()
