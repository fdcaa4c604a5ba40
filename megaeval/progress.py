"""Progress bars on stderr (rich), the same look for every command that counts items."""

from __future__ import annotations

from typing import Any


def item_bar(label: str, unit: str, total: int, completed: int, enabled: bool) -> tuple[Any, Any]:
    """A bar counting `unit`s (examples, documents) with elapsed time and ETA; returns (bar, task id).

    The task's description is shown after the label, so callers can name the current task there.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn(f"{label} {{task.description:>13}}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn(unit), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                   console=Console(stderr=True), disable=not enabled)  # fmt: skip
    return bar, bar.add_task("", total=total, completed=completed)
