"""The `megaeval` command line: parse arguments, call the library, print. No evaluation logic here."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from .cli_longppl import longppl
from .cli_options import (
    AlphaOpt,
    BetaOpt,
    BosOpt,
    ChatTemplateOpt,
    ChunkParallelOpt,
    DeviceOpt,
    DistTimeoutOpt,
    DtypeOpt,
    EvaluatorArgsOpt,
    EvaluatorOpt,
    FewshotMultiturnOpt,
    KernelsOpt,
    KeyTokensOpt,
    ModelArg,
    ModelArgsOpt,
    ModelOpt,
    NoBosOpt,
    SlidingWindowOpt,
    SystemInstructionOpt,
    TruncLenOpt,
    bare_chat_template,
    bos_flag,
    exit_process,
    unescape,
    user_errors,
)
from .cli_retrieval import needle, ruler
from .console import echo, error_line, interrupt_on_sigterm, interrupted_line
from .scoring.sweep_plan import DEFAULT_LENGTHS


class _Commands(typer.core.TyperGroup):
    """megaeval's command group: a bare `--chat-template` (no name) reads as `--chat-template=default`."""

    def parse_args(self, ctx, args):  # noqa: ANN001, ANN201 (click's signature)
        return super().parse_args(ctx, bare_chat_template(args))


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Evaluate long-context language models: perplexity sweeps, needle retrieval, SCROLLS and the academic suite.",
)


@app.callback()
def _commands() -> None:
    """Evaluate long-context language models: perplexity sweeps, needle retrieval, SCROLLS and the academic suite."""


