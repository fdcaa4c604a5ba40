"""What a MEGALODON call carries in and out: the state, and where a call stands in its sequence.

Per layer the state is: the TimestepNorm statistics (count, per-group mean and variance, kept in float64),
the CEMA hidden state (complex), and the keys/values of the current partial attention chunk; plus the final
TimestepNorm's statistics. Attention never crosses a chunk boundary, so nothing else needs to be remembered.

`LocalSlice` is the one place the forward pass (model.py) asks where a call's state comes from and goes to:
all of it in this process by default, one rank's slice of the call under chunk parallel (parallel.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..base import one_or_per_row, per_row, repeated_rows


@dataclass
class NormState:
    """TimestepNorm statistics over every timestep so far: count and per-group mean/variance (rows stacked from
    states of different lengths: one count per row)."""

    count: int | list[int]
    mean: Tensor  # [B, G] float64
    var: Tensor  # [B, G] float64

    def clone(self) -> NormState:
        return NormState(_same(self.count), self.mean.clone(), self.var.clone())

    def repeat(self, n: int) -> NormState:
        return NormState(
            repeated_rows(self.count, n), self.mean.repeat_interleave(n, 0), self.var.repeat_interleave(n, 0)
        )

    def counts(self) -> list[int]:
        """Each row's count."""
        return per_row(self.count, self.mean.shape[0])


def _same(value: int | list[int]) -> int | list[int]:
    return list(value) if isinstance(value, list) else value


@dataclass
class LayerState:
    """What one MEGALODON layer carries across calls."""

    norm: NormState
    cema: Tensor  # [B, D, N] complex hidden state of the CEMA
    k: Tensor  # [B, n, H, dz] rotated keys of the current partial chunk, n < chunk_size
    v: Tensor  # [B, n, H, dv] values of the current partial chunk

    def clone(self) -> LayerState:
        return LayerState(self.norm.clone(), self.cema.clone(), self.k.clone(), self.v.clone())

    def repeat(self, n: int) -> LayerState:
        def rep(t: Tensor) -> Tensor:
            return t.repeat_interleave(n, 0)

        return LayerState(self.norm.repeat(n), rep(self.cema), rep(self.k), rep(self.v))


