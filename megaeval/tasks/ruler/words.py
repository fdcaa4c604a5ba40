"""RULER's word tasks, generated record for record as RULER generates them: cwe (common words extraction: which
words of a numbered list occur most often) and fwe (frequent words extraction: the most frequent coded words of a
Zipf-distributed text).

From NVIDIA/RULER at c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a, scripts/data/synthetic/common_words_extraction.py and
freq_words_extraction.py, with the arguments of scripts/synthetic.yaml and those scripts' defaults. RULER runs each
task in a fresh process after `random.seed(seed)` (and `np.random.seed(seed)`, which neither task draws from); here
one `random.Random(seed)` is that stream, drawn from in RULER's order (the estimate, the search, each sample), and a
fresh `random.Random(seed)` shuffles wherever RULER makes one.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import Any

import numpy as np

from ...errors import MegaevalError, fail
from .fitting import draw_fitting, largest_fitting, ruler_record
from .inputs import RulerInputs, TokenCounter, wonderwords_words

CWE_INCREMENTAL = 10  # sys_word_pair_random's step
CWE_ESTIMATE_WORDS = 4096  # the word count RULER measures tokens per word at
CWE_SMALL_BELOW = 4096  # below this max_seq_length RULER switches to its smaller setting
CWE_MAX_LISTED = 50_000_000  # words listed in one prompt (with repeats) past which memory runs out
CWE_DEFAULTS = {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}
FWE_DEFAULTS = {"alpha": 2.0, "coded_wordlen": 6, "vocab_size": -1}
FWE_WORDS_PER_VOCAB = 50  # vocab_size -1: one coded word per 50 tokens of the budget
FWE_STEPS = 32  # fwe steps its word count by a 32nd of the budget

# Bernoulli numbers B_2, B_4, ..., B_20 for the Euler-Maclaurin tail of zeta
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510, 43867 / 798, -174611 / 330)


# cwe ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Cwe:
    """One cwe run: the prompt template, RULER's counts, the word lists and the random stream."""

    task: str
    length: int
    template: str
    num_cw: int
    freq_cw: int
    freq_ucw: int
    num_fewshot: int
    words: list[str]
    english_words: list[str] | None
    seed: int
    rng: Random


def generate_cwe(
    spec: dict[str, Any], count_tokens: TokenCounter, max_seq_length: int, num_samples: int, seed: int,
    inputs: RulerInputs,
) -> list[dict[str, Any]]:  # fmt: skip
    """RULER's cwe records (common_words_extraction.py under prepare.py's base template)."""
    args = {**CWE_DEFAULTS, **spec["args"]}
    cwe = _Cwe(
        task=spec.get("task", "cwe"),
        length=max_seq_length,
        template=spec["template"] + spec["answer_prefix"],
        num_cw=int(args["num_cw"]),
        freq_cw=int(args["freq_cw"]),
        freq_ucw=int(args["freq_ucw"]),
        num_fewshot=int(args["num_fewshot"]),
        words=cwe_words(seed),
        english_words=inputs.english_words,
        seed=seed,
        rng=Random(seed),
    )
    to_generate = spec["tokens_to_generate"]

    def total_tokens(text: str) -> int:
        return count_tokens(text) + to_generate

    def attempt(num_words: int) -> tuple[tuple[str, list[str]], int]:
        text, answer = _cwe_input(cwe, num_words)
        return (text, answer), total_tokens(text)

    if total_tokens(_cwe_prompt(cwe, "")) > max_seq_length:  # RULER would retry its smallest list for ever
        raise _too_short(cwe.task, max_seq_length, f"its template and {to_generate} tokens to generate are longer")
    _check_cwe_sizes(cwe, to_generate)
    num_words = _cwe_num_words(cwe, count_tokens, total_tokens, max_seq_length)
    if num_words < cwe.num_cw:
        raise _too_short(cwe.task, max_seq_length, f"its list fits {num_words} words, fewer than args.num_cw "
                         f"{cwe.num_cw}")  # fmt: skip
    records = []
    for index in range(num_samples):
        (text, answer), length = draw_fitting(attempt, num_words, CWE_INCREMENTAL, max_seq_length, cwe.task)
        records.append(ruler_record(index, text, answer, length, spec["answer_prefix"]))
    return records


