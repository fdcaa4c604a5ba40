"""The settings every evaluation shares; each command's settings extend them with its own flags."""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

from ..errors import fail

# Past about 9e13 s the collectives' millisecond clocks overflow; a billion seconds (31 years) is "never" enough.
MAX_DIST_TIMEOUT_S = 1e9


def check_dist_timeout(seconds: Any) -> float:
    """--dist-timeout checked: a finite number of seconds, above 0 and at most MAX_DIST_TIMEOUT_S."""
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not (number and math.isfinite(seconds) and 0 < seconds <= MAX_DIST_TIMEOUT_S):
        raise fail(f"--dist-timeout must be a positive number of seconds, at most {MAX_DIST_TIMEOUT_S:g}, "
                   f"got {seconds!r:.40}", "pass, say, --dist-timeout 1800")  # fmt: skip
    return float(seconds)


@dataclass(kw_only=True)
class RunSettings:
    """Flags of every evaluation command, defaults included; all of them are recorded in the report."""

    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "float32"
    kernels: str | None = None  # the MEGALODON family's load option `kernels`, offered as its own flag (--kernels)
    out: str = "reports/report.json"
    resume: bool = False
    chunk_parallel: int = 1  # ranks sharing each sequence (under torchrun)
    dist_timeout: float = 1800.0  # seconds a rank waits for the others before the run stops

    # Where output goes, whether a run resumes and how long ranks wait never change its numbers.
    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = ("out", "samples", "resume", "dist_timeout")
    # Family load options that the CLI also offers as flags (a command's settings may add its own, as ppl-sweep
    # does --norm-stats): they are not settings of the run but options of the family that takes them, merged
    # into --model-args and checked against the model's family (models.model_options).
    FAMILY_FLAGS: ClassVar[tuple[str, ...]] = ("kernels",)

    def __post_init__(self) -> None:
        """Refuse a bad shared flag before any work (a command's settings call this first from their own)."""
        self.dist_timeout = check_dist_timeout(self.dist_timeout)

    def numeric(self) -> dict[str, Any]:
        """The settings that can change a number: what a resumed run must share with the interrupted one."""
        return {k: v for k, v in asdict(self).items() if k not in self.OUTPUT_FLAGS}

    def family_flags(self) -> dict[str, Any]:
        """Model options given as their own flags (None: not given), merged into --model-args."""
        return {name: getattr(self, name) for name in self.FAMILY_FLAGS}

    def samples_path(self) -> str | None:
        """The per-unit samples file, for commands that write one."""
        return getattr(self, "samples", None)


Modes = tuple[str, ...]

# The shared blocks' flags that only a run of a model reads (MODEL, CHAT's --bos, RUN, --resume), and those that only
# a mode writing a report reads (--out, --samples): a mode that runs no model (scoring prediction files, preparing
# data) or writes no report would ignore them, so every command's mode table gives them the modes that read them.
RUN_FLAGS: Modes = ("model", "model_args", "device", "dtype", "kernels", "bos", "chunk_parallel", "dist_timeout",
                    "resume")  # fmt: skip
REPORT_FLAGS: Modes = ("out", "samples")


def shared_modes(run: Modes, report: Modes) -> dict[str, Modes]:
    """Mode-table rows for the shared blocks' flags: RUN_FLAGS apply to the modes in `run` (those that run a model),
    REPORT_FLAGS to those in `report` (those that write a report)."""
    return {**dict.fromkeys(RUN_FLAGS, run), **dict.fromkeys(REPORT_FLAGS, report)}


def ignored_flag(settings: Any, table: dict[str, Modes], mode: str | None) -> tuple[str, Modes] | None:
    """The first flag of `table` (a settings field -> the modes it applies to) given for a `mode` it does not apply
    to, with its modes (None: none): a flag counts as given when its value differs from its field's default."""
    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default
                for f in fields(settings) if f.name in table}  # fmt: skip
    for name, modes in table.items():  # a shared row for a block the command lacks (no --bos) is skipped
        if name in defaults and mode not in modes and getattr(settings, name) != defaults[name]:
            return name, modes
    return None
