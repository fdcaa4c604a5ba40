"""BABILong's instance generator, draw for draw, seeded: bAbI facts scattered between the sentences of background
books until an instance reaches its length.

Follows booydar/babilong at 7a6efee29f5cac03c3c410e6799c80fd2ffe3610: babilong/babilong_utils.py (`get_dataset_df`
and `TaskDataset`: one sample per question; `SentenceSampler`: background sentences; `NoiseInjectionDataset`: facts
placed between them) as data/create_tasks.py drives them, with three choices made explicit:
- the samples are the bAbI file's questions in file order (the published sets hold the test questions in file
  order), the first `num_samples` of them, where create_tasks draws a shuffled subset with the unseeded global
  `np.random.shuffle` (and `TaskDataset.__len__`, one short, leaves out the last question);
- the sentence sampler draws from `np.random.default_rng(seed)` where create_tasks passes `random_seed=None`
  (fresh entropy every run); the noise injector draws from `default_rng(seed)` too (create_tasks: its default 42);
- both are made anew for every (task, length), as create_tasks makes them.
Lengths are counted with `tokenizer` (BABILong's: GPT-2's), `prompt_reserve` tokens kept for the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import fail
from .tokenizer import decode


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
        if max_facts is None or len(facts) + 1 <= max_facts:
            samples.append(BabiSample(tuple(facts), question, answer))
    return samples


class SentenceSampler:
    """Background sentences (`SentenceSampler` with shuffle=True): a random book, read from a random character on
    (at most 10 characters per token still wanted), split by an untrained Punkt tokenizer, its first and last
    sentence dropped; each sentence tokenized with a leading space, those under `min_tokens` skipped. What one
    sample leaves is where the next one starts."""

    def __init__(self, books: list[str], tokenizer: Any, min_tokens: int, seed: int):
        from nltk.tokenize.punkt import PunktSentenceTokenizer

        self.books, self.tokenizer, self.min_tokens = books, tokenizer, min_tokens
        self.gen = np.random.default_rng(seed=seed)
        self.punkt = PunktSentenceTokenizer()
        self.sentences: list[str] = []

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
            text = self.books[int(self.gen.choice(len(self.books)))]
            if not text:
                continue
            text = text[self.gen.choice(len(text)) :][: size * 10]
            sentences = (sentences + self.punkt.tokenize(text))[1:-1]
        self.sentences += sentences


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
    spec: dict[str, Any], clean_up: bool = True,
) -> list[dict[str, str]]:  # fmt: skip
    """A (task, length)'s instances as create_tasks writes them ({input, question, target}), `length` tokens of
    context (0: the facts alone) less the task's prompt reserve; `clean_up`: decoded as transformers 4.x decoded
    (`tokenizer.decode`)."""
    size = length - spec["prompt_reserve"]
    samples = read_babi(babi, size // spec["facts_per_token"] if size > 0 else None)
    if not samples:
        raise fail(f"{babi} holds no question with at most {size // spec['facts_per_token']} facts",
                   "pass longer --lengths, or another bAbI file")  # fmt: skip
    sampler = SentenceSampler(books, tokenizer, spec["min_sentence_tokens"], seed)
    gen = np.random.default_rng(seed=seed)
    chosen = samples if num_samples is None else samples[:num_samples]
    return [{"input": inject(s, sampler, tokenizer, size, gen, clean_up), "question": s.question,
             "target": decode(tokenizer, tokenizer(s.answer, add_special_tokens=False)["input_ids"], clean_up)}
            for s in chosen]  # fmt: skip
