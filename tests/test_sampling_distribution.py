"""Seeded statistical tests: speculative sampling has exactly the target's sampling distribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chi2

import specdec_gguf.sampling as sampling_module
from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.sampling import probs_from_logits

VOCAB = 6
PROMPT = [0, 1, 2, 0, 1]  # ends on a repeated bigram, so prompt lookup drafts the first token
TRIALS = 3000


def exact_two_token_distribution(target: InMemoryEngine, params: SamplingParams) -> np.ndarray:
    """The target's own distribution of the first two sampled tokens, [V, V]."""
    first = probs_from_logits(target.logits_for(PROMPT), params)
    joint = np.zeros((VOCAB, VOCAB))
    for a in range(VOCAB):
        joint[a] = first[a] * probs_from_logits(target.logits_for(PROMPT + [a]), params)
    return joint


def chi_square_p_value(target: InMemoryEngine, drafter, params: SamplingParams) -> float:
    decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=3, adaptive=False)
    counts = np.zeros((VOCAB, VOCAB))
    for trial in range(TRIALS):
        trial_params = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed=trial)
        a, b = decoder.generate(PROMPT, 2, trial_params).tokens
        counts[a, b] += 1
    expected = exact_two_token_distribution(target, params) * TRIALS
    if counts[expected == 0].sum() > 0:
        return 0.0  # a token the target can never produce appeared
    # Pool the rare cells (expected count < 5) into one, as the chi-square approximation needs.
    rare = (expected > 0) & (expected < 5)
    big = expected >= 5
    observed = np.append(counts[big], counts[rare].sum())
    wanted = np.append(expected[big], expected[rare].sum())
    keep = wanted > 0
    stat = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    return float(chi2.sf(stat, df=int(keep.sum()) - 1))


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.2, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1),
]


def make_pair() -> tuple[InMemoryEngine, InMemoryEngine]:
    target = InMemoryEngine.random(VOCAB, seed=3, sharpness=1.0)
    return target, target.perturbed(3.0, seed=4)  # a poor draft: many rejections exercise the residual


@pytest.mark.parametrize("params", PARAMS, ids=["temp", "top_k", "top_p", "min_p"])
@pytest.mark.parametrize("drafter_kind", ["draft-model", "prompt-lookup"])
def test_speculative_sampling_matches_target_distribution(params, drafter_kind):
    target, draft = make_pair()
    drafter = AutoregressiveDrafter(draft) if drafter_kind == "draft-model" else PromptLookupDrafter(2, 1)
    assert chi_square_p_value(target, drafter, params) > 1e-3


@pytest.mark.parametrize("drafter_kind", ["draft-model", "prompt-lookup"])
def test_broken_residual_is_detected(monkeypatch, drafter_kind):
    """Proof the test above can fail: sampling the correction from p instead of the residual."""
    monkeypatch.setattr(sampling_module, "residual_probs", lambda target_probs, draft_row, token: target_probs)
    target, draft = make_pair()
    drafter = AutoregressiveDrafter(draft) if drafter_kind == "draft-model" else PromptLookupDrafter(2, 1)
    assert chi_square_p_value(target, drafter, SamplingParams(temperature=1.0)) < 1e-6


def test_seeded_sampling_is_reproducible(target, draft):
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    runs = [decoder.generate([1, 2], 50, params).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    other = decoder.generate([1, 2], 50, SamplingParams(temperature=0.9, top_p=0.95, seed=99)).tokens
    assert other != runs[0]


def test_all_joint_cells_reachable_in_reference():
    """Sanity of the reference itself: it is a distribution."""
    target, _ = make_pair()
    for params in PARAMS:
        joint = exact_two_token_distribution(target, params)
        assert abs(joint.sum() - 1.0) < 1e-6  # float32 probabilities
        assert all(joint[a, b] >= 0 for a, b in itertools.product(range(VOCAB), repeat=2))
