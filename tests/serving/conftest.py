"""The served-model tests' real server: SmolLM2-135M-Instruct (float32) behind `transformers serve`, started once
per test process, and a fresh fault proxy in front of it for each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from megaeval_testing.servers import FaultProxy, served, smollm2_folder


@pytest.fixture(scope="session")
def folder() -> Path:
    """SmolLM2-135M-Instruct as a float32 model folder."""
    pytest.importorskip("fastapi")  # transformers serve's
    return smollm2_folder()


@pytest.fixture(scope="session")
def server(folder, tmp_path_factory):
    """`transformers serve` of it on a free localhost port."""
    with served(folder, tmp_path_factory.mktemp("server") / "server.log") as s:
        yield s


@pytest.fixture
def proxy(server):
    """A fault proxy in front of the server, counting and logging this test's requests."""
    p = FaultProxy(server.url)
    yield p
    p.close()
