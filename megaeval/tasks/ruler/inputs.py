"""What RULER's generators read besides the random stream: the essay haystack, the QA files, the word lists, NLTK's
Punkt sentence splitter, and how RULER counts tokens. One place, so every generator reads them alike.

The generators (niah, variable_tracking, words, qa) each expose
`generate(spec, count_tokens, max_seq_length, num_samples, seed, inputs) -> list[dict]`: RULER's jsonl records, in
order, as RULER's own script for that task writes them for `prepare.py --model_template_type base`.

Each reader here does what RULER's scripts do (NVIDIA/RULER at c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a,
scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,qa}.py and scripts/data/tokenizer.py), and
says so where it does:

- `sent_tokenize`: NLTK's Punkt splitter (`nltk.tokenize.sent_tokenize`, English) with the parameters shipped in
  data_prep/nltk_data (never downloaded; NLTK's search path is left alone);
- `wonderwords_words`: the word lists of the installed `wonderwords` package, read as RULER reads them;
- `essay_words`: RULER's essay haystack, `re.sub(r"\\s+", " ", essay).split(" ")`;
- `read_essays`, `books_essay_text`, `qa_json`: the input files (RULER's PaulGrahamEssays.json, the public-domain
  books that stand in for it, squad.json and hotpotqa.json), each problem one line;
- `token_counter`: RULER's token count for a megaeval tokenizer.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import fail
from ...text import read_json

# count_tokens(text): the number of tokens RULER's tokenizer wrapper gives for `text` (hf: len(tok.tokenize(text));
# sentencepiece (RULER's "nemo"): len(sp.encode_as_pieces(text))), special tokens never included.
TokenCounter = Callable[[str], int]

# The QA files of RULER's download script (scripts/data/synthetic/json/download_qa_dataset.sh), by qa.py's --dataset
QA_FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}

# The longest run of characters without white space an essay may hold (a long URL is far shorter)
MAX_WORD_CHARS = 1000

# The four files of NLTK's punkt_tab model for English (see the README.md beside them for source and licence)
PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")


@dataclass
class RulerInputs:
    """The files RULER's generators read: the essay text (RULER's PaulGrahamEssays.json 'text', or the books stand-in),
    the folder of QA files (squad.json, hotpotqa.json), and RULER's english_words.json values (cwe past wonderwords)."""

    essay_text: str | None = None
    qa_dir: Path | None = None
    english_words: list[str] | None = None


def nltk_data_dir() -> Path:
    """The NLTK data folder shipped with megaeval (tokenizers/punkt_tab/english only): what NLTK_DATA points at when
    RULER's own scripts run offline."""
    return Path(str(resources.files("megaeval.data_prep").joinpath("nltk_data")))


@functools.lru_cache(maxsize=1)
def punkt_tokenizer() -> Any:
    """NLTK's English Punkt sentence tokenizer with the shipped punkt_tab parameters, decoded as NLTK decodes them
    (`nltk.tokenize.punkt.load_punkt_params`), so it splits exactly as `nltk.sent_tokenize` does with that data.
    The files are read directly: nothing is downloaded and `nltk.data.path` is not touched."""
    try:
        from nltk.tabdata import PunktDecoder
        from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    except ImportError:
        raise fail("RULER's essay haystack needs NLTK's Punkt tokenizer, and nltk is not installed",
                   "pip install 'nltk>=3.9'") from None  # fmt: skip
    folder = nltk_data_dir() / "tokenizers" / "punkt_tab" / "english"
    missing = [name for name in PUNKT_FILES if not (folder / name).is_file()]
    if missing:
        raise fail(f"megaeval's Punkt model is incomplete: {folder} lacks {', '.join(missing)}", "reinstall megaeval")
    decoder = PunktDecoder()
    params = PunktParameters()

    def decoded(name: str, how: Callable[[Any], Any]) -> Any:
        with open(folder / name, encoding="utf-8") as f:
            return how(f)

    params.collocations = set(decoded("collocations.tab", decoder.tab2tups))
    params.sent_starters = decoded("sent_starters.txt", decoder.txt2set)
    params.abbrev_types = decoded("abbrev_types.txt", decoder.txt2set)
    params.ortho_context = decoded("ortho_context.tab", decoder.tab2intdict)
    return PunktSentenceTokenizer(params)


def sent_tokenize(text: str) -> list[str]:
    """The sentences of `text` as `nltk.tokenize.sent_tokenize(text)` (English) gives them: what RULER's niah.py
    splits its essay haystack with."""
    return punkt_tokenizer().tokenize(text)


@functools.lru_cache(maxsize=8)
def _wonderwords_list(name: str) -> tuple[str, ...]:
    try:
        from wonderwords import random_word
    except ImportError:
        raise fail("RULER's word keys and word lists come from the wonderwords package, which is not installed",
                   "pip install wonderwords") from None  # fmt: skip
    try:
        return tuple(random_word._get_words_from_text_file(name))
    except (OSError, ValueError) as e:
        raise fail(f"wonderwords has no word list {name!r} ({e})",
                   "use nounlist.txt, adjectivelist.txt or verblist.txt") from None  # fmt: skip


def wonderwords_words(name: str) -> list[str]:
    """One of wonderwords' word lists ("nounlist.txt", "adjectivelist.txt", "verblist.txt"), in file order, read
    as RULER reads it (`wonderwords.random_word._get_words_from_text_file(name)`); a fresh list each call."""
    return list(_wonderwords_list(name))


