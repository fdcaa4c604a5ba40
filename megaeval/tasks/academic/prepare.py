"""Academic tasks prepared before any model loads: documents read, processed, limited, with their exemplars."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ...errors import fail
from ..data import load_split
from ..specs import data_choices, load_spec
from .docs import Doc, TaskDocs, draw_exemplars


@dataclass
class AcademicTask:
    """An academic task prepared before any model loads: its documents, ready to score, with its choices."""

    spec: dict[str, Any]
    chosen: dict[str, Any]
    docs: list[Doc]
    exemplar_ids: list[list[int]]


def academic_task_choices(settings: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The effective choices of one academic task (`settings.per_task.<task>` in the report): the task file's
    defaults unless a flag overrides them."""
    chosen = {
        **data_choices(spec, settings.shots),
        "sampler": spec["sampler"],
        "seed": settings.seed,
        "description": spec.get("description") or "",
        "target_delimiter": spec.get("target_delimiter", " "),
        "fewshot_delimiter": spec.get("fewshot_delimiter", "\n\n"),
        "metrics": spec["metrics"],
        "headline": spec["headline"],
    }
    if spec["output"] == "generate_until":
        chosen.update(stop=spec["stop"], max_new_tokens=spec["max_new_tokens"], exact_match=spec["exact_match"])
    return chosen


def _limited(docs: list[tuple[int, dict]], limit: int | None, group_by: str | None) -> list[tuple[int, dict]]:
    """The first `limit` documents (per group, as the harness limits each MMLU subject task)."""
    if limit is None:
        return docs
    if group_by is None:
        return docs[:limit]
    seen: Counter = Counter()
    kept = []
    for doc_id, doc in docs:
        seen[doc[group_by]] += 1
        if seen[doc[group_by]] <= limit:
            kept.append((doc_id, doc))
    return kept


def _check_groups(task: str, split: str, docs: list[dict], group_by: str) -> None:
    """Every document names its group (MMLU: its subject), which picks its exemplars and its score's row."""
    for i, doc in enumerate(docs):
        if not isinstance(doc.get(group_by), str):
            raise fail(f"{task}: {split} row {i} has no {group_by!r} (got {doc.get(group_by)!r:.40})",
                       f"give every row its {group_by}, as the {task} data on the hub has")  # fmt: skip


def prepare_academic_task(settings: Any, task: str, data: dict[str, Any]) -> AcademicTask:
    """Load, process and render one task's documents and their exemplars (before any model is loaded)."""
    spec = load_spec("academic", task)
    chosen = academic_task_choices(settings, spec)
    td = TaskDocs(spec)
    rows, data[task] = load_split(task, spec["split"], settings.data_dir, spec["hub"])
    docs = [(i, td.process(row, f"{spec['split']} row {i}", data[task].get("path"))) for i, row in enumerate(rows)]
    group_by = spec.get("group_by")
    if group_by:
        _check_groups(task, spec["split"], [doc for _, doc in docs], group_by)
        unknown = sorted({str(doc[group_by]) for _, doc in docs} - set(spec["subjects"]))
        if unknown:
            raise fail(f"{task}: unknown {group_by} {unknown[0]!r} in the {spec['split']} data",
                       f"use the {len(spec['subjects'])} subjects of {spec['hub']['name']}")  # fmt: skip
    docs = _limited(docs, settings.limit, group_by)
    if not docs:
        raise fail(f"{task}: the {spec['split']} split is empty")
    pool: list[dict] = []
    if chosen["shots"]:
        shot_rows, data[f"{task}:shots"] = load_split(task, spec["shot_split"], settings.data_dir, spec["hub"])
        shot_file = data[f"{task}:shots"].get("path")
        pool = [td.process(row, f"{spec['shot_split']} row {i}", shot_file) for i, row in enumerate(shot_rows)]
        if group_by:
            _check_groups(task, spec["shot_split"], pool, group_by)
    exemplar_ids: list[list[int]] = [[] for _ in docs]
    if group_by:  # exemplars come from the same group (MMLU: the subject's dev questions, in order)
        for group in dict.fromkeys(doc[group_by] for _, doc in docs):
            members = [k for k, (_, doc) in enumerate(docs) if doc[group_by] == group]
            in_pool = [i for i, ex in enumerate(pool) if ex[group_by] == group]
            group_spec = {**spec, "shot_split": f"{spec['shot_split']} ({group})"}
            members_docs, group_pool = [docs[k][1] for k in members], [pool[i] for i in in_pool]
            drawn = draw_exemplars(group_spec, members_docs, group_pool, chosen["shots"], settings.seed)
            for k, picks in zip(members, drawn, strict=True):
                exemplar_ids[k] = [in_pool[i] for i in picks]
    else:
        exemplar_ids = draw_exemplars(spec, [doc for _, doc in docs], pool, chosen["shots"], settings.seed)
    built = [
        td.build(doc_id, doc, [pool[i] for i in ids]) for (doc_id, doc), ids in zip(docs, exemplar_ids, strict=True)
    ]
    return AcademicTask(spec, chosen, built, exemplar_ids)
