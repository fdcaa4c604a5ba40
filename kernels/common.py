"""What the kernels share: dtypes, and Triton, imported late.

Triton is imported, and each kernel jitted, on the first launch of a kernel, so megaeval imports where
Triton is not installed. Triton (3.9) reads TRITON_INTERPRET whenever `triton.jit` decorates a function:
set, it makes a CPU-interpreted function, and an interpreted function stays interpreted however the
variable changes later (a jitted one likewise stays compiled). Triton's own library functions
(`tl.sum`, `tl.max`, ...) are decorated when Triton is imported, so the variable must be set before
Triton is imported, and an import of Triton is interpreted, or not, for good. A kernel is therefore
jitted once per import of Triton, and a launch whose TRITON_INTERPRET disagrees with the imported
Triton fails with a clear message.
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
    """Triton, checked to agree with TRITON_INTERPRET (see the module's docstring)."""
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = isinstance(triton.language.standard.sum, InterpretedFunction)
    if interpreting() and not interpreted:
        raise fail(
            "TRITON_INTERPRET=1 was set after Triton was imported, so Triton's own functions are not interpreted",
            "set it before anything imports triton (e.g. in the environment)",
        )
    if interpreted and not interpreting():
        raise fail(
            "Triton was imported under TRITON_INTERPRET=1 and can only interpret kernels, but the variable is unset",
            "set TRITON_INTERPRET=1 for the whole process, or not at all",
        )
    return triton


class LateKernel:
    """A function written in Triton, jitted (or interpreted) when first launched: `kernel[grid](...)`."""

    def __init__(self, fn: Callable[..., None], **options: Any):
        self.fn, self.options = fn, options
        self._built: dict[Any, Any] = {}  # the imported triton module -> the function jitted by it

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        triton = _import_triton()
        if triton not in self._built:
            self._built[triton] = self.build(triton)
        self.fn.__globals__["tl"] = triton.language  # the kernel's module sees the language of this import
        return self._built[triton][grid]

    def build(self, triton: Any = None) -> Any:
        """triton.jit of the function: a JITFunction, or an interpreted one under TRITON_INTERPRET=1."""
        triton = triton or _import_triton()
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