def essay_words(inputs: RulerInputs) -> list[str]:
    """RULER's essay haystack: the essay text with each run of white space made one space, split at spaces
    (`re.sub(r'\\s+', " ", essay).split(" ")`, empty words at the ends kept as RULER keeps them). The text is
    `inputs.essay_text`, or the public-domain books when that is None."""
    text = inputs.essay_text if inputs.essay_text is not None else books_essay_text()
    return re.sub(r"\s+", " ", text).split(" ")


def read_essays(path: str | Path) -> str:
    """The 'text' of an essay file in RULER's PaulGrahamEssays.json format (`{"text": "..."}`), or one line
    saying what is wrong with it."""
    path = Path(path)
    fix = 'pass the PaulGrahamEssays.json that RULER\'s download script writes (a JSON object {"text": "..."})'
    if not path.is_file():
        raise fail(f"--essays {path}: no such file" if not path.exists() else f"--essays {path} is not a file", fix)
    data = read_json(path, "--essays", fix)
    if not isinstance(data, dict) or "text" not in data:
        got = f"an object with {', '.join(map(repr, data)) or 'no fields'}" if isinstance(data, dict) else \
            f"a JSON {type(data).__name__}"  # fmt: skip
        raise fail(f"--essays {path} has no 'text' field (it holds {got})", fix)
    if not isinstance(data["text"], str):
        raise fail(f"--essays {path}: 'text' is a {type(data['text']).__name__}, not a string", fix)
    if not data["text"].strip():
        raise fail(f"--essays {path}: 'text' is empty", fix)
    longest = max(len(m.group()) for m in re.finditer(r"\S+", data["text"]))
    if longest > MAX_WORD_CHARS:  # RULER cuts its haystack by space-separated words: one word can be the whole text
        raise fail(f"--essays {path}: 'text' holds a run of {longest:,} characters without a space; RULER's haystack "
                   "is cut to a length in space-separated words, so text written without spaces (Chinese, Japanese) "
                   "cannot be fitted", "pass English essays as RULER uses them")  # fmt: skip
    return data["text"]


def read_english_words(path: str | Path) -> list[str]:
    """The words of RULER's english_words.json (a JSON object whose values are the words), or one line."""
    fix = "pass the file RULER's repository holds at scripts/data/synthetic/json/english_words.json"
    data = read_json(path, "--english-words", fix)
    if not isinstance(data, dict) or not data:
        raise fail(f"--english-words {path}: not RULER's english_words.json (a JSON {type(data).__name__}"
                   f"{' that is empty' if not data else ''}, not an object of words)", fix)  # fmt: skip
    words = list(data.values())
    for key, word in data.items():
        if not isinstance(word, str) or not word.strip() or len(word.split()) != 1:
            raise fail(f"--english-words {path}: not RULER's english_words.json (the value of {key!r:.40} is "
                       f"{word!r:.40}, not a word)", fix)  # fmt: skip
    return words


def qa_json(inputs: RulerInputs, dataset: str) -> Any:
    """The parsed QA file RULER's qa.py reads for `dataset` ("squad": squad.json, SQuAD v2 dev; "hotpotqa":
    hotpotqa.json, HotpotQA dev distractor) from `inputs.qa_dir`, or one line naming the file that is missing."""
    name = QA_FILES.get(dataset)
    if name is None:
        raise fail(f"unknown RULER QA dataset {dataset!r}", f"use one of {', '.join(QA_FILES)}")
    fix = f"pass --qa-data DIR holding {name} (RULER's download script names it so: " + (
        "SQuAD v2 dev-v2.0.json)" if dataset == "squad" else "HotpotQA hotpot_dev_distractor_v1.json)"
    )
    if inputs.qa_dir is None:
        raise fail(f"{'qa_1' if dataset == 'squad' else 'qa_2'} needs {name}, and no QA folder was given", fix)
    path = Path(inputs.qa_dir) / name
    if not path.is_file():
        raise fail(f"--qa-data {inputs.qa_dir}: no {name}", fix)
    return read_json(path, "--qa-data", fix)


def books_essay_text(folder: str | Path | None = None) -> str:
    """The stand-in for RULER's essays: every book of the haystack folder (`folder`, else the public-domain novels
    shipped with megaeval), sorted by path as `needle` reads them, joined with a space."""
    from ...data_prep.book_sources import read_book
    from ..needle.haystack import book_files, haystack_folder

    return " ".join(read_book(p)[1] for p in book_files(haystack_folder(str(folder) if folder else None)))


def token_counter(tokenizer: Any) -> TokenCounter:
    """RULER's token count for a megaeval tokenizer (`megaeval.models.load_tokenizer(spec)`): for a transformers
    tokenizer RULER's "hf" wrapper, `len(tok.tokenize(text))`; for a sentencepiece model RULER's "nemo" wrapper,
    `len(sp.encode_as_pieces(text))`. Neither counts special tokens. Any other tokenizer (RULER has no wrapper for
    it) counts the ids of its own encoder, without BOS."""
    sp = getattr(tokenizer, "sp", None)
    if sp is not None and hasattr(sp, "encode_as_pieces"):
        return lambda text: len(sp.encode_as_pieces(text))
    tok = getattr(tokenizer, "tok", None)
    if tok is not None and callable(getattr(tok, "tokenize", None)):
        return lambda text: len(tok.tokenize(text))
    return lambda text: len(tokenizer.encode(text))
