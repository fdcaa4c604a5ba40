"""`megaeval academic`: the short-context suite of Llama 2 / MEGALODON Table 1, as lm-evaluation-harness runs it.

Tasks: MMLU (5-shot), BoolQ, HellaSwag, PIQA, SIQA, WinoGrande, ARC-e, ARC-c (0-shot) and NQ, TriviaQA
(5-shot). Each task file (suites/academic/<task>.yaml) names the harness file every fact comes from. Documents
are processed by `tasks.academic.docs`, prepared by `tasks.academic.prepare`, scored by
`tasks.academic.evaluate` (requests encoded and scored by `scoring.requests`) and aggregated by
`tasks.academic.results`.

Few-shot exemplars: MMLU takes the first dev questions of the same subject; NQ and TriviaQA draw from train with
one random.Random(seed) per task (seed 1234, the harness's default), each document in turn, as the harness does.
`limit` keeps the first documents of each task (of each MMLU subject, as the harness's per-subject tasks do).

Scores are fractions, as the harness reports them. `results.average` is the mean over the tasks run of each
task's headline metric (`results.<task>.metric`, listed in `results.average_of`): acc_norm for HellaSwag, PIQA,
SIQA, ARC-e and ARC-c (the Llama papers choose by likelihood per character of the completion), acc for BoolQ,
WinoGrande and MMLU (MMLU's is the subject-size-weighted mean, i.e. over all questions), exact_match for NQ and
TriviaQA.

BOS (`bos`: auto, always, never): auto follows the model's convention (`scoring.requests.resolve_bos`): a
transformers tokenizer's own default, which is what lm-evaluation-harness feeds such a model, and BOS for
the sentencepiece Llama-style families (MEGALODON, RFA). The effective choice is `settings.bos_effective`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

from ..errors import fail
from ..runs import Run, RunSettings, open_run
from ..scoring.chat import ChatFlags, chat_bos, run_template
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy, resolve_bos
from ..tasks.academic.chat import chat_docs
from ..tasks.academic.evaluate import FewshotCache, evaluate_choice_docs, evaluate_generations
from ..tasks.academic.prepare import prepare_academic_task
from ..tasks.academic.results import academic_results
from ..tasks.data import data_folders
from ..tasks.specs import parse_tasks

DEFAULT_SEED = 1234  # lm-evaluation-harness's fewshot_random_seed (lm_eval/defaults.py DEFAULT_OTHER_SEED)


@dataclass(kw_only=True)
class AcademicSettings(ChatFlags, RunSettings):
    """Every flag of `megaeval academic`, defaults included (shots None: each task's own default)."""

    tasks: str = "all"
    shots: int | None = None
    limit: int | None = None
    data_dir: str | None = None
    seed: int = DEFAULT_SEED
    bos: str = "auto"  # auto, always or never (True / False are taken as always / never)
    batch_size: str | int = "auto"  # documents answered together (generation tasks); results do not depend on it
    out: str = "reports/academic.json"
    samples: str | None = None

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size")  # never changes a number

    def __post_init__(self) -> None:
        super().__post_init__()
        self.bos = bos_policy(self.bos)
        self.batch_size = parse_batch_size(self.batch_size)
        self.check_chat()


def run_academic(settings: AcademicSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Evaluate the academic tasks; write and return the report (and the samples file when asked)."""
    if settings.limit is not None and settings.limit < 1:
        raise fail("--limit must be at least 1")
    if settings.shots is not None and settings.shots < 0:
        raise fail("--shots must be >= 0")
    tasks = parse_tasks(settings.tasks, "academic")
    data: dict[str, Any] = {}
    prepared = {task: prepare_academic_task(settings, task, data) for task in tasks}  # bad data fails before the model

    effective: dict[str, Any] = {}

    def check(lm: Any) -> dict[str, Any]:  # a tokenizer without BOS (or a template) fails now, not at a document
        if not settings.chat.on and not settings.system_instruction:
            effective["bos_effective"] = resolve_bos(lm, settings.bos)
            return effective  # a resume must read the same tokens
        template = run_template(lm, settings.chat)
        for task, p in prepared.items():
            prepared[task] = replace(p, docs=chat_docs(p, template, settings.chat))
        first = next(iter(prepared.values())).docs[0].contexts[0]
        effective.update(bos_effective=chat_bos(lm, settings.bos, first), chat_template_effective=template and
                         template.facts())  # fmt: skip
        return effective  # the template's checksum identifies a resumed run too

    with open_run("academic", settings, reads=data_folders(settings.data_dir), fingerprint={"data": data},
                  check=check, progress=progress, on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, prepared, data, effective)


def _prompt_of_first(settings: AcademicSettings, task: Any) -> dict[str, str]:
    """With a chat template or a system instruction: the rendered prompt of the task's first document."""
    return {"first_prompt": task.docs[0].contexts[0]} if settings.chat.on or settings.system_instruction else {}


def _evaluate(run: Run, settings: AcademicSettings, prepared: dict, data: dict, effective: dict) -> dict | None:
    cache = FewshotCache()
    bos = effective["bos_effective"]

    def compute_batch(batch: list[tuple[str, int]]) -> list[dict[str, Any]]:
        """Documents' records in order, a task's documents together: generation documents decoded `size` at a time,
        multiple-choice documents sharing calls for their choices."""
        answers: dict[int, dict[str, Any]] = {}
        for task in dict.fromkeys(t for t, _ in batch):
            p = prepared[task]
            mine = [j for j, (t, _) in enumerate(batch) if t == task]
            if p.spec["output"] == "generate_until":
                docs = [p.docs[batch[j][1]] for j in mine]
                answers.update(zip(mine, evaluate_generations(run.answerer, p, docs, bos, size), strict=True))
                continue
            ks = [batch[j][1] for j in mine]
            firsts = [k == 0 or p.docs[k - 1].fewshot != p.docs[k].fewshot for k in ks]  # one process reads it here
            scored = evaluate_choice_docs(run.lm, p, [p.docs[k] for k in ks], bos, cache, firsts)
            answers.update(zip(mine, scored, strict=True))
        records = []
        for j, (task, k) in enumerate(batch):
            doc = prepared[task].docs[k]
            subject = {"subject": doc.group} if doc.group is not None else {}
            records.append({"task": task, "doc_id": doc.doc_id, **subject, **answers[j],
                            "exemplar_ids": prepared[task].exemplar_ids[k]})  # fmt: skip
        return records

    choices = [t for t, p in prepared.items() if p.spec["output"] != "generate_until"]
    if choices and not run.answerer.scores_choices:
        raise fail(
            f"{', '.join(choices)} score their choices by log-likelihood, which needs the model in this process "
            f"(megaeval does not ask a server for prompt log-probabilities; {run.lm.spec} is served)",
            "run the model in-process (--model DIR), or only generation tasks (--tasks nq_open,triviaqa)",
        )
    size = run.answerer.rows(settings.batch_size, run.lm.max_context or 4096)
    units = [(task, k) for task, p in prepared.items() for k in range(len(p.docs))]
    records = run.map(units, key=lambda u: [u[0], prepared[u[0]].docs[u[1]].doc_id],
                      compute=lambda u: compute_batch([u])[0], unit_name="documents", describe=lambda u: u[0],
                      contiguous=True, batch=size, compute_batch=compute_batch)  # fmt: skip
    if records is None:
        return None  # not rank 0
    results = academic_results(prepared, records)
    per_task = {t: {**p.chosen, "bos": bos, **_prompt_of_first(settings, p)} for t, p in prepared.items()}
    recorded = {**asdict(settings), **effective, "batch_size_effective": size, "per_task": per_task}
    return run.finish(recorded, data, results, samples=records)
