"""How a command line ends: a user's error as one line and exit code 2, Ctrl-C as 130, ranks leaving cleanly."""

from __future__ import annotations

import functools
import os
import sys

import typer

from ..console import error_line, interrupted_line
from ..errors import MegaevalError


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


def exit_process(code: int) -> None:
    """Leave with `code`. A rank under torchrun that succeeded leaves without interpreter teardown (its work is
    written and its groups closed, rank 0 last, by then): gloo's threads can otherwise abort it in destructors. A
    rank that failed leaves normally, after the others have heard of it."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if code == 0 and world.isdigit() and int(world) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
