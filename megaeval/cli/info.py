"""`megaeval info`'s command line."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..console import echo
from .options import MODEL_ARGUMENT, command, settings_of


@command(MODEL_ARGUMENT)
def info(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
         **shared: Any) -> None:  # fmt: skip
    """What a checkpoint is: architecture, sizes, chunk, state bytes, tokenizer, and how long it took to load."""
    import time

    from ..commands.info import info_table, load_for_info

    model = settings_of(shared)
    start = time.perf_counter()
    lm = load_for_info(model["model"], model["model_args"], model["device"], model["dtype"], model["kernels"])
    seconds = time.perf_counter() - start
    facts = {**lm.describe(), "load_seconds": round(seconds, 3)}
    echo(json.dumps(facts, indent=2) if as_json else info_table(lm, seconds), end="\n" if as_json else "")
