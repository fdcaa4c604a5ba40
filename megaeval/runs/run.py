"""open_run: everything an evaluation does before and after its own work, once for every command.

Before: the distributed context joined (one process when not launched by torchrun), outputs checked
against inputs and each other, the model loaded with its options (with --chunk-parallel P, spread over
each group of P ranks: `models.chunk_parallel_lm`), its facts recorded, the resume
journal opened against the run's fingerprint. During: `Run.map` computes each unit not yet journaled
(a sweep batch, a SCROLLS example, an academic document). On many ranks the units are dealt out by
index, each round's results are gathered on rank 0 in unit order and journaled there, and rank 0
alone shows progress. After: `Run.finish` writes the samples and the report atomically (rank 0) and
drops the journal. Use it as a context manager, so that a failure on any rank stops every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..distributed import DistContext, broadcast_object, gather_round, init_distributed, rounds
from ..errors import MegaevalError, fail
from ..files import check_outputs, check_writable, write_json_atomic, write_jsonl_atomic, written_through
from ..models import StreamingLM, chunk_parallel_lm, load_model, model_options, parse_spec
from ..scoring.answering import Answerer, LocalAnswerer
from ..serving.answers import ServedAnswerer
from ..serving.model import open_served
from ..serving.spec import answer_settings, is_served
from .journal import Journal
from .progress import ProgressBar
from .report import build_report, environment, model_facts
from .settings import RunSettings, check_dist_timeout

Unit = TypeVar("Unit")


@dataclass
class Run:
    """An open evaluation: its settings, model, facts, journal (rank 0 only) and distributed context."""

    command: str
    settings: RunSettings
    ctx: DistContext
    lm: StreamingLM
    facts: dict[str, Any]
    journal: Journal | None
    out: Path
    progress: bool = True
    on_unit: Callable[[int], None] | None = None  # called with the count of finished units (tests interrupt here)
    answerer: Answerer | None = None  # answers prompts: the model in this process, or over HTTP (a served model)

    def __post_init__(self) -> None:
        if self.answerer is None:
            self.answerer = LocalAnswerer(self.lm)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[1] is not None and self.journal is not None:
            self.journal.abandon(exc[1])
        self.ctx.__exit__(*exc)

    def map(
        self,
        units: Sequence[Unit],
        key: Callable[[Unit], Hashable],
        compute: Callable[[Unit], dict[str, Any]],
        *,
        unit_name: str,
        weight: Callable[[Unit], int] = lambda _: 1,
        describe: Callable[[Unit], str] = lambda _: "",
        contiguous: bool = False,
        batch: int = 1,
        compute_batch: Callable[[list[Unit]], list[dict[str, Any]]] | None = None,
    ) -> list[dict[str, Any]] | None:
        """Compute every unit not in the journal, journaling each record; return all records in unit order
        (on rank 0; None on the other ranks). Ranks take units round-robin, or in `contiguous` ranges.

        With `compute_batch` and `batch` > 1, units still to do go `batch` at a time (in order) to one
        `compute_batch` call, which returns their records in order (what `compute` gives each one alone): a rank
        takes a batch per round."""
        keys = [key(u) for u in units]
        journal = self.journal
        if journal is not None:
            journal.units = len(keys)
        todo = [i for i, k in enumerate(keys) if k not in journal] if journal is not None else None
        todo = broadcast_object(self.ctx, todo)
        total = sum(weight(u) for u in units)
        done = total - sum(weight(units[i]) for i in todo)
        size = batch if compute_batch is not None and batch > 1 else 1
        batches = [todo[k : k + size] for k in range(0, len(todo), size)]

        def run(members: list[int]) -> dict[int, dict[str, Any]]:
            if size == 1:
                return {members[0]: compute(units[members[0]])}
            records = compute_batch([units[i] for i in members])
            return dict(zip(members, records, strict=True))

        with ProgressBar(self.command, unit_name, total, done, self.progress and self.ctx.is_main) as bar:
            for number in rounds(list(range(len(batches))), self.ctx, contiguous):
                result = error = None
                if number is not None:
                    bar.describe(describe(units[batches[number][0]]))
                    try:
                        result = run(batches[number])
                    except MegaevalError as e:  # bad input: every rank reports it (other errors stop all ranks)
                        error = e
                finished = gather_round(self.ctx, number, result, error)
                if journal is None or finished is None:
                    continue
                for records in finished.values():
                    for i, record in records.items():
                        journal.add(keys[i], record)
                        bar.advance(weight(units[i]))
                        if self.on_unit is not None:
                            self.on_unit(len(journal))
        return None if journal is None else [journal.get(k) for k in keys]

    def finish(
        self, settings: dict[str, Any], data: dict[str, Any], results: dict[str, Any],
        samples: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:  # fmt: skip
        """Write the samples file (when asked) and the report, atomically; drop the journal; return the report
        (rank 0; the other ranks write nothing and get None)."""
        if self.journal is None:
            return None
        env = {**environment(self.lm.device, self.lm.dtype), **self.ctx.describe()}
        if isinstance(self.answerer, ServedAnswerer):
            env["serving"] = self.answerer.stats()
        samples_path = self.settings.samples_path()
        if samples_path and samples is not None:  # the report names its samples file by contents, not by name
            data = {**data, "samples_sha256": write_jsonl_atomic(samples_path, samples)}
        facts = dict(self.facts)
        if "prefill" in facts and hasattr(self.lm, "prefill"):  # the rules this process's reads used, counted now
            facts["prefill"] = self.lm.prefill.describe()
        report = build_report(self.command, settings, facts, data, results, env)
        write_json_atomic(self.out, report)
        self.journal.finish()
        return report


def check_run_outputs(settings: RunSettings, reads: Sequence[str | Path | None]) -> Path:
    """Fail before any work if an output would overwrite an input or another output, or cannot be written."""
    out = check_writable(settings.out, "--out", room=len(JOURNAL_SUFFIX))
    samples = settings.samples_path()
    if samples is not None:
        check_writable(samples, "--samples")
    check_outputs({"--out": out, "--samples": samples, "the resume file": journal_path(out)}, reads)
    return out


def journal_path(out: Path) -> Path | None:
    """Where a run writing `out` journals its progress (None: a device such as /dev/null, nothing to resume)."""
    return None if written_through(out) else out.with_name(out.name + JOURNAL_SUFFIX)


JOURNAL_SUFFIX = ".partial.jsonl"


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
    """Join the ranks, check outputs, load the model, run `check(lm)` (its result joins the fingerprint), open
    the journal (rank 0).

    `reads`: the files and folders the run reads besides the model; `fingerprint`: what identifies the
    run's data (checksums), so that a resume with other data is refused.
    """
    check_dist_timeout(settings.dist_timeout)  # again: a command's settings may skip RunSettings.__post_init__
    ctx = init_distributed(settings.device, settings.chunk_parallel, settings.dist_timeout)
    try:
        served = is_served(settings.model)
        out = check_run_outputs(settings, [*reads, None if served else parse_spec(settings.model)[1]])
        if served:
            lm = _open_served(settings, ctx)
        else:
            options = model_options(settings.model, settings.model_args, **settings.family_flags())
            lm = load_model(settings.model, device=ctx.device, dtype=settings.dtype, **options)
        if ctx.chunk_parallel > 1:  # the group's ranks share each sequence: every model call is collective
            lm = chunk_parallel_lm(lm, ctx.chunk)
        extra = check(lm) if check is not None else {}
        facts = model_facts(lm)
        numeric = {**settings.numeric(), "model_args": answer_settings(settings.model, settings.model_args)}
        identity = {"command": command, "settings": numeric, "weights_sha256": facts["weights_sha256"],
                    **(fingerprint or {}), **extra}  # fmt: skip
        journal = Journal(journal_path(out), identity, settings.resume) if ctx.is_main else None
        ctx.check(None)  # every rank is ready (or every rank stops with the first rank's error)
    except BaseException as e:
        ctx.__exit__(type(e), e, e.__traceback__)
        raise
    answerer = ServedAnswerer(lm, journal) if served else LocalAnswerer(lm)
    return Run(command, settings, ctx, lm, facts, journal, out, progress, on_unit, answerer)


def open_answerer(
    spec: str | None, model_args: dict[str, Any], device: str = "cpu", dtype: str = "float32",
    journal: Journal | None = None, role: str = "judge",
) -> Answerer:  # fmt: skip
    """An answerer for a model besides a run's own (a judge): served (its answers journaled in `journal`, when given,
    marked with `role`), or loaded in this process."""
    if is_served(spec):
        return ServedAnswerer(open_served(spec, model_args), journal, role)
    return LocalAnswerer(load_model(spec, device=device, dtype=dtype, **model_options(spec, model_args)))


def _open_served(settings: RunSettings, ctx: DistContext) -> StreamingLM:
    """A served model, once the flags that only concern a model megaeval loads are checked to be unset: the server
    chooses dtype and device, and spreads the model itself (one process sends every request)."""
    given = [flag for flag, value, default in (("--dtype", settings.dtype, "float32"), ("--device", settings.device,
             "cpu"), ("--kernels", settings.kernels, None), ("--chunk-parallel", settings.chunk_parallel, 1))
             if value != default]  # fmt: skip
    if given:
        raise fail(f"{given[0]} applies to a model megaeval loads, not to a served one ({settings.model})",
                   f"drop {given[0]}: the server chooses how it runs the model")  # fmt: skip
    if ctx.world_size > 1:
        raise fail(f"a served model ({settings.model}) runs in one process: its server spreads the model, and the "
                   "requests go from one client", "run the command without torchrun (concurrency=N in "
                   "--model-args keeps N requests in flight)")  # fmt: skip
    return open_served(settings.model, settings.model_args)
