"""The root of the command line: the typer app with every command in help order, and `main`, the console script."""

from __future__ import annotations

import sys

import typer

from ..console import error_line, interrupt_on_sigterm, interrupted_line
from . import academic, babilong, info, longbench, longppl, needle, ppl_sweep, prep_books, report, ruler, scrolls
from .exits import exit_process
from .options import bare_chat_template

HELP = "Evaluate long-context language models: perplexity sweeps, needle retrieval, SCROLLS and the academic suite."


class _Commands(typer.core.TyperGroup):
    """megaeval's command group: a bare `--chat-template` (no name) reads as `--chat-template=default`."""

    def parse_args(self, ctx, args):  # noqa: ANN001, ANN201 (click's signature)
        return super().parse_args(ctx, bare_chat_template(args))


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=HELP)


@app.callback()
def _commands() -> None:
    """Evaluate long-context language models: perplexity sweeps, needle retrieval, SCROLLS and the academic suite."""


for _name, _command in (
    ("info", info.info), ("prep-books", prep_books.prep_books), ("ppl-sweep", ppl_sweep.ppl_sweep),
    ("scrolls", scrolls.scrolls), ("academic", academic.academic), ("needle", needle.needle), ("ruler", ruler.ruler),
    ("babilong", babilong.babilong), ("longbench", longbench.longbench), ("longppl", longppl.longppl),
    ("report", report.report), ("plot", report.plot),
):  # fmt: skip
    app.command(_name)(_command)


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
