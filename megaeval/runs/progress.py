"""One progress bar on stderr (rich) for every command: units done, their rate, elapsed time and ETA."""

from __future__ import annotations

from typing import Any


class ProgressBar:
    """Counts `unit`s (tokens, examples, documents) toward `total`, starting at `completed` when resuming.

    The rate is measured over this process's work only (resumed units are not counted as fast), and
    once the bar is full it shows the average rate rather than rich's decayed one.
    """

    def __init__(self, label: str, unit: str, total: int, completed: int = 0, enabled: bool = True):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.unit = unit
        self._bar = Progress(
            TextColumn(f"{label} {{task.description:>13}}", markup=False), BarColumn(),
            TextColumn(f"{{task.completed:,}}/{{task.total:,}} {unit}"), _rate_column(unit), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled,
        )  # fmt: skip
        self._task = self._bar.add_task("", total=total, completed=completed, start_at=completed)

    def __enter__(self) -> ProgressBar:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)

    def advance(self, amount: int, description: str | None = None) -> None:
        """`amount` more units done; `description` names what is being worked on (a task, a length)."""
        kwargs = {} if description is None else {"description": description}
        self._bar.update(self._task, advance=amount, **kwargs)

    def describe(self, description: str) -> None:
        """Name what is being worked on now."""
        self._bar.update(self._task, description=description)


def _rate_column(unit: str) -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    short = {"tokens": "tok"}.get(unit, unit)

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            elapsed = task.finished_time if task.finished else task.elapsed
            done = task.completed - task.fields.get("start_at", 0)
            rate = task.speed if not task.finished and task.speed else (done / elapsed if elapsed else 0.0)
            return Text(f"{rate:,.1f} {short}/s" if rate < 100 else f"{rate:,.0f} {short}/s")

    return Rate()
