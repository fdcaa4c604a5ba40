"""Tables for people print every name as it is written: rich's markup never reads a model `mamba[v1]`, a task
`[red]x` or a document id `[/x]` (issue 46, A7)."""

from __future__ import annotations

from megaeval.tables import render_rows, render_table

NAMES = ["mamba[v1]", "mamba[v2]", "[red]x", "[/x]", "[bold]"]


def test_table_cells_headers_and_titles_are_literal():
    text = render_table(["task", *NAMES], [[name, "1", "2", "3", "4", "5"] for name in NAMES], "table",
                        title="scores of [b]models[/b]")  # fmt: skip
    for name in NAMES:
        assert text.count(name) == 2, name  # its header and its row
    assert "scores of [b]models[/b]" in text


def test_boxed_rows_are_literal():
    text = render_rows("info of [red]m", [("path", "/ckpt/[v1]"), ("[/x]", "[bold]y")])
    assert "info of [red]m" in text and "/ckpt/[v1]" in text and "[/x]" in text and "[bold]y" in text
