"""open_run: everything an evaluation does before and after its own work, once for every command.

Before: outputs checked against inputs and each other, the model loaded with its options, its facts
recorded, the resume journal opened against the run's fingerprint. During: `Run.map` computes each
unit not yet journaled (a sweep batch, a SCROLLS example, an academic document), journals its
record and moves the one progress bar. After: `Run.finish` writes the samples and the report
atomically and drops the journal. A distributed runner plugs in at `Run.map`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..files import check_outputs, check_writable, write_json_atomic, write_jsonl_atomic
from ..models import StreamingLM, load_model, model_options, parse_spec
from .journal import Journal
from .progress import ProgressBar
from .report import build_report, environment, model_facts
from .settings import RunSettings

Unit = TypeVar("Unit")


@dataclass
class Run:
    """An open evaluation: its settings, model, facts and journal."""

    command: str
    settings: RunSettings
    lm: StreamingLM
    facts: dict[str, Any]
    journal: Journal
    out: Path
    progress: bool = True
    on_unit: Callable[[int], None] | None = None  # called with the count of finished units (tests interrupt here)

    def map(
        self,
        units: Sequence[Unit],
        key: Callable[[Unit], Hashable],
        compute: Callable[[Unit], dict[str, Any]],
        *,
        unit_name: str,
        weight: Callable[[Unit], int] = lambda _: 1,
        describe: Callable[[Unit], str] = lambda _: "",
    ) -> list[dict[str, Any]]:
        """Compute every unit not in the journal, journaling each record; return all records in unit order."""
        total = sum(weight(u) for u in units)
        done = sum(weight(u) for u in units if key(u) in self.journal)
        with ProgressBar(self.command, unit_name, total, done, self.progress) as bar:
            for unit in units:
                if key(unit) in self.journal:
                    continue
                bar.describe(describe(unit))
                self.journal.add(key(unit), compute(unit))
                bar.advance(weight(unit))
                if self.on_unit is not None:
                    self.on_unit(len(self.journal))
        return [self.journal.get(key(u)) for u in units]

    def finish(
        self, settings: dict[str, Any], data: dict[str, Any], results: dict[str, Any],
        samples: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Write the samples file (when asked) and the report, atomically; drop the journal; return the report."""
        env = environment(self.lm.device, self.lm.dtype)
        report = build_report(self.command, settings, self.facts, data, results, env)
        samples_path = self.settings.samples_path()
        if samples_path and samples is not None:
            write_jsonl_atomic(samples_path, samples)
        write_json_atomic(self.out, report)
        self.journal.finish()
        return report


def check_run_outputs(settings: RunSettings, reads: Sequence[str | Path | None]) -> Path:
    """Fail before any work if an output would overwrite an input or another output, or cannot be written."""
    out = Path(settings.out)
    samples = settings.samples_path()
    outputs = {"--out": out, "--samples": samples, "the resume file": journal_path(out)}
    check_outputs(outputs, reads)
    check_writable(out)
    if samples:
        check_writable(samples, "--samples")
    return out


def journal_path(out: Path) -> Path:
    """Where a run writing `out` journals its progress."""
    return out.with_name(out.name + ".partial.jsonl")


def open_run(
    command: str,
    settings: RunSettings,
    *,
    reads: Sequence[str | Path | None] = (),
    fingerprint: dict[str, Any] | None = None,
    check: Callable[[StreamingLM], dict[str, Any]] | None = None,
    progress: bool = True,
    on_unit: Callable[[int], None] | None = None,
) -> Run:
    """Check outputs, load the model, run `check(lm)` (its result joins the fingerprint), open the journal.

    `reads`: the files and folders the run reads besides the model; `fingerprint`: what identifies the
    run's data (checksums), so that a resume with other data is refused.
    """
    out = check_run_outputs(settings, [*reads, parse_spec(settings.model)[1]])
    options = model_options(settings.model, settings.model_args, **settings.family_flags())
    lm = load_model(settings.model, device=settings.device, dtype=settings.dtype, **options)
    extra = check(lm) if check is not None else {}
    facts = model_facts(lm)
    identity = {"command": command, "settings": settings.numeric(), "weights_sha256": facts["weights_sha256"],
                **(fingerprint or {}), **extra}  # fmt: skip
    journal = Journal(journal_path(out), identity, settings.resume)
    return Run(command, settings, lm, facts, journal, out, progress, on_unit)
