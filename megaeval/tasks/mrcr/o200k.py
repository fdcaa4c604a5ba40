"""OpenAI's o200k_base encoding, offline: the token counts MRCR's bins are made of (the dataset card counts every
message's content with `tiktoken.get_encoding("o200k_base")`).

The ranks are tiktoken's own file, shipped gzipped in o200k_base/ beside this module (its sha256 is the `expected_hash`
tiktoken checks, `O200K_SHA256`; MIT, see the README there). Two ways to count, one result:
- `tiktoken` installed: `tiktoken.Encoding` built from the shipped ranks and the pattern below (nothing
  downloaded), its `encode_ordinary`;
- otherwise tiktoken's algorithm here: the text split by o200k_base's pattern (the `regex` module, which nltk
  needs anyway), each piece merged pair by pair, lowest rank first (tiktoken's `byte_pair_merge`), pieces cached.
tests/tasks/mrcr/test_o200k.py checks the second against tiktoken itself on the fixtures and hand-made texts.
Special tokens are counted as text, as `encode_ordinary` does (the card's `encode` would refuse a content holding
`<|endoftext|>`; no MRCR record does)."""

from __future__ import annotations

import base64
import gzip
import hashlib
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from ...errors import fail

NAME = "o200k_base"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext.openai_public
SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
# o200k_base's split pattern (tiktoken_ext.openai_public.o200k_base), alternative by alternative
PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])  # fmt: skip


@cache
def ranks_bytes() -> bytes:
    """The shipped ranks file (tiktoken's o200k_base.tiktoken, one `base64(token) rank` line per token), checked."""
    path = resources.files(__package__).joinpath("o200k_base", "o200k_base.tiktoken.gz")
    data = gzip.decompress(path.read_bytes())
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise fail(f"the shipped {NAME} ranks ({path}) do not have tiktoken's checksum", "reinstall megaeval")
    return data


@cache
def mergeable_ranks() -> dict[bytes, int]:
    """Token bytes -> rank (= id), as tiktoken's `load_tiktoken_bpe` reads the file."""
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in ranks_bytes().splitlines()
                                                                   if line)}  # fmt: skip


class O200k:
    """o200k_base: `encode(text)` (ids, special tokens as text) and `count(text)`, by tiktoken where it is
    installed, else by the same algorithm here; `backend` says which."""

    def __init__(self, backend: str = "auto"):
        if backend not in ("auto", "tiktoken", "python"):
            raise ValueError(f"unknown o200k backend {backend!r}")
        self._tiktoken: Any = None
        if backend in ("auto", "tiktoken"):
            try:
                import tiktoken
            except ImportError:
                if backend == "tiktoken":
                    raise fail("tiktoken is not installed", "pip install tiktoken, or count with megaeval's own "
                               "o200k_base") from None  # fmt: skip
            else:
                self._tiktoken = tiktoken.Encoding(name=NAME, pat_str=PATTERN, mergeable_ranks=mergeable_ranks(),
                                                   special_tokens=SPECIAL_TOKENS)  # fmt: skip
        if self._tiktoken is None:
            import regex

            self._split = regex.compile(PATTERN).findall
            self._ranks = mergeable_ranks()
            self._piece = lru_cache(maxsize=1 << 17)(self._merge)

    @property
    def backend(self) -> str:
        return "tiktoken" if self._tiktoken is not None else "python"

    def encode(self, text: str) -> list[int]:
        if self._tiktoken is not None:
            return self._tiktoken.encode_ordinary(text)
        return [i for piece in self._split(text) for i in self._piece(piece)]

    def count(self, text: str) -> int:
        if self._tiktoken is not None:
            return len(self._tiktoken.encode_ordinary(text))
        return sum(len(self._piece(piece)) for piece in self._split(text))

    def _merge(self, piece: str) -> tuple[int, ...]:
        """One piece's ids: its bytes merged pair by pair, the pair whose join has the lowest rank first (the
        leftmost of equals), until no adjacent pair joins to a token (tiktoken's byte_pair_merge)."""
        data = piece.encode("utf-8")
        ranks = self._ranks
        whole = ranks.get(data)
        if whole is not None:
            return (whole,)
        parts = [data[i : i + 1] for i in range(len(data))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                rank = ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best is None or rank < best):
                    best, at = rank, i
            if best is None:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        return tuple(ranks[p] for p in parts)


@cache
def o200k(backend: str = "auto") -> O200k:
    """The encoding, built once per process."""
    return O200k(backend)