@dataclass
class MegalodonState:
    """The whole model's state: per-layer states, the final norm's statistics, tokens consumed."""

    layers: list[LayerState]
    final_norm: NormState
    position: int | list[int]  # one per row in a batch stacked from states of different lengths
    history: Tensor | None = None  # last tokens, kept only by the official-window norm mode
    fills: list[int] | None = None  # stacked rows: keys and values each row's chunk cache holds (the rest is padding)
    rows_share_calls: ClassVar[bool] = False  # stacked rows at different positions read more than a token row by row

    def clone(self) -> MegalodonState:
        """A deep copy (e.g. to reuse a few-shot prefix for many continuations)."""
        history = None if self.history is None else self.history.clone()
        fills = None if self.fills is None else list(self.fills)
        return MegalodonState([s.clone() for s in self.layers], self.final_norm.clone(), _same(self.position), history,
                              fills)  # fmt: skip

    def repeat(self, n: int) -> MegalodonState:
        """A state for B * n sequences: row i * n + j is a copy of row i (this state is left as it was)."""
        history = None if self.history is None else self.history.repeat_interleave(n, 0)
        layers = [s.repeat(n) for s in self.layers]
        position = repeated_rows(self.position, n)
        fills = None if self.fills is None else [f for f in self.fills for _ in range(n)]
        return MegalodonState(layers, self.final_norm.repeat(n), position, history, fills)

    @property
    def rows_stackable(self) -> bool:
        """Whether this state's rows can join a stacked batch (the official-window mode keeps token history: no)."""
        return self.history is None

    def positions(self) -> list[int]:
        """Each row's position."""
        return per_row(self.position, self.final_norm.mean.shape[0])

    def row_fills(self) -> list[int]:
        """Keys and values each row's partial chunk holds."""
        return list(self.fills) if self.fills is not None else [self.layers[0].k.shape[1]] * len(self.positions())

    @staticmethod
    def stack(states: list[MegalodonState]) -> MegalodonState:
        """One batch of the rows of `states`, in order, each keeping its position, norm counts and partial chunk
        (the chunk caches padded on the right to the longest; `rows_attention` reads each row's own)."""

        def norms(parts: list[NormState]) -> NormState:
            count = one_or_per_row([c for n in parts for c in n.counts()])
            return NormState(count, torch.cat([n.mean for n in parts]), torch.cat([n.var for n in parts]))

        def padded(parts: list[Tensor]) -> Tensor:
            width = max(t.shape[1] for t in parts)
            return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, 0, 0, width - t.shape[1])) for t in parts])

        layers = []
        for i in range(len(states[0].layers)):
            mine = [s.layers[i] for s in states]
            layers.append(LayerState(norms([m.norm for m in mine]), torch.cat([m.cema for m in mine]),
                                     padded([m.k for m in mine]), padded([m.v for m in mine])))  # fmt: skip
        positions = one_or_per_row([p for s in states for p in s.positions()])
        fills = [f for s in states for f in s.row_fills()] if isinstance(positions, list) else None
        return MegalodonState(layers, norms([s.final_norm for s in states]), positions, None, fills)

    def select(self, rows: list[int]) -> MegalodonState:
        """A state of the given rows only, in that order (this one is left as it was); the chunk caches keep the
        padding the kept rows need, none when they are all at one position."""
        index = torch.tensor(rows, dtype=torch.long, device=self.final_norm.mean.device)
        every_position, every_fill = self.positions(), self.row_fills()
        positions, fills = [every_position[r] for r in rows], [every_fill[r] for r in rows]
        width = max(fills, default=0)

        def norm(n: NormState) -> NormState:
            counts = n.counts()
            return NormState(one_or_per_row([counts[r] for r in rows]), n.mean[index], n.var[index])

        layers = [LayerState(norm(s.norm), s.cema[index], s.k[index][:, :width], s.v[index][:, :width])
                  for s in self.layers]  # fmt: skip
        alike = len(set(positions)) == 1
        return MegalodonState(layers, norm(self.final_norm), one_or_per_row(positions), None, None if alike else fills)

    def tensors(self) -> list[Tensor]:
        """Every tensor held by the state."""
        out = [self.final_norm.mean, self.final_norm.var]
        for s in self.layers:
            out += [s.norm.mean, s.norm.var, s.cema, s.k, s.v]
        return out + ([] if self.history is None else [self.history])

    def nbytes(self) -> int:
        """Bytes held by the state's tensors (the integer counters are not counted)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


# ------------------------------------------------------------------------------------ slices


class LocalSlice:
    """Where a call stands in its sequence when one process runs all of it: the hooks `Megalodon.forward` and its
    layers ask. Chunk parallel passes its own instead (megalodon.parallel.GroupSlice: one rank's slice of a call
    a group shares, merging what crosses slices), so the forward pass is written once, here."""

    def pieces(self, length: int) -> list[tuple[int, int]]:
        """[a, b) steps of the call that each layer runs in turn (twice: norm and CEMA, then the rest)."""
        return [(0, length)]

    def norm_before(self, x: Tensor, carried: NormState) -> NormState:
        """TimestepNorm statistics entering the call, given its input x."""
        return carried

    def norm_after(self, carried: NormState, local: NormState) -> NormState:
        """Statistics after the whole call (`local`: after this process's part)."""
        return local

    def cema_start(self, carried: Tensor) -> Tensor:
        """The CEMA state this process's recurrence starts from."""
        return carried

    def cema_carry(self, cema: nn.Module, carried: Tensor, local: Tensor) -> tuple[CarryTerm | None, Tensor]:
        """(What the state truly entering adds to the CEMA output of piece [a, b), or None: nothing; the CEMA state
        after the whole call), given `local`, the state the recurrence ended in."""
        return None, local

    def kv_start(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the partial chunk the call continues."""
        return k, v

    def state_after(self, before: MegalodonState, after: MegalodonState) -> MegalodonState:
        """The model's state after the whole call."""
        return after


CarryTerm = Callable[[int, int, Tensor], Tensor]  # (a, b, CEMA output of piece [a, b)) -> that output completed
LOCAL = LocalSlice()


def joined(parts: list[Tensor], like: Tensor) -> Tensor:
    """The pieces of a call as one tensor along time (no copy for one piece; `like`'s empty for none)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1) if parts else like[:, :0]
