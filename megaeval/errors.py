"""The one exception type that reaches users: a bad input, named with its fix."""


class MegaevalError(Exception):
    """A problem with the user's input; the CLI prints it as one line and exits non-zero."""


def fail(problem: str, fix: str | None = None) -> MegaevalError:
    """Build a MegaevalError whose message names the problem and, when known, the fix."""
    return MegaevalError(problem if fix is None else f"{problem}; {fix}")
