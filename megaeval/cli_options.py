"""The options several `megaeval` commands share, and how the CLI turns errors into one line and an exit code."""

from __future__ import annotations

import functools
import sys
from typing import Annotated

import typer

from .console import error_line, interrupted_line
from .errors import MegaevalError

ModelArg = Annotated[
    str | None, typer.Argument(help="Checkpoint dir, FAMILY:PATH or embedded:NAME; default: embedded:megalodon-tiny.")
]
ModelArgsOpt = Annotated[
    str,
    typer.Option(
        "--model-args", help="Comma-separated key=value options, e.g. norm_stats=official-window,tokenizer=PATH."
    ),
]
DtypeOpt = Annotated[str, typer.Option(help="float32, float64, bfloat16 or float16.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]
KernelsOpt = Annotated[
    str | None,
    typer.Option(help="MEGALODON kernels: auto (default: Triton on CUDA, PyTorch otherwise), triton or torch."),
]


BosOpt = Annotated[
    str,
    typer.Option(
        "--bos",
        help="Start contexts with BOS: auto (the model's convention: an hf tokenizer's own default, as "
        "lm-evaluation-harness does; BOS for MEGALODON and RFA), always or never.",
    ),
]
ChunkParallelOpt = Annotated[
    int,
    typer.Option(
        help="Under torchrun: ranks that share each sequence, each reading a slice and (hf) holding that slice's "
        "KV cache (MEGALODON, hf)."
    ),
]
NoBosOpt = Annotated[bool, typer.Option("--no-bos", hidden=True, help="Same as --bos never.")]


def bos_flag(bos: str, no_bos: bool) -> str:
    """The --bos policy, with the old --no-bos flag as an alias of never."""
    from .errors import fail
    from .scoring.requests import bos_policy

    bos = bos_policy(bos)
    if no_bos and bos not in ("auto", "never"):
        raise fail(f"--no-bos contradicts --bos {bos}", "pass one of them")
    return "never" if no_bos else bos


DistTimeoutOpt = Annotated[
    float, typer.Option(help="Under torchrun: seconds a rank waits for the others before the whole run stops.")
]


def user_errors(fn):
    """Turn MegaevalError into one line on stderr and exit code 2; Ctrl-C into exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MegaevalError as e:
            error_line(str(e))
            raise typer.Exit(2) from None
        except KeyboardInterrupt as e:  # a run's journal puts what --resume will do in its message
            interrupted_line(str(e) if str(e).startswith("interrupted") else "interrupted")
            raise typer.Exit(130) from None

    return wrapper


ChatTemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="Render prompts with the model's chat template (a bare flag: its default; or a NAME of its "
        "several), as lm-eval's --apply_chat_template. Off: base-model prompts."
    ),
]
SystemInstructionOpt = Annotated[
    str | None, typer.Option(help="A system turn (with --chat-template; before the prompt's text without).")
]
FewshotMultiturnOpt = Annotated[
    bool | None,
    typer.Option(
        "--fewshot-as-multiturn/--no-fewshot-as-multiturn",
        help="Exemplars as user/assistant turns (default: on with --chat-template, as lm-eval 0.4).",
    ),
]


def bare_chat_template(argv: list[str]) -> list[str]:
    """`--chat-template` without a name (last, or before another option) as `--chat-template=default`."""
    return [f"{a}=default" if a == "--chat-template" and (k + 1 == len(argv) or argv[k + 1].startswith("-")) else a
            for k, a in enumerate(argv)]  # fmt: skip


ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="Checkpoint dir, FAMILY:PATH or embedded:NAME; default: embedded:megalodon-tiny."),
]


def unescape(text: str) -> str:
    """A --stop value with backslash escapes (\\n, \\t, \\u2014) decoded."""
    import codecs

    from .errors import fail

    try:
        return codecs.decode(text, "unicode_escape")
    except UnicodeDecodeError as e:
        raise fail(
            f"--stop {text!r} has a bad escape ({e.reason})",
            "write escapes such as \\n or \\t, or \\\\ for a backslash",
        ) from None


def exit_process(code: int) -> None:
    """Leave with `code`. A rank under torchrun that succeeded leaves without interpreter teardown (its work is
    written and its groups closed, rank 0 last, by then): gloo's threads can otherwise abort it in destructors. A
    rank that failed leaves normally, after the others have heard of it."""
    import os

    world = os.environ.get("WORLD_SIZE", "1").strip()
    if code == 0 and world.isdigit() and int(world) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


# LongPPL's key tokens, in `longppl` and `ppl-sweep` (None: a key-token file's value, else the reference's default)
EvaluatorOpt = Annotated[
    str | None, typer.Option(help="LongPPL: the model that finds key tokens (a spec like --model's).")
]
EvaluatorArgsOpt = Annotated[str, typer.Option(help="Load options of the evaluator, key=value,...")]
KeyTokensOpt = Annotated[
    str | None, typer.Option(help="LongPPL: key tokens from this file (longppl --save-key-tokens), no evaluator run.")
]
TruncLenOpt = Annotated[
    int | None, typer.Option(help="LongPPL: tokens of short context the evaluator compares with; default 4096.")
]
SlidingWindowOpt = Annotated[
    int | None, typer.Option(help="LongPPL: tokens scored by one short-context window; default 1024.")
]
AlphaOpt = Annotated[
    float | None, typer.Option(help="LongPPL: key when full context lowers the loss by more than alpha; default 2.")
]
BetaOpt = Annotated[
    float | None, typer.Option(help="LongPPL: ... and the full-context loss is below -beta nats; default -2.")
]
