"""Peak memory over a stretch of work, on CUDA (allocator peak) or CPU (process peak RSS)."""

from __future__ import annotations

import ctypes
import gc
import resource
from pathlib import Path

import torch


class PeakMemory:
    """Resettable peak-memory meter.

    CUDA: torch's peak allocated bytes on the device. CPU on Linux: the process's peak resident set
    (VmHWM), reset by writing 5 to /proc/self/clear_refs. Elsewhere: ru_maxrss, which cannot be
    reset, so later readings include earlier peaks (`method` says which).
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.method = "cuda_max_memory_allocated"
        elif Path("/proc/self/clear_refs").exists() and _vm_hwm() is not None:
            self.method = "process_peak_rss"
        else:
            self.method = "process_max_rss_since_start"

    def reset(self) -> None:
        """Start a new measurement."""
        if self.method == "cuda_max_memory_allocated":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.method == "process_peak_rss":
            _return_freed_memory()  # else memory freed by earlier work still counts as resident
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.method = "process_max_rss_since_start"

    def peak(self) -> int:
        """Peak bytes since the last reset."""
        if self.method == "cuda_max_memory_allocated":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.method == "process_peak_rss":
            return int(_vm_hwm() or 0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _return_freed_memory() -> None:
    """Collect young garbage and hand freed heap pages back to the OS (glibc malloc_trim), where possible. The last
    stretch of work's cycles are young; a full collection walks every object the process holds (a tenth of a second
    with transformers imported) before every measured batch."""
    gc.collect(1)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _vm_hwm() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
