"""The options several commands share, declared once as blocks, and `command`, which gives a command the blocks it
names. A command module declares only its own options; the blocks' values reach it as `**shared`, and
`settings_of(shared)` turns them into its settings' fields.

Blocks: MODEL (which model, and how it is loaded), CHAT (chat template, system turn, BOS), FEWSHOT (exemplars as
turns), KEYS (LongPPL's key tokens), RUN (ranks under torchrun) and `output(...)` (report, samples, resume,
progress; each command names its own report file and samples).
"""

from __future__ import annotations

import codecs
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..console import echo
from .exits import user_errors

ModelArg = Annotated[
    str | None, typer.Argument(help="Checkpoint dir, FAMILY:PATH or embedded:NAME; default: embedded:megalodon-tiny.")
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="Checkpoint dir, FAMILY:PATH or embedded:NAME; default: embedded:megalodon-tiny."),
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
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar on stderr.")]


@dataclass(frozen=True)
class Block:
    """Options that several commands declare alike: parameters added to the signature of each command naming it."""

    params: tuple[inspect.Parameter, ...]
    first: bool = False  # before the command's own options (which model), else after them

    @staticmethod
    def of(first: bool = False, **options: tuple[Any, Any]) -> Block:
        """A block from name=(annotation, default) pairs, in order."""
        kind = inspect.Parameter.KEYWORD_ONLY
        return Block(tuple(inspect.Parameter(name, kind, annotation=annotation, default=default)
                           for name, (annotation, default) in options.items()), first)  # fmt: skip


def _model_block(spec: Any) -> Block:
    return Block.of(first=True, model=(spec, None), model_args=(ModelArgsOpt, ""), device=(DeviceOpt, "cpu"),
                    dtype=(DtypeOpt, "float32"), kernels=(KernelsOpt, None))  # fmt: skip


MODEL = _model_block(ModelOpt)
# `megaeval mtbench`: the model is one of three starting points, with no default
MODEL_ANSWERING = _model_block(Annotated[str | None, typer.Option(
    "--model", help="The model that answers: a checkpoint dir, FAMILY:PATH, embedded:NAME or openai:URL (or --answers, "
    "or --judgments).")])  # fmt: skip
MODEL_ARGUMENT = _model_block(ModelArg)  # `megaeval info [MODEL]`: the model is the argument

BosOpt = Annotated[
    str,
    typer.Option(
        "--bos",
        help="Start contexts with BOS: auto (the model's convention: an hf tokenizer's own default, as "
        "lm-evaluation-harness does; BOS for MEGALODON and RFA), always or never.",
    ),
]
CHAT = Block.of(
    chat_template=(
        Annotated[
            str | None,
            typer.Option(
                help="Render prompts with the model's chat template (a bare flag: its default; or a NAME of its "
                "several), as lm-eval's --apply_chat_template. Off: base-model prompts."
            ),
        ],
        None,
    ),
    system_instruction=(
        Annotated[
            str | None, typer.Option(help="A system turn (with --chat-template; before the prompt's text without).")
        ],
        None,
    ),
    bos=(BosOpt, "auto"),
    no_bos=(Annotated[bool, typer.Option("--no-bos", hidden=True, help="Same as --bos never.")], False),
)
FEWSHOT = Block.of(
    fewshot_as_multiturn=(
        Annotated[
            bool | None,
            typer.Option(
                "--fewshot-as-multiturn/--no-fewshot-as-multiturn",
                help="Exemplars as user/assistant turns (default: on with --chat-template, as lm-eval 0.4).",
            ),
        ],
        None,
    ),
)
# LongPPL's key tokens, in `longppl` and `ppl-sweep` (None: a key-token file's value, else the reference's default)
KEYS = Block.of(
    key_tokens=(
        Annotated[
            str | None,
            typer.Option(help="LongPPL: key tokens from this file (longppl --save-key-tokens), no evaluator run."),
        ],
        None,
    ),
    evaluator=(
        Annotated[str | None, typer.Option(help="LongPPL: the model that finds key tokens (a spec like --model's).")],
        None,
    ),
    evaluator_args=(Annotated[str, typer.Option(help="Load options of the evaluator, key=value,...")], ""),
    trunc_len=(
        Annotated[
            int | None, typer.Option(help="LongPPL: tokens of short context the evaluator compares with; default 4096.")
        ],
        None,
    ),
    sliding_window=(
        Annotated[int | None, typer.Option(help="LongPPL: tokens scored by one short-context window; default 1024.")],
        None,
    ),
    alpha=(
        Annotated[
            float | None,
            typer.Option(help="LongPPL: key when full context lowers the loss by more than alpha; default 2."),
        ],
        None,
    ),
    beta=(
        Annotated[
            float | None, typer.Option(help="LongPPL: ... and the full-context loss is below -beta nats; default -2.")
        ],
        None,
    ),
)
RUN = Block.of(
    chunk_parallel=(
        Annotated[
            int,
            typer.Option(
                help="Under torchrun: ranks that share each sequence, each reading a slice and (hf) holding that "
                "slice's KV cache (MEGALODON, hf)."
            ),
        ],
        1,
    ),
    dist_timeout=(
        Annotated[
            float,
            typer.Option(help="Under torchrun: seconds a rank waits for the others before the whole run stops."),
        ],
        1800.0,
    ),
)


