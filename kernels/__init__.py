"""Triton kernels for MEGALODON inference, each beside its plain-PyTorch reference (installed as megaeval.kernels).

One module per operation (timestep_norm, cema, attention, nll) holds the reference and the kernel with
its wrapper, with the same arguments and results; `dispatch.select` picks one set for a device.
"""

from __future__ import annotations

from .dispatch import KERNELS, TORCH, TRITON, Ops, select

__all__ = ["KERNELS", "TORCH", "TRITON", "Ops", "select"]
