"""Triton kernels for MEGALODON inference, each beside its plain-PyTorch reference (installed as megaeval.kernels).

One module per operation (timestep_norm, cema, attention, nll) holds the reference and the kernel with
its wrapper, with the same arguments and results; `dispatch.select` picks one set for a device.

The names below load lazily: with the repository root on sys.path this folder is also importable as
a top-level `kernels` (transformers probes for Hugging Face's package of that name), and importing it
that way must not fail.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KERNELS", "TORCH", "TRITON", "Ops", "select"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
