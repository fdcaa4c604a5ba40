"""`megaeval prep-books`'s command line."""

from __future__ import annotations

from typing import Annotated

import typer

from ..console import echo
from .options import ModelArgsOpt, ProgressOpt, command


@command()
def prep_books(
    sources: Annotated[
        list[str],
        typer.Argument(
            help="Folders of .txt/.txt.gz books, .jsonl/.parquet files, "
            "save_to_disk folders, or hub dataset NAME[:SPLIT]."
        ),
    ],
    out: Annotated[str, typer.Option(help="Output folder for tokens.bin and manifest.json.")],
    tokenizer: Annotated[str | None, typer.Option(help="A sentencepiece .model file.")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Use this model's tokenizer (default: the embedded model's, when --tokenizer is not given)."
        ),
    ] = None,
    model_args: ModelArgsOpt = "",
    seed: Annotated[int, typer.Option(help="Seed of the book shuffle.")] = 0,
    min_tokens: Annotated[int, typer.Option(help="Keep only books with at least this many tokens.")] = 0,
    text_field: Annotated[str, typer.Option(help="Field holding the text in jsonl/parquet/datasets rows.")] = "text",
    bos: Annotated[bool, typer.Option(help="Start every book with BOS.")] = True,
    eos: Annotated[bool, typer.Option(help="End every book with EOS.")] = True,
    workers: Annotated[int | None, typer.Option(help="Tokenizer processes; default: all cores.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing stream in --out.")] = False,
    progress: ProgressOpt = True,
) -> None:
    """Shuffle books, wrap each in BOS...EOS, and tokenize them once into a memory-mapped stream."""
    from ..commands.prep_books import prep_books as run_prep_books
    from ..commands.prep_books import summary
    from ..models import parse_model_args

    manifest = run_prep_books(sources, out, tokenizer=tokenizer, model=model, model_args=parse_model_args(model_args),
                              seed=seed, min_tokens=min_tokens, text_field=text_field, bos=bos, eos=eos,
                              workers=workers, progress=progress, force=force)  # fmt: skip
    echo(summary(out, manifest))
