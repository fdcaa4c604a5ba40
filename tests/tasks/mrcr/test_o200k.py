"""o200k_base offline: the shipped ranks are tiktoken's (its own expected hash), megaeval's encoder gives tiktoken's
ids, and MRCR's token counts (so its bins) equal those tiktoken's own `get_encoding("o200k_base")` gives on the
fixture records, with the ranks handed to it offline (integration: tiktoken is not an extra)."""

from __future__ import annotations

import gzip
import hashlib
import json
import random

import pytest

from megaeval.tasks.mrcr.data import read_records
from megaeval.tasks.mrcr.o200k import O200K_SHA256, O200k, ranks_bytes
from megaeval.tasks.mrcr.results import bin_of
from megaeval_testing import REPO

FIXTURES = REPO / "tests" / "fixtures" / "mrcr"
URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"  # where tiktoken fetches it from
# ids from tiktoken 0.14.0's get_encoding("o200k_base").encode(text)
KNOWN = {
    "Hello world! It's 12345 tapirs.": [13225, 2375, 0, 7744, 220, 7633, 2548, 12909, 14168, 13],
    "Prepend aYooSG8CQg to the 2nd (1 indexed) poem about tapirs.": [
        4319, 5293, 261, 56, 3782, 13594, 23, 132006, 70, 316, 290, 220, 17, 301, 350, 16, 44010, 8, 41339, 1078,
        12909, 14168, 13],
    " \n\n  東京 🦜 don't WE'LL\r\n": [1202, 220, 185244, 9552, 99, 250, 4128, 26919, 6, 7454, 370],
}  # fmt: skip


def texts() -> list[str]:
    rng = random.Random(0)
    made = ["".join(rng.choice("ab cé\n1.,'東🦜XY\t") for _ in range(2000)) for _ in range(3)]
    return [*KNOWN, *made, "<|endoftext|> is text here", "a" * 300, ""]


def test_the_shipped_ranks_are_tiktokens_file():
    assert hashlib.sha256(ranks_bytes()).hexdigest() == O200K_SHA256
    assert len(ranks_bytes().splitlines()) == 199_998  # ranks 0-199997; 199999 and 200018 are special


def test_megaevals_own_encoder_gives_tiktokens_ids():
    python = O200k("python")
    assert python.backend == "python"
    for text, ids in KNOWN.items():
        assert python.encode(text) == ids and python.count(text) == len(ids)


@pytest.fixture(scope="module")
def tiktoken_itself(tmp_path_factory):
    """tiktoken's own o200k_base, its ranks file put where tiktoken caches downloads (it checks the hash again)."""
    tiktoken = pytest.importorskip("tiktoken")
    import os

    cache = tmp_path_factory.mktemp("tiktoken_cache")
    (cache / hashlib.sha1(URL.encode()).hexdigest()).write_bytes(ranks_bytes())
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    try:
        from tiktoken.registry import ENCODINGS

        ENCODINGS.pop("o200k_base", None)  # built again from the cache above
        yield tiktoken.get_encoding("o200k_base")
    finally:
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["python", "tiktoken"])
def test_counts_and_bins_equal_tiktokens_own_encoding(tiktoken_itself, backend, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAEVAL_CACHE_DIR", str(tmp_path))  # counted here, by this backend, not read back
    encoding = O200k(backend)
    for text in texts():
        assert encoding.encode(text) == tiktoken_itself.encode_ordinary(text)
    for layout in ("current", "first_release"):
        records, _ = read_records(FIXTURES / layout, encoding)
        for r in records:
            import pandas as pd

            file, row = r.id.split("#")
            raw = pd.read_parquet(FIXTURES / layout / file).iloc[int(row)]
            # the card's n_tokens(messages), and its count of the answer
            prompt = sum(len(tiktoken_itself.encode(m["content"])) for m in json.loads(raw["prompt"]))
            answer = len(tiktoken_itself.encode(raw["answer"]))
            assert (r.prompt_tokens, r.answer_tokens) == (prompt, answer)
            assert bin_of(r.prompt_tokens + r.answer_tokens) == bin_of(prompt + answer)


def test_the_ranks_file_is_stored_compressed_and_whole():
    path = REPO / "megaeval" / "tasks" / "mrcr" / "o200k_base" / "o200k_base.tiktoken.gz"
    assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == O200K_SHA256
    assert (path.parent / "LICENSE.TIKTOKEN").read_text().startswith("MIT License")