def _check_cwe_sizes(cwe: _Cwe, to_generate: int) -> None:
    """Refuse, before drawing, arguments whose smallest prompt lists more words than the length has tokens (each
    listed word takes at least one), or whose lists hold fewer words than the num_cw common ones asked for."""
    small = cwe.length < CWE_SMALL_BELOW
    shot_words, shot_cw, shot_ucw = (20, 3, 1) if small else (40, 10, 3)
    cw, ucw = (6, 1) if small else (cwe.freq_cw, cwe.freq_ucw)
    if cwe.num_fewshot and cwe.num_cw > shot_words:
        raise fail(f"{cwe.task} at length {cwe.length}: args.num_cw {cwe.num_cw} asks for more common words than its "
                   f"few-shot lists of {shot_words} words hold", f"use args.num_cw up to {shot_words}")  # fmt: skip
    shots = cwe.num_fewshot * (cwe.num_cw * shot_cw + (shot_words - cwe.num_cw) * shot_ucw)
    listed = shots + cwe.num_cw * cw + max(CWE_INCREMENTAL - cwe.num_cw, 1) * ucw
    if listed + to_generate > cwe.length:
        args = "num_fewshot, num_cw" + ("" if small else ", freq_cw, freq_ucw")
        raise fail(f"{cwe.task} cannot be generated at length {cwe.length}: its smallest prompt lists {listed:,} "
                   f"words (args {args}), each at least a token, and {to_generate} tokens are to be generated",
                   f"lower args {args} in the task file, or use a longer length")  # fmt: skip
    estimating = shots + cwe.num_cw * cw + max(CWE_ESTIMATE_WORDS - cwe.num_cw, 0) * ucw
    if estimating > CWE_MAX_LISTED:  # the list RULER measures tokens per word with would not fit in memory
        raise fail(f"{cwe.task}: RULER's estimate lists {CWE_ESTIMATE_WORDS} words {estimating:,} times with these "
                   "args (num_fewshot, num_cw, freq_cw, freq_ucw)", "lower them in the task file")  # fmt: skip


def cwe_words(seed: int) -> list[str]:
    """cwe's word list: wonderwords' nouns, adjectives and verbs, deduplicated, sorted, shuffled by a fresh
    Random(seed)."""
    words = sorted(set(wonderwords_words("nounlist.txt") + wonderwords_words("adjectivelist.txt")
                       + wonderwords_words("verblist.txt")))  # fmt: skip
    Random(seed).shuffle(words)
    return words


