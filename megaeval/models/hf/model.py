"""The state of a transformers causal LM (its KV cache), and the check that a loaded model reads left to right."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import fail


@dataclass
class HFState:
    """A KV cache, the number of slots in it, and (rows stacked from states of different lengths) how many slots at
    the start of each row hold no token: those rows are left-padded, masked out and given their own positions."""

    cache: Any
    length: int
    batch_size: int
    pads: list[int] | None = None  # None: every row holds `length` tokens

    def clone(self) -> HFState:
        """A deep copy of the cache."""
        return HFState(copy.deepcopy(self.cache), self.length, self.batch_size, _copy(self.pads))

    def repeat(self, n: int) -> HFState:
        """A state for batch_size * n sequences, each row's cache repeated n times (this one is left as it was)."""
        if n == 1:
            return self.clone()
        cache = None if self.cache is None else repeated_cache(self.cache, n)
        pads = None if self.pads is None else [p for p in self.pads for _ in range(n)]
        return HFState(cache, self.length, self.batch_size * n, pads)

    def row_lengths(self) -> list[int]:
        """Tokens held by each row."""
        return [self.length - p for p in (self.pads or [0] * self.batch_size)]

    @staticmethod
    def stack(states: list[HFState]) -> HFState:
        """One batch of the rows of `states` (in order), each row keeping its own tokens: shorter rows are padded
        on the left to the longest, and those slots are masked out. The states are left as they were."""
        length = max(s.length for s in states)
        pads = [length - n for s in states for n in s.row_lengths()]
        batch = len(pads)
        if length == 0:
            return HFState(None, 0, batch)
        like = next(s.cache for s in states if s.length)
        cache = fresh_layers(like)
        for i, layer in enumerate(cache.layers):
            for name in ("keys", "values"):
                parts = []
                for s in states:
                    if s.length:
                        t = getattr(s.cache.layers[i], name)
                        parts.append(torch.nn.functional.pad(t, (0, 0, length - s.length, 0)))
                    else:
                        t = getattr(like.layers[i], name)
                        parts.append(t.new_zeros(s.batch_size, *t.shape[1:-2], length, t.shape[-1]))
                setattr(layer, name, torch.cat(parts, 0))
        return HFState(cache, length, batch, pads if any(pads) else None)

    def select(self, rows: list[int]) -> HFState:
        """A state of the given rows only (in that order); slots no kept row uses are dropped. This one is left as
        it was."""
        pads = [(self.pads or [0] * self.batch_size)[r] for r in rows]
        drop = min(pads, default=0)
        if self.cache is None:
            return HFState(None, 0, len(rows))
        index = torch.tensor(rows, dtype=torch.long, device=cache_tensors(self.cache)[0].device)
        cache = fresh_layers(self.cache)
        for layer in cache.layers:
            for name in ("keys", "values"):
                setattr(layer, name, getattr(layer, name).index_select(0, index)[..., drop:, :])
        pads = [p - drop for p in pads]
        return HFState(cache, self.length - drop, len(rows), pads if any(pads) else None)

    def nbytes(self) -> int:
        """Bytes of the keys and values in the cache."""
        if self.cache is None:
            return 0
        return sum(t.numel() * t.element_size() for t in cache_tensors(self.cache))


def _copy(pads: list[int] | None) -> list[int] | None:
    return None if pads is None else list(pads)


def repeated_cache(cache: Any, n: int) -> Any:
    """A transformers cache whose rows are each `cache`'s repeated n times; `cache` is left as it was (fresh
    layer objects: batch_repeat_interleave rebinds their tensors, never writes them)."""
    out = fresh_layers(cache)
    out.batch_repeat_interleave(n)
    return out


def fresh_layers(cache: Any) -> Any:
    """A shallow copy of a transformers cache with its own layer objects: rebinding a layer's keys or values in the
    copy leaves `cache` as it was (the tensors themselves are shared until rebound)."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    return out


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The keys and values a transformers cache holds, layer by layer."""
    out = []
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


@torch.inference_mode()
def refuse_non_causal(model: Any, path: Path, length: int = 8) -> None:
    """Refuse a model whose earlier outputs depend on later tokens (a masked LM such as BERT, which
    AutoModelForCausalLM loads with bidirectional attention): two inputs that differ only in their last token
    must give the same logits before it."""
    vocab = int(model.config.vocab_size)
    device = next(model.parameters()).device
    ids = (torch.arange(length, device=device) * 7 + 3) % vocab
    other = ids.clone()
    other[-1] = (other[-1] + 1) % vocab
    a, b = model(input_ids=torch.stack([ids, other]), use_cache=False).logits[:, :-1].float()  # one call, two rows
    scale = 1.0 + float(a.abs().max())
    tolerance = (1e-2 if torch.finfo(a.dtype).bits < 32 or model.dtype in (torch.float16, torch.bfloat16)
                 else 1e-5) * scale  # fmt: skip
    if float((a - b).abs().max()) > tolerance:
        raise fail(
            f"{path}: {type(model).__name__} is not a causal language model (its outputs at earlier positions "
            "change with later tokens: bidirectional attention, as in a masked LM)",
            "megaeval scores left-to-right models; use a decoder-only checkpoint",
        )
