"""`megaeval ruler`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..console import echo
from .options import CHAT, MODEL, RUN, command, finish, output, settings_of


@command(MODEL, CHAT, RUN, output("reports/ruler.json", "Per-instance JSONL: prediction, outputs, score."))
def ruler(
    tasks: Annotated[str, typer.Option("--tasks", "--task", help="Comma-separated RULER tasks, or all (13).")] = "all",
    lengths: Annotated[str, typer.Option(help="max_seq_length of each instance, generation included.")] = (
        "4K,8K,16K,32K,64K,128K"
    ),
    num_samples: Annotated[int, typer.Option(help="Instances per task and length (RULER's 500).")] = 500,
    seed: Annotated[int, typer.Option(help="RULER's random_seed.")] = 42,
    essays: Annotated[
        str | None, typer.Option(help="RULER's PaulGrahamEssays.json; default: public-domain books stand in.")
    ] = None,
    qa_data: Annotated[str | None, typer.Option(help="Folder with RULER's squad.json and hotpotqa.json.")] = None,
    english_words: Annotated[
        str | None, typer.Option(help="RULER's english_words.json (cwe past wonderwords' list).")
    ] = None,
    data_dir: Annotated[str | None, typer.Option(help="Read instances from RULER's layout DIR/<length>/<task>.")] = (
        None
    ),
    write_data: Annotated[str | None, typer.Option(help="Write the instances in RULER's layout.")] = None,
    prepare_only: Annotated[bool, typer.Option(help="Write --write-data and stop; loads no weights.")] = False,
    tokenizer: Annotated[
        str | None, typer.Option(help="--prepare-only: a model spec whose tokenizer counts (default: --model's).")
    ] = None,
    threshold: Annotated[float, typer.Option(help="Effective length: averages must exceed it (RULER's 85.6).")] = (
        85.6
    ),
    include_path: Annotated[
        list[str] | None, typer.Option(help="Folder of your own RULER task files; repeatable.")
    ] = None,
    batch_size: Annotated[
        str, typer.Option(help="Instances of one task and length decoded together: auto or a number.")
    ] = "auto",
    share_prefixes: Annotated[
        bool,
        typer.Option(
            help="Instances of one task and length answered together read the start they share once (the haystack "
            "before the first needle); --no-share-prefixes: each prompt whole. The same predictions."
        ),
    ] = True,
    **shared: Any,
) -> None:
    """RULER's 13 tasks with RULER's own instances, scores, averages and effective length."""
    from ..commands.ruler import RulerSettings, prepare_ruler, ruler_summary, run_ruler

    settings = RulerSettings(
        tasks=tasks, lengths=lengths, num_samples=num_samples, seed=seed, essays=essays, qa_data=qa_data,
        english_words=english_words, data_dir=data_dir, write_data=write_data, prepare_only=prepare_only,
        tokenizer=tokenizer, threshold=threshold, include_path=include_path or [], batch_size=batch_size,
        share_prefixes=share_prefixes,
        **settings_of(shared),
    )  # fmt: skip
    if prepare_only:
        written = prepare_ruler(settings, progress=shared["progress"])
        echo(f"wrote {len(written)} files of RULER instances under {write_data}")
        return
    finish(run_ruler(settings, progress=shared["progress"]), ruler_summary, settings.out)
