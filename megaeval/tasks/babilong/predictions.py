"""BABILong's prediction files: `{task}_{length}_{prompt_name}.csv` (columns target, output, question, after pandas'
index) beside `{task}_{length}_{prompt_name}.json` (the prompt and generation settings), as
scripts/run_model_on_babilong.py writes them and babilong/collect_results.py reads them (7a6efee): read with
pandas' defaults, so an empty cell, `None`, `NA` or `nan` is an empty answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import MegaevalError, fail
from ...files import file_sha256, write_output
from .data import check_target
from .prompts import PARTS, PromptParts
from .spec import length_tokens, parse_lengths

COLUMNS = ("target", "output", "question")


def run_config(name: str) -> dict[str, bool]:
    """A prompt name's flags (collect_results' `parse_run_cfg`): `instruction_yes_examples_no...` -> {instruction:
    True, examples: False, ...}."""
    flags, key = {}, []
    for part in name.split("_"):
        if part in ("yes", "no"):
            flags["_".join(key)] = part == "yes"
            key = []
        else:
            key.append(part)
    return flags


def matches(name: str, parts: PromptParts) -> bool:
    """Whether a prediction file's prompt name is the run `parts` describes (flags it leaves out do not count; a
    system prompt never matches: megaeval's runs have none)."""
    flags = run_config(name)
    wanted = {**{p: getattr(parts, p) for p in PARTS}, "chat_template": parts.chat_template, "system_prompt": False}
    return bool(flags) and all(wanted.get(k) == v for k, v in flags.items())


def prediction_file(folder: str | Path, task: str, length: str, parts: PromptParts) -> Path:
    """The one prediction file of `task` at `length` in `folder` made with the prompt `parts` describes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise fail(f"--predictions {folder}: no such folder", "pass the folder of one model's prediction files")
    found = [p for p in sorted(folder.glob(f"{task}_{length}_*.csv")) if matches(p.stem.split("_", 2)[2], parts)]
    if len(found) == 1:
        return found[0]
    names = sorted({p.stem.split("_", 2)[2] for p in folder.glob("qa*_*_*.csv")})
    if not found:
        raise fail(f"--predictions {folder} holds no {task}_{length}_{parts.name}.csv (its prompt names: "
                   f"{', '.join(names) or 'none'})", "ask for the tasks, lengths and --no-instruction/--no-examples/"
                   "--no-post-prompt/--chat-template the files were made with")  # fmt: skip
    raise fail(f"--predictions {folder} holds {len(found)} files for {task} at {length} with that prompt: "
               f"{', '.join(p.name for p in found)}", "keep one of them in the folder")  # fmt: skip


def held_lengths(folder: str | Path, tasks: list[str], parts: PromptParts) -> list[str]:
    """The lengths at which `folder` holds a prediction file of one of `tasks` made with the prompt `parts`
    describes, shortest first."""
    found = set()
    for path in Path(folder).glob("qa*_*_*.csv"):
        task, length, name = path.stem.split("_", 2)
        if task in tasks and matches(name, parts):
            try:
                found.update(parse_lengths(length))
            except MegaevalError:  # not a length name: no file of a set
                continue
    return sorted(found, key=length_tokens)


def read_predictions(path: Path, spec: dict[str, Any] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A prediction file's rows ({target, output, question}, empty cells as "") and its source (path, sha256); a
    file without rows is refused, and with `spec` each row's target and question are checked as an instance's
    are."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except Exception as e:  # pandas' parser errors, an empty file
        raise fail(f"{path} is not a readable CSV file ({' '.join(str(e).split())[:120]})",
                   "pass BABILong's prediction files as written") from None  # fmt: skip
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise fail(f"{path} has no `{missing[0]}` column (it has {', '.join(map(str, frame.columns))})",
                   "pass BABILong's prediction files (columns target, output, question)")  # fmt: skip
    rows = [{c: "" if pd.isna(v) else str(v) for c, v in zip(COLUMNS, values, strict=True)}
            for values in frame[list(COLUMNS)].itertuples(index=False)]  # fmt: skip
    if not rows:
        raise fail(f"{path} holds no predictions (only its header)",
                   "remove the file, or pass --lengths and --tasks without it")  # fmt: skip
    for number, row in enumerate(rows, 1):
        if spec is not None:
            check_target(row["target"], row["question"], spec, f"{path} row {number}")
    return rows, {"path": str(path), "sha256": file_sha256(path)}


def write_predictions(folder: str | Path, task: str, length: str, parts: PromptParts, rows: list[dict[str, str]],
                      config: dict[str, Any]) -> Path:  # fmt: skip
    """One task and length's answers as the official script leaves them: the CSV (pandas' to_csv, its index first)
    and the JSON of prompt and generation settings (indent 4), both atomically."""
    import pandas as pd

    stem = Path(folder) / f"{task}_{length}_{parts.name}"
    frame = pd.DataFrame({c: [r[c] for r in rows] for c in COLUMNS})
    csv_text = frame.to_csv()
    write_output(stem.with_suffix(".csv"), lambda f: f.write(csv_text.encode("utf-8")), "--write-predictions")
    cfg_text = json.dumps(config, indent=4)
    write_output(stem.with_suffix(".json"), lambda f: f.write(cfg_text.encode("utf-8")), "--write-predictions")
    return stem.with_suffix(".csv")
