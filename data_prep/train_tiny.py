"""Train megaeval's embedded default model: a SentencePiece tokenizer and a tiny MEGALODON.

Trains on five Jane Austen novels (data_prep/corpora/austen) and holds out Persuasion as the
validation stream. Uses megaeval's own model code and writes the official checkpoint layout.

    python -m megaeval.data_prep.train_tiny --out megaeval/assets/megalodon-tiny
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from megaeval.models.megalodon import Megalodon, ModelArgs, save_checkpoint

from .tokenizer import train_sentencepiece

CORPUS = Path(__file__).resolve().parent / "corpora" / "austen"
TRAIN_BOOKS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey"]
HELD_OUT = "persuasion"
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


def book_tokens(sp, names: list[str]) -> torch.Tensor:
    """Each book as BOS + tokens + EOS, concatenated."""
    ids: list[int] = []
    for name in names:
        ids += [sp.bos_id()] + sp.encode((CORPUS / f"{name}.txt").read_text(encoding="utf-8")) + [sp.eos_id()]
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def heldout_ppl(model: Megalodon, tokens: torch.Tensor, context: int = 4096) -> dict:
    """Token perplexity of the held-out book in segments of `context` tokens, each from a fresh state."""
    n = (len(tokens) - 1) // context * context
    nll = 0.0
    for s in range(0, n, context):
        window = tokens[None, s : s + context + 1]
        hidden, _ = model(window[:, :-1], model.init_state(1))
        nll += float(torch.nn.functional.cross_entropy(model.logits(hidden)[0], window[0, 1:], reduction="sum"))
    return {"context": context, "tokens": n, "ppl": round(math.exp(nll / n), 3)}


def train(out: Path, steps: int, minutes: float, seq_len: int, batch: int, lr: float, seed: int) -> dict:
    """Train tokenizer and model; write the checkpoint to `out`; return the training log."""
    import sentencepiece as spm

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = train_sentencepiece([CORPUS / f"{b}.txt" for b in TRAIN_BOOKS], out / "tokenizer.model", VOCAB)
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    data = book_tokens(sp, TRAIN_BOOKS)
    model = Megalodon(TINY).init_weights(seed).train()
    params = sum(p.numel() for p in model.parameters())
    optim = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    log = {
        "config": TINY.to_dict(),
        "parameters": params,
        "train_tokens": len(data),
        "seq_len": seq_len,
        "batch_size": batch,
        "peak_lr": lr,
        "seed": seed,
        "curve": [],
    }
    start, step, ema = time.time(), 0, None
    while step < steps and (time.time() - start) < minutes * 60:
        offsets = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        window = torch.stack([data[o : o + seq_len + 1] for o in offsets.tolist()])
        for group in optim.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup=min(100, steps // 10 + 1))
        hidden, _ = model(window[:, :-1], model.init_state(batch))
        loss = torch.nn.functional.cross_entropy(model.logits(hidden).flatten(0, 1), window[:, 1:].flatten())
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        step += 1
        if step % 25 == 0 or step == 1:
            elapsed = time.time() - start
            log["curve"].append({"step": step, "seconds": round(elapsed, 1), "train_loss": round(ema, 4)})
            print(f"step {step:5d}  {elapsed:6.0f}s  loss {ema:.3f}", flush=True)
    log["steps"] = step
    log["seconds"] = round(time.time() - start, 1)
    model.eval()
    log["heldout"] = heldout_ppl(model, book_tokens(sp, [HELD_OUT]))
    print(f"held-out {HELD_OUT}: {log['heldout']}", flush=True)
    save_checkpoint(model, out, tok_path, copy_tokenizer=False)
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=800, help="optimizer steps (the LR schedule spans them)")
    parser.add_argument("--minutes", type=float, default=15.0, help="wall-clock cap")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    train(a.out, a.steps, a.minutes, a.seq_len, a.batch_size, a.lr, a.seed)


if __name__ == "__main__":
    main()
