"""`megaeval academic`: the short-context suite of Llama 2 / MEGALODON Table 1, as lm-evaluation-harness runs it.

Tasks: MMLU (5-shot), BoolQ, HellaSwag, PIQA, SIQA, WinoGrande, ARC-e, ARC-c (0-shot) and NQ, TriviaQA
(5-shot). Each task file (suites/academic/<task>.yaml) names the harness file every fact comes from; the
documents are processed and rendered by `megaeval.academic_tasks`.

Multiple-choice requests are encoded as the harness encodes them (lm_eval/api/model.py `_encode_pair`):
trailing spaces of the context move to the continuation, context tokens = encode(context), continuation
tokens = encode(context + continuation)[len(context tokens):]. The model reads [BOS] + context tokens once
(`bos=False` drops BOS; the harness adds it when the tokenizer does by default, as Llama's does) and every
choice continues from a clone of that state; a choice scores the sum of its tokens' log-probabilities.
WinoGrande scores the shared continuation after each option's own context. NQ and TriviaQA decode greedily
until "\\n", "." or "," (at most 256 tokens), strip the answer and score exact match against every reference.
Models with a fixed context lose context tokens from the left, as the harness truncates.

Few-shot exemplars: MMLU takes the first dev questions of the same subject; NQ and TriviaQA draw from train with
one random.Random(seed) per task (seed 1234, the harness's default), each document in turn, as the harness does.
`limit` keeps the first documents of each task (of each MMLU subject, as the harness's per-subject tasks do).

Scores are fractions, as the harness reports them. `results.average` is the mean over the tasks run of each
task's headline metric (`results.<task>.metric`, listed in `results.average_of`): acc_norm for HellaSwag, PIQA,
SIQA, ARC-e and ARC-c (the Llama papers choose by likelihood per character of the completion), acc for BoolQ,
WinoGrande and MMLU (MMLU's is the subject-size-weighted mean, i.e. over all questions), exact_match for NQ and
TriviaQA.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .academic_tasks import Doc, TaskDocs, draw_exemplars
from .data import load_split
from .errors import fail
from .files import check_outputs, check_writable, write_json_atomic, write_jsonl_atomic
from .generate import greedy_generate, prefill
from .loglik import Prefix, continuation_logprobs, forward_tokens, read_prefix, starts_with
from .metrics.academic import choice_predictions, exact_match, group_scores, mean, mean_stderr
from .models import StreamingLM, load_model, model_options, parse_spec
from .progress import item_bar
from .progress_log import ProgressLog
from .report import build_report, environment, model_facts, numeric_settings
from .tasks import load_spec, parse_tasks

DEFAULT_SEED = 1234  # lm-evaluation-harness's fewshot_random_seed (lm_eval/defaults.py DEFAULT_OTHER_SEED)


@dataclass
class AcademicSettings:
    """Every flag of `megaeval academic`, defaults included (shots None: each task's own default)."""

    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    tasks: str = "all"
    shots: int | None = None
    limit: int | None = None
    data_dir: str | None = None
    seed: int = DEFAULT_SEED
    bos: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    kernels: str | None = None
    out: str = "reports/academic.json"
    samples: str | None = None
    resume: bool = False


@dataclass
class PreparedTask:
    """A task's documents, ready to score, with its effective settings."""

    spec: dict[str, Any]
    chosen: dict[str, Any]
    docs: list[Doc]
    exemplar_ids: list[list[int]]


def task_settings(settings: AcademicSettings, spec: dict[str, Any]) -> dict[str, Any]:
    """The effective per-task choices, written into the report."""
    chosen = {
        "hub": spec["hub"],
        "split": spec["split"],
        "shot_split": spec["shot_split"],
        "shots": spec["shots"] if settings.shots is None else settings.shots,
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


def prepare_task(settings: AcademicSettings, task: str, data: dict[str, Any]) -> PreparedTask:
    """Load, process and render one task's documents and their exemplars (before any model is loaded)."""
    spec = load_spec("academic", task)
    chosen = task_settings(settings, spec)
    td = TaskDocs(spec)
    rows, data[task] = load_split(task, spec["split"], settings.data_dir, spec["hub"])
    docs = [(i, td.process(row, f"{spec['split']} row {i}")) for i, row in enumerate(rows)]
    group_by = spec.get("group_by")
    if group_by:
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
        pool = [td.process(row, f"{spec['shot_split']} row {i}") for i, row in enumerate(shot_rows)]
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
    return PreparedTask(spec, chosen, built, exemplar_ids)


def encode_pair(lm: StreamingLM, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as the harness splits them (trailing context spaces move right)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = lm.tokenizer.encode(context + continuation)
    context_ids = lm.tokenizer.encode(context)
    return context_ids, whole[len(context_ids) :]


def _bos(lm: StreamingLM, bos: bool) -> list[int]:
    if not bos:
        return []
    if lm.tokenizer.bos_id is None or lm.tokenizer.bos_id < 0:
        raise fail("the model's tokenizer has no BOS token", "pass bos=False (--no-bos)")
    return [lm.tokenizer.bos_id]


class FewshotCache:
    """BOS + the current few-shot block, read once for every document that starts with it
    (all of an MMLU subject's questions share their 5 exemplars)."""

    def __init__(self) -> None:
        self.key: tuple[tuple[int, ...], str] | None = None
        self.prefix: Prefix | None = None

    def get(self, lm: StreamingLM, bos: list[int], text: str) -> tuple[Prefix | None, int]:
        """The prefix for `text` and the tokens read to build it now (0 when cached)."""
        if not text:
            return None, 0
        if self.key != (tuple(bos), text):
            self.key, self.prefix = (tuple(bos), text), read_prefix(lm, bos + lm.tokenizer.encode(text))
            return self.prefix, len(self.prefix.ids)
        return self.prefix, 0


def score_requests(
    lm: StreamingLM, context: list[int], continuations: list[list[int]], fewshot: Prefix | None = None
) -> tuple[list[float], list[bool], int, int, int]:
    """(log-likelihoods, is-greedy flags, forward tokens reused, from scratch, context tokens dropped) of continuations.

    The context is read once for all continuations, and a few-shot prefix it starts with is not read again. A
    fixed-context model keeps, as the harness does, the last max_context + 1 tokens of each context + continuation,
    scoring that choice on its own.
    """
    if not context:
        raise fail("an empty context with bos=False cannot be scored", "keep BOS on")
    scores: list[tuple[float, bool]] = [(0.0, True)] * len(continuations)  # an empty continuation scores 0
    todo = [k for k, c in enumerate(continuations) if c]
    conts = [continuations[k] for k in todo]
    limit = lm.max_context
    if limit is None or len(context) + max((len(c) for c in conts), default=1) - 1 <= limit:
        for k, s in zip(todo, continuation_logprobs(lm, context, conts, fewshot) if conts else [], strict=True):
            scores[k] = (s.logprob, s.is_greedy)
        reused, scratch = forward_tokens(context, conts) if conts else (0, 0)
        if conts and starts_with(context, fewshot):
            reused -= len(fewshot.ids)
        return [s[0] for s in scores], [s[1] for s in scores], reused, scratch, 0
    reused = scratch = dropped = 0
    for k, cont in zip(todo, conts, strict=True):
        drop = max(0, len(context) + len(cont) - 1 - limit)
        if drop >= len(context):
            raise fail(f"a continuation of {len(cont)} tokens does not fit max_context {limit}")
        (s,) = continuation_logprobs(lm, context[drop:], [cont])
        scores[k] = (s.logprob, s.is_greedy)
        reused += len(context) - drop + len(cont) - 1
        dropped = max(dropped, drop)
    return [s[0] for s in scores], [s[1] for s in scores], reused, reused, dropped


def evaluate_choices(
    lm: StreamingLM, prepared: PreparedTask, doc: Doc, bos: bool, cache: FewshotCache | None = None
) -> dict[str, Any]:
    """Score a multiple-choice (or multiple-input) document; its samples record."""
    prefix = _bos(lm, bos)
    fewshot, prefix_read = (cache or FewshotCache()).get(lm, prefix, doc.fewshot)
    if prepared.spec["output"] == "multiple_input":
        lls, greedy, reused, scratch, dropped, context_tokens = [], [], prefix_read, 0, 0, []
        for context in doc.contexts:
            ctx, cont = encode_pair(lm, context, doc.continuations[0])
            ll, g, r, s, d = score_requests(lm, prefix + ctx, [cont], fewshot)
            lls += ll
            greedy += g
            reused, scratch, dropped = reused + r, scratch + s, max(dropped, d)
            context_tokens.append(len(prefix + ctx))
    else:
        pairs = [encode_pair(lm, doc.contexts[0], c) for c in doc.continuations]
        context = prefix + pairs[0][0]
        lls, greedy, reused, scratch, dropped = score_requests(lm, context, [cont for _, cont in pairs], fewshot)
        reused += prefix_read
        context_tokens = len(context)
    pred, pred_norm = choice_predictions(lls, doc.choices)
    metrics = prepared.chosen["metrics"]
    return {
        "target": doc.gold, "loglikelihoods": lls, "is_greedy": greedy, "prediction": pred,
        "acc": float(pred == doc.gold), "acc_norm": float(pred_norm == doc.gold) if "acc_norm" in metrics else None,
        "context_tokens": context_tokens, "forward_tokens": reused, "forward_tokens_from_scratch": scratch,
        "truncated_tokens": dropped,
    }  # fmt: skip


def evaluate_generation(lm: StreamingLM, prepared: PreparedTask, doc: Doc, bos: bool) -> dict[str, Any]:
    """Greedy answer of a generation document and its exact match; its samples record."""
    chosen = prepared.chosen
    ids = _bos(lm, bos) + lm.tokenizer.encode(doc.contexts[0])
    dropped = 0
    if lm.max_context is not None:  # the harness keeps the last max_length - max_gen_toks context tokens
        budget = lm.max_context - chosen["max_new_tokens"]
        if budget < 1:
            raise fail(f"max_context {lm.max_context} leaves no room for the prompt and {chosen['max_new_tokens']} "
                       "new tokens")  # fmt: skip
        dropped = max(0, len(ids) - budget)
        ids = ids[dropped:]
    logits, state = prefill(lm, ids, lm.init_state(1))
    gen = greedy_generate(lm, logits, state, chosen["max_new_tokens"], chosen["stop"])
    prediction = gen.text.strip()  # the remove_whitespace filter
    fed = len(ids) + len(gen.tokens) - (gen.stop_reason != "eos" and len(gen.tokens) > 0)
    return {
        "prediction": prediction, "references": doc.references,
        "exact_match": exact_match(prediction, doc.references, **chosen["exact_match"]),
        "stop_reason": gen.stop_reason, "prompt_tokens": len(ids), "generated_tokens": len(gen.tokens),
        "forward_tokens": fed, "forward_tokens_from_scratch": fed, "truncated_tokens": dropped,
    }  # fmt: skip


def run_academic(
    settings: AcademicSettings, progress: bool = True, on_document: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Evaluate the academic tasks; write and return the report (and the samples file when asked)."""
    if settings.limit is not None and settings.limit < 1:
        raise fail("--limit must be at least 1")
    if settings.shots is not None and settings.shots < 0:
        raise fail("--shots must be >= 0")
    tasks = parse_tasks(settings.tasks, "academic")
    data: dict[str, Any] = {}
    prepared = {task: prepare_task(settings, task, data) for task in tasks}  # bad data fails before the model loads
    out = Path(settings.out)
    reads = [d["path"] for d in data.values() if "path" in d] + [parse_spec(settings.model)[1]]
    resume_file = out.with_name(out.name + ".partial.jsonl")
    outputs = {"--out": out, "--samples": settings.samples, "the resume file": resume_file}
    check_outputs(outputs, reads)
    check_writable(out)
    if settings.samples:
        check_writable(settings.samples, "--samples")

    options = model_options(settings.model, settings.model_args, kernels=settings.kernels)
    lm = load_model(settings.model, device=settings.device, dtype=settings.dtype, **options)
    _bos(lm, settings.bos)
    facts = model_facts(lm, settings.model, options)
    fingerprint = {"settings": numeric_settings(settings), "weights_sha256": facts["weights_sha256"], "data": data}
    log = ProgressLog(out.with_name(out.name + ".partial.jsonl"), fingerprint, settings.resume)
    bar, bar_task = item_bar("academic", "documents", sum(len(p.docs) for p in prepared.values()), len(log.done),
                             progress)  # fmt: skip
    cache = FewshotCache()
    with bar:
        for task, p in prepared.items():
            bar.update(bar_task, description=task)
            generation = p.spec["output"] == "generate_until"
            for doc, exemplars in zip(p.docs, p.exemplar_ids, strict=True):
                if (task, doc.doc_id) in log.done:
                    continue
                record = {"task": task, "id": doc.doc_id, "doc_id": doc.doc_id}
                if doc.group is not None:
                    record["subject"] = doc.group
                if generation:
                    record.update(evaluate_generation(lm, p, doc, settings.bos))
                else:
                    record.update(evaluate_choices(lm, p, doc, settings.bos, cache))
                record["exemplar_ids"] = exemplars
                log.add(record)
                bar.advance(bar_task, 1)
                if on_document is not None:
                    on_document(len(log.records))

    results = academic_results(prepared, log.records)
    recorded = {**asdict(settings), "per_task": {t: p.chosen for t, p in prepared.items()}}
    env = environment(lm.device, lm.dtype)
    report = build_report("academic", settings=recorded, model=facts, data=data, results=results, env=env)
    if settings.samples:
        write_jsonl_atomic(settings.samples, [{k: v for k, v in r.items() if k != "id"} for r in log.records])
    write_json_atomic(out, report)
    log.finish()
    return report


def _with_stderr(name: str, values: list[float]) -> dict[str, float | None]:
    return {name: mean(values), f"{name}_stderr": mean_stderr(values)}


def task_results(prepared: PreparedTask, records: list[dict]) -> dict[str, Any]:
    """One task's scores from its samples records."""
    spec, chosen = prepared.spec, prepared.chosen
    result: dict[str, Any] = {"metric": chosen["headline"], "shots": chosen["shots"]}
    if spec.get("group_by"):
        by_group: dict[str, list[float]] = defaultdict(list)
        for r in records:
            by_group[r["subject"]].append(r["acc"])
        pooled = group_scores(by_group)
        result.update(acc=pooled["weighted"], acc_stderr=pooled["stderr"], acc_macro=pooled["macro"])
        result["subjects"] = {s: {**_with_stderr("acc", v), "n": len(v), "category": spec["subjects"][s]}
                              for s, v in sorted(by_group.items())}  # fmt: skip
        by_category: dict[str, dict[str, list[float]]] = defaultdict(dict)
        for s, v in by_group.items():
            by_category[spec["subjects"][s]][s] = v
        result["categories"] = {}
        for category, groups in sorted(by_category.items()):
            scores = group_scores(groups)
            result["categories"][category] = {"acc": scores["weighted"], "acc_stderr": scores["stderr"],
                                              "acc_macro": scores["macro"], "n": scores["n"]}  # fmt: skip
    else:
        for metric in chosen["metrics"]:
            result.update(_with_stderr(metric, [r[metric] for r in records]))
    result["n"] = len(records)
    reused = sum(r["forward_tokens"] for r in records)
    scratch = sum(r["forward_tokens_from_scratch"] for r in records)
    result.update(forward_tokens=reused, forward_tokens_from_scratch=scratch,
                  forward_tokens_saved=1 - reused / scratch if scratch else 0.0,
                  truncated_tokens=sum(r["truncated_tokens"] for r in records),
                  documents_truncated=sum(1 for r in records if r["truncated_tokens"]))  # fmt: skip
    if spec["output"] == "generate_until":
        result["stop_reasons"] = dict(Counter(r["stop_reason"] for r in records))
        result["mean_generated_tokens"] = mean([r["generated_tokens"] for r in records])
    return result


def academic_results(prepared: dict[str, PreparedTask], records: list[dict]) -> dict[str, Any]:
    """Per-task results and `average`: the mean over tasks of each task's headline metric."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    results: dict[str, Any] = {}
    for task, p in prepared.items():
        if by_task[task]:
            results[task] = task_results(p, by_task[task])
    headlines = {task: r[r["metric"]] for task, r in results.items()}
    results["average"] = mean(list(headlines.values())) if headlines else None
    results["average_of"] = {task: results[task]["metric"] for task in headlines}
    return results
