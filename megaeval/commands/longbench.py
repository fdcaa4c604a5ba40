"""`megaeval longbench`: LongBench v1 / LongBench-E (Bai et al., ACL 2024) and LongBench v2 (Bai et al., 2024) as
THUDM/LongBench runs and scores them (2e00731).

v1 (`--version 1`): every record of every task is one unit: the task's prompt (`suites/longbench/<task>.yaml`)
filled with the record, cut in the middle as pred.py cuts it when it passes the run's limit
(`tasks.longbench.evaluate`), rendered with --chat-template except for the six tasks the official keeps raw,
answered greedily with the task's budget (samsum also stops at a newline token, never as its first token), and
scored by the task's metric (`metrics.longbench`). Results: eval.py's per-task scores, the leaderboard's categories,
with --e LongBench-E's 0-4k / 4-8k / 8k+ buckets.

v2 (`--version 2`): every item is one unit. `--protocol official`: the 0-shot prompt (`--cot`: reasoning of 1,024
tokens, then the answer prompt holding it; `--no-context`: the question alone), cut in the middle at the run's
limit (the official passes 120,000), as one user turn of --chat-template, sampled at --temperature 0.1 (each query
seeded from --seed and the item's _id; 0: greedy) with 128 new tokens, the letter extracted by the official two
regular expressions. An item whose output is empty is left out of the figures, as the official script writes no line
for it (the report counts them). `--protocol loglik`: lm-evaluation-harness's `longbench2` form (the letters scored
by log-likelihood after "Answer:"), for base models. Results: result.py's overall, easy, hard, short, medium, long.

`--predictions` scores the official prediction files without a model (`commands.longbench_files`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ..errors import fail
from ..metrics.longbench import extract_answer, score_prediction
from ..models.base import StreamingLM
from ..runs import Run, RunSettings, open_run
from ..runs.answers import add_measured, answer_measured, without_measurements
from ..runs.cost import announce_cost as cost_line
from ..runs.memory import PeakMemory
from ..runs.samples import prompt_ends
from ..runs.settings import ignored_flag, shared_modes
from ..scoring.answering import Query, Rule, generation_facts
from ..scoring.chat import BASE, ChatFlags, conversation, render_turns, run_template
from ..scoring.decoding import GREEDY, Decoding, check_temperature
from ..scoring.generate import parse_batch_size
from ..scoring.requests import bos_policy, bos_prefix, encode_pair, prompt_bos, prompt_encoder, score_requests
from ..tasks.longbench.data import HUB, present_tasks, read_v1, read_v2
from ..tasks.longbench.evaluate import fit_prompt, item_seed, newline_id, token_estimates
from ..tasks.longbench.prompts import truncate_v1, truncate_v2, v1_prompt, v2_prompt
from ..tasks.longbench.results import v1_results, v2_results
from ..tasks.longbench.spec import load_longbench_task, v2_templates
from ..tasks.specs import parse_tasks, spec_sha256

PROTOCOLS = ("official", "loglik")
V2_BUDGET, V2_COT_BUDGET = 128, 1024  # pred.py's max_new_tokens: the answer, the reasoning
LETTERS = ("A", "B", "C", "D")
# lm-eval 0.4's longbench2 task (_longbench_common_yaml): the context as given, the question stripped, "Answer:"
LOGLIK_TEXT = ("Please read the following text and answer the question below.\n\n<text>\n{context}\n</text>\n\n"
               "What is the correct answer to this question: {question}\nChoices:\n(A) {a}\n(B) {b}\n(C) {c}\n(D) {d}"
               "\n\nAnswer:")  # fmt: skip


@dataclass(kw_only=True)
class LongbenchSettings(ChatFlags, RunSettings):
    """Every flag of `megaeval longbench`, defaults included (the official protocols)."""

    version: int = 1
    data: str | None = None  # v1: the folder of data/<task>.jsonl; v2: data.json; or hub:NAME
    tasks: str = "all"  # v1
    longbench_e: bool = False  # v1: LongBench-E's files and buckets
    num_samples: int | None = None  # the first N records of each task (v1) or items (v2); None: all
    max_prompt_tokens: int | None = None  # None: the whole prompt (state-carrying), the context's room (fixed)
    protocol: str = "official"  # v2
    cot: bool = False  # v2
    no_context: bool = False  # v2
    temperature: float = 0.1  # v2, official protocol
    seed: int = 42  # v2, official protocol
    compensated: bool = False  # v2: a missing answer counts 0.25
    predictions: str | None = None  # score these official prediction files, no model
    bos: str = "auto"
    batch_size: str | int = "auto"
    include_path: list[str] = field(default_factory=list)
    out: str = "reports/longbench.json"
    samples: str | None = None
    task_names: list[str] = field(default_factory=list)

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "batch_size")
    # flag -> the modes it applies to: v1, v2 (its loglik protocol), "v2 official"; then --data or --predictions
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {
        **dict.fromkeys(("tasks", "longbench_e", "include_path"), ("v1",)),
        **dict.fromkeys(("protocol", "no_context", "compensated"), ("v2", "v2 official")),
        **dict.fromkeys(("cot", "temperature", "seed"), ("v2 official",)),
        "max_prompt_tokens": ("v1", "v2 official"),  # loglik reads lm-eval's prompt as lm-eval does: no middle cut
    }  # fmt: skip
    MODE_FLAGS: ClassVar[dict[str, str]] = {"v1": "--version 1", "v2": "--version 2",
                                            "v2 official": "--version 2 --protocol official"}  # fmt: skip
    SOURCES: ClassVar[dict[str, tuple[str, ...]]] = {
        **shared_modes(run=("--data",), report=("--data", "--predictions")),
        **dict.fromkeys(("max_prompt_tokens", "batch_size", "chat_template", "protocol", "no_context", "cot",
                         "temperature", "seed"), ("--data",)),
    }  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        self.bos = bos_policy(self.bos)
        self.check_chat()
        self.batch_size = parse_batch_size(self.batch_size)
        if self.version not in (1, 2):
            raise fail(f"--version {self.version}: LongBench has versions 1 and 2", "pass --version 1 or --version 2")
        if self.protocol not in PROTOCOLS:
            raise fail(f"unknown --protocol {self.protocol!r}", f"use {' or '.join(PROTOCOLS)}")
        if self.cot and self.protocol == "loglik":
            raise fail("--cot asks for reasoning before the answer, but --protocol loglik scores the letters without "
                       "generating", "drop --cot, or use --protocol official")  # fmt: skip
        if self.cot and self.no_context:
            raise fail("--cot and --no-context are two prompts of their own", "pass one of them")
        if self.system_instruction:
            raise fail("--system-instruction: LongBench's official runs send the prompt as the only turn",
                       "drop --system-instruction")  # fmt: skip
        if not (self.data is None) ^ (self.predictions is None):
            raise fail("pass exactly one of --data and --predictions",
                       "--data runs a model on LongBench's files, --predictions scores the official prediction "
                       "files")  # fmt: skip
        for name, low in (("num_samples", 1), ("max_prompt_tokens", 2)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise fail(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
        if not 0 <= self.temperature <= 10:
            raise fail(f"--temperature must be between 0 and 10, got {self.temperature}", "the official uses 0.1")
        check_temperature(self.temperature, "--temperature")
        mode = "v1" if self.version == 1 else "v2 official" if self.protocol == "official" else "v2"
        source = "--data" if self.data else "--predictions"
        for table, given in ((self.MODES, mode), (self.SOURCES, source)):
            ignored = ignored_flag(self, table, given)
            if ignored is not None:
                flag = "--e" if ignored[0] == "longbench_e" else f"--{ignored[0].replace('_', '-')}"
                where = " or ".join(self.MODE_FLAGS.get(m, m) for m in ignored[1])
                named = "--protocol loglik" if given == "v2" else given  # the mode "v2" is loglik's
                raise fail(f"{flag} does not apply with {named} (it would be ignored)", f"use it with {where}")
        if self.version == 1:
            self.task_names = self.chosen_tasks()
            if self.longbench_e:
                plain = [t for t in self.task_names if not load_longbench_task(t, self.include_path)["longbench_e"]]
                if plain and self.tasks not in ("all", "present"):
                    raise fail(f"LongBench-E has no {plain[0]}", "ask for LongBench-E's tasks, or drop --e")
                self.task_names = [t for t in self.task_names if t not in plain]

    def chosen_tasks(self) -> list[str]:
        """--tasks: names, all, or present (the tasks whose files the --data folder holds; with --predictions, all is
        already the tasks the folder holds)."""
        if self.tasks.strip() != "present":
            return parse_tasks(self.tasks, "longbench", self.include_path)
        known = parse_tasks("all", "longbench", self.include_path)
        return known if self.data is None else present_tasks(self.data, known, self.longbench_e)


def run_longbench(settings: LongbenchSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Run the model on every record (or, with --predictions, score prediction files); write and return the report
    (rank 0; None on the other ranks)."""
    if settings.predictions is not None:
        from .longbench_files import score_predictions

        return score_predictions(settings)
    reads = [settings.data if not settings.data.startswith(HUB) else None]
    if settings.version == 1:
        specs = {t: load_longbench_task(t, settings.include_path) for t in settings.task_names}
        sets = {t: read_v1(settings.data, t, settings.longbench_e, specs[t]["metric"]) for t in specs}
        records = {t: rows[: settings.num_samples] for t, (rows, _) in sets.items()}
        sha = {t: {"sha256": spec_sha256("longbench", t, settings.include_path)} for t in specs}
        data = {"data": settings.data, "sources": {t: src for t, (_, src) in sets.items()}, "tasks": sha}
        with open_run("longbench", settings, reads=reads, fingerprint={"data": data}, check=lambda lm: check_model(
                lm, settings), progress=progress, on_unit=on_unit) as run:  # fmt: skip
            return _evaluate_v1(run, settings, specs, records, data)
    items, source = read_v2(settings.data)
    items = items[: settings.num_samples]
    data = {"data": settings.data, "source": source, "templates_sha256": spec_sha256_v2()}
    with open_run("longbench", settings, reads=reads, fingerprint={"data": data}, check=lambda lm: check_model(
            lm, settings), progress=progress, on_unit=on_unit) as run:  # fmt: skip
        return _evaluate_v2(run, settings, items, data)


