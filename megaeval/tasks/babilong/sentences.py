"""BABILong's sentence split, as its pinned nltk (3.8.1) splits, whatever nltk is installed: an untrained Punkt
tokenizer (`nltk.PunktSentenceTokenizer()`, as babilong_utils.SentenceSampler makes it) whose punctuation is
3.8.1's.

nltk 3.10.2 made Punkt treat curly quotes and guillemets as closing punctuation, so `…woman.”\\nAlmayer` became two
sentences where 3.8.1 (and so every published set) has one; nltk 3.10 also compiles Punkt's patterns with the
`regex` engine, each match under a time limit. Here the patterns tokenization reads (the language variables' and
the token's) are 3.8.1's, compiled by the standard `re`; Punkt's algorithm itself is unchanged from 3.8.1 to 3.10.
tests/tasks/babilong/test_generator.py holds this split and the generator against output recorded from BABILong's
own code under nltk 3.8.1 (tests/fixtures/babilong/nltk381/).
"""

from __future__ import annotations

import re

from nltk.tokenize.punkt import PunktLanguageVars, PunktSentenceTokenizer, PunktToken


class _LanguageVars381(PunktLanguageVars):
    """Punkt's English language variables as nltk 3.8.1 has them: only ASCII quotes and brackets close a sentence
    or end a word."""

    re_boundary_realignment = re.compile(r'["\')\]}]+?(?:\s+|(?=--)|$)', re.MULTILINE)

    @property
    def _re_non_word_chars(self) -> str:
        others = re.escape("".join(sorted(set(self.sent_end_chars) - {"."})))
        return r"(?:[)\";}\]\*:@\'\({\[" + others + "])"

    def _word_tokenizer_re(self) -> re.Pattern:
        try:
            return self._re_word_tokenizer
        except AttributeError:
            parts = {"NonWord": self._re_non_word_chars, "MultiChar": self._re_multi_char_punct,
                     "WordStart": self._re_word_start}  # fmt: skip
            self._re_word_tokenizer = re.compile(self._word_tokenize_fmt % parts, re.UNICODE | re.VERBOSE)
            return self._re_word_tokenizer

    def period_context_re(self) -> re.Pattern:
        try:
            return self._re_period_context
        except AttributeError:
            parts = {"NonWord": self._re_non_word_chars, "SentEndChars": self._re_sent_end_chars}
            self._re_period_context = re.compile(self._period_context_fmt % parts, re.UNICODE | re.VERBOSE)
            return self._re_period_context


class _Token381(PunktToken):
    """Punkt's token with its patterns compiled by the standard `re`, as in nltk 3.8.1."""

    __slots__ = ()
    _RE_ELLIPSIS = re.compile(r"\.\.+$")
    _RE_NUMERIC = re.compile(r"^-?[\.,]?\d[\d,\.-]*\.?$")
    _RE_INITIAL = re.compile(r"[^\W\d]\.$", re.UNICODE)
    _RE_ALPHA = re.compile(r"[^\W\d]+$", re.UNICODE)


def sentence_splitter() -> PunktSentenceTokenizer:
    """An untrained Punkt tokenizer that splits as nltk 3.8.1's does (`.tokenize(text)`: the sentences)."""
    return PunktSentenceTokenizer(lang_vars=_LanguageVars381(), token_cls=_Token381)
