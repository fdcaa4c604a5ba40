"""What a RULER task file (suites/ruler/*.yaml, or a user's from --include-path) must hold, checked once when it is
read: RULER's generator for the task (`kind`), its arguments as scripts/synthetic.yaml gives them, the tokens to
generate, the template and answer prefix, and the metric. A broken file is one line naming the file and the field."""

from __future__ import annotations

import math
import string
from typing import Any

from ...errors import fail
from ..specs import check_fields, load_spec

METRICS = ("string_match_all", "string_match_part")
HAYSTACKS = {"niah": ("noise", "essay", "needle"), "variable_tracking": ("noise", "essay")}
NEEDLE_TYPES = ("numbers", "words", "uuids")
# kind -> {argument: its type}; the placeholders the template must hold and may hold
ARGS: dict[str, dict[str, type]] = {
    "niah": {"type_haystack": str, "type_needle_k": str, "type_needle_v": str, "num_needle_k": int,
             "num_needle_v": int, "num_needle_q": int},
    "variable_tracking": {"type_haystack": str, "num_chains": int, "num_hops": int},
    "common_words_extraction": {"freq_cw": int, "freq_ucw": int, "num_cw": int, "num_fewshot": int},
    "freq_words_extraction": {"alpha": float, "coded_wordlen": int, "vocab_size": int},
    "qa": {"dataset": str},
}  # fmt: skip
PLACEHOLDERS: dict[str, tuple[set[str], set[str]]] = {
    "niah": ({"context", "query"}, {"type_needle_v"}),
    "variable_tracking": ({"context", "query"}, {"num_v"}),
    "common_words_extraction": ({"context"}, {"query", "num_cw"}),
    "freq_words_extraction": ({"context"}, {"query"}),
    "qa": ({"context", "query"}, set()),
}
QA_DATASETS = ("squad", "hotpotqa")
# fwe's bounds: past them its generator draws for ever or runs out of memory (RULER's own: 2.0, 6, -1)
MAX_ALPHA = 100.0
MAX_CODED_WORDLEN = 50
MAX_VOCAB = 1_000_000
FIELDS = ("task", "kind", "args", "tokens_to_generate", "template", "answer_prefix", "metric")


