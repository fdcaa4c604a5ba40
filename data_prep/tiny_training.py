"""What the embedded tiny models share: the Austen books, the training loop and the held-out perplexity.

Every tiny model (train_tiny.py: MEGALODON, train_tiny_rfa.py: RFA, train_tiny_transformer.py: a
Llama-style Transformer) trains on the same five novels, tokenized by the same sentencepiece model,
with the same recipe, and is measured on *Persuasion*, which none of them sees.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CORPUS = Path(__file__).resolve().parent / "corpora" / "austen"
TRAIN_BOOKS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey"]
HELD_OUT = "persuasion"
ASSETS = Path(__file__).resolve().parent.parent / "megaeval" / "assets"
SHARED_TOKENIZER = ASSETS / "megalodon-tiny" / "tokenizer.model"  # trained by train_tiny.py; reused by the others


@dataclass(frozen=True)
class TrainSettings:
    """The recipe: steps (the LR schedule spans them), a wall-clock cap, windows, batch, peak LR, seed."""

    steps: int = 800
    minutes: float = 15.0
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 3e-3
    seed: int = 0


def add_arguments(parser: argparse.ArgumentParser, defaults: TrainSettings = TrainSettings()) -> None:
    """The recipe's command-line flags (and --out)."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps (LR schedule spans them)")
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="wall-clock cap")
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--seed", type=int, default=defaults.seed)


def make_parser(doc: str | None, tokenizer: bool = False) -> argparse.ArgumentParser:
    """A training script's parser: the recipe's flags, and --tokenizer for models that reuse the shared one."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    if tokenizer:
        parser.add_argument(
            "--tokenizer", type=Path, default=SHARED_TOKENIZER, help="sentencepiece model to train with"
        )
    return parser


def settings_from(args: argparse.Namespace) -> TrainSettings:
    """TrainSettings from parsed flags."""
    return TrainSettings(args.steps, args.minutes, args.seq_len, args.batch_size, args.lr, args.seed)


def book_tokens(sp: Any, names: list[str]) -> torch.Tensor:
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


def train_loop(
    model: torch.nn.Module, loss_of: Callable[[torch.Tensor], torch.Tensor], data: torch.Tensor, s: TrainSettings
) -> dict[str, Any]:
    """AdamW on random windows of `data` (`loss_of(window [B, L+1])` -> mean NLL); returns curve, steps, seconds."""
    optim = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98), weight_decay=0.1)
    gen = torch.Generator().manual_seed(s.seed)
    curve: list[dict[str, float]] = []
    start, cpu, step, ema = time.time(), time.process_time(), 0, None
    while step < s.steps and (time.time() - start) < s.minutes * 60:
        offsets = torch.randint(0, len(data) - s.seq_len - 1, (s.batch_size,), generator=gen)
        window = torch.stack([data[o : o + s.seq_len + 1] for o in offsets.tolist()])
        for group in optim.param_groups:
            group["lr"] = lr_at(step, s.steps, s.lr, warmup=min(100, s.steps // 10 + 1))
        loss = loss_of(window)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        step += 1
        if step % 25 == 0 or step == 1:
            elapsed = time.time() - start
            curve.append({"step": step, "seconds": round(elapsed, 1), "train_loss": round(ema, 4)})
            print(f"step {step:5d}  {elapsed:6.0f}s  loss {ema:.3f}", flush=True)
    cpu_seconds = round(time.process_time() - cpu, 1)
    return {"curve": curve, "steps": step, "seconds": round(time.time() - start, 1), "cpu_seconds": cpu_seconds}


def train_model(
    model: torch.nn.Module, loss_of: Callable[[torch.Tensor], torch.Tensor], data: torch.Tensor, s: TrainSettings,
    config: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Train `model` with the recipe (it is left in eval mode); the log: header, curve, steps and time."""
    log = log_header(config, sum(p.numel() for p in model.parameters()), data, s)
    log.update(train_loop(model, loss_of, data, s))
    model.eval()
    return log


def window_nll_sum(logits_of: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], float]:
    """`nll_sum(window [1, L+1])` for heldout_ppl, from `logits_of(inputs [1, L])` -> logits [1, L, V] read from a
    fresh state."""

    def nll_sum(window: torch.Tensor) -> float:
        logits = logits_of(window[:, :-1])
        return float(torch.nn.functional.cross_entropy(logits[0].float(), window[0, 1:], reduction="sum"))

    return nll_sum


@torch.no_grad()
def heldout_ppl(nll_sum: Callable[[torch.Tensor], float], tokens: torch.Tensor, context: int) -> dict[str, Any]:
    """Token perplexity of the held-out book in segments of `context` tokens, each from a fresh state.

    `nll_sum(window [1, context+1])` returns the summed NLL of the window's last `context` tokens.
    """
    n = (len(tokens) - 1) // context * context
    nll = sum(nll_sum(tokens[None, s : s + context + 1]) for s in range(0, n, context))
    return {"context": context, "tokens": n, "ppl": round(math.exp(nll / n), 3)}


def write_log(out: Path, log: dict[str, Any]) -> None:
    """train_log.json beside the checkpoint."""
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")


def log_header(config: dict[str, Any], params: int, data: torch.Tensor, s: TrainSettings) -> dict[str, Any]:
    """The head of train_log.json: architecture, size, data and recipe."""
    return {
        "config": config,
        "parameters": params,
        "train_tokens": len(data),
        "seq_len": s.seq_len,
        "batch_size": s.batch_size,
        "peak_lr": s.lr,
        "seed": s.seed,
    }
