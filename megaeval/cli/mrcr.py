"""`megaeval mrcr` and `megaeval graphwalks`' command lines."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .options import MODEL, RUN, command, finish, output, settings_of

BosOpt = Annotated[
    str, typer.Option(help="BOS before the prompt: auto (the template's, or the model's), always, never.")
]
BatchOpt = Annotated[str, typer.Option(help="Records answered together: auto or N (results do not change).")]
TemplateOpt = Annotated[
    str | None, typer.Option(help="One of the model's several chat templates, by name; default: its own.")
]
TemperatureOpt = Annotated[float, typer.Option(help="0: greedy (default); above 0, sampled with a seed per record.")]
SeedOpt = Annotated[int, typer.Option(help="Sampled answers: each record's seed is drawn from this.")]


@command(MODEL, RUN, output("reports/mrcr.json", "Per-record JSONL: id, bin, response, answer, grade (a --predictions "
                                                 "file as it is)."))  # fmt: skip
def mrcr(
    data: Annotated[
        str | None,
        typer.Option(
            help="openai/mrcr's files (a folder of {2,4,8}needle/*.parquet or {2,4,8}needle.parquet, or one file), "
            "or GDM MRCR v2's mrcr_v2p1_*.csv files."
        ),
    ] = None,
    predictions: Annotated[
        str | None, typer.Option(help="Grade these responses (JSONL: id, response) against --data, no model.")
    ] = None,
    needles: Annotated[str, typer.Option(help="Needle counts to run, comma-separated.")] = "2,4,8",
    limit: Annotated[int | None, typer.Option(help="The first N records of each needle count; default: all.")] = None,
    bin_by: Annotated[
        str, typer.Option(help="Bin by o200k_base tokens of prompt+answer (the card's) or of the prompt alone.")
    ] = "prompt+answer",
    max_length: Annotated[
        int | None,
        typer.Option(
            help="Run the bins whose upper edge is at most N tokens; default: the model's context (all "
            "for a state-carrying model)."
        ),
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option(help="Tokens per response (the card's snippet sets no limit: the API's own).")
    ] = 4096,
    strip: Annotated[bool, typer.Option(help="Strip the response's whitespace before grading (the card does not).")] = (
        False
    ),
    render: Annotated[
        str, typer.Option(help="template (the model's chat template), plain (a transcript), or auto.")
    ] = "auto",
    chat_template: TemplateOpt = None,
    temperature: TemperatureOpt = 0.0,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    batch_size: BatchOpt = "auto",
    **shared: Any,
) -> None:
    """OpenAI MRCR: multi-round co-reference in chats to 1M tokens, graded by the dataset card's grade()."""
    from ..commands.mrcr import MrcrSettings, mrcr_summary, run_mrcr

    settings = MrcrSettings(
        data=data, predictions=predictions, needles=needles, limit=limit, bin_by=bin_by, max_length=max_length,
        max_new_tokens=max_new_tokens, strip=strip, render=render, chat_template=chat_template,
        temperature=temperature, seed=seed, bos=bos, batch_size=batch_size, **settings_of(shared),
    )  # fmt: skip
    finish(run_mrcr(settings, progress=shared["progress"]), mrcr_summary, settings.out)


@command(MODEL, RUN, output("reports/graphwalks.json", "Per-record JSONL: id, problem type, response, nodes read, "
                                                       "F1 (a --predictions file as it is)."))  # fmt: skip
def graphwalks(
    data: Annotated[
        str | None,
        typer.Option(help="openai/graphwalks' files: a folder of its .parquet files, or one file of records."),
    ] = None,
    predictions: Annotated[
        str | None, typer.Option(help="Score these responses (JSONL: id, response) against --data, no model.")
    ] = None,
    problem_types: Annotated[str, typer.Option(help="Problem types to run, comma-separated.")] = "bfs,parents",
    limit: Annotated[int | None, typer.Option(help="The first N records of each problem type; default: all.")] = None,
    grader: Annotated[
        str,
        typer.Option(
            help="lm-eval (lm-evaluation-harness 0.4.13's f1), lm-eval-flexible (its flexible_f1) or card "
            "(the dataset card's snippets)."
        ),
    ] = "lm-eval",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per response (lm-eval's max_gen_toks).")] = 16384,
    render: Annotated[
        str, typer.Option(help="template (one user turn of the model's chat template), plain (as is), or auto.")
    ] = "auto",
    chat_template: TemplateOpt = None,
    temperature: TemperatureOpt = 0.0,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    batch_size: BatchOpt = "auto",
    **shared: Any,
) -> None:
    """Graphwalks: BFS and parent lookups over hash-named graphs to 1M tokens, scored by set F1."""
    from ..commands.graphwalks import GraphwalksSettings, graphwalks_summary, run_graphwalks

    settings = GraphwalksSettings(
        data=data, predictions=predictions, problem_types=problem_types, limit=limit, grader=grader,
        max_new_tokens=max_new_tokens, render=render, chat_template=chat_template, temperature=temperature, seed=seed,
        bos=bos, batch_size=batch_size, **settings_of(shared),
    )  # fmt: skip
    finish(run_graphwalks(settings, progress=shared["progress"]), graphwalks_summary, settings.out)
