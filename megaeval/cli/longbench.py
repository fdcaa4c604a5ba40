"""`megaeval longbench`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .options import CHAT, MODEL, RUN, command, finish, output, settings_of

SAMPLES = "Per-record JSONL: prompt head/tail, prediction, references, score."


@command(MODEL, CHAT, RUN, output("reports/longbench.json", SAMPLES))
def longbench(
    version: Annotated[int, typer.Option(help="1: LongBench (and LongBench-E with --e); 2: LongBench v2.")] = 1,
    data: Annotated[
        str | None,
        typer.Option(
            help="v1: the folder of LongBench's data/<task>.jsonl; v2: its data.json; or hub:THUDM/LongBench[-v2] "
            "with network."
        ),
    ] = None,
    tasks: Annotated[
        str,
        typer.Option("--tasks", "--task", help="v1: comma-separated task names, all, or present (the --data folder's)"),
    ] = "all",
    longbench_e: Annotated[
        bool, typer.Option("--e", help="v1: LongBench-E (<task>_e.jsonl, its 13 tasks, 0-4k/4-8k/8k+ buckets).")
    ] = False,
    num_samples: Annotated[int | None, typer.Option(help="The first N records of each task (v2: items).")] = None,
    max_prompt_tokens: Annotated[
        int | None,
        typer.Option(
            help="Cut longer prompts in the middle, as the official scripts do (official v2: 120000). Default: "
            "none for a state-carrying model; the room max_context leaves for the answer for a fixed one."
        ),
    ] = None,
    protocol: Annotated[
        str, typer.Option(help="v2: official (generate, extract the letter) or loglik (lm-eval's letters).")
    ] = "official",
    cot: Annotated[bool, typer.Option(help="v2: reason first (1,024 tokens), then answer (official CoT).")] = False,
    no_context: Annotated[bool, typer.Option(help="v2: the question without its text (official).")] = False,
    temperature: Annotated[float, typer.Option(help="v2: sampling temperature (official 0.1; 0: greedy).")] = 0.1,
    seed: Annotated[int, typer.Option(help="v2: the seed of every draw (with each item's _id).")] = 42,
    compensated: Annotated[bool, typer.Option(help="v2: an item with no answer counts 0.25 (result.py).")] = False,
    predictions: Annotated[
        str | None,
        typer.Option(help="Score official prediction files without a model (v1: pred/<model>/; v2: the .jsonl)."),
    ] = None,
    batch_size: Annotated[
        str, typer.Option(help="Prompts of one task answered together: auto or N (results do not change).")
    ] = "auto",
    include_path: Annotated[
        list[str] | None, typer.Option(help="v1: a folder of your own LongBench task files; repeatable.")
    ] = None,
    **shared: Any,
) -> None:
    """LongBench v1 / LongBench-E and v2 with their official prompts, truncation, extraction and metrics."""
    from ..commands.longbench import LongbenchSettings, longbench_summary, run_longbench

    settings = LongbenchSettings(
        version=version, data=data, tasks=tasks, longbench_e=longbench_e, num_samples=num_samples,
        max_prompt_tokens=max_prompt_tokens, protocol=protocol, cot=cot, no_context=no_context,
        temperature=temperature, seed=seed, compensated=compensated, predictions=predictions, batch_size=batch_size,
        include_path=include_path or [], **settings_of(shared),
    )  # fmt: skip
    finish(run_longbench(settings, progress=shared["progress"]), longbench_summary, settings.out)
