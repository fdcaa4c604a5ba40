"""BABILong's instance generator, draw for draw, seeded: bAbI facts scattered between the sentences of background
books until an instance reaches its length.

Follows booydar/babilong at 7a6efee29f5cac03c3c410e6799c80fd2ffe3610: babilong/babilong_utils.py (`get_dataset_df`
and `TaskDataset`: one sample per question; `SentenceSampler`: background sentences; `NoiseInjectionDataset`: facts
placed between them) as data/create_tasks.py drives them, with three choices made explicit:
- the samples are the bAbI file's questions in file order but its last (`TaskDataset.__len__`, one short, leaves
  it out), the first `num_samples` of them, or those at given positions (`positions`: the published 100-instance
  sets' data/test_100_idxs.json, `published_positions`), where create_tasks draws a shuffled subset with the
  unseeded global `np.random.shuffle`;
- the sentence sampler draws from `np.random.default_rng(seed)` where create_tasks passes `random_seed=None`
  (fresh entropy every run); the noise injector draws from `default_rng(seed)` too (create_tasks: its default 42);
- both are made anew for every (task, length), as create_tasks makes them.
Lengths are counted with `tokenizer` (BABILong's: GPT-2's), `prompt_reserve` tokens kept for the prompt. Sentences
are split as BABILong's pinned nltk 3.8.1 splits them, whatever nltk is installed (`sentences`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import fail
from .data import check_instance
from .sentences import sentence_splitter
from .spec import length_tokens
from .tokenizer import decode

# Draws of a random book passage in a row that may give no usable sentence before the books are refused: a book
# gives one on nearly every draw, so only books that cannot (one long sentence, two sentences, only short ones) get
# this far.
DRAW_BUDGET = 200
PUBLISHED_FROM = 64_000  # the published 100-instance sets from 64k on hold the questions at test_100_idxs.json's


@cache
def published_positions() -> dict[str, list[int]]:
    """booydar/babilong's data/test_100_idxs.json (shipped in suites/babilong/): per task (qa1-qa5), the positions of
    the test questions its published 100-instance sets hold at 64k and above."""
    text = resources.files("megaeval.suites").joinpath("babilong", "test_100_idxs.json").read_text(encoding="utf-8")
    return json.loads(text)


def question_positions(task: str, length: str, split: str) -> list[int] | None:
    """Where a set's questions come from: the published positions for the published 100-instance sets (qa1-qa5
    from 64k on, made from the test split), else None (file order)."""
    if task in published_positions() and split == "test" and length_tokens(length) >= PUBLISHED_FROM:
        return published_positions()[task]
    return None


@dataclass(frozen=True)
class BabiSample:
    """One bAbI question with the facts before it in its story (earlier questions left out)."""

    facts: tuple[str, ...]
    question: str
    answer: str


def read_babi(path: str | Path, max_facts: int | None = None) -> list[BabiSample]:
    """A bAbI file's questions in file order, each with its story's facts before it (`get_dataset_df`); with
    `max_facts`, only samples of at most that many lines, facts and question counted."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").strip().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise fail(f"cannot read the bAbI file {path} ({getattr(e, 'strerror', None) or e})",
                   "pass --babi DIR holding the bAbI tasks (tasks_1-20_v1-2/en/qaN_*_test.txt)") from None  # fmt: skip
    samples: list[BabiSample] = []
    facts: list[str] = []
    for number, line in enumerate(lines, 1):
        head, _, text = line.partition(" ")
        if not head.isdigit() or not text:
            raise fail(f"{path} line {number} is not a bAbI line (`N text` or `N question<TAB>answer<TAB>facts`): "
                       f"{line[:60]!r}", "pass the bAbI tasks' own files")  # fmt: skip
        if int(head) == 1:
            facts = []
        elif number == 1:
            raise fail(f"{path} line 1 does not start a story (its number is {head}, not 1)",
                       "pass the bAbI tasks' own files")  # fmt: skip
        if "\t" not in text:
            facts.append(text)
            continue
        question, answer = text.split("\t")[0], text[text.index("\t") + 1 :].split("\t")[0]
        if not question.strip() or not answer.strip():
            empty = "question" if not question.strip() else "answer"
            raise fail(f"{path} line {number} has an empty {empty}: {line[:60]!r}", "pass the bAbI tasks' own files")
        if max_facts is None or len(facts) + 1 <= max_facts:
            samples.append(BabiSample(tuple(facts), question, answer))
    return samples


