"""What needles hide in: the books haystack (RULER's "essay", from public-domain books), sentence splitting, and
the random keys and values of RULER's needles."""

from __future__ import annotations

import functools
import re
import uuid
from pathlib import Path
from random import Random

from ...data_prep.book_sources import folder_books, read_book
from ...errors import fail
from ..data import shipped_books

# RULER's depths for the needles it does not ask about: round(linspace(0, 100, 40)), as niah.py computes them.
RULER_DEPTHS = tuple(round(i * 100 / 39) for i in range(40))

# Keys of type "words" are adjective-noun pairs, as RULER draws them (from wonderwords' lists; these are ours).
ADJECTIVES = (
    "abundant", "agreeable", "alert", "ancient", "anxious", "bitter", "bold", "brave", "bright", "broad", "calm",
    "careful", "cheerful", "clever", "cloudy", "clumsy", "curious", "damp", "dark", "deep", "distant", "dusty",
    "eager", "early", "elegant", "empty", "faint", "fancy", "fierce", "fragile", "frozen", "gentle", "giant",
    "glossy", "golden", "grumpy", "handsome", "hollow", "humble", "icy", "jolly", "kind", "lively", "lonely",
    "loud", "lucky", "massive", "mellow", "misty", "modern", "narrow", "nervous", "noisy", "odd", "orange",
    "pale", "plain", "polite", "proud", "purple", "quiet", "rapid", "rare", "rough", "round", "rusty", "sandy",
    "scarlet", "shiny", "silent", "silver", "simple", "sleepy", "slow", "smooth", "soft", "solid", "sour",
    "spicy", "steep", "sticky", "stormy", "strange", "sturdy", "sudden", "sunny", "swift", "tall", "tame",
    "tender", "thick", "tiny", "tired", "vast", "velvet", "warm", "wary", "wide", "wild", "witty", "wooden",
    "young", "zealous",
)  # fmt: skip
NOUNS = (
    "acorn", "anchor", "apple", "arrow", "badge", "banjo", "barrel", "basket", "beacon", "blanket", "bottle",
    "branch", "bridge", "bucket", "cabin", "camera", "candle", "canyon", "carpet", "castle", "cellar", "chair",
    "cherry", "circus", "cloud", "comet", "compass", "cottage", "crayon", "crown", "dragon", "drum", "eagle",
    "engine", "falcon", "feather", "fiddle", "forest", "fountain", "garden", "glacier", "goblet", "harbor",
    "helmet", "island", "jacket", "jungle", "kettle", "ladder", "lantern", "lemon", "lizard", "magnet", "marble",
    "meadow", "mirror", "monkey", "mountain", "needle", "oyster", "paddle", "parrot", "pebble", "pencil",
    "piano", "pillow", "pirate", "planet", "pocket", "puzzle", "quilt", "rabbit", "ribbon", "river", "rocket",
    "saddle", "scarf", "shadow", "shovel", "spider", "squirrel", "statue", "teapot", "thunder", "ticket",
    "tiger", "towel", "tower", "tractor", "trumpet", "tunnel", "umbrella", "valley", "violin", "wagon", "walnut",
    "whistle", "window", "wizard", "zebra",
)  # fmt: skip


def random_value(kind: str, rng: Random) -> str:
    """A random key or value of RULER's types: a 7-digit number, an adjective-noun word, or a version-4 UUID."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise fail(f"unknown needle type {kind!r} in a needle task file", "use numbers, words or uuids")


# A sentence ends at . ! or ? (and any closing quotes or brackets) followed by white space, unless the word before
# the stop is a common abbreviation ("Mr. Darcy") or the next word starts in lower case; at any other of Unicode's
# sentence terminals (Chinese and Japanese 。！？, Devanagari । ॥, Arabic ؟ ۔, Ethiopic ።, Armenian ։, ...),
# white space after it or not; and at every line break (as RULER's noise lines end).
_TERMINALS = "\u0589\u061f\u06d4\u0700-\u0702\u0964\u0965\u104a\u104b\u1362\u1367\u1368\u166e\u1803\u1809" \
             "\u203c\u203d\u2047-\u2049\u2e2e\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ufe52\ufe56\ufe57\uff01" \
             "\uff0e\uff1f\uff61"  # fmt: skip
_CLOSING = "\"'\u201d\u2019)\\]\u300d\u300f\uff09\u300b\u3011"
_END = re.compile(rf"[.!?]+[{_CLOSING}]*[^\S\n]+|[{_TERMINALS}]+[{_CLOSING}]*\s*|\s*\n\s*")
_ABBREVIATIONS = frozenset(
    "mr mrs ms messrs dr st esq rev col capt gen lt sr jr vs etc no co vol ch fig i.e e.g viz".split()
)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, each stripped (RULER splits with NLTK's punkt, which needs a download)."""
    sentences, start = [], 0
    for m in _END.finditer(text):
        end = m.end()
        if text[m.start()] in ".!?":
            if end < len(text) and text[end].islower():
                continue
            word = text[max(start, m.start() - 12) : m.start()].rsplit(None, 1)
            if text[m.start()] == "." and word and word[-1].lower().lstrip("\"'(\u201c\u2018") in _ABBREVIATIONS:
                continue
        piece = text[start:end].strip()
        if piece:
            sentences.append(piece)
        start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def haystack_folder(haystack: str | None) -> Path:
    """The folder of haystack books: --haystack, else those shipped with megaeval (Jane Austen's six novels, public
    domain)."""
    return Path(haystack) if haystack else shipped_books()


def book_files(folder: Path) -> list[Path]:
    """The .txt/.txt.gz books of a haystack folder, at any depth and sorted, as `prep-books` reads a book folder."""
    if not folder.is_dir():
        raise fail(f"--haystack {folder}: no such folder", "pass a folder of .txt books")
    return [path for _, path in folder_books(f"--haystack {folder}", folder)]


@functools.lru_cache(maxsize=2)
def book_words(folder: str) -> tuple[str, ...]:
    """The words of every book in `folder` (sorted by path, joined with a space), white space collapsed as RULER does
    to its essays: the essay haystack of N words is the first N of these (repeated when N is more)."""
    text = " ".join(read_book(p)[1] for p in book_files(Path(folder)))
    words = tuple(w for w in re.sub(r"\s+", " ", text).strip().split(" ") if w)
    if len(words) < 100:
        raise fail(f"--haystack {folder} holds only {len(words)} words", "pass a folder of whole books")
    return words


@functools.lru_cache(maxsize=4)  # one haystack serves every depth of a sample
def essay_sentences(words: tuple[str, ...], count: int) -> list[str]:
    """RULER's essay haystack of `count` words: the first `count` words (the books repeated as needed), joined and
    split into sentences."""
    repeats = -(-count // len(words))
    taken = (words * repeats)[:count] if repeats > 1 else words[:count]
    return split_sentences(" ".join(taken))
