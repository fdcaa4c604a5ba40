"""The `megaeval` command line: parse arguments, call the library, print. No evaluation logic here."""

from __future__ import annotations

import functools
import json
import sys
from typing import Annotated

import typer

from .errors import MegaevalError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Evaluate long-context language models: perplexity sweeps, SCROLLS and the academic suite.",
)


@app.callback()
def _commands() -> None:
    """Evaluate long-context language models: perplexity sweeps, SCROLLS and the academic suite."""


ModelArg = Annotated[
    str | None, typer.Argument(help="Checkpoint dir or FAMILY:PATH; default: the embedded tiny model.")
]
ModelArgsOpt = Annotated[
    str,
    typer.Option(
        "--model-args", help="Comma-separated key=value options, e.g. norm_stats=official-window,tokenizer=PATH."
    ),
]
DtypeOpt = Annotated[str, typer.Option(help="float32, float64, bfloat16 or float16.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]


def user_errors(fn):
    """Turn MegaevalError into one line on stderr and exit code 2; Ctrl-C into exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MegaevalError as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError


@app.command()
@user_errors
def info(
    model: ModelArg = None,
    model_args: ModelArgsOpt = "",
    dtype: DtypeOpt = "float32",
    device: DeviceOpt = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """What a checkpoint is: architecture, sizes, chunk, state bytes, tokenizer."""
    from .models import load_model, parse_model_args

    facts = load_model(model, device=device, dtype=dtype, **parse_model_args(model_args)).describe()
    if as_json:
        print(json.dumps(facts, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{facts['family']} model", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    cfg = facts["config"]
    rows = [
        ("path", facts["path"]),
        ("parameters", f"{facts['parameters']:,}"),
        ("layers × model_dim", f"{cfg['num_layers']} × {cfg['model_dim']}"),
        ("z_dim / value_dim / heads", f"{cfg['z_dim']} / {cfg['value_dim']} / {cfg['num_heads']}"),
        ("ffn_hidden_dim", f"{cfg['ffn_hidden_dim']}" + (" (SwiGLU)" if cfg["swiglu"] else "")),
        ("cema_ndim / norm groups", f"{cfg['cema_ndim']} / {cfg['norm_num_groups']}"),
        ("chunk size", f"{facts['chunk_size']:,}"),
        ("max context", "unlimited (state carried)" if facts["max_context"] is None else f"{facts['max_context']:,}"),
        ("state per sequence", f"{human_bytes(facts['state_bytes_per_sequence'])} (at most)"),
        ("norm statistics", facts["norm_stats"]),
        (
            "dtype",
            f"{facts['dtype']} on {facts['device']} (stored {facts['stored_dtype']}, "
            f"model-parallel {facts['model_parallel_size']})",
        ),
        ("tokenizer", facts["tokenizer"]["path"]),
        (
            "vocabulary",
            f"{facts['tokenizer']['vocab_size']:,} (bos {facts['tokenizer']['bos_id']}, "
            f"eos {facts['tokenizer']['eos_id']})",
        ),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    Console().print(table)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