@app.command()
@user_errors
def info(
    model: ModelArg = None,
    model_args: ModelArgsOpt = "",
    dtype: DtypeOpt = "float32",
    device: DeviceOpt = "cpu",
    kernels: KernelsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """What a checkpoint is: architecture, sizes, chunk, state bytes, tokenizer."""
    from .commands.info import info_table, load_for_info
    from .models import parse_model_args

    lm = load_for_info(model, parse_model_args(model_args), device, dtype, kernels)
    echo(json.dumps(lm.describe(), indent=2) if as_json else info_table(lm), end="\n" if as_json else "")


@app.command("prep-books")
@user_errors
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
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Shuffle books, wrap each in BOS...EOS, and tokenize them once into a memory-mapped stream."""
    from .commands.prep_books import prep_books as run_prep_books
    from .commands.prep_books import summary
    from .models import parse_model_args

    manifest = run_prep_books(sources, out, tokenizer=tokenizer, model=model, model_args=parse_model_args(model_args),
                              seed=seed, min_tokens=min_tokens, text_field=text_field, bos=bos, eos=eos,
                              workers=workers, progress=progress, force=force)  # fmt: skip
    echo(summary(out, manifest))


@app.command("ppl-sweep")
@user_errors
def ppl_sweep(
    stream: Annotated[str, typer.Option(help="Books stream directory made by `megaeval prep-books`.")],
    model: ModelOpt = None,
    model_args: ModelArgsOpt = "",
    lengths: Annotated[str, typer.Option(help="Context lengths; K = 1024, M = 1048576.")] = DEFAULT_LENGTHS,
    tokens: Annotated[
        str | None, typer.Option(help="Targets N scored at every length; default: the most that fit.")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Segments of one length scored together.")] = 1,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    norm_stats: Annotated[
        str | None, typer.Option(help="MEGALODON norm statistics: cumulative (default) or official-window.")
    ] = None,
    kernels: KernelsOpt = None,
    window_policy: Annotated[
        str, typer.Option(help="Lengths beyond a model's max_context: error, disjoint or sliding:S.")
    ] = "error",
    schedule: Annotated[
        str, typer.Option(help="shared (shared-prefix reuse) or naive (every segment run).")
    ] = "shared",
    peak_tflops: Annotated[
        str, typer.Option(help="MFU's peak per device: auto (nominal, else measure), measure, or TFLOP/s.")
    ] = "auto",
    key_tokens: KeyTokensOpt = None,
    evaluator: EvaluatorOpt = None,
    evaluator_args: EvaluatorArgsOpt = "",
    trunc_len: TruncLenOpt = None,
    sliding_window: SlidingWindowOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    chunk_parallel: ChunkParallelOpt = 1,
    dist_timeout: DistTimeoutOpt = 1800.0,
    out: Annotated[str, typer.Option(help="Report file (JSON).")] = "reports/ppl_sweep.json",
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Perplexity of a books stream at context lengths 4K ... 2M, every length scoring the same tokens (and LongPPL on
    the key tokens with --key-tokens or --evaluator)."""
    from .commands.ppl_sweep import SweepSettings, run_ppl_sweep, sweep_summary
    from .models import parse_model_args

    settings = SweepSettings(
        stream=stream, model=model, model_args=parse_model_args(model_args), lengths=lengths, tokens=tokens,
        batch_size=batch_size, device=device, dtype=dtype, norm_stats=norm_stats, kernels=kernels,
        window_policy=window_policy, schedule=schedule, peak_tflops=peak_tflops, key_tokens=key_tokens,
        evaluator=evaluator, evaluator_args=parse_model_args(evaluator_args), trunc_len=trunc_len,
        sliding_window=sliding_window, alpha=alpha, beta=beta, chunk_parallel=chunk_parallel, out=out, resume=resume,
        dist_timeout=dist_timeout,
    )  # fmt: skip
    report = run_ppl_sweep(settings, progress=progress)
    if report is not None:  # rank 0 (or the only process)
        echo(sweep_summary(report), end="")
        echo(f"report: {out}")


@app.command("scrolls")
@user_errors
def scrolls(
    model: ModelOpt = None,
    model_args: ModelArgsOpt = "",
    tasks: Annotated[str, typer.Option(help="Comma-separated: narrative_qa, qasper, qmsum, or all.")] = (
        "narrative_qa,qasper,qmsum"
    ),
    data_dir: Annotated[
        str | None,
        typer.Option(
            help="Local data: DIR/<task>/<split>.jsonl|.parquet; default: the hub's tau/scrolls parquet export."
        ),
    ] = None,
    split: Annotated[str | None, typer.Option(help="Split to evaluate; default: validation.")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N examples of each task.")] = None,
    shots: Annotated[int | None, typer.Option(help="Few-shot exemplars; default per task: 0 / 2 / 1.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the exemplar draw.")] = 0,
    template: Annotated[str | None, typer.Option(help="Prompt template; default '{CONTEXT} Q: {QUESTION} A:'.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Default per task: 64 / 128 / 512.")] = None,
    stop: Annotated[
        list[str] | None, typer.Option(help="Stop string (repeatable; escapes like \\n allowed); default: newline.")
    ] = None,
    truncation: Annotated[
        str, typer.Option(help="Fixed-context models: drop document tokens from the middle, left or right.")
    ] = "middle",
    batch_size: Annotated[str, typer.Option(help="Examples answered together: auto or N (results do not change).")] = (
        "auto"
    ),
    chat_template: ChatTemplateOpt = None,
    system_instruction: SystemInstructionOpt = None,
    fewshot_as_multiturn: FewshotMultiturnOpt = None,
    bos: BosOpt = "auto",
    no_bos: NoBosOpt = False,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    kernels: KernelsOpt = None,
    predictions: Annotated[
        str | None, typer.Option(help="Score these predictions (JSONL: task, id, prediction) without a model.")
    ] = None,
    allow_partial: Annotated[
        bool, typer.Option(help="With --predictions: score only the examples predicted (coverage is shown).")
    ] = False,
    chunk_parallel: ChunkParallelOpt = 1,
    dist_timeout: DistTimeoutOpt = 1800.0,
    out: Annotated[str, typer.Option(help="Report file (JSON).")] = "reports/scrolls.json",
    samples: Annotated[str | None, typer.Option(help="Per-example JSONL: prompt size, prediction, scores.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """SCROLLS NarrativeQA (F1), Qasper (F1) and QMSum (geometric ROUGE) with the paper's prompt."""
    from .commands.report import task_summary
    from .commands.scrolls import ScrollsSettings, run_scrolls
    from .models import parse_model_args

    settings = ScrollsSettings(
        model=model, model_args=parse_model_args(model_args), tasks=tasks, data_dir=data_dir, split=split,
        limit=limit, shots=shots, seed=seed, template=template, max_new_tokens=max_new_tokens,
        stop=None if stop is None else [unescape(s) for s in stop], truncation=truncation, batch_size=batch_size,
        bos=bos_flag(bos, no_bos), device=device, dtype=dtype, kernels=kernels, predictions=predictions,
        allow_partial=allow_partial, out=out, samples=samples, resume=resume, chunk_parallel=chunk_parallel,
        dist_timeout=dist_timeout, chat_template=chat_template, system_instruction=system_instruction,
        fewshot_as_multiturn=fewshot_as_multiturn,
    )  # fmt: skip
    report = run_scrolls(settings, progress=progress)
    if report is not None:  # rank 0 (or the only process)
        echo(task_summary(report), end="")
        echo(f"report: {out}")


@app.command("academic")
@user_errors
def academic(
    model: ModelOpt = None,
    model_args: ModelArgsOpt = "",
    tasks: Annotated[
        str,
        typer.Option(
            help="all, or a comma list of: hellaswag, piqa, siqa, winogrande, "
            "arc_easy, arc_challenge, boolq, mmlu, nq_open, triviaqa."
        ),
    ] = "all",
    shots: Annotated[
        int | None,
        typer.Option(
            help="Few-shot exemplars for every task; default per task (5 for MMLU, NQ, TriviaQA; 0 otherwise)."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N documents (per subject for MMLU).")] = None,
    data_dir: Annotated[
        str | None,
        typer.Option(help="Local data: DIR/<task>/<split>.jsonl|.parquet|.csv in the hub schema; default: the hub."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random few-shot sampler (lm-evaluation-harness's).")] = 1234,
    batch_size: Annotated[str, typer.Option(help="Documents answered together: auto or N (results do not change).")] = (
        "auto"
    ),
    chat_template: ChatTemplateOpt = None,
    system_instruction: SystemInstructionOpt = None,
    fewshot_as_multiturn: FewshotMultiturnOpt = None,
    bos: BosOpt = "auto",
    no_bos: NoBosOpt = False,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    kernels: KernelsOpt = None,
    out: Annotated[str, typer.Option(help="Report file (JSON).")] = "reports/academic.json",
    samples: Annotated[
        str | None, typer.Option(help="Per-document JSONL: log-likelihoods, prediction, scores.")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run of the same settings.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
    chunk_parallel: ChunkParallelOpt = 1,
    dist_timeout: DistTimeoutOpt = 1800.0,
) -> None:
    """The short-context suite of Table 1 (MMLU, BoolQ, HellaSwag, ...), as lm-evaluation-harness defines it."""
    from .commands.academic import AcademicSettings, run_academic
    from .commands.report import task_summary
    from .models import parse_model_args

    settings = AcademicSettings(
        model=model, model_args=parse_model_args(model_args), tasks=tasks, shots=shots, limit=limit,
        data_dir=data_dir, seed=seed, batch_size=batch_size, bos=bos_flag(bos, no_bos), device=device, dtype=dtype,
        kernels=kernels, out=out, samples=samples, resume=resume, chunk_parallel=chunk_parallel,
        dist_timeout=dist_timeout, chat_template=chat_template, system_instruction=system_instruction,
        fewshot_as_multiturn=fewshot_as_multiturn,
    )  # fmt: skip
    report = run_academic(settings, progress=progress)
    if report is None:  # a rank other than 0: rank 0 reports
        return
    echo(task_summary(report), end="")
    if report["results"].get("average") is not None:
        echo(f"average over tasks: {report['results']['average']:.4f}")
    echo(f"report: {out}")


# The retrieval commands live in cli_retrieval (this module would pass 400 lines); registered here, in help order.
app.command("needle")(needle)
app.command("ruler")(ruler)
app.command("longppl")(longppl)


@app.command("report")
@user_errors
def report_cmd(
    reports: Annotated[list[str], typer.Argument(help="Report JSON files.")],
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv, or html (one page, --out).")] = "table",
    metric: Annotated[
        str | None,
        typer.Option(
            help="ppl-sweep: ppl (default), bits_per_byte, word_ppl, ...; other reports: a result key "
            "such as exact_match (default: each task's headline metric)."
        ),
    ] = None,
    samples: Annotated[
        list[str] | None, typer.Option(help="html: the runs' --samples files, for the sample browser (repeatable).")
    ] = None,
    out: Annotated[str | None, typer.Option(help="html: the page to write, e.g. reports/runs.html.")] = None,
) -> None:
    """Reports side by side: a row per context length (ppl-sweep) or per task, a column per report; with
    --format html, one self-contained page of every kind with plots and a sample browser."""
    from .commands.report import compare
    from .errors import fail

    if fmt == "html":
        from .commands.report_html import write_html

        if out is None:
            raise fail("--format html writes a page", "pass --out runs.html")
        echo(f"page: {write_html(reports, samples or [], out)}")
        return
    if samples or out:
        raise fail("--samples and --out go with --format html", "pass --format html, or leave them out")
    echo(compare(reports, fmt=fmt, metric=metric), end="")


@app.command("plot")
@user_errors
def plot_cmd(
    reports: Annotated[list[str], typer.Argument(help="ppl-sweep or needle report JSON files.")],
    out: Annotated[str, typer.Option(help="Picture file: .png, .svg or .pdf.")],
    position_curve: Annotated[bool, typer.Option(help="Add the per-position NLL curve panel.")] = False,
    metric: Annotated[str, typer.Option(help="ppl-sweep: ppl, or longppl (a sweep with key tokens).")] = "ppl",
) -> None:
    """Perplexity against context length (log2 axis), one line per report; needle reports: heatmaps of accuracy
    by depth and length, and (several reports) accuracy against length."""
    from .commands.plot import plot_reports

    echo(f"plot: {plot_reports(reports, out, position_curve=position_curve, metric=metric)}")


def main() -> None:
    """Console-script entry point: a bad command line is one `error:` line and exit code 2, like bad input."""
    try:  # typer >= 0.20 carries its own copy of click
        from typer._click import exceptions as click_errors
    except ImportError:
        from click import exceptions as click_errors

    interrupt_on_sigterm()
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="megaeval", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as e:
        print(e.ctx.get_help() if e.ctx else "", file=sys.stderr)
        code = 2
    except click_errors.UsageError as e:  # unknown option, bad value, missing argument
        where = e.ctx.command_path if e.ctx else "megaeval"
        error_line(f"{' '.join(e.format_message().split()).rstrip('.')}; see `{where} --help`")
        code = 2
    except typer.Abort:
        interrupted_line()
        code = 130
    exit_process(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