class SentenceSampler:
    """Background sentences (`SentenceSampler` with shuffle=True): a random book, read from a random character on
    (at most 10 characters per token still wanted), split by an untrained Punkt tokenizer, its first and last
    sentence dropped; each sentence tokenized with a leading space, those under `min_tokens` skipped. What one
    sample leaves is where the next one starts."""

    def __init__(self, books: list[str], tokenizer: Any, min_tokens: int, seed: int, source: str = "the books"):
        self.books, self.tokenizer, self.min_tokens, self.source = books, tokenizer, min_tokens, source
        self.gen = np.random.default_rng(seed=seed)
        self.punkt = sentence_splitter()
        self.sentences: list[str] = []
        self.fruitless = 0  # draws since the last usable sentence

    def get_sample(self, size: int) -> list[list[int]]:
        """Sentences' tokens until they hold `size` tokens, the last one cut to fit (a size at or below zero gives
        one empty sentence: BABILong's 0k)."""
        sample: list[list[int]] = []
        total = 0
        while True:
            for i, sentence in enumerate(self.sentences):
                tokens = self.tokenizer.encode(" " + sentence, add_special_tokens=False)
                if len(tokens) < self.min_tokens:
                    continue
                self.fruitless = 0
                total += len(tokens)
                sample.append(tokens)
                if total >= size:
                    self.sentences = self.sentences[i + 1 :]
                    cutoff = total - size
                    if cutoff > 0:
                        sample[-1] = sample[-1][:-cutoff]
                    return sample
            self.sentences = []
            self._more_sentences(size)

    def _more_sentences(self, size: int) -> None:
        sentences: list[str] = []
        while not sentences:
            self._count_draw()
            text = self.books[int(self.gen.choice(len(self.books)))]
            if not text:
                continue
            text = text[self.gen.choice(len(text)) :][: size * 10]
            sentences = (sentences + self.punkt.tokenize(text))[1:-1]
        self.sentences += sentences

    def _count_draw(self) -> None:
        self.fruitless += 1
        if self.fruitless > DRAW_BUDGET:
            raise fail(f"the background books ({self.source}) gave no sentence BABILong can use in {DRAW_BUDGET} "
                       f"draws of a random passage (one needs at least three sentences, and one of them of at least "
                       f"{self.min_tokens} tokens between the first and the last)",
                       "pass books of ordinary prose as --background")  # fmt: skip


def inject(
    sample: BabiSample, sampler: SentenceSampler, tokenizer: Any, size: int, gen: np.random.Generator, clean_up: bool
) -> str:  # fmt: skip
    """One instance's text (`NoiseInjectionDataset.__getitem__`, decoded and stripped as create_tasks writes it):
    `size` tokens of the sample's facts, each placed before a background sentence drawn at random (in order), and
    the background around them."""
    facts = tokenizer([" " + f for f in sample.facts], add_special_tokens=False)["input_ids"] if sample.facts else []
    background = sampler.get_sample(size - sum(len(f) for f in facts))
    positions = np.sort(gen.choice(range(len(background) + 1), len(facts)))
    slots: list[list[list[int]]] = [[] for _ in range(len(background) + 1)]
    for fact, at in zip(facts, positions, strict=True):
        slots[at].append(fact)
    for i, sentence in enumerate(background):
        slots[i].append(sentence)
    tokens = [t for slot in slots for piece in slot for t in piece]
    return decode(tokenizer, tokens, clean_up).strip()


def generate(
    babi: str | Path, books: list[str], tokenizer: Any, length: int, num_samples: int | None, seed: int,
    spec: dict[str, Any], clean_up: bool = True, positions: list[int] | None = None, source: str = "the books",
) -> list[dict[str, str]]:  # fmt: skip
    """A (task, length)'s instances as create_tasks writes them ({input, question, target}), `length` tokens of
    context (0: the facts alone) less the task's prompt reserve; `clean_up`: decoded as transformers 4.x decoded
    (`tokenizer.decode`); `positions`: the questions at these places (else in file order), the first `num_samples`
    of them (or all); `source` names the books in a refusal."""
    size = length - spec["prompt_reserve"]
    chosen = choose(babi, read_babi(babi, size // spec["facts_per_token"] if size > 0 else None), size, spec,
                    num_samples, positions)  # fmt: skip
    sampler = SentenceSampler(books, tokenizer, spec["min_sentence_tokens"], seed, source)
    gen = np.random.default_rng(seed=seed)
    records = []
    for s in chosen:
        record = {
            "input": inject(s, sampler, tokenizer, size, gen, clean_up),
            "question": s.question,
            "target": decode(tokenizer, tokenizer(s.answer, add_special_tokens=False)["input_ids"], clean_up),
        }
        records.append(check_instance(record, spec, f"{babi}, question {len(records) + 1}"))  # fmt: skip
    return records


def choose(babi: str | Path, samples: list[BabiSample], size: int, spec: dict[str, Any], num_samples: int | None,
           positions: list[int] | None) -> list[BabiSample]:  # fmt: skip
    """The samples an instance set is made of: those at `positions` if given, else in file order; the first
    `num_samples` of them, or without it TaskDataset's (every question but the last: its `__len__` is one short, so
    create_tasks never draws the last); fewer than asked for is refused."""
    if positions is not None:
        beyond = [p for p in positions if p >= len(samples)]
        if beyond:
            raise fail(f"{babi} holds {len(samples)} questions, but the published positions go to {max(beyond)}",
                       "pass bAbI's full test file (1,000 questions)")  # fmt: skip
        samples = [samples[p] for p in positions]
    elif num_samples is None:
        samples = samples[:-1]
    if not samples:
        limit = f" with at most {size // spec['facts_per_token']} facts" if size > 0 else ""
        raise fail(f"{babi} holds no question{limit} but its last, which BABILong's TaskDataset leaves out",
                   "pass longer --lengths, or another bAbI file")  # fmt: skip
    if num_samples is not None and num_samples > len(samples):
        if positions is not None:
            raise fail(f"--num-samples {num_samples}: the published set holds the {len(samples)} questions at "
                       "test_100_idxs.json's positions (qa1-qa5 from 64k on)",
                       f"pass --num-samples {len(samples)} or fewer")  # fmt: skip
        raise fail(f"--num-samples {num_samples}: {babi} holds {len(samples)} questions",
                   f"pass --num-samples {len(samples)} or fewer, or leave it out for all of them")  # fmt: skip
    return samples if num_samples is None else samples[:num_samples]
