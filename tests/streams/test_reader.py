"""Opening a books stream: the manifest is validated and tokens.bin is checked against its sha256."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from megaeval import MegaevalError
from megaeval.files import cached_file_sha256, file_sha256
from megaeval.streams import BooksStream


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAEVAL_CACHE_DIR", str(tmp_path / "cache"))


def edit_manifest(stream, **changes):
    path = stream / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_a_good_stream_opens_and_records_the_verified_checksum(make_stream):
    stream = make_stream()
    opened = BooksStream(stream)
    assert opened.describe()["tokens_sha256"] == hashlib.sha256((stream / "tokens.bin").read_bytes()).hexdigest()
    assert len(opened) == len(opened.tokens) > 100


def test_two_changed_tokens_of_the_same_size_are_refused(make_stream):
    stream = make_stream()
    BooksStream(stream)  # hashed and cached while intact
    tokens = np.fromfile(stream / "tokens.bin", dtype="<u2")
    tokens[10], tokens[11] = tokens[11] + 1, tokens[10] + 1
    tokens.tofile(stream / "tokens.bin")
    with pytest.raises(MegaevalError, match="does not match its manifest"):
        BooksStream(stream)


def test_the_checksum_cache_never_hides_an_edit(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"a" * 1000)
    first = cached_file_sha256(path)
    assert first == file_sha256(path) == cached_file_sha256(path)
    stat = path.stat()
    path.write_bytes(b"b" * 1000)  # same size; then put the old mtime back
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cached_file_sha256(path) == hashlib.sha256(b"b" * 1000).hexdigest() != first


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokens_file": "../tokens.bin"}, "plain file name"),
        ({"tokens_file": "/etc/passwd"}, "plain file name"),
        ({"tokens_file": ".."}, "plain file name"),
        ({"tokens_file": 7}, "'tokens_file' must be a str"),
        ({"dtype": "float16"}, "not a token dtype"),
        ({"total_tokens": "many"}, "'total_tokens' must be a int"),
        ({"tokens_sha256": "abc"}, "not a sha256"),
        ({"books": [{"offset": 10**9, "tokens": 5, "bytes": 1, "words": 1}]}, "runs past"),
        ({"books": [{"offset": -1, "tokens": 5, "bytes": 1, "words": 1}]}, "non-negative"),
        ({"books": ["x"]}, "must be an object"),
        ({"bos": "yes"}, "'bos' must be a bool"),
        ({"schema_version": 9}, "schema_version"),
        ({"kind": "other"}, "not a megaeval books-stream"),
    ],
)
def test_bad_manifest_fields_are_one_line_errors(make_stream, changes, message):
    stream = make_stream()
    edit_manifest(stream, **changes)
    with pytest.raises(MegaevalError, match=message):
        BooksStream(stream)


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "{", "\xff"])
def test_a_manifest_that_is_not_an_object_is_refused(make_stream, content):
    stream = make_stream()
    (stream / "manifest.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(MegaevalError, match="JSON|object"):
        BooksStream(stream)


def test_a_manifest_without_tokens_file_is_refused(make_stream):
    stream = make_stream()
    manifest = json.loads((stream / "manifest.json").read_text())
    del manifest["tokens_file"]
    (stream / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MegaevalError, match="no 'tokens_file' field"):
        BooksStream(stream)


def test_a_file_instead_of_a_folder_is_refused(make_stream):
    stream = make_stream()
    with pytest.raises(MegaevalError, match="is a file, not a stream folder"):
        BooksStream(stream / "tokens.bin")
