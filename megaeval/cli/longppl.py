"""`megaeval longppl`'s command line."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..console import echo
from .options import KEYS, MODEL, RUN, command, output, settings_of


@command(MODEL, KEYS, RUN,
         output("reports/longppl.json", "Per-document JSONL: longppl, n_key_tokens, ppl, n_tokens."))  # fmt: skip
def longppl(
    data: Annotated[
        list[str],
        typer.Option(
            help="Documents (repeatable): a folder of .txt files (one document each), a .jsonl/.parquet file (one per "
            "row, --text-field), a save_to_disk folder, or hub:NAME[:SPLIT] (e.g. LongPPL's GovReport) with network."
        ),
    ],
    save_key_tokens: Annotated[
        str | None, typer.Option(help="Write the evaluator's key-token spans of every document to this file.")
    ] = None,
    text_field: Annotated[str, typer.Option(help="The field holding the text in .jsonl/.parquet rows.")] = "text",
    batch_size: Annotated[int, typer.Option(help="Short-context windows read together.")] = 8,
    **shared: Any,
) -> None:
    """LongPPL: perplexity on the key tokens, those an evaluator predicts far better with the whole document than
    with a short context (Fang et al., ICLR 2025), streamed to any length."""
    from ..commands.longppl import LongpplSettings, longppl_summary, run_longppl

    settings = LongpplSettings(data=data, save_key_tokens=save_key_tokens, text_field=text_field,
                               batch_size=batch_size, **settings_of(shared))  # fmt: skip
    report = run_longppl(settings, progress=shared["progress"])
    if report is not None:
        echo(longppl_summary(report), end="")
        if save_key_tokens:
            echo(f"key tokens: {save_key_tokens}")
        echo(f"report: {settings.out}")
