"""Needle prompts as the task files under suites/needle/ define them: the needles a sample hides, the haystack around
them at a depth, and the haystack sized in the model's own tokens so that prompt + max_new_tokens fits a length.

A sample is drawn from `Random(f"{seed}:{task}:{length}:{sample}")`, so the same seed gives the same prompts in any
process. Its depths share one haystack (the same size and text), so prompts of nearby depths share their start.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

import numpy as np

from ...errors import fail
from ...scoring.requests import Encoder
from .haystack import RULER_DEPTHS, book_words, essay_sentences, haystack_folder, random_value, split_sentences

# A needle lands at a sentence boundary: this far (in percent of the haystack) from the asked depth it is refused
DEPTH_TOLERANCE = 25.0


@dataclass
class Needles:
    """What one sample hides and asks: needles[0] goes at the asked depth, the others at `other_depths`."""

    needles: list[str]
    other_depths: list[int]
    query: str  # the keys asked about, as RULER joins them ("a, b, and c"); "" for passkey
    answers: list[str]
    distractor_seed: int  # the "needle" haystack's distractors come from Random(distractor_seed)


@dataclass
class NeedlePrompt:
    """One rendered prompt: its text, its token ids (BOS included when read), and what it hides."""

    depth: int
    text: str  # the whole prompt (in a chat turn, with --chat-template), RULER's answer prefix included
    ids: np.ndarray  # int32
    answers: list[str]
    needle_char: int  # where needles[0] starts in `text`
    haystack_units: int  # sentences (passkey), noise lines, distractor needles, or words (essay)
    asked: str = ""  # the task text and answer prefix alone, outside any template (a chat API's user turn)


def needle_token_offset(prompt: NeedlePrompt, encode_text: Callable[[str], Sequence[int]], bos: bool) -> int:
    """Where the needle starts in the prompt's ids (BOS counted): the first token the needle's text changes, i.e.
    the ids of the text before the needle, encoded alone, kept as long as they agree with the prompt's own ids (a
    SentencePiece tokenizer encodes the space before the needle alone as a trailing "▁", but inside the prompt the
    space and the needle's first word are one piece). Not RULER's `token_position_answer`, which counts the
    tokens of the text up to the answer value without BOS (`megaeval ruler` reports that one)."""
    before = np.asarray(encode_text(prompt.text[: prompt.needle_char]), dtype=np.int64)
    ids = np.asarray(prompt.ids[int(bos) :], dtype=np.int64)[: len(before)]
    differ = np.flatnonzero(ids != before[: len(ids)])
    return int(bos) + (int(differ[0]) if len(differ) else len(ids))


def sample_rng(seed: int, task: str, length: int, sample: int) -> Random:
    """The random stream of one sample (string seeds hash the same in every process)."""
    return Random(f"{seed}:{task}:{length}:{sample}")


def draw_needles(spec: dict[str, Any], rng: Random) -> Needles:
    """A sample's needles, query and answers, drawn as the task's source draws them."""
    if spec["kind"] == "passkey":
        low, high = spec["key_range"]
        key = str(rng.randint(low, high))
        return Needles([spec["needle"].format(key=key)], [], "", [key], rng.getrandbits(63))
    k = max(spec["num_needle_k"], spec["num_needle_q"])
    keys, values, needles, owners = [], [], [], []
    for i in range(k):
        keys.append(random_value(spec["type_needle_k"], rng))
        values.append([random_value(spec["type_needle_v"], rng) for _ in range(spec["num_needle_v"])])
        for value in values[-1]:
            needles.append(spec["needle"].format(type_needle_v=spec["type_needle_v"], key=keys[-1], value=value))
            owners.append((i, value))
    asked = rng.sample(range(k), spec["num_needle_q"])
    queries = [keys[i] for i in asked]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    answers = [a for i in asked for a in values[i]]
    first = owners.index((asked[0], values[asked[0]][0]))  # the first needle asked about goes at the asked depth
    order = [first] + [i for i in range(len(needles)) if i != first]
    others = rng.sample(RULER_DEPTHS, len(needles) - 1)
    return Needles([needles[i] for i in order], others, query, answers, rng.getrandbits(63))


def ruler_question(spec: dict[str, Any], needles: Needles) -> tuple[str, str]:
    """RULER's template and answer prefix for this sample, with its singular rewrite when one value is asked."""
    template, prefix, kind = spec["template"], spec["answer_prefix"], spec["type_needle_v"]
    if spec["num_needle_q"] * spec["num_needle_v"] == 1:
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template, prefix = template.replace(old, new), prefix.replace(old, new)
        kind = kind[:-1]
    template = template.replace("{type_needle_v}", kind).replace("{query}", needles.query)
    return template, prefix.format(type_needle_v=kind, query=needles.query)


