"""`megaeval longppl`: perplexity on the tokens that need long context (LongPPL, Fang et al., ICLR 2025), a document
at a time: an evaluator's key-token spans (`scoring.key_tokens`, or a key-token file), then the model's losses on its
own tokens inside them (`metrics.longppl`).

As the reference (`longppl` 0.3.0): the evaluator reads each document with its tokenizer's default special tokens,
the model without any; the model's loss on its first token is never counted. A document without key tokens gets
`longppl: null`. Over documents: LongPPL token-weighted by key tokens, perplexity weighted by tokens.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import fail
from ..files import check_outputs, check_writable, file_sha256, write_json_atomic
from ..metrics.longppl import KeySettings, document_longppl, pooled_perplexity
from ..models import StreamingLM, naming, parse_spec
from ..runs import Run, RunSettings, open_run
from ..runs.report import model_facts
from ..runs.run import check_run_outputs
from ..scoring.key_tokens import (
    check_evaluator_fits,
    check_fits,
    full_nll,
    key_spans,
    load_evaluator,
    model_key_positions,
)
from ..serving.spec import refuse_served
from ..tables import format_value, render_table, report_label
from ..tasks.data import Document, read_documents
from ..tasks.longppl.data import (
    KEY_MODES,
    check_key_modes,
    key_file,
    key_identity,
    key_settings,
    read_key_file,
    spans_for,
)
from ..tokenizers import encode_offsets

MODEL_CONTEXT_FIX = "use a model whose context holds the document (--model-args max_context=N), or shorter documents"


@dataclass(kw_only=True)
class LongpplSettings(RunSettings):
    """Every flag of `megaeval longppl`, defaults included (all recorded in the report; None: see `resolve`)."""

    data: list[str] = field(default_factory=list)
    text_field: str = "text"
    evaluator: str | None = None
    evaluator_args: dict[str, Any] = field(default_factory=dict)
    key_tokens: str | None = None
    save_key_tokens: str | None = None
    trunc_len: int | None = None  # None: the key-token file's, else the reference's (tasks.longppl.data.key_settings)
    sliding_window: int | None = None
    alpha: float | None = None
    beta: float | None = None
    batch_size: int = 8
    samples: str | None = None
    out: str = "reports/longppl.json"

    OUTPUT_FLAGS: ClassVar[tuple[str, ...]] = (*RunSettings.OUTPUT_FLAGS, "save_key_tokens")
    # flag -> the modes it applies to (`tasks.longppl.data.check_key_modes`): what only an evaluator run uses
    MODES: ClassVar[dict[str, tuple[str, ...]]] = {**KEY_MODES, "save_key_tokens": ("--evaluator",),
                                                   "batch_size": ("--evaluator",)}  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.evaluator is None) == (self.key_tokens is None):
            raise fail("pass exactly one of --evaluator E (find key tokens) and --key-tokens F (read them)",
                       "e.g. --evaluator embedded:megalodon-tiny, or a file from --save-key-tokens")  # fmt: skip
        check_key_modes(self, self.MODES)
        if self.batch_size < 1:
            raise fail(f"--batch-size must be at least 1, got {self.batch_size}", "pass --batch-size 8")


def run_longppl(settings: LongpplSettings, progress: bool = True, on_unit=None) -> dict[str, Any] | None:
    """Run (or resume) LongPPL over the documents and write the report (and key-token file); rank 0 returns it."""
    refuse_served(settings.model, "longppl", "scores every token of a document, carrying the model's state")
    refuse_served(settings.evaluator, "--evaluator", "scores every token of a document to find its key tokens")
    with naming("--evaluator", settings.evaluator):
        evaluator_path = parse_spec(settings.evaluator)[1] if settings.evaluator else None
    reads = [*settings.data, settings.key_tokens, evaluator_path]
    out = check_run_outputs(settings, [*reads, parse_spec(settings.model)[1]])
    if settings.save_key_tokens is not None:
        save = check_writable(settings.save_key_tokens, "--save-key-tokens")
        check_outputs({"--out": out, "--samples": settings.samples, "--save-key-tokens": save}, reads)
    documents, sources = read_documents(settings.data, settings.text_field)
    if settings.text_field != "text" and all(s["kind"] in ("folder", "txt", "txt.gz") for s in sources):
        raise fail(f"--text-field {settings.text_field} names a field of .jsonl/.parquet rows, but every --data is "
                   "text files: it would be ignored", "leave --text-field out")  # fmt: skip
    held = read_key_file(settings.key_tokens) if settings.key_tokens else None
    key = key_settings(settings, held, settings.key_tokens)
    spans = spans_for(held, settings.key_tokens, documents) if held else None
    prepared: dict[str, Any] = {}

    def check(lm: StreamingLM) -> dict[str, Any]:
        prepared.update(prepare(lm, settings, documents, key, spans is None))
        evaluator = prepared.get("evaluator")
        prepared["evaluator_facts"] = held["evaluator"] if held else model_facts(evaluator)
        return key_identity(prepared["evaluator_facts"], asdict(key), settings.key_tokens)

    fingerprint = {"documents": [d.sha256 for d in documents]}
    with open_run("longppl", settings, reads=reads, fingerprint=fingerprint, check=check, progress=progress,
                  on_unit=on_unit) as run:  # fmt: skip
        return _evaluate(run, settings, documents, sources, key, spans, prepared)


def prepare(lm: StreamingLM, settings: LongpplSettings, documents: list[Document], key: KeySettings,
            evaluate: bool) -> dict[str, Any]:  # fmt: skip
    """Load the evaluator (when key tokens are to be found) and tokenize every document for it and the model,
    refusing what cannot be computed before any model pass: a document too short, or too long for a context."""
    evaluator = load_evaluator(settings.evaluator, settings.evaluator_args, lm, settings.dtype) if evaluate else None
    model_tokens, evaluator_tokens = [], []
    for doc in documents:
        ids, offsets = encode_offsets(lm.tokenizer, doc.text, specials=False)
        if len(ids) < 2:
            raise fail(f"document {doc.id} has {len(ids)} token(s) for the model; perplexity needs 2",
                       "remove it from the data")  # fmt: skip
        check_fits(lm, len(ids), f"document {doc.id}", MODEL_CONTEXT_FIX)
        model_tokens.append((ids, offsets))
        if evaluator is not None:
            ids, offsets = encode_offsets(evaluator.tokenizer, doc.text, specials=True)
            check_evaluator_fits(evaluator, len(ids), key, f"document {doc.id}")
            evaluator_tokens.append((ids, offsets))
    return {"evaluator": evaluator, "model_tokens": model_tokens, "evaluator_tokens": evaluator_tokens}


def _evaluate(run: Run, settings: LongpplSettings, documents: list[Document], sources: list[dict[str, Any]],
              key: KeySettings, spans: list | None, prepared: dict[str, Any]) -> Any:  # fmt: skip
    lm, evaluator = run.lm, prepared["evaluator"]

    def compute(i: int) -> dict[str, Any]:
        doc = documents[i]
        record: dict[str, Any] = {"id": doc.id, "sha256": doc.sha256}
        if spans is None:
            ids, offsets = prepared["evaluator_tokens"][i]
            doc_spans, n_key = key_spans(evaluator, ids, offsets, key, settings.batch_size, f"document {doc.id}")
            record.update(spans=[list(s) for s in doc_spans], evaluator_tokens=len(ids), evaluator_key_tokens=n_key)
        else:
            doc_spans = spans[i]
        ids, offsets = prepared["model_tokens"][i]
        nll = full_nll(lm, ids, f"document {doc.id}")
        keys = model_key_positions(offsets, doc_spans)
        record.update(n_tokens=len(ids), nll_sum=float(np.sum(nll[1:])), n_key_tokens=len(keys),
                      key_nll_sum=float(np.sum(nll[keys])), longppl=document_longppl(nll, keys),
                      ppl=math.exp(float(np.mean(nll[1:]))))  # fmt: skip
        return record

    records = run.map(range(len(documents)), key=lambda i: documents[i].sha256 + f"/{i}", compute=compute,
                      unit_name="characters", weight=lambda i: len(documents[i].text),
                      describe=lambda i: documents[i].id)  # fmt: skip
    if records is None:
        return None
    if settings.save_key_tokens is not None:
        content = key_file(
            prepared["evaluator_facts"],
            asdict(key),
            documents,
            [r["spans"] for r in records],
            [r["evaluator_tokens"] for r in records],
            [r["evaluator_key_tokens"] for r in records],
        )
        write_json_atomic(settings.save_key_tokens, content, flag="--save-key-tokens")
    samples = [{k: r.get(k) for k in SAMPLE_FIELDS} for r in records]
    recorded = {**asdict(settings), **asdict(key)}
    data = {"sources": sources, "documents": len(documents), "evaluator": prepared["evaluator_facts"],
            "key_tokens_file": settings.key_tokens,
            "key_tokens_sha256": file_sha256(settings.key_tokens) if settings.key_tokens else None}  # fmt: skip
    return run.finish(recorded, data, longppl_results(records), samples)


SAMPLE_FIELDS = ("id", "sha256", "longppl", "n_key_tokens", "ppl", "n_tokens", "evaluator_key_tokens")


def longppl_results(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-document rows and the pooled values, as the reference's perplexity.py pools them."""
    return {
        "longppl": pooled_perplexity([(r["longppl"], r["n_key_tokens"]) for r in records]),
        "ppl": pooled_perplexity([(r["ppl"], r["n_tokens"]) for r in records]),
        "n_key_tokens": sum(r["n_key_tokens"] for r in records),
        "n_tokens": sum(r["n_tokens"] for r in records),
        "documents_without_key_tokens": sum(r["longppl"] is None for r in records),
        "aggregation": "longppl: exp(sum_d n_key_d log LongPPL_d / sum_d n_key_d); ppl: weighted by n_tokens",
        "documents": [{k: r.get(k) for k in SAMPLE_FIELDS if k != "sha256"} for r in records],
    }


def longppl_summary(report: dict[str, Any]) -> str:
    """One longppl report as a table: a row per document and the pooled row."""
    res = report["results"]
    rows = [[d["id"], f"{d['n_tokens']:,}", f"{d['n_key_tokens']:,}", format_value(d["ppl"]),
             "" if d["longppl"] is None else format_value(d["longppl"])] for d in res["documents"]]  # fmt: skip
    rows.append(["all (pooled)", f"{res['n_tokens']:,}", f"{res['n_key_tokens']:,}", format_value(res["ppl"]),
                 "" if res["longppl"] is None else format_value(res["longppl"])])  # fmt: skip
    s = report["settings"]
    title = (f"LongPPL of {report_label(report, 'model')}: T={s['trunc_len']}, W={s['sliding_window']}, "
             f"alpha {s['alpha']:g}, beta {s['beta']:g}")  # fmt: skip
    return render_table(["document", "tokens", "key tokens", "ppl", "longppl"], rows, "table", title=title)