def output(out: str, samples: str | None = None) -> Block:
    """The output options: the report file (default `out`), per-unit samples (when `samples`, their help), --resume,
    --progress."""
    options: dict[str, tuple[Any, Any]] = {"out": (Annotated[str, typer.Option(help="Report file (JSON).")], out)}
    if samples is not None:
        options["samples"] = (Annotated[str | None, typer.Option(help=samples)], None)
    options["resume"] = (Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")], False)
    options["progress"] = (ProgressOpt, True)
    return Block.of(**options)


def command(*blocks: Block) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Declare a command: the options of a `first` block, then its own, then the other blocks' (as --help lists
    them); the blocks' values reach it as **shared. A MegaevalError becomes one line and exit code 2."""

    def declare(fn: Callable[..., None]) -> Callable[..., None]:
        keyword = inspect.Parameter.KEYWORD_ONLY
        own = [p.replace(kind=keyword) for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]  # fmt: skip
        params = ([p for b in blocks if b.first for p in b.params] + own
                  + [p for b in blocks if not b.first for p in b.params])  # fmt: skip
        declared = user_errors(fn)
        declared.__signature__ = inspect.Signature(params)  # what typer reads
        declared.__annotations__ = {p.name: p.annotation for p in params}
        return declared

    return declare


def settings_of(shared: dict[str, Any]) -> dict[str, Any]:
    """The blocks' values as settings fields: load options parsed, --no-bos folded into --bos, --progress left out
    (it changes no setting: commands pass it to their run)."""
    from ..models import parse_model_args

    fields = {k: v for k, v in shared.items() if k not in ("progress", "no_bos")}
    for name in ("model_args", "evaluator_args"):
        if name in fields:
            fields[name] = parse_model_args(fields[name])
    if "bos" in fields:
        fields["bos"] = bos_flag(fields["bos"], shared.get("no_bos", False))
    return fields


def bos_flag(bos: str, no_bos: bool) -> str:
    """The --bos policy, with the old --no-bos flag as an alias of never."""
    from ..errors import fail
    from ..scoring.requests import bos_policy

    bos = bos_policy(bos)
    if no_bos and bos not in ("auto", "never"):
        raise fail(f"--no-bos contradicts --bos {bos}", "pass one of them")
    return "never" if no_bos else bos


def bare_chat_template(argv: list[str]) -> list[str]:
    """`--chat-template` without a name (last, or before another option) as `--chat-template=default`."""
    return [f"{a}=default" if a == "--chat-template" and (k + 1 == len(argv) or argv[k + 1].startswith("-")) else a
            for k, a in enumerate(argv)]  # fmt: skip


def unescape(text: str) -> str:
    """A --stop value with backslash escapes (\\n, \\t, \\u2014) decoded."""
    from ..errors import fail

    try:
        return codecs.decode(text, "unicode_escape")
    except UnicodeDecodeError as e:
        raise fail(
            f"--stop {text!r} has a bad escape ({e.reason})",
            "write escapes such as \\n or \\t, or \\\\ for a backslash",
        ) from None


def finish(report: dict[str, Any] | None, summary: Callable[[dict[str, Any]], str], out: str) -> None:
    """Print a finished run's summary and where its report is (rank 0, or the only process; other ranks print
    nothing)."""
    if report is not None:
        echo(summary(report), end="")
        echo(f"report: {out}")
