"""The KV cache the hf family reads and decodes into: transformers' DynamicCache whose layers keep their keys and
values in buffers with room to spare, so that a decoding step writes its token into the room instead of copying the
whole cache (`torch.cat`, as DynamicLayer does on every call)."""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import torch

from . import checkpoint

SPARE_TOKENS = 256  # room a buffer keeps past what it must hold, at least (at most an eighth more, below)


def spare_capacity(needed: int) -> int:
    """Slots of a buffer that must hold `needed` tokens: an eighth more (so a long decode reallocates a handful of
    times), at least SPARE_TOKENS more."""
    return needed + max(SPARE_TOKENS, needed // 8)


def growing_cache() -> Any:
    """An empty transformers DynamicCache whose layers (made as the model calls them) are `growing_layer()`s."""
    tf = checkpoint.transformers_module()
    out = tf.DynamicCache()
    out.layer_class_to_replicate = growing_layer()
    return out


def cache_argument(module: Any) -> str:
    """The keyword a transformers model's forward takes and returns its KV cache by: `cache` (transformers 5.x, where
    `past_key_values` warns that it is deprecated), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


@cache
def growing_layer() -> type:
    """The cache layer class (a transformers DynamicLayer, defined once transformers is imported)."""
    from transformers.cache_utils import DynamicLayer

    takes_values = "value_states" in inspect.signature(DynamicLayer.lazy_initialization).parameters  # 5.x; 4.x: keys

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer whose `keys` and `values` are views of the first tokens of larger buffers it owns: a call
        writes its new keys and values after them, and the buffers are reallocated (an eighth larger) only when
        full. Anything that rebinds `keys` or `values` (transformers' crop and batch methods, megaeval's stack and
        select) makes the next call copy them into fresh buffers; a shallow copy of the layer owns no buffer (it
        would share its original's), a deep copy owns the copies of its buffers."""

        def __init__(self) -> None:
            super().__init__()
            self._owned: tuple[torch.Tensor, ...] | None = None  # (keys view, values view, key buffer, value buffer)

        def __copy__(self) -> GrowingLayer:
            out = type(self).__new__(type(self))
            out.__dict__.update(self.__dict__)
            out._owned = None
            return out

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(*((key_states, value_states) if takes_values else (key_states,)))
            held = self.keys.shape[-2] if self.keys.dim() == 4 else 0
            end = held + key_states.shape[-2]
            owned = self._owned
            if owned is None or owned[0] is not self.keys or owned[1] is not self.values or owned[2].shape[-2] < end:
                owned = self._reallocate(key_states, value_states, held, end)
            key_buffer, value_buffer = owned[2], owned[3]
            key_buffer[:, :, held:end] = key_states
            value_buffer[:, :, held:end] = value_states
            self.keys, self.values = key_buffer[:, :, :end], value_buffer[:, :, :end]
            self._owned = (self.keys, self.values, key_buffer, value_buffer)
            return self.keys, self.values

        def _reallocate(
            self, key_states: torch.Tensor, value_states: torch.Tensor, held: int, end: int
        ) -> tuple[torch.Tensor, ...]:
            """Fresh buffers with room for `end` tokens and spare, holding the `held` tokens the layer has."""
            slots = spare_capacity(end)
            buffers = []
            for new, old in ((key_states, self.keys), (value_states, self.values)):
                buffer = new.new_empty(*new.shape[:2], slots, new.shape[-1])
                if held:
                    buffer[:, :, :held] = old
                buffers.append(buffer)
            return (self.keys, self.values, *buffers)

    return GrowingLayer
