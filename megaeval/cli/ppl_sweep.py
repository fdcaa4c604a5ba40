"""`megaeval ppl-sweep`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..scoring.sweep_plan import DEFAULT_LENGTHS
from .options import KEYS, MODEL, RUN, command, finish, output, settings_of


@command(MODEL, KEYS, RUN, output("reports/ppl_sweep.json"))
def ppl_sweep(
    stream: Annotated[str, typer.Option(help="Books stream directory made by `megaeval prep-books`.")],
    lengths: Annotated[str, typer.Option(help="Context lengths; K = 1024, M = 1048576.")] = DEFAULT_LENGTHS,
    tokens: Annotated[
        str | None, typer.Option(help="Targets N scored at every length; default: the most that fit.")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Segments of one length scored together.")] = 1,
    norm_stats: Annotated[
        str | None, typer.Option(help="MEGALODON norm statistics: cumulative (default) or official-window.")
    ] = None,
    window_policy: Annotated[
        str, typer.Option(help="Lengths beyond a model's max_context: error, disjoint or sliding:S.")
    ] = "error",
    schedule: Annotated[
        str, typer.Option(help="shared (shared-prefix reuse) or naive (every segment run).")
    ] = "shared",
    peak_tflops: Annotated[
        str, typer.Option(help="MFU's peak per device: auto (nominal, else measure), measure, or TFLOP/s.")
    ] = "auto",
    **shared: Any,
) -> None:
    """Perplexity of a books stream at context lengths 4K ... 2M, every length scoring the same tokens (and LongPPL on
    the key tokens with --key-tokens or --evaluator)."""
    from ..commands.ppl_sweep import SweepSettings, run_ppl_sweep, sweep_summary

    settings = SweepSettings(
        stream=stream, lengths=lengths, tokens=tokens, batch_size=batch_size, norm_stats=norm_stats,
        window_policy=window_policy, schedule=schedule, peak_tflops=peak_tflops, **settings_of(shared),
    )  # fmt: skip
    finish(run_ppl_sweep(settings, progress=shared["progress"]), sweep_summary, settings.out)
