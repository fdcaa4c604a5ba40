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
    """What a checkpoint is: architecture, sizes, chunk, state bytes, tokenizer."""
    from ..commands.info import info_table, load_for_info

    model = settings_of(shared)
    lm = load_for_info(model["model"], model["model_args"], model["device"], model["dtype"], model["kernels"])
    echo(json.dumps(lm.describe(), indent=2) if as_json else info_table(lm), end="\n" if as_json else "")
