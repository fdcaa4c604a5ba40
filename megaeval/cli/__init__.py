"""The `megaeval` command line: parse arguments, call the library, print; no evaluation logic here.

`root` holds the typer app, the commands in help order and `main` (the console script); one module per command
declares that command's own options, builds its settings and calls one function of `megaeval.commands`; `options`
declares once the option blocks several commands share (the model, chat, LongPPL key-token, run and output
options) and `command`, which gives a command the blocks it names; `exits` turns errors into one line and an exit
code.
"""

from .root import app, main

__all__ = ["app", "main"]
