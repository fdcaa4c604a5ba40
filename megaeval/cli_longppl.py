"""`megaeval longppl`'s command line (registered on the app in cli.py): options declared, settings built, one command
function called."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_options import (
    AlphaOpt,
    BetaOpt,
    ChunkParallelOpt,
    DeviceOpt,
    DistTimeoutOpt,
    DtypeOpt,
    EvaluatorArgsOpt,
    EvaluatorOpt,
    KernelsOpt,
    KeyTokensOpt,
    ModelArgsOpt,
    ModelOpt,
    SlidingWindowOpt,
    TruncLenOpt,
    user_errors,
)
from .console import echo


@user_errors
def longppl(
    data: Annotated[
        list[str],
        typer.Option(
            help="Documents (repeatable): a folder of .txt files (one document each), a .jsonl/.parquet file (one per "
            "row, --text-field), a save_to_disk folder, or hub:NAME[:SPLIT] (e.g. LongPPL's GovReport) with network."
        ),
    ],
    model: ModelOpt = None,
    model_args: ModelArgsOpt = "",
    evaluator: EvaluatorOpt = None,
    evaluator_args: EvaluatorArgsOpt = "",
    key_tokens: KeyTokensOpt = None,
    save_key_tokens: Annotated[
        str | None, typer.Option(help="Write the evaluator's key-token spans of every document to this file.")
    ] = None,
    text_field: Annotated[str, typer.Option(help="The field holding the text in .jsonl/.parquet rows.")] = "text",
    trunc_len: TruncLenOpt = None,
    sliding_window: SlidingWindowOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    batch_size: Annotated[int, typer.Option(help="Short-context windows read together.")] = 8,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    kernels: KernelsOpt = None,
    chunk_parallel: ChunkParallelOpt = 1,
    dist_timeout: DistTimeoutOpt = 1800.0,
    out: Annotated[str, typer.Option(help="Report file (JSON).")] = "reports/longppl.json",
    samples: Annotated[
        str | None, typer.Option(help="Per-document JSONL: longppl, n_key_tokens, ppl, n_tokens.")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """LongPPL: perplexity on the key tokens, those an evaluator predicts far better with the whole document than
    with a short context (Fang et al., ICLR 2025), streamed to any length."""
    from .commands.longppl import LongpplSettings, longppl_summary, run_longppl
    from .models import parse_model_args

    settings = LongpplSettings(
        data=data, model=model, model_args=parse_model_args(model_args), evaluator=evaluator,
        evaluator_args=parse_model_args(evaluator_args), key_tokens=key_tokens, save_key_tokens=save_key_tokens,
        text_field=text_field, trunc_len=trunc_len, sliding_window=sliding_window, alpha=alpha, beta=beta,
        batch_size=batch_size, device=device, dtype=dtype, kernels=kernels, chunk_parallel=chunk_parallel,
        dist_timeout=dist_timeout, out=out, samples=samples, resume=resume,
    )  # fmt: skip
    report = run_longppl(settings, progress=progress)
    if report is not None:
        echo(longppl_summary(report), end="")
        if save_key_tokens:
            echo(f"key tokens: {save_key_tokens}")
        echo(f"report: {out}")
