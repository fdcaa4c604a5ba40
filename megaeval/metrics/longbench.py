"""LongBench's scoring, equal to the official scorer's (THUDM/LongBench at 2e00731): the v1 metrics of
`LongBench/metrics.py`, the per-item rule, task score and LongBench-E buckets of `LongBench/eval.py`, and v2's
answer extraction (`pred.py` `extract_answer`) and table (`result.py`).

Exactness rules, each a place where the official behaviour is not the obvious one:

- `rouge` is ROUGE-L F of the PyPI `rouge` 1.0.1 package (what the official calls), 0.0 on any exception. That
  package splits a text into sentences at every "." (pieces of length 0 dropped, each piece's whitespace runs
  collapsed to one space: a piece of only spaces becomes the sentence ""), sentences into words at " ", and counts
  words as *sets*: m and n are the distinct words of the reference and the prediction, and the overlap is the size of
  the union, over every (reference sentence, prediction sentence) pair, of the words on one LCS back-trace (the
  reference's words; on a mismatch the trace moves up when table[i-1][j] > table[i][j-1], else left: ties go left).
  F = 2 * (P * R) / (P + R + 1e-8). No sentence on either side raises (0.0): "", "...".
- Its back-trace is recursive: one Python frame per step plus one, on top of the frames below it. A trace whose
  frames pass the interpreter's recursion limit raises RecursionError, which the official turns into 0.0. Here the
  trace is walked iteratively and a pair whose trace takes more than `ROUGE_MAX_TRACE` steps (`rouge`) or
  `ROUGE_ZH_MAX_TRACE` (`rouge_zh`, one frame deeper) scores 0.0. Measured by running the official `eval.py` as a
  script (`python eval.py`, CPython 3.11, sys.getrecursionlimit() == 1000) on one-sentence texts of n equal words,
  whose trace is n steps: gov_report scores n = 990 and gives 0.0 at 991; vcsum scores 989 and gives 0.0 at 990.
  That is 1000 frames at most = 9 (eval.py's module, scorer, rouge_score, get_scores, _get_avg_scores, the metric
  lambda, rouge_l_summary_level, _union_lcs, _recon_lcs; + rouge_zh_score for vcsum) + steps + 1.
- `code_sim` is fuzzywuzzy 0.18's `fuzz.ratio` without python-Levenshtein: 0 for None, 100 for equal strings, 0 when
  one is empty, else int(round(100 * difflib.SequenceMatcher(None, a, b).ratio())) (autojunk on); then / 100.
- `classification` drops matched class names contained in (and unequal to) the reference while iterating over the
  same list, so the name right after a dropped one is never examined; kept as is.
- `qa_f1_zh` and `rouge_zh` segment with jieba (`jieba.cut(text, cut_all=False)`), imported on first use.
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Callable
from difflib import SequenceMatcher
from functools import cache

import numpy as np

from megaeval.errors import fail

RECURSION_LIMIT = 1000  # CPython's default sys.getrecursionlimit(), which the official runs under
ROUGE_MAX_TRACE = RECURSION_LIMIT - 9 - 1  # 990 back-trace steps: the most `python eval.py` survives (docstring)
ROUGE_ZH_MAX_TRACE = ROUGE_MAX_TRACE - 1  # rouge_zh_score is one more frame

GROUPS: dict[str, tuple[str, ...]] = {
    "Single-Doc QA": ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"),
    "Multi-Doc QA": ("hotpotqa", "2wikimqa", "musique", "dureader"),
    "Summarization": ("gov_report", "qmsum", "multi_news", "vcsum"),
    "Few-shot Learning": ("trec", "triviaqa", "samsum", "lsht"),
    "Code Completion": ("lcc", "repobench-p"),
    "Synthetic Tasks": ("passage_count", "passage_retrieval_en", "passage_retrieval_zh"),
}
ZH_TASKS = frozenset({"multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"})
CODE_TASKS = frozenset(GROUPS["Code Completion"])

# Characters the Chinese normalisation deletes besides ASCII punctuation: full-width forms, CJK brackets and marks,
# dashes, curly quotes, ellipsis (inclusive code-point ranges; 《 U+300A and ． U+FF0E are not among them).
_ZH_RANGES = ((0x2013, 0x2014), (0x2018, 0x2019), (0x201B, 0x201F), (0x2026, 0x2027), (0x3001, 0x3003),
              (0x300B, 0x3011), (0x3014, 0x301F), (0x3030, 0x3030), (0x303E, 0x303F), (0xFE4F, 0xFE4F),
              (0xFF01, 0xFF0D), (0xFF0F, 0xFF0F), (0xFF1A, 0xFF20), (0xFF3B, 0xFF40), (0xFF5B, 0xFF64))  # fmt: skip
_EN_PUNCT = frozenset(string.punctuation)
ZH_PUNCT = _EN_PUNCT | {chr(c) for lo, hi in _ZH_RANGES for c in range(lo, hi + 1)}
_ARTICLE = re.compile(r"\b(a|an|the)\b")


@cache
def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its "Building prefix dict ..." lines go to stderr at DEBUG
    return jieba


def _segment(text: str) -> list[str]:
    return list(_jieba().cut(text, cut_all=False))


def _f1(prediction: list[str], reference: list[str]) -> float:
    same = sum((Counter(prediction) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction)
    recall = same / len(reference)
    return (2 * precision * recall) / (precision + recall)


def normalize_en(text: str) -> str:
    """SQuAD-style: lower-case, drop ASCII punctuation, then the words a/an/the, then collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _EN_PUNCT)
    return " ".join(_ARTICLE.sub(" ", text).split())


