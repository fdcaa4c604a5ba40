"""The root of the command line: the typer app with every command in help order, and `main`, the console script."""

from __future__ import annotations

import shutil
import sys
from collections import Counter

import typer

from ..console import error_line, interrupt_on_sigterm, interrupted_line
from . import (
    academic,
    babilong,
    info,
    longbench,
    longppl,
    mrcr,
    mtbench,
    needle,
    ppl_sweep,
    prep_books,
    report,
    ruler,
    scrolls,
)
from .exits import exit_process
from .options import bare_chat_template

HELP = "Evaluate long-context language models: perplexity sweeps, needle retrieval, SCROLLS and the academic suite."


HELP_WIDTH = 100  # the width of help off a terminal; a terminal narrower than this gets plain help at its own width


def help_width() -> int | None:
    """The width of plain-text help, or None on a terminal wide enough for rich's panels (which squeeze every
    option's text into a narrow column below that, and are drawn at 80 columns off a terminal)."""
    if not getattr(sys.stdout, "isatty", lambda: False)():
        return HELP_WIDTH
    columns = shutil.get_terminal_size().columns
    return None if columns >= HELP_WIDTH else columns


def _format_help(ctx, formatter, rich, plain) -> None:  # noqa: ANN001 (click's types)
    """`rich` (typer's panels) on a wide terminal, else `plain` (click's layout) at `help_width()`."""
    width = help_width()
    if width is None:
        return rich(ctx, formatter)
    formatter.width = width
    return plain(ctx, formatter)


class _Commands(typer.core.TyperGroup):
    """megaeval's command group: a bare `--chat-template` (no name) reads as `--chat-template=default`."""

    def parse_args(self, ctx, args):  # noqa: ANN001, ANN201 (click's signature)
        return super().parse_args(ctx, bare_chat_template(args))

    def format_help(self, ctx, formatter) -> None:  # noqa: ANN001 (click's signature)
        _format_help(ctx, formatter, super().format_help, super(typer.core.TyperGroup, self).format_help)


class _Command(typer.core.TyperCommand):
    """A megaeval command: an option that takes one value, given twice, is refused (click would keep the last one
    without a word); help as `_format_help` lays it out."""

    def parse_args(self, ctx, args):  # noqa: ANN001, ANN201 (click's signature)
        given = list(args)  # click's parser consumes the list it reads
        rest = super().parse_args(ctx, args)
        _, _, order = self.make_parser(ctx).parse_args(args=given)
        for param, times in Counter(order).items():
            if times > 1 and param.param_type_name == "option" and not (param.multiple or param.count):
                name = param.opts[0]
                listed = f" (several as one comma-separated value: {name} A,B)" if "omma-separated" in (
                    param.help or "") else ""  # fmt: skip
                ctx.fail(f"{name} is given {times} times but takes one value, and only the last would count; pass "
                         f"it once{listed}")  # fmt: skip
        return rest

    def format_help(self, ctx, formatter) -> None:  # noqa: ANN001 (click's signature)
        _format_help(ctx, formatter, super().format_help, super(typer.core.TyperCommand, self).format_help)


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=HELP)


@app.callback()
def _commands() -> None:
    """Evaluate long-context language models: perplexity sweeps, needle retrieval, SCROLLS and the academic suite."""


for _name, _command in (
    ("info", info.info), ("prep-books", prep_books.prep_books), ("ppl-sweep", ppl_sweep.ppl_sweep),
    ("scrolls", scrolls.scrolls), ("academic", academic.academic), ("needle", needle.needle), ("ruler", ruler.ruler),
    ("babilong", babilong.babilong), ("longbench", longbench.longbench), ("longppl", longppl.longppl),
    ("mtbench", mtbench.mtbench), ("mrcr", mrcr.mrcr), ("graphwalks", mrcr.graphwalks), ("report", report.report),
    ("plot", report.plot),
):  # fmt: skip
    app.command(_name, cls=_Command)(_command)


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