def spec_sha256_v2() -> str:
    """Checksum of LongBench v2's prompt templates as loaded."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(v2_templates(), sort_keys=True).encode()).hexdigest()


def check_model(lm: StreamingLM, settings: LongbenchSettings) -> dict[str, Any]:
    """Refuse, before any work, a chat template the tokenizer lacks and budgets or --max-prompt-tokens a fixed
    context cannot hold; what the run records: BOS, the template, the limit prompts are cut at."""
    template = run_template(lm, settings.chat)
    probe = render_turns(template, conversation("", fmt=settings.chat), False) if template is not None else None
    if lm.max_context is not None:
        budgets = ({t: load_longbench_task(t, settings.include_path)["max_new_tokens"] for t in settings.task_names}
                   if settings.version == 1 else {"v2": V2_COT_BUDGET if settings.cot else V2_BUDGET})  # fmt: skip
        prompt = settings.max_prompt_tokens or 2
        tight = [t for t, budget in budgets.items() if budget + prompt >= lm.max_context]
        if tight:
            what = f"--max-prompt-tokens {settings.max_prompt_tokens:,} and " if settings.max_prompt_tokens else ""
            raise fail(f"{lm.spec} reads at most max_context {lm.max_context:,} tokens: {what}the "
                       f"{budgets[tight[0]]} new tokens of {', '.join(tight)} leave no room for a prompt",
                       "leave those tasks out (--tasks), pass a smaller --max-prompt-tokens, or use a model with a "
                       "longer context (--model-args max_context=N)")  # fmt: skip
    limit = "the whole prompt" if lm.max_context is None else "max_context minus the answer's budget and the template"
    if settings.version == 2 and settings.protocol == "loglik" and lm.max_context is not None:
        limit = "the last max_context tokens (lm-eval's left truncation)"
    # v1 tokenizes build_chat's text with the tokenizer's special tokens (pred.py); v2's server renders the template
    # and adds none (vLLM's chat completions): only the template's own BOS, unless --bos always
    bos = settings.bos == "always" if settings.version == 2 and template is not None else None
    return {"bos_effective": prompt_bos(lm, settings.bos, probe) if bos is None else bos,
            "chat_template_effective": template and template.facts(),
            "max_prompt_tokens_effective": settings.max_prompt_tokens or limit}  # fmt: skip


def _encoders(lm: StreamingLM, settings: LongbenchSettings, chosen: dict[str, Any]) -> tuple[Any, Any]:
    """(the encoder of chat-rendered prompts, the encoder of raw ones)."""
    template = run_template(lm, settings.chat)
    raw = prompt_encoder(lm, prompt_bos(lm, settings.bos), BASE)
    return (prompt_encoder(lm, chosen["bos_effective"], settings.chat, template) if template else raw), raw


def as_query(prompt: Any, name: str) -> Query:
    """A fitted prompt as the model is asked it (a chat API gets the cut task text as one user turn, as pred.py's
    requests to its vLLM server send it)."""
    return Query(prompt.ids, prompt.text, ({"role": "user", "content": prompt.cut},), name)


def _evaluate_v1(
    run: Run, settings: LongbenchSettings, specs: dict[str, dict], records: dict[str, list[dict]], data: dict
) -> dict[str, Any] | None:  # fmt: skip
    lm = run.lm
    chosen = check_model(lm, settings)
    chat, raw = _encoders(lm, settings, chosen)
    meter = PeakMemory(lm.device)

    def compute_batch(batch: list[tuple[str, int]]) -> list[dict[str, Any]]:
        out = []
        for task in dict.fromkeys(t for t, _ in batch):
            spec, indices = specs[task], [i for t, i in batch if t == task]
            encode = chat if spec["chat"] else raw
            prompts = [fit_prompt(lm, encode, v1_prompt(spec["prompt"], records[task][i]), spec["max_new_tokens"],
                                  settings.max_prompt_tokens, truncate_v1, f"{task} record {i}")
                       for i in indices]  # fmt: skip
            rule = Decoding(stop_ids=(newline_id(lm),), min_new_tokens=1) if spec["stop_at_newline"] else GREEDY
            queries = [as_query(p, f"longbench {task} record {i}") for p, i in zip(prompts, indices, strict=True)]
            answers, measured = answer_measured(
                run, queries, Rule(spec["max_new_tokens"], (), rule), False, size, meter
            )
            for i, prompt, answer in zip(indices, prompts, answers, strict=True):
                record = records[task][i]
                classes = records[task][-1]["all_classes"]  # eval.py scores a task with its file's last line's
                score = score_prediction(spec["metric"], answer.text, record["answers"], classes, spec["first_line"])
                out.append({
                    "task": task, "id": f"{task}/{i}", "_id": record.get("_id"), "sample": i, "metric": spec["metric"],
                    "length": record["length"], "answers": record["answers"], "prediction": answer.text,
                    "score": score, "prompt_tokens": len(prompt.ids), "tokens_dropped": prompt.dropped,
                    "max_prompt_tokens": prompt.limit, "stop_reason": answer.stop_reason, **prompt_ends(prompt.text),
                    **generation_facts(answer), **measured,
                })  # fmt: skip
        return out

    longest = max((len(r["context"]) for rows in records.values() for r in rows), default=1)
    size = run.answerer.rows(settings.batch_size, min(longest // 3 + 1, lm.max_context or longest))
    units = [(t, i) for t in specs for i in range(len(records[t]))]
    sizes = [len(specs[t]["prompt"]) + len(records[t][i]["context"]) + len(records[t][i]["input"]) for t, i in units]
    first = v1_prompt(specs[units[0][0]]["prompt"], records[units[0][0]][0]) if units else ""
    tokens = token_estimates(lm, first, sizes, settings.max_prompt_tokens or lm.max_context)
    weights = dict(zip(units, tokens, strict=True))
    rows = min(size, max(1, round(len(units) / max(len(specs), 1))))  # a batch decodes one task's records
    announce_cost(run, [(list(u), weights[u], specs[u[0]]["max_new_tokens"]) for u in units], rows)
    done = run.map(units, key=list, compute=lambda u: compute_batch([u])[0], unit_name="tokens",
                   weight=lambda u: weights[u], describe=lambda u: u[0], batch=size,
                   compute_batch=compute_batch)  # fmt: skip
    if done is None:
        return None
    results = v1_results(done, list(specs), settings.longbench_e)
    effective = {**chosen, "batch_size_effective": size}
    samples = [without_measurements(r) for r in done]
    return run.finish({**asdict(settings), **effective}, data, results, samples=samples)


def _evaluate_v2(run: Run, settings: LongbenchSettings, items: list[dict], data: dict) -> dict[str, Any] | None:
    lm = run.lm
    if settings.protocol == "loglik" and not run.answerer.scores_choices:
        raise fail("--protocol loglik scores the four letters by log-likelihood, which needs the model in this process "
                   f"(megaeval does not ask a server for prompt log-probabilities; {lm.spec} is served)",
                   "use --protocol official, or run the model in-process (--model DIR)")  # fmt: skip
    chosen = check_model(lm, settings)
    encode, _ = _encoders(lm, settings, chosen)
    templates = v2_templates()
    name = "0shot_no_context" if settings.no_context else "0shot_cot" if settings.cot else "0shot"
    meter = PeakMemory(lm.device)
    explicit = settings.max_prompt_tokens

    def sample(queries: list[tuple[dict, str]], budget: int, query: str) -> tuple[list[Any], list[Any], dict]:
        prompts = [fit_prompt(lm, encode, text, budget, explicit, truncate_v2, f"item {item['_id']}")
                   for item, text in queries]  # fmt: skip
        seeds = tuple(item_seed(settings.seed, item["_id"], query) for item, _ in queries)
        rule = Decoding(temperature=settings.temperature, seeds=seeds) if settings.temperature > 0 else GREEDY
        asked = [as_query(p, f"longbench v2 item {item['_id']}") for p, (item, _) in zip(prompts, queries, strict=True)]
        answers, measured = answer_measured(run, asked, Rule(budget, (), rule), False, size, meter)
        return prompts, answers, measured

    def compute_batch(batch: list[int]) -> list[dict[str, Any]]:
        chosen_items = [items[i] for i in batch]
        if settings.protocol == "loglik":
            return [_loglik(lm, settings, item) for item in chosen_items]
        queries = [(item, v2_prompt(templates[name], item, item["context"])) for item in chosen_items]
        prompts, answers, measured = sample(queries, V2_COT_BUDGET if settings.cot else V2_BUDGET, "first")
        outputs = [a.text for a in answers]  # the official leaves out an item whose output is '' (not stripped)
        facts = [generation_facts(a) for a in answers]
        reasoning: list[str | None] = [None] * len(batch)
        if settings.cot:
            reasoning = [text.strip() if text else None for text in outputs]
            todo = [k for k, text in enumerate(outputs) if text]
            answer = templates["0shot_cot_ans"]
            second = [(x, v2_prompt(answer, x, x["context"], cot=reasoning[k])) for k in todo
                      for x in [chosen_items[k]]]  # fmt: skip
            if second:
                more, answers2, also = sample(second, V2_BUDGET, "answer")
                measured = add_measured(measured, also, len(second) / len(batch))
                for k, p, a in zip(todo, more, answers2, strict=True):
                    outputs[k], facts[k] = a.text, generation_facts(a)
                    prompts[k].dropped += p.dropped
        out = []
        for item, prompt, output, cot, fact in zip(chosen_items, prompts, outputs, reasoning, facts, strict=True):
            response = output.strip()
            pred = extract_answer(response)
            out.append({
                **item_fields(item),
                "response_cot": cot, "response": response, "pred": pred, "judge": pred == item["answer"],
                "skipped": output == "", "score": float(pred == item["answer"]), "prompt_tokens": len(prompt.ids),
                "tokens_dropped": prompt.dropped, "max_prompt_tokens": prompt.limit, **prompt_ends(prompt.text),
                **fact, **measured,
            })  # fmt: skip
        return out

    longest = max((len(item["context"]) for item in items), default=1)
    size = run.answerer.rows(settings.batch_size, min(longest // 3 + 1, lm.max_context or longest))
    sizes = [len(item["context"]) + len(item["question"]) for item in items]
    first = items[0]["context"] if items else ""
    weights = dict(enumerate(token_estimates(lm, first, sizes, settings.max_prompt_tokens or lm.max_context)))
    new = V2_COT_BUDGET + V2_BUDGET if settings.cot else 0 if settings.protocol == "loglik" else V2_BUDGET
    announce_cost(run, [(items[i]["_id"], w, new) for i, w in weights.items()], min(size, max(len(items), 1)))
    done = run.map(list(range(len(items))), key=lambda i: items[i]["_id"], compute=lambda i: compute_batch([i])[0],
                   unit_name="tokens", weight=lambda i: weights[i], describe=lambda i: items[i]["domain"],
                   batch=size, compute_batch=compute_batch)  # fmt: skip
    if done is None:
        return None
    results = v2_results(done, settings.compensated, settings.protocol)
    effective = {**chosen, "batch_size_effective": size, "prompt_template": name}
    samples = [without_measurements(r) for r in done]
    return run.finish({**asdict(settings), **effective}, data, results, samples=samples)


def announce_cost(run: Run, costs: list[tuple[Any, int, int]], rows: int) -> None:
    """The cost line (`runs.cost`): the records still to run (`costs`: each unit's journal key, its prompt tokens,
    about, and its new tokens at most), their tokens, at the model's read rate now (`rows` records decoded
    together)."""

    def left(journal: Any) -> tuple[int, int, list[int], int]:
        todo = [cost for cost in costs if cost[0] not in journal]
        return len(todo), len(costs), [c[1] for c in todo], sum(c[2] for c in todo)

    cost_line(run, "records", left, min(4096, run.lm.max_context or 4096), about=True, rows=rows)


def item_fields(item: dict[str, Any]) -> dict[str, Any]:
    """What a v2 sample keeps of its item (its domain as its task; pred.py's fields, the context left out)."""
    keep = ("_id", "domain", "sub_domain", "difficulty", "length", "answer")
    return {"task": item["domain"], "id": item["_id"], **{k: item[k] for k in keep}}


def loglik_text(item: dict[str, Any]) -> str:
    """lm-eval's longbench2 context of an item (its `doc_to_text`)."""
    return LOGLIK_TEXT.format(context=item["context"], question=item["question"].strip(), a=item["choice_A"],
                              b=item["choice_B"], c=item["choice_C"], d=item["choice_D"])  # fmt: skip


def _loglik(lm: StreamingLM, settings: LongbenchSettings, item: dict[str, Any]) -> dict[str, Any]:
    """An item scored as lm-eval's longbench2 scores it: the letter of highest log-likelihood after the context."""
    text = loglik_text(item)
    start = bos_prefix(lm, settings.bos)
    pairs = [encode_pair(lm, text, " " + letter) for letter in LETTERS]
    context = start + pairs[0][0]
    scored = score_requests(lm, context, [cont for _, cont in pairs])
    best = max(range(len(LETTERS)), key=lambda k: scored.loglikelihoods[k])
    pred = LETTERS[best]
    return {**item_fields(item), "response": None,
            "loglikelihoods": scored.loglikelihoods, "pred": pred, "judge": pred == item["answer"], "skipped": False,
            "score": float(pred == item["answer"]), "prompt_tokens": len(context), "tokens_dropped": scored.truncated,
            **prompt_ends(text)}  # fmt: skip


def longbench_summary(report: dict[str, Any]) -> str:
    """LongBench's tables of a report (what the command prints)."""
    from ..tables import report_label
    from .report.kinds import longbench_tables

    return longbench_tables([report], [report_label(report, "longbench")])
