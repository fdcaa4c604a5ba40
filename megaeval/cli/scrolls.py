"""`megaeval scrolls`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .options import CHAT, FEWSHOT, MODEL, RUN, command, finish, output, settings_of, unescape


@command(MODEL, CHAT, FEWSHOT, RUN,
         output("reports/scrolls.json", "Per-example JSONL: prompt size, prediction, scores."))  # fmt: skip
def scrolls(
    tasks: Annotated[str, typer.Option(help="Comma-separated: narrative_qa, qasper, qmsum, or all.")] = (
        "narrative_qa,qasper,qmsum"
    ),
    data_dir: Annotated[
        str | None,
        typer.Option(
            help="Local data: DIR/<task>/<split>.jsonl|.parquet; default: the hub's tau/scrolls parquet export."
        ),
    ] = None,
    split: Annotated[str | None, typer.Option(help="Split to evaluate; default: validation.")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N examples of each task.")] = None,
    shots: Annotated[int | None, typer.Option(help="Few-shot exemplars; default per task: 0 / 2 / 1.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the exemplar draw.")] = 0,
    template: Annotated[str | None, typer.Option(help="Prompt template; default '{CONTEXT} Q: {QUESTION} A:'.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Default per task: 64 / 128 / 512.")] = None,
    stop: Annotated[
        list[str] | None, typer.Option(help="Stop string (repeatable; escapes like \\n allowed); default: newline.")
    ] = None,
    truncation: Annotated[
        str, typer.Option(help="Fixed-context models: drop document tokens from the middle, left or right.")
    ] = "middle",
    batch_size: Annotated[str, typer.Option(help="Examples answered together: auto or N (results do not change).")] = (
        "auto"
    ),
    share_documents: Annotated[
        bool,
        typer.Option(
            help="Questions on one document read it once (--no-share-documents: each prompt whole; "
            "the same predictions)."
        ),
    ] = True,
    predictions: Annotated[
        str | None, typer.Option(help="Score these predictions (JSONL: task, id, prediction) without a model.")
    ] = None,
    allow_partial: Annotated[
        bool, typer.Option(help="With --predictions: score only the examples predicted (coverage is shown).")
    ] = False,
    **shared: Any,
) -> None:
    """SCROLLS NarrativeQA (F1), Qasper (F1) and QMSum (geometric ROUGE) with the paper's prompt."""
    from ..commands.report.kinds import task_summary
    from ..commands.scrolls import ScrollsSettings, run_scrolls

    settings = ScrollsSettings(
        tasks=tasks, data_dir=data_dir, split=split, limit=limit, shots=shots, seed=seed, template=template,
        max_new_tokens=max_new_tokens, stop=None if stop is None else [unescape(s) for s in stop],
        truncation=truncation, batch_size=batch_size, share_documents=share_documents, predictions=predictions,
        allow_partial=allow_partial,
        **settings_of(shared),
    )  # fmt: skip
    finish(run_scrolls(settings, progress=shared["progress"]), task_summary, settings.out)