def load_ruler_task(name: str, include_paths: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """A RULER task's definition (suites/ruler/NAME.yaml, or NAME.yaml of an --include-path folder), checked."""
    return load_spec("ruler", name, include_paths, check_ruler_spec)


def check_ruler_spec(spec: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming the file and the field, a RULER task definition that could not run right."""

    def bad(field: str, rule: str) -> Exception:
        return fail(f"RULER task file {where}: `{field}` {rule}", "fix the task file (suites/ruler/ has examples)")

    check_fields(spec, FIELDS, "a RULER task", bad)
    kind = spec["kind"]
    if not isinstance(kind, str) or kind not in ARGS:
        raise bad("kind", f"is {kind!r}; it must be one of {', '.join(ARGS)}")
    if not isinstance(spec["metric"], str) or spec["metric"] not in METRICS:
        raise bad("metric", f"is {spec['metric']!r}; it must be one of {', '.join(METRICS)}")
    if not _whole(spec["tokens_to_generate"]) or spec["tokens_to_generate"] < 1:
        raise bad("tokens_to_generate", f"is {spec['tokens_to_generate']!r}; it must be a whole number of at least 1")
    for field in ("template", "answer_prefix"):
        if not isinstance(spec[field], str):
            raise bad(field, "must be a text")
    _check_args(spec, kind, bad)
    must, may = PLACEHOLDERS[kind]
    try:
        parsed = string.Formatter().parse(spec["template"] + spec["answer_prefix"])
        names = {n for _, n, _, _ in parsed if n is not None}
    except ValueError as e:
        raise bad("template", f"is not a valid template ({e}; write a literal brace as {{{{ or }}}})") from None
    extra, lacking = sorted(names - must - may), sorted(must - names)
    if extra:
        raise bad("template", f"has the unknown placeholder {{{extra[0]}}}")
    if lacking:
        raise bad("template", f"lacks the placeholder {{{lacking[0]}}}")
    if not spec["answer_prefix"].strip():
        raise bad("answer_prefix", "must be a non-empty text (RULER cuts the prompt where it starts)")


def _check_args(spec: dict[str, Any], kind: str, bad) -> None:
    args = spec["args"]
    if not isinstance(args, dict):
        raise bad("args", "must be a mapping of RULER's arguments")
    expected = ARGS[kind]
    unknown = sorted(set(args) - set(expected))
    if unknown:
        raise bad(f"args.{unknown[0]}", f"is not an argument of RULER's {kind} (arguments: {', '.join(expected)})")
    for name, kind_of in expected.items():
        if name not in args:
            raise bad(f"args.{name}", "is missing")
        value = args[name]
        if kind_of is int and not _whole(value):
            raise bad(f"args.{name}", f"is {value!r}; it must be a whole number")
        if kind_of is float and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad(f"args.{name}", f"is {value!r}; it must be a number")
        if kind_of is str and not isinstance(value, str):
            raise bad(f"args.{name}", f"is {value!r}; it must be a text")
    for name in ("num_needle_k", "num_needle_v", "num_needle_q", "num_chains", "num_hops", "freq_cw", "freq_ucw",
                 "num_cw", "coded_wordlen"):  # fmt: skip
        if name in args and args[name] < 1:
            raise bad(f"args.{name}", f"is {args[name]}; it must be at least 1")
    if kind in HAYSTACKS and args["type_haystack"] not in HAYSTACKS[kind]:
        raise bad("args.type_haystack", f"is {args['type_haystack']!r}; it must be one of {', '.join(HAYSTACKS[kind])}")
    for name in ("type_needle_k", "type_needle_v"):
        if name in args and args[name] not in NEEDLE_TYPES:
            raise bad(f"args.{name}", f"is {args[name]!r}; it must be one of {', '.join(NEEDLE_TYPES)}")
    if kind == "qa" and args["dataset"] not in QA_DATASETS:
        raise bad("args.dataset", f"is {args['dataset']!r}; it must be one of {', '.join(QA_DATASETS)}")
    if kind == "freq_words_extraction":
        _check_fwe(args, bad)
    if kind == "common_words_extraction" and args["num_fewshot"] < 0:
        raise bad("args.num_fewshot", f"is {args['num_fewshot']}; it must be 0 or more")


def _check_fwe(args: dict[str, Any], bad) -> None:
    """fwe's Zipf exponent, word length and vocabulary: what its generator can draw (distinct words of
    `coded_wordlen` lowercase letters) in bounded time and memory."""
    if not math.isfinite(args["alpha"]) or not 1 < args["alpha"] <= MAX_ALPHA:
        raise bad("args.alpha", f"is {args['alpha']}; the Zipf exponent must be above 1 and at most {MAX_ALPHA} "
                  "(RULER's is 2.0)")  # fmt: skip
    if args["coded_wordlen"] > MAX_CODED_WORDLEN:
        raise bad("args.coded_wordlen", f"is {args['coded_wordlen']}; it must be at most {MAX_CODED_WORDLEN} "
                  "(RULER's is 6)")  # fmt: skip
    vocab = args["vocab_size"]
    if vocab != -1 and not 2 <= vocab <= MAX_VOCAB:
        raise bad("args.vocab_size", f"is {vocab}; it must be -1 (RULER's: one word per 50 tokens of the length) or "
                  f"from 2 (the noise and one answer word) to {MAX_VOCAB:,}")  # fmt: skip
    if vocab > 26 ** args["coded_wordlen"]:
        raise bad("args.vocab_size", f"is {vocab:,}, more distinct words than {args['coded_wordlen']} letters make "
                  f"(26^{args['coded_wordlen']})")  # fmt: skip


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