def render(
    spec: dict[str, Any], needles: Needles, units: int, depth: int, words: tuple[str, ...] = ()
) -> tuple[str, int, float]:
    """The task text (without RULER's answer prefix) with a haystack of `units` and needles[0] at `depth` percent of
    it, at a sentence boundary; where needles[0] starts in that text; and the depth it landed at (percent of the
    haystack's sentences before it)."""
    if spec["kind"] == "passkey":
        filler = split_sentences(spec["filler"])
        cut = units * depth // 100
        before = [filler[i % len(filler)] for i in range(cut)]
        after = [filler[i % len(filler)] for i in range(units - cut)]  # the filler starts again after the needle
        head = f"{spec['instruction']}\n{' '.join(before)}\n"
        text = f"{head}{needles.needles[0]}\n{' '.join(after)}\n{spec['question']}"
        return text, len(head), placed_depth(units, cut, depth)
    depths = [depth, *needles.other_depths]
    if spec["haystack"] == "essay":
        sentences = essay_sentences(words, units)
        joiner = " "
    elif spec["haystack"] == "noise":
        sentences, joiner = [spec["noise"]] * units, "\n"
    else:
        rng = Random(needles.distractor_seed)
        kinds = spec["type_needle_k"], spec["type_needle_v"]
        sentences = [spec["needle"].format(type_needle_v=kinds[1], key=random_value(kinds[0], rng),
                                           value=random_value(kinds[1], rng)) for _ in range(units)]  # fmt: skip
        joiner = "\n"
    places = sorted((len(sentences) * d // 100, i) for i, d in enumerate(depths))  # needles[0] first at a tie
    if joiner == " ":  # RULER's essay: the runs between needles joined, then everything joined with spaces
        parts, last = [], 0
        for at, i in places:
            parts += [" ".join(sentences[last:at]), needles.needles[i]]
            last = at
        parts.append(" ".join(sentences[last:]))
    else:  # RULER's noise and needle haystacks: needles inserted between lines
        parts = list(sentences)
        for at, i in reversed(places):
            parts.insert(at, needles.needles[i])
    anchor = next(k for k, part in enumerate(parts) if part is needles.needles[0])
    context = joiner.join(parts)
    offset = sum(len(p) + len(joiner) for p in parts[:anchor])
    template, _ = ruler_question(spec, needles)
    head = template.split("{context}")[0]
    placed = placed_depth(len(sentences), len(sentences) * depth // 100, depth)
    return template.replace("{context}", context, 1), len(head) + offset, placed


def placed_depth(units: int, cut: int, asked: int) -> float:
    """Where a needle put after `cut` of a haystack's `units` sentences (or lines) sits, in percent of them, as RULER
    measures depth (`asked` when there is no haystack to place it in)."""
    return asked if units == 0 else 100 * cut / units


def haystack_words(spec: dict[str, Any], haystack: str | None) -> tuple[str, ...]:
    """The books' words for an essay haystack (the default books unless --haystack), else nothing."""
    if spec["kind"] != "ruler_niah" or spec["haystack"] != "essay":
        return ()
    return book_words(str(haystack_folder(haystack)))


def build_prompts(
    spec: dict[str, Any], needles: Needles, length: int, depths: list[int], max_new_tokens: int, encode: Encoder,
    words: tuple[str, ...] = (),
) -> list[NeedlePrompt]:  # fmt: skip
    """The prompts of one sample at `depths`, sharing the largest haystack with which every one of them, plus
    `max_new_tokens`, fits `length` tokens (RULER's rule: prompt tokens + tokens to generate <= length).

    `encode(text, answer_prefix)` gives the ids the model reads, the prompt's whole text (the task text inside a
    chat turn, say, then the answer prefix) and where the task text starts in it."""
    budget = length - max_new_tokens
    prefix = ruler_question(spec, needles)[1] if spec["kind"] == "ruler_niah" else ""
    middle = depths[len(depths) // 2]

    def size(units: int, depth: int = middle) -> tuple[np.ndarray, str, int, float, str]:
        text, at, placed = render(spec, needles, units, depth, words)
        ids, whole, start = encode(text, prefix)
        return ids, whole, start + at, placed, text + prefix

    def build(units: int) -> tuple[list[tuple], int]:
        built = [(d, *size(units, d)) for d in depths]
        return built, max(len(b[1]) for b in built) - budget

    def too_long(tokens: int) -> Exception:
        return fail(f"--lengths {length:,}: the {spec['task']} prompt without haystack is already {tokens:,} tokens, "
                    f"and {max_new_tokens:,} new tokens must fit too", "ask for longer --lengths")  # fmt: skip

    high = _largest_fitting(lambda n: len(size(n)[0]), budget)  # what fits at the middle depth
    if high < 0:
        raise too_long(len(size(0)[0]))
    built, over = build(high)
    units = high
    if over > 0:  # a depth's own tokenization came out a little longer: the largest haystack that fits at all depths
        step, low = 1, high
        while over > 0:
            if low == 0:
                raise too_long(budget + over)
            high, low = low, max(0, low - step)
            step *= 2
            built, over = build(low)
        units = low
        while high - units > 1:
            mid = (units + high) // 2
            tried, over = build(mid)
            if over <= 0:
                units, built = mid, tried
            else:
                high = mid
    _check_depths(spec["task"], length, [(d, placed) for d, _, _, _, placed, _ in built])
    return [NeedlePrompt(d, text, ids, needles.answers, at, units, asked) for d, ids, text, at, _, asked in built]


def _check_depths(task: str, length: int, placed: list[tuple[int, float]]) -> None:
    """Refuse a haystack too short to put each asked depth at its own place, near where it was asked."""
    fix = "use longer --lengths, fewer --depths, or a haystack whose sentences end in . ! ? (or their equivalents)"
    for (d1, p1), (d2, p2) in itertools.pairwise(placed):
        if d1 != d2 and p1 == p2:
            raise fail(f"{task} at --lengths {length:,}: the haystack has too few sentences to put the needle at "
                       f"depths {d1}% and {d2}% in different places (both would sit at {p1:.0f}%)", fix)  # fmt: skip
    for d, p in placed:
        if abs(p - d) > DEPTH_TOLERANCE:
            raise fail(f"{task} at --lengths {length:,}: the needle asked at depth {d}% would sit at {p:.0f}% of "
                       "the haystack, which has too few sentences to place it", fix)  # fmt: skip


def _largest_fitting(tokens: Callable[[int], int], budget: int) -> int:
    """The largest n >= 0 with tokens(n) <= budget (-1 if even 0 does not fit); tokens(n) grows about linearly, so
    interpolation finds it in a few calls (bisection takes over if it does not)."""
    low, t_low = 0, tokens(0)
    t_zero = t_low
    if t_low > budget:
        return -1
    probe, t_probe = 64, tokens(64)
    high = t_high = None
    if t_probe > budget:
        high, t_high = probe, t_probe
    else:
        low, t_low = probe, t_probe
    rate = max((t_probe - t_zero) / 64, 1e-3)
    for step in range(200):
        if high is not None and high - low <= 1:
            return low
        if high is None:
            guess = low + max(1, int((budget - t_low) / rate))
        elif step < 12:
            guess = low + int((budget - t_low) * (high - low) / max(t_high - t_low, 1))
            guess = min(max(guess, low + 1), high - 1)
        else:
            guess = (low + high) // 2
        t = tokens(guess)
        if t <= budget:
            if high is None and guess > low:
                rate = max((t - t_low) / (guess - low), 1e-3) if t > t_low else rate
            low, t_low = guess, t
        else:
            high, t_high = guess, t
    return low
