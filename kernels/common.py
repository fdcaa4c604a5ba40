"""What the kernels share: dtypes, and Triton, imported late.

Triton is imported, and each kernel jitted, on the first launch of a kernel: megaeval imports where
Triton is not installed, and TRITON_INTERPRET (which Triton reads when it is imported) can still be
set after megaeval is imported, e.g. at the top of a test module.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

from ..errors import fail

tl: Any = None  # triton.language: bound into each kernel's module when the kernel is first built


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 models, float32 otherwise (as the official kernels)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def available() -> bool:
    """Whether Triton is installed."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _import_triton() -> Any:
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    if interpreting() and not isinstance(triton.language.standard.sum, InterpretedFunction):
        raise fail(
            "TRITON_INTERPRET=1 was set after Triton was imported, so Triton's own functions are not interpreted",
            "set it before anything imports triton (e.g. in the environment)",
        )
    return triton


class LateKernel:
    """A function written in Triton, jitted (or interpreted) when first launched: `kernel[grid](...)`."""

    def __init__(self, fn: Callable[..., None], **options: Any):
        self.fn, self.options = fn, options
        self._built: dict[bool, Any] = {}

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        mode = interpreting()
        if mode not in self._built:
            self._built[mode] = self.build()
        return self._built[mode][grid]

    def build(self) -> Any:
        """triton.jit of the function: a JITFunction, or an interpreted one under TRITON_INTERPRET=1."""
        triton = _import_triton()
        self.fn.__globals__["tl"] = triton.language
        return triton.jit(self.fn, **self.options)


def jit(fn: Callable[..., None] | None = None, **options: Any) -> Any:
    """Like triton.jit, but built on first launch."""
    if fn is None:
        return lambda f: LateKernel(f, **options)
    return LateKernel(fn, **options)


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (Triton block sizes must be powers of two)."""
    return 1 << max(n - 1, 0).bit_length()


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_input(name: str, t: torch.Tensor) -> None:
    """Kernels take float32/bfloat16/float16 tensors on a CUDA device, or on the CPU under the interpreter."""
    if not available():
        raise fail("Triton is not installed", "use kernels='torch' (or 'auto')")
    if t.dtype not in FLOAT_DTYPES:
        raise fail(
            f"the Triton kernels take float32, bfloat16 or float16 tensors; {name} is {t.dtype}",
            "use kernels='torch' (or 'auto') for float64 models",
        )
    if t.device.type != "cuda" and not interpreting():
        raise fail(
            f"Triton kernels need a CUDA device; {name} is on {t.device}", "set TRITON_INTERPRET=1 to test on CPU"
        )
