"""Shared fixtures: in-memory engines, and the tiny GGUF family written once per session."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Cost profiles measured by tests go to a throw-away cache, never the user's (child processes inherit it).
os.environ["SPECDEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="specdec-test-cache-")

from specdec_gguf.engines import InMemoryEngine


@pytest.fixture(autouse=True)
def _no_remembered_calibrations():
    """Each test starts with no drafter calibration remembered from another test's runs."""
    from specdec_gguf.calibrations import store_dir

    shutil.rmtree(store_dir(), ignore_errors=True)


@pytest.fixture
def target() -> InMemoryEngine:
    return InMemoryEngine.random(40, seed=7, n_ctx=512)


@pytest.fixture
def draft(target: InMemoryEngine) -> InMemoryEngine:
    return target.perturbed(0.3, seed=11)


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory):
    """A tiny F32 target/draft pair (written once per test session)."""
    from specdec_gguf.tiny import write_tiny_family

    return write_tiny_family(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def tiny_engines(tiny_family):
    """Loaded tiny target and draft engines, shared by the tests that reset them.

    One thread each: a tiny model gains nothing from more, and llama.cpp's spinning thread
    barriers slow down by orders of magnitude when the cores are shared with other work.
    """
    from specdec_gguf.engines import LlamaCppEngine

    target = LlamaCppEngine(tiny_family.target, n_ctx=512, n_batch=64, n_threads=1)
    draft = LlamaCppEngine(tiny_family.draft, n_ctx=512, n_batch=64, n_threads=1)
    yield target, draft
    target.close()
    draft.close()
