"""RULER's needle-in-a-haystack generator (its eight niah_* tasks), draw for draw: the same records, in the same
order, as RULER's niah.py writes for `prepare.py --model_template_type base`, given the same seed, tokenizer and
essay text.

Follows NVIDIA/RULER scripts/data/synthetic/niah.py at commit c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a. RULER seeds
the global `random` once per task process; here one `random.Random(seed)` is consumed in the same order: the
estimating draw, each draw of the binary search, then each sample's draws (retries included).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

from ...errors import fail
from ..needle.haystack import RULER_DEPTHS as DEPTHS  # round(linspace(0, 100, 40)), as niah.py computes them
from .fitting import checked_sample_size, draw_fitting, estimate, largest_fitting, ruler_record
from .inputs import RulerInputs, TokenCounter, essay_words, sent_tokenize, wonderwords_words

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# RULER's `incremental`: the haystack items (essay words, noise or needle lines) of the estimating draw, the
# search's lower bound, and each retry's step
INCREMENTAL = {"essay": 500, "noise": 25, "needle": 25}
SHORT_INCREMENTAL = 5  # noise and needle haystacks below 4096 tokens


class AdjectiveNounWords(Sequence[str]):
    """RULER's word keys, `sorted(set(f"{adj}-{noun}"))` over wonderwords' lists, indexed without building its six
    million strings: sorted, the pairs of one adjective stay together, except that an adjective extending another
    with a hyphen ("blue", "blue-eyed") interleaves with it, so such a family is merged into one block."""

    def __init__(self, adjectives: Sequence[str], nouns: Sequence[str]):
        nouns = sorted(set(nouns))
        prefixes = {f"{adj}-" for adj in adjectives}
        families: dict[str, list[str]] = {}
        for prefix in sorted(prefixes):
            families.setdefault(_root(prefix, prefixes), []).append(prefix)
        self.prefixes = sorted(families)
        self.suffixes = [_block(root, families[root], nouns) for root in self.prefixes]
        self.offsets = [0, *itertools.accumulate(len(s) for s in self.suffixes)]

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not 0 <= i < len(self):
            raise IndexError(i)
        block = bisect.bisect_right(self.offsets, i) - 1
        return self.prefixes[block] + self.suffixes[block][i - self.offsets[block]]


def _root(prefix: str, prefixes: set[str]) -> str:
    """The shortest of `prefixes` that `prefix` starts with (each ends with "-", so only cuts after a "-" count)."""
    for cut, char in enumerate(prefix):
        if char == "-" and prefix[: cut + 1] in prefixes:
            return prefix[: cut + 1]
    return prefix


def _block(root: str, family: list[str], nouns: list[str]) -> list[str]:
    """The sorted distinct suffixes after `root` of every word of the adjectives in `family`."""
    if family == [root]:
        return nouns
    return sorted({prefix[len(root) :] + noun for prefix in family for noun in nouns})


@functools.lru_cache(maxsize=1)
def ruler_words() -> AdjectiveNounWords:
    """RULER's adjective-noun keys from the installed wonderwords' lists."""
    return AdjectiveNounWords(wonderwords_words("adjectivelist.txt"), wonderwords_words("nounlist.txt"))


@dataclass
class NiahRun:
    """One task's generation, as one RULER process holds it: its arguments, random stream and haystack."""

    spec: dict[str, Any]
    count_tokens: TokenCounter
    rng: Random
    seed: int
    haystack: list[str] | None  # essay words; None for the noise and needle haystacks
    split: tuple[int, list[str]] | None = None  # the essay's sentences at the size last split

    def sentences(self, num_haystack: int) -> list[str]:
        """The first `num_haystack` essay words (repeated when the essay is shorter), split into sentences; once per
        size, as draws at one size (a sample's retries, the next sample's first try) split the same text."""
        assert self.haystack is not None
        if self.split is None or self.split[0] != num_haystack:
            words = itertools.islice(itertools.cycle(self.haystack), num_haystack)
            self.split = (num_haystack, sent_tokenize(" ".join(words).strip()))
        return self.split[1]

    @property
    def args(self) -> dict[str, Any]:
        """The task's arguments, as scripts/synthetic.yaml gives them."""
        return self.spec["args"]

    @property
    def num_needle_k(self) -> int:
        """RULER asks about keys that exist: it raises num_needle_k to num_needle_q."""
        return max(self.args["num_needle_k"], self.args["num_needle_q"])


