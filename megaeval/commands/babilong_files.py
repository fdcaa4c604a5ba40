"""`megaeval babilong`'s files besides the report: the official prediction files scored without a model
(--predictions) or written from a run (--write-predictions), and instances made by BABILong's generator
(--prepare-only --write-data), in the layout the sets' files have, with a manifest of what made them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..console import note_line
from ..errors import fail
from ..files import check_outputs, check_writable, file_sha256, write_json_atomic, write_jsonl_atomic, write_output
from ..metrics.babilong import compare_answers
from ..runs.progress import ProgressBar
from ..runs.report import build_report, environment
from ..runs.run import check_run_outputs
from ..tasks.babilong.data import write_instances
from ..tasks.babilong.predictions import held_lengths, prediction_file, read_predictions, write_predictions
from ..tasks.babilong.results import babilong_results
from ..tasks.babilong.spec import length_tokens

MANIFEST = "babilong_data.json"  # beside generated instances: what made them
GENERATOR = {"repository": "booydar/babilong", "commit": "7a6efee29f5cac03c3c410e6799c80fd2ffe3610",
             "code": ["babilong/babilong_utils.py", "data/create_tasks.py"]}  # fmt: skip


def score_predictions(settings: Any, specs: dict[str, dict]) -> dict[str, Any]:
    """--predictions DIR: the official prediction files of every task and length scored by the official rule
    (each file's first --num-samples rows, or all); writes the report (and samples) and returns it. Files of the
    chosen tasks at lengths outside --lengths are named (a note, and `data.left_out` in the report)."""
    if settings.model is not None or settings.model_args:
        raise fail(f"--predictions scores the prediction files in {settings.predictions} without a model, so --model "
                   "would be ignored", "drop --model and --model-args, or drop --predictions")  # fmt: skip
    out = check_run_outputs(settings, [settings.predictions])
    records, sources = [], {}
    for task, spec in specs.items():
        for length in settings.lengths:
            path = prediction_file(settings.predictions, task, length, settings.parts)
            rows, sources[f"{task}/{length}"] = read_predictions(path, spec)
            for i, row in enumerate(rows[: settings.num_samples]):
                correct = compare_answers(row["target"], row["output"], row["question"], spec["labels"])
                records.append({"task": task, "length": length, "id": f"{length}/{i}", "sample": i, **row,
                                "prediction": row["output"], "correct": correct, "score": float(correct)})  # fmt: skip
    results = babilong_results(records, list(specs), settings.lengths)
    model = {"spec": None, "predictions": settings.predictions}
    data = {"predictions": sources, "prompt_name": settings.parts.name}
    left = [n for n in held_lengths(settings.predictions, list(specs), settings.parts) if n not in settings.lengths]
    if left:
        data["left_out"] = {"lengths": left, "why": "outside --lengths"}
        note_line(f"--predictions {settings.predictions} also holds files at {', '.join(left)}, not scored: outside "
                  f"--lengths (pass --lengths {','.join([*settings.lengths, *left])} to score them)")  # fmt: skip
    if settings.samples:
        rows = [{k: v for k, v in r.items() if k != "output"} for r in records]
        data["samples_sha256"] = write_jsonl_atomic(settings.samples, rows)
    report = build_report("babilong", asdict(settings), model, data, results, environment("cpu", "none"))
    write_json_atomic(out, report)
    return report


def write_all(settings: Any, specs: dict[str, dict], records: list[dict[str, Any]], lm: Any) -> list[Path]:
    """--write-predictions DIR: each task and length's answers as the official script writes them (target,
    output, question in instance order; the prompt and generation settings beside them)."""
    pad = getattr(getattr(lm.tokenizer, "tok", None), "pad_token_id", None)
    written = []
    for task, spec in specs.items():
        prompt = {p: spec[p] if getattr(settings.parts, p) else "" for p in ("instruction", "examples", "post_prompt")}
        config = {"prompt": {**prompt, "template": spec["template"], "chat_template": settings.parts.chat_template,
                             "system_prompt": ""},
                  "generate_kwargs": {"max_new_tokens": spec["max_new_tokens"], "max_length": None, "num_beams": 1,
                                      "do_sample": False, "temperature": None, "top_p": None, "top_k": None,
                                      "pad_token_id": pad if pad is not None else lm.tokenizer.eos_id}}  # fmt: skip
        for length in settings.lengths:
            mine = sorted(
                (r for r in records if r["task"] == task and r["length"] == length), key=lambda r: r["sample"]
            )
            rows = [{"target": r["target"], "output": r["prediction"], "question": r["question"]} for r in mine]
            written.append(write_predictions(settings.write_predictions, task, length, settings.parts, rows, config))
    return written


def prepare_babilong(settings: Any, progress: bool = True) -> list[Path]:
    """--prepare-only: every task and length's instances from BABILong's generator, written in the generator's
    layout under --write-data (FOLDER/qaN/<length>.json) with a manifest (babilong_data.json); no model."""
    from ..tasks.babilong.generator import generate, question_positions
    from ..tasks.babilong.spec import load_babilong_task
    from ..tasks.babilong.tokenizer import length_tokenizer
    from ..tasks.data import read_documents, shipped_books

    specs = {name: load_babilong_task(name, settings.include_path) for name in settings.task_names}
    folder = Path(settings.write_data)
    babi = babi_folder(settings.babi)
    files = {t: babi / f"{s['babi_file']}_{settings.babi_split}.txt" for t, s in specs.items()}
    for task, path in files.items():
        if not path.is_file():
            raise fail(f"--babi {settings.babi} has no {path.name} for {task}",
                       "pass the folder of bAbI's tasks (tasks_1-20_v1-2, or its en/ folder)")  # fmt: skip
    check_writable(folder / MANIFEST, "--write-data")
    check_outputs({"--write-data": folder / MANIFEST}, [settings.babi, *settings.background])
    tokenizer = length_tokenizer(settings.length_tokenizer)
    books, sources = read_documents(settings.background or [str(shipped_books())], settings.text_field, "--background")
    written, counts = [], {}
    source = ", ".join(settings.background) or "the shipped books"
    total = len(specs) * sum(length_tokens(n) + 1 for n in settings.lengths)
    with ProgressBar("babilong", "tokens", total, 0, progress) as bar:
        for task, spec in specs.items():
            for length in settings.lengths:
                bar.advance(0, f"{task} {length}")
                positions = question_positions(task, length, settings.babi_split)
                records = generate(files[task], [b.text for b in books], tokenizer, length_tokens(length),
                                   settings.num_samples, settings.seed, spec, settings.clean_up_spaces, positions,
                                   source)  # fmt: skip
                counts.setdefault(task, {})[length] = {"instances": len(records), "questions": "published positions"
                                                       if positions is not None else "file order"}  # fmt: skip
                written.append(write_instances(folder, task, length, records))
                bar.advance(length_tokens(length) + 1)
    manifest = {**generation_facts(settings, files, sources, tokenizer), "sets": counts}
    write_output(folder / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()), "--write-data")
    return written


def babi_folder(babi: str) -> Path:
    """The folder holding bAbI's task files: `babi` itself, or its `en/` folder (the tasks_1-20_v1-2 layout)."""
    root = Path(babi)
    if not root.is_dir():
        raise fail(f"--babi {babi}: no such folder", "pass the folder of bAbI's tasks (tasks_1-20_v1-2)")
    return root / "en" if (root / "en").is_dir() else root


def generation_facts(settings: Any, files: dict[str, Path], sources: list[dict], tokenizer: Any) -> dict[str, Any]:
    """What generated instances are made of and with (the manifest beside them, copied into the reports of runs on
    them)."""
    import nltk
    import transformers

    shipped = not settings.background
    return {
        "kind": "megaeval-babilong-instances", "generator": GENERATOR, "seed": settings.seed,
        "lengths": settings.lengths, "num_samples": settings.num_samples,
        "babi": {t: {"path": str(p), "sha256": file_sha256(p)} for t, p in files.items()},
        "babi_split": settings.babi_split, "background": sources,
        "background_note": "public-domain books (Jane Austen's novels) stand in for PG-19's test books" if shipped
        else None, "length_tokenizer": {"name": settings.length_tokenizer, "class": type(tokenizer).__name__},
        "clean_up_spaces": settings.clean_up_spaces, "nltk": nltk.__version__, "transformers": transformers.__version__,
    }  # fmt: skip


def read_manifest(data: str) -> dict[str, Any] | None:
    """The generator's manifest of a --data folder, if it has one."""
    path = Path(data) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise fail(f"{path} is not valid JSON", "make the instances again with --prepare-only") from None
