"""`megaeval academic`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .options import CHAT, FEWSHOT, MODEL, RUN, command, finish, output, settings_of


@command(MODEL, CHAT, FEWSHOT, RUN,
         output("reports/academic.json", "Per-document JSONL: log-likelihoods, prediction, scores."))  # fmt: skip
def academic(
    tasks: Annotated[
        str,
        typer.Option(
            help="all, or a comma list of: hellaswag, piqa, siqa, winogrande, "
            "arc_easy, arc_challenge, boolq, mmlu, nq_open, triviaqa."
        ),
    ] = "all",
    shots: Annotated[
        int | None,
        typer.Option(
            help="Few-shot exemplars for every task; default per task (5 for MMLU, NQ, TriviaQA; 0 otherwise)."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N documents (per subject for MMLU).")] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(help="Local data: DIR/<task>/<split>.jsonl|.parquet|.csv in the hub schema; default: the hub."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random few-shot sampler (lm-evaluation-harness's).")] = 1234,
    batch_size: Annotated[str, typer.Option(help="Documents answered together: auto or N (results do not change).")] = (
        "auto"
    ),
    **shared: Any,
) -> None:
    """The short-context suite of Table 1 (MMLU, BoolQ, HellaSwag, ...), as lm-evaluation-harness defines it."""
    from ..commands.academic import AcademicSettings, run_academic

    settings = AcademicSettings(tasks=tasks, shots=shots, limit=limit, data_dir=data_dir, seed=seed,
                                batch_size=batch_size, **settings_of(shared))  # fmt: skip
    finish(run_academic(settings, progress=shared["progress"]), summary, settings.out)


def summary(report: dict[str, Any]) -> str:
    """The task table, and the average over tasks when every task has a score."""
    from ..commands.report.kinds import task_summary

    average = report["results"].get("average")
    return task_summary(report) + ("" if average is None else f"average over tasks: {average:.4f}\n")
