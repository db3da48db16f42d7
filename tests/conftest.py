"""Shared fixtures: in-memory engines, and the tiny GGUF family written once per session."""

from __future__ import annotations

import pytest

from specdec_gguf.engines import InMemoryEngine


@pytest.fixture
def target() -> InMemoryEngine:
    return InMemoryEngine.random(40, seed=7, n_ctx=512)


@pytest.fixture
def draft(target: InMemoryEngine) -> InMemoryEngine:
    return target.perturbed(0.3, seed=11)
