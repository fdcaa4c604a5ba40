"""`megaeval babilong`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..console import echo
from .options import CHAT, MODEL, RUN, command, finish, output, settings_of


@command(MODEL, CHAT, RUN,
         output("reports/babilong.json", "Per-instance JSONL: target, question, prediction, score."))  # fmt: skip
def babilong(
    data: Annotated[
        str | None,
        typer.Option(
            help="The sets: a folder (qaN/<length>.json, <length>/qaN.parquet or save_to_disk folders) "
            "or hub:RMT-team/babilong[-1k-samples] with network."
        ),
    ] = None,
    tasks: Annotated[str, typer.Option("--tasks", "--task", help="Comma-separated qa1 ... qa20, or all.")] = (
        "qa1,qa2,qa3,qa4,qa5"
    ),
    lengths: Annotated[
        str | None,
        typer.Option(
            help="The sets' configs: 0k, 1k, ..., 128k, ..., 1M, 10M; default 0k-128k, with --predictions every "
            "length the folder holds."
        ),
    ] = None,
    num_samples: Annotated[
        int | None, typer.Option(help="The first N instances of each task and length; default: all.")
    ] = None,
    instruction: Annotated[bool, typer.Option(help="The task's instruction in the prompt (official flag).")] = True,
    examples: Annotated[bool, typer.Option(help="The task's in-context examples (official flag).")] = True,
    post_prompt: Annotated[bool, typer.Option(help="The task's post-prompt (official flag).")] = True,
    predictions: Annotated[
        str | None, typer.Option(help="Score the official prediction files in this folder, without a model.")
    ] = None,
    write_predictions: Annotated[
        str | None, typer.Option(help="Also write the answers as the official prediction files, in this folder.")
    ] = None,
    prepare_only: Annotated[bool, typer.Option(help="Write generated instances (--write-data) and stop.")] = False,
    write_data: Annotated[str | None, typer.Option(help="--prepare-only: the folder to write them to.")] = None,
    babi: Annotated[str | None, typer.Option(help="--prepare-only: bAbI's tasks (tasks_1-20_v1-2).")] = None,
    babi_split: Annotated[str, typer.Option(help="--prepare-only: the bAbI split, test or train.")] = "test",
    background: Annotated[
        list[str] | None,
        typer.Option(
            help="--prepare-only: background books (folders of .txt, .jsonl/.parquet, hub:pg19:test; "
            "repeatable); default: the shipped public-domain novels."
        ),
    ] = None,
    text_field: Annotated[str, typer.Option(help="The text field of .jsonl/.parquet background rows.")] = "text",
    length_tokenizer: Annotated[
        str, typer.Option(help="--prepare-only: the tokenizer lengths count in (gpt2, BABILong's, or a folder).")
    ] = "gpt2",
    clean_up_spaces: Annotated[
        bool, typer.Option(help="--prepare-only: decode as transformers 4.x did (no space before punctuation).")
    ] = True,
    seed: Annotated[int, typer.Option(help="--prepare-only: the seed of every random draw.")] = 42,
    schedule: Annotated[
        str, typer.Option(help="auto (shared for state-carrying models, naive otherwise), shared or naive.")
    ] = "auto",
    batch_size: Annotated[
        str, typer.Option(help="Instances of one task and length decoded together: auto or N (results do not change).")
    ] = "auto",
    include_path: Annotated[
        list[str] | None, typer.Option(help="Folder of your own BABILong task files; repeatable.")
    ] = None,
    **shared: Any,
) -> None:
    """BABILong's 20 reasoning tasks on the published sets (0k to 10M tokens), official prompts and scorer."""
    from ..commands.babilong import BabilongSettings, babilong_summary, run_babilong

    settings = BabilongSettings(
        data=data, tasks=tasks, lengths=lengths, num_samples=num_samples, instruction=instruction,
        examples=examples, post_prompt=post_prompt, predictions=predictions, write_predictions=write_predictions,
        prepare_only=prepare_only, write_data=write_data, babi=babi, babi_split=babi_split,
        background=background or [], text_field=text_field, length_tokenizer=length_tokenizer,
        clean_up_spaces=clean_up_spaces, seed=seed, schedule=schedule, batch_size=batch_size,
        include_path=include_path or [], **settings_of(shared),
    )  # fmt: skip
    if prepare_only:
        from ..commands.babilong_files import prepare_babilong

        written = prepare_babilong(settings, progress=shared["progress"])
        echo(f"wrote {len(written)} files of BABILong instances under {write_data}")
        return
    finish(run_babilong(settings, progress=shared["progress"]), babilong_summary, settings.out)
