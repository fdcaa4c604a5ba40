"""The repository's layout as Python sees it: kernels/, suites/ and data_prep/ import only as megaeval.*."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from megaeval_testing import REPO


def _inside_repo(spec) -> bool:
    places = [spec.origin, *(spec.submodule_search_locations or [])]
    return any(p and Path(p).resolve().is_relative_to(REPO) for p in places)


@pytest.mark.parametrize("folder", ["kernels", "suites", "data_prep"])
def test_folders_installed_under_megaeval_are_not_top_level_packages(folder):
    """Not importable as a stray top-level package (a top-level `kernels` would hide Hugging Face's), nor is any
    test folder of that name (tests/kernels)."""
    spec = importlib.util.find_spec(folder)
    assert spec is None or not _inside_repo(spec), f"{folder!r} imports from {spec.submodule_search_locations}"
    assert folder not in sys.modules or not _inside_repo(sys.modules[folder].__spec__)
    installed = importlib.util.find_spec(f"megaeval.{folder}")
    assert installed is not None and Path(installed.origin).resolve().parent == REPO / folder


def test_neither_the_repository_nor_the_tests_folder_is_on_sys_path():
    """Either would make kernels/ (or tests/kernels/, tests/models/, ...) a top-level package."""
    on_path = {Path(p or ".").resolve() for p in sys.path}
    assert REPO not in on_path and REPO / "tests" not in on_path