def _cwe_num_words(
    cwe: _Cwe, count_tokens: TokenCounter, total_tokens: Callable[[str], int], max_seq_length: int
) -> int:
    """The word count RULER's search settles on: tokens per word measured at 4096 words, then a binary search up to
    twice the words that estimate allows."""
    sample, _ = _cwe_input(cwe, CWE_ESTIMATE_WORDS)
    tokens_per_word = count_tokens(sample) / CWE_ESTIMATE_WORDS
    upper = max(int(max_seq_length // tokens_per_word) * 2, CWE_INCREMENTAL * 2)
    found = largest_fitting(lambda n: total_tokens(_cwe_input(cwe, n)[0]), CWE_INCREMENTAL, upper, max_seq_length)
    return CWE_INCREMENTAL if found is None else found


def _cwe_input(cwe: _Cwe, num_words: int) -> tuple[str, list[str]]:
    """RULER's cwe prompt with `num_words` distinct words, after its few-shot examples; and the common words."""
    if cwe.length < CWE_SMALL_BELOW:  # RULER's smaller setting ignores freq_cw and freq_ucw
        shots = [_cwe_example(cwe, 20, 3, 1) for _ in range(cwe.num_fewshot)]
        context, answer = _cwe_example(cwe, num_words, 6, 1)
    else:
        shots = [_cwe_example(cwe, 40, 10, 3) for _ in range(cwe.num_fewshot)]
        context, answer = _cwe_example(cwe, num_words, cwe.freq_cw, cwe.freq_ucw)
    shown = [_cwe_prompt(cwe, shot) + " " + _numbered(common) for shot, common in shots]
    return "\n".join(shown) + "\n" + _cwe_prompt(cwe, context), answer


def _cwe_example(cwe: _Cwe, num_words: int, common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
    """A shuffled numbered list of `num_words` random words, the first num_cw of them repeated `common_repeats`
    times and the rest `uncommon_repeats` times; and those common words."""
    pool = cwe.words if num_words <= len(cwe.words) else _english_words(cwe, num_words)
    chosen = cwe.rng.sample(pool, num_words)
    common, uncommon = chosen[: cwe.num_cw], chosen[cwe.num_cw :]
    listed = common * common_repeats + uncommon * uncommon_repeats
    Random(cwe.seed).shuffle(listed)
    return _numbered(listed), common


def _english_words(cwe: _Cwe, num_words: int) -> list[str]:
    """RULER's english_words.json values, where cwe needs more distinct words than wonderwords has."""
    where = f"{cwe.task} at length {cwe.length} needs {num_words} distinct words"
    if cwe.english_words is None:
        raise fail(f"{where}, more than wonderwords' {len(cwe.words)}: RULER then draws from its english_words.json",
                   "pass that file with --english-words FILE")  # fmt: skip
    if num_words > len(cwe.english_words):
        raise fail(f"{where}, and the english words file holds {len(cwe.english_words)}",
                   "pass RULER's english_words.json with --english-words FILE, or use a shorter length")  # fmt: skip
    return cwe.english_words


def _cwe_prompt(cwe: _Cwe, context: str) -> str:
    return cwe.template.format(num_cw=cwe.num_cw, context=context, query="")


def _numbered(words: list[str]) -> str:
    """RULER's "1. word 2. word ..." list."""
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


# fwe ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Fwe:
    """One fwe run: the prompt template, the token budget of the prompt, RULER's settings and the random stream."""

    task: str
    length: int
    template: str
    count_tokens: TokenCounter
    budget: int
    coded_wordlen: int
    vocab_size: int
    step: int
    alpha: float
    seed: int
    rng: Random


def generate_fwe(
    spec: dict[str, Any], count_tokens: TokenCounter, max_seq_length: int, num_samples: int, seed: int,
    inputs: RulerInputs,
) -> list[dict[str, Any]]:  # fmt: skip
    """RULER's fwe records (freq_words_extraction.py under prepare.py's base template)."""
    args = {**FWE_DEFAULTS, **spec["args"]}
    task, to_generate = spec.get("task", "fwe"), spec["tokens_to_generate"]
    budget = max_seq_length - to_generate
    vocab_size = int(args["vocab_size"])
    if vocab_size == -1:
        vocab_size = budget // FWE_WORDS_PER_VOCAB
    if vocab_size < 1:
        raise _too_short(task, max_seq_length, "RULER's vocabulary (one coded word per 50 tokens) is empty")
    if vocab_size > 26 ** int(args["coded_wordlen"]):  # drawing distinct words would go on for ever
        raise fail(f"{task} at length {max_seq_length} needs {vocab_size:,} distinct coded words (vocab_size -1: one "
                   f"per 50 tokens), more than {args['coded_wordlen']} letters make",
                   "raise args.coded_wordlen or set args.vocab_size in the task file")  # fmt: skip
    fwe = _Fwe(
        task=task,
        length=max_seq_length,
        template=spec["template"] + spec["answer_prefix"],
        count_tokens=count_tokens,
        budget=budget,
        coded_wordlen=int(args["coded_wordlen"]),
        vocab_size=vocab_size,
        step=budget // FWE_STEPS,
        alpha=float(args["alpha"]),  # RULER's argparse type: k ** -alpha must be a float power
        seed=seed,
        rng=Random(seed),
    )
    _, _, num_example_words = _fwe_input(fwe, -1)
    records = []
    for index in range(num_samples):
        text, answer, _ = _fwe_input(fwe, num_example_words)
        length = count_tokens(text) + to_generate
        records.append(ruler_record(index, text, answer, length, spec["answer_prefix"]))
    if vocab_size < 2:  # the instance would have no answer word
        raise _too_short(task, max_seq_length, "RULER's vocabulary (one coded word per 50 tokens) holds only the "
                         "noise word '...', and no word to answer with")  # fmt: skip
    return records


def _fwe_input(fwe: _Fwe, num_words: int) -> tuple[str, list[str], int]:
    """RULER's generate_input_output: a fresh vocabulary, then the word count stepped down from `num_words` until
    the prompt fits, or (num_words <= 0) stepped up from budget/wordlen until it no longer does, less one step."""
    vocab = _fwe_vocab(fwe)
    if num_words > 0:
        text, answer = _fwe_text(fwe, vocab, num_words)
        while fwe.count_tokens(text) > fwe.budget:
            if num_words <= 0 or fwe.step == 0:  # the text no longer changes
                raise _too_short(fwe.task, fwe.length, "its template and the tokens to generate are longer")
            num_words -= fwe.step
            text, answer = _fwe_text(fwe, vocab, num_words)
    else:
        num_words = fwe.budget // fwe.coded_wordlen
        text, answer = _fwe_text(fwe, vocab, num_words)
        while fwe.count_tokens(text) < fwe.budget:
            if fwe.step == 0:
                raise _too_short(fwe.task, fwe.length, "RULER's step (1/32 of the budget) is 0 tokens")
            num_words += fwe.step
            text, answer = _fwe_text(fwe, vocab, num_words)
        num_words -= fwe.step
    text, answer = _fwe_text(fwe, vocab, num_words)
    return text, answer, num_words


def _fwe_vocab(fwe: _Fwe) -> list[str]:
    """vocab_size distinct random lowercase words, sorted, shuffled by a fresh Random(seed), the first made '...'
    (RULER's noise, the most frequent word)."""
    letters = string.ascii_lowercase
    vocab = ["".join(fwe.rng.choices(letters, k=fwe.coded_wordlen)) for _ in range(fwe.vocab_size)]
    while len(set(vocab)) < fwe.vocab_size:
        vocab.append("".join(fwe.rng.choices(letters, k=fwe.coded_wordlen)))
    vocab = sorted(set(vocab))
    Random(fwe.seed).shuffle(vocab)
    vocab[0] = "..."
    return vocab


def _fwe_text(fwe: _Fwe, vocab: list[str], num_words: int) -> tuple[str, list[str]]:
    """The prompt whose context holds the k-th word num_words * k^-alpha / zeta(alpha) times (truncated), shuffled
    by a fresh Random(seed); and the three most frequent words after the noise."""
    ranks = np.arange(1, len(vocab) + 1)
    # numpy as RULER computes it, so the counts agree bit for bit
    counts = (num_words * (ranks**-fwe.alpha) / zeta(fwe.alpha)).astype(int).tolist()
    words = [word for word, count in zip(vocab, counts, strict=True) for _ in range(count)]
    Random(fwe.seed).shuffle(words)
    return fwe.template.format(context=" ".join(words), query=""), vocab[1:4]


def zeta(s: float) -> float:
    """The Riemann zeta function for s > 1 (what RULER takes from scipy.special.zeta): scipy's value bit for bit
    at RULER's s = 2, within a few units in the last place elsewhere."""
    if not s > 1:
        raise ValueError(f"zeta({s}) diverges; the Zipf exponent must be above 1")
    if s == 2:
        return math.pi**2 / 6  # equals scipy.special.zeta(2.0) exactly
    # Euler-Maclaurin: the first n - 1 terms, the rest as an integral, half a term and Bernoulli corrections
    n = 10
    head = math.fsum(k**-s for k in range(1, n))
    tail = [n ** (1 - s) / (s - 1), n**-s / 2]
    rising, power, factorial = s, n ** (-s - 1), 2.0  # s(s+1)...(s+2j-2), n^(-s-2j+1), (2j)!
    for j, bernoulli in enumerate(_BERNOULLI, start=1):
        tail.append(bernoulli / factorial * rising * power)
        rising *= (s + 2 * j - 1) * (s + 2 * j)
        power /= n * n
        factorial *= (2 * j + 1) * (2 * j + 2)
    return math.fsum([head, *tail])


def _too_short(task: str, length: int, reason: str) -> MegaevalError:
    """The one line for a length RULER cannot fill (where its script would loop for ever or crash)."""
    return fail(f"{task} cannot be generated at length {length}: {reason}", "use a longer length")
