"""Triton kernels for MEGALODON inference, each beside its plain-PyTorch reference (installed as megaeval.kernels)."""