def normalize_zh(text: str) -> str:
    """Lower-case, drop ASCII and Chinese punctuation (ZH_PUNCT), then every whitespace character."""
    return "".join("".join(ch for ch in text.lower() if ch not in ZH_PUNCT).split())


def qa_f1(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """Token F1 of the normalised texts split at whitespace."""
    return _f1(normalize_en(prediction).split(), normalize_en(reference).split())


def qa_f1_zh(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """Token F1 over jieba's words, each normalised (normalize_zh), the emptied ones dropped."""

    def words(text: str) -> list[str]:
        return [w for w in map(normalize_zh, _segment(text)) if w]

    return _f1(words(prediction), words(reference))


def _numbers_score(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return sum(n == target for n in numbers) / len(numbers) if numbers else 0.0


def count(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """The share of the prediction's numbers that equal the reference."""
    return _numbers_score(prediction, str(reference))


def _retrieval(pattern: str) -> Callable[[str, str, list[str] | None], float]:
    def score(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
        found = re.findall(pattern, reference)
        if not found:  # the official fails with IndexError here
            raise fail(f"LongBench retrieval reference {reference!r} names no paragraph", "check the task's answers")
        return _numbers_score(prediction, found[0])

    score.__doc__ = f"The share of the prediction's numbers equal to the paragraph number in the reference ({pattern})."
    return score


PARAGRAPH = {"retrieval": r"Paragraph (\d+)", "retrieval_zh": r"段落(\d+)"}  # what a retrieval answer names
retrieval = _retrieval(PARAGRAPH["retrieval"])
retrieval_zh = _retrieval(PARAGRAPH["retrieval_zh"])


def fuzz_ratio(a: str | None, b: str | None) -> int:
    """fuzzywuzzy 0.18 `fuzz.ratio` on difflib (no python-Levenshtein): its three guards, then the rounded ratio."""
    if a is None or b is None:
        return 0
    if a == b:
        return 100
    if len(a) == 0 or len(b) == 0:
        return 0
    return int(round(100 * SequenceMatcher(None, a, b).ratio()))


def code_sim(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """fuzz_ratio / 100 of the reference and the prediction's first line free of "`", "#" and "//" ("" if none)."""
    lines = prediction.lstrip("\n").split("\n")
    first = next((line for line in lines if "`" not in line and "#" not in line and "//" not in line), "")
    return fuzz_ratio(first, reference) / 100


def classification(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """1 / (number of class names matched) when the reference is among them, else 0.0 (module docstring)."""
    if all_classes is None:
        raise fail("LongBench classification needs the task's all_classes", "pass the class names")
    matched = [name for name in all_classes if name in prediction]
    i = 0
    while i < len(matched):  # a removal shifts the next name into slot i, which is then skipped (as the official)
        name = matched[i]
        if name in reference and name != reference:
            matched.remove(name)  # the first equal entry, as list.remove does
        i += 1
    return 1.0 / len(matched) if reference in matched else 0.0


def _sentences(text: str) -> list[str]:
    return [" ".join(piece.split()) for piece in text.split(".") if len(piece) > 0]


def _lcs_table(a: np.ndarray, b: np.ndarray, keep_from: int) -> np.ndarray:
    """LCS lengths of every prefix of `a` against the prefixes of `b` of length >= keep_from: row i is a[:i]."""
    table = np.zeros((len(a) + 1, len(b) + 1 - keep_from), dtype=np.int32)
    row = np.zeros(len(b) + 1, dtype=np.int32)
    for i, word in enumerate(a, 1):
        # a match extends the diagonal; otherwise the cell above; then the running maximum along the row
        step = np.where(b == word, row[:-1] + 1, row[1:])
        row = np.concatenate(([0], np.maximum.accumulate(step)))
        table[i] = row[keep_from:]
    return table


def _trace_words(ref: list[str], hyp: list[str], max_steps: int) -> set[str] | None:
    """The reference words on the official's LCS back-trace of (ref, hyp), or None past `max_steps` steps."""
    n, m = len(ref), len(hyp)
    if min(n, m) > max_steps:  # a trace ends when i or j reaches 0: at least min(n, m) steps
        return None
    if n * m <= 4096:  # small: plain lists are faster than numpy
        rows = [[0] * (m + 1)]
        for word in ref:
            prev, cur = rows[-1], [0]
            for j, other in enumerate(hyp, 1):
                cur.append(prev[j - 1] + 1 if word == other else max(prev[j], cur[j - 1]))
            rows.append(cur)

        def cell(i: int, j: int) -> int:
            return rows[i][j]
    else:  # loop over the shorter side; keep only the cells a trace of max_steps can reach on the longer one
        ids: dict[str, int] = {}
        r = np.array([ids.setdefault(w, len(ids)) for w in ref])
        h = np.array([ids.setdefault(w, len(ids)) for w in hyp])
        flip = n > m
        lo = max(0, (n if flip else m) - max_steps - 1)
        table = _lcs_table(h, r, lo) if flip else _lcs_table(r, h, lo)

        def cell(i: int, j: int) -> int:
            return int(table[j, i - lo] if flip else table[i, j - lo])

    words: set[str] = set()
    i, j, steps = n, m, 0
    while i > 0 and j > 0:
        steps += 1
        if steps > max_steps:
            return None
        if ref[i - 1] == hyp[j - 1]:
            words.add(ref[i - 1])
            i, j = i - 1, j - 1
        elif cell(i - 1, j) > cell(i, j - 1):
            i -= 1
        else:
            j -= 1
    return words


def rouge_l(prediction: str, reference: str, max_trace: int = ROUGE_MAX_TRACE) -> float:
    """The `rouge` package's summary-level ROUGE-L F (module docstring), 0.0 where the official raises."""
    hyp, ref = _sentences(prediction), _sentences(reference)
    if not hyp or not ref:
        return 0.0
    union: set[str] = set()
    for ref_sentence in ref:
        for hyp_sentence in hyp:
            words = _trace_words(ref_sentence.split(" "), hyp_sentence.split(" "), max_trace)
            if words is None:
                return 0.0
            union |= words
    m = len({w for s in ref for w in s.split(" ")})
    n = len({w for s in hyp for w in s.split(" ")})
    recall, precision = len(union) / m, len(union) / n
    return 2.0 * ((precision * recall) / (precision + recall + 1e-8))


def rouge(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """ROUGE-L F as the official `rouge_score` (rouge_l)."""
    return rouge_l(prediction, reference, ROUGE_MAX_TRACE)


def rouge_zh(prediction: str, reference: str, all_classes: list[str] | None = None) -> float:
    """ROUGE-L F of the texts' jieba words joined by spaces, as the official `rouge_zh_score`."""
    return rouge_l(" ".join(_segment(prediction)), " ".join(_segment(reference)), ROUGE_ZH_MAX_TRACE)


METRICS: dict[str, Callable[[str, str, list[str] | None], float]] = {
    "qa_f1": qa_f1, "qa_f1_zh": qa_f1_zh, "rouge": rouge, "rouge_zh": rouge_zh, "classification": classification,
    "retrieval": retrieval, "retrieval_zh": retrieval_zh, "count": count, "code_sim": code_sim,
}  # fmt: skip


def unscorable(metric: str, answers: list[str], all_classes: list[str] | None) -> str | None:
    """Why `metric` could not score an item with these references (the official fails, or scores every
    prediction 0), or None: a classification item needs its task's class names, a retrieval answer its paragraph."""
    if metric == "classification" and not all_classes:
        return f"`all_classes` is {all_classes!r}; the classification metric needs the task's class names"
    if metric in PARAGRAPH:
        bad = next((a for a in answers if not re.search(PARAGRAPH[metric], a)), None)
        if bad is not None:
            return f"the answer {bad!r:.60} names no paragraph ({PARAGRAPH[metric]}); {metric} scores by its number"
    return None


def score_prediction(
    metric: str, prediction: str, answers: list[str], all_classes: list[str] | None, first_line: bool
) -> float:
    """eval.py's score of one item: the best metric value over its answers (from 0.0); with first_line, of the
    prediction's first line once leading newlines are dropped (the task file's `first_line`: trec, triviaqa, samsum,
    lsht)."""
    if metric not in METRICS:
        raise fail(f"unknown LongBench metric {metric!r}", f"use one of {', '.join(METRICS)}")
    if first_line:
        prediction = prediction.lstrip("\n").split("\n")[0]
    score = 0.0
    for answer in answers:
        score = max(score, METRICS[metric](prediction, answer, all_classes))
    return score


def task_score(scores: list[float]) -> float:
    """eval.py's task figure: 100 x the mean item score (summed in order), rounded to 2 decimals."""
    if not scores:
        raise fail("no LongBench item scores to average", "score at least one prediction")
    total = 0.0
    for s in scores:
        total += s
    return round(100 * total / len(scores), 2)


BUCKETS = ("0-4k", "4-8k", "8k+")  # LongBench-E's length buckets (words; characters in Chinese)


def length_buckets(scores: list[float], lengths: list[int]) -> dict[str, float | None]:
    """LongBench-E's figures (eval.py `scorer_e`): round(100 * np.mean, 2) over items of length < 4000, < 8000 and
    the rest. An empty bucket is None here (NaN in the official)."""
    if len(scores) != len(lengths):
        raise fail(f"{len(scores)} LongBench scores but {len(lengths)} lengths", "give one length per score")
    buckets: dict[str, list[float]] = {b: [] for b in BUCKETS}
    for score, length in zip(scores, lengths, strict=True):
        buckets["0-4k" if length < 4000 else "4-8k" if length < 8000 else "8k+"].append(score)
    # round() of numpy's float64 (numpy's rounding) of numpy's pairwise mean, exactly as the official
    return {k: float(round(100 * np.mean(v), 2)) if v else None for k, v in buckets.items()}


def leaderboard(task_scores: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """The README leaderboard: per language, each category's mean over its present tasks of that language (code
    tasks count for both), and "Avg", the mean of the present categories; None where nothing is present."""
    out: dict[str, dict[str, float | None]] = {}
    for language in LANGUAGES:
        row: dict[str, float | None] = {}
        for category in GROUPS:
            mine = [task_scores[t] for t in category_tasks(language, category) if t in task_scores]
            row[category] = sum(mine) / len(mine) if mine else None
        present = [v for v in row.values() if v is not None]
        out[language] = {"Avg": sum(present) / len(present) if present else None, **row}
    return out


LANGUAGES = ("English", "Chinese")


def category_tasks(language: str, category: str) -> list[str]:
    """The tasks of a leaderboard category in a language's row (code tasks count for both)."""
    return [t for t in GROUPS[category] if t in CODE_TASKS or (t in ZH_TASKS) == (language == "Chinese")]


def leaderboard_missing(tasks: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per language, each leaderboard category that lacks some of its tasks (`tasks`: those scored), with the tasks
    it lacks: its mean, and the language's "Avg", are over part of LongBench only."""
    return {language: {category: missing for category in GROUPS
                       if (missing := [t for t in category_tasks(language, category) if t not in tasks])}
            for language in LANGUAGES}  # fmt: skip


_ANSWER_PAREN = re.compile(r"The correct answer is \(([A-D])\)")
_ANSWER_BARE = re.compile(r"The correct answer is ([A-D])")


def extract_answer(response: str) -> str | None:
    """LongBench v2's choice letter: with every "*" removed, "The correct answer is (X)", else "... is X"."""
    response = response.replace("*", "")
    match = _ANSWER_PAREN.search(response) or _ANSWER_BARE.search(response)
    return match.group(1) if match else None


def v2_figures(records: list[dict], compensated: bool = False) -> dict[str, float | None]:
    """result.py's row: 100 x accuracy rounded to 1 decimal, overall and by difficulty ("easy", else hard) and
    length ("short", "medium", else long). `compensated` counts a record whose `pred` is None as 0.25 right. A
    figure whose group is empty (ZeroDivisionError in the official) is None."""
    n = dict.fromkeys(("easy", "hard", "short", "medium", "long"), 0)
    right: dict[str, float] = dict.fromkeys(n, 0)
    for record in records:
        acc: float = int(record["judge"])
        if compensated and record["pred"] is None:
            acc = 0.25
        for group in ("easy" if record["difficulty"] == "easy" else "hard",
                      record["length"] if record["length"] in ("short", "medium") else "long"):  # fmt: skip
            n[group] += 1
            right[group] += acc

    def figure(acc: float, total: int) -> float | None:
        return round(100 * acc / total, 1) if total else None

    out = {"overall": figure(right["easy"] + right["hard"], len(records))}
    return out | {group: figure(right[group], n[group]) for group in n}
