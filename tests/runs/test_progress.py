"""The one progress bar: its rate counts only this process's work and stays meaningful once the bar is full."""

from __future__ import annotations

import time

from megaeval.runs.progress import ProgressBar


def rate_text(bar: ProgressBar) -> str:
    task = bar._bar.tasks[0]
    rate_column = bar._bar.columns[3]
    return rate_column.render(task).plain


def test_a_finished_bar_shows_the_average_rate_not_zero():
    with ProgressBar("ppl-sweep", "tokens", total=2000, completed=0, enabled=False) as bar:
        bar.advance(1000)
        time.sleep(0.05)
        bar.advance(1000)
        time.sleep(0.05)
    text = rate_text(bar)
    assert text.endswith("tok/s")
    rate = float(text.split()[0].replace(",", ""))
    # the bar filled ~0.05 s after it started: about 40,000 tok/s, never rich's decayed "0 tok/s"
    assert 2000 / 0.5 < rate <= 2000 / 0.05 * 1.05


def test_resumed_units_do_not_count_as_fast_work():
    with ProgressBar("academic", "documents", total=100, completed=90, enabled=False) as bar:
        time.sleep(0.1)
        bar.advance(10)
    rate = float(rate_text(bar).split()[0].replace(",", ""))
    assert rate < 10 / 0.1 * 1.5  # 10 documents done here, not 100
