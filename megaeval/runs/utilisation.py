"""Model FLOPs utilisation (MFU): a device's peak matmul throughput, nominal or measured, and the arithmetic.

MFU = achieved model FLOP/s / (peak FLOP/s per device x devices). Model FLOPs are the family's count of a forward
pass's matmul FLOPs (`StreamingLM.flops_per_token`); the peak is, by `--peak-tflops`:

* `auto` (default): the device's nominal dense peak for the run's dtype from `NOMINAL_TFLOPS` (NVIDIA's data
  sheets, no sparsity; float32 without TF32), or, for a device or dtype the table lacks, `measure`.
* `measure`: an 8192 x 8192 x 8192 torch.matmul in the run's dtype on the run's device, the median of 10 timings.
* a number: that many TFLOP/s per device.

Off CUDA there is no peak (`auto` and `measure` give None, and so do achieved TFLOP/s and MFU) unless a number is given.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import fail

PEAK_CHOICES = "auto, measure, or a positive number of TFLOP/s per device"
PEAK_RANGE = (1e-3, 1e6)  # TFLOP/s per device: a slow CPU core to far past any accelerator
MATMUL_SIZE = 8192
MATMUL_REPEATS = 10

# (pattern in torch.cuda.get_device_name, name, dense TFLOP/s by dtype): the first match wins.
NOMINAL_TFLOPS: list[tuple[str, str, dict[str, float]]] = [
    (r"H100 NVL", "H100 NVL", {"bfloat16": 835.0, "float16": 835.0, "float32": 60.0}),
    (r"H100 PCIe", "H100 PCIe", {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0}),
    (r"H100", "H100 SXM", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    (r"H200 NVL", "H200 NVL", {"bfloat16": 835.0, "float16": 835.0, "float32": 60.0}),
    (r"H200", "H200 SXM", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    (r"A100", "A100", {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}),
    (r"L40S", "L40S", {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6}),
    (r"\bL4\b", "L4", {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3}),
]


@dataclass(frozen=True)
class Peak:
    """A device's peak matmul throughput: TFLOP/s per device (None: unknown), where it came from, and how."""

    tflops: float | None
    source: str | None  # "flag", "nominal", "measured", or None (no peak: not on CUDA)
    detail: str | None

    def describe(self) -> dict[str, Any]:
        """The report's keys: peak_tflops, peak_tflops_source, peak_tflops_detail."""
        return {"peak_tflops": self.tflops, "peak_tflops_source": self.source, "peak_tflops_detail": self.detail}


def parse_peak(text: str) -> float | None:
    """'auto' | 'measure' -> None; a positive number -> it; anything else is refused."""
    if text in ("auto", "measure"):
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 < value < float("inf"):
        raise fail(f"bad --peak-tflops {text!r}", f"use {PEAK_CHOICES}")
    low, high = PEAK_RANGE
    if not low <= value <= high:  # 5e-324 would give an infinite MFU, which no report can hold
        raise fail(f"--peak-tflops {text} is no device's peak (megaeval takes {low:g} to {high:,.0f} TFLOP/s)",
                   f"use {PEAK_CHOICES} in that range")  # fmt: skip
    return value


def nominal_tflops(device_name: str, dtype: torch.dtype | str) -> tuple[str, float] | None:
    """(name, dense TFLOP/s) of a known GPU for `dtype`, or None."""
    dtype = str(dtype).removeprefix("torch.")
    for pattern, name, table in NOMINAL_TFLOPS:
        if re.search(pattern, device_name):
            return (name, table[dtype]) if dtype in table else None
    return None


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = MATMUL_SIZE) -> float:
    """TFLOP/s of an n x n x n torch.matmul in `dtype` on a CUDA device: the median of MATMUL_REPEATS timings."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):  # warm-up
        a @ b
    times = []
    for _ in range(MATMUL_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


def device_peak(setting: str, device: torch.device | str, dtype: torch.dtype) -> Peak:
    """The peak `--peak-tflops` asks for on `device` (module docstring)."""
    given = parse_peak(setting)
    if given is not None:
        return Peak(given, "flag", None)
    device = torch.device(device)
    if device.type != "cuda":
        return Peak(None, None, None)
    dtype_name = str(dtype).removeprefix("torch.")
    if setting == "auto":
        known = nominal_tflops(torch.cuda.get_device_name(device), dtype)
        if known is not None:
            return Peak(known[1], "nominal", f"{known[0]} {dtype_name} dense")
    try:
        tflops = measure_matmul_tflops(device, dtype)
    except torch.cuda.OutOfMemoryError:
        return Peak(None, None, "measuring failed: out of memory")
    return Peak(round(tflops, 1), "measured", f"{dtype_name} {MATMUL_SIZE}^3 matmul, median of {MATMUL_REPEATS}")


def utilisation(
    flops_per_token: float | None, tokens: int, seconds: float, peak_tflops: float | None, devices: int = 1
) -> dict[str, float | None]:
    """achieved_tflops (model FLOPs of `tokens` over `seconds`) and mfu (that / (peak_tflops x devices)); None
    where an input is unknown (or no peak was given: achieved_tflops too, as on a CPU)."""
    if flops_per_token is None or peak_tflops is None or seconds <= 0:
        return {"achieved_tflops": None, "mfu": None}
    achieved = flops_per_token * tokens / seconds / 1e12
    return {"achieved_tflops": achieved, "mfu": achieved / (peak_tflops * devices)}
