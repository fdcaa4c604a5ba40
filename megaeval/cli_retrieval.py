"""The retrieval commands' command lines, `megaeval needle` and `megaeval ruler` (registered on the app in cli.py):
options declared, settings built, one command function called."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_options import (
    BosOpt,
    ChatTemplateOpt,
    ChunkParallelOpt,
    DeviceOpt,
    DistTimeoutOpt,
    DtypeOpt,
    KernelsOpt,
    ModelArgsOpt,
    ModelOpt,
    SystemInstructionOpt,
    user_errors,
)
from .console import echo


@user_errors
def needle(
    model: ModelOpt = None,
    model_args: ModelArgsOpt = "",
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
    chat_template: ChatTemplateOpt = None,
    system_instruction: SystemInstructionOpt = None,
    schedule: Annotated[
        str, typer.Option(help="auto (shared for state-carrying models, naive otherwise), shared or naive.")
    ] = "auto",
    batch_size: Annotated[
        str, typer.Option(help="Prompts decoded together: auto (8 on CPU, 32 on GPU; fewer for long KV caches) or N.")
    ] = "auto",
    bos: BosOpt = "auto",
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    kernels: KernelsOpt = None,
    chunk_parallel: ChunkParallelOpt = 1,
    dist_timeout: DistTimeoutOpt = 1800.0,
    out: Annotated[str, typer.Option(help="Report file (JSON).")] = "reports/needle.json",
    samples: Annotated[str | None, typer.Option(help="Per-prompt JSONL: needle, answer, prediction, score.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Passkey and RULER needle-in-a-haystack retrieval over a length x depth grid (heatmap: megaeval plot)."""
    from .commands.needle import NeedleSettings, needle_summary, run_needle
    from .models import parse_model_args

    settings = NeedleSettings(
        model=model, model_args=parse_model_args(model_args), tasks=tasks, lengths=lengths, depths=depths,
        samples_per_cell=samples_per_cell, seed=seed, max_new_tokens=max_new_tokens, haystack=haystack,
        include_path=include_path or [], chat_template=chat_template, system_instruction=system_instruction,
        schedule=schedule, batch_size=batch_size,
        bos=bos, device=device, dtype=dtype, kernels=kernels, chunk_parallel=chunk_parallel,
        dist_timeout=dist_timeout, out=out,
        samples=samples, resume=resume,
    )  # fmt: skip
    report = run_needle(settings, progress=progress)
    if report is not None:  # rank 0 (or the only process)
        echo(needle_summary(report), end="")
        echo(f"report: {out}")


@user_errors
def ruler(
    model: ModelOpt = None,
    model_args: ModelArgsOpt = "",
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
    chat_template: ChatTemplateOpt = None,
    system_instruction: SystemInstructionOpt = None,
    threshold: Annotated[float, typer.Option(help="Effective length: averages must exceed it (RULER's 85.6).")] = (
        85.6
    ),
    include_path: Annotated[
        list[str] | None, typer.Option(help="Folder of your own RULER task files; repeatable.")
    ] = None,
    batch_size: Annotated[
        str, typer.Option(help="Instances of one task and length decoded together: auto or a number.")
    ] = "auto",
    bos: BosOpt = "auto",
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    kernels: KernelsOpt = None,
    chunk_parallel: ChunkParallelOpt = 1,
    dist_timeout: DistTimeoutOpt = 1800.0,
    out: Annotated[str, typer.Option(help="Report file (JSON).")] = "reports/ruler.json",
    samples: Annotated[str | None, typer.Option(help="Per-instance JSONL: prediction, outputs, score.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """RULER's 13 tasks with RULER's own instances, scores, averages and effective length."""
    from .commands.ruler import RulerSettings, prepare_ruler, ruler_summary, run_ruler
    from .models import parse_model_args

    settings = RulerSettings(
        model=model, model_args=parse_model_args(model_args), tasks=tasks, lengths=lengths, num_samples=num_samples,
        seed=seed, essays=essays, qa_data=qa_data, english_words=english_words, data_dir=data_dir,
        write_data=write_data, prepare_only=prepare_only, tokenizer=tokenizer, chat_template=chat_template,
        system_instruction=system_instruction,
        threshold=threshold, include_path=include_path or [], batch_size=batch_size, bos=bos, device=device,
        dtype=dtype, kernels=kernels, chunk_parallel=chunk_parallel, dist_timeout=dist_timeout, out=out,
        samples=samples, resume=resume,
    )  # fmt: skip
    if prepare_only:
        written = prepare_ruler(settings, progress=progress)
        echo(f"wrote {len(written)} files of RULER instances under {write_data}")
        return
    report = run_ruler(settings, progress=progress)
    if report is not None:
        echo(ruler_summary(report), end="")
        echo(f"report: {out}")