def random_value(run: NiahRun, kind: str) -> str:
    """A key or value of RULER's types: a 7-digit number, an adjective-noun word, or a version-4 UUID."""
    if kind == "numbers":
        return str(run.rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return run.rng.choice(ruler_words())
    if kind == "uuids":
        return str(uuid.UUID(int=run.rng.getrandbits(128), version=4))
    raise fail(f"RULER's niah has no needle type {kind!r}", "use numbers, words or uuids")


def draw_needles(run: NiahRun) -> tuple[list[str], list[list[str]], list[str]]:
    """Keys, their values, and the needle sentences, drawn key by key, then shuffled by a fresh Random(seed)."""
    args = run.args
    keys, values, needles = [], [], []
    for _ in range(run.num_needle_k):
        keys.append(random_value(run, args["type_needle_k"]))
        values.append([])
        for _ in range(args["num_needle_v"]):
            values[-1].append(random_value(run, args["type_needle_v"]))
            needles.append(NEEDLE.format(type_needle_v=args["type_needle_v"], key=keys[-1], value=values[-1][-1]))
    Random(run.seed).shuffle(needles)
    return keys, values, needles


def essay_context(run: NiahRun, needles: list[str], num_haystack: int) -> str:
    """The essay's sentences with the needles placed at random depths between them."""
    sentences = run.sentences(num_haystack)
    depths = run.rng.sample(DEPTHS, len(needles))
    cuts = [0, *sorted(int(len(sentences) * (depth / 100)) for depth in depths), len(sentences)]
    parts = []
    for i in range(1, len(cuts)):
        parts.append(" ".join(sentences[cuts[i - 1] : cuts[i]]))
        if i - 1 < len(needles):
            parts.append(needles[i - 1])
    return " ".join(parts)


def line_context(run: NiahRun, needles: list[str], num_haystack: int) -> str:
    """`num_haystack` noise sentences, or needles about other keys, one a line, with the needles inserted."""
    args = run.args
    if args["type_haystack"] == "noise":
        lines = [NOISE] * num_haystack
    else:
        lines = [
            NEEDLE.format(type_needle_v=args["type_needle_v"], key=random_value(run, args["type_needle_k"]),
                          value=random_value(run, args["type_needle_v"]))
            for _ in range(num_haystack)
        ]  # fmt: skip
    checked_sample_size(len(needles), num_haystack)
    positions = sorted(run.rng.sample(range(num_haystack), len(needles)), reverse=True)
    for position, needle in zip(positions, needles, strict=True):
        lines.insert(position, needle)
    return "\n".join(lines)


def draw_prompt(run: NiahRun, num_haystack: int) -> tuple[str, list[str]]:
    """One prompt (task template and answer prefix, filled) with `num_haystack` haystack items, and its answers."""
    args = run.args
    keys, values, needles = draw_needles(run)
    if args["type_haystack"] == "essay":
        context = essay_context(run, needles, num_haystack)
    else:
        context = line_context(run, needles, num_haystack)
    asked = run.rng.sample(range(run.num_needle_k), args["num_needle_q"])
    queries = [keys[i] for i in asked]
    answers = [value for i in asked for value in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template = run.spec["template"] + run.spec["answer_prefix"]
    type_needle_v = args["type_needle_v"]
    if args["num_needle_q"] * args["num_needle_v"] == 1:  # RULER's singular wording, by plain replacement
        for plural, singular in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(plural, singular)
        type_needle_v = type_needle_v[:-1]
    return template.format(type_needle_v=type_needle_v, context=context, query=query), answers


def record(run: NiahRun, text: str, answers: list[str], length: int) -> dict[str, Any]:
    """RULER's record of one sample, where `index` is not the sample's number: niah.py overwrites it with the
    character offset of the first answer's first occurrence in the prompt, and adds that offset in tokens."""
    fields = ruler_record(0, text, answers, length, run.spec["answer_prefix"])
    fields["index"] = fields["input"].find(answers[0])
    fields["token_position_answer"] = run.count_tokens(fields["input"][: fields["index"]])
    return fields


def generate(
    spec: dict[str, Any], count_tokens: TokenCounter, max_seq_length: int, num_samples: int, seed: int,
    inputs: RulerInputs,
) -> list[dict[str, Any]]:  # fmt: skip
    """RULER's niah records for one task at one length (`max_seq_length` includes the tokens to generate)."""
    args = spec["args"]
    task = spec.get("task", "niah")
    essay = args["type_haystack"] == "essay"
    run = NiahRun(spec, count_tokens, Random(seed), seed, essay_words(inputs) if essay else None)
    if essay and run.num_needle_k * args["num_needle_v"] > len(DEPTHS):  # RULER's random.sample(DEPTHS) raises
        raise fail(f"RULER's {task} places at most {len(DEPTHS)} needles in an essay",
                   "lower num_needle_k × num_needle_v in the task file")  # fmt: skip
    budget = spec["tokens_to_generate"]
    needles = run.num_needle_k * args["num_needle_v"]
    if needles + budget > max_seq_length:  # each needle sentence takes several tokens: drawing them is hopeless
        raise fail(f"{task} cannot be generated at length {max_seq_length}: args.num_needle_k × args.num_needle_v "
                   f"asks for {needles:,} needle sentences, and {budget} tokens are to be generated",
                   "lower num_needle_k or num_needle_v in the task file, or use a longer length")  # fmt: skip
    incremental = INCREMENTAL[args["type_haystack"]]
    if not essay and max_seq_length < 4096:
        incremental = SHORT_INCREMENTAL

    def prompt_tokens(num_haystack: int) -> int:
        return count_tokens(draw_prompt(run, num_haystack)[0])

    per_item = estimate(prompt_tokens, incremental, task)
    high = max(int((max_seq_length / per_item) * 3), incremental * 2)
    best = largest_fitting(lambda n: prompt_tokens(n) + budget, incremental, high, max_seq_length)
    num_haystack = incremental if best is None else best

    def attempt(size: int) -> tuple[tuple[str, list[str]], int]:
        text, answers = draw_prompt(run, size)
        return (text, answers), count_tokens(text) + budget

    records = []
    for _ in range(num_samples):
        (text, answers), length = draw_fitting(attempt, num_haystack, incremental, max_seq_length, task)
        records.append(record(run, text, answers, length))
    return records
