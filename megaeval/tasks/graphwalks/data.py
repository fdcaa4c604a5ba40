"""Graphwalks' records as openai/graphwalks publishes them: `graphwalks_128k_and_shorter.parquet` and
`graphwalks_256k_to_1mil.parquet` (any .parquet/.jsonl files of a --data folder, or one file), each row with `prompt`
(one user turn), `answer_nodes` (the card's table calls it `answer`; either is read), `problem_type` (bfs or parents)
and `prompt_chars`. A record's id is `<file>#<row>`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import fail
from ...files import file_sha256
from ..data import read_rows

FIX = "pass openai/graphwalks' files as published (prompt, answer_nodes, problem_type, prompt_chars)"


@dataclass(frozen=True)
class Walk:
    id: str
    prompt: str
    gold: tuple[str, ...]
    problem_type: str
    prompt_chars: int


def _gold(row: dict[str, Any], where: str) -> tuple[str, ...]:
    nodes = row.get("answer_nodes", row.get("answer"))
    if nodes is None:
        raise fail(f"{where} has no answer_nodes", FIX)
    if hasattr(nodes, "tolist"):
        nodes = nodes.tolist()
    if not isinstance(nodes, list | tuple) or not all(isinstance(n, str) for n in nodes):
        raise fail(f"{where}: answer_nodes is {type(nodes).__name__}, not a list of node names", FIX)
    return tuple(nodes)


def check_walk(row: Any, name: str, i: int) -> Walk:
    where = f"{name} row {i}"
    if not isinstance(row, dict):
        raise fail(f"{where} is a {type(row).__name__}, not a record", FIX)
    prompt, kind, chars = row.get("prompt"), row.get("problem_type"), row.get("prompt_chars")
    if not isinstance(prompt, str) or not prompt:
        raise fail(f"{where}: prompt is missing or not a text", FIX)
    if not isinstance(kind, str) or not kind:
        raise fail(f"{where}: problem_type is missing or not a text", FIX)
    if chars is None:
        chars = len(prompt)
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 0:
        raise fail(f"{where}: prompt_chars is {chars!r:.20}, not a count", FIX)
    return Walk(f"{name}#{i}", prompt, _gold(row, where), kind, chars)


def read_walks(data: str | Path, problem_types: list[str] | None = None,
               limit: int | None = None) -> tuple[list[Walk], dict[str, Any]]:  # fmt: skip
    """The records under --data (those of `problem_types`, the first `limit` of each type), checked; their source."""
    if str(data).startswith("hub:"):
        raise fail(f"--data {data}: megaeval reads Graphwalks' files from a folder, not from the hub",
                   "download them first: huggingface-cli download openai/graphwalks --repo-type dataset --local-dir "
                   "graphwalks, then pass --data graphwalks")  # fmt: skip
    root = Path(data)
    if root.is_file():
        files, base = [root], root.parent
    elif root.is_dir():
        files, base = sorted(p for p in root.iterdir() if p.suffix in (".parquet", ".jsonl")), root
    else:
        raise fail(f"--data {data}: no such file or folder", "pass a folder of openai/graphwalks' files")
    if not files:
        raise fail(f"--data {data} holds no .parquet or .jsonl file", "pass the folder openai/graphwalks' files are in")
    walks: list[Walk] = []
    taken: dict[str, int] = {}
    for path in files:
        name = path.relative_to(base).as_posix()
        for i, row in enumerate(read_rows(path)):
            walk = check_walk(row, name, i)
            if problem_types is not None and walk.problem_type not in problem_types:
                continue
            if limit is not None and taken.get(walk.problem_type, 0) >= limit:
                continue
            taken[walk.problem_type] = taken.get(walk.problem_type, 0) + 1
            walks.append(walk)
    if not walks:
        raise fail(f"--data {data} holds no record of the problem types asked for", "check --problem-types")
    return walks, {"data": str(data), "files": {p.relative_to(base).as_posix(): file_sha256(p) for p in files}}
