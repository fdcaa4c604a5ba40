"""`megaeval needle`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .options import CHAT, MODEL, RUN, command, finish, output, settings_of


@command(MODEL, CHAT, RUN, output("reports/needle.json", "Per-prompt JSONL: needle, answer, prediction, score."))
def needle(
    tasks: Annotated[
        str,
        typer.Option(
            "--task",
            "--tasks",
            help="Comma-separated: passkey, niah_single_1/2/3, niah_multikey_1/2/3, "
            "niah_multivalue, niah_multiquery, or all.",
        ),
    ] = "passkey",
    lengths: Annotated[str, typer.Option(help="Prompt lengths, max_new_tokens included; K = 1024, M = 1048576.")] = (
        "4K,8K,16K,32K,64K,128K"
    ),
    depths: Annotated[str, typer.Option(help="Needle depths in percent of the haystack.")] = (
        "0,10,20,30,40,50,60,70,80,90,100"
    ),
    samples_per_cell: Annotated[int, typer.Option(help="Prompts per (length, depth), each with new needles.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the needles, keys and values (RULER's default).")] = 42,
    max_new_tokens: Annotated[int | None, typer.Option(help="Default per task: passkey 10, RULER 128.")] = None,
    haystack: Annotated[
        str | None, typer.Option(help="Folder of .txt books for RULER's essay haystack; default: six Austen novels.")
    ] = None,
    include_path: Annotated[
        list[str] | None,
        typer.Option(help="Folder of your own task files (NAME.yaml, checked like the shipped ones); repeatable."),
    ] = None,
    schedule: Annotated[
        str, typer.Option(help="auto (shared for state-carrying models, naive otherwise), shared or naive.")
    ] = "auto",
    batch_size: Annotated[
        str, typer.Option(help="Prompts decoded together: auto (8 on CPU, 32 on GPU; fewer for long KV caches) or N.")
    ] = "auto",
    **shared: Any,
) -> None:
    """Passkey and RULER needle-in-a-haystack retrieval over a length x depth grid (heatmap: megaeval plot)."""
    from ..commands.needle import NeedleSettings, needle_summary, run_needle

    settings = NeedleSettings(
        tasks=tasks, lengths=lengths, depths=depths, samples_per_cell=samples_per_cell, seed=seed,
        max_new_tokens=max_new_tokens, haystack=haystack, include_path=include_path or [], schedule=schedule,
        batch_size=batch_size, **settings_of(shared),
    )  # fmt: skip
    finish(run_needle(settings, progress=shared["progress"]), needle_summary, settings.out)
